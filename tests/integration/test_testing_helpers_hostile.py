"""``django_pgoutbox.testing`` under the habits of a user's own tests and handlers: an ORM
error caught without a savepoint, a handler that changes its connection's settings, Ctrl-C, a
handler that calls the helpers, a clock that stands still in the test's transaction, and
assertions given what they cannot mean."""

from __future__ import annotations

import contextlib
import math
import time
import unittest
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import DataError, IntegrityError, connection, connections
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

from django_pgoutbox import (
    JobContext,
    Snooze,
    enqueue,
    enqueue_many,
    job,
    outbox,
    publish,
    resize_queue,
    subscriber,
)
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import Job, OutboxEvent
from django_pgoutbox.registry import registered_jobs, restore_registry
from django_pgoutbox.testing import (
    AttemptFailed,
    DrainLimitExceeded,
    assert_enqueued,
    drain,
    enqueued_jobs,
    perform_job,
    refute_enqueued,
    run_jobs,
    run_relay,
)
from testproject.testjobs.models import SideEffect


class Handlers:
    """The handlers of these tests, registered while a test runs."""

    def __init__(self) -> None:
        self._jobs = registered_jobs()
        self._subscribers = {key: list(value) for key, value in outbox._subscribers.items()}

        @job("hostile.echo")
        def echo(payload: dict[str, Any], ctx: JobContext) -> Any:
            return payload

        @job("hostile.duplicate_caught")
        def duplicate_caught(payload: dict[str, Any], ctx: JobContext) -> str:
            # the ORM's save() marks the test's atomic() for rollback when its INSERT fails,
            # even though the handler catches the error
            first = SideEffect.objects.create(
                job_id=ctx.job_id, attempt=1, event="first", pid=0, worker_thread="t"
            )
            with contextlib.suppress(IntegrityError):
                SideEffect.objects.create(
                    id=first.pk,
                    job_id=ctx.job_id,
                    attempt=1,
                    event="again",
                    pid=0,
                    worker_thread="t",
                )
            return "caught"

        @job("hostile.tenant")
        def tenant(payload: dict[str, Any], ctx: JobContext) -> str:
            # a schema-per-tenant app's habit: the tenant's schema first on the search path
            with connection.cursor() as cursor:
                cursor.execute("SET search_path TO hostile_tenant")
                cursor.execute("SET statement_timeout = '7s'")
                cursor.execute("SET session_replication_role = replica")  # no triggers fire
            return "switched"

        @job("hostile.interrupted")
        def interrupted(payload: dict[str, Any], ctx: JobContext) -> None:
            raise KeyboardInterrupt  # Ctrl-C, delivered to the main thread the handler runs on

        @job("hostile.snoozes")
        def snoozes(payload: dict[str, Any], ctx: JobContext) -> str:
            if not SideEffect.objects.filter(job_id=ctx.job_id).exists():
                SideEffect.objects.create(
                    job_id=ctx.job_id, attempt=1, event="snooze", pid=0, worker_thread="t"
                )
                raise Snooze(0.2)
            return "woke"

        @job("hostile.drains_then_closes")
        def drains_then_closes(payload: dict[str, Any], ctx: JobContext) -> int:
            ran = len(drain())  # the helpers called from a handler
            connection.close()
            return ran

        @job("hostile.publishes")
        def publishes(payload: dict[str, Any], ctx: JobContext) -> None:
            aggregate = uuid.UUID(payload["aggregate"])
            for n in range(payload["events"]):  # one aggregate's: projected one batch each
                publish(
                    "hostile.ping", aggregate_type="a", aggregate_id=aggregate, payload={"n": n}
                )

        @subscriber("hostile.ping", name="hostile.on_ping")
        def on_ping(event: OutboxEvent) -> None:
            pass

        @job("hostile.fails_the_test")
        def fails_the_test(payload: dict[str, Any], ctx: JobContext) -> None:
            if payload["how"] == "fail":
                pytest.fail("this job must not run")
            if payload["how"] == "skip":
                pytest.skip("not here")
            raise unittest.SkipTest("not here either")

        @job("hostile.duplicate_caught_on")
        def duplicate_caught_on(payload: dict[str, Any], ctx: JobContext) -> str:
            effects = SideEffect.objects.using(payload["database"])
            first = effects.create(
                job_id=ctx.job_id, attempt=1, event="first", pid=0, worker_thread="t"
            )
            with contextlib.suppress(IntegrityError):
                effects.create(
                    id=first.pk,
                    job_id=ctx.job_id,
                    attempt=1,
                    event="again",
                    pid=0,
                    worker_thread="t",
                )
            return "caught"

    def restore(self) -> None:
        restore_registry(self._jobs)
        outbox._subscribers.clear()
        outbox._subscribers.update(self._subscribers)


