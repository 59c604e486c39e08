"""The retry policy: a pure function from (failure, attempt, budget) to a named decision.

It touches no database and no clock, so it is tested on its own. The table it implements:

==========================  ==========================================================
failure                     decision
==========================  ==========================================================
``TransientError``          retry after ``BASE_DELAY * 2**min(attempt, 10)``, capped at
                            ``MAX_DELAY``, with jitter
``RateLimited(retry_after)`` retry after the hint (the backoff when there is none)
``PermanentError``          dead letter at once
``Revoked``                 cancel, never retry
any other exception         retry with backoff while ``attempt <= UNKNOWN_ERROR_RETRIES``,
                            then dead letter
(any retry)                 dead letter instead once ``attempt >= max_attempts``
process crash               not decided here: the lease expires and the job is reclaimed
==========================  ==========================================================
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import JobFailure, PermanentError, RateLimited, Revoked, TransientError

#: ``jobs.last_error_summary`` never holds more than this many characters.
MAX_SUMMARY_LENGTH = 1000

#: Exponent cap of the backoff, from the source text: ``shift := min(attempt, 10)``.
MAX_SHIFT = 10


class Action(enum.StrEnum):
    RETRY = "retry"
    DEAD = "dead"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Decision:
    """What to do with a failed attempt; ``delay`` (seconds) only matters for ``RETRY``."""

    action: Action
    code: str
    summary: str
    delay: float = 0.0


def backoff(attempt: int, policy: RetrySettings, rng: random.Random | None = None) -> float:
    """``BASE_DELAY * 2**min(attempt, 10)``, capped at ``MAX_DELAY``, then jittered.

    Jitter moves the delay by up to ``JITTER`` of itself either way, so that jobs that failed
    together spread out; the result never exceeds ``MAX_DELAY`` nor drops below zero.
    """
    shift = min(max(attempt, 0), MAX_SHIFT)
    delay = min(policy.base_delay * (1 << shift), policy.max_delay)
    if policy.jitter:
        delay += delay * policy.jitter * (rng or random).uniform(-1.0, 1.0)
    return max(0.0, min(delay, policy.max_delay))


def error_code(error: BaseException) -> str:
    """The stable name stored in ``jobs.last_error_code``: the failure's code or class name."""
    if isinstance(error, JobFailure) and error.code:
        return error.code
    return type(error).__name__


def summarize(error: BaseException, limit: int = MAX_SUMMARY_LENGTH) -> str:
    """``ClassName: message``, cut to ``limit`` characters; tracebacks belong in the log."""
    message = str(error)
    return bound(f"{type(error).__name__}: {message}" if message else type(error).__name__, limit)


def bound(text: str, limit: int = MAX_SUMMARY_LENGTH) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut; storable as PostgreSQL text.

    NUL characters and lone surrogates (which UTF-8 cannot encode) are escaped: an error message
    must never be the reason an outcome cannot be written.
    """
    text = text.replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    # The count in the marker is at most len(text), so this head always leaves room for it.
    head = limit - len(f" [... {len(text)} more characters]")
    return f"{text[:head]} [... {len(text) - head} more characters]"


def decide(
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    policy: RetrySettings,
    rng: random.Random | None = None,
) -> Decision:
    """Decide the fate of attempt number ``attempt`` (1-based) that raised ``error``."""
    code = bound(error_code(error), 200)
    summary = summarize(error)
    if isinstance(error, Revoked):
        return Decision(Action.CANCEL, code, summary)
    if isinstance(error, PermanentError):
        return Decision(Action.DEAD, code, summary)
    if attempt >= max_attempts:
        exhausted = f"attempts exhausted ({attempt}/{max_attempts}): {summary}"
        return Decision(Action.DEAD, code, bound(exhausted))
    if isinstance(error, RateLimited):
        if error.retry_after is not None:
            return Decision(Action.RETRY, code, summary, float(error.retry_after))
        return Decision(Action.RETRY, code, summary, backoff(attempt, policy, rng))
    if isinstance(error, TransientError):
        return Decision(Action.RETRY, code, summary, backoff(attempt, policy, rng))
    if attempt > policy.unknown_error_retries:
        return Decision(Action.DEAD, code, summary)
    return Decision(Action.RETRY, code, summary, backoff(attempt, policy, rng))
