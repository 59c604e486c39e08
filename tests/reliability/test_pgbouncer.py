"""Workers, producers, the relay and the scheduler through PgBouncer in transaction mode.

PgBouncer 1.18 (no prepared statements across its pooled server connections) runs in front of a
cluster of the test's own. Everything goes through it as docs/databases.md says to configure it:
the pooled alias has ``DISABLE_SERVER_SIDE_CURSORS`` (one of the signs ``pooling_signs()`` looks
for, so the lanes prepare nothing) and ``LISTEN_DATABASES`` maps it to a direct alias
(``PGOUTBOX_TEST_DIRECT_URL`` in testproject/settings.py).

A producer process enqueues jobs through the pooler (``enqueue()`` in transactions,
``enqueue_many()`` by INSERT and by COPY) and publishes events, while worker processes (jobs,
relay, scheduler; several threads each) drain them and the test SIGKILLs workers that hold jobs
and starts replacements. Checked: every acknowledged job executed (duplicates only for jobs in
flight at a kill), every event projected once, each slot of a one-second schedule enqueued once
and none missed, no job left leased, and no "prepared statement" error in any worker's log, the
pooler's log or the server's log. The producer's first job goes to a queue polled every 30 s:
it starts at once only if the NOTIFY sent through the pooler reaches a worker's ``LISTEN`` on its
direct connection. The connections each worker opens to the pooler, and the server connections
the pooler uses for them, are counted idle and under load, and printed.

The long variant (``PGOUTBOX_LONG_TESTS=1``): more jobs and events, more kills.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.processes import ROOT, WorkerProcess, scaled, seed_or, wait_for
from tests.processes.reliability.checker import check
from tests.reliability.cluster import Cluster, free_port, own_cluster

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
DATABASE = "pgb_bouncer"
WORKERS = 3
CONCURRENCY = 4
#: Every error PostgreSQL or psycopg gives for a prepared statement that a pooled server
#: connection does not have, or has from another client ("does not exist", "already exists").
PREPARED = "prepared statement"
ONLY_TICK = {
    "tick": {"JOB": "tests.noop", "EVERY": 1, "CATCH_UP": "all"},
    "pgoutbox.prune": None,
    "pgoutbox.recover_leases": None,
    "pgoutbox.reconcile_outbox": None,
}
SETTINGS: dict[str, Any] = {
    # "notifications" waits 30 s between polls: a job there starts at once only if the NOTIFY
    # sent through the pooler reaches the worker's LISTEN on its direct connection.
    "QUEUES": {"notifications": {"POLL_INTERVAL": 30}},
    # Long enough that a worker slowed by the busy machine keeps its leases: a job runs twice
    # only when its worker was killed.
    "LEASE_SECONDS": 4,
    "POLL_INTERVAL": 1,
    "OUTBOX": {"CLAIM_SECONDS": 2},
    "LISTEN_DATABASES": {"default": "direct"},
    "SCHEDULES": ONLY_TICK,
}


class Bouncer:
    """PgBouncer in transaction mode on a free port, in front of ``cluster``."""

    def __init__(self, cluster: Cluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        self.port = free_port()
        self.log = directory / "pgbouncer.log"
        self.config = directory / "pgbouncer.ini"
        (directory / "users.txt").write_text('"postgres" ""\n')
        self.config.write_text(
            "[databases]\n"
            f"* = host={cluster.host} port={cluster.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
            "admin_users = postgres\npool_mode = transaction\n"
            "default_pool_size = 20\nmax_client_conn = 1000\n"
            f"logfile = {self.log}\npidfile = {directory / 'pgbouncer.pid'}\n"
            # Only what goes wrong: a connection and a disconnection for every handler attempt
            # (Django's CONN_MAX_AGE = 0) would fill the log.
            "log_connections = 0\nlog_disconnections = 0\n"
            # Each transaction to the server connection used least recently, not the one just
            # left: a statement prepared on one is all the likelier to be missed on the next.
            "server_round_robin = 1\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [PGBOUNCER, str(self.config)]
        if os.geteuid() == 0:  # it refuses to run as root
            owner = pwd.getpwnam("postgres")
            for path in self.directory.iterdir():
                os.chown(path, owner.pw_uid, owner.pw_gid)
            os.chown(self.directory, owner.pw_uid, owner.pw_gid)
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

        def answers() -> bool:
            """PgBouncer answers on its admin console"""
            assert self.process is not None
            assert self.process.poll() is None, self.log_text()
            with contextlib.suppress(psycopg.OperationalError):
                self.admin("SHOW VERSION")
                return True
            return False

        wait_for(answers, timeout=20, interval=0.1)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(OSError, ValueError):
            # PgBouncer's own pid: runuser, in between, waits for it.
            pid = int((self.directory / "pgbouncer.pid").read_text())
            os.kill(pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=scaled(10))

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A ``SHOW`` command of the admin console, its rows as dicts."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(command)
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def pgbouncer(cluster: Cluster) -> Iterator[Bouncer]:
    if not Path(PGBOUNCER).exists():
        pytest.skip(f"no pgbouncer binary ({PGBOUNCER}): apt-get install pgbouncer")
    directory = Path(tempfile.mkdtemp(prefix="pgoutbox-pgbouncer-"))
    bouncer = Bouncer(cluster, directory)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(directory, ignore_errors=True)


# -- the producer: a process of its own, whose Django reaches the database through the pooler ----


def produce(plan: dict[str, Any], acknowledged: Path) -> None:
    """Enqueue ``plan["jobs"]`` jobs and publish ``plan["events"]`` events over about
    ``plan["seconds"]``, writing the ids of each committed transaction to ``acknowledged``.

    By every path: ``enqueue()`` calls in a transaction (with an event or two in the same one:
    the transactional outbox), ``enqueue_many()`` of a few items (an INSERT) and of more than
    ``COPY_MIN_ROWS`` (a binary COPY).
    """
    from django.db import transaction

    from django_pgoutbox import enqueue, enqueue_many, publish

    rng = random.Random(plan["seed"])
    jobs, events = plan["jobs"], plan["events"]
    started = time.monotonic()
    done_jobs = done_events = 0

    def behave() -> dict[str, Any]:
        return {"job_type": "tests.behave", "payload": {"sleep": rng.choice([0, 0.005, 0.02])}}

    with acknowledged.open("a") as out:
        with transaction.atomic():
            stamp = enqueue("tests.stamp", {}, queue="notifications")
        out.write(json.dumps({"stamp": str(stamp.pk)}) + "\n")
        out.flush()
        while done_jobs < jobs or done_events < events:
            way = rng.choice(["enqueue", "enqueue", "insert", "copy"])
            count = min(jobs - done_jobs, {"enqueue": 8, "insert": 20, "copy": 100}[way])
            publishing = min(events - done_events, rng.randint(0, 3))
            with transaction.atomic():
                if way == "enqueue":
                    ids = [enqueue(**behave()).pk for _ in range(count)]
                else:
                    ids = [job.pk for job in enqueue_many([behave() for _ in range(count)])]
                published = [
                    publish(
                        "tests.projected",
                        aggregate_type="pgbouncer",
                        aggregate_id=uuid.uuid4(),
                        payload={"sequence": 0},
                    ).pk
                    for _ in range(publishing)
                ]
            # Committed: acknowledged.
            batch = {"jobs": [str(i) for i in ids], "events": [str(e) for e in published]}
            out.write(json.dumps(batch) + "\n")
            out.flush()
            done_jobs += count
            done_events += publishing
            # At the pace the plan asks for, so that workers die while jobs keep coming.
            ahead = (done_jobs / max(jobs, 1)) * plan["seconds"] - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


def run_producer(
    bouncer: Bouncer, direct_url: str, plan: dict[str, Any], directory: Path
) -> subprocess.Popen[bytes]:
    acknowledged = directory / "acknowledged.jsonl"
    code = (
        "import django, json, sys; from pathlib import Path; django.setup(); "
        "from tests.reliability.test_pgbouncer import produce; "
        "produce(json.loads(sys.argv[1]), Path(sys.argv[2]))"
    )
    with (directory / "producer.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(plan), str(acknowledged)],
            cwd=ROOT,
            env={
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "testproject.settings",
                "DATABASE_URL": bouncer.url(DATABASE),
                "PGOUTBOX_TEST_DIRECT_URL": direct_url,
                "PGAPPNAME": "pgoutbox-test-producer",
            },
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def read_acknowledged(directory: Path) -> tuple[list[uuid.UUID], list[uuid.UUID], str]:
    """The jobs and events the producer has committed so far, and its first job's id."""
    jobs: list[uuid.UUID] = []
    events: list[uuid.UUID] = []
    stamp = ""
    path = directory / "acknowledged.jsonl"
    text = path.read_text() if path.exists() else ""
    for line in text.split("\n")[:-1]:  # whole lines: the producer may be writing the last
        batch = json.loads(line)
        stamp = batch.get("stamp", stamp)
        jobs += [uuid.UUID(i) for i in batch.get("jobs", [])]
        events += [uuid.UUID(e) for e in batch.get("events", [])]
    return jobs, events, stamp


