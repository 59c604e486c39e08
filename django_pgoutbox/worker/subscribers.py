"""One event's projection through its subscribers: whether they accept its schema version,
running them (what one raises, or a connection one closes, told apart from the relay's own
statements), and the failure, logged, that the relay records when one fails."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.db import connections

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.failures import failure_outcome
from django_pgoutbox.models import OutboxEvent
from django_pgoutbox.outbox import subscribers_for
from django_pgoutbox.retry import Kind, bound, error_code, summarize

logger = logging.getLogger("django_pgoutbox.relay")

#: ``last_error_code`` of an event whose subscribers enqueued a job that cannot be written.
UNWRITABLE_JOB = "unwritable_job"

#: ``last_error_code`` of an event whose subscriber closed the relay's connection.
CLOSED_RELAY_CONNECTION = "closed_relay_connection"


class ClosedBySubscriber(Exception):
    """A subscriber closed the relay's connection (``connection.close()``,
    ``close_old_connections()``): the batch's transaction is gone, through that event's fault."""

    def __init__(self, event: OutboxEvent) -> None:
        super().__init__(
            f"a subscriber of {event.event_type!r} closed the relay's database connection "
            "inside the batch's transaction (connection.close(), close_old_connections()); "
            "nothing the event's subscribers wrote was kept"
        )
        self.event = event


class SubscriberRaised(Exception):
    """What a subscriber raised (any ``BaseException``), carried apart from the relay's own
    statements."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


@dataclass(frozen=True)
class Failure:
    """How one event's run failed: what RECORD_EVENT_FAILURES writes of it."""

    event_id: uuid.UUID
    dead: bool
    delay: float
    code: str
    error: str


def check_versions(event: OutboxEvent) -> Failure | None:
    """The failure, dead at once, of an event whose schema version one of its subscribers
    does not accept; else None."""
    refusing = [
        s.name for s in subscribers_for(event.event_type) if event.schema_version not in s.versions
    ]
    if not refusing:
        return None
    message = (
        f"schema version {event.schema_version} of {event.event_type!r} is not accepted "
        f"by {', '.join(refusing)}"
    )
    logger.error(
        "event %s: %s; dead-lettered",
        event.id,
        message,
        extra={"event_id": str(event.id), "event_type": event.event_type},
    )
    return Failure(event.id, True, 0.0, "unsupported_schema_version", bound(message))


def run_subscribers(event: OutboxEvent, using: str) -> None:
    """Run ``event``'s subscribers; whatever one raises (``KeyboardInterrupt`` aside) comes
    out as ``SubscriberRaised``, so that it is told apart from the relay's own statements, and a
    connection closed by one of them as ``ClosedBySubscriber``."""
    wrapper = connections[using]
    try:
        for projection in subscribers_for(event.event_type):
            projection(event)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit too: a subscriber's, not the process's
        if wrapper.closed_in_transaction:
            raise ClosedBySubscriber(event) from error
        raise SubscriberRaised(error) from error
    # Set by Django's close() alone, never by a connection the server dropped.
    if wrapper.closed_in_transaction:
        raise ClosedBySubscriber(event)


def failure(
    event: OutboxEvent,
    error: BaseException,
    code: str,
    *,
    suspect: bool,
    max_attempts: int,
    policy: RetrySettings,
) -> Failure:
    """The failure of ``event``'s run that ``error`` ended, logged (``suspect``: the event was
    taken over, and its claim counted this run already)."""
    # ``attempts`` counts the failures before this one, and, for an event taken over, this
    # very run: the claim counted it before any subscriber ran (CLAIM_EVENTS).
    attempt = event.attempts if suspect else event.attempts + 1
    summary = summarize(error)
    if code == UNWRITABLE_JOB:
        summary = bound(f"a job it enqueued cannot be written: {summary}")
    elif code == CLOSED_RELAY_CONNECTION:
        summary = bound(str(error))
    # Whatever a subscriber raised, the event is retried until its attempts run out.
    failed = failure_outcome(
        error,
        attempt=attempt,
        max_attempts=max_attempts,
        policy=policy,
        kind=Kind.TRANSIENT,
        code=code,
        summary=summary,
    )
    dead, delay = failed.dead, failed.delay
    arguments = (
        event.id,
        event.event_type,
        attempt,
        max_attempts,
        summary,
        "dead" if dead else f"retry in {delay:.1f}s",
    )
    fields = {"event_id": str(event.id), "event_type": event.event_type, "attempt": attempt}
    try:
        logger.error(
            "event %s (%s) attempt %d/%d: %s -> %s", *arguments, exc_info=error, extra=fields
        )
    except BaseException:  # a traceback that cannot be formatted (its __class__ raises)
        logger.error(
            "event %s (%s) attempt %d/%d: %s -> %s (its traceback could not be formatted)",
            *arguments,
            extra=fields,
        )
    return Failure(event.id, dead, delay, code, summary)


def code_of(error: BaseException) -> str:
    """``error_code(error)``, bounded; the class name when its ``code`` is not text."""
    try:
        return bound(error_code(error), 200)
    except Exception:
        return bound(type(error).__name__, 200)
