"""PgQueuer peer benchmark: enqueue rates, drain rate and wake-up latency.

    .venv-bench/bin/python benchmarks/peers/pgqueuer_bench.py --dsn postgres://...:5432/DB \\
        [--jobs 100000] [--single 2000] [--latency-jobs 500] [--gap-ms 10] [--workers 1 2] [--quick]
    .venv-bench/bin/python benchmarks/peers/pgqueuer_bench.py --dsn ... --sleep-ms 10 \
        --jobs 10000 --max-concurrent-tasks 100 [--batch-size 100] [--runs 3]

PgQueuer's own objects in that database are dropped and re-installed at start; nothing else in
the database is touched. Progress goes to stderr; the last line on stdout is one JSON object.

- enqueue_single_per_s: ``Queries.enqueue(entrypoint, payload)`` once per job, each call its own
  autocommit statement, from one asyncpg connection.
- enqueue_bulk_per_s: ``Queries.enqueue([...], [...], [...])`` (the list form), one call for all
  jobs or chunks of 5,000, whichever was faster; these are the jobs the drain then runs.
- drain: N worker processes, each this script with ``--worker drain``, which hands
  :func:`worker_factory` to ``pgqueuer.run`` (what ``pgq run`` calls, on uvloop as ``pgq run``
  does; see :func:`worker_main` for why not ``pgq run`` itself). The rate is jobs divided by the
  time between the first 'picked' and the last 'successful' row of ``pgqueuer_log`` (both stamped
  by the database clock).
- latency: one idle worker (continuous mode, PgQueuer's defaults, LISTEN/NOTIFY wake-up); jobs
  enqueued ``--gap-ms`` apart; latency is handler start minus enqueue return, in ms.
- ``--sleep-ms``: only drains, ``--runs`` times, of ``--jobs`` jobs whose handler is
  ``async def sleep(job): await asyncio.sleep(ms / 1000)``, by one worker with
  ``max_concurrent_tasks=--max-concurrent-tasks`` (and ``--batch-size``, else PgQueuer's
  default): coroutines in flight, as ``benchmarks/drain_cpu.py --job-type tests.async_sleep``
  drains them here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import inspect
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pgqueuer
from pgqueuer import QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

PEER = "pgqueuer"
VERSION = "1.6.0"
SCRIPT = Path(__file__).resolve()

NOOP = "noop"
STAMP = "stamp"
SLEEP = "sleep"
ENV_DSN = "PGQ_BENCH_DSN"
ENV_SLEEP_S = "PGQ_BENCH_SLEEP_S"
ENV_STAMP_FILE = "PGQ_BENCH_STAMP_FILE"

BULK_CHUNK = 5_000
CONNECT_TIMEOUT_S = 10.0
SETTLE_S = 3.0
STOP_GRACE_S = 15.0


class BenchError(RuntimeError):
    """A failure worth a one-line message rather than a traceback."""


# --------------------------------------------------------------------------- worker side


@contextlib.asynccontextmanager
async def worker_factory() -> AsyncIterator[QueueManager]:
    """A ``pgq run`` factory: a QueueManager on one asyncpg connection (PgQueuer's README setup)."""
    connection = await asyncpg.connect(os.environ[ENV_DSN])
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))
        stamp_file = os.environ.get(ENV_STAMP_FILE, "")

        @manager.entrypoint(NOOP)
        async def noop(job: Job) -> None:
            pass

        @manager.entrypoint(STAMP)
        async def stamp(job: Job) -> None:
            started = time.time()
            sequence = (job.payload or b"").decode()
            with open(stamp_file, "a", encoding="ascii") as out:
                out.write(f"{sequence} {started!r}\n")

        sleep_s = float(os.environ.get(ENV_SLEEP_S, "0"))

        @manager.entrypoint(SLEEP)
        async def sleep(job: Job) -> None:
            await asyncio.sleep(sleep_s)

        yield manager
    finally:
        await connection.close()


