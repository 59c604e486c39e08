"""``Worker``: the roles of one ``runworkers`` process, their listener, and how they stop."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable

from django.db import router

from django_pgoutbox.conf import (
    CANCEL_CHANNEL,
    CONTROL_CHANNEL,
    JOBS_CHANNEL,
    MAX_CONCURRENCY,
    OUTBOX_CHANNEL,
    get_settings,
)
from django_pgoutbox.db import error_hint
from django_pgoutbox.health import ROLES as HEALTH_ROLES
from django_pgoutbox.health import Heartbeat
from django_pgoutbox.models import Job
from django_pgoutbox.scheduler import Scheduler
from django_pgoutbox.schedules import load_schedules
from django_pgoutbox.worker import recycling, worker_ids
from django_pgoutbox.worker.listener import Listener
from django_pgoutbox.worker.relay import Relay
from django_pgoutbox.worker.runner import AloneGate, QueueRunner

logger = logging.getLogger("django_pgoutbox.worker")

#: What a worker process can do; ``runworkers --roles`` picks among them (what health requires).
ROLES = HEALTH_ROLES


def default_worker_id() -> str:
    """``host:pid:random``: unique per process, readable in ``jobs.locked_by``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


#: The longest ``--worker-id``: it is written into every job's ``worker_ids`` and each lease.
MAX_WORKER_ID_LENGTH = 200


def check_worker_id(worker_id: str) -> str:
    """``worker_id`` if it can name a worker; else ``ValueError`` saying why."""
    if not isinstance(worker_id, str) or not worker_id.strip():
        raise ValueError(f"worker id must be non-empty text, not {worker_id!r}")
    if len(worker_id) > MAX_WORKER_ID_LENGTH:
        raise ValueError(
            f"worker id must be at most {MAX_WORKER_ID_LENGTH} characters, not {len(worker_id):,}"
        )
    if not worker_id.isprintable():
        raise ValueError(
            f"worker id {worker_id!r} must hold printable characters only (no NUL, no newline)"
        )
    return worker_id


class WorkerFailed(RuntimeError):
    """One of the worker's loops failed on an unexpected error; the worker stopped."""


