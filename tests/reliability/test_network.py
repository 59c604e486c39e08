"""Workers on several hosts (network namespaces), reaching their PostgreSQL over a bad network.

Each host is a namespace with a veth on a bridge of this test's own (``netns.py``); the cluster
listens on the bridge's address. Latency is added by a relay in the root namespace
(``DelayProxy``: this kernel has no ``netem``), loss and partitions by nftables rules in the
host's namespace. The partition is silent: packets vanish, nothing is refused.

- a drain through 5 ms and 50 ms of added round trip, and 1 % packet loss each way: every
  acknowledged job runs (the checker), a job runs again only on an attempt of its own;
- one host cut off for longer than its lease while it runs jobs: another host takes each of
  them over once, the cut-off host's outcomes, sent when it is back, are fenced off, and an
  execution log kept off the database shows no two hosts running a job under two unexpired
  leases;
- two scheduler replicas on two hosts, one cut off for a while: each 1-second slot is enqueued
  once, and none is missed.

``PGOUTBOX_LONG_TESTS=1``: more jobs, more hosts, repeated partitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, wait_for
from tests.processes.reliability.checker import check
from tests.reliability.cluster import Cluster, own_cluster
from tests.reliability.netns import DelayProxy, Host, HostWorker, Network, network

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
HOSTS = 4 if LONG else 2
DRAIN_JOBS = 2000 if LONG else 200
PARTITIONS = 3 if LONG else 1
LEASE_SECONDS = 3
#: Twice the lease. The cut-off host's handlers run on past the heal, and end while the taker's
#: run still goes: their outcomes, sent then, meet the taker's lease (not a settled job).
PARTITION_SECONDS = 6
STEP_SECONDS = 10
SCHEDULER_PARTITION_SECONDS = 8

#: Every row change of a ``tests.leased_step`` job: the leases each worker held, and who wrote
#: the outcome. Kept by the server, in the order of its commits.
LEASE_LOG = """
CREATE TABLE net_lease_log (
    job_id uuid, attempt integer, worker text, status text, lease_expires_at timestamptz,
    result jsonb, at timestamptz
);
CREATE FUNCTION net_log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO net_lease_log VALUES (NEW.id, NEW.attempts, NEW.locked_by, NEW.status,
        NEW.lease_expires_at, NEW.result, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER net_log_lease AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (NEW.job_type = 'tests.leased_step') EXECUTE FUNCTION net_log_lease();
"""


@dataclass
class Site:
    net: Network
    cluster: Cluster
    proxy: DelayProxy
    hosts: list[Host]
    database: str = "net"
    workers: list[HostWorker] = field(default_factory=list)

    def url(self, via_proxy: bool = False) -> str:
        port = self.proxy.port if via_proxy else self.cluster.port
        return f"postgres://postgres@{self.net.gateway}:{port}/{self.database}"

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.cluster.execute(self.database, sql, params)

    def start(
        self,
        host: Host,
        *args: str,
        log_dir: Path,
        via_proxy: bool = False,
        execution_log: Path | None = None,
        **settings: Any,
    ) -> HostWorker:
        application = f"net-{host.name}-{len(self.workers)}"
        env = {
            **os.environ,
            "DATABASE_URL": self.url(via_proxy),
            "PGOUTBOX_TEST_SETTINGS": json.dumps(settings),
            "PGAPPNAME": application,
            "PYTHONUNBUFFERED": "1",
            "PGOUTBOX_TEST_HOST": host.name,
            "PGOUTBOX_TEST_EXECUTION_LOG": str(execution_log or log_dir / "executions.jsonl"),
        }
        worker = HostWorker(
            host,
            [sys.executable, str(ROOT / "manage.py"), "runworkers", *args],
            env,
            log_dir / f"{application}.log",
            ROOT,
            application,
        )
        self.workers.append(worker)
        return worker

    def listening(self, worker: HostWorker) -> bool:
        rows = self.query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND query ILIKE 'LISTEN%%'",
            [worker.application],
        )
        return bool(rows[0][0])

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()
            lines = worker.output().splitlines()
            print(f"--- {worker.log_path.name}, last 30 of {len(lines)} lines:")
            print("\n".join(lines[-30:]))
        self.workers.clear()

    def insert(self, job_type: str, payloads: list[dict[str, Any]]) -> list[uuid.UUID]:
        rows = self.query(
            "INSERT INTO jobs (queue, job_type, payload) "
            "SELECT 'default', %s, p FROM unnest(%s::jsonb[]) AS p RETURNING id",
            [job_type, [json.dumps(p) for p in payloads]],
        )
        return [row[0] for row in rows]


@contextlib.contextmanager
def built_site(hosts: int, setup_sql: str) -> Iterator[Site]:
    """``hosts`` hosts in network namespaces, a cluster of its own on the bridge that trusts
    them, its database ``net`` migrated and ``setup_sql`` run there, and a latency relay."""
    with network() as net, own_cluster(host=net.gateway) as cluster:
        with (cluster.pgdata / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {net.subnet} trust\n")
        cluster.reload()
        members = [net.add_host() for _ in range(hosts)]
        cluster.migrated_database("net")
        cluster.execute("net", setup_sql)
        proxy = DelayProxy(net.gateway, (net.gateway, cluster.port))
        proxy.start()
        built = Site(net, cluster, proxy, members)
        try:
            yield built
        finally:
            built.stop_all()
            proxy.stop()


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with built_site(HOSTS, LEASE_LOG) as built:
        yield built


@pytest.fixture
def running(site: Site) -> Iterator[Site]:
    """The site, its workers of this test killed (and their logs printed) at the end."""
    try:
        yield site
    finally:
        for host in site.hosts:
            host.heal()
        site.proxy.delay = 0.0
        site.stop_all()


def wait_listening(site: Site, workers: list[HostWorker]) -> None:
    for worker in workers:
        wait_for(lambda w=worker: site.listening(w) or w.process.poll() is not None, timeout=60)  # type: ignore[misc]
        assert worker.process.poll() is None, worker.output()[-3000:]


# -- the drain through latency and loss ------------------------------------------------------------


def test_drain_through_latency_and_loss(running: Site, tmp_path: Path) -> None:
    site = running
    workers = [
        site.start(
            host,
            "--roles",
            "jobs",
            "--queues",
            "default",
            "--concurrency",
            "4",
            log_dir=tmp_path,
            via_proxy=True,
            LEASE_SECONDS=10,
            POLL_INTERVAL=0.5,
        )
        for host in site.hosts
    ]
    wait_listening(site, workers)
    phases: list[tuple[str, float, float]] = [
        ("no fault", 0.0, 0.0),
        ("latency 5 ms", 0.005, 0.0),
        ("latency 50 ms", 0.05, 0.0),
        ("loss 1%", 0.0, 1.0),
    ]
    figures = []
    for name, delay, loss in phases:
        site.proxy.delay = delay
        for host in site.hosts:
            if loss:
                host.lose(loss)
            else:
                host.heal()
        acknowledged = site.insert("tests.behave", [{"phase": name}] * DRAIN_JOBS)
        started = time.monotonic()

        def drained(ids: list[uuid.UUID] = acknowledged) -> bool:
            """every job of the phase completed"""
            rows = site.query(
                "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status <> 'completed'", [ids]
            )
            return bool(rows[0][0] == 0)

        wait_for(drained, timeout=60 + DRAIN_JOBS * (delay * 20 + loss * 0.05), interval=0.1)
        seconds = time.monotonic() - started
        executions = [
            row[0]
            for row in site.query(
                "SELECT job_id FROM testjobs_sideeffect WHERE event = 'end' AND job_id = ANY(%s)",
                [acknowledged],
            )
        ]
        verdict = check(acknowledged, executions)
        # Its attempts: the last, and each one before it that ended (failed, or lost with its
        # lease: given back, so not counted in ``attempts``), as ``attempt_log`` keeps them.
        attempts = dict(
            site.query(
                "SELECT id, 1 + jsonb_array_length(coalesce(attempt_log, '[]'::jsonb))"
                " FROM jobs WHERE id = ANY(%s)",
                [acknowledged],
            )
        )
        runs = Counter(executions)
        # At least once: a job runs again only on an attempt of its own (a lease that expired,
        # an outcome lost with its connection), never twice in one attempt.
        beyond = {job: n for job, n in runs.items() if n > attempts[job]}
        figures.append(f"{name}: {DRAIN_JOBS / seconds:.0f} jobs/s ({verdict})")
        print(f"\n{name}: {DRAIN_JOBS} jobs drained in {seconds:.2f} s: {verdict}")
        assert verdict.lost == 0, verdict
        assert verdict.unexpected == 0, verdict
        assert not beyond, f"{name}: jobs run more often than attempted: {beyond}"
    print(f"\ndrain rates, {HOSTS} hosts x 4 threads:", "; ".join(figures))


# -- one host cut off for longer than its lease ----------------------------------------------------


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class Run:
    """One attempt's run on a host, from the execution log, and the lease its worker held."""

    job: str
    attempt: int
    worker: str
    host: str
    start: float
    end: float  # when it ended (or the end of the test, if it never did)
    lease_until: float  # the latest lease expiry the server committed for this attempt's worker


def runs_of(entries: list[dict[str, Any]], leases: dict[tuple[str, int, str], float]) -> list[Run]:
    started: dict[tuple[str, int, str], dict[str, Any]] = {}
    ended: dict[tuple[str, int, str], float] = {}
    for entry in entries:
        key = (entry["job"], entry["attempt"], entry["worker"])
        if entry["event"] == "start":
            started[key] = entry
        else:
            ended[key] = entry["at"]
    now = time.time()
    return [
        Run(
            *key,
            entry["host"],
            entry["at"],
            ended.get(key, now),
            leases.get(key, entry.get("lease_expires_at") or 0.0),
        )
        for key, entry in started.items()
    ]


def unexpired_overlaps(runs: list[Run]) -> list[tuple[Run, Run, float]]:
    """Pairs of runs of one job on two hosts that ran at the same time, both under an unexpired
    lease: the time they shared (seconds) with each pair."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    found = []
    for job_runs in by_job.values():
        for i, first in enumerate(job_runs):
            for second in job_runs[i + 1 :]:
                if first.host == second.host:
                    continue
                shared_from = max(first.start, second.start)
                shared_until = min(first.end, first.lease_until, second.end, second.lease_until)
                if shared_from < shared_until:
                    found.append((first, second, shared_until - shared_from))
    return found


def lease_expiries(site: Site) -> dict[tuple[str, int, str], float]:
    rows = site.query(
        "SELECT job_id::text, attempt, worker, max(extract(epoch FROM lease_expires_at)) "
        "FROM net_lease_log WHERE worker IS NOT NULL AND lease_expires_at IS NOT NULL "
        "GROUP BY 1, 2, 3"
    )
    return {(job, attempt, worker): float(until) for job, attempt, worker, until in rows}


def test_partitioned_host_is_taken_over_and_fenced(running: Site, tmp_path: Path) -> None:
    site = running
    execution_log = tmp_path / "executions.jsonl"
    workers = [
        site.start(
            host,
            "--roles",
            "jobs",
            "--queues",
            "default",
            "--concurrency",
            "4",
            log_dir=tmp_path,
            execution_log=execution_log,
            LEASE_SECONDS=LEASE_SECONDS,
            POLL_INTERVAL=0.5,
        )
        for host in site.hosts
    ]
    wait_listening(site, workers)
    takeovers: list[float] = []
    fenced_after: list[float] = []
    handlers_ended: list[float] = []
    all_jobs: list[uuid.UUID] = []
    cut_off: set[str] = set()
    for round_ in range(PARTITIONS):
        jobs = site.insert("tests.leased_step", [{"seconds": STEP_SECONDS}] * (2 * HOSTS))
        all_jobs += jobs
        names = {str(job) for job in jobs}

        def all_started(names: set[str] = names) -> bool:
            """each job of the round has a start line in the execution log"""
            starts = {e["job"] for e in read_log(execution_log) if e["event"] == "start"}
            return names <= starts

        wait_for(all_started, timeout=30)
        by_host = Counter(
            e["host"]
            for e in read_log(execution_log)
            if e["event"] == "start" and e["job"] in names
        )
        victim_name = by_host.most_common(1)[0][0]
        victim = next(host for host in site.hosts if host.name == victim_name)
        victim_worker = next(w for w in workers if w.host is victim)
        held = {
            e["job"]
            for e in read_log(execution_log)
            if e["event"] == "start" and e["job"] in names and e["host"] == victim_name
        }
        victim_ids = {e["worker"] for e in read_log(execution_log) if e["host"] == victim_name}
        cut_off |= held
        victim.partition()
        cut_at = time.time()
        try:
            # A lost attempt is given back (``attempts`` goes down by one): the taker runs the
            # job under the same attempt number, its own worker id in ``locked_by``.
            def taken_over(held: set[str] = held, victim_ids: set[str] = victim_ids) -> bool:
                """every job the cut-off host ran is claimed again by another worker"""
                rows = site.query(
                    "SELECT count(DISTINCT job_id) FROM net_lease_log"
                    " WHERE job_id = ANY(%s::uuid[]) AND status = 'leased' AND worker <> ALL(%s)",
                    [sorted(held), sorted(victim_ids)],
                )
                return bool(rows[0][0] == len(held))

            wait_for(taken_over, timeout=30, interval=0.1)
            remaining = cut_at + PARTITION_SECONDS - time.time()
            if remaining > 0:
                time.sleep(remaining)
        finally:
            victim.heal()
        healed_at = time.time()

        def done(jobs: list[uuid.UUID] = jobs) -> bool:
            """every job of the round completed"""
            rows = site.query(
                "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status <> 'completed'", [jobs]
            )
            return bool(rows[0][0] == 0)

        wait_for(done, timeout=60, interval=0.2)

        def answered(
            held: set[str] = held, worker: HostWorker = victim_worker, victim: str = victim_name
        ) -> bool:
            """the cut-off host, back, has each of its outcomes fenced off (or written)"""
            output = worker.output()
            written = {
                job
                for (job,) in site.query(
                    "SELECT job_id::text FROM net_lease_log WHERE status = 'completed'"
                    " AND result ->> 'host' = %s",
                    [victim],
                )
            }
            return all(
                job in written or re.search(rf"job {job} attempt \d+: .*discarded", output)
                for job in held
            )

        wait_for(answered, timeout=60, interval=0.2)
        fenced_after.append(time.time() - healed_at)
        ended = [
            e["at"]
            for e in read_log(execution_log)
            if e["event"] == "end" and e["job"] in held and e["host"] == victim_name
        ]
        handlers_ended.append(max(ended) - healed_at)
        # The takeover: from the expiry of the cut-off worker's lease to the taker's claim.
        for job in held:
            (until,) = site.query(
                "SELECT max(extract(epoch FROM lease_expires_at)) FROM net_lease_log "
                "WHERE job_id = %s AND worker = ANY(%s)",
                [job, sorted(victim_ids)],
            )[0]
            (claimed,) = site.query(
                "SELECT min(extract(epoch FROM at)) FROM net_lease_log "
                "WHERE job_id = %s AND status = 'leased' AND worker <> ALL(%s)",
                [job, sorted(victim_ids)],
            )[0]
            takeovers.append(float(claimed) - float(until))
        print(
            f"\nround {round_ + 1}: {victim_name} cut off for {healed_at - cut_at:.1f} s "
            f"holding {len(held)} job(s)"
        )

    entries = read_log(execution_log)
    runs = runs_of(entries, lease_expiries(site))
    overlaps = unexpired_overlaps(runs)
    assert not overlaps, f"two hosts ran one job under two unexpired leases: {overlaps}"
    # Each job ends completed, its outcome written by the last attempt's worker (the taker's, for
    # a job taken over), never overwritten by the late outcome of the cut-off host.
    final = site.query(
        "SELECT id::text, status, attempts, locked_by, result FROM jobs WHERE id = ANY(%s)",
        [all_jobs],
    )
    for job, status, attempts, locked_by, result in final:
        assert status == "completed", (job, status)
        ran = [r for r in runs if r.job == job]
        last = max(ran, key=lambda r: r.start)
        assert attempts == last.attempt, (job, attempts, ran)
        assert locked_by == last.worker, (job, locked_by, last)
        assert result == {"host": last.host, "attempt": last.attempt}, (job, result, last)
        # Taken over once if its host was cut off (two runs, two hosts), else run once.
        assert len(ran) == (2 if job in cut_off else 1), (job, ran)
        assert len({r.host for r in ran}) == len(ran), (job, ran)
        writes = site.query(
            "SELECT attempt, worker, status FROM net_lease_log WHERE job_id = %s ORDER BY at",
            [job],
        )
        settled = [w for w in writes if w[2] == "completed"]
        assert settled == [(attempts, locked_by, "completed")], (job, writes)
    executions = [uuid.UUID(e["job"]) for e in entries if e["event"] == "end"]
    print(
        f"\n{check(all_jobs, executions)}; takeover after lease expiry: "
        f"{', '.join(f'{t:.2f}' for t in sorted(takeovers))} s; cut-off host's handlers ended "
        f"{', '.join(f'{t:.1f}' for t in handlers_ended)} s after the heal, their outcomes "
        f"fenced off by {', '.join(f'{t:.1f}' for t in fenced_after)} s after it"
    )


# -- two scheduler replicas, one cut off -----------------------------------------------------------


def tick_slots(site: Site) -> list[tuple[datetime, datetime]]:
    """(slot, created_at) of each job of the ``nettick`` schedule, in slot order."""
    rows = site.query(
        "SELECT idempotency_key, created_at FROM jobs "
        "WHERE idempotency_key LIKE 'schedule:nettick:%%'"
    )
    return sorted((datetime.fromisoformat(key.split(":", 2)[2]), at) for key, at in rows)


#: Each enqueue of a ``nettick`` slot takes 0.4 s on the server: long enough for the test to see
#: a replica inside its transaction (holding the schedule's lock) and cut it off there.
SLOW_SLOTS = """
CREATE FUNCTION net_slow_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.4);
    RETURN NEW;
