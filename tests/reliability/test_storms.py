"""Retry storms and connection exhaustion, on a PostgreSQL cluster of the test's own.

Storm: ``JOBS`` jobs all fail with a ``TransientError`` at their first attempt and are retried
once by real ``runworkers`` processes. The test reads when each first attempt failed, when its
retry became due (``run_at``) and when the retry was claimed (``locked_at``), prints per-second
histograms, the spread of due times and of claim lags, and the most claims in one second, and
checks that the jitter spreads the retries: the busiest second of due times holds at most what
the jitter's own spread allows (see :func:`busiest_due_bound`), not the whole storm.

Exhaustion: a cluster with a low ``max_connections``; while workers run a stream of jobs whose
handler uses the ORM, the test takes every connection slot left for ``HELD`` seconds and starts
one more worker. Nothing may exit, the logs stay bounded (no traceback per attempt), the ORM's
failure to connect (SQLSTATE 53300) is a named, retried outcome, and once the slots are free
every worker recovers by itself and drains everything (checker: nothing lost).

The fast variants run with the suite (``BASE_DELAY`` 4 s, slots held 10 s);
``PGOUTBOX_LONG_TESTS=1`` runs the long ones (``BASE_DELAY`` 10 s, slots held 30 s).
``PGOUTBOX_STORM_BASE_DELAY`` and ``PGOUTBOX_STORM_JITTER`` set the storm's policy, to measure
another (the defaults, 1 and 0.1: the first retries come due within 0.4 s of each other, so a
storm's retries come due as closely together as its failures happened).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from django_pgoutbox.db import ERROR_BACKOFF
from django_pgoutbox.health import HEARTBEAT_SECONDS
from django_pgoutbox.management.commands.runworkers import START_WAIT
from django_pgoutbox.worker.listener import RECONNECT_BACKOFF
from tests.processes import wait_for
from tests.processes.reliability.checker import check
from tests.reliability.cluster import Cluster, own_cluster

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
#: The database of both tests on the module's cluster.
DATABASE = "storms"

#: Jobs of the storm; every one fails once, then completes.
JOBS = 10_000
#: The storm's retry policy: the first retry is due ``BASE_DELAY * 2`` after the failure,
#: moved by up to ``JITTER`` of itself either way (``retry.backoff``).
BASE_DELAY = float(os.environ.get("PGOUTBOX_STORM_BASE_DELAY") or (10.0 if LONG else 4.0))
JITTER = float(os.environ.get("PGOUTBOX_STORM_JITTER") or 0.5)
STORM_WORKERS = 2
STORM_CONCURRENCY = 8

#: Workers are plain processes: no query log per connection (``DEBUG``).
QUIET = {"PGOUTBOX_DEBUG": "0"}


def _cluster_rows(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> list[Any]:
    return conn.execute(sql, params).fetchall()


def busiest_due_bound(jobs: int, base_delay: float, jitter: float) -> float:
    """The most retries that may come due in one second when the jitter spreads them.

    The first retry's delay is uniform over ``2 * BASE_DELAY * (1 ± JITTER)``: a density of
    ``1 / (4 * BASE_DELAY * JITTER)`` per second. Each due time is a failure time plus such a
    delay, and the density of a sum is never higher than that of either term: however close
    together the failures, one second holds about ``jobs / (4 * BASE_DELAY * JITTER)`` of the
    due times, plus a binomial deviation (five standard deviations here).
    """
    width = 4 * base_delay * jitter
    expected = jobs * min(1.0, 1.0 / width) if width > 0 else jobs
    return expected + 5 * math.sqrt(expected)


def _histogram(times: list[float], origin: float) -> Counter[int]:
    return Counter(math.floor(t - origin) for t in times)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _show(name: str, histogram: Counter[int]) -> str:
    return f"{name}: " + " ".join(f"{s}:{histogram[s]}" for s in sorted(histogram))


@pytest.fixture(scope="module")
def module_cluster() -> Iterator[Cluster]:
    """One cluster and one migrated database (``DATABASE``) for the module's tests: making and
    migrating one takes about 20 s on a busy two-core machine."""
    with own_cluster() as cluster:
        cluster.migrated_database(DATABASE)
        yield cluster


def fresh_database(cluster: Cluster, max_connections: int) -> str:
    """The module's database, emptied, on its cluster restarted with ``max_connections`` if it
    has another; its URL."""
    current = int(cluster.execute(DATABASE, "SHOW max_connections")[0][0])
    if current != max_connections:
        cluster.execute("postgres", f"ALTER SYSTEM SET max_connections = {max_connections}")
        cluster.restart()
    cluster.execute(DATABASE, "TRUNCATE jobs, testjobs_sideeffect, worker_heartbeats CASCADE")
    return cluster.url(DATABASE)


def test_retry_storm_is_spread_by_the_jitter(module_cluster: Cluster, start_worker: Any) -> None:
    storm_cluster = module_cluster
    url = fresh_database(storm_cluster, 100)
    with storm_cluster.connect(DATABASE) as conn:
        acknowledged = [
            row[0]
            for row in _cluster_rows(
                conn,
                "INSERT INTO jobs (queue, job_type, payload) "
                "SELECT 'default', 'tests.storm', %s::jsonb FROM generate_series(1, %s) "
                "RETURNING id",
                [json.dumps({"fail_attempts": 1}), JOBS],
            )
        ]
    started = time.monotonic()
    workers = [
        start_worker(
            "--queues",
            "default",
            "--concurrency",
            str(STORM_CONCURRENCY),
            database_url=url,
            env=QUIET,
            LEASE_SECONDS=30,
            POLL_INTERVAL=0.5,
            RETRY={"BASE_DELAY": BASE_DELAY, "MAX_DELAY": 600.0, "JITTER": JITTER},
        )
        for _ in range(STORM_WORKERS)
    ]

    def done() -> bool:
        """every job of the storm has left the queue (completed, dead or cancelled)"""
        rows = storm_cluster.execute(
            DATABASE,
            "SELECT count(*) FROM jobs WHERE status NOT IN ('completed', 'dead', 'cancelled')",
        )
        assert all(w.process.poll() is None for w in workers), "a worker exited"
        return int(rows[0][0]) == 0

    wait_for(done, timeout=60 + 4 * BASE_DELAY * (1 + JITTER), interval=0.5)
    elapsed = time.monotonic() - started

    with storm_cluster.connect(DATABASE) as conn:
        statuses = dict(_cluster_rows(conn, "SELECT status, count(*) FROM jobs GROUP BY status"))
        attempts = dict(_cluster_rows(conn, "SELECT attempts, count(*) FROM jobs GROUP BY 1"))
        rows = _cluster_rows(
            conn,
            "SELECT extract(epoch FROM (attempt_log->0->>'started_at')::timestamptz), "
            "extract(epoch FROM (attempt_log->0->>'ended_at')::timestamptz), "
            "extract(epoch FROM run_at), extract(epoch FROM locked_at) "
            "FROM jobs WHERE attempt_log IS NOT NULL",
        )
        executions = [
            r[0]
            for r in _cluster_rows(
                conn, "SELECT job_id FROM testjobs_sideeffect WHERE event = 'end'"
            )
        ]
    first_starts = [float(r[0]) for r in rows]
    failures = [float(r[1]) for r in rows]
    dues = [float(r[2]) for r in rows]
    claims = [float(r[3]) for r in rows]
    origin = min(first_starts)
    due_histogram = _histogram(dues, origin)
    claim_histogram = _histogram(first_starts + claims, origin)
    failure_histogram = _histogram(failures, origin)
    lags = [c - d for c, d in zip(claims, dues, strict=True)]
    due_spread = sorted(d - min(dues) for d in dues)
    busiest_due = max(due_histogram.values())
    bound = busiest_due_bound(JOBS, BASE_DELAY, JITTER)
    verdict = check(acknowledged, executions)
    print(
        f"\nretry storm: {JOBS} jobs, {STORM_WORKERS} workers x {STORM_CONCURRENCY} threads, "
        f"BASE_DELAY={BASE_DELAY:g} JITTER={JITTER:g}; all done in {elapsed:.1f}s\n"
        f"statuses {statuses}, attempts {attempts}; {verdict}\n"
        f"first failures over {max(failures) - min(failures):.2f}s; "
        f"retries due over {due_spread[-1]:.2f}s "
        f"(p50 {_percentile(due_spread, 0.5):.2f}s, p95 {_percentile(due_spread, 0.95):.2f}s "
        f"after the first)\n"
        f"claim lag after due: p50 {_percentile(lags, 0.5):.3f}s, "
        f"p95 {_percentile(lags, 0.95):.3f}s, max {max(lags):.3f}s\n"
        f"busiest second of due retries: {busiest_due} (bound {bound:.0f}); "
        f"most claims in one second: {max(claim_histogram.values())}; "
        f"most failures in one second: {max(failure_histogram.values())}\n"
        f"{_show('failures/s', failure_histogram)}\n"
        f"{_show('due/s', due_histogram)}\n"
        f"{_show('claims/s', claim_histogram)}"
    )
    assert statuses == {"completed": JOBS}
    assert attempts == {2: JOBS}
    assert len(rows) == JOBS
    assert verdict.lost == 0
    assert verdict.duplicated == 0
    assert verdict.unexpected == 0
    assert busiest_due <= bound, (
        f"{busiest_due} retries came due in one second, more than the jitter allows ({bound:.0f})"
    )


# -- connection exhaustion -------------------------------------------------------------------------

#: The exhaustion cluster's ``max_connections`` (``superuser_reserved_connections`` stays 3; the
#: test connects as a superuser, as the workers do, so it can take every slot).
MAX_CONNECTIONS = 20
#: Seconds every slot is held: less than ``runworkers.START_WAIT``, the most a worker started
#: meanwhile waits for a connection before it gives up.
HELD = 30.0 if LONG else 10.0
assert HELD < START_WAIT
EXHAUST_WORKERS = 2
EXHAUST_CONCURRENCY = 2
#: Jobs offered per second while the slots are held and before.
STREAM_RATE = 40
#: The retry policy of the exhaustion: short, so that the backlog goes soon after the release.
EXHAUST_RETRY = {"BASE_DELAY": 0.25, "MAX_DELAY": 2.0, "JITTER": 0.5}


def tries_within(seconds: float, backoff: tuple[float, float]) -> int:
    """How many times a loop that waits ``backoff[0]`` after its first failure, twice as long
    after each next one up to ``backoff[1]``, tries within ``seconds``: a warning each."""
    pause, spent, tries = backoff[0], 0.0, 1
    while spent + pause <= seconds:
        spent += pause
        pause = min(pause * 2, backoff[1])
        tries += 1
    return tries


def log_records_bound(seconds: float) -> int:
    """The most log records, other than one per failed attempt of a job, that a worker whose
    every connection is refused for ``seconds`` may write: one per try of each of its loops
    (two lanes and the listener back off; the heartbeat beats), and a few more (a lease it saw
    expire, the start)."""
    return (
        2 * tries_within(seconds, ERROR_BACKOFF)
        + tries_within(seconds, RECONNECT_BACKOFF)
        + int(seconds / HEARTBEAT_SECONDS)
        + 1
        + 2 * EXHAUST_CONCURRENCY
    )


class SlotTaker:
    """Takes every free connection slot of a cluster, and keeps taking each one that frees."""

    def __init__(self, cluster: Cluster, database: str) -> None:
        self.cluster = cluster
        self.database = database
        self.held: list[psycopg.Connection[Any]] = []
        self.refusals: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slot-taker", daemon=True)

    def _take_all(self) -> None:
        while not self._stop.is_set():
            try:
                self.held.append(
                    psycopg.connect(
                        self.cluster.url(self.database), autocommit=True, connect_timeout=5
                    )
                )
            except psycopg.OperationalError as error:
                self.refusals[error.sqlstate or str(error).strip().splitlines()[-1]] += 1
                return

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take_all()
            self._stop.wait(0.02)

    def start(self) -> None:
        self._take_all()
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for conn in self.held:
            conn.close()
        self.held.clear()


def _other_records(text: str) -> list[str]:
    """The log's records that are not a job's attempt (``job ... attempt``): the first line
    of each (the lines after it of a message that spans several start with a blank)."""
    return [
        line
        for line in text.splitlines()
        if line.strip() and not line[0].isspace() and not line.startswith("job ")
    ]


def test_connection_exhaustion_recovers(module_cluster: Cluster, start_worker: Any) -> None:
    small_cluster = module_cluster
    url = fresh_database(small_cluster, MAX_CONNECTIONS)
    settings: dict[str, Any] = {
        "LEASE_SECONDS": 2,
        "POLL_INTERVAL": 0.5,
        "RETRY": EXHAUST_RETRY,
    }
    monitor = small_cluster.connect(DATABASE)
    producer_conn = small_cluster.connect(DATABASE)
    acknowledged: list[Any] = []
    stop_stream = threading.Event()

    def stream() -> None:
        payload = json.dumps({"orm": True, "sleep": 0.01})
        while not stop_stream.wait(0.1):
            acknowledged.extend(
                row[0]
                for row in producer_conn.execute(
                    "INSERT INTO jobs (queue, job_type, payload, max_attempts) "
                    "SELECT 'default', 'tests.storm', %s::jsonb, 50 "
                    "FROM generate_series(1, %s) RETURNING id",
                    [payload, STREAM_RATE // 10],
                ).fetchall()
            )

    def alive(worker: Any) -> bool:
        return bool(worker.process.poll() is None)

    def connections_of(worker: Any) -> int:
        return int(
            monitor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [worker.application_name],
            ).fetchone()[0]  # type: ignore[index]
        )

    def failed_attempts() -> int:
        return int(
            monitor.execute(
                "SELECT coalesce(sum(jsonb_array_length(attempt_log)), 0) FROM jobs"
            ).fetchone()[0]  # type: ignore[index]
        )

    producer = threading.Thread(target=stream, name="stream", daemon=True)
    taker = SlotTaker(small_cluster, DATABASE)
    try:
        workers = [
            start_worker(
                "--queues",
                "default",
                "--concurrency",
                str(EXHAUST_CONCURRENCY),
                database_url=url,
                env=QUIET,
                **settings,
            )
            for _ in range(EXHAUST_WORKERS)
        ]
        producer.start()

        def completing() -> bool:
            """the workers complete jobs of the stream"""
            done = monitor.execute("SELECT count(*) FROM jobs WHERE status = 'completed'")
            return int(done.fetchone()[0]) >= STREAM_RATE  # type: ignore[index]

        def running() -> bool:
            """every worker holds its lane, listener and heartbeat connections"""
            assert all(alive(w) for w in workers), "a worker exited before the slots were taken"
            return all(connections_of(w) >= 3 for w in workers)

        wait_for(completing, timeout=60, interval=0.2)
        wait_for(running, timeout=60, interval=0.2)
        before = {w.pid: len(w.output()) for w in workers}
        failed_before = failed_attempts()

        taker.start()
        full_at = time.monotonic()
        assert taker.refusals, "the cluster never refused a connection"
        # One worker loses every connection while the server is full: it must reconnect into it.
        cut = int(
            monitor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                [workers[0].application_name],
            ).fetchone()[0]  # type: ignore[index]
        )
        held_by_the_cut = int(
            monitor.execute(
                "SELECT count(*) FROM jobs WHERE status = 'leased' AND locked_by LIKE %s",
                [f"%:{workers[0].pid}:%"],
            ).fetchone()[0]  # type: ignore[index]
        )
        late = start_worker(
            "--queues",
            "default",
            "--concurrency",
            str(EXHAUST_CONCURRENCY),
            database_url=url,
            env=QUIET,
            **settings,
        )
        workers.append(late)
        before[late.pid] = 0
        held_for = HELD  # the fault lasts as long on any machine: not a deadline
        while time.monotonic() - full_at < held_for:
            assert all(alive(w) for w in workers), "a worker exited while the slots were held"
            time.sleep(0.2)
        during = {w.pid: w.output()[before[w.pid] :] for w in workers}
        failed_while_held = failed_attempts() - failed_before
        slots_held = len(taker.held)
        late_connections = connections_of(late)
        states = dict(
            monitor.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
        )
        taker.release()
        released_at = time.monotonic()
        stop_stream.set()
        producer.join(timeout=30)

        late_started: list[float] = []

        def drained() -> bool:
            """every job of the stream completed, and the late worker connected"""
            assert all(alive(w) for w in workers), "a worker exited after the release"
            if not late_started and connections_of(late) >= 3:
                late_started.append(time.monotonic() - released_at)
            left = monitor.execute("SELECT count(*) FROM jobs WHERE status <> 'completed'")
            return int(left.fetchone()[0]) == 0 and bool(late_started)  # type: ignore[index]

        wait_for(drained, timeout=60, interval=0.1)
        recovered_in = time.monotonic() - released_at
        drained_jobs = monitor.execute(
            "SELECT extract(epoch FROM max(completed_at) - now()) FROM jobs"
        ).fetchone()
        executions = [
            row[0]
            for row in monitor.execute(
                "SELECT job_id FROM testjobs_sideeffect WHERE event = 'end'"
            ).fetchall()
        ]
        codes = dict(
            monitor.execute(
                "SELECT entry->>'outcome' || ' ' || (entry->>'error_code'), count(*) "
                "FROM jobs, jsonb_array_elements(coalesce(attempt_log, '[]')) AS entry "
                "GROUP BY 1"
            ).fetchall()
        )
        summaries = [
            row[0]
            for row in monitor.execute(
                "SELECT DISTINCT left(entry->>'summary', 120) "
                "FROM jobs, jsonb_array_elements(coalesce(attempt_log, '[]')) AS entry LIMIT 5"
            ).fetchall()
        ]
        most_attempts = monitor.execute("SELECT max(attempts) FROM jobs").fetchone()
        verdict = check(acknowledged, executions)
        tracebacks = {
            pid: text.count("Traceback (most recent call last)") for pid, text in during.items()
        }
        other = {pid: _other_records(text) for pid, text in during.items()}
        attempt_lines = {
            pid: sum(1 for line in text.splitlines() if line.startswith("job "))
            for pid, text in during.items()
        }
        print(
            f"\nconnection exhaustion: max_connections={MAX_CONNECTIONS}, {slots_held} slots held "
            f"{held_for:.0f}s (refused: {dict(taker.refusals)}), {len(workers)} workers "
            f"(the last started while full: {late_connections} connections then; "
            f"{cut} connections of the first terminated once full, its {held_by_the_cut} jobs "
            "leased then)\n"
            f"jobs while held: {states}; {verdict}; attempt outcomes {codes}; "
            f"most attempts {most_attempts}\n"
            f"summaries: {summaries}\n"
            f"log while held: tracebacks {tracebacks}, job attempt lines {attempt_lines}, "
            f"other lines {{pid: count}} { ({pid: len(lines) for pid, lines in other.items()}) }\n"
            f"failed attempts while held: {failed_while_held}; "
            f"the late worker ran {late_started[0]:.1f}s after the release; "
            f"all drained {recovered_in:.1f}s after the release "
            f"(the last completion {recovered_in + float(drained_jobs[0]):.1f}s after it)"  # type: ignore[index]
        )
        for pid, lines in other.items():
            print(f"other lines of {pid}:\n" + "\n".join(lines[:20]))
        assert verdict.lost == 0
        assert verdict.unexpected == 0
        assert all(alive(w) for w in workers)
        assert all(count == 0 for count in tracebacks.values()), tracebacks
        # One line per failed attempt (its outcome), never one per try to connect.
        assert sum(attempt_lines.values()) <= failed_while_held + EXHAUST_WORKERS * (
            EXHAUST_CONCURRENCY + 1
        ), (attempt_lines, failed_while_held)
        # A handler refused a connection (53300) fails its attempt with a named, retried outcome;
        # the jobs of the worker cut off were given back once their leases expired.
        assert codes.get("retrying OperationalError", 0) > 0, codes
        assert set(codes) <= {"retrying OperationalError", "lost lease_expired"}, codes
        assert codes.get("lost lease_expired", 0) <= held_by_the_cut
        # Run again: at most the jobs the cut worker held (it ran some whose outcome it could
        # no longer write).
        assert verdict.duplicated <= held_by_the_cut
        assert late_connections == 0  # it could not start while the slots were held
        # ... and said so once, then once more when it could (no traceback, no exit).
        late_log = late.output()
        assert late_log.count("unavailable at start") == 1, late_log
        assert late_log.count("answers after") == 1, late_log
        assert "Traceback" not in late_log
        bound = log_records_bound(held_for)
        assert all(len(lines) <= bound for lines in other.values()), (bound, other)
    finally:
        stop_stream.set()
        taker.release()
        monitor.close()
        producer_conn.close()


# -- a worker that cannot connect at start ---------------------------------------------------------


def test_start_waits_out_a_refused_connection_then_gives_up_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``runworkers`` while every connection is refused (no SQLSTATE, as libpq reports it):
    one warning, tries with back-off, then one ``CommandError`` line after the wait; an error
    of any other kind is raised at once."""
    from django.core.management.base import CommandError
    from django.db import OperationalError, ProgrammingError

    from django_pgoutbox.management.commands import runworkers

    tries: list[float] = []

    def refused(alias: str) -> None:
        tries.append(time.monotonic())
        raise OperationalError("connection failed: FATAL:  sorry, too many clients already")

    monkeypatch.setattr(runworkers, "require_migrated", refused)
    started = time.monotonic()
    with pytest.raises(CommandError) as raised:
        runworkers.require_migrated_once_it_answers("default", wait=1.0)
    assert 1.0 <= time.monotonic() - started < 5
    assert str(raised.value) == (
        "database 'default' still unavailable after 1s: "
        "connection failed: FATAL:  sorry, too many clients already"
    )
    assert 3 <= len(tries) <= 6  # 0.2, 0.4 then what is left of the second: a back-off
    warnings = [r.getMessage() for r in caplog.records if "unavailable at start" in r.getMessage()]
    assert len(warnings) == 1, warnings

    def broken(alias: str) -> None:
        raise ProgrammingError("permission denied for table jobs")

    monkeypatch.setattr(runworkers, "require_migrated", broken)
    with pytest.raises(ProgrammingError):
        runworkers.require_migrated_once_it_answers("default", wait=1.0)
