"""A worker process bounded: recycled after ``--max-jobs``, past ``--max-memory`` or with too many
abandoned handler threads; and one live process per ``--worker-id``."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from django_pgoutbox import enqueue, enqueue_many
from django_pgoutbox.models import Job, JobStatus, WorkerHeartbeat
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"LEASE_SECONDS": 2, "POLL_INTERVAL": 0.2}


def completed(count: int) -> Any:
    def check() -> bool:
        """the jobs completed"""
        return Job.objects.filter(status=JobStatus.COMPLETED).count() >= count

    return check


def recycled(worker: Any, times: int) -> Any:
    def check() -> bool:
        """the process recycled itself"""
        return bool(worker.output().count("recycled (") >= times)

    return check


def test_max_jobs_recycles_the_process_and_every_job_completes(start_worker: Any) -> None:
    """Past 5 jobs (checked every quarter second) the process finishes its running jobs, gives back
    those it had claimed for later, and starts again; every job completes once."""
    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.25}}] * 16)
    worker = start_worker("--queues", "default", "--max-jobs", "5", "--concurrency", "2", **QUICK)
    wait_for(completed(16), timeout=60)
    wait_for(recycled(worker, 1), timeout=30)
    assert worker.process.poll() is None  # the same process (its pid), started again
    assert "jobs run (--max-jobs 5)" in worker.output()
    assert not Job.objects.exclude(status=JobStatus.COMPLETED).exists()
    assert SideEffect.objects.filter(event="end").count() == 16  # each ran once


def test_max_memory_bounds_a_leaking_handler(start_worker: Any) -> None:
    """Each job keeps 20 MiB for the life of its process. Under --max-memory 200, the process
    recycles before it holds much more, and the jobs beside the leaks complete."""
    enqueue_many(
        [{"job_type": "tests.leak", "payload": {"mb": 20}}] * 20
        + [{"job_type": "tests.behave", "payload": {}}] * 10
    )
    worker = start_worker("--queues", "default", "--max-memory", "200", **QUICK)
    wait_for(completed(30), timeout=90)
    wait_for(recycled(worker, 1), timeout=30)
    assert worker.process.poll() is None
    output = worker.output()
    assert "(--max-memory 200)" in output, output


def test_abandoned_threads_recycle_the_process(start_worker: Any) -> None:
    """Handlers that hold their threads long past their 1 s timeout, beside innocent jobs in the
    same claim: at two threads abandoned the process recycles; every hung attempt ends with
    its timeout, every innocent completes."""
    hung = enqueue_many([{"job_type": "tests.poison_hang", "payload": {"seconds": 600}}] * 3)
    innocents = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 6)
    worker = start_worker(
        "--queues",
        "default",
        "--concurrency",
        "4",
        "--max-abandoned-threads",
        "2",
        "--grace-period",
        "0.5",
        **QUICK,
    )
    wait_for(recycled(worker, 1), timeout=60)
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in hung], status=JobStatus.DEAD).count() == 3,
        timeout=60,
    )
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in innocents], status=JobStatus.COMPLETED).count()
            == 6
        ),
        timeout=30,
    )
    assert worker.process.poll() is None
    assert "handler threads abandoned at their timeout" in worker.output()
    for job in Job.objects.filter(pk__in=[j.pk for j in hung]):
        assert job.last_error_code == "timeout", job.last_error_summary


def test_a_live_worker_id_cannot_be_taken(start_worker: Any) -> None:
    first = start_worker("--queues", "default", "--worker-id", "shared", **QUICK)
    wait_for(lambda: WorkerHeartbeat.objects.filter(worker_id="shared").exists())
    second = start_worker("--queues", "default", "--worker-id", "shared", **QUICK)
    assert second.wait(timeout=30) != 0
    assert f"worker id 'shared' is in use by process {first.pid}" in second.output()
    # The first goes on, its row untouched by the second's exit.
    assert first.process.poll() is None
    row = WorkerHeartbeat.objects.get(worker_id="shared")
    assert row.pid == first.pid
    job = enqueue("tests.behave", {})
    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists())
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0
    assert not WorkerHeartbeat.objects.filter(worker_id="shared").exists()


def test_a_killed_workers_id_is_free_again_on_its_host(start_worker: Any) -> None:
    """SIGKILL leaves the row, fresh; the id's process is gone from this host, so a new
    process takes the id at once (a restart under systemd with a fixed --worker-id)."""
    first = start_worker("--queues", "default", "--worker-id", "fixed", **QUICK)
    wait_for(lambda: WorkerHeartbeat.objects.filter(worker_id="fixed").exists())
    first.kill()
    assert WorkerHeartbeat.objects.filter(worker_id="fixed", pid=first.pid).exists()
    second = start_worker("--queues", "default", "--worker-id", "fixed", **QUICK)
    wait_for(lambda: WorkerHeartbeat.objects.filter(worker_id="fixed", pid=second.pid).exists())
    assert second.process.poll() is None


def test_sigterm_while_recycling_stops_the_process(start_worker: Any) -> None:
    """A SIGTERM that comes while the process finishes its jobs to recycle is the last word:
    the process exits, and does not start again."""
    slow = enqueue("tests.behave", {"sleep": 3}, priority=5)
    enqueue("tests.behave", {})
    worker = start_worker(
        "--queues", "default", "--max-jobs", "1", "--concurrency", "2", "--grace-period", "10"
    )
    wait_for(lambda: "recycles: " in worker.output(), timeout=30)
    assert Job.objects.get(pk=slow.pk).status == JobStatus.LEASED  # still finishing
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "recycled (" not in worker.output()
    assert worker.output().count("Worker ") == 1  # started once
    assert Job.objects.get(pk=slow.pk).status == JobStatus.COMPLETED
