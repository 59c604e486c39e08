"""One event's projection through its subscribers, one subscriber at a time: which of them run
(``plan``: not one that refuses the event's schema version, nor one whose earlier delivery of the
aggregate still waits), running one (what it raises, or a connection it closes, told apart from
the relay's own statements), and the deliveries, logged, that the relay writes for those that did
not run or failed (``outbox_deliveries``). The relay and its delivery runner share them."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connections

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.db import ended_idle_in_transaction
from django_pgoutbox.enqueueing import for_event
from django_pgoutbox.failures import failure_outcome
from django_pgoutbox.models import OutboxEvent
from django_pgoutbox.outbox import Subscriber, subscribers_for
from django_pgoutbox.retry import Kind, bound, error_code, summarize
from django_pgoutbox.tracing import traced_event

logger = logging.getLogger("django_pgoutbox.relay")

#: ``last_error_code`` of an event whose subscribers enqueued a job that cannot be written.
UNWRITABLE_JOB = "unwritable_job"

#: ``last_error_code`` of an event whose subscriber closed the relay's connection.
CLOSED_RELAY_CONNECTION = "closed_relay_connection"

#: ``last_error_code`` of an event whose subscriber kept the relay's transaction silent for
#: longer than its idle bound (``OUTBOX["CLAIM_SECONDS"]``, 3 s at least), so that the server
#: ended the relay's session (``idle_in_transaction_session_timeout``).
SUBSCRIBER_TIMEOUT = "subscriber_timeout"

#: ``last_error_code`` of a delivery whose event's schema version its subscriber does not accept.
UNSUPPORTED_SCHEMA_VERSION = "unsupported_schema_version"

#: ``last_error_code`` of a delivery whose subscriber no process here has registered (renamed,
#: removed, or not deployed to this host yet): retried, then dead.
UNKNOWN_SUBSCRIBER = "unknown_subscriber"

#: ``last_error_code`` of a delivery whose subscriber returned with the relay's transaction
#: aborted (it caught a database error and went on).
ABORTED_TRANSACTION = "aborted_transaction"


class AbortedTransaction(Exception):
    """A subscriber returned with the relay's transaction aborted: a statement of its failed,
    and it caught the error instead of letting it out (or of running the statement in a
    savepoint of its own). Every later statement of the transaction would fail; it is that
    subscriber's failure, as if it had raised."""

    def __init__(self, event: OutboxEvent, subscriber: str) -> None:
        super().__init__(
            f"subscriber {subscriber!r} of {event.event_type!r} returned with the relay's "
            "transaction aborted: a statement of its failed and it caught the DatabaseError "
            "(wrap a statement that may fail in transaction.atomic(), a savepoint, or let the "
            "error out); nothing it wrote was kept"
        )


class ClosedBySubscriber(Exception):
    """A subscriber closed the relay's connection (``connection.close()``,
    ``close_old_connections()``): the transaction is gone, through that subscriber's fault."""

    #: The failed delivery's ``last_error_code``.
    code = CLOSED_RELAY_CONNECTION

    def __init__(self, event: OutboxEvent, subscriber: str, message: str | None = None) -> None:
        super().__init__(
            message
            or f"subscriber {subscriber!r} of {event.event_type!r} closed the relay's database "
            "connection inside the relay's transaction (connection.close(), "
            "close_old_connections()); nothing it wrote was kept"
        )
        self.event = event
        self.subscriber = subscriber


class SubscriberTimedOut(ClosedBySubscriber):
    """A subscriber ran for longer than the relay's transaction may stay silent (no statement
    sent: an HTTP call, a sleep), and the server ended the relay's session: the transaction is
    gone, through that subscriber's fault. Without this, the relay would project the same batch
    again and again, each time cut off by the same subscriber."""

    code = SUBSCRIBER_TIMEOUT

    def __init__(self, event: OutboxEvent, subscriber: str, seconds: float, bound: float) -> None:
        super().__init__(
            event,
            subscriber,
            f"subscriber {subscriber!r} of {event.event_type!r} ran for {seconds:.1f}s, longer "
            f"than the relay's transaction may stay idle ({bound:g}s: OUTBOX['CLAIM_SECONDS'], "
            "3 s at least), and the server ended the relay's session; nothing it wrote was "
            "kept (slow work belongs in a job the subscriber enqueues)",
        )