@pytest.fixture
def handlers() -> Iterator[Handlers]:
    registered = Handlers()
    yield registered
    registered.restore()


@pytest.mark.django_db
def test_an_orm_error_the_handler_caught_rolls_back_its_savepoint(handlers: Handlers) -> None:
    enqueue("hostile.duplicate_caught", {})
    enqueue("hostile.echo", {"n": 1})
    summary = drain()
    assert [run.result for run in summary.runs] == ["caught", {"n": 1}]
    # the handler's writes went with its savepoint; the test's transaction goes on
    assert not SideEffect.objects.exists()
    assert Job.objects.filter(status="completed").count() == 2
    assert not connection.needs_rollback


def _show(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        row = cursor.fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.django_db
def test_a_handlers_set_does_not_outlive_its_attempt(handlers: Handlers) -> None:
    # in a worker the handler's connection is not the one its outcome is written on, and is
    # closed after the attempt: the helpers' statements, and the test's, never run under its SET
    names = ("search_path", "statement_timeout", "session_replication_role")
    before = [_show(name) for name in names]
    enqueue("hostile.tenant", {})
    enqueue("hostile.echo", {"n": 1})
    summary = drain()
    assert [run.result for run in summary.runs] == ["switched", {"n": 1}]
    assert [_show(name) for name in names] == before
    assert Job.objects.filter(status="completed").count() == 2
    assert perform_job("hostile.tenant").result == "switched"
    assert [_show(name) for name in names] == before


@pytest.mark.django_db
@pytest.mark.parametrize("raise_on_failure", [True, False])
def test_ctrl_c_in_a_handler_stops_the_test_run(handlers: Handlers, raise_on_failure: bool) -> None:
    interrupted = enqueue("hostile.interrupted", {}, priority=1)
    enqueue("hostile.echo", {"n": 1})
    with pytest.raises(KeyboardInterrupt):
        drain(raise_on_failure=raise_on_failure)
    # its outcome written, the job claimed with it given back untouched
    assert Job.objects.get(pk=interrupted.pk).status == "retrying"
    assert Job.objects.get(job_type="hostile.echo").status == "pending"
    with pytest.raises(KeyboardInterrupt):
        perform_job("hostile.interrupted", raise_on_failure=raise_on_failure)


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["complete", "running", ["pending", "done"]])
def test_a_status_no_job_has_is_refused(handlers: Handlers, status: Any) -> None:
    # else it matched nothing, and every refute_enqueued() given it passed
    enqueue("hostile.echo", {"n": 1})
    drain()
    for helper in (refute_enqueued, enqueued_jobs, assert_enqueued):
        with pytest.raises(ValueError, match="a job's status is one of waiting, pending, leased"):
            helper("hostile.echo", status=status)


@pytest.mark.django_db
def test_a_status_given_as_a_generator(handlers: Handlers) -> None:
    enqueue("hostile.echo", {"n": 1})
    statuses = (status for status in ["completed", "dead"])
    with pytest.raises(AssertionError, match=r"status in \('completed', 'dead'\)\), found none"):
        assert_enqueued("hostile.echo", status=statuses)


@pytest.mark.django_db
@pytest.mark.parametrize("count", [0, -1, True, 1.5])
def test_a_count_that_is_no_positive_number_is_refused(handlers: Handlers, count: Any) -> None:
    # count=0 failed whatever the table held: "expected a job enqueued ..., found none"
    with pytest.raises(ValueError, match="refute_enqueued"):
        assert_enqueued("hostile.echo", count=count)


@pytest.mark.django_db
def test_the_nearest_jobs_of_a_large_table_say_how_many_are_not_listed(
    handlers: Handlers,
) -> None:
    enqueue_many([{"job_type": "hostile.echo", "payload": {"n": n}} for n in range(300)])
    with pytest.raises(AssertionError) as raised:
        assert_enqueued("hostile.other", payload={"n": -1})
    message = str(raised.value)
    assert "the nearest to it of the newest 200 of the 300 jobs in the table" in message
    assert message.endswith("... and 290 more")
    assert len(message.splitlines()) == 12
    with pytest.raises(AssertionError) as raised:
        refute_enqueued("hostile.echo")
    assert str(raised.value).endswith("... and 290 more")


