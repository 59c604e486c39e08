"""One queue's loop: claim as many jobs as there are free threads, run them, record outcomes.

Each queue of a worker process has its own ``QueueRunner``: its own dispatcher thread (and so its
own database connection, Django's connections being per thread) and its own handler threads. A
queue of slow reports therefore holds only its own threads and its own connection, and can never
delay the claims of ``critical_alerts``.

The dispatcher is the only thread that talks to the database about leases. Each turn of its loop:

1. renews the leases of running attempts, in one statement, when a third of the lease is gone;
2. recovers this queue's expired leases, once per poll interval;
3. writes the outcomes that handlers produced since the last turn and claims as many jobs as
   there are free handler threads: both in one statement, one round trip;
4. waits until a handler finishes, a notification arrives, or the poll interval passes.

No transaction is open while a handler runs: the claim commits before the handler starts, and
the outcome is written in a later, separate statement.
"""

from __future__ import annotations

import json
import logging
import queue as queue_module
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from django_pgoutbox import metrics, queries
from django_pgoutbox.conf import QueueSettings, RetrySettings
from django_pgoutbox.errors import LeaseLost
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.worker.execute import ClaimedJob, Outcome, execute

logger = logging.getLogger("django_pgoutbox.worker")

#: Renew a running attempt's lease when this fraction of it has passed.
RENEW_FRACTION = 1 / 3

#: Back-off bounds (seconds) after a database error in the dispatcher.
ERROR_BACKOFF = (0.2, 10.0)


@dataclass
class _Running:
    job: ClaimedJob
    lease_lost: bool = False


@dataclass
class _RenewalRequest:
    job_id: uuid.UUID
    done: threading.Event = field(default_factory=threading.Event)
    held: bool = False


class _HandlerThreads:
    """A fixed set of daemon threads running handlers.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not hold the process open at exit: once
    the grace period is over and the unfinished jobs are released, a hung handler must not keep
    the worker alive.
    """

    def __init__(self, size: int, name: str) -> None:
        self._tasks: queue_module.SimpleQueue[Callable[[], None] | None] = (
            queue_module.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True)
            for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            task()


