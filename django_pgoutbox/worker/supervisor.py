"""``Worker``: the queues of one ``runworkers`` process, their listener, and how they stop."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Iterable

from django.db import router

from django_pgoutbox.conf import JOBS_CHANNEL, get_settings
from django_pgoutbox.models import Job
from django_pgoutbox.worker.listener import Listener
from django_pgoutbox.worker.runner import QueueRunner

logger = logging.getLogger("django_pgoutbox.worker")


def default_worker_id() -> str:
    """``host:pid:random``: unique per process, readable in ``jobs.locked_by``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs the jobs of the chosen queues until stopped.

    Drive it from tests as ``Worker(queues=["default"], burst=True).run()``; ``runworkers`` is a
    thin command around it.
    """

    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        exclude_queues: Iterable[str] = (),
        concurrency: int | None = None,
        burst: bool = False,
        worker_id: str | None = None,
        using: str | None = None,
        grace_period: float = 30.0,
    ) -> None:
        conf = get_settings()
        chosen = list(queues) if queues is not None else list(conf.queues)
        excluded = set(exclude_queues)
        unknown = [name for name in [*chosen, *excluded] if name not in conf.queues]
        if unknown:
            raise ValueError(
                f"unknown queue(s) {', '.join(map(repr, unknown))}; "
                f"PGOUTBOX['QUEUES'] has {', '.join(conf.queues)}"
            )
        names = [name for name in dict.fromkeys(chosen) if name not in excluded]
        if not names:
            raise ValueError("no queue left to run")
        self.worker_id = worker_id or default_worker_id()
        self.using = using or router.db_for_write(Job)
        # A burst drains what is already due: nothing to wait for, so nothing to listen to.
        self.listen = conf.notify and not burst
        self.runners = {
            name: QueueRunner(
                conf.queues[name],
                worker_id=self.worker_id,
                using=self.using,
                policy=conf.retry,
                concurrency=concurrency,
                burst=burst,
                grace_period=grace_period,
            )
            for name in names
        }
        self.listener: Listener | None = None
        self._stopped = threading.Event()

    def run(self) -> None:
        """Run until ``stop()`` (or, with ``burst``, until no queue has due work)."""
        logger.info(
            "worker %s running queues %s",
            self.worker_id,
            ", ".join(f"{name}x{runner.concurrency}" for name, runner in self.runners.items()),
        )
        if self.listen:
            self.listener = Listener(
                using=self.using,
                channel=JOBS_CHANNEL,
                on_notify=self._on_notify,
                on_connect=self._wake_all,
            )
            self.listener.start()
        threads = [
            threading.Thread(target=runner.run, name=f"pgoutbox-dispatch-{name}")
            for name, runner in self.runners.items()
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)
        finally:
            if self.listener is not None:
                self.listener.stop()
                self.listener.join(timeout=2)
            self._stopped.set()
        logger.info("worker %s stopped", self.worker_id)

    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period, the rest are released."""
        for runner in self.runners.values():
            runner.stop()

    def _on_notify(self, queue: str) -> None:
        runner = self.runners.get(queue)
        if runner is not None:
            runner.wake()

    def _wake_all(self) -> None:
        for runner in self.runners.values():
            runner.wake()
