"""Hostile ``async def`` handlers on a queue's real event loop (``worker.coroutines``) with the
real attempt runner, no database: what one coroutine does to the loop must not take the
innocents beside it down, and every attempt ends in a named outcome."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_pgoutbox import JobContext, job, signals
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import JobRegistrationError
from django_pgoutbox.models import JobStatus
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.coroutines import Coroutines
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.handlers import AttemptRunner
from django_pgoutbox.worker.mailbox import ENDED, Mailbox
from tests.unit.fakes import claim_row

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)
INNOCENT = "tests.hostile_innocent"


@pytest.fixture
def innocent(registry: None) -> None:
    @job(INNOCENT)
    async def innocent(payload: dict[str, Any], ctx: JobContext) -> Any:
        await asyncio.sleep(0.05)
        await asyncio.to_thread(lambda: None)
        return {"ok": True}


def _attempt(job_type: str) -> Attempt:
    return Attempt(claim_row()._replace(job_type=job_type))


def _run(
    hostile: Callable[..., Any], *, innocents: int = 5, capacity: int = 10, then: int = 3
) -> tuple[Outcome, list[Outcome], list[Outcome]]:
    """The hostile attempt beside ``innocents`` in one batch, then ``then`` more innocents
    once they all ended: every outcome, the hostile's first."""
    job("tests.hostile")(hostile)
    mailbox = Mailbox()
    runner = AttemptRunner(
        queue="default", policy=POLICY, using="default", mailbox=mailbox, renew=lambda key: None
    )
    coroutines = Coroutines("default", capacity, runner.run_async, mailbox, lease_seconds=60)
    try:
        bad = _attempt("tests.hostile")
        batch = [bad] + [_attempt(INNOCENT) for _ in range(innocents)]
        outcomes = _ended(coroutines, mailbox, batch)
        later = [_attempt(INNOCENT) for _ in range(then)]
        after = _ended(coroutines, mailbox, later)
        return outcomes[bad.id], [outcomes[a.id] for a in batch[1:]], list(after.values())
    finally:
        coroutines.shutdown()


def _ended(coroutines: Coroutines, mailbox: Mailbox, attempts: list[Attempt]) -> dict[Any, Any]:
    for attempt in attempts:
        coroutines.submit(attempt, time.monotonic())
    coroutines.flush()
    found: dict[Any, Any] = {}
    deadline = time.monotonic() + 5
    while len(found) < len(attempts):
        assert time.monotonic() < deadline, f"{len(found)} of {len(attempts)} ended"
        for message in mailbox.wait(0.05):
            if message[0] == ENDED:
                assert message[3] is not None, "an attempt ended with no outcome"
                found[message[2].id] = message[3]
    return found


def _all_completed(outcomes: list[Outcome]) -> None:
    assert [o.status for o in outcomes] == [JobStatus.COMPLETED] * len(outcomes)