class QueueRunner:
    """Claims, runs and records the jobs of one queue."""

    def __init__(
        self,
        settings: QueueSettings,
        *,
        worker_id: str,
        using: str,
        policy: RetrySettings,
        concurrency: int | None = None,
        burst: bool = False,
        grace_period: float = 30.0,
    ) -> None:
        self.queue = settings.name
        self.settings = settings
        self.worker_id = worker_id
        self.using = using
        self.policy = policy
        self.concurrency = concurrency or settings.concurrency
        self.burst = burst
        self.grace_period = grace_period
        self.lease_seconds = settings.lease_seconds
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._outcomes: deque[Outcome] = deque()
        self._renewals: deque[_RenewalRequest] = deque()
        self._running: dict[uuid.UUID, _Running] = {}
        self._threads = _HandlerThreads(self.concurrency, f"pgoutbox-{self.queue}")
        self.finished = threading.Event()

    # -- called from other threads ---------------------------------------------------------------

    def wake(self) -> None:
        """New work may exist (a notification, a reconnect): claim now instead of at the poll."""
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming; let running attempts finish within the grace period."""
        self._stopping.set()
        self._wake.set()

    def renew(self, job_id: uuid.UUID) -> None:
        """Renew one attempt's lease now (``ctx.renew_lease()``); raise ``LeaseLost`` if gone."""
        request = _RenewalRequest(job_id)
        self._renewals.append(request)
        self._wake.set()
        if not request.done.wait(timeout=self.lease_seconds):
            raise TimeoutError(f"the lease of job {job_id} could not be renewed in time")
        if not request.held:
            raise LeaseLost(f"the lease of job {job_id} was lost; its outcome will be discarded")

    # -- the dispatcher --------------------------------------------------------------------------

    def run(self) -> None:
        """The dispatcher loop; returns when stopped (or, in burst mode, when nothing is due)."""
        renew_every = self.lease_seconds * RENEW_FRACTION
        next_renewal = time.monotonic() + renew_every
        next_recovery = 0.0
        next_poll = 0.0
        stop_deadline: float | None = None
        backoff = ERROR_BACKOFF[0]
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                try:
                    if self._renewals or (self._running and now >= next_renewal):
                        self._renew_leases()
                        next_renewal = now + renew_every
                    if now >= next_recovery:
                        recover_expired_leases(self.queue, using=self.using)
                        next_recovery = now + self.settings.poll_interval
                    if self._stopping.is_set():
                        self._record_and_claim(claim=False)
                        stop_deadline = stop_deadline or now + self.grace_period
                        if not self._running:
                            return
                        if now >= stop_deadline:
                            self._release_unfinished()
                            return
                    else:
                        claimed, requested = self._record_and_claim(claim=True)
                        if requested:
                            next_poll = now + self.settings.poll_interval
                        if self.burst and not claimed and not self._running:
                            return
                        if requested and len(claimed) == requested:
                            continue  # the queue may hold more: fill the threads that free up
                    backoff = ERROR_BACKOFF[0]
                except (OperationalError, InterfaceError) as error:
                    logger.warning(
                        "queue %s: database unavailable (%s); retrying in %.1fs",
                        self.queue,
                        error,
                        backoff,
                        extra={"queue": self.queue},
                    )
                    connections[self.using].close()
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, ERROR_BACKOFF[1])
                    continue
                deadlines = [next_poll, next_recovery]
                if self._running:
                    deadlines.append(next_renewal)
                if stop_deadline is not None:
                    deadlines.append(stop_deadline)
                self._wake.wait(max(0.0, min(deadlines) - time.monotonic()))
        finally:
            self._threads.shutdown()
            connections[self.using].close()
            self.finished.set()

    def _record_and_claim(self, *, claim: bool) -> tuple[list[ClaimedJob], int]:
        """Write the finished attempts' outcomes and, with ``claim``, fill the free threads.

        One statement either way (RECORD_AND_CLAIM when there is both to do). Returns the jobs
        claimed and how many were asked for.
        """
        batch: list[Outcome] = []
        while self._outcomes:
            batch.append(self._outcomes.popleft())
        # Attempts whose outcome is in this batch no longer hold a thread.
        limit = self.concurrency - (len(self._running) - len(batch)) if claim else 0
        if not batch and limit <= 0:
            return [], 0
        outcome_params: list[Any] = [
            [o.job.id for o in batch],
            [o.job.attempt for o in batch],
            [o.status.value for o in batch],
            [o.delay for o in batch],
            [o.code for o in batch],
            [o.summary for o in batch],
            [o.result_json for o in batch],
            self.worker_id,
        ]
        claim_params: list[Any] = [self.queue, limit, self.worker_id, self.lease_seconds]
        applied: set[uuid.UUID] = set()
        rows: list[tuple[Any, ...]] = []
        started = time.perf_counter()
        try:
            with connections[self.using].cursor() as cursor:
                if batch and limit > 0:
                    cursor.execute(queries.RECORD_AND_CLAIM, outcome_params + claim_params)
                    for is_claim, *row in cursor.fetchall():
                        if is_claim:
                            rows.append(tuple(row))
                        else:
                            applied.add(row[0])
                elif batch:
                    cursor.execute(queries.RECORD_OUTCOMES, outcome_params)
                    applied = {row[0] for row in cursor.fetchall()}
                else:
                    cursor.execute(queries.CLAIM_JOBS, claim_params)
                    rows = cursor.fetchall()
        except DatabaseError:
            # Not written: keep them (and their leases, still renewed) for the next turn.
            self._outcomes.extendleft(reversed(batch))
            raise
        elapsed = time.perf_counter() - started
        metrics.BATCH_DB_DURATION.observe(elapsed, role="jobs")
        if limit > 0:
            metrics.CLAIM_DURATION.observe(elapsed, queue=self.queue)
        self._settle(batch, applied)
        return self._start(rows), limit

    def _start(self, rows: list[tuple[Any, ...]]) -> list[ClaimedJob]:
        claimed = [
            ClaimedJob(
                id=job_id,
                job_type=job_type,
                payload=json.loads(payload),
                attempt=attempts,
                max_attempts=max_attempts,
                organization_id=organization_id,
                queue=queue,
                priority=priority,
                created_at=created_at,
                waited=waited,
                worker_ids=json.loads(worker_ids),
            )
            for (
                job_id,
                job_type,
                payload,
                attempts,
                max_attempts,
                organization_id,
                queue,
                priority,
                created_at,
                waited,
                worker_ids,
            ) in rows
        ]
        if claimed:
            metrics.JOBS_CLAIMED.inc(len(claimed), queue=self.queue)
        for job in claimed:
            self._running[job.id] = _Running(job)
            self._threads.submit(self._task(job))
        return claimed

    def _task(self, job: ClaimedJob) -> Callable[[], None]:
        def run() -> None:
            try:
                outcome = execute(job, policy=self.policy, renew=lambda: self.renew(job.id))
            except BaseException:  # pragma: no cover - execute() catches everything it can
                logger.exception("job %s: the worker failed to run it", job.id)
                return  # no outcome: its lease expires and another attempt follows
            self._outcomes.append(outcome)
            self._wake.set()

        return run

    def _settle(self, batch: list[Outcome], applied: set[uuid.UUID]) -> None:
        """Forget the attempts of ``batch``; count what was written and what was fenced off."""
        for outcome in batch:
            job = outcome.job
            self._running.pop(job.id, None)
            if job.id in applied:
                metrics.JOB_OUTCOMES.inc(
                    queue=self.queue, job_type=job.job_type, outcome=outcome.status.value
                )
            else:
                metrics.STALE_OUTCOMES.inc(queue=self.queue)
                logger.warning(
                    "job %s attempt %d: outcome %s discarded, the lease was taken over",
                    job.id,
                    job.attempt,
                    outcome.status.value,
                    extra={
                        "job_id": str(job.id),
                        "job_type": job.job_type,
                        "queue": self.queue,
                        "attempt": job.attempt,
                        "outcome": "stale",
                    },
                )

    def _renew_leases(self) -> None:
        requests: list[_RenewalRequest] = []
        while self._renewals:
            requests.append(self._renewals.popleft())
        held: set[uuid.UUID] = set()
        running = [r for r in self._running.values() if not r.lease_lost]
        if running:
            try:
                with connections[self.using].cursor() as cursor:
                    cursor.execute(
                        queries.RENEW_LEASES,
                        [
                            self.lease_seconds,
                            [r.job.id for r in running],
                            [r.job.attempt for r in running],
                            self.worker_id,
                        ],
                    )
                    held = {row[0] for row in cursor.fetchall()}
            except DatabaseError:
                self._renewals.extend(requests)
                raise
        for entry in running:
            if entry.job.id not in held:
                entry.lease_lost = True
                logger.warning(
                    "job %s attempt %d: lease lost; its outcome will be discarded",
                    entry.job.id,
                    entry.job.attempt,
                    extra={"job_id": str(entry.job.id), "queue": self.queue},
                )
        for request in requests:
            request.held = request.job_id in held
            request.done.set()

    def _release_unfinished(self) -> None:
        unfinished = list(self._running.values())
        if not unfinished:
            return
        with connections[self.using].cursor() as cursor:
            cursor.execute(
                queries.RELEASE_JOBS,
                [
                    [r.job.id for r in unfinished],
                    [r.job.attempt for r in unfinished],
                    self.worker_id,
                ],
            )
            released = cursor.rowcount
        logger.warning(
            "queue %s: grace period over; released %d unfinished job(s) for another worker",
            self.queue,
            released,
            extra={"queue": self.queue},
        )
        self._running.clear()
