"""A held xmin horizon under a sustained offer, through a real worker, on a server with autovacuum.

``tests/processes/reliability/test_horizon_drain.py`` holds the horizon on the shared server,
which runs with autovacuum off. Here the server is the test's own (``cluster.py``), with
autovacuum on, PostgreSQL's defaults and the tables' own settings from the migrations: what
users have. A ``runworkers`` process drains ``RATE`` jobs a second offered by a producer process
(``horizon_producer.py``, the package's ``enqueue_many``); after a baseline, two sessions hold
the horizon together: one idle in transaction after ``txid_current()`` (a transaction that has
an id), and a ``REPEATABLE READ`` reader whose snapshot stays, reading ``jobs`` again every few
seconds like a slow report. Then both end, and the stream goes on until autovacuum has caught up.

Each ``WINDOW`` the test samples the cluster (``pg_stat_user_tables``, the sizes of ``jobs`` and
its indexes, ``pg_stat_statements`` for the claims: those that read the claim index from its
head, "full", and those past the worker's mark, "seek"), and a ``pgoutbox stats --json --watch``
process gives the package's gauge (``oldest_transaction_age``) and its horizon warning, with
``HORIZON_WARNING_SECONDS`` lowered to ``WARN_AFTER``. It prints a table of the windows and checks:

- every two consecutive windows held (6 s; but those where the offer itself fell short, and the
  next) completed at least ``KEPT`` of the rate before the hold;
- every acknowledged job ran to its end exactly once (the checker, over a side-effect row per
  run), and every job completed at its first attempt;
- the gauge and the warning name a holder from ``WARN_AFTER`` seconds held until the release
  (all but ``MISSED`` of the readings, and the last), ``pgoutbox health`` warns (and stays
  healthy) while held, and neither warns after;
- none of the worker's own sessions stays in a transaction (it would hold the horizon itself);
- after the release, an autovacuum of ``jobs`` ran, the dead tuples fell below half their peak,
  and the full claims' time came back within ``RECOVERED`` times the baseline's (or 2 ms of
  it). The recovery times are printed.

The fast variant (in the suite) holds for ``FAST_HELD`` seconds with ``autovacuum_naptime``
lowered to 10 s, so that the catch-up after the release falls within its budget. The long one
(``PGOUTBOX_LONG_TESTS=1``) holds for two minutes, or ``PGOUTBOX_HORIZON_HELD`` seconds, with
autovacuum's settings at their defaults. Both load ``pg_stat_statements``, and run with
``fsync`` off as every cluster of ``cluster.py`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.processes import scaled, wait_for
from tests.processes.reliability.checker import check
from tests.reliability.cluster import ROOT, Cluster, own_cluster

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
#: Seconds the long variant holds the horizon: the issue's two minutes unless
#: ``PGOUTBOX_HORIZON_HELD`` says otherwise.
LONG_HELD = float(os.environ.get("PGOUTBOX_HORIZON_HELD") or 120)
FAST_HELD = 24.0

#: Jobs offered per second: about a fifth of what one worker drains on a two-core machine, so
#: that the rate before the hold is the rate offered.
RATE = 1000
#: Seconds per window of the table.
WINDOW = 3.0
#: Windows before the hold: the first warms up, the others are the baseline.
BEFORE = 4
#: ``HORIZON_WARNING_SECONDS`` of the stats and health processes.
WARN_AFTER = 5.0
#: Every two consecutive windows held keep at least this share of the baseline's rate. With
#: 1,000 jobs a second offered, the windows of the fast variant measured 0.94 of it or more; in
#: the long one, a single window fell to 0.4 when other processes raised the machine's load
#: average from 8 to 16, and the next ones caught up (docs/operations.md): two windows make a
#: collapse of the drain (issue 31: to 2% of its rate) fail, not a spell of the machine's.
KEPT = 0.5
#: At most this share of the gauge's readings while held (past ``WARN_AFTER``) may miss the
#: holders: in one run of about ten, one reading of some 15 named another session of the
#: database, with no warning; the test prints such readings whole (not explained yet).
MISSED = 0.1
#: The full claims are back once they take at most this many times the baseline's (or 2 ms more).
RECOVERED = 3.0

STATEMENTS = """
SELECT coalesce(sum(calls) FILTER (WHERE NOT seek), 0)::int8,
       coalesce(sum(total_exec_time) FILTER (WHERE NOT seek), 0)::float8,
       coalesce(sum(calls) FILTER (WHERE seek), 0)::int8,
       coalesce(sum(total_exec_time) FILTER (WHERE seek), 0)::float8