class Worker:
    """Runs the chosen roles (jobs of the chosen queues, the relay, the scheduler) until stopped.

    Drive it from tests as ``Worker(queues=["default"], burst=True).run()``; ``runworkers`` is a
    thin command around it.
    """

    def __init__(
        self,
        *,
        roles: Iterable[str] = ROLES,
        queues: Iterable[str] | None = None,
        exclude_queues: Iterable[str] = (),
        concurrency: int | None = None,
        burst: bool = False,
        worker_id: str | None = None,
        using: str | None = None,
        grace_period: float = 30.0,
        recycle: recycling.Recycling | None = None,
    ) -> None:
        conf = get_settings()
        self.roles = list(dict.fromkeys(roles))
        unknown_roles = [role for role in self.roles if role not in ROLES]
        if unknown_roles or not self.roles:
            raise ValueError(
                f"unknown role(s) {', '.join(map(repr, unknown_roles)) or '(none given)'}; "
                f"roles are {', '.join(ROLES)}"
            )
        if concurrency is not None and (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= MAX_CONCURRENCY
        ):
            raise ValueError(
                f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY}, "
                f"not {concurrency!r}"
            )
        self.worker_id = check_worker_id(worker_id) if worker_id else default_worker_id()
        #: Whether ``take_id`` took the worker id already (``runworkers`` does, at start).
        self._id_taken = False
        self.using = using or router.db_for_write(Job)
        # A burst drains what is already due: nothing to wait for, so nothing to listen to.
        self.listen = conf.notify and not burst
        self.runners: dict[str, QueueRunner] = {}
        if "jobs" in self.roles:
            gate = AloneGate()  # one suspect runs alone at a time in this process
            for name in self._queue_names(conf.queues, queues, exclude_queues):
                self.runners[name] = QueueRunner(
                    conf.queues[name],
                    worker_id=self.worker_id,
                    using=self.using,
                    policy=conf.retry,
                    concurrency=concurrency,
                    burst=burst,
                    grace_period=grace_period,
                    gate=gate,
                )
        self.relay = (
            Relay(
                conf.outbox,
                relay_id=self.worker_id,
                using=self.using,
                policy=conf.retry,
                burst=burst,
            )
            if "relay" in self.roles
            else None
        )
        self.scheduler: Scheduler | None = None
        if "scheduler" in self.roles:
            schedules, problems = load_schedules()
            if problems:
                raise ValueError("; ".join(map(str, problems)))
            self.scheduler = Scheduler(
                schedules, using=self.using, poll_interval=conf.poll_interval, burst=burst
            )
        self.listener: Listener | None = None
        self.failed: list[str] = []  # the loops that raised
        #: The limits past which this process recycles itself (``runworkers --max-jobs``...).
        self.recycling = recycle or recycling.Recycling(max_abandoned=None)
        #: Why the worker stopped to recycle itself (the limit it reached), or None. The
        #: thread of ``run()`` alone writes it.
        self.recycled: str | None = None

    @staticmethod
    def _queue_names(
        configured: Iterable[str], queues: Iterable[str] | None, exclude: Iterable[str]
    ) -> list[str]:
        configured = list(configured)
        chosen = list(queues) if queues is not None else configured
        excluded = set(exclude)
        unknown = [name for name in [*chosen, *excluded] if name not in configured]
        if unknown:
            raise ValueError(
                f"unknown queue(s) {', '.join(map(repr, unknown))}; "
                f"PGOUTBOX['QUEUES'] has {', '.join(configured)}"
            )
        names = [name for name in dict.fromkeys(chosen) if name not in excluded]
        if not names:
            raise ValueError("no queue left to run")
        return names

    def describe(self) -> str:
        parts = [f"{name} (x{runner.concurrency})" for name, runner in self.runners.items()]
        if self.relay is not None:
            parts.append("outbox relay")
        if self.scheduler is not None:
            parts.append(f"scheduler ({len(self.scheduler.schedules)} schedules)")
        return ", ".join(parts)

    def take_id(self) -> None:
        """Take this process's worker id (``worker_ids.take``) before ``run``, which then does
        not: raises ``WorkerIdInUse`` if another live process runs under it."""
        heartbeat = Heartbeat(self.worker_id, self.roles, list(self.runners), self.using)
        worker_ids.take(heartbeat.params, self.using)
        self._id_taken = True

    def run(self) -> None:
        """Run until ``stop()`` (or, with ``burst``, until nothing is due); raises
        ``WorkerIdInUse`` first if another live process runs under this worker id."""
        if not self._id_taken:
            self.take_id()
        heartbeat = Heartbeat(self.worker_id, self.roles, list(self.runners), self.using)
        logger.info("worker %s running %s", self.worker_id, self.describe())
        if self.listen:
            channels: dict[str, Callable[[str], None]] = {}
            if self.runners:
                channels[JOBS_CHANNEL] = self._on_job_notification
                channels[CANCEL_CHANNEL] = self._on_cancel_notification
                channels[CONTROL_CHANNEL] = self._on_control_notification
            if self.relay is not None:
                channels[OUTBOX_CHANNEL] = self.relay.wake
            if channels:  # a scheduler alone has nothing to listen for
                listen_using = get_settings().listen_databases.get(self.using, self.using)
                self.listener = Listener(
                    using=listen_using, channels=channels, on_connect=self._wake_all
                )
                self.listener.start()
        loops: list[tuple[str, Callable[[], None]]] = [
            (f"pgoutbox-dispatch-{name}", runner.run) for name, runner in self.runners.items()
        ]
        if self.relay is not None:
            loops.append(("pgoutbox-relay", self.relay.run))
        if self.scheduler is not None:
            loops.append(("pgoutbox-scheduler", self.scheduler.run))
        threads = [
            threading.Thread(target=self._guarded(name, target), name=name)
            for name, target in loops
        ]
        heartbeat.start()
        for thread in threads:
            thread.start()
        try:
            self._watch(threads)
        finally:
            heartbeat.stop()
            if self.listener is not None:
                self.listener.stop()
                self.listener.join(timeout=2)
        logger.info("worker %s stopped", self.worker_id)
        if self.failed:
            raise WorkerFailed(
                f"worker {self.worker_id} stopped because {', '.join(self.failed)} failed"
            )

    def _watch(self, threads: list[threading.Thread]) -> None:
        """Wait for ``threads`` to end; meanwhile, stop the worker once it is past one of its
        recycling limits."""
        watching = self.recycling.limited
        next_check = time.monotonic() + recycling.CHECK_INTERVAL
        while alive := [thread for thread in threads if thread.is_alive()]:
            alive[0].join(max(0.0, next_check - time.monotonic()) if watching else 0.5)
            if watching and time.monotonic() >= next_check:
                next_check = time.monotonic() + recycling.CHECK_INTERVAL
                self.recycled = self._recycle_reason()
                if self.recycled is not None:
                    watching = False
                    logger.warning(
                        "worker %s recycles: %s; finishing its running jobs, then starting again",
                        self.worker_id,
                        self.recycled,
                    )
                    self.stop()

    def _recycle_reason(self) -> str | None:
        snapshots = [runner.snapshot() for runner in self.runners.values()]
        limits = self.recycling
        return limits.reason(
            jobs=sum(snapshot.written for snapshot in snapshots),
            memory=recycling.resident_memory() if limits.max_memory is not None else None,
            abandoned=sum(snapshot.abandoned for snapshot in snapshots),
        )

    def _guarded(self, name: str, target: Callable[[], None]) -> Callable[[], None]:
        """``target``, but an error that escapes it stops the whole worker.

        The loops survive lost connections by themselves; anything else that escapes one (a
        missing table, a bug) would leave the process up, its heartbeat saying it is alive, while
        that queue or role does nothing. Better to stop, say why, and exit with an error, so that
        a supervisor restarts the process and its alerts see it.
        """

        def run() -> None:
            try:
                target()
            except BaseException as error:
                hint = error_hint(error, self.using)
                logger.critical(
                    "%s failed; stopping this worker so that its supervisor restarts it%s",
                    name,
                    f" ({hint})" if hint else "",
                    exc_info=True,
                )
                self.failed.append(name)
                self.stop()

        return run

    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period, the rest are released."""
        for runner in self.runners.values():
            runner.stop()
        if self.relay is not None:
            self.relay.stop()
        if self.scheduler is not None:
            self.scheduler.stop()

    def _on_job_notification(self, queue: str) -> None:
        runner = self.runners.get(queue)
        if runner is not None:
            runner.wake()

    def _on_cancel_notification(self, queue: str) -> None:
        runner = self.runners.get(queue)
        if runner is not None:
            runner.check_cancellations()

    def _on_control_notification(self, queue: str) -> None:
        runner = self.runners.get(queue)
        if runner is not None:
            runner.controls_changed()

    def _wake_all(self) -> None:
        """(Re)connected: a notification sent meanwhile is lost. Each queue claims, and reads
        its row of ``queue_controls`` again."""
        for runner in self.runners.values():
            runner.controls_changed()
            runner.wake()
        if self.relay is not None:
            self.relay.wake()
