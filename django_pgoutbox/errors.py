"""Exceptions: the failure classes of the retry policy, and errors of bad input.

A handler raises one of the four failure classes to tell the retry policy what happened; any other
exception is *unknown* and gets a few retries before it is dead-lettered (see docs/retries.md).
"""

from __future__ import annotations

import math
from typing import Any

from django.db.transaction import TransactionManagementError

from django_pgoutbox.conf import MAX_DELAY_CEILING


class PgOutboxError(Exception):
    """Base class of every exception this app raises on its own."""


# -- failure classes a handler raises ------------------------------------------------------------


class JobFailure(Exception):
    """Base class of the failures that a handler raises to steer the retry policy.

    ``code`` is stored in ``jobs.last_error_code``; it defaults to the class name.
    """

    code: str | None = None

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class TransientError(JobFailure):
    """A network or service failure that may pass: retry with exponential backoff and jitter."""


def checked_delay(seconds: Any, what: str) -> float:
    """``seconds`` as a float cut to ``MAX_DELAY_CEILING``; ``TypeError`` unless a finite
    number >= 0. ``what`` names the argument in the error."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not seconds >= 0
        or (isinstance(seconds, float) and not math.isfinite(seconds))
    ):
        raise TypeError(f"{what} must be a finite number of seconds >= 0, not {seconds!r}")
    # min() before float(): an int too large for a float is cut, not an OverflowError.
    return float(min(seconds, MAX_DELAY_CEILING))


class RateLimited(JobFailure):
    """The other side asked us to slow down: retry after ``retry_after`` seconds (its hint).

    The hint must be a finite number >= 0 (else ``TypeError``); the retry policy cuts it to
    ``RETRY['MAX_DELAY']``.
    """

    def __init__(
        self, retry_after: float | None = None, message: str = "", *, code: str | None = None
    ) -> None:
        if retry_after is not None:
            retry_after = checked_delay(retry_after, "RateLimited(retry_after=...)")
        if not message:
            hint = "" if retry_after is None else f" (retry after {retry_after:g}s)"
            message = f"rate limited{hint}"
        super().__init__(message, code=code)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.retry_after, str(self)), self.__dict__)


class PermanentError(JobFailure):
    """The payload can never succeed (invalid, refers to nothing): dead-letter at once."""


class InvalidResult(PermanentError):
    """The handler returned a value that is not JSON; the attempt is dead-lettered.

    Retrying would repeat the handler's side effects and fail the same way.
    """

    code = "invalid_result"


class ResultTooLarge(InvalidResult):
    """The handler returned a value whose JSON is over ``PGOUTBOX['MAX_RESULT_BYTES']``; the
    attempt is dead-lettered, its result not stored."""

    code = "result_too_large"


class Revoked(JobFailure):
    """Authorization was withdrawn or the work was revoked: cancel safely, never retry."""


class Cancelled(Revoked):
    """Someone cancelled this running job (``cancel()``, the admin, ``pgoutbox cancel``).

    ``ctx.renew_lease()`` and ``ctx.raise_if_cancelled()`` raise it once the request is seen;
    letting it propagate ends the job ``cancelled``.
    """

    code = "cancelled"


class JobTimeout(TransientError):
    """The attempt ran past its job type's ``timeout``: retried with backoff, like a transient
    failure, until ``max_attempts``.

    Recorded by the worker, not raised in the handler's thread (a thread cannot be stopped from
    outside); in ``isolation="process"`` the handler's process is killed instead.
    """

    code = "timeout"


class Snooze(Exception):
    """Raise (or return) ``Snooze(seconds)`` to run again later without spending an attempt.

    The job goes back to ``retrying`` with ``run_at`` that far ahead and its ``attempts``
    unchanged, so ``max_attempts`` counts only real failures. ``seconds`` must be a finite
    number >= 0 (else ``TypeError``) and is cut to 365 days (``conf.MAX_DELAY_CEILING``).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = checked_delay(seconds, "Snooze(seconds)")
        super().__init__(f"snoozed for {self.seconds:g}s")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.seconds,))


