"""Priority aging with a real ``runworkers``: low-priority jobs behind a flood of higher-priority
work that keeps one worker busy for minutes. With ``PRIORITY_AGING`` they run long before the
flood drains; without it, they wait for it (docs/workers.md, "Priority aging";
``benchmarks/aging.py`` measures the waits)."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from tests.processes import holds_for, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FLOOD = 20_000  # of priority 5, 10 ms each: minutes of work for one handler thread


def _low_then_flood() -> list[Any]:
    """Three priority-0 jobs, then the flood: the low ones are the oldest, so that once aging
    gives them the flood's priority they are first in it (a later run_at goes after)."""
    low = enqueue_many([{"job_type": "tests.behave", "payload": {"record": False}}] * 3)
    enqueue_many(
        [{"job_type": "tests.behave", "payload": {"sleep": 0.01, "record": False}, "priority": 5}]
        * FLOOD
    )
    return [job.pk for job in low]


def _flood_left() -> int:
    return Job.objects.filter(priority=5, base_priority=None, status=JobStatus.PENDING).count()


def test_aging_runs_low_priority_jobs_while_a_flood_keeps_the_worker_busy(
    start_worker: Any,
) -> None:
    low = _low_then_flood()
    worker = start_worker(
        "--queues",
        "default",
        "--concurrency",
        "1",
        QUEUES={"default": {"PRIORITY_AGING": {"EVERY": 1, "UP_TO": 5}}},
        POLL_INTERVAL=0.2,
    )

    def low_completed() -> bool:
        return Job.objects.filter(pk__in=low, status=JobStatus.COMPLETED).count() == 3

    # Five steps of a second raise them to 5, a pass at most a poll interval later: then the
    # next full claim takes them, ahead of every flood job enqueued after them.
    wait_for(low_completed, timeout=60)
    left = _flood_left()
    rows = list(Job.objects.filter(pk__in=low).values_list("priority", "base_priority"))
    print(f"\naging: the 3 low-priority jobs completed with {left} of {FLOOD} flood jobs left")
    assert rows == [(5, 0)] * 3
    assert left > FLOOD // 2  # long before the flood drained
    assert worker.process.poll() is None


def test_without_aging_the_flood_holds_low_priority_jobs_back(start_worker: Any) -> None:
    low = _low_then_flood()
    start_worker("--queues", "default", "--concurrency", "1", POLL_INTERVAL=0.2)
    wait_for(lambda: _flood_left() < FLOOD - 100)  # the worker runs the flood

    def low_waiting() -> bool:
        """Every low-priority job still pending, at its priority."""
        return Job.objects.filter(pk__in=low, status=JobStatus.PENDING, priority=0).count() == 3

    # Longer than the aging test's low jobs needed to get their raise: without it, a claim
    # takes a priority-5 job while one is due, however long the others wait.
    holds_for(low_waiting, seconds=8)
