"""django-tasks-db, measured the way we measure our own queue, on the same PostgreSQL.

    python benchmarks/peers/tasksdb_bench.py --dsn postgres://postgres@127.0.0.1:5432/DBNAME \\
        [--jobs 100000] [--single 2000] [--latency-jobs 500] [--gap-ms 10] [--workers 1 2] [--quick]

Run from the repository root with the virtualenv that has django-tasks-db. Progress goes to
stderr; the last line on stdout is one JSON object with the figures.

What django-tasks-db 0.13.0 offers, read from its source:
- backend ``django_tasks_db.DatabaseBackend``, app ``django_tasks_db`` (label
  ``django_tasks_database``, one table ``django_tasks_database_dbtaskresult``);
- tasks are Django's own ``django.tasks.task`` on Django 6.x; ``Task.enqueue()`` inserts one row,
  and there is no bulk enqueue;
- ``manage.py db_worker``: one process, one task at a time (no threads or concurrency option),
  ``--batch`` (exit at the first empty poll), ``--interval`` (seconds slept after an empty poll,
  default 1), ``--no-startup-delay`` (else a random sleep of up to 1 s before the first poll),
  ``--backend``, ``--queue-name``, ``--max-tasks``, ``--reload``;
- every row records ``enqueued_at``, ``started_at`` and ``finished_at``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from types import FrameType
from typing import IO, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_MODULE = "benchmarks.peers.tasksdb_settings"
PEER = "django-tasks-db"
APP_LABEL = "django_tasks_database"
BACKEND_ALIAS = "tasksdb"  # as in tasksdb_settings.TASKS and tasksdb_tasks
LATENCY_FILE_ENV = "TASKSDB_BENCH_LATENCY_FILE"  # as in tasksdb_tasks
CONN_MAX_AGE_ENV = "TASKSDB_BENCH_CONN_MAX_AGE"  # as in tasksdb_settings
SETTLE_SECONDS = 3.0
STALL_SECONDS = 120.0  # a drain with no task finished for this long has failed
PROGRESS_SECONDS = 15.0
STOP_GRACE_SECONDS = 5.0
QUICK = {"jobs": 5000, "single": 500, "latency_jobs": 100}


class BenchError(Exception):
    """A failure to report on stderr, with a non-zero exit."""


@dataclass(frozen=True)
class WorkerConfig:
    """How the drain's ``db_worker`` processes run."""

    label: str
    args: tuple[str, ...] = ()
    conn_max_age: str | None = None  # overrides the test project's CONN_MAX_AGE = 0


DEFAULT_CONFIG = WorkerConfig("db_worker --batch (all else default)")
# --interval is left out: it is only slept after an empty poll, and --batch exits at the first.
# In a --quick trial, --no-startup-delay --verbosity 0 alone changed nothing (70 vs 72 jobs/s):
# the cost is the reconnection per task that CONN_MAX_AGE=0 makes, so the sweep keeps the
# connection, alone and then with the two flags.
SWEEP = (
    WorkerConfig("db_worker --batch, CONN_MAX_AGE=None", conn_max_age="none"),
    WorkerConfig(
        "db_worker --batch --no-startup-delay --verbosity 0, CONN_MAX_AGE=None",
        ("--no-startup-delay", "--verbosity", "0"),
        conn_max_age="none",
    ),
)


def log(message: str) -> None:
    print(f"[tasksdb] {message}", file=sys.stderr, flush=True)


# --- worker processes --------------------------------------------------------------------------

_started: list[subprocess.Popen[bytes]] = []


def start_worker(
    args: Sequence[str], *, env: dict[str, str], stderr: IO[bytes]
) -> subprocess.Popen[bytes]:
    """One ``manage.py db_worker`` process, in a session of its own so that it stops whole."""
    command = [
        sys.executable,
        str(ROOT / "manage.py"),
        "db_worker",
        "--backend",
        BACKEND_ALIAS,
        *args,
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # its per-task log lines (verbosity 1) go to stdout
        stderr=stderr,
        start_new_session=True,
    )
    _started.append(process)
    return process


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the process's group (its own session: the group id is its pid) while unreaped."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)