@pytest.mark.django_db
def test_a_job_due_by_the_clock_runs_though_the_transactions_now_stands_still(
    handlers: Handlers,
) -> None:
    # now() is the time the test's transaction began (a TestCase's: its class's): a run_at
    # from Python's clock, "now", is after it
    assert not Job.objects.exists()
    time.sleep(0.05)
    enqueue("hostile.echo", {"n": "now"}, run_at=timezone.now())
    enqueue("hostile.echo", {"n": "later"}, run_at=timedelta(hours=1))
    summary = drain()
    assert [run.payload["n"] for run in summary.runs] == ["now"]
    assert_enqueued("hostile.echo", payload={"n": "later"})
    # a snooze (a retry's back-off likewise) that has passed by the clock, as a worker sees it
    enqueue("hostile.snoozes", {})
    summary = drain(retry_at_once=False)
    assert [(run.snoozed, run.status) for run in summary.runs] == [(True, "retrying")]
    assert len(drain(retry_at_once=False)) == 0  # not yet
    time.sleep(0.3)
    assert [run.result for run in drain(retry_at_once=False).runs] == ["woke"]


@pytest.mark.django_db
def test_a_handler_that_drains_then_closes_the_connection(handlers: Handlers) -> None:
    # the inner drain() gave the connection its close() back while the outer handler ran
    enqueue("hostile.drains_then_closes", {})
    enqueue("hostile.echo", {"n": 1}, queue="notifications")  # claimed after "default"'s
    summary = drain()
    assert [run.result for run in summary.runs] == [1], summary
    assert not connection.closed_in_transaction
    assert "close" not in connection.__dict__
    assert Job.objects.filter(status="completed").count() == 2


@pytest.mark.django_db
def test_the_relays_bound_names_the_events_projected_in_all(handlers: Handlers) -> None:
    publish("hostile.ping", aggregate_type="a", aggregate_id=uuid.uuid4(), payload={})
    enqueue("hostile.publishes", {"aggregate": str(uuid.uuid4()), "events": 5})
    with pytest.raises(DrainLimitExceeded) as raised:
        drain(relay=True, max_events=3)
    # the bound is the drain's, not what was left of it in its last round
    assert raised.value.summary.events == 3
    assert "drain() stopped after 3 events" in str(raised.value)


@pytest.mark.django_db
def test_job_types_held_back_by_a_limited_queue_are_said_so(handlers: Handlers) -> None:
    # the queue's claim takes the first job in its order, of another type, and gives it back:
    # the job of the type asked for is never reached, which the summary said nothing of
    enqueue("hostile.echo", {"n": "first"}, priority=5)
    enqueue("hostile.tenant", {})
    resize_queue("default", max_running=1)
    summary = drain(job_types="hostile.tenant")
    assert len(summary) == 0
    assert summary.held_back == {"default"}
    assert "jobs due but not claimed (MAX_RUNNING, RATE_LIMIT, other types first): default" in (
        repr(summary)
    )
    assert Job.objects.get(job_type="hostile.echo").attempts == 0  # given back untouched
    assert drain().job_types == ["hostile.echo", "hostile.tenant"]


@pytest.mark.django_db
def test_an_event_available_by_the_clock_is_projected(handlers: Handlers) -> None:
    assert not OutboxEvent.objects.exists()
    time.sleep(0.05)
    publish(
        "hostile.ping",
        aggregate_type="a",
        aggregate_id=uuid.uuid4(),
        payload={},
        available_at=timezone.now(),
    )
    publish(
        "hostile.ping",
        aggregate_type="a",
        aggregate_id=uuid.uuid4(),
        payload={},
        available_at=timezone.now() + timedelta(hours=1),
    )
    assert run_relay() == 1
    assert drain(relay=True).events == 0


