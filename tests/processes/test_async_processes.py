"""``async def`` handlers in a real ``runworkers`` process: the queue's event loop, beside its
handler threads, with hostile coroutines among innocent ones."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from django_pgoutbox import cancel, enqueue, enqueue_many
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


def _finished(job: Job) -> Job:
    wait_for(
        lambda: Job.objects.filter(
            pk=job.pk, status__in=[JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED]
        ).exists(),
        timeout=60,
    )
    job.refresh_from_db()
    return job


def _started(job: Job) -> Any:
    return lambda: SideEffect.objects.filter(job_id=job.pk, event="start").exists()


def test_two_hundred_async_jobs_complete(start_worker: Any) -> None:
    """The reproduction of the issue: each of them ended dead (``invalid_result``, a coroutine
    is not JSON) before handlers could be coroutines."""
    jobs = _innocents(200, sleep=0.05)
    start_worker("--queues", "default", QUEUES={"default": {"ASYNC_CONCURRENCY": 50}}, **QUICK)
    wait_for(lambda: _all(jobs, JobStatus.COMPLETED), timeout=60)
    results = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("result", flat=True)
    threads = {result["thread"] for result in results if isinstance(result, dict)}
    assert len(threads) == 1
    assert threads.pop().startswith("pgoutbox-default-loop-")


def test_hostile_coroutines_beside_innocents_and_sync_jobs(start_worker: Any) -> None:
    innocents = _innocents(30, sleep=0.2)
    sync_jobs = list(enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 10))
    kinds = {
        "system_exit": (JobStatus.DEAD, "SystemExit"),
        "keyboard_interrupt": (JobStatus.DEAD, "KeyboardInterrupt"),
        "base_exception": (JobStatus.DEAD, "BaseException"),
        "non_json": (JobStatus.DEAD, "invalid_result"),
        "unprintable": (JobStatus.DEAD, None),
        "stop_loop": (JobStatus.COMPLETED, None),
        "close_loop": (JobStatus.DEAD, "RuntimeError"),
        "callback_exit": (JobStatus.COMPLETED, None),
    }
    hostile = {kind: enqueue("tests.async_hostile", {"kind": kind}) for kind in kinds}
    more = _innocents(30, sleep=0.1)
    worker = start_worker("--queues", "default", **QUICK)
    wait_for(lambda: _all([*innocents, *more, *sync_jobs], JobStatus.COMPLETED), timeout=60)
    for kind, (status, code) in kinds.items():
        job = _finished(hostile[kind])
        assert job.status == status, (kind, job.last_error_code, job.last_error_summary)
        if code is not None:
            assert job.last_error_code == code, kind
    assert worker.process.poll() is None
    after = _innocents(10)
    wait_for(lambda: _all(after, JobStatus.COMPLETED))


def test_a_timeout_cancels_the_coroutine_even_one_that_swallows_it(start_worker: Any) -> None:
    cancelled = enqueue("tests.async_timeout", {"sleep": 30})
    swallows = enqueue("tests.async_timeout", {"sleep": 30, "swallow": True, "after": 30})
    innocents = _innocents(20, sleep=0.5)
    start_worker("--queues", "default", **QUICK)
    started = time.monotonic()
    for job in (cancelled, swallows):
        job = _finished(job)
        assert (job.status, job.last_error_code) == (JobStatus.DEAD, "timeout")
    assert time.monotonic() - started < scaled(15)
    wait_for(lambda: SideEffect.objects.filter(job_id=cancelled.pk, event="cancelled").exists())
    wait_for(lambda: _all(innocents, JobStatus.COMPLETED))


def test_cancelling_a_running_coroutine(start_worker: Any) -> None:
    plain = enqueue("tests.async_cancellable", {})
    swallows = enqueue("tests.async_cancellable", {"swallow": True})
    innocents = _innocents(10, sleep=0.5)
    start_worker("--queues", "default", **QUICK)
    for job in (plain, swallows):
        wait_for(_started(job))
        cancel(job.pk)
    for job in (plain, swallows):
        job = _finished(job)
        assert (job.status, job.last_error_code) == (JobStatus.CANCELLED, "cancelled")
    wait_for(lambda: _all(innocents, JobStatus.COMPLETED))


def test_a_loop_blocking_coroutine_is_left_behind_and_the_innocents_complete(
    start_worker: Any,
) -> None:
    """``time.sleep(1000)`` in a coroutine holds its loop's thread: the coordinator stops hearing
    from the loop, leaves it behind with its attempts (their leases expire), and runs the next
    ones on a fresh loop; the attempts lost twice run alone, where the blocker alone stalls."""
    innocents = _innocents(5, sleep=0.3)
    blocker = enqueue("tests.async_hostile", {"kind": "block", "sleep": 0.1})
    worker = start_worker("--queues", "default", **QUICK)
    blocker = _finished(blocker)
    assert blocker.status == JobStatus.DEAD
    assert blocker.last_error_code == "lease_expired"
    wait_for(lambda: _all(innocents, JobStatus.COMPLETED), timeout=60)
    assert "stopped answering" in worker.output() or "has not answered" in worker.output()
    assert worker.process.poll() is None
    after = _innocents(20)
    wait_for(lambda: _all(after, JobStatus.COMPLETED))


def test_sigterm_with_coroutines_in_flight(start_worker: Any) -> None:
    jobs = _innocents(60, sleep=0.3)
    worker = start_worker(
        "--queues", "default", QUEUES={"default": {"ASYNC_CONCURRENCY": 10}}, **QUICK
    )
    wait_for(lambda: SideEffect.objects.filter(event="end").count() >= 10)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    rows = Job.objects.filter(pk__in=[job.pk for job in jobs])
    assert rows.filter(status=JobStatus.LEASED).count() == 0
    completed = rows.filter(status=JobStatus.COMPLETED).count()
    assert completed + rows.filter(status=JobStatus.PENDING).count() == 60
    assert 10 <= completed < 60
    assert SideEffect.objects.filter(event="end").count() == completed


def test_the_grace_period_releases_a_coroutine_still_running(start_worker: Any) -> None:
    job = enqueue("tests.async_behave", {"sleep": 30})
    worker = start_worker("--queues", "default", "--grace-period", "0.5", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=job.pk).exists())
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - started < scaled(5)
    job.refresh_from_db()
    assert (job.status, job.last_error_code) == (JobStatus.PENDING, "worker_shutdown")
