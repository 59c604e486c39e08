"""Run one claimed attempt outside any transaction and turn what happened into an outcome."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import MISSING, dataclass, fields, replace
from datetime import datetime
from functools import partial
from types import CoroutineType
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.db import close_old_connections
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from django_pgoutbox import metrics, signals, tracing
from django_pgoutbox.conf import RetrySettings, get_settings
from django_pgoutbox.context import CancelFlag, JobContext, ProgressNote
from django_pgoutbox.errors import (
    InvalidResult,
    JobFailure,
    ResultTooLarge,
    Snooze,
)
from django_pgoutbox.failures import FailureOutcome, failure_outcome
from django_pgoutbox.log import job_fields, job_logger
from django_pgoutbox.models import JobStatus
from django_pgoutbox.progress import Report, progress_json
from django_pgoutbox.registry import JobDefinition, get_job
from django_pgoutbox.retry import MAX_CODE_LENGTH, bound, clamp_delay, error_code, summarize
from django_pgoutbox.worker.isolated import run_isolated

logger = logging.getLogger("django_pgoutbox.worker")


@dataclass(frozen=True)
class ClaimedJob:
    """One leased attempt, as the claim returned it."""

    id: uuid.UUID
    job_type: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    organization_id: uuid.UUID | None
    queue: str
    priority: int
    created_at: datetime
    waited: float = 0.0  # seconds from run_at to the claim, by the database clock
    worker_ids: tuple[str, ...] | list[str] = ()  # the worker of each attempt, this one last
    #: The W3C context of the span that enqueued the job, JSON text (``tracing``), if any.
    trace_context: str | None = None

    @classmethod
    def from_claim(
        cls,
        id: uuid.UUID,
        job_type: str,
        payload: dict[str, Any],
        attempt: int,
        max_attempts: int,
        organization_id: uuid.UUID | None,
        queue: str,
        priority: int,
        created_at: datetime,
        waited: float,
        worker_ids: tuple[str, ...] | list[str],
        trace_context: str | None = None,
    ) -> ClaimedJob:
        """The job of a claim's row: the same object as calling the class (see ``_frozen``)."""
        return _frozen(
            cls,
            {
                "id": id,
                "job_type": job_type,
                "payload": payload,
                "attempt": attempt,
                "max_attempts": max_attempts,
                "organization_id": organization_id,
                "queue": queue,
                "priority": priority,
                "created_at": created_at,
                "waited": waited,
                "worker_ids": worker_ids,
                "trace_context": trace_context,
            },
        )


@dataclass(frozen=True)
class Outcome:
    """What to write for an attempt: the new status and, for a retry, when to try again."""

    job: ClaimedJob
    status: JobStatus
    delay: float = 0.0  # seconds until the retry, for 'retrying'
    code: str | None = None
    summary: str | None = None
    result_json: str | None = None
    #: The attempt is not counted: ``attempts`` goes down by one as it is written, so the next
    #: claim runs the same attempt number again (the handler raised ``Snooze``).
    gives_back_attempt: bool = False
    #: Written by the dispatcher because the attempt ran past its timeout; the handler's own
    #: outcome, if it ever comes, is then stale.
    timed_out: bool = False
    #: The last ``jobs.progress`` and ``jobs.meta`` the attempt set, as JSON text, written with
    #: the outcome (None: leave the column as it is).
    progress_json: str | None = None
    meta_json: str | None = None
    #: The span of a traced attempt that did not complete its job, JSON text written to
    #: ``jobs.trace_context`` for the next attempt's link (``tracing``); None if untraced.
    attempt_trace: str | None = None

    @classmethod
    def completed(cls, job: ClaimedJob, result_json: str | None = None) -> Outcome:
        """``Outcome(job, JobStatus.COMPLETED, result_json=...)`` (see ``_frozen``)."""
        return _frozen(cls, {**_OUTCOME_DEFAULTS, "job": job, "result_json": result_json})


#: Outcome's fields with a default, and COMPLETED: what ``Outcome.completed()`` starts from.
_OUTCOME_DEFAULTS: dict[str, Any] = {
    **{f.name: f.default for f in fields(Outcome) if f.default is not MISSING},
    "status": JobStatus.COMPLETED,
}

_T = TypeVar("_T")


