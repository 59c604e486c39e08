"""The retry policy, as a pure function: no database."""

from __future__ import annotations

import random
from typing import Any

import django.db
import psycopg
import pytest

from django_pgoutbox.conf import MAX_DELAY_CEILING, RetrySettings
from django_pgoutbox.errors import (
    JobTimeout,
    PermanentError,
    RateLimited,
    Revoked,
    Snooze,
    TransientError,
)
from django_pgoutbox.failures import failure_outcome
from django_pgoutbox.models import JobStatus
from django_pgoutbox.retry import (
    MAX_SUMMARY_LENGTH,
    Action,
    Kind,
    backoff,
    bound,
    clamp_delay,
    decide,
    error_code,
    kind_of,
    summarize,
)


def _wrapped(kind: type[BaseException], cause: BaseException) -> BaseException:
    """``kind`` raised from ``cause``, as Django wraps a driver's error."""
    error = kind(str(cause))
    error.__cause__ = cause
    return error


class _SqlstateRaises(django.db.OperationalError):
    """A lost connection's class, with a cause whose SQLSTATE cannot be read."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.__cause__ = _BrokenSqlstate(message)


class _BrokenSqlstate(psycopg.OperationalError):
    armed = False  # psycopg's own __init__ reads sqlstate

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.armed = True

    @property
    def sqlstate(self) -> str | None:  # type: ignore[override]
        if self.armed:
            raise RuntimeError("no SQLSTATE here")
        return None


class _CauseRaises(django.db.OperationalError):
    """A lost connection's class whose ``__cause__`` raises when read."""

    @property
    def __cause__(self) -> BaseException | None:  # type: ignore[override]
        raise RuntimeError("no cause here")


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

    @pytest.mark.parametrize(
        "error",
        [
            psycopg.errors.AdminShutdown("terminating connection"),  # 57P01
            psycopg.errors.ConnectionFailure("lost"),  # 08006
            psycopg.OperationalError("the connection is closed"),  # no SQLSTATE
            psycopg.errors.SerializationFailure("could not serialize"),  # 40001
            psycopg.errors.DeadlockDetected("deadlock"),  # 40P01
            psycopg.errors.QueryCanceled("statement timeout"),  # 57014
            _wrapped(django.db.OperationalError, psycopg.errors.AdminShutdown("x")),
            _wrapped(django.db.InterfaceError, psycopg.InterfaceError("connection already closed")),
        ],
        ids=repr,
    )
    def test_a_lost_connection_or_conflict_retries_until_the_budget(
        self, error: BaseException
    ) -> None:
        """The database failed, not the job: as a TransientError, past UNKNOWN_ERROR_RETRIES."""
        assert kind_of(error) is Kind.TRANSIENT
        assert decision(error, attempt=7, max_attempts=10).action == Action.RETRY
        assert decision(error, attempt=10, max_attempts=10).action == Action.DEAD

    @pytest.mark.parametrize(
        "error",
        [
            psycopg.errors.UniqueViolation("duplicate key"),  # 23505: the job's data
            psycopg.errors.ProgramLimitExceeded("too large"),  # 54000, an OperationalError
            psycopg.errors.NumericValueOutOfRange("out of range"),  # 22003
            psycopg.errors.UndefinedTable("no such table"),  # 42P01
            _wrapped(django.db.IntegrityError, psycopg.errors.UniqueViolation("x")),
            _wrapped(ValueError, psycopg.errors.AdminShutdown("x")),  # not a database error
            _SqlstateRaises("x"),
            _CauseRaises("x"),
        ],
        ids=repr,
    )
    def test_other_database_errors_are_unknown(self, error: BaseException) -> None:
        """A database error the job's own data or code caused is as any other exception: a
        few retries, then a dead letter; one whose attributes raise is unknown too."""
        assert kind_of(error) is Kind.UNKNOWN
        assert decision(error, attempt=4, max_attempts=10).action == Action.DEAD

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