def worker_main(mode: str, batch_size: int | None, max_concurrent_tasks: int | None) -> int:
    """One worker process: ``pgq run`` without its CLI front end.

    ``pgq run`` (pgqueuer 1.6.0) dies at start-up with typer 0.29 (its ``--log-level`` parser
    returns a str where ``setup_fancy_logger`` wants the enum), so this calls what it calls:
    ``pgqueuer.run`` (the supervisor: SIGTERM/SIGINT mean a graceful stop) on uvloop when
    installed. Unset knobs keep ``pgqueuer.run``'s own defaults.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    execution = QueueExecutionMode(mode)
    # max_concurrent_tasks=None is PgQueuer's own default (no limit); batch_size is left out
    # entirely unless given, so the default run really is PgQueuer's default.
    if batch_size is None:
        worker = pgqueuer.run(
            worker_factory, mode=execution, max_concurrent_tasks=max_concurrent_tasks
        )
    else:
        worker = pgqueuer.run(
            worker_factory,
            mode=execution,
            batch_size=batch_size,
            max_concurrent_tasks=max_concurrent_tasks,
        )
    runner: Callable[..., object] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    runner(worker)
    return 0


# --------------------------------------------------------------------------- worker processes


@dataclass(frozen=True)
class WorkerConfig:
    """``pgqueuer.run`` knobs; None leaves PgQueuer's default in place."""

    batch_size: int | None = None
    max_concurrent_tasks: int | None = None

    def worker_args(self) -> list[str]:
        args: list[str] = []
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size)]
        if self.max_concurrent_tasks is not None:
            args += ["--max-concurrent-tasks", str(self.max_concurrent_tasks)]
        return args

    def label(self) -> str:
        batch = self.batch_size if self.batch_size is not None else DEFAULTS["batch_size"]
        limit = self.max_concurrent_tasks or DEFAULTS["max_concurrent_tasks"] or "unlimited"
        return f"batch_size={batch}, max_concurrent_tasks={limit}"


def queue_manager_defaults() -> dict[str, object]:
    """PgQueuer's own defaults, read from ``QueueManager.run`` rather than restated."""
    parameters = inspect.signature(QueueManager.run).parameters
    dequeue_timeout = parameters["dequeue_timeout"].default
    assert isinstance(dequeue_timeout, timedelta)
    return {
        "batch_size": parameters["batch_size"].default,
        "max_concurrent_tasks": parameters["max_concurrent_tasks"].default,
        "dequeue_timeout_s": dequeue_timeout.total_seconds(),
    }


DEFAULTS = queue_manager_defaults()
SWEEP = (
    WorkerConfig(batch_size=100),
    WorkerConfig(batch_size=1000),
    WorkerConfig(batch_size=100, max_concurrent_tasks=200),
)