def _frozen(cls: type[_T], values: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` with these field values, without ``__init__``.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; for every
    claimed job and its outcome that cost as much as the rest of making them, so the fields go
    straight into the instance's ``__dict__``. ``values`` must name every field.
    """
    instance = object.__new__(cls)
    instance.__dict__.update(values)
    return instance


_thread_state = threading.local()


@receiver(connection_created)
def _note_connection(sender: Any, **kwargs: Any) -> None:
    _thread_state.connected = True


class Begun:
    """An attempt whose handler is about to be called: what ``execute()`` and
    ``execute_async()`` share between the steps before the call and after it."""

    __slots__ = ("ctx", "definition", "job", "refused", "sender", "started")

    def __init__(
        self,
        job: ClaimedJob,
        definition: JobDefinition | None,
        sender: Any,
        refused: Outcome | None,
        ctx: JobContext | None,
    ) -> None:
        self.job = job
        self.definition = definition
        self.sender = sender
        #: The attempt's outcome without a call (no handler for its job type, an invalid task).
        self.refused = refused
        self.ctx = ctx
        self.started = time.perf_counter()


def execute(
    job: ClaimedJob,
    *,
    policy: RetrySettings,
    renew: Callable[[], None],
    cancel: CancelFlag | None = None,
    using: str = "default",
    report: Callable[[ProgressNote], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> Outcome:
    """Run the handler of ``job`` and decide its outcome, with its metrics and signals.

    ``cancel`` is set by the worker when the job's cancellation is requested (``ctx.cancelled``);
    ``report`` is called with the attempt's ``ProgressNote`` at its first ``ctx.set_progress()``
    or ``ctx.set_meta()`` (None: those write nothing until the outcome). ``on_error`` is called
    with what the handler raised (or the ``InvalidResult`` of what it returned), its traceback
    intact, before the outcome is decided: the outcome keeps only a code and a summary
    (``django_pgoutbox.testing`` raises it again in a test).
    An ``async def`` handler called here (on a thread with no event loop: a test's, a worker's
    fallback) runs to its end through ``async_to_sync``.
    Never raises: whatever the handler, its hooks or the receivers of the job signals do, the
    attempt ends with an outcome.
    """
    try:
        if tracing.enabled():  # its span, current while the handler runs (docs/observability.md)
            # partial, not a lambda: a closure would make every argument a cell, at every call
            attempt = partial(_execute, job, policy, renew, cancel, using, report, on_error)
            return tracing.traced_attempt(job, attempt)
        # _execute()'s steps inline: one call fewer on every untraced attempt
        begun = begin(job, renew, cancel, using, report)
        if begun.refused is not None:
            return finish(begun, begun.refused)
        returned, error = _call(begun)
        return finish(begun, settle(begun, returned, error, policy, True, on_error))
    except BaseException as error:  # a bug of this module: the guards below catch the rest
        return worker_failed(job, error, policy)


def _execute(
    job: ClaimedJob,
    policy: RetrySettings,
    renew: Callable[[], None],
    cancel: CancelFlag | None,
    using: str,
    report: Callable[[ProgressNote], None] | None,
    on_error: Callable[[BaseException], None] | None,
) -> Outcome:
    begun = begin(job, renew, cancel, using, report)
    if begun.refused is not None:
        return finish(begun, begun.refused)
    returned, error = _call(begun)
    return finish(begun, settle(begun, returned, error, policy, True, on_error))


def worker_failed(job: ClaimedJob, error: BaseException, policy: RetrySettings) -> Outcome:
    logger.exception(
        "job %s (%s) attempt %d: the worker failed around its handler",
        job.id,
        job.job_type,
        job.attempt,
        extra=job_fields(job),
    )
    return _failed(job, error, policy)


def begin(
    job: ClaimedJob,
    renew: Callable[[], None],
    cancel: CancelFlag | None,
    using: str,
    report: Callable[[ProgressNote], None] | None,
    *,
    hooks: bool = True,
) -> Begun:
    """Before the handler: its definition, the start's metrics, signal and hook (``hooks``
    False: the caller's to call, ``started_hooks``), its context."""
    definition, refused = _definition(job)
    metrics.JOB_START_DELAY.observe_key((job.queue,), max(job.waited, 0.0))
    sender = definition if definition is not None else signals.NO_HANDLER
    # Sent only where a receiver is connected: with none, send_robust() alone cost a tenth of
    # a no-op job's time in the worker.
    if hooks and (
        signals.job_started.receivers
        or (definition is not None and definition.on_started is not None)
    ):
        started_hooks(job, sender, definition)
    ctx = None
    if definition is None:
        refused = refused or _unknown_job_type(job)
    elif refused is None:
        ctx = JobContext(
            job_id=job.id,
            job_type=job.job_type,
            attempt=job.attempt,
            organization_id=job.organization_id,
            queue=job.queue,
            logger=job_logger(job),
            renew=renew,
            cancel=cancel or CancelFlag(),
            worker_ids=list(job.worker_ids),
            using=using,
            report=report,
        )
    return Begun(job, definition, sender, refused, ctx)


def started_hooks(job: ClaimedJob, sender: Any, definition: JobDefinition | None) -> None:
    """``job_started``'s receivers and the definition's ``on_started``."""
    if signals.job_started.receivers:
        _call_hook(signals.job_started.send_robust, sender=sender, job=job)
    if definition is not None and definition.on_started is not None:
        _call_hook(definition.on_started, job=job)


def finished_hooks(begun: Begun, outcome: Outcome, duration: float) -> None:
    """``job_finished``'s receivers and the definition's ``on_finished``."""
    job, definition = begun.job, begun.definition
    if signals.job_finished.receivers:
        _call_hook(
            signals.job_finished.send_robust,
            sender=begun.sender,
            job=job,
            outcome=outcome.status.value,
            duration=duration,
            detail=outcome,
        )
    if definition is not None and definition.on_finished is not None:
        _call_hook(
            definition.on_finished,
            job=job,
            outcome=outcome.status.value,
            duration=duration,
            detail=outcome,
        )


def finish(begun: Begun, outcome: Outcome, *, hooks: bool = True) -> Outcome:
    """After the outcome is decided: the duration's metric, the finish's signal and hook
    (``hooks`` False: the caller's to call, ``finished_hooks``)."""
    job, definition = begun.job, begun.definition
    duration = time.perf_counter() - begun.started
    metrics.JOB_DURATION.observe_key((job.queue, job.job_type, outcome.status.value), duration)
    if hooks and (
        signals.job_finished.receivers
        or (definition is not None and definition.on_finished is not None)
    ):
        finished_hooks(begun, outcome, duration)
    if outcome.status == JobStatus.COMPLETED and logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "job %s (%s) attempt %d completed in %.3fs",
            job.id,
            job.job_type,
            job.attempt,
            duration,
            extra={**job_fields(job), "outcome": "completed"},
        )
    return outcome


def _leave_forked_child(job: ClaimedJob) -> None:
    """The handler called ``os.fork()`` and this is the child, returning into the worker: it
    must not go on as a second worker with a copy of the first's state and its connections'
    sockets (an outcome written twice, a protocol stream broken, an orphan process). It leaves
    at once, with no cleanup that could write to those sockets, and says so on stderr (not
    through ``logging``, whose locks another thread of the parent may have held at the fork).
    """
    message = (
        f"job {job.id} ({job.job_type}) attempt {job.attempt}: its handler forked, and the "
        f"child (pid {os.getpid()}) returned into the worker; the child exits\n"
    )
    try:
        os.write(2, message.encode("utf-8", "replace"))
    finally:
        os._exit(70)  # EX_SOFTWARE


def log_failure(job: ClaimedJob, error: BaseException, failed: FailureOutcome) -> None:
    """One line per failed attempt: what failed, what becomes of the job and why.

    As Django logs a request: what the code chose (a ``JobFailure`` it raised: a retry, a dead
    letter, a cancellation) is one line; an unexpected exception that ends the job (a bug to
    fix) carries its traceback at ERROR. Every other traceback, for who needs to see where a
    failure was raised, is a record of its own at DEBUG. The table holds only the summary.
    """
    retrying = failed.status == JobStatus.RETRYING
    with_traceback = not retrying and not issubclass(type(error), JobFailure)
    record = {**job_fields(job), "outcome": failed.status.value, "error_code": failed.code}
    (logger.warning if retrying else logger.error)(
        "job %s (%s) attempt %d/%d: %s -> %s",
        job.id,
        job.job_type,
        job.attempt,
        job.max_attempts,
        failed.summary,
        failed.verdict,
        exc_info=error if with_traceback else None,
        extra=record,
    )
    if not with_traceback and logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "job %s (%s) attempt %d: the traceback of %s",
            job.id,
            job.job_type,
            job.attempt,
            failed.code,
            exc_info=error,
            extra=record,
        )


def _failed(job: ClaimedJob, error: BaseException, policy: RetrySettings) -> Outcome:
    """The outcome of an attempt that failed outside its handler, as the policy decides it."""
    try:
        failed = failure_outcome(
            error, attempt=job.attempt, max_attempts=job.max_attempts, policy=policy
        )
        return Outcome(
            job, failed.status, delay=failed.delay, code=failed.code, summary=failed.summary
        )
    except BaseException:
        return Outcome(
            job,
            JobStatus.DEAD,
            code="worker_error",
            summary="the worker failed around this attempt; see its log",
        )


def _call_hook(hook: Callable[..., Any], **arguments: Any) -> None:
    """A hook or a job signal, which must never fail the attempt.

    BaseException: these run on a handler thread, where no KeyboardInterrupt is delivered, and
    a ``SystemExit`` raised by a hook must not leave the attempt without an outcome.
    """
    try:
        hook(**arguments)
    except BaseException:
        logger.exception("job %s: the %s hook raised; ignored", arguments["job"].id, hook)


def _definition(job: ClaimedJob) -> tuple[JobDefinition | None, Outcome | None]:
    """The job's handler; or, for a job that names something it cannot run, its dead letter.

    A job that names no handler at all gets (None, None): ``_run`` dead-letters it as
    ``unknown_job_type``.
    """
    definition = get_job(job.job_type)
    if definition is not None:
        return definition, None
    try:
        return _task_definition(job.job_type, job.payload), None
    except Exception as error:
        code = error_code(error) if isinstance(error, JobFailure) else "invalid_task"
        summary = summarize(error)
        logger.error(
            "job %s (%s): %s; dead-lettered with its payload intact",
            job.id,
            job.job_type,
            summary,
            extra={**job_fields(job), "outcome": "dead", "error_code": code},
        )
        return None, Outcome(job, JobStatus.DEAD, code=code, summary=summary)


def _task_definition(job_type: str, payload: dict[str, Any]) -> JobDefinition | None:
    """The handler of a django.tasks task stored as this job, if it is one."""
    if not isinstance(payload.get("task"), dict):
        return None
    try:
        from django_pgoutbox.backend import task_definition
    except ImportError:  # neither django.tasks nor the django-tasks backport is installed
        return None
    return task_definition(job_type, payload)


def _unknown_job_type(job: ClaimedJob) -> Outcome:
    logger.error(
        "no handler for job type %r (job %s); dead-lettered with its payload intact",
        job.job_type,
        job.id,
        extra={**job_fields(job), "outcome": "dead"},
    )
    return Outcome(
        job,
        JobStatus.DEAD,
        code="unknown_job_type",
        summary=bound(
            f"no handler is registered for job type {job.job_type!r} in this worker; "
            "deploy it, then retry this dead letter"
        ),
    )


def _call(begun: Begun) -> tuple[Any, BaseException | None]:
    """Call the handler on this thread: what it returned, or what it raised."""
    job, definition, ctx = begun.job, begun.definition, begun.ctx
    assert definition is not None
    assert ctx is not None
    try:
        if definition.isolation == "process":
            returned = run_isolated(job, definition, ctx._cancel, ctx.using, ctx._adopt)
        else:
            pid = os.getpid()
            try:
                returned = definition(job.payload, ctx)
            finally:
                if os.getpid() != pid:
                    _leave_forked_child(job)
            if returned is not None and type(returned) is CoroutineType:
                returned = async_to_sync(_awaited)(returned)
    except BaseException as error:
        return None, error
    return returned, None


async def _awaited(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return await coroutine


def settle(
    begun: Begun,
    returned: Any,
    error: BaseException | None,
    policy: RetrySettings,
    close_connections: bool = True,
    on_error: Callable[[BaseException], None] | None = None,
) -> Outcome:
    """The outcome of the handler's call (what it returned, or raised), with the progress and
    metadata it set last; never raises. ``close_connections``: the thread's connections are
    checked after the attempt (not on an event loop, whose thread opens none)."""
    job, definition, ctx = begun.job, begun.definition, begun.ctx
    assert definition is not None
    assert ctx is not None
    try:
        if error is not None:
            raise error
        if isinstance(returned, Snooze):
            raise returned
        outcome = Outcome.completed(job, None if returned is None else _result_json(returned))
    except Snooze as snooze:
        # Snooze checked its seconds; a value changed since is clamped, never sent as is.
        seconds = clamp_delay(getattr(snooze, "seconds", None))
        logger.info(
            "job %s (%s) attempt %d: snoozed for %gs",
            job.id,
            job.job_type,
            job.attempt,
            seconds,
            extra={**job_fields(job), "outcome": "snoozed"},
        )
        outcome = Outcome(
            job,
            JobStatus.RETRYING,
            delay=seconds,
            code="snoozed",
            summary=f"snoozed for {seconds:g}s by attempt {job.attempt}",
            gives_back_attempt=True,
        )
    except BaseException as raised:
        tracing.record_failure(raised)
        if on_error is not None:
            _call_hook(lambda job, error: on_error(error), job=job, error=raised)
        failed = failure_outcome(
            raised, attempt=job.attempt, max_attempts=job.max_attempts, policy=policy
        )
        status = failed.status
        log_failure(job, raised, failed)
        code, summary = failed.code, failed.summary
        if definition.error_details is not None and not isinstance(raised, InvalidResult):
            code, summary = _error_details(definition, raised, job, code, summary)
        outcome = Outcome(job, status, delay=failed.delay, code=code, summary=summary)
    finally:
        # Once per attempt, after it: a connection the handler left broken, in a transaction,
        # or past CONN_MAX_AGE is closed before the thread's next job (as after a request).
        # Only in threads that ever opened one: looking costs more than a no-op job.
        if close_connections and getattr(_thread_state, "connected", False):
            try:
                close_old_connections()
            except Exception:
                logger.exception("job %s: closing its thread's connections failed", job.id)
    if ctx._progress is None and ctx._meta_json is None:  # the common case: nothing set
        return outcome
    return with_report(outcome, (ctx._progress, ctx._meta_json))


def with_report(outcome: Outcome, reported: Report) -> Outcome:
    """``outcome`` carrying the progress and metadata ``reported``, to write with it."""
    progress, meta_json = reported
    return replace(
        outcome,
        progress_json=None if progress is None else progress_json(progress),
        meta_json=meta_json,
    )


def _error_details(
    definition: JobDefinition, error: BaseException, job: ClaimedJob, code: str, summary: str
) -> tuple[str, str]:
    """The definition's own code and summary of ``error``, bounded; the policy's if it fails."""
    assert definition.error_details is not None
    try:
        details = definition.error_details(error)
        own_code, own_summary = details
        if not isinstance(own_code, str) or not isinstance(own_summary, str):
            raise TypeError(f"error_details returned {details!r}, not two strings")
        return bound(own_code, MAX_CODE_LENGTH), bound(own_summary)
    except Exception:
        logger.exception(
            "job %s: describing its error failed; the policy's summary is kept", job.id
        )
        return code, summary


#: A real NUL character in JSON text, as ``json.dumps`` writes it: ``\u0000`` whose backslash is
#: not itself escaped (an even number of backslashes before it). The six characters ``\u0000``
#: of a string are written ``\\u0000``, which jsonb stores; PostgreSQL refuses only a real NUL.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _result_json(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidResult(
            f"the handler returned {type(value).__name__}, which is not JSON: {error}"
        ) from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidResult("the handler's return value contains a NUL character (\\x00)")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidResult(
                "the handler's return value contains an unpaired surrogate"
            ) from None
    limit = get_settings().max_result_bytes
    if limit is not None and size > limit:
        raise ResultTooLarge(
            f"the handler returned {size:,} bytes of JSON, over the limit of {limit:,} bytes "
            "(PGOUTBOX['MAX_RESULT_BYTES']); the result is not stored"
        )
    return text