# -- connections: to the pooler, from the pooler, and direct ---------------------------------------


class Connections:
    def __init__(self, cluster: Cluster, bouncer: Bouncer) -> None:
        self.cluster = cluster
        self.bouncer = bouncer

    def server_rows(self, name: str) -> list[tuple[int, str, bool]]:
        """(client port, state, in a transaction) of the server's backends named ``name``."""
        return [
            (int(port), str(state), bool(in_transaction))
            for port, state, in_transaction in self.cluster.execute(
                DATABASE,
                "SELECT client_port, state, xact_start IS NOT NULL FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                [name],
            )
        ]

    def pooled_ports(self) -> set[int]:
        """The ports the pooler's own server connections come from."""
        return {int(row["local_port"]) for row in self.bouncer.admin("SHOW SERVERS")}

    def direct(self, worker: WorkerProcess) -> int:
        """The worker's connections that go straight to the server, not through the pooler."""
        rows = self.server_rows(worker.application_name)
        pooled = self.pooled_ports()  # after the rows: every pooled one among them is listed
        return sum(1 for port, _, _ in rows if port not in pooled)

    def listening_directly(self, worker: WorkerProcess) -> bool:
        """the worker LISTENs on a direct connection"""
        rows = self.cluster.execute(
            DATABASE,
            "SELECT client_port FROM pg_stat_activity WHERE application_name = %s "
            "AND state = 'idle' AND query ILIKE 'LISTEN%%'",
            [worker.application_name],
        )
        pooled = self.pooled_ports()
        return any(int(port) not in pooled for (port,) in rows)

    def counts(self, workers: list[WorkerProcess]) -> dict[str, Any]:
        """Per worker: clients of the pooler, server connections serving it now, direct ones;
        and the pool's totals."""
        clients = self.bouncer.admin("SHOW CLIENTS")
        servers = self.bouncer.admin("SHOW SERVERS")
        by_pointer = {row["ptr"]: row["application_name"] for row in clients}
        per_worker = {}
        for n, worker in enumerate(workers):
            name = worker.application_name
            per_worker[n] = {
                "clients": sum(1 for row in clients if row["application_name"] == name),
                "servers": sum(1 for row in servers if by_pointer.get(row["link"]) == name),
                "direct": self.direct(worker),
            }
        pool = next(row for row in self.bouncer.admin("SHOW POOLS") if row["database"] == DATABASE)
        return {
            "workers": per_worker,
            "clients": pool["cl_active"] + pool["cl_waiting"],
            "waiting": pool["cl_waiting"],
            "servers": sum(
                pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
            ),
            "servers_active": pool["sv_active"],
        }

    def wait_until_gone(self, worker: WorkerProcess) -> None:
        """Every statement and transaction the killed ``worker`` had on the server has ended,
        and its direct connection is closed (its idle pooled ones stay with the pooler)."""

        def gone() -> bool:
            """the killed worker's backends are done"""
            rows = self.server_rows(worker.application_name)
            pooled = self.pooled_ports()
            return not any(
                port not in pooled or state != "idle" or in_transaction
                for port, state, in_transaction in rows
            )

        wait_for(gone, timeout=30, interval=0.1)


