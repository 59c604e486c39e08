"""``manage.py runworkers``: run the workers of the configured queues."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgoutbox.conf import MAX_CONCURRENCY, MAX_DELAY_CEILING
from django_pgoutbox.db import (
    ERROR_BACKOFF,
    ErrorKind,
    classify_error,
    error_hint,
    require_migrated,
    require_postgresql,
)
from django_pgoutbox.log import show_job_logs
from django_pgoutbox.worker import Worker
from django_pgoutbox.worker.isolated import kill_isolated_children
from django_pgoutbox.worker.recycling import DEFAULT_MAX_ABANDONED, Recycling
from django_pgoutbox.worker.supervisor import ROLES, WorkerFailed
from django_pgoutbox.worker.worker_ids import WorkerIdInUse

logger = logging.getLogger("django_pgoutbox.worker")
#: The level of ctx.logger's records printed at each --verbosity (2 and 3: DEBUG), where the
#: project's LOGGING does not route them.
JOB_LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO}


#: How long a worker waits at start for a database that refuses connections (seconds).
START_WAIT = 60.0


def require_migrated_once_it_answers(alias: str, wait: float = START_WAIT) -> None:
    """``require_migrated``, waiting out a database that refuses connections for now
    (``once_it_answers``)."""
    once_it_answers(alias, lambda: require_migrated(alias), wait)


def once_it_answers(alias: str, step: Callable[[], None], wait: float = START_WAIT) -> None:
    """``step`` (a statement on database ``alias`` at start), waiting out a database that
    refuses connections for now.

    A worker started while the server is full (53300: "too many clients"), starting up (57P03)
    or not reachable (``db.classify_error``: ``CONNECTION``) tries again with the loops'
    back-off (``ERROR_BACKOFF``), saying so once, and once more when it answers; no traceback.
    libpq reports no SQLSTATE for a refused connection, so a wrong password or database name
    looks the same: after ``wait`` seconds the command stops with one line (``CommandError``).
    Any other error is raised at once: as one line with what to change if it is a setting's
    fault (``db.error_hint``: a read-only database, say), else as it is.
    """
    pause, refused_at = ERROR_BACKOFF[0], None
    while True:
        try:
            step()
        except Exception as error:
            # libpq's message: the failure, then often a hint on a line of its own (and one
            # line per host tried): all of it, on one line.
            reason = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
            reason = reason or type(error).__name__
            if classify_error(error) is not ErrorKind.CONNECTION:
                hint = error_hint(error, alias)
                if hint:  # a setting's fault: what to change, in one line
                    raise CommandError(f"{reason} ({hint})") from error
                raise
            connections[alias].close()
            now = time.monotonic()
            if refused_at is None:
                refused_at = now
                logger.warning(
                    "database %r unavailable at start (%s); retrying for up to %.0fs",
                    alias,
                    reason,
                    wait,
                )
            elif now - refused_at >= wait:
                raise CommandError(
                    f"database {alias!r} still unavailable after {now - refused_at:.0f}s: {reason}"
                ) from error
            time.sleep(min(pause, max(0.0, refused_at + wait - now)))
            pause = min(pause * 2, ERROR_BACKOFF[1])
            continue
        if refused_at is not None:
            logger.warning(
                "database %r answers after %.1fs: starting", alias, time.monotonic() - refused_at
            )
        return


#: The signals that stop a worker (``Command._install_signal_handlers``).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StoppedBeforeStart(BaseException):
    """SIGTERM or SIGINT received while ``runworkers`` waited for its database: nothing runs
    yet, so nothing to finish. A ``BaseException``, as ``KeyboardInterrupt``, so that no
    ``except Exception`` on the way (the wait's, the driver's) takes it for a database error."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


def _stop_before_start(signum: int, frame: FrameType | None) -> None:
    raise StoppedBeforeStart(signum)


def _names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated queue names")
    return names


def _integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None