def stop_workers(processes: Sequence[subprocess.Popen[bytes]] | None = None) -> None:
    """SIGTERM (db_worker finishes its current task and exits), then SIGKILL after a grace."""
    targets = list(_started if processes is None else processes)
    for process in targets:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in targets:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
        if process in _started:
            _started.remove(process)


def _exit_on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop workers


def worker_env(*, conn_max_age: str | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.pop(CONN_MAX_AGE_ENV, None)
    if conn_max_age is not None:
        env[CONN_MAX_AGE_ENV] = conn_max_age
    return env


def tail(path: Path, lines: int = 20) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    return "\n".join(text[-lines:]) or "(nothing on stderr)"


# --- database ----------------------------------------------------------------------------------


def setup_django(dsn: str) -> None:
    os.environ["DATABASE_URL"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    os.environ["PGOUTBOX_DEBUG"] = "0"
    os.environ.pop(CONN_MAX_AGE_ENV, None)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)

    import django
    from django.db import OperationalError, connection

    django.setup()
    try:
        connection.ensure_connection()
    except OperationalError as exc:
        raise BenchError(f"cannot connect to PostgreSQL at {redact(dsn)}: {exc}") from exc

    from django.core.management import call_command

    call_command("migrate", APP_LABEL, verbosity=0, stdout=sys.stderr)


def redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def truncate() -> None:
    """Empty django-tasks-db's table, and only it."""
    from django.db import connection
    from django_tasks_db.models import DBTaskResult

    table = connection.ops.quote_name(DBTaskResult._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")


def vacuum_analyze() -> None:
    """As our own drain does after its fill: autovacuum is off on the benchmark server, and
    without statistics the planner sorts every ready row for each claim."""
    from django.db import connection
    from django_tasks_db.models import DBTaskResult

    table = connection.ops.quote_name(DBTaskResult._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {table}")


def finished_count() -> int:
    from django_tasks_db.models import DBTaskResult

    return int(DBTaskResult.objects.finished().count())


# --- the measurements --------------------------------------------------------------------------


def enqueue_single(count: int) -> float:
    """``count`` enqueues, one at a time, each committed on its own (autocommit): jobs/s."""
    from benchmarks.peers.tasksdb_tasks import noop

    truncate()
    started = time.perf_counter()
    for _ in range(count):
        noop.enqueue()
    rate = count / (time.perf_counter() - started)
    truncate()
    return rate


def enqueue_bulk(count: int) -> float:
    """No bulk API: ``enqueue()`` in a loop inside one transaction, commit included: jobs/s."""
    from django.db import transaction

    from benchmarks.peers.tasksdb_tasks import noop

    started = time.perf_counter()
    with transaction.atomic():
        for _ in range(count):
            noop.enqueue()
    return count / (time.perf_counter() - started)


def wait_for_drain(processes: Sequence[subprocess.Popen[bytes]], jobs: int, stderr: Path) -> None:
    """Until every ``--batch`` worker has exited; fail on a crash or a stalled drain."""
    last_done, last_change, last_report = -1, time.monotonic(), time.monotonic()
    while True:
        codes = [process.poll() for process in processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            raise BenchError(f"a db_worker exited with {failed[0]}:\n{tail(stderr)}")
        if all(code == 0 for code in codes):
            return
        time.sleep(0.2)
        now = time.monotonic()
        if now - last_report >= PROGRESS_SECONDS:
            done = finished_count()
            log(f"  {done}/{jobs} finished")
            if done != last_done:
                last_done, last_change = done, now
            elif now - last_change > STALL_SECONDS:
                raise BenchError(f"drain stalled at {done}/{jobs}:\n{tail(stderr)}")
            last_report = now


def drain_window(jobs: int) -> float:
    """Seconds from the first task's start to the last one's finish, from the table's stamps."""
    from django.db.models import Max, Min
    from django_tasks_db.models import DBTaskResult

    rows = DBTaskResult.objects.all()
    successful = rows.successful().count()
    if successful != jobs:
        counts = {status: rows.filter(status=status).count() for status in ("READY", "FAILED")}
        raise BenchError(f"{successful}/{jobs} tasks successful after the drain ({counts})")
    stamps = rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return float((stamps["last"] - stamps["first"]).total_seconds())


def drain(
    workers: int, config: WorkerConfig, jobs: int, scratch: Path, name: str
) -> tuple[float, float]:
    """Fill the queue with ``jobs`` no-ops, drain it with ``workers`` processes.

    Returns (drain jobs/s, the fill's enqueue jobs/s).
    """
    truncate()
    fill_rate = enqueue_bulk(jobs)
    vacuum_analyze()
    log(f"drain, {workers} worker(s), {config.label}: {jobs} enqueued at {fill_rate:,.0f}/s")
    stderr_path = scratch / f"{name}.stderr"
    env = worker_env(conn_max_age=config.conn_max_age)
    with stderr_path.open("wb") as stderr:
        processes = [
            start_worker(["--batch", *config.args], env=env, stderr=stderr) for _ in range(workers)
        ]
        try:
            wait_for_drain(processes, jobs, stderr_path)
        finally:
            stop_workers(processes)
    rate = jobs / drain_window(jobs)
    log(f"  {rate:,.0f} jobs/s")
    truncate()
    return rate, fill_rate


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile, as our own benchmarks take it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latency(count: int, gap_ms: float, scratch: Path) -> tuple[dict[str, float], str]:
    """Enqueue-commit to task-start, in ms, with one idle worker on its default settings.

    Returns the figures and a sentence for the notes: how often tasks arrived against how often
    the worker started one while it had a backlog (when it cannot keep up, a queue builds).
    """
    from benchmarks.peers.tasksdb_tasks import record_start

    truncate()
    stamps = scratch / "latency-starts.txt"
    stamps.write_text("", encoding="utf-8")
    stderr_path = scratch / "latency.stderr"
    committed: dict[int, float] = {}
    with stderr_path.open("wb") as stderr:
        process = start_worker([], env=worker_env(**{LATENCY_FILE_ENV: str(stamps)}), stderr=stderr)
        try:
            time.sleep(SETTLE_SECONDS)
            if process.poll() is not None:
                raise BenchError(f"the latency worker exited early:\n{tail(stderr_path)}")
            log(f"latency: {count} tasks, {gap_ms:g} ms apart")
            for seq in range(count):
                record_start.enqueue(seq)  # autocommit: committed when it returns
                committed[seq] = time.time()
                time.sleep(gap_ms / 1000)
            started = wait_for_starts(stamps, count, process, stderr_path)
        finally:
            stop_workers([process])
    truncate()
    values = [(started[seq] - committed[seq]) * 1000 for seq in range(count)]
    figures = {
        "p50": percentile(values, 0.50),
        "p95": percentile(values, 0.95),
        "p99": percentile(values, 0.99),
        "mean": statistics.fmean(values),
    }
    if count < 2:
        return figures, ""
    arrival_ms = (committed[count - 1] - committed[0]) * 1000 / (count - 1)
    starts = sorted(started.values())
    service_ms = statistics.median((b - a) * 1000 for a, b in itertools.pairwise(starts))
    summary = (
        f"In the latency run tasks were committed every {arrival_ms:.1f} ms on average and the "
        f"worker started one every {service_ms:.1f} ms (median gap between starts)."
    )
    return figures, summary


def wait_for_starts(
    path: Path, count: int, process: subprocess.Popen[bytes], stderr: Path
) -> dict[int, float]:
    deadline = time.monotonic() + 60 + count * 0.1
    while True:
        started: dict[int, float] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            seq, stamp = line.split()
            started[int(seq)] = float(stamp)
        if len(started) >= count:
            return started
        if process.poll() is not None:
            code = process.returncode
            raise BenchError(f"the latency worker exited with {code}:\n{tail(stderr)}")
        if time.monotonic() > deadline:
            raise BenchError(f"only {len(started)}/{count} latency tasks started in time")
        time.sleep(0.1)


# --- the whole run -----------------------------------------------------------------------------


def best_of(measure: Callable[[WorkerConfig], float]) -> tuple[float, float, str]:
    """(default rate, best rate, best config's label) over the default and the sweep."""
    default = measure(DEFAULT_CONFIG)
    best, best_label = default, DEFAULT_CONFIG.label
    for config in SWEEP:
        rate = measure(config)
        if rate > best:
            best, best_label = rate, config.label
    return default, best, best_label


def run(args: argparse.Namespace) -> dict[str, Any]:
    setup_django(args.dsn)
    truncate()
    log(f"enqueue, single: {args.single} tasks")
    single = enqueue_single(args.single)
    log(f"  {single:,.0f} jobs/s")

    fill_rates: list[float] = []
    drains: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tasksdb-bench-") as tmp:
        scratch = Path(tmp)
        for workers in args.workers:

            def measure(config: WorkerConfig, workers: int = workers) -> float:
                name = f"drain-{len(fill_rates)}"
                rate, fill_rate = drain(workers, config, args.jobs, scratch, name)
                fill_rates.append(fill_rate)
                return rate

            default, best, best_label = best_of(measure)
            drains[str(workers)] = {"default": default, "best": best, "best_config": best_label}
        lat, lat_summary = latency(args.latency_jobs, args.gap_ms, scratch)

    notes = (
        "No bulk enqueue in django-tasks-db: enqueue_bulk_per_s is Task.enqueue() in a loop "
        "inside one transaction.atomic() (one INSERT per task), taken on the first fill; "
        f"all {len(fill_rates)} fills (one before each drain) ran "
        f"{min(fill_rates):,.0f}-{max(fill_rates):,.0f} jobs/s. "
        "Tasks use Django 6.1's own django.tasks @task (backend alias 'tasksdb'); the "
        "django-tasks backport is installed but unused. db_worker runs one task at a time per "
        "process and has no thread/concurrency option, so N workers = N processes. The drain "
        "uses --batch (exit at the first empty poll) and is timed from the table's started_at "
        "and finished_at. The table is VACUUM ANALYZEd after each fill, before the workers "
        "start, as our own drain does: autovacuum is off on the server, and without statistics "
        "the planner sorts every ready row for each claim (a cost growing with the backlog). "
        "Sweep: CONN_MAX_AGE=None (with the test project's CONN_MAX_AGE=0, Django's default, "
        "the worker's close_old_connections() each loop reconnects to PostgreSQL for every "
        "task), alone and with --no-startup-delay (else each worker sleeps up to 1 s before its "
        "first poll) and --verbosity 0 (else two INFO log lines per task, sent to /dev/null); "
        "those two flags alone gave nothing in a trial. --interval is not swept: it is only "
        "slept after an empty poll. Latency: one worker on all defaults (CONN_MAX_AGE=0 too); "
        "when idle it polls every 1 s (--interval 1), with a backlog it runs tasks back to back "
        f"without sleeping; there is no LISTEN/NOTIFY. {lat_summary} "
        "Percentiles are nearest-rank, as in our own benchmarks."
    )
    return {
        "peer": PEER,
        "version": version("django-tasks-db"),
        "config": (
            "manage.py db_worker --backend tasksdb, one OS process per worker, one task at a "
            "time each; drain default: --batch, all else default (interval 1 s, startup delay "
            "up to 1 s, verbosity 1, the test project's CONN_MAX_AGE=0); latency: db_worker on "
            "defaults (polls every 1 s when idle)"
        ),
        "enqueue_single_per_s": single,
        "enqueue_bulk_per_s": fill_rates[0] if fill_rates else 0.0,
        "drain": drains,
        "latency_ms": lat,
        "notes": notes,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", required=True, help="postgres://user@host:port/dbname")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--latency-jobs", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--quick", action="store_true", help="jobs=5000, single=500, latency-jobs=100"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.single, args.latency_jobs = (
            QUICK["jobs"],
            QUICK["single"],
            QUICK["latency_jobs"],
        )
    parts = urlsplit(args.dsn)
    if parts.scheme not in {"postgres", "postgresql"} or not parts.path.strip("/"):
        parser.error("--dsn must look like postgres://user@host:port/dbname")
    if min(args.jobs, args.single, args.latency_jobs, *args.workers) < 1:
        parser.error("--jobs, --single, --latency-jobs and --workers must be at least 1")
    if args.gap_ms < 0:
        parser.error("--gap-ms must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    try:
        result = run(args)
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    finally:
        stop_workers()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
