"""A queue's handler threads: each takes a claimed attempt, runs it, and posts what finished.

A handler thread touches nothing of its queue's state: it reads the attempt's claim row, posts
``(STARTED, attempt, deadline)`` when a timeout starts to run, ``(PROGRESS, note)`` at
the handler's first ``ctx.set_progress()`` or ``ctx.set_meta()``, then ``(FINISHED, attempt,
outcome)``; or ``(LOST, attempt, thread_died)`` on the last-resort path where no outcome came.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections.abc import Callable
from typing import Protocol

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.failures import failure_outcome
from django_pgoutbox.models import JobStatus
from django_pgoutbox.registry import get_job
from django_pgoutbox.retry import Kind, bound, summarize
from django_pgoutbox.worker.attempt import Attempt, Key
from django_pgoutbox.worker.execute import ClaimedJob, Outcome, execute
from django_pgoutbox.worker.execute_async import execute_async
from django_pgoutbox.worker.mailbox import FINISHED, LOST, PROGRESS, STARTED, Mailbox

logger = logging.getLogger("django_pgoutbox.worker")

#: Error codes of the outcomes that the worker writes when it cannot write the attempt's own
#: (docs/workers.md, "When the worker itself fails").
WORKER_ERROR = "worker_error"
UNREADABLE_JOB = "unreadable_job"


def cancelled_unstarted(job: ClaimedJob) -> Outcome:
    """The outcome of an attempt whose cancellation was requested before its handler started."""
    return Outcome(
        job, JobStatus.CANCELLED, code="cancelled", summary="cancelled before its handler started"
    )


class Handlers(Protocol):
    """What a coordinator asks of its handler threads (``HandlerThreads``, or a test's fake)."""

    run: Callable[[Attempt], Outcome | None]

    def start(self) -> None: ...
    def submit(self, attempt: Attempt) -> None: ...
    def take_waiting(self) -> list[Attempt]: ...
    def add_thread(self) -> None: ...
    def retire_thread(self) -> None: ...
    def shutdown(self) -> None: ...


class HandlerThreads:
    """A set of daemon threads running handlers, fed by a queue of claimed attempts.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not hold the process open at exit: once
    the grace period is over and the unfinished jobs are released, a hung handler must not keep
    the worker alive. ``run`` turns an attempt into its outcome (``AttemptRunner``); None means
    it left the attempt without one.
    """

    def __init__(
        self, size: int, name: str, run: Callable[[Attempt], Outcome | None], mailbox: Mailbox
    ) -> None:
        self._name = name
        self.run = run
        self._mailbox = mailbox
        self._tasks: queue_module.SimpleQueue[Attempt | None] = queue_module.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True)
            for index in range(size)
        ]
        self._added = 0  # threads added since, each named by its number

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def submit(self, attempt: Attempt) -> None:
        self._tasks.put(attempt)

    def take_waiting(self) -> list[Attempt]:
        """Take back the attempts that no thread has started (at shutdown)."""
        taken: list[Attempt] = []
        retirements = 0
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue_module.Empty:
                break
            if item is None:
                retirements += 1
            else:
                taken.append(item)
        for _ in range(retirements):
            self._tasks.put(None)
        return taken

    def add_thread(self) -> None:
        """Start one more thread: in place of one that a timed-out handler still occupies, or
        one more of a queue resized at run time. The threads that ended (retired) are forgotten
        here, so that a queue resized up and down a thousand times keeps no thousand of them."""
        self._added += 1
        thread = threading.Thread(
            target=self._work, name=f"{self._name}+{self._added}", daemon=True
        )
        self._threads = [known for known in self._threads if known.is_alive()]
        self._threads.append(thread)
        thread.start()

    def retire_thread(self) -> None:
        """Let one idle thread end: a timed-out handler returned, its thread is free again."""
        self._tasks.put(None)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)

    def _work(self) -> None:
        attempt: Attempt | None = None
        retired = False
        tasks, post = self._tasks, self._mailbox.post
        try:
            while (attempt := tasks.get()) is not None:
                outcome: Outcome | None = None
                try:
                    outcome = self.run(attempt)
                except BaseException:
                    logger.exception("%s: running a job failed in the worker", self._name)
                if outcome is None:
                    post((LOST, attempt, False))
                else:
                    # Wake the coordinator now only if the threads run short of work: else it
                    # lets outcomes gather for one statement.
                    post((FINISHED, attempt, outcome), urgent=tasks.qsize() < attempt.low_water)
                attempt = None
            retired = True
        finally:
            if not retired:  # the thread dies: the coordinator starts another in its place
                post((LOST, attempt, True))


