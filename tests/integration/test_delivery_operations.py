"""The operator's side of per-subscriber deliveries: re-drive and discard dead deliveries, replay
processed events to a subscriber added later (``django_pgoutbox.control``), each on real rows,
and what the relay then does with them.

Two subscribers of ``tests.ops``: ``first`` and ``second`` record the sequence of each event they
see; ``first`` raises while ``broken`` holds the event's sequence.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import control, publish, subscriber
from django_pgoutbox.conf import get_settings
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import OutboxDelivery, OutboxEvent
from django_pgoutbox.worker.relay import Relay

FIRST = "tests.ops.first"
SECOND = "tests.ops.second"
LATE = "tests.ops.late"
TYPE = "tests.ops"

seen: list[tuple[str, int]] = []
broken: set[int] = set()


def register_two() -> None:
    """Register ``first`` and ``second``, forget what they saw (call under ``registry``)."""
    seen.clear()
    broken.clear()

    @subscriber(TYPE, name=FIRST)
    def first(event: OutboxEvent) -> None:
        seen.append((FIRST, event.payload["n"]))
        if event.payload["n"] in broken:
            raise RuntimeError(f"first cannot take {event.payload['n']}")

    @subscriber(TYPE, name=SECOND)
    def second(event: OutboxEvent) -> None:
        seen.append((SECOND, event.payload["n"]))


@pytest.fixture
def two_subscribers(registry: None) -> None:
    register_two()


def add_late_subscriber() -> None:
    @subscriber(TYPE, "tests.ops.other", name=LATE)
    def late(event: OutboxEvent) -> None:
        seen.append((LATE, event.payload["n"]))


def relay() -> Relay:
    conf = get_settings()
    return Relay(conf.outbox, relay_id="relay-ops", using="default", policy=conf.retry, burst=True)


def seen_by(name: str) -> list[int]:
    return [n for who, n in seen if who == name]


def event(
    n: int,
    *,
    aggregate: uuid.UUID | None = None,
    event_type: str = TYPE,
    ago: float = 0,
    processed: bool = True,
    **fields: Any,
) -> OutboxEvent:
    """An event, occurred ``ago`` seconds ago, processed (by default) as the fast path leaves it."""
    made = publish(
        event_type,
        aggregate_type="ops",
        aggregate_id=aggregate or uuid.uuid4(),
        payload={"n": n},
    )
    moment = timezone.now() - timedelta(seconds=ago)
    OutboxEvent.objects.filter(pk=made.pk).update(
        occurred_at=moment,
        available_at=moment,
        processed_at=timezone.now() if processed else None,
        **fields,
    )
    return OutboxEvent.objects.get(pk=made.pk)


def delivery(made: OutboxEvent, name: str, state: str, *, dead_ago: float = 60) -> OutboxDelivery:
    """``name``'s delivery of ``made``, in ``state``, as the relay writes one."""
    now = timezone.now()
    fields: dict[str, Any] = {"attempts": 0, "last_error": None}
    if state in ("failing", "dead", "discarded"):
        fields.update(attempts=3, last_error_code="RuntimeError", last_error="RuntimeError: no")
    if state in ("dead", "discarded"):
        fields["dead_at"] = now - timedelta(seconds=dead_ago)
    if state in ("delivered", "discarded"):
        fields["delivered_at"] = now
    if state == "failing":
        fields["available_at"] = now + timedelta(hours=1)
    return OutboxDelivery.objects.create(
        event=made,
        subscriber=name,
        aggregate_type=made.aggregate_type,
        aggregate_id=made.aggregate_id,
        occurred_at=made.occurred_at,
        **fields,
    )


def states() -> dict[int, str]:
    return {d.pk: d.state for d in OutboxDelivery.objects.all()}


@pytest.mark.django_db
class TestRedriveAndDiscard:
    def test_redrive_gives_dead_deliveries_a_fresh_budget(self) -> None:
        dead = delivery(event(1), FIRST, "dead")
        assert control.redrive_dead_deliveries([dead.pk]) == 1
        dead.refresh_from_db()
        assert (dead.state, dead.attempts, dead.dead_at, dead.claimed_by) == (
            "failing",
            0,
            None,
            None,
        )
        assert dead.available_at <= timezone.now()
        assert dead.last_error == "RuntimeError: no"  # kept: what it died of

    def test_redrive_and_discard_touch_nothing_that_is_not_dead(self) -> None:
        made = event(1)
        others = [
            delivery(made, "tests.ops.waiting", "waiting"),
            delivery(made, "tests.ops.failing", "failing"),
            delivery(made, "tests.ops.delivered", "delivered"),
            delivery(made, "tests.ops.discarded", "discarded"),
        ]
        before = {
            d.pk: (d.state, d.attempts, d.available_at, d.delivered_at, d.last_error)
            for d in OutboxDelivery.objects.all()
        }
        ids = [d.pk for d in others] + [2**62, -1]  # and ids of no delivery at all
        assert control.redrive_dead_deliveries(ids) == 0
        assert control.discard_dead_deliveries(ids) == 0
        assert control.redrive_dead_deliveries([]) == 0
        after = {
            d.pk: (d.state, d.attempts, d.available_at, d.delivered_at, d.last_error)
            for d in OutboxDelivery.objects.all()
        }
        assert after == before

    def test_discard_marks_delivered_and_says_so(self) -> None:
        dead = delivery(event(1), FIRST, "dead")
        assert control.discard_dead_deliveries([dead.pk]) == 1
        dead.refresh_from_db()
        assert dead.state == "delivered"
        assert (dead.last_error or "").startswith("discarded by an operator; RuntimeError: no")
        assert control.discard_dead_deliveries([dead.pk]) == 0  # once


