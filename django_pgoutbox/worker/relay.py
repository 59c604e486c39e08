"""The outbox relay: claim a batch of facts, project each through its subscribers, exactly once.

One loop, one thread, one database connection. Each turn:

1. claims up to ``OUTBOX['BATCH_SIZE']`` events with the source text's ``FOR UPDATE SKIP LOCKED``
   claim (a lease: ``claimed_at``/``claimed_by``, taken over after ``CLAIM_SECONDS``), only the
   earliest unprocessed event of each aggregate, so an aggregate's events go one at a time, in
   order; mostly from the mark of the last claim on (``EventSeekPolicy``), so that a held xmin
   horizon does not make it step over every event projected since. Of the events whose last
   claim expired unfinished (their relay died or stalled, maybe because of one of them), it
   claims at most one, counting it an attempt in the claim itself: that *suspect* is projected
   alone, after the others, in a transaction of its own (steps 2 to 4), so that a subscriber
   that kills its process (``os._exit()``, a crash in native code, the OOM killer) takes no
   innocent event down with it again, and ends dead (``relay_crashed``) after ``MAX_ATTEMPTS``
   of them;
2. opens one transaction for the batch and locks the events it still holds (the fence);
3. runs each event's subscribers (what they enqueue or write joins the transaction; the jobs
   they enqueue without an idempotency key are written together, in one statement) and marks
   the events processed. A subscriber that raises (anything but ``KeyboardInterrupt``:
   ``SystemExit`` too), or whose jobs cannot be written, rolls back its own work only: the batch
   is first tried without savepoints (two round trips fewer per subscriber); if anything fails,
   that attempt is rolled back whole and the batch runs again with a savepoint per subscriber
   of each event. The event is processed all the same, and the failing subscriber gets a
   *delivery* of it (``outbox_deliveries``), retried on its own with back-off, dead after
   ``MAX_ATTEMPTS``. A subscriber that does not accept the event's schema version gets a dead
   delivery; one whose earlier delivery of the aggregate still waits, a delivery that waits
   behind it (each subscriber sees an aggregate's events in order);
4. commits: the subscribers' jobs, the deliveries and the ``processed_at`` marks land together.
   A relay killed at any line leaves each event either unprocessed with no jobs, or processed
   with the jobs of the subscribers that ran and a delivery for each of the others;
5. between batches, claims and runs the deliveries that are due (``worker.deliveries``).

The relay's own connection lost anywhere in a turn abandons the batch (rolled back, no failure
recorded: ``attempts`` counts failures and takeovers, not claims); the loop reconnects after a
back-off and projects what is left of the same batch again. Any other error that escapes a
turn is logged and retried after a back-off too; only the same error ``SAME_FAILURE_LIMIT``
times in a row (a table gone, say) stops the loop, and with it the worker, so that its
supervisor sees it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from django_pgoutbox import metrics, queries, session_settings
from django_pgoutbox.conf import OutboxSettings, RetrySettings
from django_pgoutbox.db import (
    ERROR_BACKOFF,
    ErrorKind,
    classify_error,
    ended_idle_in_transaction,
    server_side_cursor,
)
from django_pgoutbox.enqueueing import DeferredEnqueues, deferred_enqueues
from django_pgoutbox.models import OutboxEvent
from django_pgoutbox.retry import summarize
from django_pgoutbox.worker import subscribers
from django_pgoutbox.worker.deliveries import (
    ConnectionLost,
    DeliveryRunner,
    claimed_event,
    connection_lost,
    idle_bound,
    idle_seconds,
    metric_name,
    run_alone,
    write_deliveries,
)
from django_pgoutbox.worker.seek import SeekPolicy

logger = logging.getLogger("django_pgoutbox.relay")

#: A turn that fails with the same unexpected error this many times in a row stops the relay
#: (about 6 s of back-off): a schema gone, not a passing fault. Lost connections never do.
SAME_FAILURE_LIMIT = 5

#: ``last_error_code`` of an event taken over from a relay that never finished it (see
#: ``queries.CLAIM_EVENTS``), and the summaries the claim writes: counted, or dead.
RELAY_CRASHED = "relay_crashed"
RELAY_CRASHED_SUMMARY = (
    "the relay projecting this event stopped before finishing it (its process was killed: "
    "os._exit() or a crash in a subscriber, the OOM killer, a SIGKILL; or it stalled past "
    "OUTBOX['CLAIM_SECONDS']); counted as an attempt, and projected alone next"
)
RELAY_CRASHED_DEAD_SUMMARY = (
    "dead after OUTBOX['MAX_ATTEMPTS'] attempts; at the last one, the relay projecting this "
    "event stopped before finishing it, as when a subscriber kills its process (os._exit(), a "
    "crash in native code, the OOM killer)"
)


class EventSeekPolicy(SeekPolicy):
    """When the relay claims from its mark (SEEK_CLAIM_EVENTS), and when it runs the full claim
    (CLAIM_EVENTS): ``SeekPolicy``'s rules, with the relay's own mark.

    The mark is the ``(occurred_at, id)`` of the *first* event the last claim took, not the last:
    the events that claim skipped because an earlier event of their aggregate was in the batch
    sort after it, and the next seek takes them once the batch is projected. It never moves back:
    a full claim that took older events (retries, late commits, takeovers) leaves it where it
    was, and what those events held back waits for the next full claim.
    """

    MARK_NAMES = ("mark_occurred_at", "mark_id")

    def mark_of(self, rows: Sequence[Any]) -> tuple[Any, ...]:
        first = min((row.occurred_at, row.id) for row in rows)
        return first if self.mark is None else max(self.mark, first)


#: After a batch whose first pass failed, the batches of the next seconds start at the second
#: pass: with a subscriber failing 1% of 500-event batches, nearly every first pass would fail.
SEGMENTED_SECONDS = 5.0

#: Events the second pass runs between two savepoints: a subscriber that fails there costs a
#: rerun of at most this many events' subscribers, and a batch of 500 events 16 savepoints.
SEGMENT = 32


class _SubscriberFailed(Exception):
    """A subscriber of ``event_id`` raised while it ran without a savepoint of its own."""

    def __init__(self, event_id: uuid.UUID) -> None:
        super().__init__()
        self.event_id = event_id


class _Unwritable(Exception):
    """The jobs of the batch, written together, could not be written (a data error)."""


class Relay:
    """Projects outbox events until stopped (or, in burst mode, until none is claimable)."""

    def __init__(
        self,
        settings: OutboxSettings,
        *,
        relay_id: str,
        using: str,
        policy: RetrySettings,
        burst: bool = False,
    ) -> None:
        self.settings = settings
        self.relay_id = relay_id
        self.using = using
        self.policy = policy
        self.burst = burst
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.finished = threading.Event()
        #: The events claimed and not yet projected: a turn that failed (its connection lost)
        #: projects them again, rather than leave them claimed until ``CLAIM_SECONDS``; and the
        #: ids of those among them to project alone (taken over from a relay that never
        #: finished them). Read and written by the loop's thread only.
        self._batch: list[OutboxEvent] = []
        self._suspects: set[uuid.UUID] = set()
        #: Per claimed event, the subscribers whose earlier delivery of its aggregate waits
        #: (the claim's last column): their delivery of it waits too, in order.
        self._waiting: dict[uuid.UUID, frozenset[str]] = {}
        #: Until when batches skip the pass without savepoints (``SEGMENTED_SECONDS``).
        self._segmented_until = 0.0
        #: The subscribers' deliveries of past events (``outbox_deliveries``): claimed and run
        #: by this loop's thread too, between its batches of events.
        self.deliveries = DeliveryRunner(settings, relay_id=relay_id, using=using, policy=policy)
        #: Where the next claim starts; and whether the last one was a seek (an empty seek
        #: says nothing of the events behind the mark: the full claim looks before sleeping).
        self.seek = EventSeekPolicy()
        self._sought = False

    def wake(self, _payload: str = "") -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def run(self) -> None:
        pause = ERROR_BACKOFF[0]
        last_failure, repeats = "", 0
        try:
            while not self._stopping.is_set():
                if self._wake.is_set():
                    # A publication: its event may sort behind the mark (a transaction that
                    # began before the mark's event and committed after it).
                    self.seek.behind()
                    self._wake.clear()
                try:
                    claimed = self.run_once()
                    pause = ERROR_BACKOFF[0]
                    last_failure, repeats = "", 0
                except Exception as error:
                    self._close_quietly()
                    if ended_idle_in_transaction(error):
                        # The server ended the session, idle inside a transaction past its
                        # bound, and no subscriber kept it silent that long (that one fails its
                        # delivery, subscriber_timeout): the relay was cut off from the server
                        # (a partition) or stalled. Projecting the same batch again at once
                        # could end the same way: leave it to its claim's expiry, after which
                        # its events are taken over one at a time, each attempt counted.
                        logger.warning(
                            "relay: database unavailable (the server ended the session, idle "
                            "inside a transaction for longer than its "
                            "idle_in_transaction_session_timeout: cut off from the server, or "
                            "stalled); the %d events it held are left to their claim's expiry "
                            "(OUTBOX['CLAIM_SECONDS']), then projected one by one",
                            len(self._batch),
                        )
                        self._batch = []
                        self._suspects.clear()
                        self._waiting.clear()
                    elif isinstance(error, ConnectionLost) or (
                        classify_error(error) is ErrorKind.CONNECTION
                    ):
                        logger.warning(
                            "relay: database unavailable (%s); retrying in %.1fs",
                            summarize(error.__cause__ or error),
                            pause,
                        )
                    else:
                        failure = summarize(error)
                        repeats = repeats + 1 if failure == last_failure else 1
                        last_failure = failure
                        if repeats >= SAME_FAILURE_LIMIT:
                            raise
                        logger.error(
                            "relay: turn failed (%s, %d time(s) in a row); retrying in %.1fs",
                            failure,
                            repeats,
                            pause,
                            exc_info=error,
                        )
                    self._stopping.wait(pause)
                    pause = min(pause * 2, ERROR_BACKOFF[1])
                    continue
                if claimed:
                    # More may be waiting, and projecting this batch made the next event of
                    # each of its aggregates claimable: claim again before sleeping.
                    continue
                if self._sought:
                    # Nothing past the mark: the full claim, as soon as its spacing allows.
                    self._wake.wait(max(0.0, self.seek.earliest_full - time.monotonic()))
                    continue
                if self.burst:
                    return
                self._wake.wait(
                    min(self.settings.poll_interval, self.deliveries.wait(time.monotonic()))
                )
        finally:
            self._close_quietly()
            self.finished.set()

    def _close_quietly(self) -> None:
        """Close the connection, which may be broken already, so that the next turn opens one."""
        try:
            connections[self.using].close()
        except Exception:
            logger.debug("relay: closing a broken connection failed", exc_info=True)

    def run_once(self) -> int:
        """Claim and project one batch (what is left of the last one, if it failed); return
        how many events it held."""
        events = self._batch = self._batch or self._claim()
        together = [e for e in events if e.id not in self._suspects]
        if together:
            self._project(together)
        for suspect in [e for e in self._batch if e.id in self._suspects]:
            self._batch = [suspect]  # the others are done: a failed turn resumes here
            self._project([suspect])
        self._batch = []
        self._suspects.clear()
        self._waiting.clear()
        done = len(events)
        if self.burst or self.deliveries.due(time.monotonic()):
            done += self.deliveries.run_once()
        return done

    def _claim(self) -> list[OutboxEvent]:
        limit = self.settings.batch_size
        params: dict[str, Any] = {
            "claim_seconds": self.settings.claim_seconds,
            "limit": limit,
            "max_attempts": self.settings.max_attempts,
            "relay_id": self.relay_id,
            "crashed_code": RELAY_CRASHED,
            "dead_summary": RELAY_CRASHED_DEAD_SUMMARY,
            "summary": RELAY_CRASHED_SUMMARY,
        }
        seek = self._sought = self.seek.seek(time.monotonic())
        if seek:
            params |= self.seek.params()
        started = time.perf_counter()
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            cursor.execute(queries.CLAIM_EVENTS_PLAN)
            cursor.execute(queries.SEEK_CLAIM_EVENTS if seek else queries.CLAIM_EVENTS, params)
            rows = cursor.fetchall()
        seconds = time.perf_counter() - started
        events, taken = [], []
        for *row, claimed_at, reclaimed, spent, waiting in rows:
            event = claimed_event(row, self.using, claimed_at=claimed_at, claimed_by=self.relay_id)
            taken.append(event)
            if waiting:
                self._waiting[event.id] = frozenset(waiting)
            if spent:
                self._crashed_out(event)
                continue
            if reclaimed:
                self._suspects.add(event.id)
                logger.warning(
                    "event %s (%s): taken over from a relay that never finished it; attempt "
                    "%d/%d counted, projected alone",
                    event.id,
                    event.event_type,
                    event.attempts,
                    self.settings.max_attempts,
                    extra={"event_id": str(event.id), "event_type": event.event_type},
                )
            events.append(event)
        self.seek.claimed(taken, limit, full=not seek, seconds=seconds, now=time.monotonic())
        # The claim is ordered by (occurred_at, id); UPDATE ... RETURNING is not.
        events.sort(key=lambda e: (e.occurred_at, e.id))
        return events

    def _crashed_out(self, event: OutboxEvent) -> None:
        """``event`` was dead in the claim: its relays kept dying before finishing it."""
        logger.error(
            "event %s (%s): dead after %d attempts, the last one a relay that stopped before "
            "finishing it (%s)",
            event.id,
            event.event_type,
            event.attempts,
            RELAY_CRASHED,
            extra={"event_id": str(event.id), "event_type": event.event_type},
        )
        metrics.EVENTS_PROJECTED.inc(event_type=event.event_type, outcome="dead")

    def _project(self, events: Sequence[OutboxEvent]) -> None:
        started = time.perf_counter()
        while events:
            try:
                self._project_passes(events)
                break
            except subscribers.ClosedBySubscriber as closed:
                # The batch's transaction died with the connection. That event's deliveries are
                # written apart, and the rest of the batch projected again without it.
                self._record_apart(closed)
                events = [e for e in events if e is not closed.event]
                self._batch = [e for e in self._batch if e is not closed.event]
        metrics.BATCH_DB_DURATION.observe(time.perf_counter() - started, role="relay")

    def _record_apart(self, closed: subscribers.ClosedBySubscriber) -> None:
        """In a transaction of its own, if its claim is still held: mark the event whose
        subscriber closed the connection processed, with a failed delivery for that subscriber
        and a waiting one for each other subscriber (nothing of theirs was kept either)."""
        event = closed.event
        plan = subscribers.plan(event, self._waiting.get(event.id, ()))
        deliveries = list(plan.deliveries)
        for projection in plan.runnable:
            if projection.name == closed.subscriber:
                deliveries.append(self._failed(event, projection.name, closed, closed.code))
            else:
                deliveries.append(subscribers.waiting_delivery(event, projection.name))
        with transaction.atomic(using=self.using):
            if not self._lock([event]):
                return
            with server_side_cursor(self.using) as cursor:
                cursor.execute(queries.MARK_EVENTS_PROCESSED, [[event.id]])
                write_deliveries(cursor, deliveries)
        self._count([event], deliveries)

    def _project_passes(self, events: Sequence[OutboxEvent]) -> None:
        """Project ``events`` in one transaction, in up to three passes.

        1. No savepoint at all: the fast path, when every subscriber succeeds (skipped for
           ``SEGMENTED_SECONDS`` after a batch whose first pass failed).
        2. If a subscriber raised, the batch is rolled back whole and run again in segments of
           ``SEGMENT`` events, each in a savepoint, the failing event's subscribers each in a
           savepoint of its own (so only its failing subscriber's work is undone, and it gets a
           delivery). Another subscriber that raises there rolls back its segment only, which
           runs again with that event's subscribers in savepoints too; after a second failure
           in one segment, with all of its events' subscribers in savepoints.
        3. If the jobs of the batch, written together at the end, could not be written (a data
           error), every subscriber again in a savepoint of its own, its jobs written there, so
           that the failing statement is that subscriber's alone.
        """
        try:
            if time.monotonic() < self._segmented_until:
                self._project_batch(events, suspects=set(), flush_each=False)
                return
            try:
                self._project_batch(events, suspects=None, flush_each=False)
            except _SubscriberFailed as failed:
                # While subscribers keep failing, most batches would fail their first pass:
                # the next ones start at the second.
                self._segmented_until = time.monotonic() + SEGMENTED_SECONDS
                self._project_batch(events, suspects={failed.event_id}, flush_each=False)
        except _Unwritable:
            self._project_batch(events, suspects={e.id for e in events}, flush_each=True)

    def _project_batch(
        self, events: Sequence[OutboxEvent], *, suspects: set[uuid.UUID] | None, flush_each: bool
    ) -> None:
        """One pass (see ``_project_passes``): without savepoints when ``suspects`` is None,
        else in segments, the subscribers of the events in ``suspects`` (which grows) each in
        a savepoint."""
        processed: list[OutboxEvent] = []
        deliveries: list[subscribers.Delivery] = []
        with (
            transaction.atomic(using=self.using),
            deferred_enqueues(self.using) as jobs,
        ):
            held = self._lock(events)
            session_settings.arm(self.using)
            for event in events:
                if event.id not in held:
                    logger.warning(
                        "event %s: claim taken over by another relay; skipped",
                        event.id,
                        extra={"event_id": str(event.id), "event_type": event.event_type},
                    )
            todo = [event for event in events if event.id in held]
            if suspects is None:
                for event in todo:
                    self._run_event(event, jobs, deliveries, alone=False, flush=False)
                processed = todo
            else:
                self._run_segments(todo, jobs, suspects, processed, deliveries, flush=flush_each)
            if todo:
                session_settings.restore(self.using, f"a subscriber of {len(todo)} events")
            if not flush_each:
                try:
                    jobs.flush()  # the jobs the subscribers enqueued: one statement for the batch
                except Exception as error:
                    if classify_error(error) is ErrorKind.DATA and not connection_lost(self.using):
                        raise _Unwritable from error
                    raise
            with server_side_cursor(self.using) as cursor:
                if processed:
                    cursor.execute(queries.MARK_EVENTS_PROCESSED, [[e.id for e in processed]])
                write_deliveries(cursor, deliveries)
        # Counted once committed: a batch abandoned (its connection lost) is projected again.
        self._count(processed, deliveries)

    def _run_segments(
        self,
        events: Sequence[OutboxEvent],
        jobs: DeferredEnqueues,
        suspects: set[uuid.UUID],
        processed: list[OutboxEvent],
        deliveries: list[subscribers.Delivery],
        *,
        flush: bool,
    ) -> None:
        start, failed_before = 0, False
        while start < len(events):
            segment = events[start : start + SEGMENT]
            mark = jobs.mark()
            done: list[subscribers.Delivery] = []
            try:
                with transaction.atomic(using=self.using):  # a savepoint: this segment
                    for event in segment:
                        alone = event.id in suspects
                        self._run_event(event, jobs, done, alone=alone, flush=flush)
            except _SubscriberFailed as failed:
                # Rolled back to the segment's start. Again, with that event's subscribers each
                # in a savepoint; after a second failure in the segment, every event's: so a
                # segment runs three times at most, however many of its events fail.
                jobs.discard_from(mark)
                suspects.add(failed.event_id)
                if failed_before:
                    suspects.update(event.id for event in segment)
                failed_before = True
                continue
            processed.extend(segment)
            deliveries.extend(done)
            start, failed_before = start + len(segment), False

    def _run_event(
        self,
        event: OutboxEvent,
        jobs: DeferredEnqueues,
        deliveries: list[subscribers.Delivery],
        *,
        alone: bool,
        flush: bool,
    ) -> None:
        """Run ``event``'s subscribers; add the deliveries of those that did not run or (when
        each runs ``alone``, in a savepoint) failed. Without savepoints, a subscriber that
        raises raises ``_SubscriberFailed``."""
        plan = subscribers.plan(event, self._waiting.get(event.id, ()))
        deliveries.extend(plan.deliveries)
        idle = idle_seconds(self.settings.claim_seconds)
        for projection in plan.runnable:
            if alone:
                failure = run_alone(
                    projection, event, jobs, self.using, flush=flush, idle_seconds=idle
                )
                if failure is not None:
                    deliveries.append(self._failed(event, projection.name, *failure))
                continue
            try:
                subscribers.run_one(projection, event, self.using, idle)
            except subscribers.SubscriberRaised as raised:
                if connection_lost(self.using):
                    raise ConnectionLost from raised.error
                raise _SubscriberFailed(event.id) from raised.error

    def _count(
        self, processed: Sequence[OutboxEvent], deliveries: Sequence[subscribers.Delivery]
    ) -> None:
        for event in processed:
            metrics.EVENTS_PROJECTED.inc(event_type=event.event_type, outcome="processed")
        types = {event.id: event.event_type for event in processed}
        for delivery in deliveries:
            name = metric_name(delivery.subscriber, types[delivery.event_id])
            metrics.DELIVERIES.inc(subscriber=name, outcome=delivery.outcome)
        self.deliveries.expect(deliveries)

    def _lock(self, events: Sequence[OutboxEvent]) -> set[uuid.UUID]:
        with server_side_cursor(self.using) as cursor:
            cursor.execute(
                queries.LOCK_CLAIMED_EVENTS,
                [
                    idle_bound(self.settings.claim_seconds),
                    [e.id for e in events],
                    [e.claimed_at for e in events],
                    self.relay_id,
                ],
            )
            return {row[0] for row in cursor.fetchall()}

    def _failed(
        self, event: OutboxEvent, subscriber: str, error: BaseException, code: str
    ) -> subscribers.Delivery:
        return subscribers.failed(
            event,
            subscriber,
            error,
            code,
            attempt=1,
            max_attempts=self.settings.max_attempts,
            policy=self.policy,
        )
