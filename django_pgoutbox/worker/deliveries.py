"""The relay's second duty: the subscribers' deliveries of past events (``outbox_deliveries``).

A delivery exists for a subscriber that did not run with the others when the relay projected
its event (it failed, or an earlier delivery of the aggregate waited). The relay's loop, on its
own thread, claims a batch of them between its batches of events (``DeliveryRunner.run_once``):
the first undelivered delivery of each (aggregate, subscriber), so that each subscriber sees an
aggregate's events in order and a dead delivery holds back only its own subscriber's later ones.
Each runs in a savepoint of the batch's transaction, its jobs written there; one that fails is
retried with back-off, and dead after ``OUTBOX["MAX_ATTEMPTS"]``; what the others wrote commits
with their ``delivered_at``. A delivery taken over from a relay that died under it is counted an
attempt by the claim and run alone, as an event is.

The runner is the relay's: the same thread, the same connection, no state shared with another.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from django_pgoutbox import metrics, queries, session_settings
from django_pgoutbox.conf import OutboxSettings, RetrySettings
from django_pgoutbox.db import ErrorKind, classify_error, server_side_cursor
from django_pgoutbox.enqueueing import DeferredEnqueues, deferred_enqueues
from django_pgoutbox.models import OutboxEvent, saved_instance
from django_pgoutbox.outbox import Subscriber, subscribers_for
from django_pgoutbox.worker import subscribers

logger = logging.getLogger("django_pgoutbox.relay")

#: ``last_error_code`` of a delivery taken over from a relay that never finished it, and the
#: summaries the claim writes (as an event's: ``relay.RELAY_CRASHED``).
DELIVERY_CRASHED = "relay_crashed"
DELIVERY_CRASHED_SUMMARY = (
    "the relay delivering this event to this subscriber stopped before finishing it (its "
    "process was killed: os._exit() or a crash in the subscriber, the OOM killer, a SIGKILL; or "
    "it stalled past OUTBOX['CLAIM_SECONDS']); counted as an attempt, and delivered alone next"
)
DELIVERY_CRASHED_DEAD_SUMMARY = (
    "dead after OUTBOX['MAX_ATTEMPTS'] attempts; at the last one, the relay delivering this "
    "event to this subscriber stopped before finishing it, as when a subscriber kills its "
    "process (os._exit(), a crash in native code, the OOM killer)"
)

#: The metrics' subscriber label of a delivery whose subscriber no process here registered:
#: label values stay the registered names, however many old names the table holds.
UNREGISTERED = "unregistered"


class ConnectionLost(Exception):
    """The relay's connection broke during a batch: the batch is abandoned, nothing recorded."""


class UnknownSubscriber(Exception):
    """No subscriber of this name is registered for the event's type in this process."""

    code = subscribers.UNKNOWN_SUBSCRIBER


def connection_lost(using: str) -> bool:
    """Whether the relay's own connection broke (no round trip: psycopg's flags)."""
    raw = connections[using].connection
    return raw is None or bool(raw.closed) or bool(raw.broken)


def write_deliveries(cursor: Any, deliveries: Sequence[subscribers.Delivery]) -> None:
    """WRITE_DELIVERIES, on the relay's cursor, in the transaction that marks their events."""
    if not deliveries:
        return
    cursor.execute(
        queries.WRITE_DELIVERIES,
        {
            "ids": [d.event_id for d in deliveries],
            "subscribers": [d.subscriber for d in deliveries],
            "attempts": [d.attempts for d in deliveries],
            "delays": [d.delay for d in deliveries],
            "dead": [d.dead for d in deliveries],
            "codes": [d.code for d in deliveries],
            "errors": [d.error for d in deliveries],
        },
    )


#: The event's columns that the relay's claims return, in order (CLAIM_EVENTS adds ``claimed_at``).
EVENT_COLUMNS = (
    "id",
    "organization_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "schema_version",
    "payload",
    "occurred_at",
    "available_at",
    "attempts",
    "trace_context",
)


def claimed_event(row: Sequence[Any], using: str, **extra: Any) -> OutboxEvent:
    """The event of a claim's ``row`` (``EVENT_COLUMNS``, its payload as JSON text)."""
    values = dict(zip(EVENT_COLUMNS, row, strict=True))
    values["payload"] = json.loads(values["payload"])
    return saved_instance(OutboxEvent, using, {**values, **extra})


