"""Peer benchmark: Procrastinate (psycopg 3) on the same PostgreSQL as django-pgoutbox.

Run it with the benchmark virtualenv, which has ``procrastinate`` installed::

    .venv-bench/bin/python benchmarks/peers/procrastinate_bench.py \\
        --dsn postgres://postgres@127.0.0.1:5432/bench_procrastinate --quick

It drops Procrastinate's own objects (every table, type, function and trigger whose name starts
with ``procrastinate``) from the database's current schema, applies Procrastinate's schema, and
measures:

- single enqueue: ``Task.defer`` one job at a time, one transaction each, from one client;
- bulk enqueue: ``Task.batch_defer`` in chunks of 5,000 jobs, one transaction per chunk;
- drain: N worker processes, each ``python -m procrastinate --app=procrastinate_bench.app
  worker --one-shot`` (``wait=False``: it exits once the queue is empty), timed from the first
  ``started`` event to the last ``succeeded`` event in ``procrastinate_events``;
- latency: one idle worker with default settings (LISTEN/NOTIFY), jobs deferred ``--gap-ms``
  apart, the task writing ``time.time()`` at its first line to a file.

Progress goes to stderr; the last line on stdout is one JSON object.

This module is also the worker's app module: the ``procrastinate`` CLI imports it as
``procrastinate_bench`` (its directory is put on ``PYTHONPATH``) and finds ``app`` below, whose
connection string and pool size come from environment variables set by the benchmark.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector  # type: ignore[import-not-found,unused-ignore]
from psycopg import sql

PEER = "procrastinate"
NOOP_TASK = "bench.noop"
STAMP_TASK = "bench.stamp"
DSN_ENV = "PROCBENCH_DSN"
POOL_MAX_ENV = "PROCBENCH_POOL_MAX"
STAMP_FILE_ENV = "PROCBENCH_STAMP_FILE"
BULK_CHUNK = 5_000
SWEEP_CONCURRENCY = (10, 50)
SWEEP_POOL_CAP = 16
HERE = Path(__file__).resolve().parent


# --- The app and its tasks (shared by the benchmark process and the worker processes) ---------


async def noop() -> None:
    """The drained job: does nothing. Async, because sync tasks go through a thread."""


async def stamp(seq: int) -> None:
    """The latency job: note when it started, keyed by its sequence number."""
    started = time.time()
    with open(os.environ[STAMP_FILE_ENV], "a", encoding="utf-8") as out:
        out.write(f"{seq} {started!r}\n")


def make_app(dsn: str, pool_max: int | None = None) -> Any:
    """An App on a ``PsycopgConnector``; its pool is psycopg_pool's default unless ``pool_max``."""
    pool_args: dict[str, Any] = {"conninfo": dsn}
    if pool_max:
        pool_args.update(min_size=min(4, pool_max), max_size=pool_max)
    new_app = App(connector=PsycopgConnector(**pool_args))
    # Explicit names, so the jobs deferred from ``__main__`` match the worker's import.
    new_app.task(name=NOOP_TASK)(noop)
    new_app.task(name=STAMP_TASK)(stamp)
    return new_app


def __getattr__(name: str) -> Any:
    """``app``, what ``procrastinate --app=procrastinate_bench.app worker`` loads.

    Built on first access from the environment set by the benchmark, so that importing this
    module (or running it as ``__main__``) creates no App of its own.
    """
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    pool_max = int(os.environ.get(POOL_MAX_ENV) or 0) or None
    built = make_app(os.environ[DSN_ENV], pool_max)
    globals()["app"] = built
    return built


# --- Small helpers ---------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[procrastinate] {message}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile over the sorted values (rank rounded from fraction * (n - 1))."""
    ordered = sorted(values)
    index = round(fraction * (len(ordered) - 1))
    return ordered[max(0, min(len(ordered) - 1, index))]


