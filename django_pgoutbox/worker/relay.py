"""The outbox relay: claim a batch of facts, project each through its subscribers, exactly once.

One loop, one thread, one database connection. Each turn:

1. claims up to ``OUTBOX['BATCH_SIZE']`` events with the source text's ``FOR UPDATE SKIP LOCKED``
   claim (a lease: ``claimed_at``/``claimed_by``, taken over after ``CLAIM_SECONDS``), only the
   earliest unprocessed event of each aggregate, so an aggregate's events go one at a time, in
   order;
2. opens one transaction for the batch and locks the events it still holds (the fence);
3. runs each event's subscribers (what they enqueue or write joins the transaction; the jobs
   they enqueue without an idempotency key are written together, in one statement) and marks
   the events processed. A subscriber that raises rolls back that event's work only: the
   batch is first tried without savepoints (two round trips fewer per event); if anything
   raises, that attempt is rolled back whole and the batch runs again with a savepoint per
   event. The failing event is retried later with backoff, or dead after ``MAX_ATTEMPTS``;
4. commits: the subscribers' jobs and the ``processed_at`` marks land together. A relay killed
   at any line leaves each event either unprocessed with no jobs, or processed with its jobs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import InterfaceError, OperationalError, connections, transaction

from django_pgoutbox import metrics, queries
from django_pgoutbox.conf import OutboxSettings, RetrySettings
from django_pgoutbox.db import server_side_cursor
from django_pgoutbox.jobs import deferred_enqueues
from django_pgoutbox.models import OutboxEvent, saved_instance
from django_pgoutbox.outbox import subscribers_for
from django_pgoutbox.retry import backoff, bound, error_code, summarize

logger = logging.getLogger("django_pgoutbox.relay")

ERROR_BACKOFF = (0.2, 10.0)


class _SubscriberFailed(Exception):
    """A subscriber raised while the batch ran without savepoints."""


@dataclass(frozen=True)
class _Failure:
    event_id: uuid.UUID
    dead: bool
    delay: float
    code: str
    error: str


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

    def wake(self, _payload: str = "") -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def run(self) -> None:
        pause = ERROR_BACKOFF[0]
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                try:
                    claimed = self.run_once()
                    pause = ERROR_BACKOFF[0]
                except (OperationalError, InterfaceError) as error:
                    logger.warning(
                        "relay: database unavailable (%s); retrying in %.1fs", error, pause
                    )
                    connections[self.using].close()
                    self._stopping.wait(pause)
                    pause = min(pause * 2, ERROR_BACKOFF[1])
                    continue
                if claimed:
                    # More may be waiting, and projecting this batch made the next event of
                    # each of its aggregates claimable: claim again before sleeping.
                    continue
                if self.burst:
                    return
                self._wake.wait(self.settings.poll_interval)
        finally:
            connections[self.using].close()
            self.finished.set()

    def run_once(self) -> int:
        """Claim and project one batch; return how many events were claimed."""
        events = self._claim()
        if events:
            self._project(events)
        return len(events)

    def _claim(self) -> list[OutboxEvent]:
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            cursor.execute(queries.CLAIM_EVENTS_PLAN)
            cursor.execute(
                queries.CLAIM_EVENTS,
                [self.settings.claim_seconds, self.settings.batch_size, self.relay_id],
            )
            rows = cursor.fetchall()
        names = [
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
            "claimed_at",
        ]
        events = []
        for row in rows:
            values = dict(zip(names, row, strict=True))
            values["payload"] = json.loads(values["payload"])
            values["claimed_by"] = self.relay_id
            events.append(saved_instance(OutboxEvent, self.using, values))
        # The claim is ordered by (occurred_at, id); UPDATE ... RETURNING is not.
        events.sort(key=lambda e: (e.occurred_at, e.id))
        return events

    def _project(self, events: Sequence[OutboxEvent]) -> None:
        started = time.perf_counter()
        try:
            self._project_batch(events, isolate=False)
        except _SubscriberFailed:
            # Rolled back whole: nothing of the batch was written. Again, event by event.
            self._project_batch(events, isolate=True)
        metrics.BATCH_DB_DURATION.observe(time.perf_counter() - started, role="relay")

    def _project_batch(self, events: Sequence[OutboxEvent], *, isolate: bool) -> None:
        processed: list[uuid.UUID] = []
        failures: list[_Failure] = []
        with (
            transaction.atomic(using=self.using),
            deferred_enqueues(self.using) as jobs,
        ):
            held = self._lock(events)
            for event in events:
                if event.id not in held:
                    logger.warning(
                        "event %s: claim taken over by another relay; skipped",
                        event.id,
                        extra={"event_id": str(event.id), "event_type": event.event_type},
                    )
                    continue
                if isolate:
                    mark = jobs.mark()
                    failure = self._project_one(event)
                    if failure is not None:
                        jobs.discard_from(mark)
                else:
                    failure = self._check_versions(event)
                    if failure is None:
                        try:
                            for projection in subscribers_for(event.event_type):
                                projection(event)
                        except Exception as error:
                            raise _SubscriberFailed from error
                if failure is None:
                    processed.append(event.id)
                else:
                    failures.append(failure)
            jobs.flush()  # the jobs the subscribers enqueued: one statement for the batch
            types = {event.id: event.event_type for event in events}
            for event_id in processed:
                metrics.EVENTS_PROJECTED.inc(event_type=types[event_id], outcome="processed")
            for failure in failures:
                metrics.EVENTS_PROJECTED.inc(
                    event_type=types[failure.event_id],
                    outcome="dead" if failure.dead else "retrying",
                )
            with server_side_cursor(self.using) as cursor:
                if processed:
                    cursor.execute(queries.MARK_EVENTS_PROCESSED, [processed])
                if failures:
                    cursor.execute(
                        queries.RECORD_EVENT_FAILURES,
                        [
                            [f.event_id for f in failures],
                            [f.dead for f in failures],
                            [f.delay for f in failures],
                            [f.code for f in failures],
                            [f.error for f in failures],
                        ],
                    )

    def _lock(self, events: Sequence[OutboxEvent]) -> set[uuid.UUID]:
        with server_side_cursor(self.using) as cursor:
            cursor.execute(
                queries.LOCK_CLAIMED_EVENTS,
                [[e.id for e in events], [e.claimed_at for e in events], self.relay_id],
            )
            return {row[0] for row in cursor.fetchall()}

    def _check_versions(self, event: OutboxEvent) -> _Failure | None:
        refusing = [
            s.name
            for s in subscribers_for(event.event_type)
            if event.schema_version not in s.versions
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
        return _Failure(event.id, True, 0.0, "unsupported_schema_version", bound(message))

    def _project_one(self, event: OutboxEvent) -> _Failure | None:
        extra = {
            "event_id": str(event.id),
            "event_type": event.event_type,
            "attempt": event.attempts + 1,
        }
        refused = self._check_versions(event)
        if refused is not None:
            return refused
        try:
            with transaction.atomic(using=self.using):  # a savepoint: this event only
                for projection in subscribers_for(event.event_type):
                    projection(event)
        except Exception as error:
            attempt = event.attempts + 1  # ``attempts`` counts the failures before this one
            dead = attempt >= self.settings.max_attempts
            delay = 0.0 if dead else backoff(attempt, self.policy)
            logger.error(
                "event %s (%s) attempt %d/%d: %s -> %s",
                event.id,
                event.event_type,
                attempt,
                self.settings.max_attempts,
                summarize(error),
                "dead" if dead else f"retry in {delay:.1f}s",
                exc_info=error,
                extra=extra,
            )
            return _Failure(event.id, dead, delay, bound(error_code(error), 200), summarize(error))
        return None