def _positive_int(value: str, maximum: int = 2**31 - 1) -> int:
    number = _integer(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    if number > maximum:
        raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, not {number:,}")
    return number


def _concurrency(value: str) -> int:
    return _positive_int(value, MAX_CONCURRENCY)


def _port(value: str) -> int:
    return _positive_int(value, 65535)


def _mebibytes(value: str) -> int:
    return _positive_int(value, 2**40) * 2**20


def _count(value: str) -> int:
    number = _integer(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {number}")
    return number


#: ``--gc-threshold``'s default: the collector's first threshold in a worker process.
GC_THRESHOLD = 20_000


def tune_collector(threshold: int) -> None:
    """Keep the garbage collector off the worker's hot path (``runworkers --gc-threshold``).

    The objects loaded at start-up (Django, the apps, their modules) are frozen out of the
    collector's scans, and its youngest generation is collected every ``threshold`` new objects
    instead of every 700. A worker draining fast jobs makes a few objects per job that live
    until the job's outcome is written, a few milliseconds: with Python's default, they were
    scanned again and again on their way to the oldest generation, whose full collections also
    walked every object of start-up (docs/benchmarks.md, "What profiling found", item 21). Memory
    that reference counting frees is freed as before; only reference cycles wait a little
    longer. ``0`` leaves the collector as Python set it.
    """
    if not threshold:
        return
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {value!r}")
    if number > MAX_DELAY_CEILING:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_DELAY_CEILING:.0f} seconds (365 days), not {value}"
        )
    return number