class SubscriberRaised(Exception):
    """What a subscriber raised (any ``BaseException``), carried apart from the relay's own
    statements."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error


@dataclass(frozen=True)
class Delivery:
    """A subscriber of an event that did not run with the others: what WRITE_DELIVERIES writes
    (``attempts`` 1 and an error for one that failed, 0 and none for one that waits)."""

    event_id: uuid.UUID
    subscriber: str
    attempts: int
    dead: bool
    delay: float
    code: str | None
    error: str | None

    @property
    def outcome(self) -> str:
        """The metric's outcome: ``dead``, ``retrying`` or ``waiting``."""
        if self.dead:
            return "dead"
        return "waiting" if self.error is None else "retrying"


@dataclass
class Plan:
    """Which of an event's subscribers run now, and the deliveries of those that do not."""

    runnable: list[Subscriber] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)


def plan(event: OutboxEvent, waiting: Collection[str]) -> Plan:
    """``event``'s subscribers that run now; a dead delivery for each that refuses its schema
    version, and a waiting one for each named in ``waiting`` (it has an undelivered delivery
    of the same aggregate: each subscriber sees an aggregate's events in order)."""
    result = Plan()
    for projection in subscribers_for(event.event_type):
        if projection.name in waiting:
            result.deliveries.append(waiting_delivery(event, projection.name))
        elif event.schema_version not in projection.versions:
            result.deliveries.append(refused(event, projection.name))
        else:
            result.runnable.append(projection)
    return result


def waiting_delivery(event: OutboxEvent, subscriber: str) -> Delivery:
    return Delivery(event.id, subscriber, 0, False, 0.0, None, None)


def refused(event: OutboxEvent, subscriber: str) -> Delivery:
    """The delivery, dead at once, of an event whose schema version ``subscriber`` does not
    accept: never guessed at, never silently dropped."""
    message = (
        f"schema version {event.schema_version} of {event.event_type!r} is not accepted "
        f"by {subscriber}"
    )
    logger.error(
        "event %s: %s; its delivery to %s is dead",
        event.id,
        message,
        subscriber,
        extra={"event_id": str(event.id), "event_type": event.event_type},
    )
    return Delivery(event.id, subscriber, 1, True, 0.0, UNSUPPORTED_SCHEMA_VERSION, bound(message))


def run_one(
    projection: Subscriber, event: OutboxEvent, using: str, idle_seconds: float | None = None
) -> None:
    """Run one subscriber on ``event``; whatever it raises (``KeyboardInterrupt`` aside) comes
    out as ``SubscriberRaised``, so that it is told apart from the relay's own statements, and a
    connection it closed as ``ClosedBySubscriber``. One that ran for ``idle_seconds`` or more
    (the transaction's ``idle_in_transaction_session_timeout``) after which the server ended the
    session raises ``SubscriberTimedOut``."""
    wrapper = connections[using]
    statements = _InStatements()
    try:
        with (
            wrapper.execute_wrapper(statements),
            for_event(event.id),
            traced_event(event, projection.name),
        ):
            projection(event)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit too: a subscriber's, not the process's
        if wrapper.closed_in_transaction:
            raise ClosedBySubscriber(event, projection.name) from error
        _raise_if_timed_out(projection, event, using, statements.silent(), idle_seconds, error)
        raise SubscriberRaised(error) from error
    _raise_if_timed_out(projection, event, using, statements.silent(), idle_seconds, None)
    # Set by Django's close() alone, never by a connection the server dropped.
    if wrapper.closed_in_transaction:
        raise ClosedBySubscriber(event, projection.name)
    raw = wrapper.connection
    if raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        # No round trip: psycopg knows the server's transaction status from its last answer.
        aborted = AbortedTransaction(event, projection.name)
        raise SubscriberRaised(aborted) from aborted


