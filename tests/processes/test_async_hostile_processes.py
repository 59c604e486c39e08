"""Hostile ``async def`` handlers in a real ``runworkers`` process: what they leave running
must not keep the process from stopping, and a loop left behind while merely slow writes no
outcome twice."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from django_pgoutbox import enqueue, enqueue_many
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"LEASE_SECONDS": 2, "POLL_INTERVAL": 0.2}


def _innocents(count: int, sleep: float = 0.05) -> list[Job]:
    return list(
        enqueue_many([{"job_type": "tests.async_behave", "payload": {"sleep": sleep}}] * count)
    )


def _all(jobs: list[Job], status: str) -> bool:
    return Job.objects.filter(pk__in=[job.pk for job in jobs], status=status).count() == len(jobs)


@pytest.mark.parametrize("kind", ["pool_hog", "sensitive_hog"])
def test_sigterm_with_a_thread_held_by_a_coroutine(start_worker: Any, kind: str) -> None:
    """A coroutine that holds a thread (``asyncio.to_thread``, ``sync_to_async``) past the
    grace period: its job is released and the process exits at the first SIGTERM."""
    hog = enqueue("tests.async_hostile", {"kind": kind})
    worker = start_worker("--queues", "default", "--grace-period", "0.5", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=hog.pk, event="start").exists())
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=scaled(15)) == 0
    assert time.monotonic() - started < scaled(5)
    hog.refresh_from_db()
    assert (hog.status, hog.last_error_code) == (JobStatus.DEAD, "worker_shutdown")  # 1 attempt


def test_a_loop_left_behind_while_merely_slow_writes_nothing_late(start_worker: Any) -> None:
    """A coroutine blocks its loop for 3 s, then returns: the loop was left behind after a
    third of the lease, its attempts' leases expired into recovery. What the loop does when it
    wakes (the blocker's result, the innocents cancelled at its retirement) is written for
    none of them: the blocker stays dead for its lost lease, the innocents complete once more."""
    innocents = _innocents(5, sleep=0.5)
    blocker = enqueue("tests.async_hostile", {"kind": "block", "seconds": 3, "sleep": 0.1})
    worker = start_worker("--queues", "default", **QUICK)
    wait_for(lambda: _all(innocents, JobStatus.COMPLETED), timeout=60)
    wait_for(lambda: Job.objects.filter(pk=blocker.pk, status=JobStatus.DEAD).exists())
    time.sleep(scaled(3))  # the loop woke up meanwhile, and retired
    blocker.refresh_from_db()
    assert (blocker.status, blocker.last_error_code) == (JobStatus.DEAD, "lease_expired")
    assert blocker.result is None
    rows = Job.objects.filter(pk__in=[job.pk for job in innocents])
    assert {row.status for row in rows} == {JobStatus.COMPLETED}
    assert {row.last_error_code for row in rows} <= {None, "lease_expired"}
    assert "has not answered" in worker.output()
    assert worker.process.poll() is None
    after = _innocents(10)
    wait_for(lambda: _all(after, JobStatus.COMPLETED))


def test_a_loop_left_behind_blocked_recycles_the_process(start_worker: Any) -> None:
    """The thread of a loop that a coroutine blocks for good is an abandoned thread: with
    ``--max-abandoned-threads 1`` the process recycles (its blocked thread gone), and goes on
    with the innocents."""
    blocker = enqueue("tests.async_hostile", {"kind": "block", "sleep": 0.1})
    worker = start_worker("--queues", "default", "--max-abandoned-threads", "1", **QUICK)
    wait_for(lambda: "recycled" in worker.output(), timeout=60)
    assert "abandoned" in worker.output()
    blocker.refresh_from_db()
    assert worker.process.poll() is None
    after = _innocents(10)
    wait_for(lambda: _all(after, JobStatus.COMPLETED), timeout=60)


@pytest.mark.xfail(
    strict=True,
    reason="the async ORM of every coroutine runs in asgiref's one thread-sensitive thread, "
    "which a coroutine holding it (sync_to_async of a blocking call) holds for all of them",
)
def test_a_coroutine_holding_the_thread_sensitive_thread(start_worker: Any) -> None:
    """``await sync_to_async(time.sleep)(10)`` beside innocents that use the async ORM: the
    innocents wait for it, though the loop itself is free."""
    hog = enqueue("tests.async_hostile", {"kind": "sensitive_hog", "seconds": 10})
    start_worker("--queues", "default", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=hog.pk, event="start").exists())
    innocents = _innocents(5)
    started = time.monotonic()
    wait_for(lambda: _all(innocents, JobStatus.COMPLETED), timeout=30)
    assert time.monotonic() - started < scaled(3)


def test_max_jobs_recycles_with_coroutines_in_flight(start_worker: Any) -> None:
    """``--max-jobs`` reached while coroutines run: they finish, the unstarted ones go back,
    the process starts again and runs the rest; each job ends once, none runs twice."""
    jobs = _innocents(120, sleep=0.3)
    worker = start_worker(
        "--queues",
        "default",
        "--max-jobs",
        "30",
        QUEUES={"default": {"ASYNC_CONCURRENCY": 40}},
        **QUICK,
    )
    wait_for(lambda: _all(jobs, JobStatus.COMPLETED), timeout=90)
    assert "recycled" in worker.output()
    assert worker.process.poll() is None
    ends = SideEffect.objects.filter(job_id__in=[job.pk for job in jobs], event="end")
    assert ends.count() == 120
    assert len(set(ends.values_list("job_id", flat=True))) == 120
