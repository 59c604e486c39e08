"""The retry policy: a pure function from (failure, attempt, budget) to a named decision.

It touches no database and no clock, so it is tested on its own. ``failures.failure_outcome``
applies it to every failed attempt (a handler's exception, a timeout, the worker's own failure,
a subscriber's failure); the rows below it marked *SQL* are enforced by the statements named,
and ``tests/integration/test_outcome_rules.py`` checks each of those against the database.

=============================  ==========================================================
failure                        decision
=============================  ==========================================================
``TransientError``             retry after ``BASE_DELAY * 2**min(attempt, 10)``, capped at
                               ``MAX_DELAY``, with jitter
``RateLimited(retry_after)``   retry after the hint, capped at ``MAX_DELAY`` (the backoff when
                               there is none)
``PermanentError``             dead letter at once
a return value that is not     an ``InvalidResult`` (a ``PermanentError``), raised where the
JSON, or is over               result is written as JSON (``worker.execute``): dead letter at
``MAX_RESULT_BYTES``           once, code ``invalid_result`` or ``result_too_large``, no result
                               stored (retrying would repeat the handler's side effects)
``Revoked``                    cancel, never retry
a database error that says     a ``TransientError``: the connection was lost (SQLSTATE class
the connection or the          08, 53, 57P01-03, 57P05, 25P03, or a closed connection) or the
transaction was lost           transaction lost a conflict or was cancelled (class 40,
                               57014), as ``db.classify_error`` reads it
any other exception            retry with backoff while ``attempt <= UNKNOWN_ERROR_RETRIES``,
                               then dead letter
(any retry)                    dead letter instead once ``attempt >= max_attempts``
``JobTimeout``                 a ``TransientError``: retry with backoff, then dead letter
the worker's own failure       ``Kind.TRANSIENT`` whatever was raised (``worker_error``); a row
                               it cannot read is ``Kind.PERMANENT`` (``unreadable_job``)
a subscriber's failure         ``Kind.TRANSIENT`` whatever was raised, counted against
                               ``OUTBOX['MAX_ATTEMPTS']`` (``worker.relay``)
``Snooze(seconds)``            retry after ``seconds``, the attempt given back (``attempts``
                               goes down by one), so never dead; not a failure, so not decided
                               here (``worker.execute``). *SQL*: RECORD_OUTCOMES, for an
                               outcome whose ``gives_back_attempt`` is true
cancellation requested         cancel, whatever the attempt's outcome (its result is kept).
while the attempt ran          *SQL*: RECORD_OUTCOMES (``cancel_requested_at``), and
                               RECOVER_EXPIRED_LEASES and RELEASE_JOBS for an attempt that
                               ends without an outcome
process crash (lease expired)  the attempt is given back and retried at once; if it ran alone
                               (a suspect, ``alone_attempt``) it counts, and is a dead letter
                               once ``attempts >= max_attempts``. *SQL*: RECOVER_EXPIRED_LEASES
=============================  ==========================================================

Every delay it returns is a finite number of seconds between 0 and ``MAX_DELAY`` (itself at most
``conf.MAX_DELAY_CEILING``, 365 days), and :func:`decide` never raises: an exception that cannot
be printed, or a failure object with a broken code, still gets a decision.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import Error as DjangoDatabaseError

from django_pgoutbox.conf import MAX_DELAY_CEILING, RetrySettings
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.errors import JobFailure, PermanentError, RateLimited, Revoked, TransientError

#: ``jobs.last_error_summary`` never holds more than this many characters.
MAX_SUMMARY_LENGTH = 1000

#: ``jobs.last_error_code`` never holds more than this many characters.
MAX_CODE_LENGTH = 200

#: Exponent cap of the backoff, from the source text: ``shift := min(attempt, 10)``.
MAX_SHIFT = 10


class Kind(enum.StrEnum):
    """The kind of a failure: which row of the table decides it (``kind_of``)."""

    REVOKED = "revoked"
    PERMANENT = "permanent"
    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    UNKNOWN = "unknown"


def kind_of(error: BaseException) -> Kind:
    """The kind of ``error``, read from ``type(error)``, never from the instance: an
    exception's ``__class__`` (which ``isinstance`` consults) can be a property that raises."""
    kind = type(error)
    if issubclass(kind, Revoked):
        return Kind.REVOKED
    if issubclass(kind, PermanentError):
        return Kind.PERMANENT
    if issubclass(kind, RateLimited):
        return Kind.RATE_LIMITED
    if issubclass(kind, TransientError):
        return Kind.TRANSIENT
    if issubclass(kind, DjangoDatabaseError | psycopg.Error) and _lost_to_the_database(error):
        return Kind.TRANSIENT
    return Kind.UNKNOWN