@pytest.mark.django_db(transaction=True)
class TestWhatTheRelayDoesNext:
    def test_a_discarded_dead_head_lets_the_next_delivery_go_and_only_that_subscribers(
        self, two_subscribers: None
    ) -> None:
        aggregate = uuid.uuid4()
        head = event(1, aggregate=aggregate, ago=30)
        behind = event(2, aggregate=aggregate, ago=20)
        dead = delivery(head, FIRST, "dead")
        waiting = delivery(behind, FIRST, "waiting")
        elsewhere = delivery(event(3, ago=10), SECOND, "dead")
        relay().run()
        assert seen == []  # the dead head holds back its subscriber's delivery behind it
        assert control.discard_dead_deliveries([dead.pk]) == 1
        relay().run()
        assert seen == [(FIRST, 2)]  # the discarded one never ran
        assert states() == {dead.pk: "delivered", waiting.pk: "delivered", elsewhere.pk: "dead"}

    def test_a_redriven_dead_head_runs_then_the_ones_behind_it_in_order(
        self, two_subscribers: None
    ) -> None:
        aggregate = uuid.uuid4()
        made = [event(n, aggregate=aggregate, ago=60 - n) for n in (1, 2, 3)]
        dead = delivery(made[0], FIRST, "dead")
        for later in made[1:]:
            delivery(later, FIRST, "waiting")
        assert control.redrive_dead_deliveries([dead.pk]) == 1
        relay().run()
        assert seen_by(FIRST) == [1, 2, 3]
        assert seen_by(SECOND) == []  # it had seen them: no delivery of its own
        assert set(states().values()) == {"delivered"}