def run_alone(
    projection: Subscriber,
    event: OutboxEvent,
    jobs: DeferredEnqueues,
    using: str,
    *,
    flush: bool,
    idle_seconds: float | None = None,
) -> tuple[BaseException, str] | None:
    """Run one subscriber on ``event`` in a savepoint (and, with ``flush``, write the jobs it
    enqueued there); if it failed, what failed it and the code of its delivery.

    What it raises, and a job of its that cannot be written (a data error), are its failure. A
    connection it closed raises ``ClosedBySubscriber``; a broken connection is nobody's:
    ``ConnectionLost`` abandons the batch. Any other error of the relay's own statements leaves
    the turn. The relay's isolated runs and the delivery runner share it.
    """
    mark = jobs.mark()
    try:
        with transaction.atomic(using=using):  # a savepoint: this subscriber only
            subscribers.run_one(projection, event, using, idle_seconds)
            if flush:
                session_settings.restore(using, f"subscriber {projection.name!r}")
                jobs.flush()
    except Exception as error:
        jobs.discard_from(mark)
        if isinstance(error, subscribers.ClosedBySubscriber):
            raise
        cause = error.error if isinstance(error, subscribers.SubscriberRaised) else error
        if connection_lost(using):
            raise ConnectionLost from cause
        if isinstance(error, subscribers.SubscriberRaised):
            return cause, subscribers.code_of(cause)
        if classify_error(error) is ErrorKind.DATA:
            return error, subscribers.UNWRITABLE_JOB
        raise
    return None


#: The shortest ``idle_bound``: the 3 s that the relay's claims allow between two of their own
#: statements (CLAIM_EVENTS_PLAN), for a ``CLAIM_SECONDS`` shorter than that (tests set 1 ms).
IDLE_FLOOR_SECONDS = 3.0


def idle_seconds(claim_seconds: float) -> float:
    """How long a transaction that runs subscribers on claimed rows (LOCK_CLAIMED_EVENTS,
    LOCK_CLAIMED_DELIVERIES) may stay idle: ``CLAIM_SECONDS``, after which the claim may be
    taken over anyway, and never below ``IDLE_FLOOR_SECONDS``. A subscriber that keeps it idle
    longer fails its delivery (``SubscriberTimedOut``)."""
    return max(claim_seconds, IDLE_FLOOR_SECONDS)


def idle_bound(claim_seconds: float) -> str:
    """``idle_seconds`` as an ``idle_in_transaction_session_timeout``."""
    return f"{math.ceil(idle_seconds(claim_seconds) * 1000)}ms"


def metric_name(subscriber: str, event_type: str) -> str:
    """``subscriber``, if registered for ``event_type`` here; else ``UNREGISTERED``."""
    if any(s.name == subscriber for s in subscribers_for(event_type)):
        return subscriber
    return UNREGISTERED


@dataclass(frozen=True)
class Claimed:
    """A claimed delivery: its row's id, subscriber, attempts and fencing token, and its event."""

    id: int
    subscriber: str
    attempts: int
    claimed_at: Any
    reclaimed: bool
    event: OutboxEvent


@dataclass(frozen=True)
class Finished:
    """A delivery's failed attempt, as RECORD_DELIVERY_FAILURES writes it."""

    claimed: Claimed
    outcome: subscribers.Delivery


class _Closed(Exception):
    """A subscriber closed the connection while a delivery ran: that one's failure is recorded
    apart, and the others run again."""

    def __init__(self, claimed: Claimed, error: subscribers.ClosedBySubscriber) -> None:
        super().__init__()
        self.claimed = claimed
        self.error = error