# Loaded here, not in the forked child, so the child only makes the call.
LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it if the benchmark dies, even by SIGKILL."""
    if LIBC is not None:
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerPool:
    """The worker processes this benchmark started; :meth:`stop_all` reaps every one."""

    def __init__(self, dsn: str, log_dir: Path) -> None:
        self.dsn = dsn
        self.log_dir = log_dir
        self.live: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.started = 0

    def start(
        self, config: WorkerConfig, mode: str, stamp_file: Path | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        self.started += 1
        log_path = self.log_dir / f"worker-{self.started}.log"
        env = {**os.environ, ENV_DSN: self.dsn}
        if stamp_file is not None:
            env[ENV_STAMP_FILE] = str(stamp_file)
        command = [sys.executable, str(SCRIPT), "--worker", mode, *config.worker_args()]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # safe: this process starts no threads
            )
        self.live.append((process, log_path))
        return process, log_path

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        """SIGTERM (``pgqueuer.run`` stops gracefully on it), then SIGKILL after a grace period."""
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.live = [(p, log) for p, log in self.live if p is not process]

    def stop_all(self) -> None:
        for process, _ in list(self.live):
            self.stop(process)


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------- measurements


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}{port}"))


@dataclass
class Bench:
    dsn: str
    connection: asyncpg.Connection
    queries: Queries
    pool: WorkerPool
    scratch: Path

    @property
    def queue_table(self) -> str:
        return self.queries.qbe.settings.qualified.queue_table

    @property
    def log_table(self) -> str:
        return self.queries.qbe.settings.qualified.queue_table_log

    async def reinstall(self) -> None:
        """Drop PgQueuer's own objects (only those) and install them afresh."""
        await self.queries.uninstall()
        await self.queries.install()

    async def reset(self) -> None:
        await self.queries.clear_queue()
        await self.queries.clear_queue_log()
        await self.queries.clear_statistics_log()

    async def enqueue_single(self, count: int) -> float:
        await self.reset()
        started = time.perf_counter()
        for _ in range(count):
            await self.queries.enqueue(NOOP, None)
        elapsed = time.perf_counter() - started
        await self.reset()
        return count / elapsed

    async def enqueue_bulk(self, count: int, chunk: int, entrypoint: str = NOOP) -> float:
        started = time.perf_counter()
        for offset in range(0, count, chunk):
            size = min(chunk, count - offset)
            await self.queries.enqueue([entrypoint] * size, [None] * size, [0] * size)
        return count / (time.perf_counter() - started)

    async def drain(
        self, jobs: int, workers: int, config: WorkerConfig, chunk: int, entrypoint: str = NOOP
    ) -> DrainRun:
        await self.reset()
        enqueue_rate = await self.enqueue_bulk(jobs, chunk, entrypoint)
        await self.connection.execute(f"VACUUM ANALYZE {self.queue_table}, {self.log_table}")

        started = time.monotonic()
        running = [self.pool.start(config, "drain") for _ in range(workers)]
        deadline = started + 120 + jobs / 100
        while any(process.poll() is None for process, _ in running):
            if time.monotonic() > deadline:
                raise BenchError(f"drain workers still running after {deadline - started:.0f} s")
            await asyncio.sleep(0.05)
        wall = time.monotonic() - started
        for process, log_path in running:
            self.pool.stop(process)
            if process.returncode != 0:
                raise BenchError(
                    f"worker exited with {process.returncode}; log tail:\n{log_tail(log_path)}"
                )

        row = await self.connection.fetchrow(
            f"""
            SELECT count(*) FILTER (WHERE status = 'successful') AS done,
                   count(*) FILTER (WHERE status = 'picked') AS picks,
                   min(created) FILTER (WHERE status = 'picked') AS first_pick,
                   max(created) FILTER (WHERE status = 'successful') AS last_done
            FROM {self.log_table}
            """
        )
        left = await self.connection.fetchval(f"SELECT count(*) FROM {self.queue_table}")
        assert row is not None
        if row["done"] != jobs or left != 0:
            raise BenchError(f"drain incomplete: {row['done']} of {jobs} done, {left} left")
        first_pick: datetime = row["first_pick"]
        last_done: datetime = row["last_done"]
        seconds = (last_done - first_pick).total_seconds()
        return DrainRun(
            workers=workers,
            config=config,
            chunk=chunk,
            enqueue_per_s=enqueue_rate,
            seconds=seconds,
            per_s=jobs / seconds,
            wall_s=wall,
            picks=int(row["picks"]),
        )

    async def latency(self, count: int, gap_s: float) -> list[float]:
        await self.reset()
        stamp_file = self.scratch / "stamps.txt"
        stamp_file.write_text("")
        process, log_path = self.pool.start(WorkerConfig(), "continuous", stamp_file)
        try:
            await asyncio.sleep(SETTLE_S)
            if process.poll() is not None:
                raise BenchError(f"latency worker died; log tail:\n{log_tail(log_path)}")
            committed: dict[str, float] = {}
            for sequence in range(count):
                await self.queries.enqueue(STAMP, str(sequence).encode())
                committed[str(sequence)] = time.time()
                await asyncio.sleep(gap_s)
            deadline = time.monotonic() + 60
            while True:
                lines = stamp_file.read_text(encoding="ascii").splitlines()
                if len(lines) >= count:
                    break
                if time.monotonic() > deadline or process.poll() is not None:
                    raise BenchError(f"only {len(lines)} of {count} latency jobs ran")
                await asyncio.sleep(0.05)
        finally:
            self.pool.stop(process)
        started = dict(line.split() for line in lines)
        return [(float(started[key]) - committed[key]) * 1000 for key in committed]


@dataclass(frozen=True)
class DrainRun:
    workers: int
    config: WorkerConfig
    chunk: int
    enqueue_per_s: float
    seconds: float
    per_s: float
    wall_s: float
    picks: int


