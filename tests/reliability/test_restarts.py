"""PostgreSQL restarted again and again (``-m fast`` and ``-m immediate``, a crash) under load.

On a cluster of the test's own (``own_cluster``), never the shared server. Two ``runworkers``
processes (jobs, relay and scheduler roles) run the whole time; a producer thread of the test
commits jobs and outbox events through its own connection, reconnecting across the outages; a
schedule enqueues a job every second. The server is restarted at random intervals of 5 to 40 s
(drawn from ``seed_or(...)``: the seed and the schedule are printed, ``PGOUTBOX_TEST_SEED``
replays them), in fast and immediate mode by turns.

An id counts as *acknowledged* only once its ``COMMIT`` returned. A ``COMMIT`` that failed with
the connection is *unknown*: it may or may not have landed; the checker reads which, and holds
the rows that landed to the same rules as the acknowledged ones.

Then the load stops and everything drains, and the test checks: every acknowledged job completed
(its outcome row) and its handler ran to its end at least once, more than once only for the
jobs in flight at a restart (at-least-once: counted and bounded); every acknowledged event
projected once, its job enqueued once; every schedule slot from the first to the last enqueued
once; nothing leased; the workers are the processes started at the beginning, alive, connected
again, and they logged each outage in a bounded number of lines, without a traceback for every
retry. Per restart it prints the downtime, the seconds to the first job completed after it
(``completed_at``, the server's clock) and to the backlog back at its level before.

The fast variant (2 minutes of restarts) runs with the suite; ``PGOUTBOX_LONG_TESTS=1`` runs a
long one (``PGOUTBOX_RESTART_SECONDS``, default 900).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from django_pgoutbox import queries
from django_pgoutbox.conf.values import JOBS_CHANNEL, OUTBOX_CHANNEL
from django_pgoutbox.health import HEARTBEAT_SECONDS
from django_pgoutbox.ids import uuid7
from tests.processes import scaled, seed_or, wait_for
from tests.processes.reliability.checker import check
from tests.reliability.cluster import Cluster, own_cluster

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
#: Seconds of load and restarts: the fast variant's two minutes, or the long one's.
FAST_SECONDS = 120.0
LONG_SECONDS = float(os.environ.get("PGOUTBOX_RESTART_SECONDS") or 900)
#: The interval between two restarts is drawn from this range (seconds).
INTERVAL = (5.0, 40.0)

WORKERS = 2
CONCURRENCY = 4
SCHEDULE = "restarts.tick"
SETTINGS: dict[str, Any] = {
    "LEASE_SECONDS": 3,
    "POLL_INTERVAL": 0.5,
    "RETRY": {"BASE_DELAY": 0.2, "MAX_DELAY": 2.0},
    "OUTBOX": {"CLAIM_SECONDS": 3},
    "SCHEDULES": {
        SCHEDULE: {
            "JOB": "tests.behave",
            "EVERY": 1,
            "CATCH_UP": "all",  # a slot missed during an outage is enqueued after it
            "PAYLOAD": {"sleep": 0.01, "schedule": True},
        }
    },
}
#: The producer's offer: a transaction every PERIOD seconds, with JOBS_PER_COMMIT jobs and one
#: event (projected by ``tests.projected`` into a ``tests.noop`` job).
PERIOD = 0.1
JOBS_PER_COMMIT = 2
JOB_PAYLOAD = {"sleep": 0.05}
#: Lines a worker may log per restart (the outage, the reconnection, per lane and role).
LINES_PER_RESTART = 60


# -- the producer --------------------------------------------------------------------------------


@dataclass
class Offer:
    """What the producer sent, by what it knows of each commit."""

    acknowledged_jobs: list[uuid.UUID] = field(default_factory=list)
    acknowledged_events: list[uuid.UUID] = field(default_factory=list)
    unknown_jobs: list[uuid.UUID] = field(default_factory=list)  # the COMMIT failed
    unknown_events: list[uuid.UUID] = field(default_factory=list)
    rolled_back: int = 0  # transactions that failed before their COMMIT: never landed
    reconnects: int = 0


class Producer(threading.Thread):
    """Commit jobs and an event every ``PERIOD`` through a connection of its own, reconnecting
    (with a short back-off) whenever the server is gone."""

    def __init__(self, url: str) -> None:
        super().__init__(name="producer", daemon=True)
        self.url = url
        self.offer = Offer()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the test, never swallowed
            self.error = error

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        sequence = 0
        while not self.stopping.is_set():
            if conn is None:
                try:
                    conn = psycopg.connect(self.url, connect_timeout=2)
                except psycopg.OperationalError:
                    self.stopping.wait(0.2)
                    continue
                self.offer.reconnects += 1
            jobs = [uuid7() for _ in range(JOBS_PER_COMMIT)]
            event = uuid7()
            sequence += 1
            try:
                conn.execute(
                    "INSERT INTO jobs (id, queue, job_type, payload) "
                    "SELECT id, 'default', 'tests.behave', %s::jsonb FROM unnest(%s::uuid[]) AS id",
                    [json.dumps(JOB_PAYLOAD), jobs],
                )
                conn.execute("SELECT pg_notify(%s, 'default')", [JOBS_CHANNEL])
                conn.execute(
                    queries.PUBLISH_EVENT,
                    {
                        "id": event,
                        "organization_id": None,
                        "aggregate_type": "restarts",
                        "aggregate_id": uuid.uuid4(),
                        "event_type": "tests.projected",
                        "schema_version": 1,
                        "payload": json.dumps({"sequence": sequence}),
                        "occurred_at": None,
                        "available_at": None,
                        "trace_context": None,
                        "notify": True,
                        "channel": OUTBOX_CHANNEL,
                    },
                )
            except psycopg.OperationalError:
                self.offer.rolled_back += 1  # no COMMIT was sent: none of it landed
                conn.close()
                conn = None
                continue
            try:
                conn.commit()
            except psycopg.OperationalError:
                self.offer.unknown_jobs += jobs
                self.offer.unknown_events.append(event)
                conn.close()
                conn = None
                continue
            self.offer.acknowledged_jobs += jobs
            self.offer.acknowledged_events.append(event)
            self.stopping.wait(PERIOD)
        if conn is not None:
            conn.close()


# -- reading the cluster -------------------------------------------------------------------------


def query(cluster: Cluster, database: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """``cluster.execute``, or ``[]`` while the server is away (restarting)."""
    try:
        return cluster.execute(database, sql, params)
    except psycopg.OperationalError:
        return []


#: Work not done yet: unfinished jobs of the load and unprocessed events.
BACKLOG = """
SELECT (SELECT count(*) FROM jobs WHERE status IN ('pending', 'retrying', 'leased')
          AND job_type IN ('tests.behave', 'tests.noop'))
     + (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL)