FROM (
    SELECT calls, total_exec_time, query LIKE '%%(run_at, created_at, id) >%%' AS seek
    FROM pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND query LIKE '%%candidates AS MATERIALIZED%%' AND query LIKE '%%FROM jobs%%'
) claims
"""

TABLE = """
SELECT n_dead_tup, n_live_tup, autovacuum_count,
       extract(epoch FROM last_autovacuum)::float8,
       pg_relation_size('jobs'), pg_indexes_size('jobs'), pg_relation_size('jobs_claim_idx'),
       extract(epoch FROM clock_timestamp())::float8
FROM pg_stat_user_tables WHERE relname = 'jobs'
"""

#: The worker's sessions that are in a transaction, and the oldest one's age.
WORKER_TRANSACTIONS = """
SELECT count(*), coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8
FROM pg_stat_activity WHERE application_name = %s AND xact_start IS NOT NULL
"""

_DIE_WITH_THE_TEST = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


@dataclass
class Sample:
    """The cluster at the end of one window (``at``: epoch seconds, the database's clock)."""

    at: float
    dead: int
    live: int
    autovacuums: int
    last_autovacuum: float | None
    table_bytes: int
    index_bytes: int
    claim_index_bytes: int
    full_calls: int
    full_ms: float
    seek_calls: int
    seek_ms: float
    worker_in_transaction: int
    worker_oldest_transaction: float
    #: the machine's load average over the last minute: other processes slow the worker too
    load: float
    #: CPU seconds the worker process has used (user and system)
    worker_cpu: float


@dataclass
class Gauges:
    """What ``pgoutbox stats --json --watch 1`` printed, with when it arrived (epoch seconds)."""

    snapshots: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self, stream: Any) -> None:
        lines: list[str] = []
        for line in stream:
            lines.append(line)
            if line.rstrip("\n") == "}":  # the end of one object (indented two spaces)
                report = json.loads("".join(lines))
                lines = []
                with self.lock:
                    self.snapshots.append((time.time(), report))

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        with self.lock:
            return [report for at, report in self.snapshots if start <= at < end]

    def last_before(self, moment: float) -> dict[str, Any] | None:
        with self.lock:
            earlier = [report for at, report in self.snapshots if at <= moment]
        return earlier[-1] if earlier else None


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has used; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn(args: list[str], url: str, log: Path, **env: str) -> subprocess.Popen[str]:
    """A Python process of the project on ``url``, in its own session, dying with the test."""
    return subprocess.Popen(
        [*_DIE_WITH_THE_TEST, sys.executable, *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": url,
            "PGOUTBOX_DEBUG": "0",
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        stdout=subprocess.PIPE if "stats" in args else log.open("w"),
        stderr=log.open("a") if "stats" in args else subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(timeout=scaled(10))


class Sampler(threading.Thread):
    """Samples the cluster at the end of each window, from ``start`` (the database's clock)."""

    def __init__(
        self, cluster: Cluster, database: str, start: float, worker_name: str, worker_pid: int
    ) -> None:
        super().__init__(daemon=True)
        self.worker_pid = worker_pid
        self.cluster, self.database, self.start_at = cluster, database, start
        self.worker_name = worker_name
        self.samples: list[Sample] = []
        self.failure: BaseException | None = None
        self._halt = threading.Event()
        self._sampled = threading.Condition()

    def run(self) -> None:
        try:
            with self.cluster.connect(self.database) as conn:
                offset = time.time() - float(
                    conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0]  # type: ignore[index]
                )
                window = 0
                while True:
                    due = self.start_at + window * WINDOW + offset
                    if self._halt.wait(max(0.0, due - time.time())):
                        return
                    row = conn.execute(TABLE).fetchone()
                    claims = conn.execute(STATEMENTS).fetchone()
                    worker = conn.execute(WORKER_TRANSACTIONS, [self.worker_name]).fetchone()
                    assert row is not None
                    assert claims is not None
                    assert worker is not None
                    with self._sampled:
                        self.samples.append(
                            Sample(
                                at=row[7],
                                dead=row[0],
                                live=row[1],
                                autovacuums=row[2],
                                last_autovacuum=row[3],
                                table_bytes=row[4],
                                index_bytes=row[5],
                                claim_index_bytes=row[6],
                                full_calls=claims[0],
                                full_ms=claims[1],
                                seek_calls=claims[2],
                                seek_ms=claims[3],
                                worker_in_transaction=worker[0],
                                worker_oldest_transaction=worker[1],
                                load=os.getloadavg()[0],
                                worker_cpu=cpu_seconds(self.worker_pid),
                            )
                        )
                        self._sampled.notify_all()
                    window += 1
        except BaseException as error:  # shown by the test, not lost in a thread
            self.failure = error

    def wait_for_windows(self, count: int) -> None:
        """Until ``count`` windows are over (sample ``count`` is taken: sample 0 is the start)."""
        with self._sampled:
            ok = self._sampled.wait_for(
                lambda: len(self.samples) > count or self.failure is not None,
                timeout=scaled(count * WINDOW + 60),
            )
        assert self.failure is None, self.failure
        assert ok, len(self.samples)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=scaled(30))


