"""``django_pgoutbox.testing`` in a user's tests: inside Django's ``TestCase`` and
pytest-django's ``db`` (the test's transaction, one connection), and ``transactional_db``.

The handlers are registered for each test and the registries restored after it
(``Handlers``)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.db import connection, connections, transaction
from django.test import TestCase

from django_pgoutbox import (
    EnqueueError,
    JobContext,
    PermanentError,
    Snooze,
    TransientError,
    cancel,
    enqueue,
    job,
    outbox,
    publish,
    subscriber,
    workflow,
)
from django_pgoutbox.models import Job, OutboxDelivery, OutboxEvent
from django_pgoutbox.registry import registered_jobs, restore_registry
from django_pgoutbox.testing import (
    AttemptFailed,
    DrainLimitExceeded,
    RunSummary,
    SubscriberFailed,
    assert_enqueued,
    drain,
    enqueued_jobs,
    perform_job,
    refute_enqueued,
    run_jobs,
    run_relay,
)
from testproject.testjobs.models import SideEffect


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class Handlers:
    """The handlers and subscribers of these tests, registered while a test runs."""

    def __init__(self) -> None:
        self._jobs = registered_jobs()
        self._subscribers = {key: list(value) for key, value in outbox._subscribers.items()}

        @job("shop.send_receipt", queue="notifications")
        def send_receipt(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            mail.send_mail(
                f"Your order {payload['order']}",
                "Thank you.",
                "shop@example.com",
                [payload["email"]],
            )
            return {"sent_to": payload["email"]}

        @job("helpers.record")
        def record(payload: dict[str, Any], ctx: JobContext) -> int:
            SideEffect.objects.create(
                job_id=ctx.job_id, attempt=ctx.attempt, event="ran", pid=0, worker_thread="t"
            )
            return SideEffect.objects.count()

        @job("helpers.fail", max_attempts=3)
        def fail(payload: dict[str, Any], ctx: JobContext) -> None:
            raise ValueError(f"boom at attempt {ctx.attempt}")

        @job("helpers.flaky")
        def flaky(payload: dict[str, Any], ctx: JobContext) -> str:
            if ctx.attempt < payload.get("until", 2):
                raise TransientError("not yet")
            return "done"

        @job("helpers.permanent")
        def permanent(payload: dict[str, Any], ctx: JobContext) -> None:
            raise PermanentError("no such order")

        @job("helpers.exit")
        def exits(payload: dict[str, Any], ctx: JobContext) -> None:
            raise SystemExit(3)

        @job("helpers.unprintable")
        def unprintable(payload: dict[str, Any], ctx: JobContext) -> None:
            raise Unprintable()

        @job("helpers.bad_result")
        def bad_result(payload: dict[str, Any], ctx: JobContext) -> Any:
            kind = payload.get("kind")
            if kind == "nan":
                return [math.nan]
            if kind == "surrogate":
                return "\ud800"
            if kind == "set":
                return {1, 2}
            return {"when": datetime.now(UTC)}

        @job("helpers.forever")
        def forever(payload: dict[str, Any], ctx: JobContext) -> None:
            enqueue("helpers.forever", {"n": payload["n"] + 1})

        @job("helpers.database_error")
        def database_error(payload: dict[str, Any], ctx: JobContext) -> str:
            SideEffect.objects.create(
                job_id=ctx.job_id, attempt=ctx.attempt, event="before", pid=0, worker_thread="t"
            )
            with connection.cursor() as cursor:
                try:
                    cursor.execute("SELECT 1/0")
                except Exception:
                    if payload.get("raise"):
                        raise
            return "caught it"

        @job("helpers.cancels_itself")
        def cancels_itself(payload: dict[str, Any], ctx: JobContext) -> str:
            cancel(ctx.job_id)
            return "finished all the same"

        @job("helpers.closes_the_connection")
        def closes_the_connection(payload: dict[str, Any], ctx: JobContext) -> int:
            connection.close()
            return SideEffect.objects.count()

        @job("helpers.after_commit")
        def after_commit(payload: dict[str, Any], ctx: JobContext) -> None:
            transaction.on_commit(
                lambda: mail.send_mail("Later", "body", "a@example.com", ["b@example.com"])
            )

        @job("helpers.echo")
        def echo(payload: dict[str, Any], ctx: JobContext) -> Any:
            return {"payload": payload, "parents": ctx.parent_results}

        @job("helpers.snooze_once")
        def snooze_once(payload: dict[str, Any], ctx: JobContext) -> str:
            if not SideEffect.objects.filter(job_id=ctx.job_id).exists():
                SideEffect.objects.create(
                    job_id=ctx.job_id, attempt=ctx.attempt, event="snooze", pid=0, worker_thread="t"
                )
                raise Snooze(3600)
            return "woke"

        @job("helpers.publisher")
        def publisher(payload: dict[str, Any], ctx: JobContext) -> None:
            publish(
                "helpers.order_placed",
                aggregate_type="order",
                aggregate_id=uuid.uuid4(),
                payload={"order": payload["order"], "email": "buyer@example.com"},
            )

        @subscriber("helpers.order_placed", name="helpers.receipt_on_order")
        def receipt_on_order(event: OutboxEvent) -> None:
            send_receipt.enqueue({"order": event.payload["order"], "email": event.payload["email"]})

        @subscriber("helpers.order_placed", name="helpers.broken_projection")
        def broken_projection(event: OutboxEvent) -> None:
            if event.payload.get("break"):
                raise ValueError("the projection's bug")

        self.send_receipt = send_receipt
        self.record = record
        self.fail = fail
        self.flaky = flaky

    def restore(self) -> None:
        restore_registry(self._jobs)
        outbox._subscribers.clear()
        outbox._subscribers.update(self._subscribers)


def place_order(order: int, email: str) -> None:
    """What a view would do: write the order, and enqueue its receipt in the same transaction."""
    with transaction.atomic():
        enqueue("shop.send_receipt", {"order": order, "email": email})


# -- Django's TestCase ---------------------------------------------------------------------------


class TestInsideTestCase(TestCase):
    def setUp(self) -> None:
        self.handlers = Handlers()
        self.addCleanup(self.handlers.restore)

    def test_an_order_enqueues_its_receipt_and_drain_sends_it(self) -> None:
        place_order(7, "buyer@example.com")
        queued = assert_enqueued(
            "shop.send_receipt", payload={"order": 7, "email": "buyer@example.com"}
        )
        assert queued.queue == "notifications"
        assert_enqueued(self.handlers.send_receipt, payload_contains={"order": 7})
        assert [job.pk for job in enqueued_jobs("shop.send_receipt")] == [queued.pk]
        refute_enqueued("shop.send_receipt", payload_contains={"order": 8})
        summary = drain()
        assert summary.completed == 1, summary
        assert summary.runs[0].result == {"sent_to": "buyer@example.com"}
        assert [m.to for m in mail.outbox] == [["buyer@example.com"]]
        refute_enqueued("shop.send_receipt")
        assert_enqueued("shop.send_receipt", status="completed")

    def test_a_handlers_writes_are_the_tests_and_the_connection_stays_open(self) -> None:
        before = connection.connection
        enqueue("helpers.record", {})
        enqueue("helpers.record", {})
        summary = run_jobs()
        assert [run.result for run in summary.runs] == [1, 2]
        assert SideEffect.objects.count() == 2
        # execute() closes a thread's connections after an attempt when their autocommit is not
        # their setting's: the test's, inside its transaction, is left open
        assert connection.connection is before
        assert connection.in_atomic_block
        assert not connection.closed_in_transaction
        assert Job.objects.filter(status="completed").count() == 2

    def test_a_database_error_the_handler_caught_rolls_back_its_savepoint_only(self) -> None:
        SideEffect.objects.create(
            job_id=uuid.uuid4(), attempt=0, event="test", pid=0, worker_thread="t"
        )
        enqueue("helpers.database_error", {})
        enqueue("helpers.database_error", {"raise": True})
        summary = run_jobs(raise_on_failure=False)
        completed, failed = summary.runs
        assert completed.status == "completed"
        assert completed.result == "caught it"
        assert (failed.status, failed.code) == ("retrying", "DataError"), failed
        # the test's transaction goes on; the handlers' rows went with their savepoints
        assert list(SideEffect.objects.values_list("event", flat=True)) == ["test"]

    def test_raise_on_failure_raises_the_handlers_exception_as_the_cause(self) -> None:
        enqueue("helpers.fail", {"order": 1})
        with pytest.raises(AttemptFailed) as raised:
            drain()
        assert isinstance(raised.value.__cause__, ValueError)
        assert "boom at attempt 1" in str(raised.value)
        assert raised.value.run.status == "retrying"
        # its outcome was written before it raised
        assert Job.objects.get().status == "retrying"

    def test_retries_run_at_once_until_dead(self) -> None:
        enqueue("helpers.fail", {})
        summary = drain(raise_on_failure=False)
        assert [run.status for run in summary.runs] == ["retrying", "retrying", "dead"]
        assert summary.dead == 1
        assert summary.retried == 2
        dead = Job.objects.get()
        assert dead.status == "dead"
        assert dead.attempts == 3
        assert dead.last_error_code == "ValueError"
        assert "dead" in repr(summary)
        assert "boom at attempt 3" in repr(summary)

    def test_a_retry_after_its_backoff_when_asked(self) -> None:
        enqueue("helpers.flaky", {"until": 2})
        summary = drain(raise_on_failure=False, retry_at_once=False)
        assert [run.status for run in summary.runs] == ["retrying"]
        assert_enqueued("helpers.flaky", status="retrying")
        summary = drain(raise_on_failure=False)  # still after its back-off: nothing due
        assert len(summary) == 0
        summary = drain(raise_on_failure=False, with_scheduled=True)
        assert [run.result for run in summary.runs] == ["done"]

    def test_a_job_that_enqueues_itself_for_ever_stops_the_drain(self) -> None:
        enqueue("helpers.forever", {"n": 0})
        with pytest.raises(DrainLimitExceeded) as raised:
            drain(max_jobs=25)
        assert "helpers.forever (25 attempts)" in str(raised.value)
        assert len(raised.value.summary.runs) == 25

    def test_a_workflow_drains_in_order(self) -> None:
        flow = workflow("receipt")
        first = flow.add("helpers.echo", {"step": 1}, name="first")
        flow.add("helpers.echo", {"step": 2}, name="second", after=[first])
        flow.enqueue()
        assert_enqueued("helpers.echo", payload={"step": 2}, status="waiting")
        summary = drain()
        assert [run.payload["step"] for run in summary.runs] == [1, 2]
        assert summary.runs[1].result["parents"] == {
            "first": {"payload": {"step": 1}, "parents": {}}
        }

    def test_the_relay_projects_then_drain_runs_what_it_enqueued(self) -> None:
        enqueue("helpers.publisher", {"order": 9})
        summary = drain(relay=True)
        assert summary.job_types == ["helpers.publisher", "shop.send_receipt"], summary
        assert summary.events == 1
        assert [m.subject for m in mail.outbox] == ["Your order 9"]
        assert OutboxEvent.objects.get().processed_at is not None

    def test_run_relay_alone(self) -> None:
        publish(
            "helpers.order_placed",
            aggregate_type="order",
            aggregate_id=uuid.uuid4(),
            payload={"order": 3, "email": "a@example.com"},
        )
        refute_enqueued("shop.send_receipt")
        assert run_relay() == 1
        assert_enqueued("shop.send_receipt", payload={"order": 3, "email": "a@example.com"})
        assert run_relay() == 0

    def test_a_handler_that_closes_the_connection_leaves_the_tests_transaction(self) -> None:
        # in a worker, its next query would open a new connection; here it goes on on the
        # test's, whose transaction stays whole (the class's too, for the tests after it)
        SideEffect.objects.create(
            job_id=uuid.uuid4(), attempt=0, event="t", pid=0, worker_thread="t"
        )
        enqueue("helpers.closes_the_connection", {})
        assert run_jobs().runs[0].result == 1
        assert connection.in_atomic_block
        assert not connection.closed_in_transaction
        assert "close" not in connection.__dict__

    def test_on_commit_callbacks_of_a_handler_run_when_captured(self) -> None:
        # a worker's handler runs outside any transaction: its on_commit callbacks run at once
        enqueue("helpers.after_commit", {})
        with self.captureOnCommitCallbacks(execute=True):
            drain()
        assert [m.subject for m in mail.outbox] == ["Later"]

    def test_a_subscriber_that_fails_is_said_so(self) -> None:
        publish(
            "helpers.order_placed",
            aggregate_type="order",
            aggregate_id=uuid.uuid4(),
            payload={"order": 4, "email": "a@example.com", "break": True},
        )
        with pytest.raises(SubscriberFailed) as raised:
            run_relay()
        (failure,) = raised.value.failures
        assert failure.subscriber == "helpers.broken_projection"
        assert failure.event_type == "helpers.order_placed"
        assert "the projection's bug" in str(raised.value)
        assert not failure.dead
        # the event is processed, the other subscriber's job enqueued, the failure a delivery
        assert OutboxEvent.objects.get().processed_at is not None
        assert_enqueued("shop.send_receipt", payload_contains={"order": 4})
        assert OutboxDelivery.objects.get().subscriber == "helpers.broken_projection"

    def test_perform_job_writes_no_row(self) -> None:
        run = perform_job("shop.send_receipt", {"order": 1, "email": "x@example.com"})
        assert run.status == "completed"
        assert run.result == {"sent_to": "x@example.com"}
        assert not Job.objects.exists()
        assert len(mail.outbox) == 1


# -- pytest-django ---------------------------------------------------------------------------------


@pytest.fixture
def handlers() -> Iterator[Handlers]:
    registered = Handlers()
    yield registered
    registered.restore()


@pytest.mark.django_db
def test_assertion_messages_name_what_was_asked_and_the_nearest_jobs(handlers: Handlers) -> None:
    enqueue("shop.send_receipt", {"order": 1, "email": "a@example.com"})
    enqueue("shop.send_receipt", {"order": 2, "email": "b@example.com"})
    enqueue("helpers.record", {"n": 1})
    with pytest.raises(AssertionError) as raised:
        assert_enqueued("shop.send_receipt", payload={"order": 3, "email": "a@example.com"})
    message = str(raised.value)
    assert "job_type='shop.send_receipt'" in message
    assert "payload={'order': 3, 'email': 'a@example.com'}" in message
    lines = message.splitlines()
    # the same type first, the one sharing a payload value before the other
    assert '"order": 1' in lines[1]
    assert '"order": 2' in lines[2]
    assert "helpers.record" in lines[3]
    with pytest.raises(AssertionError, match="expected 1 job"):
        assert_enqueued("shop.send_receipt", count=1)
    assert_enqueued("shop.send_receipt", count=2)
    with pytest.raises(AssertionError, match="expected no job enqueued"):
        refute_enqueued(queue="notifications")


@pytest.mark.django_db
def test_other_fields_filter(handlers: Handlers) -> None:
    org = uuid.uuid4()
    later = datetime.now(UTC) + timedelta(hours=1)
    enqueue("helpers.record", {}, organization_id=org, priority=5, idempotency_key="k1")
    enqueue("helpers.record", {}, run_at=later)
    assert_enqueued("helpers.record", organization_id=org, priority=5, idempotency_key="k1")
    assert_enqueued("helpers.record", run_at__gt=datetime.now(UTC))
    refute_enqueued("helpers.record", priority=4)
    assert len(enqueued_jobs(handlers.record)) == 2
    assert len(enqueued_jobs(status=None)) == 2
    summary = run_jobs()
    assert summary.completed == 1  # the other is scheduled for later
    assert_enqueued("helpers.record", count=1)


@pytest.mark.django_db
def test_priorities_and_filters(handlers: Handlers) -> None:
    enqueue("helpers.echo", {"n": "low"}, priority=0)
    enqueue("helpers.echo", {"n": "high"}, priority=9)
    enqueue("helpers.record", {})
    summary = run_jobs(job_types=[handlers.fail, "helpers.echo"])
    assert [run.payload["n"] for run in summary.runs] == ["high", "low"]
    assert_enqueued("helpers.record", status="pending")  # given back, untouched
    assert Job.objects.get(job_type="helpers.record").attempts == 0
    assert len(run_jobs(queues=["notifications"])) == 0
    assert run_jobs(queues="default").completed == 1


@pytest.mark.django_db
def test_run_jobs_runs_once_what_is_due(handlers: Handlers) -> None:
    enqueue("helpers.forever", {"n": 0})
    summary = run_jobs()
    assert len(summary) == 1
    assert_enqueued("helpers.forever", payload={"n": 1})


@pytest.mark.django_db
def test_hostile_handlers_end_as_named_outcomes(handlers: Handlers) -> None:
    enqueue("helpers.exit", {})
    enqueue("helpers.unprintable", {})
    enqueue("helpers.bad_result", {})
    enqueue("helpers.permanent", {})
    summary = run_jobs(raise_on_failure=False)
    outcomes = {run.job_type: (run.status, run.code) for run in summary.runs}
    assert outcomes["helpers.exit"] == ("retrying", "SystemExit")
    assert outcomes["helpers.unprintable"][1] == "Unprintable"
    assert outcomes["helpers.bad_result"] == ("dead", "invalid_result")
    assert outcomes["helpers.permanent"] == ("dead", "PermanentError")
    assert summary.dead == 2
    assert len(summary.failures) == 4
    text = repr(summary)
    assert text.startswith("<RunSummary 4 attempt(s)")
    assert "failures:" in text
    # the test's transaction is whole
    assert Job.objects.count() == 4


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["nan", "surrogate", "set", "datetime"])
def test_a_result_json_cannot_carry_is_a_dead_letter(handlers: Handlers, kind: str) -> None:
    enqueue("helpers.bad_result", {"kind": kind})
    (run,) = run_jobs(raise_on_failure=False).runs
    assert (run.status, run.code) == ("dead", "invalid_result")
    assert Job.objects.get().last_error_code == "invalid_result"


@pytest.mark.django_db
def test_a_subscriber_failure_in_the_summary(handlers: Handlers) -> None:
    for broken in (False, True):
        publish(
            "helpers.order_placed",
            aggregate_type="order",
            aggregate_id=uuid.uuid4(),
            payload={"order": 1, "email": "a@example.com", "break": broken},
        )
    summary = drain(relay=True, raise_on_failure=False)
    assert summary.events == 2
    assert summary.completed == 2  # the receipts of both
    assert [f.subscriber for f in summary.subscriber_failures] == ["helpers.broken_projection"]
    assert "subscribers failed: helpers.broken_projection on helpers.order_placed" in repr(summary)
    publish(
        "helpers.order_placed",
        aggregate_type="order",
        aggregate_id=uuid.uuid4(),
        payload={"order": 2, "email": "a@example.com", "break": True},
    )
    with pytest.raises(SubscriberFailed):
        drain(relay=True)


@pytest.mark.django_db
def test_the_relays_bound(handlers: Handlers) -> None:
    for order in range(3):
        publish(
            "helpers.order_placed",
            aggregate_type="order",
            aggregate_id=uuid.uuid4(),
            payload={"order": order, "email": "a@example.com"},
        )
    assert run_relay(max_events=3) == 3  # the bound reached with nothing left: no error
    aggregate = uuid.uuid4()  # one aggregate's events are projected one batch each, in order
    for order in range(3):
        publish(
            "helpers.order_placed",
            aggregate_type="order",
            aggregate_id=aggregate,
            payload={"order": order, "email": "a@example.com"},
        )
    with pytest.raises(DrainLimitExceeded, match="after 2 events"):
        drain(relay=True, max_events=2)


@pytest.mark.django_db
def test_a_cancellation_requested_while_it_ran_wins(handlers: Handlers) -> None:
    enqueue("helpers.cancels_itself", {})
    with pytest.raises(AttemptFailed, match="ended cancelled"):
        run_jobs()
    row = Job.objects.get()
    assert (row.status, row.last_error_code) == ("cancelled", "cancelled")


@pytest.mark.django_db
def test_systemexit_with_raise_on_failure(handlers: Handlers) -> None:
    enqueue("helpers.exit", {})
    with pytest.raises(AttemptFailed) as raised:
        run_jobs()
    assert isinstance(raised.value.__cause__, SystemExit)


@pytest.mark.django_db
def test_a_snooze_is_no_failure_and_runs_again_at_once(handlers: Handlers) -> None:
    enqueue("helpers.snooze_once", {})
    summary = drain()
    assert [(run.snoozed, run.status) for run in summary.runs] == [
        (True, "retrying"),
        (False, "completed"),
    ]
    assert summary.counts == {"snoozed": 1, "completed": 1}
    assert Job.objects.get().attempts == 1


@pytest.mark.django_db
def test_a_paused_queue_is_not_run(handlers: Handlers) -> None:
    from django_pgoutbox import pause_queue, resume_queue

    enqueue("shop.send_receipt", {"order": 1, "email": "a@example.com"})
    pause_queue("notifications")
    summary = drain()
    assert len(summary) == 0
    assert summary.paused == {"notifications"}
    assert "paused: notifications" in repr(summary)
    resume_queue("notifications")
    assert drain().completed == 1


@pytest.mark.parametrize(
    ("payload", "where", "what"),
    [
        ({"when": datetime(2024, 1, 1, tzinfo=UTC)}, "payload['when']", "datetime"),
        ({"tags": {"a"}}, "payload['tags']", "set"),
        ({"x": [1, math.nan]}, "payload['x'][1]", "nan"),
        ({"name": "\ud800"}, "payload['name']", "surrogate"),
    ],
)
def test_perform_job_refuses_a_payload_that_json_cannot_carry(
    handlers: Handlers, payload: dict[str, Any], where: str, what: str
) -> None:
    with pytest.raises(EnqueueError) as raised:
        perform_job("helpers.echo", payload)
    assert raised.value.field == where
    assert what in str(raised.value)


def test_perform_job_without_a_database(handlers: Handlers) -> None:
    run = perform_job(handlers.flaky, {"until": 1, "pair": (1, 2)})
    assert run.result == "done"
    assert run.payload == {"until": 1, "pair": [1, 2]}  # as a worker gives it: JSON's list
    run = perform_job("helpers.flaky", {"until": 3}, attempt=2, raise_on_failure=False)
    assert (run.status, run.code, run.attempt) == ("retrying", "TransientError", 2)
    with pytest.raises(AttemptFailed, match="unknown_job_type"):
        perform_job("helpers.nobody", {})
    run = perform_job("helpers.bad_result", raise_on_failure=False)
    assert (run.status, run.code) == ("dead", "invalid_result")


@pytest.mark.django_db(transaction=True)
def test_in_a_transactional_test_statements_commit(handlers: Handlers) -> None:
    # transaction=True: the helpers must work on a connection in autocommit, as a worker's
    place_order(1, "a@example.com")
    enqueue("helpers.fail", {})
    summary = drain(raise_on_failure=False)
    assert (summary.completed, summary.dead) == (1, 1), summary
    assert len(mail.outbox) == 1
    assert not connection.in_atomic_block
    assert Job.objects.get(job_type="helpers.fail").attempts == 3


@pytest.mark.django_db(databases=["default", "secondary"])
def test_another_database(handlers: Handlers) -> None:
    enqueue("helpers.echo", {"n": 1}, using="secondary")
    refute_enqueued("helpers.echo")
    assert_enqueued("helpers.echo", using="secondary")
    assert len(drain()) == 0
    summary = drain(using="secondary")
    assert summary.completed == 1
    assert_enqueued("helpers.echo", status="completed", using="secondary")
    assert connections["secondary"].in_atomic_block


@pytest.mark.django_db
def test_summary_repr_is_bounded(handlers: Handlers) -> None:
    for n in range(8):
        enqueue("helpers.permanent", {"n": n})
    summary = run_jobs(raise_on_failure=False)
    assert isinstance(summary, RunSummary)
    assert "and 3 more" in repr(summary)


@pytest.mark.django_db
def test_a_queues_max_running_cuts_each_claim(handlers: Handlers) -> None:
    from django_pgoutbox import resize_queue

    for n in range(3):
        enqueue("helpers.echo", {"n": n})
    resize_queue("default", max_running=1)  # the queue's claim runs under its lock, limited
    assert [run.payload["n"] for run in run_jobs().runs] == [0]
    assert [run.payload["n"] for run in drain().runs] == [1, 2]


@pytest.mark.django_db
def test_a_sequence_runs_in_order_one_at_a_time(handlers: Handlers) -> None:
    for n in range(3):
        enqueue("helpers.echo", {"n": n}, sequence="order-1")
    assert_enqueued("helpers.echo", status="waiting", count=2)
    assert [run.payload["n"] for run in run_jobs().runs] == [0]
    assert [run.payload["n"] for run in drain().runs] == [1, 2]


@pytest.mark.django_db
def test_a_unique_job_is_enqueued_once(handlers: Handlers) -> None:
    first = enqueue("helpers.echo", {"n": 1}, unique=True)
    second = enqueue("helpers.echo", {"n": 1}, unique=True)
    assert second.pk == first.pk
    assert_enqueued("helpers.echo", payload={"n": 1}, count=1)
    assert drain().completed == 1


@pytest.mark.django_db
def test_a_step_after_a_job_finished_before_it_was_enqueued(handlers: Handlers) -> None:
    parent = enqueue("helpers.echo", {"n": "parent"})
    drain()
    # its edge to a finished parent is settled as the enqueuing transaction commits, which the
    # test's never does: the helpers settle it before they claim
    enqueue("helpers.echo", {"n": "child"}, after=[parent])
    summary = drain()
    assert [run.payload["n"] for run in summary.runs] == ["child"]
    assert summary.runs[0].result["parents"] == {
        str(parent.pk): {"payload": {"n": "parent"}, "parents": {}}
    }


@pytest.mark.django_db
def test_the_testing_object_binds_a_database(handlers: Handlers) -> None:
    from django_pgoutbox.testing import Testing

    helpers = Testing()
    enqueue("helpers.echo", {"n": 1})
    helpers.assert_enqueued("helpers.echo", payload={"n": 1})
    assert len(helpers.enqueued_jobs()) == 1
    assert helpers.run_jobs().completed == 1
    helpers.refute_enqueued()
    assert helpers.drain().runs == []
    assert helpers.run_relay() == 0
    assert helpers.perform_job("helpers.echo", {"n": 2}).result == {
        "payload": {"n": 2},
        "parents": {},
    }
    assert helpers.on("secondary").using == "secondary"
    assert "as routed" in repr(helpers)


@pytest.mark.django_db
def test_a_django_task(handlers: Handlers) -> None:
    from testproject.testjobs.tasks import add

    add.enqueue(2, 3)
    job = assert_enqueued(add)
    assert job.job_type == "testproject.testjobs.tasks.add"
    assert len(drain(job_types="helpers.echo")) == 0
    summary = drain(job_types=add)
    assert summary.completed == 1
    assert Job.objects.get().status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_limited_queue_in_a_transactional_test(handlers: Handlers) -> None:
    # transaction=True: the limited claim's own transaction, on a connection in autocommit
    from django_pgoutbox import resize_queue

    for n in range(3):
        enqueue("helpers.echo", {"n": n})
    resize_queue("default", max_running=2)
    assert len(run_jobs()) == 2
    assert [run.payload["n"] for run in drain().runs] == [2]
    assert not connection.in_atomic_block


@pytest.mark.django_db
def test_an_unprintable_exception_raised_again(handlers: Handlers) -> None:
    enqueue("helpers.unprintable", {})
    with pytest.raises(AttemptFailed) as raised:
        run_jobs()
    assert isinstance(raised.value.__cause__, Unprintable)
    assert "helpers.unprintable" in str(raised.value)
    assert Job.objects.get().status == "retrying"
