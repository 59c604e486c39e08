"""``execute(on_error=...)``, no database: the handler's exception, its traceback intact, for a
caller that asks (``django_pgoutbox.testing`` raises it again in a test); never a change to the
outcome, whatever the callback does."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from django_pgoutbox import JobContext, Snooze, job
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import InvalidResult
from django_pgoutbox.models import JobStatus
from django_pgoutbox.worker.execute import Outcome, execute
from tests.conftest import claimed_job

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)


@pytest.fixture
def handlers(registry: None) -> None:
    def fails(payload: dict[str, Any], ctx: JobContext) -> None:
        raise ValueError("the handler's own failure")

    def returns(payload: dict[str, Any], ctx: JobContext) -> Any:
        return payload.get("value", 1)

    def snoozes(payload: dict[str, Any], ctx: JobContext) -> None:
        raise Snooze(5)

    job("tests.on_error_fails")(fails)
    job("tests.on_error_returns")(returns)
    job("tests.on_error_snoozes")(snoozes)


def run(job_type: str, on_error: Any, **fields: Any) -> Outcome:
    return execute(
        claimed_job(job_type, **fields), policy=POLICY, renew=lambda: None, on_error=on_error
    )


def test_it_gets_what_the_handler_raised(handlers: None) -> None:
    seen: list[BaseException] = []
    outcome = run("tests.on_error_fails", seen.append)
    (error,) = seen
    assert isinstance(error, ValueError)
    assert error.__traceback__ is not None
    assert "fails" in [frame.name for frame in traceback.extract_tb(error.__traceback__)]
    assert (outcome.status, outcome.code) == (JobStatus.RETRYING, "ValueError")


def test_it_gets_the_invalid_result_of_what_the_handler_returned(handlers: None) -> None:
    seen: list[BaseException] = []
    outcome = run("tests.on_error_returns", seen.append, payload={"value": {1, 2}})
    assert isinstance(seen[0], InvalidResult)
    assert outcome.status == JobStatus.DEAD


def test_not_called_for_a_completion_nor_a_snooze(handlers: None) -> None:
    seen: list[BaseException] = []
    assert run("tests.on_error_returns", seen.append).status == JobStatus.COMPLETED
    assert run("tests.on_error_snoozes", seen.append).code == "snoozed"
    assert seen == []


@pytest.mark.parametrize("raised", [RuntimeError("the callback's"), SystemExit(3)])
def test_a_callback_that_raises_changes_nothing(handlers: None, raised: BaseException) -> None:
    def callback(error: BaseException) -> None:
        raise raised

    outcome = run("tests.on_error_fails", callback)
    assert (outcome.status, outcome.code) == (JobStatus.RETRYING, "ValueError")