class TestVerdict:
    """The end of the worker's log line: the decision and, in plain words, the rule that made it."""

    UNKNOWN = "PGOUTBOX['RETRY']['UNKNOWN_ERROR_RETRIES']"

    @pytest.mark.parametrize(
        ("error", "attempt", "verdict"),
        [
            (TransientError("x"), 3, "retrying in 8.0s: a transient failure: backoff"),
            (
                RateLimited(retry_after=42),
                1,
                "retrying in 42.0s: rate limited: the delay it asked for",
            ),
            (RateLimited(), 2, "retrying in 4.0s: rate limited, no delay given: backoff"),
            (
                PermanentError("x"),
                1,
                "dead: a permanent failure (PermanentError) is never retried",
            ),
            (Revoked(), 1, "cancelled: Revoked is never retried"),
            (TransientError("x"), 10, "dead: attempt 10 was the last one (max_attempts=10)"),
            (
                KeyError("x"),
                2,
                "retrying in 4.0s: an unexpected error (not a TransientError), retry 2 of the 3 "
                f"that {UNKNOWN} allows",
            ),
            (
                KeyError("x"),
                4,
                "dead: an unexpected error (not a TransientError) on attempt 4, and "
                f"{UNKNOWN} = 3 allows 3 retries",
            ),
        ],
    )
    def test_says_why(self, error: BaseException, attempt: int, verdict: str) -> None:
        assert decision(error, attempt=attempt).verdict == verdict

    def test_reaches_the_failure_outcome(self) -> None:
        failed = failure_outcome(KeyError("x"), attempt=4, max_attempts=5, policy=POLICY)
        assert failed.verdict.startswith("dead: an unexpected error (not a TransientError)")

    def test_of_a_hostile_error(self) -> None:
        verdict = decide(_ClassRaises("x"), attempt=9, max_attempts=10, policy=POLICY).verdict
        assert verdict.startswith("dead: an unexpected error (not a TransientError) on attempt 9")


class TestDelays:
    """Delays are checked where they are made and never leave [0, MAX_DELAY]."""

    @pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), -1, "3", True])
    def test_rate_limited_refuses_a_hint_that_is_not_finite_or_is_negative(
        self, bad: object
    ) -> None:
        with pytest.raises(TypeError, match="finite number of seconds >= 0"):
            RateLimited(retry_after=bad)  # type: ignore[arg-type]

    @pytest.mark.parametrize("bad", [float("inf"), float("nan"), -0.5, None, "1"])
    def test_snooze_refuses_seconds_that_are_not_finite_or_are_negative(self, bad: object) -> None:
        with pytest.raises(TypeError, match="finite number of seconds >= 0"):
            Snooze(bad)  # type: ignore[arg-type]

    @pytest.mark.parametrize("huge", [1e15, 1e300, 10**400])
    def test_huge_delays_are_cut_to_the_ceiling_where_they_are_made(self, huge: float) -> None:
        assert Snooze(huge).seconds == MAX_DELAY_CEILING == 365 * 86400
        assert RateLimited(retry_after=huge).retry_after == MAX_DELAY_CEILING

    def test_the_rate_limit_hint_is_cut_to_max_delay(self) -> None:
        result = decision(RateLimited(retry_after=1e300))
        assert (result.action, result.delay) == (Action.RETRY, POLICY.max_delay)
        assert decision(RateLimited(retry_after=30)).delay == 30

    @pytest.mark.parametrize(
        ("changed", "expected"),
        [(float("inf"), 600.0), (float("nan"), 0.0), (-5, 0.0), ("soon", 0.0), (10**400, 600.0)],
    )
    def test_a_hint_changed_after_it_was_made_is_clamped(
        self, changed: object, expected: float
    ) -> None:
        error = RateLimited(retry_after=1)
        error.retry_after = changed  # type: ignore[assignment]
        assert decision(error).delay == expected

    @pytest.mark.parametrize(
        ("seconds", "expected"),
        [
            (12.5, 12.5),
            (0, 0.0),
            (-1, 0.0),
            (float("nan"), 0.0),
            (float("inf"), MAX_DELAY_CEILING),
            (1e300, MAX_DELAY_CEILING),
            (10**400, MAX_DELAY_CEILING),
            (True, 0.0),
            (None, 0.0),
        ],
    )
    def test_clamp_delay(self, seconds: object, expected: float) -> None:
        assert clamp_delay(seconds) == expected
        assert isinstance(clamp_delay(seconds), float)

    def test_clamp_delay_never_exceeds_the_hard_ceiling(self) -> None:
        assert clamp_delay(1e300, ceiling=1e300) == MAX_DELAY_CEILING
        assert clamp_delay(50, ceiling=10) == 10

    def test_backoff_stays_within_max_delay_even_at_extremes(self) -> None:
        extreme = RetrySettings(
            base_delay=MAX_DELAY_CEILING,
            max_delay=MAX_DELAY_CEILING,
            jitter=1.0,
            unknown_error_retries=3,
        )
        for attempt in (0, 1, 10, 10**9):
            assert 0 <= backoff(attempt, extreme, random.Random(attempt)) <= MAX_DELAY_CEILING


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class _Unprintable2(Exception):
    def __str__(self) -> str:
        raise _Unprintable()