@pytest.mark.django_db
def test_assertions_on_a_large_table_read_only_what_they_list(
    handlers: Handlers, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue_many([{"job_type": "hostile.echo", "payload": {"n": n}} for n in range(2000)])
    built: list[Job] = []
    from_db = Job.from_db.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Job], *args: Any, **kwargs: Any) -> Job:
        built.append(from_db(cls, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(Job, "from_db", classmethod(counted))
    assert assert_enqueued("hostile.echo").payload == {"n": 0}
    with pytest.raises(AssertionError) as raised:
        assert_enqueued("hostile.echo", count=3)
    assert "found 2000:" in str(raised.value)
    assert str(raised.value).endswith("... and 1,990 more")
    with pytest.raises(AssertionError) as raised:
        refute_enqueued("hostile.echo")
    assert "found 2000:" in str(raised.value)
    assert len(built) <= 3 * 11  # every one of the 2,000 read each time, before


@pytest.mark.django_db
def test_a_rate_limited_queue_whose_tokens_are_spent_is_said_so(handlers: Handlers) -> None:
    for n in range(3):
        enqueue("hostile.echo", {"n": n})
    resize_queue("default", rate_limit=1)  # its tokens come back with a clock that stands still
    summary = drain()
    assert summary.completed == 1
    assert summary.held_back == {"default"}
    assert_enqueued("hostile.echo", count=2)


@pytest.mark.django_db(transaction=True)
def test_a_handlers_set_on_a_persistent_connection_in_a_transactional_test(
    handlers: Handlers,
) -> None:
    # CONN_MAX_AGE = None: the connection outlives each attempt, as the helpers' statements do
    connection.ensure_connection()
    connection.close_at = None
    names = ("search_path", "statement_timeout", "session_replication_role")
    before = [_show(name) for name in names]
    enqueue("hostile.tenant", {})
    enqueue("hostile.echo", {"n": 1})
    summary = drain()
    assert [run.result for run in summary.runs] == ["switched", {"n": 1}]
    assert [_show(name) for name in names] == before
    assert not connection.in_atomic_block


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("how", "raised"),
    [
        ("fail", pytest.fail.Exception),
        ("skip", pytest.skip.Exception),
        ("unittest", unittest.SkipTest),
    ],
)
def test_a_test_frameworks_outcome_in_a_handler_ends_the_test(
    handlers: Handlers, how: str, raised: type[BaseException]
) -> None:
    # swallowed as one more failed attempt with raise_on_failure=False, and a pytest.skip()
    # failed the test as AttemptFailed with it
    for raise_on_failure in (True, False):
        enqueue("hostile.fails_the_test", {"how": how})
        with pytest.raises(raised):
            drain(raise_on_failure=raise_on_failure)
        with pytest.raises(raised):
            perform_job("hostile.fails_the_test", {"how": how}, raise_on_failure=raise_on_failure)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: run_jobs(limit=0), "limit must be a whole number from 1, not 0"),
        (
            lambda: run_jobs(limit=1.5),  # type: ignore[arg-type]
            "limit must be a whole number from 1, not 1.5",
        ),
        (lambda: drain(max_jobs=-1), "max_jobs must be a whole number from 0, not -1"),
        (lambda: drain(max_events=-1), "max_events must be a whole number from 0"),
        (lambda: run_relay(max_events=-5), "max_events must be a whole number from 0"),
        (lambda: drain(queues=[]), "queues= names no queue"),
        (lambda: run_jobs(job_types=[]), "job_types= names no job type"),
    ],
)
def test_bounds_and_filters_that_mean_nothing_are_refused(
    handlers: Handlers, call: Any, message: str
) -> None:
    # each ran nothing, and said so only as "jobs due but not claimed", or said nothing
    enqueue("hostile.echo", {"n": 1})
    with pytest.raises(ValueError, match=message):
        call()
    assert_enqueued("hostile.echo", status="pending")


@pytest.mark.django_db
def test_a_drain_without_the_relay_says_what_it_left_unprojected(handlers: Handlers) -> None:
    # the job published events whose subscribers would enqueue more: the summary said nothing
    enqueue("hostile.publishes", {"aggregate": str(uuid.uuid4()), "events": 2})
    summary = drain()
    assert summary.completed == 1
    assert summary.events_waiting == 2
    assert "2 outbox event(s) not projected (drain(relay=True) projects them)" in repr(summary)
    summary = drain(relay=True)
    assert (summary.events, summary.events_waiting) == (2, 0)
    assert drain().events_waiting == 0


