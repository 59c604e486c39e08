"""``async def`` handlers through ``execute()`` and ``execute_async()``, no database: the same
steps around the call as a plain handler, and every path ends in an outcome."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from django_pgoutbox import JobContext, Snooze, job, signals
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import JobRegistrationError
from django_pgoutbox.models import JobStatus
from django_pgoutbox.worker.execute import Outcome, execute
from django_pgoutbox.worker.execute_async import TIMEOUT_CANCEL, execute_async
from tests.conftest import claimed_job

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)


@pytest.fixture
def coroutines(registry: None) -> None:
    async def returns(payload: dict[str, Any], ctx: JobContext) -> Any:
        await asyncio.sleep(0)
        return {"attempt": ctx.attempt, "payload": payload}

    async def snoozes(payload: dict[str, Any], ctx: JobContext) -> Any:
        raise Snooze(5)

    async def exits(payload: dict[str, Any], ctx: JobContext) -> Any:
        raise SystemExit(1)

    async def not_json(payload: dict[str, Any], ctx: JobContext) -> Any:
        return {1, 2}

    async def waits(payload: dict[str, Any], ctx: JobContext) -> Any:
        await asyncio.sleep(10)

    async def swallows(payload: dict[str, Any], ctx: JobContext) -> Any:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return {"swallowed": True}

    for name, func in [
        ("returns", returns),
        ("snoozes", snoozes),
        ("exits", exits),
        ("not_json", not_json),
        ("waits", waits),
        ("swallows", swallows),
    ]:
        job(f"tests.unit_async_{name}")(func)


def run(job_type: str) -> Outcome:
    return execute(claimed_job(job_type, payload={"n": 1}), policy=POLICY, renew=lambda: None)


def run_async(
    job_type: str, *, cancel_after: float | None = None, flag: bool = False, message: str = ""
) -> Outcome:
    from django_pgoutbox.context import CancelFlag

    cancel = CancelFlag()

    async def main() -> Outcome:
        task = asyncio.ensure_future(
            execute_async(
                claimed_job(job_type, payload={"n": 1}),
                policy=POLICY,
                renew=lambda: None,
                cancel=cancel,
            )
        )
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            if flag:
                cancel.set()
            task.cancel(message or None)
        return await task

    return asyncio.run(main())


class TestOnAThread:
    """``execute()`` of an async definition, as ``django_pgoutbox.testing`` calls it."""

    def test_the_coroutine_runs_to_its_result(self, coroutines: None) -> None:
        outcome = run("tests.unit_async_returns")
        assert outcome.status == JobStatus.COMPLETED
        assert outcome.result_json == '{"attempt":1,"payload":{"n":1}}'

    def test_snooze_and_system_exit_are_outcomes(self, coroutines: None) -> None:
        snoozed = run("tests.unit_async_snoozes")
        assert (snoozed.status, snoozed.code, snoozed.delay) == (JobStatus.RETRYING, "snoozed", 5)
        exited = run("tests.unit_async_exits")
        assert (exited.status, exited.code) == (JobStatus.RETRYING, "SystemExit")

    def test_a_result_that_is_not_json(self, coroutines: None) -> None:
        outcome = run("tests.unit_async_not_json")
        assert (outcome.status, outcome.code) == (JobStatus.DEAD, "invalid_result")


class TestOnALoop:
    def test_the_same_outcome_and_signals_as_on_a_thread(self, coroutines: None) -> None:
        seen: list[str] = []

        def started(**kwargs: Any) -> None:
            seen.append("started")

        def finished(**kwargs: Any) -> None:
            seen.append(kwargs["outcome"])

        signals.job_started.connect(started, dispatch_uid="test_execute_async.started")
        signals.job_finished.connect(finished, dispatch_uid="test_execute_async.finished")
        try:
            outcome = run_async("tests.unit_async_returns")
        finally:
            signals.job_started.disconnect(dispatch_uid="test_execute_async.started")
            signals.job_finished.disconnect(dispatch_uid="test_execute_async.finished")
        assert outcome.status == JobStatus.COMPLETED
        assert seen == ["started", "completed"]

    def test_a_cancellation_requested_is_cancelled(self, coroutines: None) -> None:
        outcome = run_async("tests.unit_async_waits", cancel_after=0.01, flag=True)
        assert (outcome.status, outcome.code) == (JobStatus.CANCELLED, "cancelled")

    def test_a_swallowed_cancellation_is_cancelled_all_the_same(self, coroutines: None) -> None:
        outcome = run_async("tests.unit_async_swallows", cancel_after=0.01, flag=True)
        assert (outcome.status, outcome.code) == (JobStatus.CANCELLED, "cancelled")

    def test_a_timeout_cancellation_is_the_timeouts(self, coroutines: None) -> None:
        outcome = run_async("tests.unit_async_waits", cancel_after=0.01, message=TIMEOUT_CANCEL)
        assert outcome.code == "timeout"

    def test_another_cancellation_is_the_handlers_failure(self, coroutines: None) -> None:
        outcome = run_async("tests.unit_async_waits", cancel_after=0.01)
        assert (outcome.status, outcome.code) == (JobStatus.RETRYING, "CancelledError")

    def test_receivers_run_off_the_loop_and_a_cancellation_meanwhile(
        self, coroutines: None
    ) -> None:
        """Plain receivers run where Django runs sync code for a coroutine (not on the loop's
        thread); a cancellation while ``job_finished``'s run leaves the decided outcome, one
        while ``job_started``'s run is the attempt's, its handler not called."""
        threads: list[str] = []

        def slow(**kwargs: Any) -> None:
            threads.append(threading.current_thread().name)
            time.sleep(0.2)

        signals.job_finished.connect(slow, dispatch_uid="test_execute_async.slow")
        try:
            outcome = run_async("tests.unit_async_returns", cancel_after=0.05, flag=True)
        finally:
            signals.job_finished.disconnect(dispatch_uid="test_execute_async.slow")
        assert outcome.status == JobStatus.COMPLETED
        assert threads
        assert threads[0] != threading.current_thread().name
        signals.job_started.connect(slow, dispatch_uid="test_execute_async.slow")
        try:
            outcome = run_async("tests.unit_async_returns", cancel_after=0.05, flag=True)
        finally:
            signals.job_started.disconnect(dispatch_uid="test_execute_async.slow")
        assert (outcome.status, outcome.code) == (JobStatus.CANCELLED, "cancelled")
        assert outcome.result_json is None

    def test_system_exit_is_an_outcome(self, coroutines: None) -> None:
        outcome = run_async("tests.unit_async_exits")
        assert (outcome.status, outcome.code) == (JobStatus.RETRYING, "SystemExit")


def test_process_isolation_of_an_async_handler_is_refused(registry: None) -> None:
    async def handler(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    with pytest.raises(JobRegistrationError, match="isolation='process'"):
        job("tests.unit_async_isolated", isolation="process")(handler)


def test_an_async_handler_runs_on_the_loop_a_sync_one_does_not(registry: None) -> None:
    async def coroutine(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    def function(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    assert job("tests.unit_async_on_loop")(coroutine).on_loop
    assert not job("tests.unit_sync_on_loop")(function).on_loop