"""


@dataclass
class Restart:
    mode: str
    started_at: float  # wall clock (time.time()), the server's clock too: one machine
    downtime: float = 0.0  # until the server answered again
    server_started: float = 0.0  # pg_postmaster_start_time() of the new server (epoch)
    backlog_before: int = 0
    first_completion: float | None = None  # seconds from the restart's start
    backlog_normal: float | None = None  # seconds from the restart's start, once it completed one


def measure_recovery(
    cluster: Cluster, database: str, restart: Restart, until: float, normal: int
) -> None:
    """Poll until ``until`` (monotonic) for the first completion after ``restart``, then for the
    backlog to be back to ``normal`` (at most): a backlog seen low before the workers completed
    anything says only that the producer had not reconnected yet."""
    while time.monotonic() < until and (
        restart.first_completion is None or restart.backlog_normal is None
    ):
        if restart.first_completion is None:
            rows = query(
                cluster,
                database,
                # After the new server started: not a commit that slipped in before the old one
                # stopped.
                "SELECT extract(epoch FROM min(completed_at)) FROM jobs"
                " WHERE completed_at > to_timestamp(%s)",
                [restart.server_started],
            )
            if rows and rows[0][0] is not None:
                restart.first_completion = float(rows[0][0]) - restart.started_at
        elif restart.backlog_normal is None:
            rows = query(cluster, database, BACKLOG)
            if rows and int(rows[0][0]) <= normal:
                restart.backlog_normal = time.time() - restart.started_at
        time.sleep(0.2)


def backlog_level(cluster: Cluster, database: str, seconds: float) -> int:
    """The most work waiting seen over ``seconds`` of samples: the normal level under this load."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = query(cluster, database, BACKLOG)
        if rows:
            samples.append(int(rows[0][0]))
        time.sleep(0.2)
    return max(samples, default=0)