class AttemptRunner:
    """What a handler thread does with one attempt: every path ends in an outcome."""

    def __init__(
        self,
        *,
        queue: str,
        policy: RetrySettings,
        using: str,
        mailbox: Mailbox,
        renew: Callable[[Key], None],
    ) -> None:
        self.queue = queue
        self.policy = policy
        self.using = using
        self._mailbox = mailbox
        self._renew = renew
        post = mailbox.post
        # Once an attempt, at its first ctx.set_progress() or ctx.set_meta(): quiet, the
        # coordinator reads the note when it next writes progress. Made once, not per attempt.
        self._report = lambda note: post((PROGRESS, note), urgent=False)

    def __call__(self, attempt: Attempt) -> Outcome:
        """Run ``attempt``; should that fail in the worker itself (its row cannot be read,
        ``execute()`` raised), the outcome says so (``worker_error``)."""
        try:
            return self._run(attempt)
        except BaseException as error:
            return self.worker_error(attempt, error)

    def _run(self, attempt: Attempt) -> Outcome:
        job = attempt.job()
        if attempt.cancel.is_set():
            return cancelled_unstarted(job)
        definition = get_job(job.job_type)
        if definition is not None and definition.timeout and definition.isolation == "thread":
            deadline = time.monotonic() + definition.timeout
            self._mailbox.post((STARTED, attempt, deadline), urgent=False)
        return execute(
            job,
            policy=self.policy,
            renew=lambda: self._renew(attempt.key),
            cancel=attempt.cancel,
            using=self.using,
            report=self._report,
        )

    async def run_async(self, attempt: Attempt) -> Outcome:
        """``__call__`` for an ``async def`` handler, awaited on the queue's event loop."""
        try:
            job = attempt.job()
            if attempt.cancel.is_set():
                return cancelled_unstarted(job)
            self._start_clock(attempt, job.job_type)
            return await execute_async(
                job,
                policy=self.policy,
                renew=lambda: self._renew(attempt.key),
                cancel=attempt.cancel,
                using=self.using,
                report=self._report,
            )
        except BaseException as error:
            return self.worker_error(attempt, error)

    def _start_clock(self, attempt: Attempt, job_type: str) -> None:
        """Tell the coordinator when the attempt's timeout starts to run, if it has one."""
        definition = get_job(job_type)
        if definition is not None and definition.timeout and definition.isolation == "thread":
            deadline = time.monotonic() + definition.timeout
            self._mailbox.post((STARTED, attempt, deadline), urgent=False)

    def worker_error(self, attempt: Attempt, error: BaseException) -> Outcome:
        """The outcome of an attempt that failed in the worker rather than in its handler,
        built without calling anything of the job's (nor the error's ``__str__`` unguarded).

        A row that cannot be turned into a job (a payload nested deeper than Python's parser
        goes, say) reads the same way at every attempt: dead at once, code ``unreadable_job``,
        its payload intact for an operator. Anything else is ``worker_error``, retried with
        the policy's backoff until the attempts run out.
        """
        try:
            job = attempt.job()
            code, kind, what = WORKER_ERROR, Kind.TRANSIENT, "failed to run this attempt"
        except BaseException:
            job = attempt.bare_job()
            code, kind, what = UNREADABLE_JOB, Kind.PERMANENT, "could not read this job"
        failed = failure_outcome(
            error,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            policy=self.policy,
            kind=kind,
            code=code,
            summary=bound(f"the worker {what} ({summarize(error)}); see the worker's log"),
        )
        status, summary = failed.status, failed.summary
        fields = {"job_id": str(job.id), "queue": self.queue, "error_code": code}
        try:
            logger.error(
                "job %s attempt %d: %s -> %s",
                job.id,
                job.attempt,
                summary,
                failed.verdict,
                exc_info=error,
                extra=fields,
            )
        except BaseException:  # a traceback that cannot be formatted (its __class__ raises)
            logger.error(
                "job %s attempt %d: %s -> %s (its traceback could not be formatted)",
                job.id,
                job.attempt,
                summary,
                failed.verdict,
                extra=fields,
            )
        return Outcome(job, status, delay=failed.delay, code=code, summary=summary)