class Workers:
    """The worker processes this benchmark started; all of them are stopped on any exit path."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.log_dir = Path(tempfile.mkdtemp(prefix="procrastinate-bench-"))

    def start(
        self, dsn: str, worker_args: Sequence[str], env_extra: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROCRASTINATE_")}
        env.update(env_extra or {})
        env[DSN_ENV] = dsn
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
        command = [
            sys.executable,
            "-m",
            "procrastinate",
            "--app=procrastinate_bench.app",
            # Our own workers run with -v 0; Procrastinate's CLI logs two INFO lines per job.
            "--log-level=warning",
            "worker",
            *worker_args,
        ]
        log_path = self.log_dir / f"worker-{len(self.logs)}.log"
        self.logs.append(log_path)
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_die_with_parent,
            )
        self.procs.append(proc)
        return proc

    def wait_all(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes: list[int] = []
        for proc in self.procs:
            remaining = max(0.1, deadline - time.monotonic())
            codes.append(proc.wait(timeout=remaining))
        return codes

    def stop_all(self) -> None:
        """SIGTERM (a graceful stop for Procrastinate), then SIGKILL whatever is left."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        self.procs.clear()

    def tail_logs(self, lines: int = 15) -> str:
        chunks = []
        for path in self.logs[-4:]:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(chunks)


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it if the benchmark process dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# --- Database ----------------------------------------------------------------------------------


def connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise SystemExit(f"procrastinate_bench: cannot connect to {dsn!r}: {exc}") from exc


def drop_procrastinate_objects(conn: psycopg.Connection[Any]) -> None:
    """Drop only objects named ``procrastinate*`` in the current schema, in dependency order.

    No CASCADE: if another library's object depended on one of them, this fails loudly instead
    of dropping it. Triggers go first (they use the functions), then the functions (one returns
    the jobs table's row type), then views, tables and sequences, then the remaining types.
    """
    prefix = "procrastinate%"
    with conn.transaction():
        triggers = conn.execute(
            """
            SELECT t.tgname, c.relname FROM pg_trigger t
            JOIN pg_class c ON c.oid = t.tgrelid
            WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace
              AND t.tgname LIKE %s AND c.relname LIKE %s
            """,
            (prefix, prefix),
        ).fetchall()
        for trigger, table in triggers:
            conn.execute(
                sql.SQL("DROP TRIGGER {} ON {}").format(
                    sql.Identifier(trigger), sql.Identifier(table)
                )
            )
        routines = conn.execute(
            """
            SELECT p.oid::regprocedure::text FROM pg_proc p
            WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE %s
            """,
            (prefix,),
        ).fetchall()
        for (signature,) in routines:
            conn.execute(sql.SQL("DROP ROUTINE {}").format(sql.SQL(signature)))
        for kinds, keyword in (
            (["v"], "VIEW"),
            (["m"], "MATERIALIZED VIEW"),
            (["r", "p"], "TABLE"),
            (["S"], "SEQUENCE"),
        ):
            names = [
                row[0]
                for row in conn.execute(
                    """
                    SELECT relname FROM pg_class
                    WHERE relnamespace = current_schema()::regnamespace
                      AND relname LIKE %s AND relkind = ANY(%s::"char"[])
                    """,
                    (prefix, kinds),
                ).fetchall()
            ]
            if names:
                conn.execute(
                    sql.SQL("DROP {} {}").format(
                        sql.SQL(keyword), sql.SQL(", ").join(map(sql.Identifier, names))
                    )
                )
        types = [
            row[0]
            for row in conn.execute(
                """
                SELECT t.typname FROM pg_type t
                LEFT JOIN pg_class c ON c.oid = t.typrelid
                WHERE t.typnamespace = current_schema()::regnamespace AND t.typname LIKE %s
                  AND (t.typtype IN ('e', 'd', 'r') OR (t.typtype = 'c' AND c.relkind = 'c'))
                """,
                (prefix,),
            ).fetchall()
        ]
        if types:
            conn.execute(
                sql.SQL("DROP TYPE {}").format(sql.SQL(", ").join(map(sql.Identifier, types)))
            )