def quantile(values: list[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (``statistics.quantiles`` inclusive)."""
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[round(fraction * 100) - 1]


async def connect(dsn: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise BenchError(f"cannot connect to {redact(dsn)}: {exc}") from exc


async def run_sleeps(
    args: argparse.Namespace, pool: WorkerPool, scratch: Path
) -> dict[str, object]:
    """``--sleep-ms``: drains of coroutines that each await a sleep, one worker."""
    connection = await connect(args.dsn)
    try:
        bench = Bench(args.dsn, connection, Queries(AsyncpgDriver(connection)), pool, scratch)
        await bench.reinstall()
        config = WorkerConfig(
            batch_size=args.batch_size, max_concurrent_tasks=args.max_concurrent_tasks
        )
        rates = []
        for _ in range(args.runs):
            result = await bench.drain(args.jobs, 1, config, BULK_CHUNK, SLEEP)
            rates.append(result.per_s)
            progress(
                f"drain {args.jobs} x await asyncio.sleep({args.sleep_ms / 1000:g}), "
                f"{config.label()}: {result.per_s:,.0f} jobs/s over {result.seconds:.2f} s"
            )
        await bench.reset()
    finally:
        await connection.close()
    return {
        "peer": PEER,
        "version": VERSION,
        "sleep_ms": args.sleep_ms,
        "jobs": args.jobs,
        "config": config.label(),
        "per_s": [round(rate, 1) for rate in rates],
        "median_per_s": round(statistics.median(rates), 1),
    }


async def run(args: argparse.Namespace, pool: WorkerPool, scratch: Path) -> dict[str, object]:
    connection = await connect(args.dsn)
    try:
        bench = Bench(args.dsn, connection, Queries(AsyncpgDriver(connection)), pool, scratch)
        progress(f"pgqueuer {VERSION}: reinstalling its schema in {redact(args.dsn)}")
        await bench.reinstall()

        single = await bench.enqueue_single(args.single)
        progress(f"enqueue single: {args.single} jobs, {single:,.0f} jobs/s")

        # One call for everything, then chunks of 5,000; later rounds use the faster one.
        chunk_trials = [args.jobs] + ([BULK_CHUNK] if args.jobs > BULK_CHUNK else [])
        runs: list[DrainRun] = []
        for workers in args.workers:
            for config in (WorkerConfig(), *SWEEP):
                if len(runs) < len(chunk_trials):
                    chunk = chunk_trials[len(runs)]
                else:
                    chunk = max(runs, key=lambda r: r.enqueue_per_s).chunk
                result = await bench.drain(args.jobs, workers, config, chunk)
                runs.append(result)
                progress(
                    f"drain {args.jobs} x {workers} worker(s), {config.label()}: "
                    f"{result.per_s:,.0f} jobs/s over {result.seconds:.2f} s "
                    f"(wall {result.wall_s:.1f} s, picks {result.picks}); "
                    f"bulk enqueue (chunk {chunk}) {result.enqueue_per_s:,.0f} jobs/s"
                )

        latencies = await bench.latency(args.latency_jobs, args.gap_ms / 1000)
        progress(
            f"latency: {len(latencies)} jobs, p50 {quantile(latencies, 0.5):.1f} ms, "
            f"p99 {quantile(latencies, 0.99):.1f} ms"
        )
        await bench.reset()
    finally:
        await connection.close()
    return report(args, single, runs, latencies)


def report(
    args: argparse.Namespace, single: float, runs: list[DrainRun], latencies: list[float]
) -> dict[str, object]:
    best_chunk = max(runs, key=lambda r: r.enqueue_per_s).chunk
    bulk = statistics.median(r.enqueue_per_s for r in runs if r.chunk == best_chunk)
    drain: dict[str, dict[str, object]] = {}
    for workers in args.workers:
        mine = [r for r in runs if r.workers == workers]
        default = next(r for r in mine if r.config == WorkerConfig())
        best = max(mine, key=lambda r: r.per_s)
        drain[str(workers)] = {
            "default": round(default.per_s, 1),
            "best": round(best.per_s, 1),
            "best_config": best.config.label(),
        }
    repicks = sum(r.picks - args.jobs for r in runs)
    chunk_text = "one call for all jobs" if best_chunk >= args.jobs else f"chunks of {best_chunk}"
    config = (
        "each worker: its own OS process running pgqueuer.run(factory, mode=drain) on uvloop "
        "(the supervisor behind `pgq run`), factory = QueueManager over one asyncpg connection "
        "(AsyncpgDriver), handler `async def noop(job): pass`; "
        f"default = PgQueuer defaults: batch_size={DEFAULTS['batch_size']}, "
        "max_concurrent_tasks=unlimited, "
        f"dequeue_timeout={DEFAULTS['dequeue_timeout_s']:g}s, LISTEN/NOTIFY wake-up; "
        "sweep: " + "; ".join(c.label() for c in SWEEP)
    )
    notes = (
        "`pgq run` itself crashes at start-up in this venv (typer 0.29.2: its --log-level parser "
        "returns a str, setup_fancy_logger wants the LogLevel enum), so workers call "
        "pgqueuer.run, which is what `pgq run` runs after setting up logging. "
        "Schema: PgQueuer 1.6.0 default install (durability=durable, all tables logged; a "
        "statement-level trigger NOTIFYs on every insert/update/delete of the queue table). "
        "Drain window = first 'picked' to last 'successful' row in pgqueuer_log, by the DB clock; "
        "'successful' rows are written by a buffered flush (every batch_size completions or "
        "~0.1 s), so the window ends at the flush that records the last completion. Worker "
        "start-up is outside the window, but with N>1 the processes start unsynchronised, so "
        "the first one may run alone for a moment (matters more for small --jobs). One run per "
        "point, no repeats. Queue and log tables are VACUUM ANALYZEd after the bulk enqueue. "
        f"Bulk enqueue: the list form of Queries.enqueue, {chunk_text} (faster of those tried), "
        "median over the drain rounds; each enqueue also writes a 'queued' row to pgqueuer_log. "
        "Single enqueue: Queries.enqueue per job over asyncpg (autocommit), plain asyncio loop. "
        f"Re-picked jobs during drains: {repicks}. Latency: one idle worker with PgQueuer's "
        "defaults, woken by NOTIFY (its fallback poll is dequeue_timeout); percentiles by "
        "linear interpolation (statistics.quantiles, inclusive)."
    )
    return {
        "peer": PEER,
        "version": VERSION,
        "config": config,
        "enqueue_single_per_s": round(single, 1),
        "enqueue_bulk_per_s": round(bulk, 1),
        "drain": drain,
        "latency_ms": {
            "p50": round(quantile(latencies, 0.50), 2),
            "p95": round(quantile(latencies, 0.95), 2),
            "p99": round(quantile(latencies, 0.99), 2),
            "mean": round(statistics.fmean(latencies), 2),
        },
        "notes": notes,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", help="postgres://user@host:port/dbname (required)")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--latency-jobs", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true", help="jobs=5000, single=500, latency=100")
    parser.add_argument("--sleep-ms", type=float, help="only drains of async sleeps (see above)")
    parser.add_argument("--runs", type=int, default=3, help="drains of --sleep-ms")
    # Internal: how the benchmark starts its worker processes (DSN in the environment).
    hidden = argparse.SUPPRESS
    parser.add_argument("--worker", choices=[m.value for m in QueueExecutionMode], help=hidden)
    parser.add_argument("--batch-size", type=int, help="--sleep-ms: PgQueuer's batch size")
    parser.add_argument("--max-concurrent-tasks", type=int, help="--sleep-ms: the cap")
    args = parser.parse_args(argv)
    if args.worker:
        return args
    if not args.dsn:
        parser.error("--dsn is required")
    if args.quick:
        args.jobs, args.single, args.latency_jobs = 5_000, 500, 100
    if min(args.jobs, args.single, args.latency_jobs, *args.workers) < 1:
        parser.error("--jobs, --single, --latency-jobs and --workers must be positive")
    if args.latency_jobs < 2:
        parser.error("--latency-jobs must be at least 2 (percentiles)")
    return args


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the cleanup below runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.batch_size, args.max_concurrent_tasks)
    scratch = Path(tempfile.mkdtemp(prefix="pgqueuer-bench-"))
    pool = WorkerPool(args.dsn, scratch)
    try:
        with sigterm_as_exit():
            if args.sleep_ms is not None:
                os.environ[ENV_SLEEP_S] = str(args.sleep_ms / 1000)
                result = asyncio.run(run_sleeps(args, pool, scratch))
            else:
                result = asyncio.run(run(args, pool, scratch))
    except BenchError as exc:
        print(f"pgqueuer_bench: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pgqueuer_bench: interrupted", file=sys.stderr)
        return 130
    finally:
        pool.stop_all()
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
