"""Hostile values a handler can raise or leave behind, each beside innocent jobs in one batch
run by a real ``runworkers`` process (the style of ``test_poison_values.py``).

Every test asserts: the process is still running, every innocent job completed at its first
attempt (every innocent event projected once), the poison ended in its named state, and
nothing stays leased.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for
from tests.processes.reliability.test_poison_relay import (
    assert_dead,
    assert_innocents_projected_once,
    publish_batch,
    relay,
    wait_until_dead,
)
from tests.processes.reliability.test_poison_values import QUICK, run_beside_innocents, settle

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_exception_whose_traceback_cannot_be_formatted_still_gets_an_outcome(
    start_worker: Any,
) -> None:
    """Its ``__class__`` raises: ``isinstance()`` on it raises, and so does every traceback
    printed of it (logging's included). Each attempt still ends as ``worker_error`` at once,
    not by its lease expiring with its handler thread dead."""
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.hostile_raise", "payload": {"kind": "class_raises"}}
    )
    ended = settle(worker, poison, innocents, JobStatus.DEAD, "worker_error")
    assert ended.attempts == 3
    assert "without an outcome" not in worker.output()


@pytest.mark.parametrize(
    ("kind", "code"),
    [("snooze_property", "RuntimeError"), ("rate_hostile_float", "RateLimited")],
)
def test_a_delay_that_cannot_be_read_or_compared_is_that_jobs_error(
    start_worker: Any, kind: str, code: str
) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.hostile_raise", "payload": {"kind": kind}}
    )
    ended = settle(worker, poison, innocents, JobStatus.DEAD, code)
    assert ended.attempts == 3


def test_a_transaction_left_open_by_a_handler_does_not_swallow_the_next_jobs_writes(
    start_worker: Any,
) -> None:
    """One handler thread: the innocents after the poison run on its connection."""
    jobs = enqueue_many(
        [
            {"job_type": "tests.hostile_open_transaction", "payload": {}},
            *[{"job_type": "tests.behave", "payload": {}}] * 4,
        ]
    )
    worker = start_worker("--queues", "default", "--concurrency", "1", **QUICK)
    poison, innocents = jobs[0], list(jobs[1:])
    settle(worker, poison, innocents, JobStatus.COMPLETED, None)
    recorded = SideEffect.objects.filter(job_id__in=[j.pk for j in innocents], event="end")
    assert recorded.count() == len(innocents), worker.output()[-3000:]


def live_children(pid: int) -> list[int]:
    """The children of process ``pid`` that are still running (not zombies waiting for it)."""
    children: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        children += [int(child) for child in path.read_text().split()]
    live = []
    for child in children:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.append(child)
    return live


@pytest.mark.parametrize("raises", [False, True])
def test_a_handler_that_forks_leaves_no_second_worker_behind(
    start_worker: Any, raises: bool
) -> None:
    """The handler calls ``os.fork()`` and returns (or raises) in both processes. The child,
    back in the worker's code, exits at once instead of living on as an orphan copy of the
    worker with its sockets; the parent's outcome is the job's."""
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.hostile_fork", "payload": {"raise": raises}}
    )
    try:
        if raises:
            ended = settle(worker, poison, innocents, JobStatus.DEAD, "RuntimeError")
            assert ended.attempts == 2
        else:
            ended = settle(worker, poison, innocents, JobStatus.COMPLETED, None)
            assert ended.attempts == 1
            assert ended.result is not None
            assert ended.result["child"] > 0
        wait_for(lambda: not live_children(worker.pid), timeout=10)
        assert "the child exits" in worker.output()
    finally:
        # Should a child live on, it holds connections to the test database: end it here.
        for child in live_children(worker.pid):
            os.kill(child, signal.SIGKILL)


def test_a_row_whose_attempts_are_at_the_int4_limit_fails_no_claim(start_worker: Any) -> None:
    """A row written by raw SQL with ``attempts = 2**31 - 1``: counting its claim overflowed
    ``integer``, failed the claim statement of its whole queue and stopped the process, at
    every restart. Its claim now keeps the count at the limit; the job runs like any other."""
    jobs = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 9)
    poison, innocents = jobs[0], list(jobs[1:])
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET attempts = 2147483647, max_attempts = 2147483647 WHERE id = %s",
            [poison.pk],
        )
    worker = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    ended = settle(worker, poison, innocents, JobStatus.COMPLETED, None)
    assert ended.attempts == 2147483647


def test_a_row_due_since_minus_infinity_fails_no_claim(start_worker: Any) -> None:
    """``run_at = '-infinity'`` (raw SQL): the claim's ``now() - run_at`` raised "cannot
    subtract infinite timestamps", failed its queue's claim and stopped the process."""
    jobs = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 9)
    poison, innocents = jobs[0], list(jobs[1:])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE jobs SET run_at = '-infinity' WHERE id = %s", [poison.pk])
    worker = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    # Read without run_at, which no Python datetime can hold.
    poisoned = Job.objects.filter(pk=poison.pk).values_list("status", "attempts")
    wait_for(lambda: poisoned.get()[0] == JobStatus.COMPLETED, timeout=20)
    assert poisoned.get() == (JobStatus.COMPLETED, 1)
    assert worker.process.poll() is None, worker.output()[-3000:]
    innocent = Job.objects.filter(pk__in=[j.pk for j in innocents])
    wait_for(lambda: innocent.filter(status=JobStatus.COMPLETED).count() == 8, timeout=20)
    assert set(innocent.values_list("attempts", flat=True)) == {1}
    assert not Job.objects.filter(status=JobStatus.LEASED).exists()


def test_a_subscriber_exception_whose_traceback_cannot_be_formatted_fails_its_delivery_only(
    start_worker: Any,
) -> None:
    """Logging its failure with its traceback raised in turn: the relay thread died and the
    process exited, every event of the batch unprocessed, at every restart."""
    innocents, [poison] = publish_batch(("hostile.unprintable_class", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    assert_dead(poison, "_HostileClassError")