def clear_tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "TRUNCATE procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, "
        "procrastinate_workers RESTART IDENTITY"
    )


# --- Measurements --------------------------------------------------------------------------------


@dataclass
class Bench:
    dsn: str
    conn: psycopg.Connection[Any]
    client: Any  # the opened App used to defer
    workers: Workers
    jobs: int
    notes: list[str] = field(default_factory=list)

    @property
    def noop_task(self) -> Any:
        return self.client.tasks[NOOP_TASK]

    @property
    def stamp_task(self) -> Any:
        return self.client.tasks[STAMP_TASK]

    def enqueue_single(self, count: int) -> float:
        task = self.noop_task
        started = time.perf_counter()
        for _ in range(count):
            task.defer()
        elapsed = time.perf_counter() - started
        clear_tables(self.conn)
        return count / elapsed

    def enqueue_bulk(self) -> float:
        task = self.noop_task
        started = time.perf_counter()
        remaining = self.jobs
        while remaining > 0:
            size = min(BULK_CHUNK, remaining)
            task.batch_defer(*({} for _ in range(size)))
            remaining -= size
        elapsed = time.perf_counter() - started
        pending = self.conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'"
        ).fetchone()
        if pending is None or pending[0] != self.jobs:
            raise RuntimeError(
                f"expected {self.jobs} pending jobs after batch_defer, got {pending}"
            )
        return self.jobs / elapsed

    def drain(self, processes: int, worker_args: Sequence[str], env_extra: dict[str, str]) -> float:
        """Run ``processes`` one-shot workers over the pending jobs; jobs/s from the events."""
        # As our own drain does: the server runs with autovacuum off, and without statistics
        # the planner sorts every pending row on each fetch (3.4 ms a fetch at 5,000 pending,
        # against 0.03 ms with them, and growing with the backlog).
        self.conn.execute("VACUUM ANALYZE procrastinate_jobs, procrastinate_events")
        started = time.perf_counter()
        for _ in range(processes):
            self.workers.start(self.dsn, ["--one-shot", *worker_args], env_extra)
        try:
            codes = self.workers.wait_all(timeout=max(300.0, self.jobs / 50))
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(
                f"workers did not finish the drain in time\n{self.workers.tail_logs()}"
            ) from exc
        finally:
            self.workers.stop_all()
        wall = time.perf_counter() - started
        if any(codes):
            raise RuntimeError(f"worker exit codes {codes}\n{self.workers.tail_logs()}")
        row = self.conn.execute(
            """
            SELECT count(*) FILTER (WHERE type = 'succeeded'),
                   extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                                    - min(at) FILTER (WHERE type = 'started'))::float8
            FROM procrastinate_events
            """
        ).fetchone()
        assert row is not None
        succeeded, seconds = int(row[0]), float(row[1] or 0.0)
        if succeeded != self.jobs:
            raise RuntimeError(f"{succeeded} of {self.jobs} jobs succeeded")
        rate = self.jobs / seconds
        log(
            f"  drain x{processes} {' '.join(worker_args) or '(defaults)'} "
            f"{env_extra or ''}: {rate:,.0f} jobs/s "
            f"({seconds:.2f} s by events, {wall:.2f} s wall incl. start-up)"
        )
        return rate

    def latency(self, count: int, gap_s: float) -> dict[str, float]:
        clear_tables(self.conn)
        stamp_file = self.workers.log_dir / "stamps.txt"
        stamp_file.touch()
        self.workers.start(self.dsn, [], {STAMP_FILE_ENV: str(stamp_file)})
        self._wait_for_worker_registration()
        time.sleep(3)
        task = self.stamp_task
        committed: dict[int, float] = {}
        for seq in range(count):
            task.defer(seq=seq)
            committed[seq] = time.time()
            time.sleep(gap_s)
        started = self._read_stamps(stamp_file, count, timeout=30.0)
        self.workers.stop_all()
        missing = count - len(started)
        if missing:
            self.notes.append(f"latency: {missing} of {count} jobs had not started after 30 s")
        values = [(started[seq] - committed[seq]) * 1000 for seq in started]
        if not values:
            raise RuntimeError(f"no latency job ran\n{self.workers.tail_logs()}")
        return {
            "p50": round(percentile(values, 0.50), 3),
            "p95": round(percentile(values, 0.95), 3),
            "p99": round(percentile(values, 0.99), 3),
            "mean": round(statistics.fmean(values), 3),
        }

    def _wait_for_worker_registration(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
            if row is not None and row[0] >= 1:
                return
            if any(proc.poll() is not None for proc in self.workers.procs):
                break
            time.sleep(0.05)
        raise RuntimeError(f"latency worker did not register\n{self.workers.tail_logs()}")

    @staticmethod
    def _read_stamps(path: Path, count: int, timeout: float) -> dict[int, float]:
        deadline = time.monotonic() + timeout
        stamps: dict[int, float] = {}
        while True:
            stamps = {}
            for line in path.read_text(encoding="utf-8").splitlines():
                seq, _, when = line.partition(" ")
                if when:
                    stamps[int(seq)] = float(when)
            if len(stamps) >= count or time.monotonic() > deadline:
                return stamps
            time.sleep(0.05)


# --- Main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True, help="postgres://user@host:port/dbname")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--latency-jobs", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--quick", action="store_true", help="jobs=5000, single=500, latency-jobs=100"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.single, args.latency_jobs = 5_000, 500, 100
    if min(args.jobs, args.single, args.latency_jobs, *args.workers) < 1:
        parser.error("--jobs, --single, --latency-jobs and --workers must be positive")
    return args


def sweep() -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, CLI worker arguments, environment) for each drain configuration, default first."""
    configs: list[tuple[str, list[str], dict[str, str]]] = [("default (concurrency=1)", [], {})]
    for concurrency in SWEEP_CONCURRENCY:
        # psycopg_pool's default 4 connections would cap the finish queries in flight.
        pool = min(concurrency + 2, SWEEP_POOL_CAP)
        configs.append(
            (
                f"concurrency={concurrency}, pool max_size={pool}",
                ["--concurrency", str(concurrency)],
                {POOL_MAX_ENV: str(pool)},
            )
        )
    return configs


def run(
    args: argparse.Namespace, conn: psycopg.Connection[Any], workers: Workers
) -> dict[str, Any]:
    version = metadata.version("procrastinate")
    client = make_app(args.dsn)
    with conn, client.open():
        drop_procrastinate_objects(conn)
        client.schema_manager.apply_schema()
        log(f"schema applied (procrastinate {version}); {args.jobs} jobs, workers {args.workers}")
        bench = Bench(dsn=args.dsn, conn=conn, client=client, workers=workers, jobs=args.jobs)

        single = bench.enqueue_single(args.single)
        log(f"enqueue single: {single:,.0f} jobs/s ({args.single} jobs)")
        bulk = bench.enqueue_bulk()
        log(f"enqueue bulk: {bulk:,.0f} jobs/s ({args.jobs} jobs, chunks of {BULK_CHUNK})")

        drain: dict[str, dict[str, Any]] = {}
        later_bulk: list[float] = []
        first = True
        for processes in args.workers:
            rates: list[tuple[float, str]] = []
            for label, worker_args, env_extra in sweep():
                if not first:
                    clear_tables(conn)
                    later_bulk.append(bench.enqueue_bulk())
                first = False
                rates.append((bench.drain(processes, worker_args, env_extra), label))
            best_rate, best_label = max(rates)
            drain[str(processes)] = {
                "default": round(rates[0][0], 1),
                "best": round(best_rate, 1),
                "best_config": f"{processes} process(es), {best_label}",
            }

        latency = bench.latency(args.latency_jobs, args.gap_ms / 1000)
        log(f"latency: {latency}")
        clear_tables(conn)

    notes = [
        "Workers are separate processes running Procrastinate's CLI "
        "(python -m procrastinate --app=... --log-level=warning worker; --one-shot, i.e. "
        "wait=False, for the drains), with an async no-op task: sync tasks run in a thread "
        "via asgiref. The CLI logs two INFO lines per job by default; it runs at warning level "
        "here, as our own workers run with -v 0.",
        "Drain is timed from procrastinate_events: first 'started' to last 'succeeded' (both "
        "stamped by triggers with now(), i.e. each statement's transaction start); worker "
        "start-up before the first fetch is excluded. Tables are truncated and the jobs "
        "re-enqueued with batch_defer before every drain, then VACUUM ANALYZEd as our own "
        "drain does (autovacuum is off on this server; with no statistics the planner sorts "
        "every pending job on each fetch: 3.4 ms a fetch at 5,000 pending against 0.03 ms "
        "with them). Jobs are kept (delete_jobs=never, the default), so each job is an insert "
        "and two updates, each with an event row.",
        f"Bulk = batch_defer in chunks of {BULK_CHUNK}, one transaction per chunk (one "
        "procrastinate_defer_jobs_v1 call on an array of composite rows); the figure is the "
        "first enqueue"
        + (
            f"; the {len(later_bulk)} re-enqueues before later drains gave "
            f"{min(later_bulk):,.0f}-{max(later_bulk):,.0f} jobs/s."
            if later_bulk
            else "."
        ),
        "Single = Task.defer (sync API, App.open() -> psycopg_pool ConnectionPool): one "
        "INSERT through the same SQL function per call, committed when the call returns.",
        "Worker defaults: concurrency=1 (jobs in flight per process; concurrency runs "
        "asyncio tasks, not threads), LISTEN/NOTIFY on (one extra connection outside the "
        "pool; a trigger notifies on every insert), fetch_job_polling_interval=5 s as "
        "fallback, one fetch query per job (FOR UPDATE SKIP LOCKED LIMIT 1) and one finish "
        "query per job, each on a connection checked out of a psycopg_pool "
        "AsyncConnectionPool (min_size=max_size=4) that PsycopgConnector builds with "
        "check=check_connection: every checkout first sends an empty query, so a job costs "
        "about six round trips (check, query, commit, twice).",
        "The machine has 2 cores shared with other work: figures vary run to run.",
        "Latency: one worker with default settings, woken by NOTIFY; start = time.time() at the "
        "task's first line, written to a file.",
        *bench.notes,
    ]
    return {
        "peer": PEER,
        "version": version,
        "config": (
            "procrastinate CLI worker processes, async no-op task, PsycopgConnector with "
            "psycopg_pool defaults (4 connections); default = concurrency 1, listen_notify "
            "on, fetch_job_polling_interval 5 s, delete_jobs never; sweep = concurrency "
            f"{', '.join(map(str, SWEEP_CONCURRENCY))} with the connector's pool max_size = "
            f"concurrency + 2 (at most {SWEEP_POOL_CAP}); log level warning"
        ),
        "enqueue_single_per_s": round(single, 1),
        "enqueue_bulk_per_s": round(bulk, 1),
        "drain": drain,
        "latency_ms": latency,
        "notes": " ".join(notes),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    conn = connect(args.dsn)  # fails fast, with a clear message, if the DSN is unreachable
    workers = Workers()
    atexit.register(workers.stop_all)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    try:
        result = run(args, conn, workers)
    except BaseException:
        workers.stop_all()
        log(f"failed; worker logs kept in {workers.log_dir}")
        raise
    workers.stop_all()
    shutil.rmtree(workers.log_dir, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    # Run from the module imported under its own name: Procrastinate warns when an App is
    # created by code in ``__main__`` (task names would then depend on how it was started).
    sys.path.insert(0, str(HERE))
    sys.exit(importlib.import_module("procrastinate_bench").main())
