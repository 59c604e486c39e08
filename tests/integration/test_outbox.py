"""publish(), the model-save hook, subscribers and the relay (in-process)."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta
from typing import Any, ClassVar

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgoutbox import Event, PublishError, enqueue, publish, subscriber
from django_pgoutbox.conf import get_settings
from django_pgoutbox.copy_rows import COPY_MIN_ROWS
from django_pgoutbox.models import Job, OutboxDelivery, OutboxEvent
from django_pgoutbox.queries import CLAIM_EVENTS, CLAIM_EVENTS_PLAN, COPY_JOBS, SEEK_CLAIM_EVENTS
from django_pgoutbox.worker.relay import Relay
from testproject.demo.models import TrackingSession, complete_session
from testproject.testjobs.models import Projection
from tests.conftest import drain_notifications

#: The name of ``testproject.testjobs.subscribers.project``, the subscriber of tests.projected.
PROJECT = "testproject.testjobs.subscribers.project"


def fact(aggregate: uuid.UUID | None = None, **payload: Any) -> OutboxEvent:
    return publish(
        "tests.projected",
        aggregate_type="test",
        aggregate_id=aggregate or uuid.uuid4(),
        payload=payload,
    )


def relay(relay_id: str = "relay-1", **overrides: Any) -> Relay:
    conf = get_settings()
    outbox = conf.outbox
    if overrides:
        from dataclasses import replace

        outbox = replace(outbox, **overrides)
    return Relay(outbox, relay_id=relay_id, using="default", policy=conf.retry, burst=True)


@pytest.mark.django_db
class TestPublish:
    def test_writes_the_fact_with_database_times(self, django_assert_num_queries: Any) -> None:
        aggregate, org = uuid.uuid4(), uuid.uuid4()
        with django_assert_num_queries(1):
            event = publish(
                "tracking_session.completed",
                aggregate_type="tracking_session",
                aggregate_id=str(aggregate),
                payload={"device": "d1"},
                organization_id=org,
            )
        stored = OutboxEvent.objects.get(pk=event.pk)
        assert (stored.aggregate_id, stored.organization_id, stored.schema_version) == (
            aggregate,
            org,
            1,
        )
        assert stored.payload == {"device": "d1"}
        assert stored.occurred_at == event.occurred_at
        assert stored.processed_at is None
        assert stored.attempts == 0

    def test_rollback_leaves_no_event(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            fact()
            raise RuntimeError
        assert not OutboxEvent.objects.exists()

    @pytest.mark.parametrize(
        ("kwargs", "field", "message"),
        [
            ({"event_type": ""}, "event_type", "non-empty string"),
            ({"aggregate_type": None}, "aggregate_type", "non-empty string"),
            ({"aggregate_id": None}, "aggregate_id", "is required"),
            ({"aggregate_id": "session-7"}, "aggregate_id", "must be a UUID"),
            ({"payload": "text"}, "payload", "must be a dict"),
            ({"payload": {"at": timezone.now()}}, "payload['at']", "not JSON-serialisable"),
            ({"payload": {"s": "a\x00"}}, "payload['s']", "NUL"),
            ({"schema_version": "2"}, "schema_version", "must be an int, not str"),
            ({"schema_version": 1.0}, "schema_version", "must be an int, not float"),
            ({"schema_version": True}, "schema_version", "must be an int, not bool"),
            ({"schema_version": 0}, "schema_version", "must be from 1 to 2147483647"),
            ({"organization_id": "acme"}, "organization_id", "must be a UUID"),
            ({"available_at": datetime(2030, 1, 1)}, "available_at", "aware datetime"),
            ({"using": "other"}, "using", "no database 'other'"),
        ],
    )
    def test_bad_input_is_refused(self, kwargs: dict[str, Any], field: str, message: str) -> None:
        arguments: dict[str, Any] = {
            "event_type": "x.happened",
            "aggregate_type": "x",
            "aggregate_id": uuid.uuid4(),
            "payload": {},
            **kwargs,
        }
        with pytest.raises(PublishError) as caught:
            publish(arguments.pop("event_type"), **arguments)
        assert caught.value.field == field
        assert message in caught.value.message
        assert not OutboxEvent.objects.exists()


@pytest.mark.django_db(transaction=True)  # the listener is a second connection
class TestPublishWakeUp:
    def test_notification_carries_the_type_and_arrives_at_commit(
        self, outbox_listener: psycopg.Connection[Any]
    ) -> None:
        with transaction.atomic():
            event = fact()
            assert drain_notifications(outbox_listener, timeout=0.3) == []
        assert drain_notifications(outbox_listener) == [event.event_type]

    def test_one_notification_per_event_type_and_transaction(
        self, outbox_listener: psycopg.Connection[Any]
    ) -> None:
        with transaction.atomic():
            events = [fact() for _ in range(50)]
        assert drain_notifications(outbox_listener) == [events[0].event_type]

    def test_rollback_sends_nothing(self, outbox_listener: psycopg.Connection[Any]) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            fact()
            raise RuntimeError
        assert drain_notifications(outbox_listener) == []


@pytest.mark.django_db
class TestSaveHook:
    def test_create_publishes_with_the_save(self) -> None:
        org = uuid.uuid4()
        session = TrackingSession.objects.create(organization_id=org, device="d1")
        event = OutboxEvent.objects.get()
        assert (event.event_type, event.aggregate_type) == (
            "tracking_session.started",
            "tracking_session",
        )
        assert (event.aggregate_id, event.organization_id) == (session.id, org)
        session.device = "d2"
        session.save()
        assert OutboxEvent.objects.count() == 1  # updates publish nothing in this model

    @pytest.mark.django_db(transaction=True)  # no test transaction around it: real autocommit
    def test_failing_event_rolls_back_the_save_even_in_autocommit(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def bad(self: TrackingSession, *, created: bool) -> list[Event]:
            return [Event("tracking_session.started", {"when": timezone.now()})]

        monkeypatch.setattr(TrackingSession, "outbox_events_for_save", bad)
        assert connection.get_autocommit()
        with pytest.raises(PublishError, match="payload"):
            TrackingSession.objects.create(organization_id=uuid.uuid4(), device="d1")
        assert not TrackingSession.objects.exists()
        assert not OutboxEvent.objects.exists()

    def test_delete_publishes_with_the_delete(self, monkeypatch: pytest.MonkeyPatch) -> None:
        session = TrackingSession.objects.create(organization_id=uuid.uuid4(), device="d1")
        monkeypatch.setattr(
            TrackingSession,
            "outbox_events_for_delete",
            lambda self: [Event("tracking_session.deleted", {"device": self.device})],
        )
        session_id = session.id
        session.delete()
        deleted = OutboxEvent.objects.get(event_type="tracking_session.deleted")
        assert deleted.aggregate_id == session_id

    def test_guarded_update_publishes_once(self) -> None:
        session = TrackingSession.objects.create(organization_id=uuid.uuid4(), device="d1")
        assert complete_session(session.id) is True
        assert complete_session(session.id) is False  # already completed: no second fact
        assert OutboxEvent.objects.filter(event_type="tracking_session.completed").count() == 1
        session.refresh_from_db()
        assert (session.status, session.version) == ("completed", 2)

    @pytest.mark.django_db(transaction=True)  # the error breaks the transaction it happens in
    def test_event_objects_only(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(
            TrackingSession, "outbox_events_for_save", lambda self, created: ["started"]
        )
        with pytest.raises(TypeError, match="must yield Event objects"):
            TrackingSession.objects.create(organization_id=uuid.uuid4(), device="d1")
        assert not TrackingSession.objects.exists()


@pytest.mark.django_db(transaction=True)  # the relay commits its own transactions
class TestRelay:
    def test_projects_into_jobs_exactly_once(self) -> None:
        events = [fact(sequence=n) for n in range(5)]
        assert relay().run_once() == 5
        assert relay().run_once() == 0
        assert OutboxEvent.objects.filter(processed_at__isnull=False).count() == 5
        assert Projection.objects.count() == 5
        assert Job.objects.filter(job_type="tests.noop").count() == 5
        assert {p.event_id for p in Projection.objects.all()} == {e.id for e in events}

    def test_a_batch_of_many_jobs_is_one_copy_without_the_poison_events_job(self) -> None:
        events = [fact(sequence=n) for n in range(COPY_MIN_ROWS * 2)]
        poison = fact(fail=True)
        with CaptureQueriesContext(connection) as queries:
            assert relay().run_once() == len(events) + 1
        copies = [q for q in queries.captured_queries if q["sql"] == COPY_JOBS]
        # The first try stops at the poison event before writing; the second writes in one COPY.
        assert len(copies) == 1
        jobs = Job.objects.filter(job_type="tests.noop")
        assert sorted(j.payload["event"] for j in jobs) == sorted(str(e.id) for e in events)
        assert not Projection.objects.filter(event_id=poison.id).exists()
        # Every event processed; the poison one's subscriber has a delivery of it, retrying.
        assert OutboxEvent.objects.filter(processed_at__isnull=False).count() == len(events) + 1
        failing = OutboxDelivery.objects.get()
        assert (failing.event_id, failing.subscriber, failing.state) == (
            poison.id,
            PROJECT,
            "failing",
        )

    def test_demo_projection(self) -> None:
        session = TrackingSession.objects.create(organization_id=uuid.uuid4(), device="d9")
        complete_session(session.id)
        relay().run()
        assert set(Job.objects.values_list("job_type", flat=True)) == {
            "demo.send_notification",
            "demo.build_report",
        }
        assert not OutboxEvent.objects.filter(processed_at__isnull=True).exists()

    def test_event_without_subscribers_is_processed(self) -> None:
        publish("nobody.listens", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
        relay().run()
        assert OutboxEvent.objects.get().processed_at is not None

    def test_poison_event_rolls_back_only_itself(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        good = fact(sequence=1)
        poison = fact(sequence=2, fail=True)
        other = fact(sequence=3)
        relay().run()
        poison.refresh_from_db()
        assert (poison.processed_at is not None, poison.attempts) == (True, 0)
        failing = OutboxDelivery.objects.get(event_id=poison.id, subscriber=PROJECT)
        assert (failing.attempts, failing.last_error_code) == (1, "ValueError")
        assert "cannot project 2" in (failing.last_error or "")
        assert failing.claimed_at is None
        assert failing.available_at > timezone.now() + timedelta(seconds=100)  # 60 * 2**1
        assert set(Projection.objects.values_list("event_id", flat=True)) == {good.id, other.id}
        assert Job.objects.count() == 2  # nothing the poison event's subscriber did survives

    def test_a_poison_delivery_dies_after_its_attempts_and_holds_back_its_aggregate(
        self, settings: Any
    ) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "RETRY": {"BASE_DELAY": 0.001, "MAX_DELAY": 0.001, "JITTER": 0},
            "OUTBOX": {"MAX_ATTEMPTS": 3},
        }
        aggregate = uuid.uuid4()
        poison = fact(aggregate, sequence=1, fail=True)
        later = fact(aggregate, sequence=2)
        elsewhere = fact(sequence=1)
        for _ in range(5):
            relay().run()
        dead = OutboxDelivery.objects.get(event_id=poison.id)
        waiting = OutboxDelivery.objects.get(event_id=later.id)
        assert (dead.attempts, dead.last_error_code, dead.state) == (3, "ValueError", "dead")
        # Held back: never delivered to this subscriber out of order.
        assert (waiting.attempts, waiting.state, waiting.subscriber) == (0, "waiting", PROJECT)
        assert Projection.objects.get().event_id == elsewhere.id  # other aggregates go on
        # An operator re-drives the dead delivery once the subscriber is fixed:
        OutboxEvent.objects.filter(pk=poison.pk).update(payload={"sequence": 1})
        OutboxDelivery.objects.filter(pk=dead.pk).update(dead_at=None, attempts=0)
        relay().run()
        assert list(
            Projection.objects.filter(aggregate_id=aggregate)
            .order_by("id")
            .values_list("sequence", flat=True)
        ) == [1, 2]
        assert OutboxDelivery.objects.filter(delivered_at__isnull=True).count() == 0

    def test_unsupported_schema_version_is_dead(self, registry: None) -> None:
        @subscriber("tests.versioned", versions=(2,))
        def v2_only(event: OutboxEvent) -> None:
            enqueue("tests.noop", {})

        old = publish("tests.versioned", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
        new = publish(
            "tests.versioned",
            aggregate_type="x",
            aggregate_id=uuid.uuid4(),
            payload={},
            schema_version=2,
        )
        relay().run()
        old.refresh_from_db()
        new.refresh_from_db()
        assert (old.processed_at is not None, old.dead_at) == (True, None)
        refused = OutboxDelivery.objects.get(event_id=old.id, subscriber=v2_only.name)
        assert refused.dead_at is not None
        assert refused.last_error_code == "unsupported_schema_version"
        assert "schema version 1" in (refused.last_error or "")
        assert new.processed_at is not None
        assert not OutboxDelivery.objects.filter(event_id=new.id).exists()
        assert Job.objects.count() == 1

    def test_one_aggregate_is_projected_in_order_one_at_a_time(self) -> None:
        aggregate = uuid.uuid4()
        with transaction.atomic():  # one transaction: same occurred_at, ordered by id
            for n in range(5):
                fact(aggregate, sequence=n)
        claimed = relay("a").run_once()
        assert claimed == 1  # only the head of the aggregate is claimable
        while relay("a").run_once():
            pass
        assert list(Projection.objects.order_by("id").values_list("sequence", flat=True)) == list(
            range(5)
        )

    def test_claim_taken_over_is_skipped(self) -> None:
        event = fact(sequence=1)
        stale = relay("stale", claim_seconds=0.001)
        claimed = stale._claim()
        taker = relay("taker", claim_seconds=0.001)
        assert taker.run_once() == 1  # the stale claim expired: taken over and projected
        stale._project(claimed)  # the stale relay wakes up and tries to project it too
        assert Projection.objects.filter(event_id=event.id).count() == 1
        assert Job.objects.count() == 1

    def test_events_taken_over_from_a_dead_relay_are_counted_and_projected_alone(
        self,
    ) -> None:
        """A batch of never-claimed events stays one transaction; an event whose last claim
        expired unfinished is counted an attempt in the claim, and projected after them, in a
        transaction of its own; one such event per claim."""
        fresh = [fact(sequence=n) for n in range(3)]
        suspects = [fact(sequence=n) for n in range(3, 5)]
        long_ago = timezone.now() - timedelta(hours=1)
        OutboxEvent.objects.filter(pk__in=[e.pk for e in suspects]).update(
            claimed_at=long_ago, claimed_by="dead-relay"
        )
        with CaptureQueriesContext(connection) as queries:
            assert relay().run_once() == 4  # the three fresh ones and one suspect
        sql = [q["sql"] for q in queries.captured_queries]
        # Two projecting transactions, each locking its events and marking them processed.
        assert sum("CROSS JOIN LATERAL" in q for q in sql) == 2
        assert sum("SET processed_at = now()" in q for q in sql) == 2
        first, second = (OutboxEvent.objects.get(pk=e.pk) for e in suspects)
        assert first.processed_at is not None
        assert (first.attempts, first.last_error_code) == (1, "relay_crashed")
        assert "(last held by dead-relay)" in (first.last_error or "")
        assert (second.processed_at, second.attempts) == (None, 0)  # its turn is next
        assert relay().run_once() == 1
        second.refresh_from_db()
        assert (second.attempts, second.last_error_code) == (1, "relay_crashed")
        assert second.processed_at is not None
        assert set(
            OutboxEvent.objects.filter(pk__in=[e.pk for e in fresh]).values_list(
                "attempts", "last_error_code"
            )
        ) == {(0, None)}
        assert Projection.objects.count() == Job.objects.count() == 5

    def test_an_event_whose_relays_keep_dying_ends_dead_and_holds_back_its_aggregate(
        self, settings: Any
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "OUTBOX": {"MAX_ATTEMPTS": 3}}
        aggregate = uuid.uuid4()
        poison = fact(aggregate, sequence=1)
        later = fact(aggregate, sequence=2)
        OutboxEvent.objects.filter(pk=poison.pk).update(
            claimed_at=timezone.now() - timedelta(hours=1), claimed_by="dead-relay", attempts=2
        )
        assert relay().run_once() == 0  # dead in the claim: none of its subscribers ran
        poison.refresh_from_db()
        assert (poison.attempts, poison.last_error_code) == (3, "relay_crashed")
        assert (poison.dead_at is not None, poison.claimed_at) == (True, None)
        assert "dead after OUTBOX['MAX_ATTEMPTS'] attempts" in (poison.last_error or "")
        relay().run()
        later.refresh_from_db()
        assert later.processed_at is None  # held back behind its dead head, as any
        assert not Projection.objects.exists()

    def test_a_run_that_fails_after_a_takeover_is_one_attempt(self, settings: Any) -> None:
        """The claim counted the takeover's run before its subscriber ran; the failure of that
        same run is not counted again, so a relay killed while holding a delivery costs it no
        more than the run that follows."""
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "RETRY": {"BASE_DELAY": 60, "JITTER": 0},
            "OUTBOX": {"MAX_ATTEMPTS": 3},
        }
        event = fact(sequence=1, fail=True)
        relay().run()  # fails: its delivery, attempt 1
        OutboxDelivery.objects.filter(event_id=event.pk).update(
            claimed_at=timezone.now() - timedelta(hours=1),
            claimed_by="dead-relay",
            available_at=timezone.now(),
        )
        assert relay().run_once() == 1
        failing = OutboxDelivery.objects.get(event_id=event.pk)
        assert (failing.attempts, failing.last_error_code) == (2, "ValueError")
        assert (failing.dead_at, failing.claimed_at, failing.delivered_at) == (None, None, None)

    def test_late_commit_is_still_projected(self) -> None:
        # Two connections and a barrier: the first transaction's event has the earlier
        # occurred_at but commits after a later event has been projected.
        opened = threading.Barrier(2, timeout=10)
        release = threading.Event()
        late: list[OutboxEvent] = []

        def slow_transaction() -> None:
            try:
                with transaction.atomic():
                    late.append(fact(sequence=1))
                    opened.wait()
                    release.wait(timeout=10)
            finally:
                connections.close_all()

        thread = threading.Thread(target=slow_transaction)
        thread.start()
        opened.wait()
        early = fact(sequence=2)
        relay().run()
        assert list(Projection.objects.values_list("event_id", flat=True)) == [early.id]
        release.set()
        thread.join(timeout=10)
        assert late[0].occurred_at < early.occurred_at
        relay().run()
        assert set(Projection.objects.values_list("event_id", flat=True)) == {early.id, late[0].id}


@pytest.mark.django_db(transaction=True)  # the relay commits its own transactions
class TestSeekClaim:
    """The relay's seek claim (issue 31): SEEK_CLAIM_EVENTS from its mark, the full claim for
    what is behind it, and the order of an aggregate's events either way."""

    PARAMS: ClassVar[dict[str, Any]] = {
        "claim_seconds": 60.0,
        "max_attempts": 5,
        "relay_id": "r",
        "crashed_code": "relay_crashed",
        "dead_summary": "dead",
        "summary": "crashed",
    }

    def claim(self, sql: str, limit: int, mark: OutboxEvent | None = None) -> list[uuid.UUID]:
        params = self.PARAMS | {"limit": limit}
        if mark is not None:
            params |= {"mark_occurred_at": mark.occurred_at, "mark_id": mark.id}
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(CLAIM_EVENTS_PLAN)
            cursor.execute(sql, params)
            rows = sorted(cursor.fetchall(), key=lambda row: (row[7], row[0]))
        return [row[0] for row in rows]

    def processed(self, ids: list[uuid.UUID]) -> None:
        OutboxEvent.objects.filter(pk__in=ids).update(processed_at=timezone.now(), claimed_at=None)

    def test_past_the_mark_in_order_behind_it_left_to_the_full_claim(self) -> None:
        """From the mark on, in (occurred_at, id) order, the mark itself included; an event
        that sorts before the mark (a late commit's older occurred_at, a retry come due) only
        by the full claim."""
        chain = uuid.uuid4()
        with transaction.atomic():  # one occurred_at: ordered by id
            events = [fact(sequence=n) for n in range(2)]
            first, second = fact(chain, sequence=2), fact(chain, sequence=3)
            events += [first, second] + [fact(sequence=n) for n in range(4, 6)]
        taken = self.claim(CLAIM_EVENTS, 3)
        # The second of the chain is skipped: its aggregate's earlier event is pending.
        assert taken == [events[0].id, events[1].id, first.id]
        self.processed(taken)
        mark = events[0]  # the first event of that claim
        hour_ago = timezone.now() - timedelta(hours=1)
        late, retried = fact(sequence=6), fact(sequence=7)
        OutboxEvent.objects.filter(pk=late.pk).update(occurred_at=hour_ago)
        OutboxEvent.objects.filter(pk=retried.pk).update(
            occurred_at=hour_ago, available_at=hour_ago, attempts=1
        )
        # The chain's next event heads its aggregate now, past the mark: the seek takes it.
        assert self.claim(SEEK_CLAIM_EVENTS, 2, mark) == [second.id, events[4].id]
        assert self.claim(SEEK_CLAIM_EVENTS, 5, mark) == [events[5].id]
        assert self.claim(SEEK_CLAIM_EVENTS, 5, mark) == []
        assert self.claim(CLAIM_EVENTS, 5) == sorted([late.id, retried.id])

    def test_an_event_past_the_mark_waits_for_its_aggregate_behind_it(self) -> None:
        """The mark narrows the candidates only: an event past it whose aggregate has an
        earlier event pending behind it (late-committed, retrying, dead) is not claimed, by the
        seek or the full claim, until that one is processed."""
        aggregate = uuid.uuid4()
        with transaction.atomic():
            mark = fact(sequence=0)
            successor = fact(aggregate, sequence=2)
        earlier = fact(aggregate, sequence=1)
        OutboxEvent.objects.filter(pk=earlier.pk).update(
            occurred_at=timezone.now() - timedelta(hours=1),
            available_at=timezone.now() + timedelta(hours=1),  # retrying, not due
        )
        self.processed([mark.id])
        assert self.claim(SEEK_CLAIM_EVENTS, 5, mark) == []
        assert self.claim(CLAIM_EVENTS, 5) == []
        OutboxEvent.objects.filter(pk=earlier.pk).update(
            available_at=timezone.now() - timedelta(hours=1)
        )
        assert self.claim(SEEK_CLAIM_EVENTS, 5, mark) == []  # behind the mark: not the seek's
        assert self.claim(CLAIM_EVENTS, 5) == [earlier.id]
        self.processed([earlier.id])
        assert self.claim(SEEK_CLAIM_EVENTS, 5, mark) == [successor.id]

    def test_the_relay_seeks_and_keeps_each_aggregates_order(self) -> None:
        """Chains of events of a few aggregates, interleaved, in batches of 3: the relay mostly
        seeks, and projects each aggregate's events in order, all of them."""
        aggregates = [uuid.uuid4() for _ in range(3)]
        with transaction.atomic():
            for n in range(12):
                fact(aggregates[n % 3] if n % 4 else None, sequence=n)
        r = relay(batch_size=3)
        with CaptureQueriesContext(connection) as queries:
            r.run()
        sql = [q["sql"] for q in queries.captured_queries]
        assert any("AND (e.occurred_at, e.id) >=" in q for q in sql)
        assert r.seek.mark is not None
        assert not OutboxEvent.objects.filter(processed_at__isnull=True).exists()
        for aggregate in aggregates:
            projected = Projection.objects.filter(aggregate_id=aggregate).order_by("id")
            sequences = list(projected.values_list("sequence", flat=True))
            assert sequences == sorted(sequences)
            assert len(sequences) == 3

    def test_a_burst_relay_looks_behind_its_mark_before_it_stops(self) -> None:
        """An empty seek says nothing of the events behind the mark: the relay runs the full
        claim before it sleeps, or, in burst mode, stops."""
        r = relay(batch_size=2)
        first = [fact(sequence=n) for n in range(2)]
        assert r.run_once() == 2
        behind = fact(sequence=9)
        OutboxEvent.objects.filter(pk=behind.pk).update(
            occurred_at=min(e.occurred_at for e in first) - timedelta(seconds=1)
        )
        r.seek.next_full = float("inf")  # no periodic full claim: only an empty seek brings it
        r.run()
        assert Projection.objects.filter(event_id=behind.id).exists()
