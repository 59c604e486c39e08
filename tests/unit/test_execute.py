"""``execute()`` as a pure step, no database: every path of an attempt ends in an outcome."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_pgoutbox import JobContext, job, signals
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import InvalidResult, Snooze
from django_pgoutbox.models import JobStatus
from django_pgoutbox.worker.execute import Outcome, _result_json, execute
from tests.conftest import claimed_job

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)


def run(job_type: str) -> Outcome:
    return execute(claimed_job(job_type), policy=POLICY, renew=lambda: None)


class TestResultJson:
    """Only a real NUL is refused; the literal text ``\\u0000`` is valid JSON (case 8)."""

    @pytest.mark.parametrize(
        "value",
        [
            {"regex": "^[\\u0000-\\u001f]+$"},
            {"text": "\\\\u0000"},
            {"\\u0000 as a key": 1},
            ["ends with a backslash \\"],
        ],
    )
    def test_literal_text_passes(self, value: Any) -> None:
        import json

        assert json.loads(_result_json(value)) == value

    @pytest.mark.parametrize(
        "value",
        [
            {"text": "a\x00b"},
            {"a\x00": 1},
            {"text": "\\\x00"},
            {"text": "\\u0000 then \x00"},
            ["\udc80"],
        ],
    )
    def test_a_real_nul_or_surrogate_is_invalid(self, value: Any) -> None:
        with pytest.raises(InvalidResult):
            _result_json(value)

    def test_a_result_too_deep_to_encode_is_invalid(self) -> None:
        deep: list[Any] = []
        for _ in range(100_000):
            deep = [deep]
        with pytest.raises(InvalidResult, match="not JSON"):
            _result_json(deep)


@pytest.fixture
def hostile(registry: None) -> Iterator[None]:
    """Job types whose hooks and error descriptions fail; a job_finished receiver that exits."""

    def fails(payload: dict[str, Any], ctx: JobContext) -> None:
        raise ValueError("the handler's own failure")

    def succeeds(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
        return {"ok": 1}

    def bad_details(error: BaseException) -> tuple[str, str]:
        raise RuntimeError("cannot describe it")

    def exits(**kwargs: Any) -> None:
        raise SystemExit(2)

    described = job("tests.unit_bad_details")(fails)
    described.error_details = bad_details
    wrong_type = job("tests.unit_details_not_str")(fails)
    wrong_type.error_details = lambda error: (5, None)  # type: ignore[assignment,return-value]
    hooked = job("tests.unit_exiting_hooks")(succeeds)
    hooked.on_started = exits
    hooked.on_finished = exits
    job("tests.unit_fails")(fails)
    signals.job_finished.connect(exits, dispatch_uid="test_execute.exits")
    try:
        yield
    finally:
        signals.job_finished.disconnect(dispatch_uid="test_execute.exits")


class TestExecuteNeverRaises:
    @pytest.mark.parametrize("job_type", ["tests.unit_bad_details", "tests.unit_details_not_str"])
    def test_error_details_that_fail_keep_the_policys_summary(
        self, hostile: None, job_type: str
    ) -> None:
        outcome = run(job_type)
        assert (outcome.status, outcome.code) == (JobStatus.RETRYING, "ValueError")
        assert outcome.summary == "ValueError: the handler's own failure"

    def test_hooks_and_receivers_that_exit_do_not_end_the_attempt(self, hostile: None) -> None:
        outcome = run("tests.unit_exiting_hooks")
        assert outcome.status == JobStatus.COMPLETED
        assert outcome.result_json == '{"ok":1}'

    def test_a_receiver_that_exits_after_a_failure(self, hostile: None) -> None:
        assert run("tests.unit_fails").status == JobStatus.RETRYING

    def test_a_failure_around_the_handler_is_the_attempts_outcome(self, hostile: None) -> None:
        """Even a failure of the worker's own steps (here: the start delay metric, given a
        claimed job it cannot read) ends in an outcome decided by the policy."""
        broken = claimed_job("tests.unit_fails", waited="not a number")
        outcome = execute(broken, policy=POLICY, renew=lambda: None)
        assert (outcome.status, outcome.code) == (JobStatus.RETRYING, "TypeError")


class TestOutcomeOfASnooze:
    @pytest.mark.parametrize("form", ["raise", "return"])
    def test_a_real_status_and_the_attempt_given_back(self, registry: None, form: str) -> None:
        def snoozes(payload: dict[str, Any], ctx: JobContext) -> Snooze:
            if form == "raise":
                raise Snooze(30)
            return Snooze(30)

        job("tests.unit_snoozes")(snoozes)
        outcome = run("tests.unit_snoozes")
        assert (outcome.status, outcome.delay, outcome.code) == (JobStatus.RETRYING, 30, "snoozed")
        assert outcome.gives_back_attempt

    def test_no_other_outcome_gives_it_back(self, hostile: None) -> None:
        assert not run("tests.unit_fails").gives_back_attempt
        assert not run("tests.unit_exiting_hooks").gives_back_attempt