@contextlib.contextmanager
def held_horizon(cluster: Cluster, database: str) -> Iterator[tuple[int, int]]:
    """An idle-in-transaction session that has a transaction id and a ``REPEATABLE READ``
    reader that re-reads ``jobs`` every 4 s in its snapshot; their pids. Both end at exit."""
    writer = psycopg.connect(cluster.url(database), application_name="held-writer")
    writer.execute("SELECT txid_current()")  # a transaction with an id, then idle in it
    ready = threading.Event()
    stop = threading.Event()
    reader_pid: list[int] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with cluster.connect(database, application_name="held-reader") as reader:
                reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                reader.execute("SELECT count(*) FROM jobs")  # the snapshot is taken and kept
                reader_pid.append(reader.info.backend_pid)
                ready.set()
                while not stop.wait(4.0):
                    reader.execute("SELECT count(*), max(created_at) FROM jobs").fetchone()
                reader.execute("ROLLBACK")
        except BaseException as error:
            errors.append(error)
            ready.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        assert ready.wait(scaled(30)), "the reader took no snapshot"
        assert not errors, errors
        yield writer.info.backend_pid, reader_pid[0]
    finally:
        stop.set()
        thread.join(timeout=scaled(30))
        writer.rollback()
        writer.close()
    assert not errors, errors


def health(url: str, log: Path, not_before: float = 0.0) -> dict[str, Any]:
    """``pgoutbox health --require jobs`` on ``url`` (from ``not_before``, epoch seconds): its
    report, and it must exit 0."""
    time.sleep(max(0.0, not_before - time.time()))
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "pgoutbox", "health", "--require", "jobs"],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": url,
            "PGOUTBOX_DEBUG": "0",
            "PGOUTBOX_TEST_SETTINGS": json.dumps({"HORIZON_WARNING_SECONDS": WARN_AFTER}),
        },
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=False,
    )
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def per_window(
    cluster: Cluster, database: str, start: float, windows: int
) -> dict[str, list[float]]:
    """Jobs created and completed in each window, and the median and largest wait from
    creation to claim of the jobs created in it (ms): one pass over the table each."""
    sql = """
        SELECT floor((extract(epoch FROM {column}) - %(start)s) / %(window)s)::int, count(*),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY locked_at - created_at),
               max(locked_at - created_at)
        FROM jobs
        WHERE {column} >= to_timestamp(%(start)s)
          AND {column} < to_timestamp(%(start)s + %(windows)s * %(window)s)
        GROUP BY 1
    """
    params = {"start": start, "windows": windows, "window": WINDOW}
    created = {n: (c, p50, top) for n, c, p50, top in cluster.execute(
        database, sql.format(column="created_at"), params
    )}  # fmt: skip
    completed = {n: c for n, c, _, _ in cluster.execute(
        database, sql.format(column="completed_at"), params
    )}  # fmt: skip

    def ms(value: Any) -> float:
        return 0.0 if value is None else value.total_seconds() * 1000

    return {
        "offered": [created.get(n, (0, None, None))[0] / WINDOW for n in range(windows)],
        "done": [completed.get(n, 0) / WINDOW for n in range(windows)],
        "wait_p50": [ms(created.get(n, (0, None, None))[1]) for n in range(windows)],
        "wait_max": [ms(created.get(n, (0, None, None))[2]) for n in range(windows)],
    }