@pytest.mark.django_db
class TestReplay:
    def test_replay_writes_one_waiting_delivery_per_processed_event_of_its_types(
        self, two_subscribers: None
    ) -> None:
        add_late_subscriber()
        since = timezone.now() - timedelta(hours=1)
        before = event(0, ago=7200)
        chosen = [event(n, ago=3000 - n) for n in range(1, 4)]
        other_type = event(4, event_type="tests.ops.other", ago=1000)
        event(5, event_type="tests.unrelated", ago=1000)
        event(6, ago=500, processed=False)  # the relay gives it to every subscriber itself
        event(7, ago=400, processed=True, dead_at=timezone.now())  # discarded: never projected
        had = event(8, ago=300)
        delivery(had, LATE, "failing")  # it has one already: left as it is
        assert control.events_to_replay(LATE, since=since).count() == 4
        assert control.replay_events(LATE, since=since) == 4
        replayed = OutboxDelivery.objects.filter(subscriber=LATE).exclude(event=had)
        assert [d.event_id for d in replayed.order_by("id")] == [
            *(e.pk for e in chosen),
            other_type.pk,
        ]
        for written in replayed:
            assert (written.state, written.attempts, written.available_at <= timezone.now()) == (
                "waiting",
                0,
                True,
            )
            made = OutboxEvent.objects.get(pk=written.event_id)
            assert (written.aggregate_id, written.occurred_at) == (
                made.aggregate_id,
                made.occurred_at,
            )
        assert OutboxDelivery.objects.get(subscriber=LATE, event=had).state == "failing"
        assert not OutboxDelivery.objects.filter(event=before).exists()

    def test_replay_twice_writes_nothing_twice(self, two_subscribers: None) -> None:
        add_late_subscriber()
        for n in range(5):
            event(n, ago=100 - n)
        since = timezone.now() - timedelta(hours=1)
        assert control.replay_events(LATE, since=since) == 5
        assert control.replay_events(LATE, since=since) == 0
        assert control.events_to_replay(LATE, since=since).count() == 0
        assert OutboxDelivery.objects.filter(subscriber=LATE).count() == 5

    def test_replay_in_small_batches_reaches_every_event(self, two_subscribers: None) -> None:
        """Batches of two over seven events, the first three replayed already: a batch that
        writes nothing (its events had deliveries) is not the end, and no batch reads the
        same events again."""
        add_late_subscriber()
        made = [event(n, ago=100 - n) for n in range(7)]
        since = made[0].occurred_at
        assert control.replay_events(LATE, since=since, until=made[3].occurred_at) == 3
        assert control.replay_events(LATE, since=since, batch=2) == 4
        assert OutboxDelivery.objects.filter(subscriber=LATE).count() == 7
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM outbox_deliveries GROUP BY event_id, subscriber")
            assert {count for (count,) in cursor.fetchall()} == {1}

    def test_until_is_exclusive_and_since_inclusive(self, two_subscribers: None) -> None:
        add_late_subscriber()
        made = [event(n, ago=100 - n) for n in range(4)]
        written = control.replay_events(LATE, since=made[1].occurred_at, until=made[3].occurred_at)
        assert written == 2
        assert set(
            OutboxDelivery.objects.filter(subscriber=LATE).values_list("event_id", flat=True)
        ) == {made[1].pk, made[2].pk}

    def test_an_unknown_subscriber_is_refused_naming_the_registered_ones(
        self, two_subscribers: None
    ) -> None:
        event(1)
        since = timezone.now() - timedelta(days=1)
        with pytest.raises(ValueError, match=r"^subscriber: no subscriber 'nope' is registered"):
            control.replay_events("nope", since=since)
        with pytest.raises(InvalidInput) as raised:
            control.replay_events("tests.ops.firs", since=since)
        assert raised.value.field == "subscriber"
        assert f"did you mean '{FIRST}'? registered: " in str(raised.value)
        for hostile in (None, 7, "x\x00", "", FIRST + " "):
            with pytest.raises(InvalidInput, match=r"^subscriber: "):
                control.replay_events(hostile, since=since)  # type: ignore[arg-type]
        assert not OutboxDelivery.objects.exists()

    def test_the_error_lists_a_bounded_number_of_subscribers(self, registry: None) -> None:
        for n in range(300):
            subscriber(f"tests.many.{n}", name=f"tests.many.{n:03}" + "x" * 200)(lambda e: None)
        with pytest.raises(InvalidInput) as raised:
            control.replay_events("nope", since=timezone.now())
        message = str(raised.value)
        assert len(message) < 1500, len(message)
        assert "more)" in message

    @pytest.mark.parametrize(
        ("arguments", "field"),
        [
            ({"since": datetime(2026, 1, 1)}, "since"),  # naive: which zone?
            ({"since": "2026-01-01"}, "since"),
            ({"since": None}, "since"),
            ({"since": datetime(2026, 1, 1, tzinfo=UTC), "until": datetime(2026, 1, 1)}, "until"),
            (
                {
                    "since": datetime(2026, 1, 2, tzinfo=UTC),
                    "until": datetime(2026, 1, 1, tzinfo=UTC),
                },
                "until",
            ),
            (
                {
                    "since": datetime(2026, 1, 1, tzinfo=UTC),
                    "until": datetime(2026, 1, 1, tzinfo=UTC),
                },
                "until",
            ),
            ({"since": datetime(1, 1, 1, tzinfo=UTC)}, "since"),
            ({"since": datetime(2026, 1, 1, tzinfo=UTC), "batch": 0}, "batch"),
            ({"since": datetime(2026, 1, 1, tzinfo=UTC), "batch": True}, "batch"),
            ({"since": datetime(2026, 1, 1, tzinfo=UTC), "batch": 1.5}, "batch"),
        ],
    )
    def test_bad_arguments_are_refused_naming_them(
        self, two_subscribers: None, arguments: dict[str, Any], field: str
    ) -> None:
        add_late_subscriber()
        event(1, ago=10)
        with pytest.raises(InvalidInput, match=rf"^{field}: ") as raised:
            control.replay_events(LATE, **arguments)
        assert raised.value.field == field
        assert not OutboxDelivery.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_relay_delivers_a_replay_in_order_and_new_events_wait_behind_it(
    two_subscribers: None,
) -> None:
    aggregate = uuid.uuid4()
    for n in (1, 2, 3):
        event(n, aggregate=aggregate, ago=100 - n)
    add_late_subscriber()
    assert control.replay_events(LATE, since=timezone.now() - timedelta(hours=1)) == 3
    publish(TYPE, aggregate_type="ops", aggregate_id=aggregate, payload={"n": 4})
    relay().run()
    # The new event ran for the others at once; for the late subscriber, after its replay.
    assert seen_by(LATE) == [1, 2, 3, 4]
    assert seen_by(FIRST) == seen_by(SECOND) == [4]
    assert set(states().values()) == {"delivered"}
