"""One claimed attempt of an ``async def`` handler, awaited on its queue's event loop
(``worker.coroutines``): ``execute()``'s steps (``begin``, ``settle``, ``finish``), the
coroutine's cancellations told apart, and the hooks called off the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async

from django_pgoutbox import signals, tracing
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.context import CancelFlag, JobContext, ProgressNote
from django_pgoutbox.errors import Cancelled, JobTimeout
from django_pgoutbox.registry import JobDefinition
from django_pgoutbox.worker.execute import (
    Begun,
    ClaimedJob,
    Outcome,
    begin,
    finish,
    finished_hooks,
    settle,
    started_hooks,
    worker_failed,
)


async def execute_async(
    job: ClaimedJob,
    *,
    policy: RetrySettings,
    renew: Callable[[], None],
    cancel: CancelFlag | None = None,
    using: str = "default",
    report: Callable[[ProgressNote], None] | None = None,
) -> Outcome:
    """``execute()`` for an ``async def`` handler, awaited on the queue's event loop: the same
    steps before and after the call. Never raises; a cancellation of the coroutine (the job's
    ``cancel`` set, its timeout) becomes the attempt's outcome, as any other exception."""
    try:
        if tracing.enabled():  # its span, current while the coroutine runs
            attempt = partial(_execute_async, job, policy, renew, cancel, using, report)
            return await tracing.traced_attempt_async(job, attempt)
        return await _execute_async(job, policy, renew, cancel, using, report)
    except BaseException as error:
        return worker_failed(job, error, policy)


async def _execute_async(
    job: ClaimedJob,
    policy: RetrySettings,
    renew: Callable[[], None],
    cancel: CancelFlag | None,
    using: str,
    report: Callable[[ProgressNote], None] | None,
) -> Outcome:
    begun = begin(job, renew, cancel, using, report, hooks=False)
    definition = begun.definition
    starts = bool(signals.job_started.receivers) or _off_loop_hook(definition, "on_started")
    if not starts and definition is not None and definition.on_started is not None:
        started_hooks(job, begun.sender, definition)  # safe on the loop, as the hook says
    if begun.refused is not None:
        if starts:
            await _off_loop(partial(started_hooks, job, begun.sender, definition))
        return await _finish_async(begun, begun.refused)
    assert definition is not None
    assert begun.ctx is not None
    returned: Any = None
    error: BaseException | None = None
    try:
        if starts:
            await _off_loop(partial(started_hooks, job, begun.sender, definition), reraise=True)
        returned = await definition(job.payload, begun.ctx)
    except BaseException as raised:
        error = raised
    if isinstance(error, asyncio.CancelledError) or (
        error is None and _cancel_requested(begun.ctx)
    ):
        error = _cancellation(begun.ctx, job, error)
    outcome = settle(begun, returned, error, policy, close_connections=False)
    return await _finish_async(begun, outcome)


async def _finish_async(begun: Begun, outcome: Outcome) -> Outcome:
    """``finish()``, its hooks called off the loop (``_off_loop``)."""
    if not (signals.job_finished.receivers or _off_loop_hook(begun.definition, "on_finished")):
        return finish(begun, outcome)  # its hook, if any, safe on the loop as it says
    duration = time.perf_counter() - begun.started
    await _off_loop(partial(finished_hooks, begun, outcome, duration))
    return finish(begun, outcome, hooks=False)


async def _off_loop(hooks: Callable[[], None], *, reraise: bool = False) -> None:
    """Call the job signals' receivers and the definition's hooks, plain functions as for a
    thread's attempt, where Django runs sync code that a coroutine calls (``sync_to_async``,
    thread-sensitive): on the loop's thread the ORM in them raised SynchronousOnlyOperation.
    They run to their end even if the coroutine is cancelled meanwhile; that cancellation is
    raised after them if ``reraise``, else dropped (the outcome is decided)."""
    call = asyncio.Task(sync_to_async(hooks)())
    cancelled: asyncio.CancelledError | None = None
    while not call.done():
        try:
            await asyncio.shield(call)
        except asyncio.CancelledError as error:
            cancelled = error
    if cancelled is not None and reraise:
        raise cancelled


def _cancel_requested(ctx: JobContext) -> bool:
    """The job's cancellation was requested and its coroutine cancelled, which returned anyway
    (it swallowed the ``CancelledError``): the outcome is the cancellation's all the same."""
    task = asyncio.current_task()
    return ctx.cancelled and task is not None and task.cancelling() > 0


def _cancellation(ctx: JobContext, job: ClaimedJob, error: BaseException | None) -> BaseException:
    """The error of a cancelled coroutine: ``Cancelled`` when the job's cancellation was
    requested, the timeout's when the event loop cancelled it at its timeout (the coordinator
    has written that outcome already), else the ``CancelledError`` itself: the coroutine
    cancelled itself, or awaited a task cancelled by someone else, and failed with it."""
    if ctx.cancelled:
        return Cancelled(f"job {job.id} was cancelled while it ran; its coroutine was cancelled")
    if error is None or TIMEOUT_CANCEL in error.args:
        return JobTimeout(
            f"attempt {job.attempt} ran past its timeout; its coroutine was cancelled"
        )
    return error


#: The message of the event loop's cancellation of a coroutine at its timeout
#: (``coroutines.EventLoop``): any other ``CancelledError`` is the handler's own failure.
TIMEOUT_CANCEL = "pgoutbox: the attempt ran past its timeout"


def _off_loop_hook(definition: JobDefinition | None, hook: str) -> bool:
    """Whether the definition's ``hook`` is to be called off the event loop now."""
    if definition is None or getattr(definition, hook) is None:
        return False
    return definition.hooks_off_loop is None or definition.hooks_off_loop()
