"""Per-subscriber delivery: a failing subscriber fails its own delivery of an event, never the
other subscribers' work, and each subscriber sees an aggregate's events in order.

Two subscribers of ``tests.two``: ``healthy`` records every event it sees; ``flaky`` records it
too, then raises while ``broken`` (a set of sequences) holds the event's sequence.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgoutbox import enqueue, publish, subscriber
from django_pgoutbox.conf import get_settings
from django_pgoutbox.maintenance import prune
from django_pgoutbox.models import Job, OutboxDelivery, OutboxEvent
from django_pgoutbox.outbox import unregister_subscriber
from django_pgoutbox.worker.relay import SEGMENT, SEGMENTED_SECONDS, Relay

HEALTHY = "tests.deliveries.healthy"
FLAKY = "tests.deliveries.flaky"

#: What each subscriber saw, in order: (subscriber, aggregate, sequence). Rolled back work is
#: not kept: each entry is written to the database too (a job per run), and the test compares
#: the two where it matters.
seen: list[tuple[str, uuid.UUID, int]] = []
broken: set[int] = set()
closing: set[int] = set()


@pytest.fixture
def two_subscribers(registry: None) -> None:
    seen.clear()
    broken.clear()
    closing.clear()

    @subscriber("tests.two", name=HEALTHY)
    def healthy(event: OutboxEvent) -> None:
        seen.append((HEALTHY, event.aggregate_id, event.payload["n"]))
        enqueue("tests.noop", {"by": HEALTHY, "event": str(event.id)})

    @subscriber("tests.two", name=FLAKY)
    def flaky(event: OutboxEvent) -> None:
        seen.append((FLAKY, event.aggregate_id, event.payload["n"]))
        enqueue("tests.noop", {"by": FLAKY, "event": str(event.id)})
        if event.payload["n"] in closing:
            close_old_connections()
        if event.payload["n"] in broken:
            raise RuntimeError(f"flaky cannot take {event.payload['n']}")


def event(n: int, aggregate: uuid.UUID | None = None) -> OutboxEvent:
    return publish(
        "tests.two", aggregate_type="t", aggregate_id=aggregate or uuid.uuid4(), payload={"n": n}
    )


def relay(**overrides: Any) -> Relay:
    conf = get_settings()
    outbox = conf.outbox
    if overrides:
        from dataclasses import replace

        outbox = replace(outbox, **overrides)
    return Relay(outbox, relay_id="relay-1", using="default", policy=conf.retry, burst=True)


def jobs_by(name: str) -> list[str]:
    """The events whose job by ``name`` committed, in the order the jobs were written."""
    return list(
        Job.objects.filter(payload__by=name)
        .order_by("created_at", "id")
        .values_list("payload__event", flat=True)
    )


def fast_retries(settings: Any, **outbox: Any) -> None:
    settings.PGOUTBOX = {
        **settings.PGOUTBOX,
        "RETRY": {"BASE_DELAY": 0.001, "MAX_DELAY": 0.001, "JITTER": 0},
        "OUTBOX": {"MAX_ATTEMPTS": 3, **outbox},
    }


@pytest.mark.django_db(transaction=True)
class TestPerSubscriber:
    def test_the_fast_path_writes_no_delivery(self, two_subscribers: None) -> None:
        events = [event(n) for n in range(5)]
        with CaptureQueriesContext(connection) as captured:
            relay().run()
        assert not any("outbox_deliveries (" in q["sql"] for q in captured.captured_queries)
        assert not OutboxDelivery.objects.exists()
        assert (
            sorted(jobs_by(HEALTHY)) == sorted(jobs_by(FLAKY)) == sorted(str(e.id) for e in events)
        )

    def test_a_failing_subscriber_fails_its_delivery_only(
        self, two_subscribers: None, settings: Any
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        broken.add(1)
        events = [event(n) for n in range(3)]
        relay().run()
        assert all(e.processed_at for e in OutboxEvent.objects.all())
        # The healthy subscriber's work for the failing event committed; the flaky one's did not.
        assert sorted(jobs_by(HEALTHY)) == sorted(str(e.id) for e in events)
        assert sorted(jobs_by(FLAKY)) == sorted(str(events[n].id) for n in (0, 2))
        failing = OutboxDelivery.objects.get()
        assert (failing.event_id, failing.subscriber, failing.attempts) == (events[1].id, FLAKY, 1)
        assert (failing.last_error_code, failing.state) == ("RuntimeError", "failing")
        assert "flaky cannot take 1" in (failing.last_error or "")
        assert failing.available_at > timezone.now() + timedelta(seconds=100)
        assert (failing.aggregate_id, failing.occurred_at) == (
            events[1].aggregate_id,
            events[1].occurred_at,
        )

    def test_order_holds_per_subscriber_and_a_dead_delivery_holds_back_only_its_own(
        self, two_subscribers: None, settings: Any
    ) -> None:
        fast_retries(settings)
        aggregate = uuid.uuid4()
        broken.add(1)
        first = event(1, aggregate)
        later = [event(n, aggregate) for n in (2, 3)]
        elsewhere = event(4)
        for _ in range(4):
            relay().run()
        # The healthy subscriber's work for the aggregate's three events committed, in order.
        mine = [str(e.id) for e in [first, *later]]
        assert [e for e in jobs_by(HEALTHY) if e in mine] == mine
        assert str(elsewhere.id) in jobs_by(HEALTHY)
        # The flaky one: its first delivery dead, the later ones waiting behind it.
        states = dict(
            OutboxDelivery.objects.filter(subscriber=FLAKY).values_list("event_id", "attempts")
        )
        assert states == {first.id: 3, later[0].id: 0, later[1].id: 0}
        assert OutboxDelivery.objects.get(event_id=first.id).state == "dead"
        assert {OutboxDelivery.objects.get(event_id=e.id).state for e in later} == {"waiting"}
        assert jobs_by(FLAKY) == [str(elsewhere.id)]
        # Fixed, and re-driven: the flaky subscriber catches up, in order.
        broken.clear()
        seen.clear()
        OutboxDelivery.objects.filter(event_id=first.id).update(dead_at=None, attempts=0)
        relay().run()
        assert [n for (name, _, n) in seen if name == FLAKY] == [1, 2, 3]
        assert not OutboxDelivery.objects.filter(delivered_at__isnull=True).exists()
        assert sorted(jobs_by(FLAKY)) == sorted(str(e.id) for e in [first, *later, elsewhere])

    def test_a_delivery_that_succeeds_on_retry_is_delivered_once(
        self, two_subscribers: None, settings: Any
    ) -> None:
        fast_retries(settings, MAX_ATTEMPTS=5)
        broken.add(1)
        failing = event(1)
        relay().run_once()  # the event, then its delivery's first retry
        assert OutboxDelivery.objects.get().state == "failing"
        broken.clear()
        relay().run()
        delivered = OutboxDelivery.objects.get()
        assert delivered.state == "delivered"
        assert delivered.claimed_at is None
        assert jobs_by(FLAKY) == [str(failing.id)]
        assert jobs_by(HEALTHY) == [str(failing.id)]

    def test_a_subscriber_closing_the_connection_fails_its_delivery_and_others_wait(
        self, two_subscribers: None, settings: Any
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        closing.add(1)
        events = [event(n) for n in range(3)]
        relay().run()
        assert all(e.processed_at for e in OutboxEvent.objects.all())
        by_subscriber = {
            d.subscriber: d for d in OutboxDelivery.objects.filter(event_id=events[1].id)
        }
        assert by_subscriber[FLAKY].last_error_code == "closed_relay_connection"
        assert by_subscriber[FLAKY].attempts == 1
        # The healthy subscriber's run was lost with the transaction: its delivery, due now,
        # ran next (this relay claims deliveries in burst mode).
        assert by_subscriber[HEALTHY].state == "delivered"
        assert sorted(jobs_by(HEALTHY)) == sorted(str(e.id) for e in events)
        assert sorted(jobs_by(FLAKY)) == sorted(str(events[n].id) for n in (0, 2))

    def test_an_unregistered_subscriber_fails_its_delivery(
        self, two_subscribers: None, settings: Any
    ) -> None:
        fast_retries(settings, MAX_ATTEMPTS=3)
        broken.add(1)
        failing = event(1)
        relay().run_once()  # the event, then its delivery's first retry
        unregister_subscriber(FLAKY)  # deployed without it
        relay().run()
        gone = OutboxDelivery.objects.get(event_id=failing.id)
        assert (gone.state, gone.last_error_code) == ("dead", "unknown_subscriber")
        assert "no subscriber 'tests.deliveries.flaky'" in (gone.last_error or "")

    def test_a_stale_delivery_claim_taken_over_is_skipped(
        self, two_subscribers: None, settings: Any
    ) -> None:
        fast_retries(settings, MAX_ATTEMPTS=10)
        broken.add(1)
        failing = event(1)
        relay().run_once()
        broken.clear()
        OutboxDelivery.objects.update(available_at=timezone.now())
        stale = relay(claim_seconds=0.001).deliveries
        claimed = stale._claim()
        assert [c.event.id for c in claimed] == [failing.id]
        time.sleep(0.05)  # well past the stale claim's 1 ms
        taker = relay(claim_seconds=0.001).deliveries
        assert taker.run_once() == 1  # expired: taken over, delivered
        stale._deliver(claimed)  # the stale relay wakes up and runs it too: fenced off
        assert jobs_by(FLAKY) == [str(failing.id)]

    def test_retention_keeps_an_event_until_its_deliveries_are_done(
        self, two_subscribers: None, settings: Any
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        broken.add(1)
        waiting, done = event(1), event(2)
        relay().run()
        OutboxEvent.objects.update(processed_at=timezone.now() - timedelta(days=400))
        prune()
        assert list(OutboxEvent.objects.values_list("id", flat=True)) == [waiting.id]
        assert OutboxDelivery.objects.get().event_id == waiting.id
        OutboxDelivery.objects.update(delivered_at=timezone.now())
        prune()
        assert not OutboxEvent.objects.exists()
        assert not OutboxDelivery.objects.exists()  # the foreign key cascades
        assert done.id  # pruned before

    def test_a_batch_of_deliveries_with_one_poison_delivers_the_others(
        self, two_subscribers: None, settings: Any
    ) -> None:
        fast_retries(settings, MAX_ATTEMPTS=10)
        broken.update({1, 2, 3})
        events = [event(n) for n in (1, 2, 3)]
        relay(poll_interval=60).run_once()
        assert OutboxDelivery.objects.count() == 3
        broken.discard(1)
        broken.discard(3)
        OutboxDelivery.objects.update(available_at=timezone.now())
        relay().deliveries.run_once()
        states = {d.event_id: d.state for d in OutboxDelivery.objects.all()}
        assert states == {
            events[0].id: "delivered",
            events[1].id: "failing",
            events[2].id: "delivered",
        }
        assert sorted(jobs_by(FLAKY)) == sorted(str(events[n].id) for n in (0, 2))

    def test_failures_in_one_segment_and_in_another_roll_back_only_theirs(
        self, two_subscribers: None, settings: Any
    ) -> None:
        """The second pass runs the batch in segments of ``SEGMENT`` events: two failing events
        in one segment and one in another, found one after the other, each fail their own
        delivery, and everything else commits once, with one statement of jobs."""
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        count = 3 * SEGMENT
        failing = {5, 6, 2 * SEGMENT + 1}
        broken.update(failing)
        with transaction.atomic():
            events = [event(n) for n in range(count)]
        with CaptureQueriesContext(connection) as captured:
            assert relay().run_once() == count
        savepoints = [q for q in captured.captured_queries if q["sql"].startswith("SAVEPOINT")]
        # The second pass, a savepoint per segment run and per subscriber run alone: the first
        # segment twice (1 + event 5's 2; then 1 + 2 + event 6's 2), the second once, the third
        # twice (1; then 1 + its failing event's 2). Not one per subscriber of the batch (192).
        assert len(savepoints) == (1 + 2) + (1 + 2 + 2) + 1 + 1 + (1 + 2)
        assert all(e.processed_at for e in OutboxEvent.objects.all())
        assert sorted(jobs_by(HEALTHY)) == sorted(str(e.id) for e in events)
        assert sorted(jobs_by(FLAKY)) == sorted(
            str(e.id) for n, e in enumerate(events) if n not in failing
        )
        assert set(OutboxDelivery.objects.values_list("event_id", "subscriber", "attempts")) == {
            (events[n].id, FLAKY, 1) for n in failing
        }

    def test_after_a_failing_batch_the_next_ones_start_in_segments_for_a_while(
        self, two_subscribers: None, settings: Any
    ) -> None:
        """While a subscriber keeps failing, a first pass without savepoints would fail nearly
        every batch: for ``SEGMENTED_SECONDS`` after one did, batches start in segments."""
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        projecting = relay()
        broken.add(1)
        event(1)
        assert projecting.run_once() == 1
        assert projecting._segmented_until > time.monotonic() + SEGMENTED_SECONDS - 1
        event(2)
        with CaptureQueriesContext(connection) as captured:
            assert projecting.run_once() == 1
        sql = [q["sql"] for q in captured.captured_queries]
        assert sum(q.startswith("SAVEPOINT") for q in sql) == 1  # one segment, run once
        projecting._segmented_until = 0.0  # the while is over: the fast path again
        event(3)
        with CaptureQueriesContext(connection) as captured:
            assert projecting.run_once() == 1
        assert not any(q["sql"].startswith("SAVEPOINT") for q in captured.captured_queries)
        assert sorted(n for (name, _, n) in seen if name == FLAKY) == [1, 1, 2, 3]

    def test_a_segment_failing_again_and_again_runs_three_times_at_most(
        self, two_subscribers: None, settings: Any
    ) -> None:
        """Every event of the first segment fails: found one by one, that segment would run
        ``SEGMENT`` times; after its second failure, all its events' subscribers run alone."""
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        broken.update(range(SEGMENT))
        with transaction.atomic():
            events = [event(n) for n in range(2 * SEGMENT)]
        with CaptureQueriesContext(connection) as captured:
            assert relay().run_once() == len(events)
        savepoints = [q for q in captured.captured_queries if q["sql"].startswith("SAVEPOINT")]
        # Pass 2: the first segment with event 0 alone (fails on event 1), with events 0 and 1
        # alone (fails on event 2), then with every event alone; the second segment once.
        assert len(savepoints) == (1 + 2) + (1 + 2 + 2) + (1 + 2 * SEGMENT) + 1
        assert sorted(jobs_by(HEALTHY)) == sorted(str(e.id) for e in events)
        assert sorted(jobs_by(FLAKY)) == sorted(str(e.id) for e in events[SEGMENT:])
        assert OutboxDelivery.objects.filter(subscriber=FLAKY, attempts=1).count() == SEGMENT