def mean_ms(samples: list[Sample], n: int, kind: str) -> float | None:
    """The mean time of window ``n``'s claims of ``kind`` (full or seek), None without any."""
    calls = getattr(samples[n], f"{kind}_calls") - getattr(samples[n - 1], f"{kind}_calls")
    spent = getattr(samples[n], f"{kind}_ms") - getattr(samples[n - 1], f"{kind}_ms")
    return spent / calls if calls else None


def run_horizon(start_worker: Callable[..., Any], tmp_path: Path, held: float, long: bool) -> None:
    settings: dict[str, Any] = {"shared_preload_libraries": "pg_stat_statements"}
    if not long:
        settings["autovacuum_naptime"] = "10s"
    held_windows = int(-(-held // WINDOW))
    released_window = BEFORE + held_windows
    health_log = tmp_path / "health.log"
    with own_cluster(settings=settings) as cluster, ThreadPoolExecutor(1) as background:
        database = "hzn_horizon"
        url = cluster.migrated_database(database)
        cluster.execute(database, "CREATE EXTENSION pg_stat_statements")
        worker = start_worker(
            "--roles", "jobs", "--queues", "default", "--concurrency", "4",
            database_url=url, env={"PGOUTBOX_DEBUG": "0"}, POLL_INTERVAL=1,
        )  # fmt: skip
        processes: list[subprocess.Popen[str]] = []
        sampler: Sampler | None = None
        try:

            def listening() -> bool:
                """the worker waits on LISTEN"""
                return bool(cluster.execute(
                    database,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND state = 'idle' AND query ILIKE 'LISTEN%%'",
                    [worker.application_name],
                )[0][0])  # fmt: skip

            wait_for(listening, timeout=60)
            gauges = Gauges()
            stats = spawn(
                [str(ROOT / "manage.py"), "pgoutbox", "stats", "--json", "--watch", "1"],
                url,
                tmp_path / "stats.log",
                PGOUTBOX_TEST_SETTINGS=json.dumps({"HORIZON_WARNING_SECONDS": WARN_AFTER}),
            )
            processes.append(stats)
            threading.Thread(target=gauges.read, args=(stats.stdout,), daemon=True).start()
            ids_path = tmp_path / "acknowledged.txt"
            producer = spawn(
                ["-m", "tests.reliability.horizon_producer", str(RATE), str(ids_path)],
                url,
                tmp_path / "producer.log",
            )
            processes.append(producer)
            start = float(cluster.execute(database, "SELECT extract(epoch FROM now())")[0][0])
            sampler = Sampler(cluster, database, start, worker.application_name, worker.pid)
            sampler.start()
            sampler.wait_for_windows(1)
            before_report = background.submit(health, url, health_log)
            sampler.wait_for_windows(BEFORE)
            with held_horizon(cluster, database) as holders:
                held_from = time.time()
                held_report = background.submit(
                    health, url, health_log, not_before=held_from + WARN_AFTER + 2
                )
                sampler.wait_for_windows(released_window)
            released = time.time()
            peak_dead = max(s.dead for s in sampler.samples)
            autovacuums_at_release = sampler.samples[released_window].autovacuums
            base = [mean_ms(sampler.samples, n, "full") for n in range(2, BEFORE + 1)]
            base_full = max(b for b in base if b is not None)
            bound = max(base_full * RECOVERED, base_full + 2.0)

            def recovered() -> bool:
                """after the release, an autovacuum of jobs ran, its dead tuples fell below half
                their peak, and two windows' full claims are back to the baseline's order"""
                assert sampler is not None
                assert sampler.failure is None, sampler.failure
                samples = list(sampler.samples)
                n = len(samples) - 1
                claims = [mean_ms(samples, k, "full") for k in (n - 1, n)]
                return (
                    n >= released_window + 2
                    and samples[n].autovacuums > autovacuums_at_release
                    and samples[n].dead < peak_dead / 2
                    and all(c is None or c <= bound for c in claims)
                )

            wait_for(recovered, timeout=240 if long else 60, interval=0.5)
            after_report = background.submit(health, url, health_log)
            stopped_window = len(sampler.samples) - 1  # the producer stops in this window
            producer.send_signal(signal.SIGTERM)
            producer.wait(timeout=scaled(30))
            assert producer.returncode == 0, (tmp_path / "producer.log").read_text()[-3000:]
            acknowledged = [uuid.UUID(line) for line in ids_path.read_text().split()]

            def all_done() -> bool:
                """every acknowledged job is finished"""
                return not cluster.execute(
                    database,
                    "SELECT 1 FROM jobs WHERE status NOT IN ('completed', 'dead', 'cancelled') "
                    "LIMIT 1",
                )

            wait_for(all_done, timeout=60)
            after_report.result(timeout=scaled(60))
            sampler.stop()
            samples = list(sampler.samples)
            windows = min(len(samples) - 1, stopped_window)
            rows = per_window(cluster, database, start, windows)
            executions = [
                uuid.UUID(str(job_id))
                for (job_id,) in cluster.execute(
                    database, "SELECT job_id FROM testjobs_sideeffect WHERE event = 'end'"
                )
            ]
            first_attempt, total = cluster.execute(
                database,
                "SELECT count(*) FILTER (WHERE status = 'completed' AND attempts = 1), count(*) "
                "FROM jobs",
            )[0]
        except BaseException:
            with contextlib.suppress(Exception):  # what the jobs were left as, for the failure
                print(cluster.execute(
                    database,
                    "SELECT status, attempts, last_error_code, count(*), min(created_at) "
                    "FROM jobs GROUP BY 1, 2, 3",
                ))  # fmt: skip
                print(cluster.execute(
                    database,
                    "SELECT pid, application_name, state, xact_start, left(query, 80) "
                    "FROM pg_stat_activity WHERE datname = current_database()",
                ))  # fmt: skip
            raise
        finally:
            for process in processes:
                end(process)
            if sampler is not None:
                sampler.stop()
            worker.stop()
        assert sampler.failure is None, sampler.failure

    # -- the table ---------------------------------------------------------------------------------
    def phase(n: int) -> str:
        return "before" if n < BEFORE else "held" if n < released_window else "after"

    print(
        f"\n{RATE} jobs/s offered; {WINDOW:g} s windows; held {held:g} s, windows {BEFORE} to "
        f"{released_window - 1}; autovacuum_naptime {'60s (default)' if long else '10s'}"
    )
    print(
        "  win   t/s  phase  offered/s  done/s  full ms (n)   seek ms (n)   wait p50/max ms"
        "  n_dead_tup  avac  jobs MB  idx MB  gauge s  warn  load  cpu"
    )
    for n in range(windows):
        counts = [getattr(samples[n + 1], f"{kind}_calls") - getattr(samples[n], f"{kind}_calls")
                  for kind in ("full", "seek")]  # fmt: skip
        full, seek = mean_ms(samples, n + 1, "full"), mean_ms(samples, n + 1, "seek")
        report = gauges.last_before(start + (n + 1) * WINDOW)
        gauge = "-" if report is None else f"{report['oldest_transaction_age']:.1f}"
        warn = "-" if report is None else ("yes" if report["warnings"] else "no")
        after = samples[n + 1]
        print(
            f"  {n:3d} {(n + 1) * WINDOW:5.0f}  {phase(n):6} {rows['offered'][n]:9.0f} "
            f"{rows['done'][n]:7.0f} {full or 0:7.2f} ({counts[0]:4d}) {seek or 0:6.2f} "
            f"({counts[1]:5d}) {rows['wait_p50'][n]:7.0f}/{rows['wait_max'][n]:<7.0f} "
            f"{after.dead:11d} {after.autovacuums:5d} {after.table_bytes / 2**20:8.1f} "
            f"{after.index_bytes / 2**20:7.1f} {gauge:>8} {warn:>5} {after.load:5.1f} "
            f"{(after.worker_cpu - samples[n].worker_cpu) / WINDOW:4.0%}"
        )

    # -- recovery ----------------------------------------------------------------------------------
    highest = max(s.dead for s in samples)
    vacuumed = next(
        s for s in samples[released_window:]
        if s.autovacuums > autovacuums_at_release and s.dead < peak_dead / 2
    )  # fmt: skip
    fulls = [mean_ms(samples, n + 1, "full") for n in range(windows)]
    back = released_window
    for n in range(released_window, windows):
        if fulls[n] is not None and fulls[n] > bound:  # type: ignore[operator]
            back = n + 1
    print(
        f"n_dead_tup {peak_dead} at the release, {highest} at most; autovacuum removed them "
        f"{vacuumed.at - released:.1f} s after the release (n_dead_tup {vacuumed.dead}); full "
        f"claims back under {bound:.2f} ms (baseline {base_full:.2f}) from window {back}, which "
        f"ended {samples[back + 1].at - released:.1f} s after it; the worker's longest "
        "transaction seen: "
        f"{max(s.worker_oldest_transaction for s in samples):.2f} s"
    )

    # -- the checks --------------------------------------------------------------------------------
    verdict = check(acknowledged, executions)
    print(verdict)
    assert (verdict.lost, verdict.duplicated, verdict.unexpected) == (0, 0, 0), verdict
    assert first_attempt == total == len(acknowledged) > 0, (first_attempt, total)

    worker_oldest = max(s.worker_oldest_transaction for s in samples)
    assert worker_oldest < scaled(5), (
        f"a worker session stayed {worker_oldest:.1f} s in a transaction"
    )

    normal = sum(rows["done"][1:BEFORE]) / (BEFORE - 1)
    steady = [offered >= normal / 2 for offered in rows["offered"]]
    kept = [n for n in range(BEFORE, released_window) if steady[n] and steady[n - 1]]
    assert len(kept) >= held_windows * 0.9, (rows["offered"], BEFORE)
    lowest = min(rows["done"][n] for n in kept)
    pairs = [(rows["done"][n] + rows["done"][n + 1]) / 2 for n in kept if n + 1 in kept]
    print(
        f"held: lowest window {lowest:.0f} jobs/s, {lowest / normal:.0%} of {normal:.0f} before; "
        f"lowest two windows {min(pairs):.0f} jobs/s, {min(pairs) / normal:.0%}"
    )
    assert min(pairs) >= normal * KEPT, (rows["done"], normal)

    quiet = gauges.between(start, held_from)
    flagged = gauges.between(held_from + WARN_AFTER + scaled(2), released - 0.5)
    cleared = gauges.between(released + scaled(3), time.time())
    assert quiet, "no gauge read before the hold"
    assert len(flagged) >= 3, len(flagged)
    assert cleared, "no gauge read after the release"
    assert not [r["warnings"] for r in quiet if r["warnings"]]

    def names_a_holder(report: dict[str, Any]) -> bool:
        horizon = report["horizon"] or {}
        return bool(report["warnings"]) and horizon.get("pid") in holders

    missed = [report["horizon"] for report in flagged if not names_a_holder(report)]
    print(f"{len(flagged) - len(missed)} of {len(flagged)} readings held warned, naming a holder")
    for horizon in missed:
        print(f"  a reading held named {horizon} (holders {holders})")
    assert len(missed) <= len(flagged) * MISSED, missed
    assert names_a_holder(flagged[-1]), flagged[-1]
    for report in cleared:
        assert not report["warnings"], report
        assert report["oldest_transaction_age"] < WARN_AFTER, report

    def horizon_warned(report: dict[str, Any]) -> bool:
        return any("xmin horizon" in warning for warning in report["warnings"])

    during_report = held_report.result()
    assert during_report["healthy"], during_report
    assert horizon_warned(during_report), during_report
    assert during_report["horizon"]["pid"] in holders, during_report
    for report in (before_report.result(), after_report.result()):
        assert report["healthy"], report
        assert not horizon_warned(report), report
    assert held_from >= samples[BEFORE].at, (held_from, samples[BEFORE].at)


def test_a_held_horizon_with_autovacuum_on(start_worker: Any, tmp_path: Path) -> None:
    run_horizon(start_worker, tmp_path, held=FAST_HELD, long=False)


@pytest.mark.skipif(not LONG, reason="the long variant: PGOUTBOX_LONG_TESTS=1")
def test_a_held_horizon_with_autovacuum_on_for_two_minutes(
    start_worker: Any, tmp_path: Path
) -> None:
    run_horizon(start_worker, tmp_path, held=LONG_HELD, long=True)
