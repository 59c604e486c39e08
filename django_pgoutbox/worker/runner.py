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

A queue with FAIR, MAX_RUNNING or RATE_LIMIT writes outcomes and claims in two steps instead: the
claim runs in a short transaction under the queue's advisory lock, so that its limits hold across
every worker (see ``queries.CLAIM_LOCK``). The dispatcher also fails attempts that run past their
job type's ``timeout`` (thread isolation), and passes cancellation requests, which it learns of at
each lease renewal, on to the handlers.
"""

from __future__ import annotations

import json
import logging
import math
import queue as queue_module
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from django_pgoutbox import metrics, queries
from django_pgoutbox.conf import QueueSettings, RetrySettings
from django_pgoutbox.errors import JobTimeout, LeaseLost
from django_pgoutbox.jobs import get_job
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.models import JobStatus
from django_pgoutbox.retry import decide
from django_pgoutbox.worker.execute import ClaimedJob, Outcome, execute

logger = logging.getLogger("django_pgoutbox.worker")

#: Renew a running attempt's lease when this fraction of it has passed.
RENEW_FRACTION = 1 / 3

#: Back-off bounds (seconds) after a database error in the dispatcher.
ERROR_BACKOFF = (0.2, 10.0)


#: The longest wait (seconds) before a rate-limited queue looks for new tokens.
RATE_LIMIT_RETRY_CAP = 1.0

#: A running attempt's key: the job and its attempt number (the fencing token).
Key = tuple[uuid.UUID, int]


@dataclass
class _Running:
    job: ClaimedJob
    #: Set when the job's cancellation was requested; the handler's ctx reads it.
    cancel: threading.Event = field(default_factory=threading.Event)
    #: When the dispatcher fails the attempt for its timeout (monotonic); thread isolation only.
    deadline: float | None = None
    lease_lost: bool = False


@dataclass
class _RenewalRequest:
    key: Key
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

    def add_thread(self) -> None:
        """Start one more thread, in place of one that a timed-out handler still occupies."""
        thread = threading.Thread(
            target=self._work, name=f"{self._threads[0].name}+{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def retire_thread(self) -> None:
        """Let one idle thread end: a timed-out handler returned, its thread is free again."""
        self._tasks.put(None)

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
        self._running: dict[Key, _Running] = {}
        #: Attempts failed for their timeout whose handler has not returned yet.
        self._abandoned: set[Key] = set()
        self._check_cancel = False
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

    def check_cancellations(self) -> None:
        """A running job of this queue was asked to stop: look at the running jobs now."""
        self._check_cancel = True
        self._wake.set()

    def renew(self, key: Key) -> None:
        """Renew one attempt's lease now (``ctx.renew_lease()``); raise ``LeaseLost`` if gone."""
        request = _RenewalRequest(key)
        self._renewals.append(request)
        self._wake.set()
        if not request.done.wait(timeout=self.lease_seconds):
            raise TimeoutError(f"the lease of job {key[0]} could not be renewed in time")
        if not request.held:
            raise LeaseLost(f"the lease of job {key[0]} was lost; its outcome will be discarded")

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
                    self._expire_timeouts(now)
                    if (
                        self._renewals
                        or (self._check_cancel and self._running)
                        or (self._running and now >= next_renewal)
                    ):
                        self._check_cancel = False
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
                        claimed, requested, retry_in = self._record_and_claim(claim=True)
                        if requested:
                            next_poll = now + min(self.settings.poll_interval, retry_in)
                        throttled = retry_in != math.inf
                        if self.burst and not claimed and not self._running and not throttled:
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
                    deadlines.extend(r.deadline for r in self._running.values() if r.deadline)
                if stop_deadline is not None:
                    deadlines.append(stop_deadline)
                self._wake.wait(max(0.0, min(deadlines) - time.monotonic()))
        finally:
            self._threads.shutdown()
            connections[self.using].close()
            self.finished.set()

    def _record_and_claim(self, *, claim: bool) -> tuple[list[ClaimedJob], int, float]:
        """Write the finished attempts' outcomes and, with ``claim``, fill the free threads.

        One statement either way (RECORD_AND_CLAIM when there is both to do), or, for a queue
        with limits or fairness, the outcomes then a claim under the queue's lock. Returns the
        jobs claimed, how many were asked for, and how soon (seconds) a claim that a limit cut
        short should be tried again (``inf`` when no limit did).
        """
        batch: list[Outcome] = []
        while self._outcomes:
            batch.append(self._outcomes.popleft())
        # Attempts whose outcome is in this batch no longer hold a thread.
        finishing = {(o.job.id, o.job.attempt) for o in batch if not o.timed_out}
        busy = len(self._running.keys() - finishing)
        limit = self.concurrency - busy if claim else 0
        if not batch and limit <= 0:
            return [], 0, math.inf
        outcome_params: list[Any] = [
            [o.job.id for o in batch],
            [o.job.attempt for o in batch],
            ["snoozed" if o.snoozed else o.status.value for o in batch],
            [o.delay for o in batch],
            [o.code for o in batch],
            [o.summary for o in batch],
            [o.result_json for o in batch],
            self.worker_id,
        ]
        special = self.settings.fair or self.settings.limited
        claim_params: list[Any] = [self.queue, limit, self.worker_id, self.lease_seconds]
        applied: set[uuid.UUID] = set()
        rows: list[tuple[Any, ...]] = []
        retry_in = math.inf
        started = time.perf_counter()
        try:
            with connections[self.using].cursor() as cursor:
                if batch and limit > 0 and not special:
                    cursor.execute(queries.RECORD_AND_CLAIM, outcome_params + claim_params)
                    for is_claim, *row in cursor.fetchall():
                        if is_claim:
                            rows.append(tuple(row))
                        else:
                            applied.add(row[0])
                else:
                    if batch:
                        cursor.execute(queries.RECORD_OUTCOMES, outcome_params)
                        applied = {row[0] for row in cursor.fetchall()}
                    if limit > 0 and special:
                        rows, retry_in = self._claim_limited(limit)
                    elif limit > 0:
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
        return self._start(rows), limit, retry_in

    def _claim_limited(self, limit: int) -> tuple[list[tuple[Any, ...]], float]:
        """The claim of a queue with FAIR, MAX_RUNNING or RATE_LIMIT; see ``queries``.

        Returns the claimed rows and, when a limit cut the claim short, how soon to try again.
        """
        conf = self.settings
        per_org = conf.limit_by == "organization"
        rate = conf.rate_limit
        burst = max(1.0, rate or 0.0)
        retry_in = math.inf
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            if conf.limited:
                cursor.execute(queries.CLAIM_LOCK, [self.queue])
            wanted = limit
            if conf.limited and not per_org:
                cursor.execute(queries.QUEUE_ALLOWANCE, [self.queue, rate, burst, self.queue])
                running, tokens = cursor.fetchone()
                if conf.max_running is not None:
                    limit = min(limit, conf.max_running - running)
                if rate is not None:
                    available = burst if tokens is None else float(tokens)
                    limit = min(limit, math.floor(available))
                    if limit < wanted:
                        retry_in = min(RATE_LIMIT_RETRY_CAP, (1 - available % 1) / rate)
                if limit <= 0:
                    return [], min(retry_in, conf.poll_interval)
            if conf.fair or per_org:
                cursor.execute(queries.FAIR_PLAN)
                cursor.execute(
                    queries.FAIR_CLAIM if conf.fair else queries.ORGANIZATION_LIMITED_CLAIM,
                    {
                        "queue": self.queue,
                        "limit": limit,
                        "worker_id": self.worker_id,
                        "lease": self.lease_seconds,
                        "max_running": conf.max_running if per_org else None,
                        "rate": rate if per_org else None,
                        "burst": burst if per_org else None,
                    },
                )
            else:
                cursor.execute(
                    queries.CLAIM_JOBS, [self.queue, limit, self.worker_id, self.lease_seconds]
                )
            rows = cursor.fetchall()
            if rate is not None and rows:
                counts: dict[str, int] = {}
                for row in rows:
                    key = self.queue
                    if per_org:
                        key = f"{self.queue}/{row[5] or 'none'}"
                    counts[key] = counts.get(key, 0) + 1
                cursor.execute(
                    queries.TAKE_TOKENS,
                    [burst, list(counts), list(counts.values()), rate, burst, burst],
                )
            if per_org and rate is not None and len(rows) < wanted:
                # Some organization may be out of tokens: look again when one may have refilled.
                retry_in = min(RATE_LIMIT_RETRY_CAP, 1 / rate)
        return rows, retry_in

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
        now = time.monotonic()
        for job in claimed:
            definition = get_job(job.job_type)
            deadline = None
            if definition is not None and definition.timeout and definition.isolation == "thread":
                deadline = now + definition.timeout
            entry = _Running(job, deadline=deadline)
            self._running[(job.id, job.attempt)] = entry
            self._threads.submit(self._task(job, entry.cancel))
        return claimed

    def _task(self, job: ClaimedJob, cancel: threading.Event) -> Callable[[], None]:
        key = (job.id, job.attempt)

        def run() -> None:
            try:
                outcome = execute(
                    job,
                    policy=self.policy,
                    renew=lambda: self.renew(key),
                    cancel=cancel,
                    using=self.using,
                )
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
            key = (job.id, job.attempt)
            late = False
            if not outcome.timed_out:
                self._running.pop(key, None)
                if key in self._abandoned:
                    # The handler of an attempt failed for its timeout returned at last: its
                    # thread is free again, and the replacement started meanwhile can go.
                    self._abandoned.discard(key)
                    self._threads.retire_thread()
                    late = True
            if job.id in applied:
                metrics.JOB_OUTCOMES.inc(
                    queue=self.queue, job_type=job.job_type, outcome=outcome.status.value
                )
            else:
                metrics.STALE_OUTCOMES.inc(queue=self.queue)
                logger.warning(
                    "job %s attempt %d: outcome %s discarded, %s",
                    job.id,
                    job.attempt,
                    outcome.status.value,
                    "it came after the attempt's timeout" if late else "the lease was taken over",
                    extra={
                        "job_id": str(job.id),
                        "job_type": job.job_type,
                        "queue": self.queue,
                        "attempt": job.attempt,
                        "outcome": "stale",
                    },
                )

    def _expire_timeouts(self, now: float) -> None:
        """Fail the attempts that ran past their timeout; their handlers' threads are replaced."""
        for key, entry in list(self._running.items()):
            if entry.deadline is None or now < entry.deadline:
                continue
            job = entry.job
            definition = get_job(job.job_type)
            timeout = definition.timeout if definition is not None else None
            error = JobTimeout(
                f"attempt {job.attempt} ran longer than its timeout of {timeout:g}s; its thread "
                "was left running and its result will be discarded"
            )
            decision = decide(
                error, attempt=job.attempt, max_attempts=job.max_attempts, policy=self.policy
            )
            status = JobStatus.DEAD if decision.action.value == "dead" else JobStatus.RETRYING
            logger.error(
                "job %s (%s) attempt %d/%d: %s -> %s",
                job.id,
                job.job_type,
                job.attempt,
                job.max_attempts,
                decision.summary,
                status.value,
                extra={
                    "job_id": str(job.id),
                    "job_type": job.job_type,
                    "queue": self.queue,
                    "attempt": job.attempt,
                    "outcome": status.value,
                    "error_code": decision.code,
                },
            )
            del self._running[key]
            self._abandoned.add(key)
            self._threads.add_thread()
            self._outcomes.appendleft(
                Outcome(
                    job,
                    status,
                    delay=decision.delay,
                    code=decision.code,
                    summary=decision.summary,
                    timed_out=True,
                )
            )

    def _renew_leases(self) -> None:
        requests: list[_RenewalRequest] = []
        while self._renewals:
            requests.append(self._renewals.popleft())
        held: dict[uuid.UUID, bool] = {}  # job id -> cancellation requested
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
                    held = {job_id: bool(cancelled) for job_id, cancelled in cursor.fetchall()}
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
            elif held[entry.job.id] and not entry.cancel.is_set():
                entry.cancel.set()
                logger.info(
                    "job %s attempt %d: cancellation requested; told the handler",
                    entry.job.id,
                    entry.job.attempt,
                    extra={"job_id": str(entry.job.id), "queue": self.queue},
                )
        for request in requests:
            asked = self._running.get(request.key)
            request.held = asked is not None and not asked.lease_lost and request.key[0] in held
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