@pytest.mark.django_db(databases=["default", "secondary"])
def test_a_handler_of_another_database_sets_on_the_default_connection(
    handlers: Handlers,
) -> None:
    # drain(using="secondary") runs a handler that SETs on default's connection
    before = _show("search_path")
    enqueue("hostile.tenant", {}, using="secondary")
    assert drain(using="secondary").runs[0].result == "switched"
    assert _show("search_path") == before
    enqueue("hostile.echo", {"n": 1})
    assert drain().completed == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"x": [1, math.nan]}, "payload['x'][1]"),
        ({"name": "\ud800"}, "payload['name']"),
        ({"tags": {"a"}}, "payload['tags']"),
    ],
)
def test_a_payload_to_match_that_json_cannot_carry_is_refused(
    handlers: Handlers, payload: dict[str, Any], where: str
) -> None:
    # NaN and a lone surrogate reached PostgreSQL, which refused them and left the test's
    # transaction aborted: every query after failed
    enqueue("hostile.echo", {"n": 1})
    for helper in (assert_enqueued, refute_enqueued, enqueued_jobs):
        with pytest.raises(InvalidInput) as raised:
            helper("hostile.echo", payload=payload)
        assert raised.value.field == where
        with pytest.raises(InvalidInput):
            helper("hostile.echo", payload_contains=payload)
    assert_enqueued("hostile.echo", payload={"n": 1})


@pytest.mark.django_db
def test_a_filter_postgresql_refuses_leaves_the_tests_transaction(handlers: Handlers) -> None:
    enqueue("hostile.echo", {"n": 1})
    for helper in (assert_enqueued, refute_enqueued, enqueued_jobs):
        with pytest.raises(DataError):
            helper("hostile.echo", payload__contains={"x": math.nan})
    assert_enqueued("hostile.echo", payload={"n": 1})


@pytest.mark.django_db(databases=["default", "secondary"])
def test_an_orm_error_caught_on_another_database(handlers: Handlers) -> None:
    # the handler of a default job caught an IntegrityError on "secondary": that database's
    # transaction was left aborted for the test
    enqueue("hostile.duplicate_caught_on", {"database": "secondary"})
    assert drain().runs[0].result == "caught"
    assert not SideEffect.objects.using("secondary").exists()
    assert not connections["secondary"].needs_rollback
    enqueue("hostile.echo", {"n": 1}, using="secondary")
    assert drain(using="secondary").completed == 1


class TestInATestCase(TestCase):
    """One transaction for the class, whose now() is its first query's time, and a savepoint
    for each test: what one test's handlers did is not there for the next."""

    setup_job: Job

    @classmethod
    def setUpTestData(cls) -> None:
        cls.setup_job = enqueue("hostile.echo", {"n": "from setUpTestData"})

    def setUp(self) -> None:
        self.handlers = Handlers()
        self.addCleanup(self.handlers.restore)

    def test_a_handler_sets_the_search_path_and_the_test_fails_midway(self) -> None:
        enqueue("hostile.tenant", {})
        summary = drain()
        assert summary.completed == 2
        time.sleep(0.02)
        enqueue("hostile.echo", {"n": "now"}, run_at=timezone.now())
        assert drain().completed == 1
        with pytest.raises(AttemptFailed):
            enqueue("hostile.nobody", {})  # no such handler: a dead letter
            drain()

    def test_b_the_next_test_sees_the_setup_job_alone(self) -> None:
        assert [job.pk for job in enqueued_jobs()] == [self.setup_job.pk]
        assert _show("search_path") != "hostile_tenant"
        time.sleep(0.02)  # the class's now() is further behind
        enqueue("hostile.echo", {"n": "now"}, run_at=timezone.now())
        assert drain().completed == 2

    def test_an_orm_error_the_handler_caught_leaves_the_class_transaction(self) -> None:
        enqueue("hostile.duplicate_caught", {})
        assert drain(job_types="hostile.duplicate_caught").runs[0].result == "caught"
        assert not SideEffect.objects.exists()

    def test_the_next_test_runs(self) -> None:
        enqueue("hostile.echo", {"n": 2})
        assert drain().completed == 2  # and the job of setUpTestData


class TestInATransactionTestCase(TransactionTestCase):
    """No transaction around the test: the helpers' statements commit as a worker's do, and
    the table is emptied after each test."""

    def setUp(self) -> None:
        self.handlers = Handlers()
        self.addCleanup(self.handlers.restore)

    def test_a_handlers_orm_error_and_set_in_autocommit(self) -> None:
        search_path = _show("search_path")
        enqueue("hostile.duplicate_caught", {})
        enqueue("hostile.tenant", {})
        summary = drain()
        assert [run.result for run in summary.runs] == ["caught", "switched"]
        # in autocommit the first insert stays, as in a worker
        assert SideEffect.objects.count() == 1
        assert _show("search_path") == search_path
        assert not connection.in_atomic_block

    def test_the_next_test_starts_empty(self) -> None:
        refute_enqueued(status=None)
        assert not SideEffect.objects.exists()