class DeliveryRunner:
    """Claims and runs due deliveries, when asked by the relay's loop (``run_once``).

    ``_next`` is when the next claim is due (``time.monotonic()``): at once after a claim that
    took any (the next delivery of each aggregate and subscriber may have become first); when
    the first delivery known to be due comes due (``_retry_at``: one the relay wrote, or one
    whose attempt failed here, after its back-off); else after the relay's poll interval. Never
    sooner than ``SPACING`` times the last claim's duration after it (``_earliest``): a claim
    reads every due delivery until it finds its batch, and deliveries waiting behind dead ones
    are due but never first (100,000 behind 1,000 dead ones made a claim that found nothing take
    0.9 s), so such a backlog costs the relay at most about a tenth of its time.
    """

    SPACING = 10.0

    def __init__(
        self,
        settings: OutboxSettings,
        *,
        relay_id: str,
        using: str,
        policy: RetrySettings,
    ) -> None:
        self.settings = settings
        self.relay_id = relay_id
        self.using = using
        self.policy = policy
        self._next = 0.0
        self._earliest = 0.0
        self._retry_at = math.inf
        #: The deliveries claimed and not yet run: a turn whose connection was lost runs them
        #: again, rather than leave them claimed until ``CLAIM_SECONDS``.
        self._batch: list[Claimed] = []

    def due(self, now: float) -> bool:
        return bool(self._batch) or now >= self._next

    def wait(self, now: float) -> float:
        """Seconds until the next claim is due."""
        return max(0.0, self._next - now)

    def expect(self, deliveries: Sequence[subscribers.Delivery]) -> None:
        """The relay wrote ``deliveries``: claim when the first of them is due."""
        delays = [d.delay for d in deliveries if not d.dead]
        if delays:
            self._retry_at = min(self._retry_at, time.monotonic() + min(delays))
            self._next = min(self._next, max(self._retry_at, self._earliest))

    def run_once(self) -> int:
        """Claim and run one batch of due deliveries (what is left of the last one, if it
        failed); return how many were claimed."""
        started = time.monotonic()
        if self._retry_at <= started:
            self._retry_at = math.inf  # this claim sees it
        claimed = self._batch = self._batch or self._claim()
        self._earliest = time.monotonic() + self.SPACING * (time.monotonic() - started)
        together = [c for c in claimed if not c.reclaimed]
        if together:
            self._deliver(together)
        for alone in [c for c in self._batch if c.reclaimed]:
            self._batch = [alone]  # the others are done: a failed turn resumes here
            self._deliver([alone])
        self._batch = []
        now = time.monotonic()
        soonest = now if claimed else min(now + self.settings.poll_interval, self._retry_at)
        self._next = max(soonest, self._earliest)
        return len(claimed)

    def _claim(self) -> list[Claimed]:
        params: dict[str, Any] = {
            "claim_seconds": self.settings.claim_seconds,
            "limit": self.settings.batch_size,
            "max_attempts": self.settings.max_attempts,
            "relay_id": self.relay_id,
            "crashed_code": DELIVERY_CRASHED,
            "dead_summary": DELIVERY_CRASHED_DEAD_SUMMARY,
            "summary": DELIVERY_CRASHED_SUMMARY,
        }
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            cursor.execute(queries.CLAIM_DELIVERIES, params)
            rows = cursor.fetchall()
        claimed = []
        for delivery_id, subscriber, attempts, claimed_at, reclaimed, spent, *row in rows:
            event = claimed_event(row, self.using)
            fields = {
                "event_id": str(event.id),
                "event_type": event.event_type,
                "subscriber": subscriber,
            }
            if spent:
                logger.error(
                    "event %s (%s) to %s: dead after %d attempts, the last one a relay that "
                    "stopped before finishing it (%s)",
                    event.id,
                    event.event_type,
                    subscriber,
                    attempts,
                    DELIVERY_CRASHED,
                    extra=fields,
                )
                self._count_one(subscriber, event.event_type, "dead")
                continue
            if reclaimed:
                logger.warning(
                    "event %s (%s) to %s: taken over from a relay that never finished it; "
                    "attempt %d/%d counted, delivered alone",
                    event.id,
                    event.event_type,
                    subscriber,
                    attempts,
                    self.settings.max_attempts,
                    extra=fields,
                )
            claimed.append(Claimed(delivery_id, subscriber, attempts, claimed_at, reclaimed, event))
        # Claimed in the order they became due; run in their events' order.
        claimed.sort(key=lambda c: (c.event.occurred_at, c.event.id, c.subscriber))
        return claimed

    def _deliver(self, items: Sequence[Claimed]) -> None:
        started = time.perf_counter()
        while items:
            try:
                self._deliver_batch(items)
                break
            except _Closed as closed:
                # The batch's transaction died with the connection: this delivery's failure is
                # recorded apart, and the others run again without it.
                self._record_apart(closed.claimed, closed.error)
                items = [c for c in items if c is not closed.claimed]
                self._batch = [c for c in self._batch if c is not closed.claimed]
        metrics.BATCH_DB_DURATION.observe(time.perf_counter() - started, role="relay")

    def _deliver_batch(self, items: Sequence[Claimed]) -> None:
        delivered: list[Claimed] = []
        failed: list[Finished] = []
        with transaction.atomic(using=self.using), deferred_enqueues(self.using) as jobs:
            held = self._lock(items)
            session_settings.arm(self.using)
            for item in items:
                if item.id not in held:
                    logger.warning(
                        "event %s to %s: delivery taken over by another relay; skipped",
                        item.event.id,
                        item.subscriber,
                        extra={"event_id": str(item.event.id), "subscriber": item.subscriber},
                    )
                    continue
                outcome = self._deliver_one(item, jobs)
                if outcome is None:
                    delivered.append(item)
                else:
                    failed.append(Finished(item, outcome))
            with server_side_cursor(self.using) as cursor:
                if delivered:
                    cursor.execute(queries.MARK_DELIVERED, [[c.id for c in delivered]])
                self._record(cursor, failed)
        for item in delivered:
            self._count_one(item.subscriber, item.event.event_type, "delivered")
        for finished in failed:
            item = finished.claimed
            self._count_one(item.subscriber, item.event.event_type, finished.outcome.outcome)
        self.expect([finished.outcome for finished in failed])

    def _record(self, cursor: Any, failed: Sequence[Finished]) -> None:
        if not failed:
            return
        cursor.execute(
            queries.RECORD_DELIVERY_FAILURES,
            {
                "ids": [f.claimed.id for f in failed],
                "dead": [f.outcome.dead for f in failed],
                "delays": [f.outcome.delay for f in failed],
                "codes": [f.outcome.code for f in failed],
                "errors": [f.outcome.error for f in failed],
                "counted": [f.claimed.reclaimed for f in failed],
            },
        )

    def _record_apart(self, item: Claimed, error: subscribers.ClosedBySubscriber) -> None:
        outcome = self._failed(item, error, error.code)
        with transaction.atomic(using=self.using):
            if self._lock([item]):
                with server_side_cursor(self.using) as cursor:
                    self._record(cursor, [Finished(item, outcome)])
        self._count_one(item.subscriber, item.event.event_type, outcome.outcome)
        self.expect([outcome])

    def _lock(self, items: Sequence[Claimed]) -> set[int]:
        with server_side_cursor(self.using) as cursor:
            cursor.execute(
                queries.LOCK_CLAIMED_DELIVERIES,
                [
                    idle_bound(self.settings.claim_seconds),
                    [c.id for c in items],
                    [c.claimed_at for c in items],
                    self.relay_id,
                ],
            )
            return {row[0] for row in cursor.fetchall()}

    def _deliver_one(self, item: Claimed, jobs: DeferredEnqueues) -> subscribers.Delivery | None:
        """Run ``item``'s subscriber in a savepoint, its jobs written there; its failure, if
        any (``run_alone``, as the relay's isolated runs)."""
        event = item.event
        projection = _registered(event.event_type, item.subscriber)
        if projection is None:
            error = UnknownSubscriber(
                f"no subscriber {item.subscriber!r} of {event.event_type!r} is registered in "
                "this process (renamed, removed, or not deployed here yet)"
            )
            return self._failed(item, error, subscribers.UNKNOWN_SUBSCRIBER)
        if event.schema_version not in projection.versions:
            return subscribers.refused(event, item.subscriber)
        try:
            failure = run_alone(
                projection,
                event,
                jobs,
                self.using,
                flush=True,
                idle_seconds=idle_seconds(self.settings.claim_seconds),
            )
        except subscribers.ClosedBySubscriber as closed:
            raise _Closed(item, closed) from closed
        return None if failure is None else self._failed(item, *failure)

    def _failed(self, item: Claimed, error: BaseException, code: str) -> subscribers.Delivery:
        # ``attempts`` counts the failures before this one; for a delivery taken over, this
        # very run too: the claim counted it (CLAIM_DELIVERIES).
        return subscribers.failed(
            item.event,
            item.subscriber,
            error,
            code,
            attempt=item.attempts if item.reclaimed else item.attempts + 1,
            max_attempts=self.settings.max_attempts,
            policy=self.policy,
        )

    def _count_one(self, subscriber: str, event_type: str, outcome: str) -> None:
        metrics.DELIVERIES.inc(subscriber=metric_name(subscriber, event_type), outcome=outcome)


def _registered(event_type: str, name: str) -> Subscriber | None:
    for projection in subscribers_for(event_type):
        if projection.name == name:
            return projection
    return None
