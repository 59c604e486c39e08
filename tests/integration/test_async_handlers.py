"""``async def`` handlers on the queue's event loop, drained by a burst worker in this process.

``transaction=True``: the worker's threads see only committed jobs.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_pgoutbox import enqueue, enqueue_many
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.conftest import drain

pytestmark = pytest.mark.django_db(transaction=True)


def _result(row: Job) -> dict[str, Any]:
    assert isinstance(row.result, dict)
    return row.result


def _statuses(jobs: list[Job]) -> dict[Any, tuple[str, str | None]]:
    rows = Job.objects.filter(pk__in=[job.pk for job in jobs])
    return {row.pk: (row.status, row.last_error_code) for row in rows}


@pytest.fixture(autouse=True)
def fast(settings: Any) -> Any:
    settings.PGOUTBOX = {
        **settings.PGOUTBOX,
        "POLL_INTERVAL": 0.2,
        "QUEUES": {"default": {"ASYNC_CONCURRENCY": 50}},
        "RETRY": {"BASE_DELAY": 0.05, "MAX_DELAY": 0.05, "JITTER": 0},
    }
    return settings


def test_two_hundred_async_jobs_complete_on_the_event_loop() -> None:
    jobs = enqueue_many([{"job_type": "tests.async_behave", "payload": {"sleep": 0.01}}] * 200)
    drain()
    rows = Job.objects.filter(pk__in=[job.pk for job in jobs])
    assert {row.status for row in rows} == {JobStatus.COMPLETED}
    threads = {_result(row)["thread"] for row in rows}
    assert len(threads) == 1
    assert threads.pop().startswith("pgoutbox-default-loop-")
    assert SideEffect.objects.filter(event="end").count() == 200


def test_async_and_sync_jobs_mixed_in_one_queue() -> None:
    jobs = enqueue_many(
        [{"job_type": "tests.async_behave", "payload": {"sleep": 0.01}}] * 50
        + [{"job_type": "tests.behave", "payload": {}}] * 50
    )
    drain()
    rows = list(Job.objects.filter(pk__in=[job.pk for job in jobs]))
    assert {row.status for row in rows} == {JobStatus.COMPLETED}
    on_loop = [row for row in rows if row.job_type == "tests.async_behave"]
    on_threads = [row for row in rows if row.job_type == "tests.behave"]
    assert all(_result(row)["thread"].startswith("pgoutbox-default-loop-") for row in on_loop)
    assert all("pid" in _result(row) for row in on_threads)


def test_snooze_retries_and_failures_of_coroutines() -> None:
    snoozed = enqueue("tests.async_behave", {"snooze": 2})
    retried = enqueue("tests.async_behave", {"fail": "transient", "fail_attempts": 1})
    dead = enqueue("tests.async_behave", {"fail": "permanent"})
    revoked = enqueue("tests.async_behave", {"fail": "revoked"})
    for _ in range(20):
        drain()
        statuses = _statuses([snoozed, retried, dead, revoked])
        if all(status not in ("pending", "retrying") for status, _ in statuses.values()):
            break
    assert statuses[snoozed.pk][0] == JobStatus.COMPLETED
    snoozed.refresh_from_db()
    assert snoozed.attempts == 1  # a snooze gives its attempt back
    assert statuses[retried.pk] == (JobStatus.COMPLETED, "TransientError")
    assert statuses[dead.pk] == (JobStatus.DEAD, "PermanentError")
    assert statuses[revoked.pk] == (JobStatus.CANCELLED, "Revoked")


def test_sync_to_async_and_the_async_orm_from_a_coroutine() -> None:
    job = enqueue("tests.async_behave", {"through": "sync_to_async"})
    drain()
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert list(
        SideEffect.objects.filter(job_id=job.pk).order_by("id").values_list("event", flat=True)
    ) == ["start", "end"]


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        ("system_exit", JobStatus.DEAD, "SystemExit"),
        ("keyboard_interrupt", JobStatus.DEAD, "KeyboardInterrupt"),
        ("base_exception", JobStatus.DEAD, "BaseException"),
        ("non_json", JobStatus.DEAD, "invalid_result"),
        ("unprintable", JobStatus.DEAD, None),
        ("stop_loop", JobStatus.COMPLETED, None),
        ("close_loop", JobStatus.DEAD, "RuntimeError"),
        ("callback_exit", JobStatus.COMPLETED, None),
    ],
)
def test_a_hostile_coroutine_is_its_own_outcome_beside_innocents(
    kind: str, status: str, code: str | None
) -> None:
    innocents = enqueue_many([{"job_type": "tests.async_behave", "payload": {"sleep": 0.2}}] * 10)
    hostile = enqueue("tests.async_hostile", {"kind": kind, "sleep": 0.05})
    more = enqueue_many([{"job_type": "tests.async_behave", "payload": {"sleep": 0.1}}] * 10)
    drain()
    hostile.refresh_from_db()
    assert hostile.status == status, (hostile.last_error_code, hostile.last_error_summary)
    if code is not None:
        assert hostile.last_error_code == code
    elif status == JobStatus.DEAD:
        assert hostile.last_error_code
    statuses = _statuses([*innocents, *more])
    assert {status for status, _ in statuses.values()} == {JobStatus.COMPLETED}