class Command(BaseCommand):
    help = (
        "Run the job workers of the configured queues: each queue with its own threads and "
        "database connections. SIGTERM (or Ctrl-C) stops claiming and lets running jobs finish "
        "within the grace period; a second one exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--roles",
            type=_names,
            action="extend",
            metavar="ROLE[,ROLE]",
            help=f"What this process does: {', '.join(ROLES)} (default: all).",
        )
        parser.add_argument(
            "--queues",
            type=_names,
            action="extend",
            metavar="NAME[,NAME]",
            help="Only these queues (default: every queue of PGOUTBOX['QUEUES']).",
        )
        parser.add_argument(
            "--exclude-queues",
            type=_names,
            action="extend",
            default=[],
            metavar="NAME[,NAME]",
            help="Every queue but these.",
        )
        parser.add_argument(
            "--concurrency",
            type=_concurrency,
            help="Handler threads per queue, overriding each queue's CONCURRENCY "
            f"(at most {MAX_CONCURRENCY}).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Run the jobs that are due, then exit.",
        )
        parser.add_argument(
            "--worker-id",
            help="Name stored in jobs.locked_by (default: host:pid:random).",
        )
        parser.add_argument(
            "--grace-period",
            type=_seconds,
            default=30.0,
            help="Seconds running jobs get to finish after SIGTERM (default 30).",
        )
        parser.add_argument(
            "--metrics-port",
            type=_port,
            help="Serve this process's Prometheus metrics on this port (needs the "
            "'prometheus' extra).",
        )
        parser.add_argument(
            "--metrics-host",
            metavar="ADDRESS",
            help="The address the metrics server listens on (default 127.0.0.1: this host "
            "only; 0.0.0.0 for every interface).",
        )
        parser.add_argument(
            "--gc-threshold",
            type=_count,
            default=GC_THRESHOLD,
            metavar="N",
            help="Collect the youngest generation of garbage every N new objects, and freeze "
            f"the objects of start-up out of its scans (default {GC_THRESHOLD:,}; 0: leave "
            "Python's collector as it is).",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="Database alias holding the jobs (default: the router's choice).",
        )
        parser.add_argument(
            "--max-jobs",
            type=_positive_int,
            metavar="N",
            help="Recycle the process after N jobs: finish the running ones, then start again "
            "(the same command, in the same process).",
        )
        parser.add_argument(
            "--max-memory",
            type=_mebibytes,
            metavar="MiB",
            help="Recycle the process once its resident memory reaches this many MiB.",
        )
        parser.add_argument(
            "--max-abandoned-threads",
            type=_count,
            default=DEFAULT_MAX_ABANDONED,
            metavar="N",
            help="Recycle the process once N handler threads, abandoned at their timeout, are "
            f"still running (default {DEFAULT_MAX_ABANDONED}; 0: never).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] is not None:
            require_postgresql(options["database"])
        try:
            worker = Worker(
                roles=options["roles"] or ROLES,
                queues=options["queues"],
                exclude_queues=options["exclude_queues"],
                concurrency=options["concurrency"],
                burst=options["burst"],
                worker_id=options["worker_id"],
                using=options["database"],
                grace_period=options["grace_period"],
                recycle=Recycling(
                    max_jobs=options["max_jobs"],
                    max_memory=options["max_memory"],
                    max_abandoned=options["max_abandoned_threads"] or None,
                ),
            )
        except ValueError as error:
            raise CommandError(str(error)) from error
        if not self._at_start(worker.using, lambda: require_migrated(worker.using)):
            return
        if not connections[worker.using].in_atomic_block:
            connections[worker.using].close()  # the loops have their own; it would sit idle
        host = options["metrics_host"]
        if host is not None and not options["metrics_port"]:
            raise CommandError("--metrics-host needs --metrics-port: no metrics server runs")
        if host is not None and not host.strip():  # "" would listen on every interface
            raise CommandError("--metrics-host must be an address (such as 0.0.0.0), not ''")
        if options["metrics_port"]:
            try:
                from django_pgoutbox.prometheus import serve_process_metrics
            except ImportError as error:
                raise CommandError(str(error)) from error
            host = host or "127.0.0.1"
            try:
                serve_process_metrics(options["metrics_port"], host)
            except OSError as error:  # an address not of this host, a port taken
                raise CommandError(
                    f"--metrics-host {host!r:.80} --metrics-port {options['metrics_port']}: "
                    f"cannot listen there ({error})"
                ) from error
        try:
            # A second connection, which the server may refuse though it took the first.
            if not self._at_start(worker.using, worker.take_id):
                return
        except WorkerIdInUse as error:
            raise CommandError(str(error)) from error
        self._install_signal_handlers(worker)
        tune_collector(options["gc_threshold"])
        show_job_logs(sys.stderr, JOB_LOG_LEVELS.get(options["verbosity"], logging.DEBUG))
        if options["verbosity"] >= 1:
            self.stdout.write(f"Worker {worker.worker_id}: {worker.describe()}")
        try:
            worker.run()
        except WorkerIdInUse as error:
            raise CommandError(str(error)) from error
        except WorkerFailed as error:
            raise CommandError(f"{error} (the log above has the error)") from error
        finally:
            # Attempts still running in child processes belong to jobs released for other
            # workers: they must not run on beside the next attempt.
            kill_isolated_children()
        # Handlers that outlived the grace period were released for other workers; do not let
        # their threads (daemons) or anything else keep the process alive.
        sys.stdout.flush()
        sys.stderr.flush()
        # Recycled, unless a signal asked the process to stop meanwhile: that one wins.
        if worker.recycled is not None and not self._signals:
            self._start_again(worker)
        if any(t.daemon and t.is_alive() for t in threading.enumerate()):
            logging.shutdown()
            os._exit(0)

    def _at_start(self, alias: str, step: Callable[[], None]) -> bool:
        """``step`` once database ``alias`` answers (``once_it_answers``); False if SIGTERM or
        SIGINT came first.

        Until the loops start (and their handlers replace these), a stop has nothing to finish:
        it exits at once, with one line and the status of a worker stopped after its loops ran,
        not a traceback (SIGINT) nor death by the signal (SIGTERM, which a container's PID 1
        would even ignore).
        """
        previous = {signum: signal.signal(signum, _stop_before_start) for signum in STOP_SIGNALS}
        try:
            once_it_answers(alias, step)
        except StoppedBeforeStart as stopped:
            connections[alias].close()
            logger.warning(
                "received %s while waiting for database %r: exiting", stopped.name, alias
            )
            return False
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        return True

    def _start_again(self, worker: Worker) -> None:
        """Run this very command again in this process (``exec``): a fresh interpreter, its
        memory and abandoned threads gone, the same pid for the process manager."""
        logger.warning("worker %s recycled (%s): starting again", worker.worker_id, worker.recycled)
        connections.close_all()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)

    def _install_signal_handlers(self, worker: Worker) -> None:
        #: The signals received (their handler runs in the main thread, as ``handle`` does).
        self._signals: list[int] = []
        received = self._signals

        def handle(signum: int, frame: FrameType | None) -> None:
            received.append(signum)
            if len(received) == 1:
                logger.warning(
                    "received %s: finishing running jobs, then exiting", signal.Signals(signum).name
                )
                worker.stop()
            else:
                # Second signal: leave now. Leases cover whatever was cut short.
                os._exit(128 + signum)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