class _LyingStr(str):
    def __format__(self, spec: str) -> str:
        raise RuntimeError("format")


class _StrSubclassMessage(Exception):
    def __str__(self) -> str:
        return _LyingStr("a message whose own methods raise")


class _BadCode(TransientError):
    code = 5  # type: ignore[assignment]


class _CodeRaises(PermanentError):
    def __getattribute__(self, name: str) -> Any:
        if name == "code":
            raise RuntimeError("no code")
        return super().__getattribute__(name)


class _HintRaises(RateLimited):
    def __getattribute__(self, name: str) -> Any:
        if name == "retry_after":
            raise RuntimeError("no hint")
        return super().__getattribute__(name)


class _NulCode(TransientError):
    code = "bad\x00code\udc80"


class _StrExits(Exception):
    def __str__(self) -> str:
        raise SystemExit(4)


class _ClassRaises(Exception):
    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise SystemExit(5)


class TestHostileErrors:
    """``decide`` and its parts never raise, whatever the handler raised."""

    def test_an_exception_whose_str_raises_system_exit(self) -> None:
        assert summarize(_StrExits()) == (
            "_StrExits (its message could not be read: SystemExit: 4)"
        )

    def test_an_exception_whose_class_raises(self) -> None:
        assert summarize(_ClassRaises("x")).startswith("_ClassRaises")
        decision = decide(_ClassRaises("x"), attempt=1, max_attempts=3, policy=POLICY)
        assert (decision.action, decision.code) == (Action.RETRY, "_ClassRaises")

    def test_a_delay_of_a_float_subclass_whose_comparisons_raise(self) -> None:
        class Hostile(float):
            def __ge__(self, other: object) -> bool:
                raise SystemExit(6)

            __lt__ = __gt__ = __le__ = __ge__

        assert clamp_delay(Hostile(5.0)) == 5.0

    def test_an_unprintable_exception_is_named_by_its_class(self) -> None:
        assert summarize(_Unprintable()) == (
            "_Unprintable (its message could not be read: RuntimeError: no message for you)"
        )

    def test_an_exception_whose_str_raises_an_unprintable_exception(self) -> None:
        assert summarize(_Unprintable2()) == (
            "_Unprintable2 (its message could not be read: _Unprintable)"
        )

    def test_a_str_subclass_message(self) -> None:
        assert summarize(_StrSubclassMessage()) == (
            "_StrSubclassMessage: a message whose own methods raise"
        )

    def test_a_code_that_is_not_a_string_gives_the_class_name(self) -> None:
        assert error_code(_BadCode("x")) == "_BadCode"
        assert error_code(_CodeRaises("x")) == "_CodeRaises"

    def test_a_code_is_bounded_and_storable(self) -> None:
        assert error_code(_NulCode()) == "bad\\x00code\\udc80"
        assert len(error_code(TransientError("x", code="c" * 5000))) <= 200

    @pytest.mark.parametrize(
        ("error", "action", "code"),
        [
            (_Unprintable(), Action.RETRY, "_Unprintable"),
            (_Unprintable2(), Action.RETRY, "_Unprintable2"),
            (_BadCode("x"), Action.RETRY, "_BadCode"),
            (_CodeRaises("x"), Action.DEAD, "_CodeRaises"),
            (_StrSubclassMessage(), Action.RETRY, "_StrSubclassMessage"),
            (SystemExit(2), Action.RETRY, "SystemExit"),
            (_HintRaises(5), Action.RETRY, "_HintRaises"),
        ],
    )
    def test_decide_never_raises(self, error: BaseException, action: Action, code: str) -> None:
        result = decision(error)
        assert (result.action, result.code) == (action, code)
        exhausted = decision(error, attempt=10, max_attempts=10)
        assert exhausted.action == Action.DEAD