def worker_connections(cluster: Cluster, database: str, application_name: str) -> int:
    rows = query(
        cluster,
        database,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        [application_name],
    )
    return int(rows[0][0]) if rows else 0


def schedule_of_restarts(seed: int, seconds: float) -> list[tuple[float, str]]:
    """When (seconds into the load) and how to restart: intervals drawn from ``INTERVAL``, the
    modes by turns from a drawn first one."""
    rng = random.Random(seed)
    modes = ["fast", "immediate"]
    rng.shuffle(modes)
    plan: list[tuple[float, str]] = []
    at = rng.uniform(*INTERVAL)
    while at < seconds - INTERVAL[0]:
        plan.append((round(at, 1), modes[len(plan) % 2]))
        at += rng.uniform(*INTERVAL)
    return plan


# -- the test ------------------------------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with own_cluster() as own:
        yield own


def run_restarts(cluster: Cluster, start_worker: Callable[..., Any], seconds: float) -> None:
    database = "restarts"
    url = cluster.migrated_database(database)
    seed = seed_or(20261206)
    plan = schedule_of_restarts(seed, seconds)
    print(f"\nseed {seed}; restarts (seconds into the load, mode): {plan}")

    workers = [
        start_worker(
            "--roles",
            "jobs,relay,scheduler",
            "--queues",
            "default",
            "--concurrency",
            str(CONCURRENCY),
            database_url=url,
            **SETTINGS,
        )
        for _ in range(WORKERS)
    ]
    pids = [worker.pid for worker in workers]

    def all_connected() -> bool:
        """every worker has connections to the cluster"""
        return all(worker_connections(cluster, database, w.application_name) > 0 for w in workers)

    wait_for(all_connected, timeout=60, interval=0.2)

    producer = Producer(url)
    restarts: list[Restart] = []
    started = time.monotonic()
    producer.start()
    try:
        for at, mode in plan:
            # The normal level: the most work seen waiting over the 3 s before the restart.
            pause = max(0.0, started + at - 3 - time.monotonic())
            time.sleep(pause)
            normal = max(backlog_level(cluster, database, 3.0), 1)
            restart = Restart(mode=mode, started_at=time.time(), backlog_before=normal)
            restart.downtime = cluster.restart(mode)
            ((server_started,),) = cluster.execute(
                database, "SELECT extract(epoch FROM pg_postmaster_start_time())"
            )
            restart.server_started = float(server_started)
            restarts.append(restart)
            following = [next_at for next_at, _ in plan if next_at > at]
            until = started + (following[0] - 3 if following else seconds)
            measure_recovery(cluster, database, restart, max(until, time.monotonic() + 1), normal)
            assert producer.error is None, producer.error
        time.sleep(max(0.0, started + seconds - time.monotonic()))
    finally:
        producer.stopping.set()
        producer.join(timeout=scaled(30))
    assert producer.error is None, producer.error
    assert not producer.is_alive()
    load_seconds = time.monotonic() - started
    assert restarts, "no restart happened"
    first_restart = datetime.fromtimestamp(restarts[0].started_at).astimezone()
    last_restart = datetime.fromtimestamp(restarts[-1].started_at).astimezone()
    stopped_at = datetime.now().astimezone()
    offer = producer.offer

    def drained() -> bool:
        """every job of the load created before it stopped is finished, every event processed"""
        rows = query(
            cluster,
            database,
            "SELECT (SELECT count(*) FROM jobs WHERE status IN ('pending', 'retrying', 'leased')"
            "        AND job_type IN ('tests.behave', 'tests.noop') AND created_at <= %s)"
            "     + (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL)",
            [stopped_at],
        )
        return bool(rows) and int(rows[0][0]) == 0

    drain_started = time.monotonic()
    wait_for(drained, timeout=90, interval=0.5)
    drain_seconds = time.monotonic() - drain_started

    # The same processes as at the start: alive, and connected again (not restarted by anyone).
    for worker in workers:
        assert worker.process.poll() is None, f"{worker.pid} exited: {worker.output()[-3000:]}"
        assert worker_connections(cluster, database, worker.application_name) > 0

    def beating_again() -> bool:
        """each worker's heartbeat row is its first one, and was written after the last restart"""
        beats = query(
            cluster, database, "SELECT pid, started_at, last_seen_at FROM worker_heartbeats"
        )
        return (
            sorted(pid for pid, _, _ in beats) == sorted(pids)
            and all(started < first_restart for _, started, _ in beats)
            and all(seen > last_restart for _, _, seen in beats)
        )

    wait_for(beating_again, timeout=HEARTBEAT_SECONDS * 2 + 10, interval=0.5)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.output()[-3000:]

    # -- the checks, on the tables the workers left --------------------------------------------
    def rows(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return cluster.execute(database, sql, params)

    jobs = {
        job_id: (status, attempts, job_type, key, payload, created_at)
        for job_id, status, attempts, job_type, key, payload, created_at in rows(
            "SELECT id, status, attempts, job_type, idempotency_key, payload, created_at FROM jobs"
            " WHERE job_type IN ('tests.behave', 'tests.noop')"
        )
    }
    ends = [
        job_id for (job_id,) in rows("SELECT job_id FROM testjobs_sideeffect WHERE event = 'end'")
    ]
    landed_unknown_jobs = [j for j in offer.unknown_jobs if j in jobs]
    scheduled = {
        job_id: key
        for job_id, (_, _, _, key, _, _) in jobs.items()
        if key is not None and key.startswith(f"schedule:{SCHEDULE}:")
    }
    # A slot enqueued after the load stopped may not have run yet (the workers were stopped).
    scheduled_before_stop = {j for j in scheduled if jobs[j][5] <= stopped_at}
    expected = set(offer.acknowledged_jobs) | set(landed_unknown_jobs) | scheduled_before_stop
    late_slots = set(scheduled) - scheduled_before_stop
    verdict = check(expected, [j for j in ends if j not in late_slots])
    runs = Counter(ends)
    twice = [j for j in expected if runs[j] > 1]
    retried = sum(1 for j in expected if j in jobs and jobs[j][1] > 1)
    not_completed = Counter(
        jobs[j][0] if j in jobs else "missing"
        for j in expected
        if j not in jobs or jobs[j][0] != "completed"
    )
    phantom_jobs = [
        j
        for j, (_, _, job_type, key, _, _) in jobs.items()
        if job_type == "tests.behave" and key is None and j not in expected
    ]

    events = dict(rows("SELECT id, processed_at FROM outbox_events"))
    landed_unknown_events = [e for e in offer.unknown_events if e in events]
    expected_events = set(offer.acknowledged_events) | set(landed_unknown_events)
    projections = Counter(
        event_id for (event_id,) in rows("SELECT event_id FROM testjobs_projection")
    )
    projected_jobs = Counter(
        payload["event"]
        for (_, _, job_type, _, payload, _) in jobs.values()
        if job_type == "tests.noop" and "event" in payload
    )
    noop_not_completed = sum(
        1
        for (status, _, job_type, _, _, _) in jobs.values()
        if job_type == "tests.noop" and status != "completed"
    )

    slots = sorted(
        datetime.fromisoformat(key.removeprefix(f"schedule:{SCHEDULE}:"))
        for key in scheduled.values()
    )
    slot_keys = Counter(scheduled.values())
    gaps = [
        (earlier, later)
        for earlier, later in itertools.pairwise(slots)
        if later - earlier != timedelta(seconds=1)
    ]
    leased = rows("SELECT count(*) FROM jobs WHERE status = 'leased'")[0][0]
    claimed_events = rows(
        "SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND claimed_at IS NOT NULL"
    )[0][0]

    # The first completion after each restart, from the server's timestamps, however soon the
    # next restart came (measure_recovery's look stops 3 s before it).
    for restart in restarts:
        (first_at,) = rows(
            "SELECT extract(epoch FROM min(completed_at)) FROM jobs"
            " WHERE completed_at > to_timestamp(%s)",
            [restart.server_started],
        )[0]
        restart.first_completion = (
            None if first_at is None else float(first_at) - restart.started_at
        )

    # -- the report ----------------------------------------------------------------------------
    print(f"load {load_seconds:.0f} s, then drained in {drain_seconds:.1f} s")
    print(
        f"producer: {len(offer.acknowledged_jobs)} jobs and {len(offer.acknowledged_events)} "
        f"events acknowledged; {len(offer.unknown_jobs)} jobs and {len(offer.unknown_events)} "
        f"events unknown (COMMIT lost), of which {len(landed_unknown_jobs)} jobs and "
        f"{len(landed_unknown_events)} events landed; {offer.rolled_back} transactions rolled "
        f"back before their COMMIT; {offer.reconnects} connections"
    )
    print(
        f"jobs (load and {len(scheduled_before_stop)} schedule slots): {verdict}; "
        f"{len(twice)} ran to their end more than once, {retried} took more than one attempt"
    )
    print(
        f"events: {len(expected_events)} expected, {len(projections)} projected, "
        f"{sum(projected_jobs.values())} projected jobs"
    )
    print(f"schedule: {len(slots)} slots, {len(gaps)} gaps, {len(slot_keys)} distinct keys")
    print(
        "restart  mode       downtime s  first completion s  (after it answered)  backlog back s"
        "  (backlog before)"
    )
    for n, r in enumerate(restarts, 1):
        first, answered = (
            (f"{r.first_completion:.2f}", f"{r.first_completion - r.downtime:.2f}")
            if r.first_completion is not None
            else ("-", "-")
        )
        back = f"{r.backlog_normal:.2f}" if r.backlog_normal is not None else "-"
        print(
            f"{n:>7}  {r.mode:<9}  {r.downtime:>10.2f}  {first:>18}  {answered:>19}  {back:>14}  "
            f"({r.backlog_before})"
        )
    for name, values in (
        ("downtime", [r.downtime for r in restarts]),
        (
            "first completion",
            [r.first_completion for r in restarts if r.first_completion is not None],
        ),
        ("backlog back", [r.backlog_normal for r in restarts if r.backlog_normal is not None]),
    ):
        if values:
            print(
                f"{name}: min {min(values):.2f} s, median {statistics.median(values):.2f} s, "
                f"max {max(values):.2f} s over {len(values)} restarts"
            )
    logs = [worker.output() for worker in workers]
    for worker, log in zip(workers, logs, strict=True):
        lines = log.splitlines()
        print(
            f"worker {worker.pid}: {len(lines)} log lines, "
            f"{sum('Traceback' in line for line in lines)} tracebacks"
        )

    # -- the verdict ---------------------------------------------------------------------------
    assert verdict.lost == 0, verdict
    assert verdict.unexpected == 0, verdict
    assert not phantom_jobs, f"jobs that no commit of the producer wrote: {phantom_jobs[:5]}"
    assert not not_completed, not_completed
    # At-least-once: a handler that ran to its end whose outcome the restart lost runs again.
    # At most the attempts in flight at the restarts.
    assert len(twice) <= len(restarts) * WORKERS * CONCURRENCY, len(twice)
    assert set(projections) == expected_events
    assert all(count == 1 for count in projections.values())
    assert all(events[e] is not None for e in expected_events)
    assert set(projected_jobs) == {str(e) for e in expected_events}
    assert all(count == 1 for count in projected_jobs.values())
    assert noop_not_completed == 0
    assert len(slots) >= load_seconds * 0.8, len(slots)
    assert not gaps, gaps[:5]
    assert all(count == 1 for count in slot_keys.values())
    assert leased == 0
    assert claimed_events == 0
    # Each restart recovered before the next one began (5 s at the least).
    for restart, after in zip(restarts, [*restarts[1:], None], strict=True):
        assert restart.first_completion is not None, f"no job completed after {restart}"
        if after is not None:
            assert restart.started_at + restart.first_completion < after.started_at, restart
    for log in logs:
        assert "database unavailable" in log or "reconnecting" in log, log[-3000:]
        lines = log.splitlines()
        assert len(lines) <= LINES_PER_RESTART * (len(restarts) + 1), "\n".join(lines[-100:])
        assert sum("Traceback" in line for line in lines) <= len(restarts), log[-5000:]


def test_workers_ride_out_repeated_restarts(cluster: Cluster, start_worker: Any) -> None:
    run_restarts(cluster, start_worker, FAST_SECONDS)


@pytest.mark.skipif(not LONG, reason="the long variant: PGOUTBOX_LONG_TESTS=1")
def test_workers_ride_out_repeated_restarts_long(cluster: Cluster, start_worker: Any) -> None:
    run_restarts(cluster, start_worker, LONG_SECONDS)