def alive(workers: list[WorkerProcess]) -> None:
    """Fail at once, with its last words, when a worker exits by itself."""
    for worker in workers:
        assert worker.process.poll() is None, worker.output()[-3000:]


def kill(worker: WorkerProcess, connections: Connections) -> None:
    worker.process.send_signal(signal.SIGKILL)
    worker.process.wait(timeout=scaled(10))
    connections.wait_until_gone(worker)


# -- the test ------------------------------------------------------------------------------------


def tick_slots(cluster: Cluster) -> list[datetime]:
    rows = cluster.execute(
        DATABASE, "SELECT idempotency_key FROM jobs WHERE idempotency_key LIKE 'schedule:tick:%%'"
    )
    return sorted(datetime.fromisoformat(str(key).split(":", 2)[2]) for (key,) in rows)


def prepared_statement_errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if PREPARED in line.lower()]


def drain_through_pgbouncer(
    start_worker: Any, tmp_path: Path, jobs: int, events: int, seconds: float, kills: int
) -> None:
    seed = seed_or(20261206)
    rng = random.Random(seed)
    began = time.monotonic()
    with own_cluster() as cluster, pgbouncer(cluster) as bouncer:
        direct_url = cluster.migrated_database(DATABASE)
        pooled_url = bouncer.url(DATABASE)
        connections = Connections(cluster, bouncer)
        env = {"PGOUTBOX_TEST_DIRECT_URL": direct_url}

        def count(sql: str) -> int:
            return int(cluster.execute(DATABASE, sql)[0][0])

        serial = 0
        worker_ids: dict[int, str] = {}

        def spawn() -> WorkerProcess:
            nonlocal serial
            serial += 1
            worker: WorkerProcess = start_worker(
                "--roles", "jobs,relay,scheduler", "--queues", "default,notifications",
                "--concurrency", str(CONCURRENCY), "--worker-id", f"pgbouncer-{serial}",
                database_url=pooled_url, env=env, **SETTINGS,
            )  # fmt: skip
            worker_ids[worker.pid] = f"pgbouncer-{serial}"
            return worker

        def busy(workers: list[WorkerProcess], rng: random.Random) -> int:
            """a worker that is up has jobs in flight (its index + 1, as a true value)"""
            alive(workers)
            names = {worker_ids[worker.pid]: n for n, worker in enumerate(workers)}
            holding = [
                names[str(name)]
                for (name,) in cluster.execute(
                    DATABASE,
                    "SELECT DISTINCT worker_ids->>-1 FROM jobs WHERE status = 'leased'",
                )
                if name in names
            ]
            return rng.choice(sorted(holding)) + 1 if holding else 0

        def ready(worker: WorkerProcess) -> None:
            def listening() -> bool:
                """the worker LISTENs on a direct connection, not through the pooler"""
                return connections.listening_directly(worker)

            wait_for(listening, timeout=60)

        workers = [spawn() for _ in range(WORKERS)]
        all_started = list(workers)
        for worker in workers:
            ready(worker)
        # Past their first claims: from now on, only a wake-up claims from "notifications".
        time.sleep(scaled(1))
        idle = connections.counts(workers)
        print(f"\n{time.monotonic() - began:.1f}s: the workers are up")

        producer = run_producer(
            bouncer, direct_url, {"jobs": jobs, "events": events, "seconds": seconds, "seed": seed},
            tmp_path,
        )  # fmt: skip
        try:
            wait_for(lambda: len(read_acknowledged(tmp_path)[0]) >= jobs // 10, timeout=60)
            loaded: list[dict[str, Any]] = []
            left_at_kills: list[int] = []
            killed: set[int] = set()
            while len(left_at_kills) < kills:
                pause = time.monotonic() + rng.uniform(1.0, 2.5)
                while time.monotonic() < pause:
                    loaded.append(connections.counts(workers))
                    time.sleep(0.2)
                victim = wait_for(lambda: busy(workers, rng), timeout=30, interval=0.1) - 1
                left_at_kills.append(count("SELECT count(*) FROM jobs WHERE status <> 'completed'"))
                killed.add(workers[victim].pid)
                kill(workers[victim], connections)
                print(f"{time.monotonic() - began:.1f}s: killed a worker")
                workers[victim] = spawn()
                all_started.append(workers[victim])
            deadline = time.monotonic() + scaled(120)
            while producer.poll() is None and time.monotonic() < deadline:
                loaded.append(connections.counts(workers))
                time.sleep(0.2)
            assert producer.wait(timeout=1) == 0, (tmp_path / "producer.log").read_text()
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        print(f"{time.monotonic() - began:.1f}s: the producer is done")
        for worker in workers:
            ready(worker)
        stamp = read_acknowledged(tmp_path)[2]

        def stamped() -> list[tuple[Any, ...]]:
            """the stamp job ran"""
            return cluster.execute(
                DATABASE,
                "SELECT extract(epoch FROM created_at)::float8, (result->>'started')::float8 "
                "FROM jobs WHERE id = %s AND status = 'completed'",
                [stamp],
            )

        created, started = wait_for(stamped, timeout=30)[0]
        woke_in = started - created
        print(
            f"woken through the direct LISTEN: a job started {woke_in * 1000:.0f} ms after its "
            "enqueue through the pooler (poll: 30 s)"
        )
        assert woke_in < scaled(5), woke_in
        acknowledged_jobs, acknowledged_events, _ = read_acknowledged(tmp_path)
        assert len(acknowledged_jobs) == jobs
        assert len(acknowledged_events) == events

        def drained() -> bool:
            """every job and event is done"""
            alive(workers)
            loaded.append(connections.counts(workers))
            return (
                count("SELECT count(*) FROM jobs WHERE status <> 'completed'") == 0
                and count("SELECT count(*) FROM outbox_events WHERE processed_at IS NULL") == 0
            )

        wait_for(drained, timeout=60 + jobs / 20, interval=0.5)
        print(f"{time.monotonic() - began:.1f}s: drained")
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(timeout=30) == 0

        # 3. The checks.
        ends = cluster.execute(
            DATABASE, "SELECT job_id::text, pid FROM testjobs_sideeffect WHERE event = 'end'"
        )
        verdict = check(acknowledged_jobs, [uuid.UUID(job_id) for job_id, _ in ends])
        # A job runs again only after an attempt lost with a killed worker: at most one of its
        # runs was in a worker that lived on, and each other run is an attempt that the lease
        # recovery logged as lost with a killed worker.
        runs = Counter(job_id for job_id, _ in ends)
        runs_not_killed = Counter(job_id for job_id, pid in ends if pid not in killed)
        killed_ids = {worker_ids[pid] for pid in killed}
        lost = {
            job_id: sum(
                1
                for entry in log
                if entry.get("outcome") == "lost" and entry.get("worker") in killed_ids
            )
            for job_id, log in cluster.execute(
                DATABASE,
                "SELECT id::text, attempt_log FROM jobs WHERE id = ANY(%s::uuid[])",
                [[job_id for job_id, n in runs.items() if n > 1]],
            )
        }
        rerun_not_after_a_kill = [
            job_id
            for job_id, n in runs.items()
            if n > 1 and (runs_not_killed[job_id] > 1 or n - 1 > lost.get(job_id, 0))
        ]
        projected = [
            uuid.UUID(str(event_id))
            for (event_id,) in cluster.execute(DATABASE, "SELECT event_id FROM testjobs_projection")
        ]
        # Each projection enqueued one job in the relay's transaction: once per event too.
        ((projection_jobs, projected_events),) = cluster.execute(
            DATABASE,
            "SELECT count(*), count(DISTINCT payload->>'event') FROM jobs "
            "WHERE job_type = 'tests.noop' AND payload ? 'event'",
        )
        slots = tick_slots(cluster)
        leased = count("SELECT count(*) FROM jobs WHERE status = 'leased'")
        errors = {
            **{w.log_path.name: prepared_statement_errors(w.output()) for w in all_started},
            "pgbouncer.log": prepared_statement_errors(bouncer.log_text()),
            "server.log": prepared_statement_errors(cluster.log.read_text(errors="replace")),
        }
        print(f"seed {seed}; workers SIGKILLed and replaced with {left_at_kills} jobs left")
        print(f"jobs: {verdict}")
        print(f"events: {len(acknowledged_events)} published, {len(projected)} projected")
        print(f"schedule: {len(slots)} slots")
        report_connections(idle, loaded)

        assert not any(errors.values()), errors
        assert verdict.lost == 0
        assert verdict.unexpected == 0
        # Duplicates only for jobs in flight when a worker was killed. Not "at most its
        # threads": a thread may end several jobs while their outcomes wait for the lane's
        # next statement.
        assert not rerun_not_after_a_kill, rerun_not_after_a_kill
        assert len(projected) == len(set(projected)) == len(acknowledged_events)
        assert set(projected) == set(acknowledged_events)
        assert projection_jobs == projected_events == len(acknowledged_events)
        assert leased == 0
        assert len(slots) == len(set(slots))  # each slot once
        assert slots
        assert {b - a for a, b in pairwise(slots)} == {timedelta(seconds=1)}, slots


def report_connections(idle: dict[str, Any], loaded: list[dict[str, Any]]) -> None:
    """Print the connection counts: each worker's idle, the most any had under load, the pool's."""
    print(
        "idle, per worker process: "
        + ", ".join(
            f"{c['clients']} to the pooler ({c['servers']} server connection(s) serving it) "
            f"+ {c['direct']} direct"
            for c in idle["workers"].values()
        )
        + f"; the pool: {idle['clients']} clients on {idle['servers']} server connections"
    )
    # Workers that are up (listening): not a replacement still starting.
    per_worker = [c for sample in loaded for c in sample["workers"].values() if c["direct"]]
    if per_worker:
        clients = sorted(c["clients"] for c in per_worker)
        print(
            f"under load ({len(loaded)} samples), per worker process: "
            f"{clients[len(clients) // 2]} to the pooler (median), at most {clients[-1]}; "
            f"at most {max(c['servers'] for c in per_worker)} server connection(s) serving one "
            f"at once; {max(c['direct'] for c in per_worker)} direct"
        )
        print(
            f"under load, the pool: at most {max(s['clients'] for s in loaded)} clients "
            f"({max(s['waiting'] for s in loaded)} waiting) on at most "
            f"{max(s['servers'] for s in loaded)} server connections, "
            f"{max(s['servers_active'] for s in loaded)} active at once"
        )


def test_drain_through_pgbouncer_with_kills(start_worker: Any, tmp_path: Path) -> None:
    drain_through_pgbouncer(start_worker, tmp_path, jobs=1500, events=150, seconds=6, kills=2)


@pytest.mark.skipif(not LONG, reason="the long variant: PGOUTBOX_LONG_TESTS=1")
def test_drain_through_pgbouncer_with_kills_long(start_worker: Any, tmp_path: Path) -> None:
    drain_through_pgbouncer(start_worker, tmp_path, jobs=12000, events=1500, seconds=60, kills=12)


def test_a_lost_prepared_statement_names_the_setting_to_change() -> None:
    """Without the pooling signs, a worker's lanes prepare statements, and PgBouncer 1.18 loses
    them: the first lane to miss one stops the worker (run by hand: within 10 s, 300 jobs
    waiting, two workers). Its log says what to set, not only psycopg's words."""
    from django_pgoutbox.db import error_hint

    for lost in (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement):
        hint = error_hint(lost('prepared statement "_pg3_1" does not exist'), "default")
        assert "database 'default'" in hint
        assert '"DISABLE_SERVER_SIDE_CURSORS": True' in hint
        assert '"prepare_threshold": None' in hint
    assert error_hint(psycopg.errors.UndefinedTable("no such table"), "default") == ""
