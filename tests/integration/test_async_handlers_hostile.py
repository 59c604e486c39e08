"""``async def`` handlers drained by a burst worker in this process, with what users hang on
them: sync receivers of the job signals that use the ORM, the sync ORM itself.

``transaction=True``: the worker's threads see only committed jobs.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from django_pgoutbox import JobContext, enqueue, enqueue_many, job, signals
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.conftest import drain

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast(settings: Any) -> Any:
    settings.PGOUTBOX = {
        **settings.PGOUTBOX,
        "POLL_INTERVAL": 0.2,
        "RETRY": {"BASE_DELAY": 0.05, "MAX_DELAY": 0.05, "JITTER": 0},
    }
    return settings


def _write(event: str, job: Any) -> None:
    SideEffect.objects.create(
        job_id=job.id,
        attempt=job.attempt,
        event=event,
        pid=os.getpid(),
        worker_thread=threading.current_thread().name,
    )


def test_sync_receivers_of_the_job_signals_use_the_orm() -> None:
    """A receiver of ``job_started`` / ``job_finished`` is a plain function, as for a thread's
    attempt: its ORM calls must work for a coroutine's too (not SynchronousOnlyOperation)."""

    def started(sender: Any, job: Any, **kwargs: Any) -> None:
        _write("signal-start", job)

    def finished(sender: Any, job: Any, **kwargs: Any) -> None:
        _write("signal-" + kwargs["outcome"], job)

    signals.job_started.connect(started, dispatch_uid="test_async_hostile.started")
    signals.job_finished.connect(finished, dispatch_uid="test_async_hostile.finished")
    try:
        row = enqueue("tests.async_behave", {"sleep": 0.01})
        drain()
    finally:
        signals.job_started.disconnect(dispatch_uid="test_async_hostile.started")
        signals.job_finished.disconnect(dispatch_uid="test_async_hostile.finished")
    row.refresh_from_db()
    assert row.status == JobStatus.COMPLETED
    events = set(SideEffect.objects.filter(job_id=row.pk).values_list("event", flat=True))
    assert {"signal-start", "signal-completed"} <= events
    assert Job.objects.filter(pk=row.pk, status=JobStatus.COMPLETED).exists()


def test_an_async_task_with_sync_receivers_of_djangos_task_signals() -> None:
    """Django's ``task_started`` / ``task_finished`` of an ``async def`` task (sent from the
    job's hooks) reach plain receivers that use the ORM."""
    from django_pgoutbox._tasks import task_finished, task_started
    from testproject.testjobs import tasks

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        _write_task("task-start", task_result)

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        _write_task("task-" + str(task_result.status).lower(), task_result)

    task_started.connect(started, dispatch_uid="test_async_hostile.task_started")
    task_finished.connect(finished, dispatch_uid="test_async_hostile.task_finished")
    try:
        result = tasks.async_double.enqueue(21)
        drain(queues=["default", "reports"])
    finally:
        task_started.disconnect(dispatch_uid="test_async_hostile.task_started")
        task_finished.disconnect(dispatch_uid="test_async_hostile.task_finished")
    assert tasks.async_double.get_result(result.id).return_value == 42
    events = set(SideEffect.objects.filter(job_id=result.id).values_list("event", flat=True))
    assert events == {"task-start", "task-successful"}


def _write_task(event: str, task_result: Any) -> None:
    SideEffect.objects.create(
        job_id=task_result.id,
        attempt=0,
        event=event,
        pid=os.getpid(),
        worker_thread=threading.current_thread().name,
    )


def test_the_sync_orm_called_in_a_coroutine_is_its_failure(registry: None) -> None:
    """Django refuses the sync ORM on the loop's thread: SynchronousOnlyOperation is the
    attempt's failure, retried, then dead; the innocents beside it complete."""

    @job("tests.async_sync_orm", max_attempts=2)
    async def sync_orm(payload: dict[str, Any], ctx: JobContext) -> Any:
        return SideEffect.objects.count()

    bad = enqueue("tests.async_sync_orm", {})
    innocents = enqueue_many([{"job_type": "tests.async_behave", "payload": {"sleep": 0.05}}] * 5)
    drain()
    bad.refresh_from_db()
    assert (bad.status, bad.last_error_code) == (JobStatus.DEAD, "SynchronousOnlyOperation")
    rows = Job.objects.filter(pk__in=[row.pk for row in innocents])
    assert {row.status for row in rows} == {JobStatus.COMPLETED}


def test_a_sequence_of_coroutines_runs_one_at_a_time_in_order() -> None:
    """Jobs of one sequence whose handler is a coroutine: the loop has room for all of them
    at once, yet each starts after the one before it ended."""
    jobs = [
        enqueue("tests.async_behave", {"sleep": 0.05, "n": n}, sequence="async-hostile")
        for n in range(6)
    ]
    drain()
    rows = Job.objects.filter(pk__in=[row.pk for row in jobs])
    assert {row.status for row in rows} == {JobStatus.COMPLETED}
    effects = list(
        SideEffect.objects.filter(job_id__in=[row.pk for row in jobs]).order_by("at", "pk")
    )
    order = [(effect.job_id, effect.event) for effect in effects]
    assert order == [(row.pk, event) for row in jobs for event in ("start", "end")]


def test_an_async_task_with_djangos_receivers_alone_stays_on_the_loop(
    monkeypatch: Any, caplog: Any
) -> None:
    """Django's own receivers of its task signals (log lines, always connected) run on the
    loop's thread as they are: no call in another thread per attempt for them alone."""
    from django_pgoutbox.worker import execute_async
    from testproject.testjobs import tasks

    calls: list[Any] = []
    real = sync_to_async

    def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(func)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(execute_async, "sync_to_async", counting)
    caplog.set_level("DEBUG")
    results = [tasks.async_double.enqueue(n) for n in range(5)]
    drain(queues=["default", "reports"])
    assert [tasks.async_double.get_result(r.id).return_value for r in results] == [0, 2, 4, 6, 8]
    assert calls == []
    own = [r for r in caplog.records if r.name.startswith(("django.tasks", "django_tasks"))]
    assert len(own) >= 10  # Django's log lines still: started and finished, each task