class _InStatements:
    """An execute wrapper on the relay's connection while a subscriber runs: how long the
    subscriber kept the connection silent, its run's time less the time its own statements
    took (a statement waiting on a network partition is not silence of the subscriber's)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.inside = 0.0

    def __call__(self, execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
        began = time.monotonic()
        try:
            return execute(sql, params, many, context)
        finally:
            self.inside += time.monotonic() - began

    def silent(self) -> float:
        return time.monotonic() - self.started - self.inside


def _raise_if_timed_out(
    projection: Subscriber,
    event: OutboxEvent,
    using: str,
    seconds: float,
    idle_seconds: float | None,
    error: BaseException | None,
) -> None:
    """After a subscriber that kept the relay's connection silent for ``idle_seconds`` or more
    (``seconds``): whether the server ended the session for it (SQLSTATE 25P03,
    ``idle_in_transaction_session_timeout``), in what it raised or in one round trip; if so,
    ``SubscriberTimedOut``. Subscribers quicker than that cost nothing. A connection gone while
    the subscriber's own statement waited on it (a network partition) is nobody's fault: the
    relay's next statement finds it lost, as after any lost connection."""
    if idle_seconds is None or seconds < idle_seconds:
        return
    ended = error is not None and ended_idle_in_transaction(error)
    raw = connections[using].connection
    if not ended and raw is not None and not raw.closed and not raw.broken:
        try:
            raw.execute("SELECT 1")
        except psycopg.Error as probe:
            # An aborted transaction (the subscriber caught a database error) answers with an
            # error too, but not this one.
            ended = ended_idle_in_transaction(probe)
    if ended:
        # As a subscriber's close() would: Django marks the transaction closed, so that the
        # relay records the failure apart in a transaction on a new connection.
        connections[using].close()
        timed_out = SubscriberTimedOut(event, projection.name, seconds, idle_seconds)
        raise timed_out from error


def failed(
    event: OutboxEvent,
    subscriber: str,
    error: BaseException,
    code: str,
    *,
    attempt: int,
    max_attempts: int,
    policy: RetrySettings,
) -> Delivery:
    """The delivery of ``event`` to ``subscriber`` whose attempt number ``attempt`` ``error``
    ended: retried with back-off, or dead once its attempts run out; logged."""
    summary = summarize(error)
    if code == UNWRITABLE_JOB:
        summary = bound(f"a job it enqueued cannot be written: {summary}")
    elif code in (CLOSED_RELAY_CONNECTION, SUBSCRIBER_TIMEOUT):
        summary = bound(str(error))
    # Whatever a subscriber raised, its delivery is retried until its attempts run out.
    outcome = failure_outcome(
        error,
        attempt=attempt,
        max_attempts=max_attempts,
        policy=policy,
        kind=Kind.TRANSIENT,
        code=code,
        summary=summary,
    )
    dead, delay = outcome.dead, outcome.delay
    arguments = (
        event.id,
        event.event_type,
        subscriber,
        attempt,
        max_attempts,
        summary,
        "dead" if dead else f"retry in {delay:.1f}s",
    )
    fields = {
        "event_id": str(event.id),
        "event_type": event.event_type,
        "subscriber": subscriber,
        "attempt": attempt,
    }
    try:
        logger.error(
            "event %s (%s) to %s, attempt %d/%d: %s -> %s",
            *arguments,
            exc_info=error,
            extra=fields,
        )
    except BaseException:  # a traceback that cannot be formatted (its __class__ raises)
        logger.error(
            "event %s (%s) to %s, attempt %d/%d: %s -> %s (its traceback could not be formatted)",
            *arguments,
            extra=fields,
        )
    return Delivery(event.id, subscriber, attempt, dead, delay, code, summary)


def code_of(error: BaseException) -> str:
    """``error_code(error)``, bounded; the class name when its ``code`` is not text."""
    if type(error) is AbortedTransaction:
        return ABORTED_TRANSACTION
    try:
        return bound(error_code(error), 200)
    except Exception:
        return bound(type(error).__name__, 200)