END $$;
CREATE TRIGGER net_slow_slot BEFORE INSERT ON jobs FOR EACH ROW
    WHEN (NEW.idempotency_key LIKE 'schedule:nettick:%') EXECUTE FUNCTION net_slow_slot();
"""


def test_scheduler_replicas_across_a_partition(running: Site, tmp_path: Path) -> None:
    """One replica cut off, inside the transaction that holds the schedule's lock (and, in the
    long variant, also at any moment): the other goes on; each slot once, none missed."""
    site = running
    site.query(SLOW_SLOTS)
    settings: dict[str, Any] = {
        "SCHEDULES": {
            # "all": a stall of the loaded machine past a slot must not read as a slot missed.
            "nettick": {"JOB": "tests.noop", "EVERY": 1, "QUEUE": "reports", "CATCH_UP": "all"},
            "pgoutbox.prune": None,
            "pgoutbox.recover_leases": None,
            "pgoutbox.reconcile_outbox": None,
        }
    }
    schedulers = [
        site.start(host, "--roles", "scheduler", log_dir=tmp_path, **settings)
        for host in site.hosts
    ]
    wait_for(lambda: len(tick_slots(site)) >= 3, timeout=60, interval=0.2)

    def inside() -> str | None:
        """a replica is inside its transaction, enqueuing a slot"""
        rows = site.query(
            "SELECT application_name FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
            " AND application_name = ANY(%s)",
            [[s.application for s in schedulers]],
        )
        return str(rows[0][0]) if rows else None

    windows = []
    for round_ in range(PARTITIONS):
        if round_ % 2 == 0:
            application = wait_for(inside, timeout=30, interval=0.01)
            victim = next(s for s in schedulers if s.application == application)
        else:
            victim = schedulers[round_ % len(schedulers)]
        victim.host.partition()
        cut_at = datetime.now(UTC)
        try:
            time.sleep(SCHEDULER_PARTITION_SECONDS)
        finally:
            victim.host.heal()
        healed_at = datetime.now(UTC)
        windows.append((cut_at, healed_at, round_ % 2 == 0))
        # Caught up: the slot of two seconds after the heal is enqueued.
        wait_for(
            lambda h=healed_at: tick_slots(site)[-1][0] > h + timedelta(seconds=2),  # type: ignore[misc]
            timeout=30,
            interval=0.2,
        )
    for scheduler in schedulers:
        assert scheduler.process.poll() is None, scheduler.output()[-3000:]
    slots = tick_slots(site)
    keys = Counter(slot for slot, _ in slots)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    gaps = {b - a for (a, _), (b, _) in pairwise(slots)}
    assert gaps == {timedelta(seconds=1)}, sorted(gaps)
    # How late the other replica enqueued the slots that fell in a partition. The server ends
    # the session of a replica silent for 3 s inside the transaction (queries.SCHEDULE_LOCK),
    # which releases the lock: the other goes on long before the heal.
    lateness = {
        inside_: max(
            (at - slot).total_seconds()
            for slot, at in slots
            for cut, healed, kind in windows
            if kind == inside_ and cut <= slot <= healed
        )
        for inside_ in {kind for _, _, kind in windows}
    }
    print(
        f"\n{len(slots)} slots of 1 s, each enqueued once, none missed, across {PARTITIONS} "
        f"partition(s) of {SCHEDULER_PARTITION_SECONDS} s of one replica; slots of the "
        f"partitions enqueued at most {lateness[True]:.1f} s late with the replica cut off inside "
        f"its transaction" + (f", {lateness[False]:.2f} s otherwise" if False in lateness else "")
    )
    assert lateness[True] < SCHEDULER_PARTITION_SECONDS - 1, (
        f"the other replica waited {lateness[True]:.1f} s for the cut-off one's lock"
    )
