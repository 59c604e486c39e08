"""``django_pgoutbox.testing`` under the habits of a user's own tests and handlers: an ORM
error caught without a savepoint, a handler that changes its connection's settings, Ctrl-C, a
handler that calls the helpers, a clock that stands still in the test's transaction, and
assertions given what they cannot mean."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test import TestCase

from django_pgoutbox import JobContext, enqueue, job, outbox
from django_pgoutbox.models import Job
from django_pgoutbox.registry import registered_jobs, restore_registry
from django_pgoutbox.testing import drain, perform_job
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
                cursor.execute("CREATE SCHEMA IF NOT EXISTS hostile_tenant")
                cursor.execute("SET search_path TO hostile_tenant")
                cursor.execute("SET statement_timeout = '7s'")
            return "switched"

        @job("hostile.interrupted")
        def interrupted(payload: dict[str, Any], ctx: JobContext) -> None:
            raise KeyboardInterrupt  # Ctrl-C, delivered to the main thread the handler runs on

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
    search_path, timeout = _show("search_path"), _show("statement_timeout")
    enqueue("hostile.tenant", {})
    enqueue("hostile.echo", {"n": 1})
    summary = drain()
    assert [run.result for run in summary.runs] == ["switched", {"n": 1}]
    assert (_show("search_path"), _show("statement_timeout")) == (search_path, timeout)
    assert Job.objects.filter(status="completed").count() == 2
    assert perform_job("hostile.tenant").result == "switched"
    assert _show("search_path") == search_path


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


class TestInATestCase(TestCase):
    def setUp(self) -> None:
        self.handlers = Handlers()
        self.addCleanup(self.handlers.restore)

    def test_an_orm_error_the_handler_caught_leaves_the_class_transaction(self) -> None:
        enqueue("hostile.duplicate_caught", {})
        assert drain().runs[0].result == "caught"
        assert not SideEffect.objects.exists()

    def test_the_next_test_runs(self) -> None:
        enqueue("hostile.echo", {"n": 2})
        assert drain().completed == 1
