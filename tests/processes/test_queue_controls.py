"""Queues paused, resumed and resized at run time, with real ``runworkers`` processes: a change
reaches every worker within a second (by notification: their poll interval here is 60 s), stays
across restarts, and the settings stay the defaults."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.queue_controls import DEFAULT, pause_queue, resize_queue, resume_queue
from tests.processes import holds_for, scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Workers that poll this rarely hear of a change only by its notification.
SLOW_POLL = {"POLL_INTERVAL": 60.0}


def _jobs(count: int, **payload: Any) -> list[dict[str, Any]]:
    return [{"job_type": "tests.behave", "payload": {"record": False, **payload}}] * count


def _claimed_after(moment: Any) -> int:
    return Job.objects.filter(locked_at__gt=moment).count()


def _leased() -> int:
    return Job.objects.filter(status=JobStatus.LEASED).count()


def test_a_pause_reaches_two_workers_within_a_second_and_a_restart(start_worker: Any) -> None:
    # Enough for both workers to be busy when the pause comes, and few enough that the one
    # restarted worker drains the rest in seconds once the queue is resumed.
    enqueue_many(_jobs(1200, sleep=0.02))
    workers = [start_worker("--concurrency", "2", **SLOW_POLL) for _ in range(2)]

    def both_claiming() -> bool:
        """both workers have claimed jobs"""
        return Job.objects.values("locked_by").distinct().exclude(locked_by=None).count() == 2

    wait_for(both_claiming, timeout=30)
    status = pause_queue("default", by="the test")
    assert status.paused
    assert status.paused_by == "the test"
    assert status.paused_at is not None
    # Every claim after the pause's commit plus a second: none, on either worker.
    time.sleep(scaled(3))
    assert _claimed_after(status.paused_at + timedelta(seconds=scaled(1))) == 0
    wait_for(lambda: _leased() == 0, timeout=10)  # the running ones finished, the rest went back
    pending = Job.objects.filter(status=JobStatus.PENDING).count()
    assert pending > 0
    # Enqueue still works; a restarted worker stays paused.
    enqueue_many(_jobs(10, sleep=0.0))
    for worker in workers:
        worker.kill()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        restart = cursor.fetchone()[0]
    restarted = start_worker("--concurrency", "2", **SLOW_POLL)
    wait_for(restarted.listening, timeout=30)

    def still_paused() -> bool:
        """no job is claimed while the queue is paused"""
        return _leased() == 0 and _claimed_after(restart) == 0

    holds_for(still_paused, 2)
    resumed = resume_queue("default")
    assert not resumed.paused

    def drained() -> bool:
        """every job completed"""
        return not Job.objects.exclude(status=JobStatus.COMPLETED).exists()

    wait_for(drained, timeout=120)


class _Peak:
    """The most jobs leased at once, sampled from the table every 10 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        import psycopg

        from django_pgoutbox.db import raw_connection_params

        with psycopg.connect(**raw_connection_params("default"), autocommit=True) as conn:
            while not self._stop.is_set():
                (count,) = conn.execute(
                    "SELECT count(*) FROM jobs WHERE status = 'leased'"
                ).fetchone() or (0,)
                self.peak = max(self.peak, count)
                time.sleep(0.01)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_concurrency_and_max_running_change_without_a_restart(start_worker: Any) -> None:
    enqueue_many(_jobs(400, sleep=0.3))
    start_worker("--concurrency", "1", **SLOW_POLL)
    start_worker("--concurrency", "1", **SLOW_POLL)
    wait_for(lambda: _leased() >= 1, timeout=30)
    resize_queue("default", concurrency=4)

    def eight_running() -> bool:
        """both workers run four jobs each (or hold one more claimed, prefetched)"""
        return _leased() >= 8

    wait_for(eight_running, timeout=5)
    # A cluster-wide cap set at run time, on a queue that had none.
    resize_queue("default", max_running=3)
    time.sleep(scaled(1.5))  # the jobs started before it run out (0.3 s each)
    with _Peak() as sampled:
        time.sleep(scaled(3))
    assert 1 <= sampled.peak <= 3
    # Back to the settings: the cap goes, the concurrency is the command line's again.
    resize_queue("default", max_running=DEFAULT, concurrency=DEFAULT)
    time.sleep(scaled(1.5))
    with _Peak() as sampled:
        time.sleep(scaled(2))
    assert 2 <= sampled.peak <= 4  # a thread each, and at most one prefetched job each
    with connection.cursor() as cursor:
        cursor.execute("SELECT overrides FROM queue_controls WHERE queue = 'default'")
        assert cursor.fetchone()[0] in ("{}", {})