def test_a_handler_that_stops_the_loop(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        asyncio.get_running_loop().stop()
        await asyncio.sleep(0.01)
        return {"stopped": True}

    bad, innocents, after = _run(hostile)
    assert bad.status == JobStatus.COMPLETED
    _all_completed(innocents + after)


@pytest.mark.parametrize("how", ["run", "run_until_complete", "new_loop"])
def test_a_handler_that_runs_a_loop_of_its_own(innocent: None, how: str) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        if how == "run":
            return asyncio.run(asyncio.sleep(0))
        if how == "run_until_complete":
            return asyncio.get_event_loop().run_until_complete(asyncio.sleep(0))
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(asyncio.sleep(0))
        finally:
            loop.close()

    bad, innocents, after = _run(hostile)
    assert bad.status in (JobStatus.RETRYING, JobStatus.COMPLETED)
    _all_completed(innocents + after)


def test_a_handler_that_unsets_the_event_loop(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        asyncio.set_event_loop(None)
        return None

    bad, innocents, after = _run(hostile)
    assert bad.status == JobStatus.COMPLETED
    _all_completed(innocents + after)


def test_a_handler_that_sets_the_exception_handler(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: 1 / 0)

        async def fails() -> None:
            raise ValueError("later")

        ctx.tasks = [loop.create_task(fails())]  # type: ignore[attr-defined]
        return None

    bad, innocents, after = _run(hostile)
    _all_completed([bad, *innocents, *after])


def test_a_handler_that_sets_a_task_factory(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        def factory(loop: Any, coro: Any, **kwargs: Any) -> Any:
            coro.close()
            raise RuntimeError("no tasks here")

        asyncio.get_running_loop().set_task_factory(factory)
        return None

    _, innocents, after = _run(hostile)
    _all_completed(innocents + after)


def test_a_handler_that_shuts_the_default_executor_down(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        await asyncio.get_running_loop().shutdown_default_executor()
        return None

    bad, innocents, after = _run(hostile)
    assert (bad.status, bad.code) == (JobStatus.RETRYING, "RuntimeError")
    _all_completed(innocents + after)


def test_a_handler_that_cancels_itself(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)

    bad, innocents, after = _run(hostile)
    assert (bad.status, bad.code) == (JobStatus.RETRYING, "CancelledError")
    _all_completed(innocents + after)


def test_a_handler_that_leaves_tasks_behind(innocent: None) -> None:
    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        async def forever() -> None:
            while True:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(10)

        ctx.tasks = [asyncio.get_running_loop().create_task(forever())]  # type: ignore[attr-defined]
        return None

    started = time.monotonic()
    bad, innocents, after = _run(hostile)
    _all_completed([bad, *innocents, *after])
    assert time.monotonic() - started < 3


class _Fetcher:
    async def __call__(self, payload: dict[str, Any], ctx: JobContext) -> Any:
        await asyncio.sleep(0)
        return {"thread": threading.current_thread().name}


def test_an_instance_with_an_async_call_runs_on_the_loop(innocent: None) -> None:
    """A class instance whose ``__call__`` is ``async def`` is an async handler: on the loop,
    not on a handler thread with a fresh event loop of its own for each attempt."""
    definition = job("tests.hostile_instance")(_Fetcher())
    assert definition.on_loop
    bad, innocents, after = _run(_Fetcher())
    _all_completed([bad, *innocents, *after])
    assert bad.result_json is not None
    assert "-loop-" in bad.result_json


def test_an_async_generator_is_refused_at_its_declaration(registry: None) -> None:
    async def generates(payload: dict[str, Any], ctx: JobContext) -> Any:
        yield 1

    with pytest.raises(JobRegistrationError, match="async generator"):
        job("tests.hostile_generator")(generates)


def test_each_coroutines_span_is_current_in_it_alone(innocent: None, traces: Any) -> None:
    """Coroutines interleaved on one loop: each sees its own attempt's span, the loop's own
    callbacks none, and a job_finished receiver (run off the loop) the attempt's."""
    from opentelemetry import trace

    seen: dict[str, list[Any]] = {}

    def current_job() -> Any:
        span = trace.get_current_span()
        attributes = getattr(span, "attributes", None) or {}
        return attributes.get("messaging.message.id")

    async def hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
        mine = seen.setdefault(str(ctx.job_id), [])
        for _ in range(5):
            mine.append(current_job())
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        outside: list[Any] = []
        loop.call_soon(lambda: outside.append(current_job()))
        await asyncio.sleep(0.01)
        mine.append(("callback", outside[0]))
        return None

    def finished(sender: Any, job: Any, **kwargs: Any) -> None:
        seen.setdefault(str(job.id), []).append(("receiver", current_job()))

    job("tests.hostile")(hostile)
    mailbox = Mailbox()
    runner = AttemptRunner(
        queue="default", policy=POLICY, using="default", mailbox=mailbox, renew=lambda key: None
    )
    coroutines = Coroutines("default", 10, runner.run_async, mailbox, lease_seconds=60)
    signals.job_finished.connect(finished, dispatch_uid="test_async_hostile.span")
    try:
        outcomes = _ended(coroutines, mailbox, [_attempt("tests.hostile") for _ in range(4)])
    finally:
        signals.job_finished.disconnect(dispatch_uid="test_async_hostile.span")
        coroutines.shutdown()
    _all_completed(list(outcomes.values()))
    assert len(traces.get_finished_spans()) == 4
    for outcome in outcomes.values():
        job_id = str(outcome.job.id)
        values = seen[job_id]
        assert values[:5] == [job_id] * 5
        assert ("callback", job_id) in values  # call_soon copies the current context
        assert ("receiver", job_id) in values


def test_renew_lease_from_a_coroutine_waits_less_than_the_loop_may_go_unheard() -> None:
    """``ctx.renew_lease()`` called in a coroutine waits on the loop's thread: an answer
    slower than the loop may go unheard would leave the loop, and every coroutine on it,
    behind. It gives up (TimeoutError) at half that; on a thread it waits the lease."""
    from tests.unit.fakes import Harness

    harness = Harness(lease_seconds=3.0)
    assert harness.runner._coroutines.stall_after == 1.0

    async def renew() -> None:
        harness.runner.renew((claim_row().id, 1))

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(renew())
    assert time.monotonic() - started < 0.9
