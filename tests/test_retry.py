"""The retry policy, as a pure function: no database."""

from __future__ import annotations

import random

import pytest

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import PermanentError, RateLimited, Revoked, TransientError
from django_pgoutbox.retry import (
    MAX_SUMMARY_LENGTH,
    Action,
    backoff,
    decide,
    error_code,
    summarize,
)

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)
JITTERY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.25, unknown_error_retries=3)


def decision(
    error: BaseException, attempt: int = 1, max_attempts: int = 10, policy: RetrySettings = POLICY
):
    return decide(
        error, attempt=attempt, max_attempts=max_attempts, policy=policy, rng=random.Random(7)
    )


class TestBackoff:
    @pytest.mark.parametrize(
        ("attempt", "expected"), [(0, 1), (1, 2), (2, 4), (5, 32), (9, 512), (10, 600), (30, 600)]
    )
    def test_doubles_per_attempt_up_to_the_cap(self, attempt: int, expected: float) -> None:
        assert backoff(attempt, POLICY) == expected

    def test_exponent_stops_at_ten(self) -> None:
        uncapped = RetrySettings(
            base_delay=1.0, max_delay=10**9, jitter=0.0, unknown_error_retries=3
        )
        assert backoff(10, uncapped) == 1024
        assert backoff(50, uncapped) == 1024

    def test_jitter_stays_within_its_fraction_and_the_cap(self) -> None:
        rng = random.Random(1)
        delays = [backoff(3, JITTERY, rng) for _ in range(2000)]
        assert min(delays) >= 8 * 0.75
        assert max(delays) <= 8 * 1.25
        assert len({round(d, 6) for d in delays}) > 1000  # actually spread
        assert all(backoff(20, JITTERY, rng) <= 600 for _ in range(200))


class TestDecide:
    def test_transient_retries_with_backoff(self) -> None:
        result = decision(TransientError("timeout"), attempt=3)
        assert (result.action, result.delay, result.code) == (Action.RETRY, 8.0, "TransientError")
        assert result.summary == "TransientError: timeout"

    def test_rate_limited_uses_the_hint(self) -> None:
        result = decision(RateLimited(retry_after=42), attempt=1)
        assert (result.action, result.delay, result.code) == (Action.RETRY, 42.0, "RateLimited")

    def test_rate_limited_without_hint_uses_the_policy(self) -> None:
        assert decision(RateLimited(), attempt=2).delay == 4.0

    def test_permanent_is_dead_at_once(self) -> None:
        result = decision(PermanentError("no such device"), attempt=1)
        assert (result.action, result.code) == (Action.DEAD, "PermanentError")

    def test_revoked_cancels(self) -> None:
        assert decision(Revoked("token withdrawn"), attempt=1).action == Action.CANCEL
        assert decision(Revoked(), attempt=10, max_attempts=10).action == Action.CANCEL

    @pytest.mark.parametrize(
        ("attempt", "action"), [(1, Action.RETRY), (3, Action.RETRY), (4, Action.DEAD)]
    )
    def test_unknown_errors_get_a_few_retries(self, attempt: int, action: Action) -> None:
        result = decision(KeyError("missing"), attempt=attempt)
        assert (result.action, result.code) == (action, "KeyError")

    @pytest.mark.parametrize("error", [TransientError(), RateLimited(5), ValueError()])
    def test_exhausted_budget_is_dead(self, error: BaseException) -> None:
        result = decision(error, attempt=5, max_attempts=5)
        assert result.action == Action.DEAD
        assert result.summary.startswith("attempts exhausted (5/5)")

    def test_custom_code(self) -> None:
        assert decision(TransientError("x", code="smtp_timeout")).code == "smtp_timeout"
        assert error_code(PermanentError("x", code="invalid_payload")) == "invalid_payload"

    def test_rate_limited_rejects_a_bad_hint(self) -> None:
        with pytest.raises(TypeError, match="seconds >= 0"):
            RateLimited(retry_after=-1)


class TestSummary:
    def test_a_megabyte_message_is_bounded(self) -> None:
        text = summarize(ValueError("x" * 1_000_000))
        assert len(text) <= MAX_SUMMARY_LENGTH
        assert text.startswith("ValueError: xxx")
        assert text.endswith("more characters]")

    def test_exhausted_summary_is_bounded_too(self) -> None:
        result = decision(ValueError("y" * 5000), attempt=10, max_attempts=10)
        assert len(result.summary) <= MAX_SUMMARY_LENGTH

    def test_nul_is_escaped(self) -> None:
        assert summarize(ValueError("a\x00b")) == "ValueError: a\\x00b"

    def test_empty_message(self) -> None:
        assert summarize(RuntimeError()) == "RuntimeError"