def _lost_to_the_database(error: BaseException) -> bool:
    """Whether a database error a handler let through says the connection was lost or the
    transaction lost a conflict (``db.classify_error``, by SQLSTATE): the attempt failed for
    the database's sake, not the job's, and another attempt may well succeed."""
    try:
        return classify_error(error) in (ErrorKind.CONNECTION, ErrorKind.CONFLICT)
    except BaseException:  # a subclass whose sqlstate or __cause__ raises: as unknown
        return False


class Action(enum.StrEnum):
    RETRY = "retry"
    DEAD = "dead"
    CANCEL = "cancel"


@dataclass(frozen=True)
class Decision:
    """What to do with a failed attempt; ``delay`` (seconds) only matters for ``RETRY``.

    ``reason`` says in plain words which rule of the table decided, for the worker's log line.
    """

    action: Action
    code: str
    summary: str
    delay: float = 0.0
    reason: str = ""

    @property
    def verdict(self) -> str:
        """The decision and its reason, as the log line ends: ``dead: attempt 4 ...``."""
        status = {Action.RETRY: "retrying", Action.DEAD: "dead", Action.CANCEL: "cancelled"}
        timing = f" in {self.delay:.1f}s" if self.action is Action.RETRY else ""
        return f"{status[self.action]}{timing}: {self.reason}"


def backoff(attempt: int, policy: RetrySettings, rng: random.Random | None = None) -> float:
    """``BASE_DELAY * 2**min(attempt, 10)``, capped at ``MAX_DELAY``, then jittered.

    Jitter moves the delay by up to ``JITTER`` of itself either way, so that jobs that failed
    together spread out; the result never exceeds ``MAX_DELAY`` nor drops below zero.
    """
    shift = min(max(attempt, 0), MAX_SHIFT)
    delay = min(policy.base_delay * (1 << shift), policy.max_delay)
    if policy.jitter:
        delay += delay * policy.jitter * (rng or random).uniform(-1.0, 1.0)
    return clamp_delay(delay, policy.max_delay)


def clamp_delay(seconds: Any, ceiling: float = MAX_DELAY_CEILING) -> float:
    """``seconds`` as a float between 0 and ``ceiling`` (itself cut to ``MAX_DELAY_CEILING``).

    The last guard before a delay reaches an outcome statement, where PostgreSQL would refuse an
    interval out of range and fail every outcome of the batch: the classes that make delays
    (``RateLimited``, ``Snooze``, the settings) refuse bad ones already, so only a delay changed
    after it was made gets here. Anything that is not a number >= 0 (NaN included) counts as 0;
    infinity as the ceiling.
    """
    ceiling = min(ceiling, MAX_DELAY_CEILING)
    kind = type(seconds)
    if kind is bool or not issubclass(kind, int | float):
        return 0.0
    # A plain copy of a subclass, whose own comparisons could raise.
    seconds = float.__float__(seconds) if issubclass(kind, float) else int.__int__(seconds)
    if not seconds >= 0:  # negative, or NaN
        return 0.0
    if seconds >= ceiling:  # compared before float(): an int too large for a float
        return float(ceiling)
    return float(seconds) if math.isfinite(seconds) else float(ceiling)


def error_code(error: BaseException) -> str:
    """The stable name stored in ``jobs.last_error_code``: the failure's code or class name.

    Bounded and storable; never raises (a ``code`` that is not a string, or whose reading
    raises, gives the class name).
    """
    try:
        code = error.code if issubclass(type(error), JobFailure) else None  # type: ignore[attr-defined]
    except BaseException:
        code = None
    if not isinstance(code, str) or not code:
        code = _class_name(error)
    return bound(code, MAX_CODE_LENGTH)