class TestBound:
    def test_a_lone_surrogate_is_escaped(self) -> None:
        assert bound("a\udc80b") == "a\\udc80b"
        bound("a\udc80b").encode("utf-8")

    def test_the_tail_can_be_kept(self) -> None:
        text = bound("head " + "x" * 5000 + " the error", 100, keep="tail")
        assert len(text) <= 100
        assert text.endswith(" the error")
        assert text.startswith("[... ")

    def test_a_str_subclass_is_read_as_plain_text(self) -> None:
        assert type(bound(_LyingStr("abc"))) is str


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


class TestFailureOutcome:
    """``failures.failure_outcome``: the decision as the status an outcome writes."""

    @pytest.mark.parametrize(
        ("error", "status"),
        [
            (TransientError("x"), JobStatus.RETRYING),
            (PermanentError("x"), JobStatus.DEAD),
            (Revoked("x"), JobStatus.CANCELLED),
            (KeyError("x"), JobStatus.RETRYING),
        ],
    )
    def test_each_action_has_its_status(self, error: BaseException, status: JobStatus) -> None:
        failed = failure_outcome(error, attempt=1, max_attempts=5, policy=POLICY)
        expected = decide(error, attempt=1, max_attempts=5, policy=POLICY)
        assert (failed.status, failed.code, failed.summary) == (
            status,
            expected.code,
            expected.summary,
        )
        assert failed.dead == (status is JobStatus.DEAD)

    def test_a_transient_kind_retries_any_error_until_the_budget(self) -> None:
        """The worker's own failures and a subscriber's: past UNKNOWN_ERROR_RETRIES, and a
        PermanentError too, are retried with the backoff until the last attempt."""
        for error in (KeyError("x"), PermanentError("x"), Revoked("x")):
            failed = failure_outcome(
                error, attempt=4, max_attempts=5, policy=POLICY, kind=Kind.TRANSIENT
            )
            assert (failed.status, failed.delay) == (JobStatus.RETRYING, 16)
            last = failure_outcome(
                error, attempt=5, max_attempts=5, policy=POLICY, kind=Kind.TRANSIENT
            )
            assert (last.status, last.delay) == (JobStatus.DEAD, 0.0)

    def test_a_permanent_kind_is_dead_at_once(self) -> None:
        failed = failure_outcome(
            TransientError("x"), attempt=1, max_attempts=5, policy=POLICY, kind=Kind.PERMANENT
        )
        assert failed.status == JobStatus.DEAD

    def test_the_callers_code_and_summary_are_written_as_they_are(self) -> None:
        failed = failure_outcome(
            KeyError("x"),
            attempt=5,
            max_attempts=5,
            policy=POLICY,
            code="worker_error",
            summary="the worker failed",
        )
        assert (failed.status, failed.code, failed.summary) == (
            JobStatus.DEAD,
            "worker_error",
            "the worker failed",
        )

    def test_the_kind_is_read_from_the_class(self) -> None:
        assert kind_of(_ClassRaises("x")) is Kind.UNKNOWN
        assert kind_of(_HintRaises()) is Kind.RATE_LIMITED
        assert kind_of(JobTimeout("x")) is Kind.TRANSIENT