# -- errors of bad input -------------------------------------------------------------------------


class InvalidInput(PgOutboxError, ValueError):
    """An argument was refused; ``field`` names it. Nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class EnqueueError(InvalidInput):
    """An enqueue was refused; ``field`` names the argument that was wrong."""


class InvalidProgress(InvalidInput):
    """``ctx.set_progress()`` or ``ctx.set_meta()`` was given a value that cannot be stored;
    ``field`` names the argument. Raised in the handler, at the call: nothing of it is kept."""


class UnknownJobTypeWarning(UserWarning):
    """``enqueue()`` of a job type that no ``@job`` of this process declares, and that
    ``PGOUTBOX["REMOTE_JOB_TYPES"]`` does not list: a misspelt name, or a handler that lives in
    another service. The job is written; a worker without the handler dead-letters it as
    ``unknown_job_type``. ``PGOUTBOX["STRICT_JOB_TYPES"] = True`` refuses it instead."""


class PublishError(InvalidInput):
    """A publish was refused; ``field`` names the argument that was wrong."""


class InboxError(InvalidInput):
    """``accept_message()`` was refused; ``field`` names the argument that was wrong."""


class InboxAutocommitWarning(UserWarning):
    """``accept_message()`` ran outside a transaction (autocommit): the message is recorded,
    and committed, at once. Nothing then undoes the record if handling the message fails, and
    the sender's redelivery is refused as a duplicate: the message is handled at most once.
    Call it inside ``transaction.atomic()`` with the work the message asks for."""


class JobRegistrationError(PgOutboxError, TypeError):
    """A ``@job`` declaration is wrong (bad name, queue or handler signature, duplicate name)."""


class SubscriberRegistrationError(PgOutboxError, TypeError):
    """A ``@subscriber`` declaration is wrong (no event type, bad versions or signature)."""


class LeaseLost(PgOutboxError):
    """This attempt's lease expired and may have been taken over: its outcome will be discarded.

    Raised by ``ctx.renew_lease()``. A handler that sees it should stop; another worker may
    already be running the job.
    """


# -- waiting for a job's result (``Job.wait()``, ``Job.await_result()``) ---------------------------


class JobNotCompleted(PgOutboxError):
    """A job that was waited for ended without completing: ``JobFailed`` or ``JobCancelled``.

    ``job`` is the job as its row was read when the wait ended; ``code`` and ``summary`` are its
    ``last_error_code`` and ``last_error_summary``.
    """

    status = ""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.job_id = job.id
        self.code: str | None = job.last_error_code
        self.summary: str | None = job.last_error_summary
        detail = f" ({self.code}: {self.summary})" if self.code else ""
        super().__init__(f"job {job.id} ({job.job_type}) ended {self.status}{detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job,))


class JobFailed(JobNotCompleted):
    """The job waited for is ``dead``: its attempts are spent, or it failed permanently.

    Raised at once, although an operator may retry the dead letter later: a later wait then
    waits for the new attempts.
    """

    status = "dead"


class JobCancelled(JobNotCompleted):
    """The job waited for is ``cancelled`` (``cancel()``, the admin, or a workflow step whose
    parent failed, code ``upstream_failed``)."""

    status = "cancelled"


class WaitTimeout(PgOutboxError, TimeoutError):
    """The job waited for had not finished when the wait's ``timeout`` ran out; ``job`` is the
    job as its row was last read (its ``status`` says where it was)."""

    def __init__(self, job: Any, timeout: float) -> None:
        self.job = job
        self.timeout = timeout
        super().__init__(f"job {job.id} was still {job.status} after {timeout:g}s")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job, self.timeout))


class WaitInTransaction(PgOutboxError, TransactionManagementError):
    """``wait()`` inside ``transaction.atomic()`` of the job's database, for a job that has not
    finished: a job enqueued in that transaction cannot run before it commits, and any other
    wait would hold the transaction open. Wait after the commit (``transaction.on_commit``)."""