def summarize(error: BaseException, limit: int = MAX_SUMMARY_LENGTH) -> str:
    """``ClassName: message``, cut to ``limit`` characters; tracebacks belong in the log.

    Never raises: an exception whose ``str()`` raises anything (``SystemExit`` included) or
    returns no string is summarized as ``ClassName (its message could not be read: ...)``.
    """
    name = _class_name(error)
    try:
        # str.__str__: a plain copy of a str subclass, whose own methods could raise later.
        message = str.__str__(str(error))
    except BaseException as problem:
        try:
            why = f"{_class_name(problem)}: {str.__str__(str(problem))}"
        except BaseException:
            why = _class_name(problem)
        return bound(f"{name} (its message could not be read: {why})", limit)
    return bound(f"{name}: {message}" if message else name, limit)


def _class_name(error: BaseException) -> str:
    """The exception's class name, which is a plain string even if its class is unusual."""
    try:
        name = type(error).__name__
    except BaseException:  # a metaclass's __getattribute__
        return "Exception"
    return str.__str__(name) if isinstance(name, str) and name else "Exception"


def bound(text: str, limit: int = MAX_SUMMARY_LENGTH, *, keep: str = "head") -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut; storable as PostgreSQL text.

    The one sanitiser of every error code and summary this app stores (``@job`` handlers,
    ``django.tasks``, the relay, the scheduler). NUL characters and lone surrogates (which UTF-8
    cannot encode) are escaped: an error message must never be the reason an outcome cannot be
    written. ``keep="tail"`` keeps the end instead (of a traceback, where the error is).
    """
    text = str.__str__(text).replace("\x00", "\\x00")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    # The count in the marker is at most len(text), so the part kept always leaves room for it.
    kept = limit - len(f" [... {len(text)} more characters]")
    if keep == "tail":
        return f"[... {len(text) - kept} more characters] {text[-kept:]}"
    return f"{text[:kept]} [... {len(text) - kept} more characters]"


def decide(
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    policy: RetrySettings,
    rng: random.Random | None = None,
    kind: Kind | None = None,
) -> Decision:
    """Decide the fate of attempt number ``attempt`` (1-based) that raised ``error``.

    ``kind``, when given, is the row of the table that decides, whatever ``error``'s class
    (the worker's own failures, a subscriber's); else ``kind_of(error)``. Never raises,
    whatever ``error`` is; every delay is between 0 and ``policy.max_delay``.
    """
    code = error_code(error)
    summary = summarize(error)
    if kind is None:
        kind = kind_of(error)
    if kind is Kind.REVOKED:
        return Decision(Action.CANCEL, code, summary, reason="Revoked is never retried")
    if kind is Kind.PERMANENT:
        reason = f"a permanent failure ({_class_name(error)}) is never retried"
        return Decision(Action.DEAD, code, summary, reason=reason)
    if attempt >= max_attempts:
        exhausted = f"attempts exhausted ({attempt}/{max_attempts}): {summary}"
        return Decision(
            Action.DEAD,
            code,
            bound(exhausted),
            reason=f"attempt {attempt} was the last one (max_attempts={max_attempts})",
        )
    if kind is Kind.RATE_LIMITED:
        try:
            hint = error.retry_after  # type: ignore[attr-defined]
        except BaseException:  # a subclass's property: the backoff instead
            hint = None
        if hint is not None:
            delay = clamp_delay(hint, policy.max_delay)
            reason = "rate limited: the delay it asked for"
            return Decision(Action.RETRY, code, summary, delay, reason)
        delay = backoff(attempt, policy, rng)
        return Decision(Action.RETRY, code, summary, delay, "rate limited, no delay given: backoff")
    if kind is Kind.TRANSIENT:
        delay = backoff(attempt, policy, rng)
        return Decision(Action.RETRY, code, summary, delay, "a transient failure: backoff")
    # Its class says nothing about whether trying again helps: a few tries, then a dead letter.
    retries, setting = policy.unknown_error_retries, "PGOUTBOX['RETRY']['UNKNOWN_ERROR_RETRIES']"
    if attempt > retries:
        return Decision(
            Action.DEAD,
            code,
            summary,
            reason=f"an unexpected error (not a TransientError) on attempt {attempt}, and "
            f"{setting} = {retries} allows {retries} retries",
        )
    delay = backoff(attempt, policy, rng)
    return Decision(
        Action.RETRY,
        code,
        summary,
        delay,
        f"an unexpected error (not a TransientError), retry {attempt} of the {retries} that "
        f"{setting} allows",
    )
