"""The django.tasks backend: Django's documented task behaviours, run by a real worker."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_pgoutbox._tasks import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgoutbox.backend import PgOutboxBackend
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs import tasks
from tests.conftest import drain
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)  # the worker threads see only commits

FAST_RETRY = {"RETRY": {"BASE_DELAY": 0.01, "MAX_DELAY": 0.01, "JITTER": 0}}


def run_worker(queues: tuple[str, ...] = ("default", "reports")) -> None:
    drain(queues=list(queues))


def local_function() -> None:
    def nested() -> None:
        pass

    return task()(nested)  # type: ignore[no-any-return]


class TestBackend:
    def test_capabilities(self) -> None:
        backend = tasks.add.get_backend()
        assert isinstance(backend, PgOutboxBackend)
        assert backend.supports_defer
        assert backend.supports_async_task
        assert backend.supports_get_result
        assert backend.supports_priority
        assert backend.queues == {
            "default",
            "critical_alerts",
            "notifications",
            "webhooks",
            "location_derivation",
            "reports",
            "exports",
            "maintenance",
        }

    def test_a_task_is_stored_as_a_job(self) -> None:
        later = timezone.now() + timedelta(hours=1)
        result = tasks.report.using(run_after=later).enqueue("fleet", rows=3)
        job = Job.objects.get(pk=result.id)
        assert job.job_type == "testproject.testjobs.tasks.report"
        assert (job.queue, job.priority, job.run_at) == ("reports", 7, later)
        assert job.payload == {
            "task": {"backend": "default"},
            "args": ["fleet"],
            "kwargs": {"rows": 3},
        }
        assert result.status == TaskResultStatus.READY
        assert result.enqueued_at == job.created_at

    @pytest.mark.parametrize(
        ("make", "message"),
        [
            (lambda: tasks.add.using(priority=101), "priority must be a whole number"),
            (lambda: tasks.add.using(priority=-101), "priority must be a whole number"),
            (lambda: tasks.add.using(queue_name="nope"), "Queue 'nope' is not valid"),
            (lambda: tasks.add.using(run_after=datetime(2030, 1, 1)), "must be an aware datetime"),
            (local_function, "module level"),
        ],
    )
    def test_invalid_tasks_are_refused(self, make: Any, message: str) -> None:
        with pytest.raises(InvalidTask, match=message):
            make()

    def test_takes_context_needs_a_context_argument(self) -> None:
        def no_context(x: int) -> None:
            pass

        no_context.__module__ = tasks.__name__
        no_context.__qualname__ = "no_context"
        with pytest.raises(InvalidTask, match="first argument of 'context'"):
            task(takes_context=True)(no_context)

    def test_arguments_must_be_json(self) -> None:
        with pytest.raises((TypeError, ValueError)):
            tasks.add.enqueue(object(), 1)
        assert not Job.objects.exists()

    def test_enqueue_joins_the_transaction(self) -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(1, 2)
            raise RuntimeError
        assert not Job.objects.exists()

    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_pgoutbox.backend.PgOutboxBackend",
                "OPTIONS": {"ENQUEUE_ON_COMMIT": True},
            }
        }
    )
    def test_enqueue_on_commit(self) -> None:
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            assert not Job.objects.exists()  # not until the commit
        assert Job.objects.get().id.hex == result.id.replace("-", "")
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(3, 4)
            raise RuntimeError
        assert Job.objects.count() == 1

    def test_unknown_result(self) -> None:
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add.get_result("00000000-0000-7000-8000-000000000000")
        with pytest.raises(TaskResultDoesNotExist):
            tasks.add.get_result("not-a-uuid")
        plain = Job.objects.create(queue="default", job_type="x", payload={})
        with pytest.raises(TaskResultDoesNotExist):  # a job, but not a task
            tasks.add.get_result(str(plain.id))


class TestRunning:
    def test_successful_result(self) -> None:
        result = tasks.add.enqueue(2, 3)
        run_worker()
        fetched = tasks.add.get_result(result.id)
        assert fetched.status == TaskResultStatus.SUCCESSFUL
        assert fetched.return_value == 5
        assert (fetched.args, fetched.kwargs) == ([2, 3], {})
        assert fetched.errors == []
        assert fetched.attempts == 1
        assert len(fetched.worker_ids) == 1
        assert fetched.enqueued_at <= fetched.started_at <= fetched.finished_at
        assert fetched.last_attempted_at == fetched.started_at
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 5

    def test_async_task_runs_on_an_event_loop(self) -> None:
        result = tasks.async_double.enqueue(21)
        run_worker()
        assert tasks.async_double.get_result(result.id).return_value == 42

    def test_async_tasks_run_on_the_queues_event_loop(self) -> None:
        results = [tasks.async_where.enqueue() for _ in range(5)]
        run_worker()
        for result in results:
            value = tasks.async_where.get_result(result.id).return_value
            assert value["attempt"] == 1
            assert value["thread"].startswith("pgoutbox-default-loop-")

    def test_aenqueue_and_aget_result(self) -> None:
        from asgiref.sync import async_to_sync

        result = async_to_sync(tasks.add.aenqueue)(4, 4)
        run_worker()
        fetched = async_to_sync(tasks.add.aget_result)(result.id)
        assert fetched.return_value == 8

    def test_context_sees_the_attempt(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, **FAST_RETRY}
        result = tasks.flaky.enqueue(fail_until=3)

        def succeeded() -> bool:
            run_worker()  # runs the attempt whose delay is over
            return bool(tasks.flaky.get_result(result.id).status == TaskResultStatus.SUCCESSFUL)

        wait_for(succeeded, timeout=30)
        fetched = tasks.flaky.get_result(result.id)
        assert fetched.return_value == {"attempt": 3, "workers": 3}
        assert fetched.attempts == 3

    def test_failure_has_class_path_and_bounded_traceback(self) -> None:
        result = tasks.broken.enqueue()
        run_worker()
        fetched = tasks.broken.get_result(result.id)
        assert fetched.status == TaskResultStatus.FAILED
        assert Job.objects.get(pk=result.id).status == JobStatus.DEAD
        [error] = fetched.errors
        assert error.exception_class_path == "django_pgoutbox.errors.PermanentError"
        assert error.exception_class.__name__ == "PermanentError"
        assert "cannot ever work" in error.traceback
        assert "Traceback" in error.traceback or error.traceback.startswith("...")
        assert len(error.traceback) <= 1000
        with pytest.raises(ValueError, match="Task failed"):
            _ = fetched.return_value

    def test_non_json_return_value_fails_clearly(self) -> None:
        result = tasks.returns_object.enqueue()
        run_worker()
        fetched = tasks.returns_object.get_result(result.id)
        assert fetched.status == TaskResultStatus.FAILED
        assert fetched.errors[0].exception_class_path == "invalid_result"
        assert "not JSON" in fetched.errors[0].traceback

    def test_result_before_running(self) -> None:
        result = tasks.add.enqueue(1, 1)
        fetched = tasks.add.get_result(result.id)
        assert fetched.status == TaskResultStatus.READY
        assert fetched.started_at is None
        with pytest.raises(ValueError, match="not finished"):
            _ = fetched.return_value

    def test_priority_orders_the_queue(self) -> None:
        low = tasks.add.using(priority=-5).enqueue(0, 0)
        high = tasks.add.using(priority=50).enqueue(0, 1)
        drain(concurrency=1)
        first = Job.objects.order_by("locked_at").first()
        assert first is not None
        assert str(first.id) == high.id
        assert Job.objects.get(pk=low.id).priority == -5

    def test_signals(self) -> None:
        received: list[tuple[str, Any]] = []

        def on(name: str) -> Any:
            def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
                received.append((name, task_result.status))

            return receiver

        receivers = {
            signal: on(name)
            for signal, name in (
                (task_enqueued, "enqueued"),
                (task_started, "started"),
                (task_finished, "finished"),
            )
        }
        for signal, receiver in receivers.items():
            signal.connect(receiver)
        try:
            tasks.add.enqueue(1, 2)
            tasks.broken.enqueue()
            run_worker()
        finally:
            for signal, receiver in receivers.items():
                signal.disconnect(receiver)
        assert received.count(("enqueued", TaskResultStatus.READY)) == 2
        assert received.count(("started", TaskResultStatus.RUNNING)) == 2
        assert ("finished", TaskResultStatus.SUCCESSFUL) in received
        assert ("finished", TaskResultStatus.FAILED) in received
