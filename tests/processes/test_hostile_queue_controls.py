"""Queues paused, resumed and resized at run time, attacked with real ``runworkers`` processes:
rows written by hand, pauses racing claims and stops, resizes racing running jobs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from django_pgoutbox.conf import CONTROL_CHANNEL
from django_pgoutbox.models import Job, JobStatus
from tests.processes import completed_jobs, holds_for, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _jobs(count: int, **payload: Any) -> list[dict[str, Any]]:
    return [{"job_type": "tests.behave", "payload": {"record": False, **payload}}] * count


def _write_by_hand(overrides: str, queue: str = "default") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_controls (queue, overrides) VALUES (%s, %s::jsonb) "
            "ON CONFLICT (queue) DO UPDATE SET overrides = EXCLUDED.overrides",
            [queue, overrides],
        )
        cursor.execute("SELECT pg_notify(%s, %s)", [CONTROL_CHANNEL, queue])


@pytest.mark.parametrize(
    "overrides",
    [
        '{"RATE_LIMIT": 1e400}',  # jsonb keeps it as a 401-digit integer
        '{"CONCURRENCY": 2, "X": ' + "[" * 3000 + "]" * 3000 + "}",  # deeper than json.loads goes
    ],
    ids=["huge-number", "deep-nesting"],
)
def test_a_row_python_cannot_decode_stops_no_worker(start_worker: Any, overrides: str) -> None:
    worker = start_worker("--concurrency", "2", POLL_INTERVAL=0.5)
    wait_for(worker.listening, timeout=30)
    enqueue_many(_jobs(2))
    wait_for(lambda: completed_jobs() == 2, timeout=30)
    _write_by_hand(overrides)
    time.sleep(1.5)  # the notification and a periodic read (with the lease recovery)
    enqueue_many(_jobs(2))

    def alive_and_running() -> bool:
        """the worker lives on and runs the new jobs"""
        return worker.process.poll() is None and completed_jobs() == 4

    wait_for(alive_and_running, timeout=30)
    holds_for(lambda: worker.process.poll() is None, 1.5)
    assert worker.output().count("queue_controls row of queue 'default'") == 1, worker.output()


def test_a_burst_on_a_paused_queue_ends_and_claims_nothing(start_worker: Any) -> None:
    from django_pgoutbox.queue_controls import pause_queue

    pause_queue("default")
    enqueue_many(_jobs(5))
    worker = start_worker("--burst", "--queues", "default")
    assert worker.wait(30) == 0, worker.output()
    assert not Job.objects.exclude(status=JobStatus.PENDING).exists()
    assert not Job.objects.filter(attempts__gt=0).exists()


def test_a_job_enqueued_after_the_pause_commits_is_not_run_by_an_idle_worker(
    start_worker: Any,
) -> None:
    """The idle queue's first lane holds a claim that a job's notification fires from the
    listener thread: the pause's notification, delivered first, must keep it from running the
    job enqueued after the pause."""
    from django.db import transaction

    from django_pgoutbox.queue_controls import pause_queue

    worker = start_worker("--concurrency", "2", "--queues", "default", POLL_INTERVAL=60.0)
    wait_for(worker.listening, timeout=30)
    enqueue_many(_jobs(1))
    wait_for(lambda: completed_jobs() == 1, timeout=30)
    time.sleep(0.5)  # idle again: the standby claim is armed
    with transaction.atomic():
        pause_queue("default")
        enqueue_many(_jobs(1))

    def untouched() -> bool:
        """the job enqueued after the pause is not claimed"""
        return Job.objects.filter(attempts__gt=0).count() == 1

    holds_for(untouched, 2)


def test_a_read_that_fails_for_a_moment_does_not_resume_a_paused_queue(
    start_worker: Any,
) -> None:
    """A lock timeout on queue_controls (a migration holds the table) is not a resume."""
    import psycopg

    from django_pgoutbox.db import raw_connection_params
    from django_pgoutbox.queue_controls import pause_queue

    pause_queue("default")
    enqueue_many(_jobs(20))
    worker = start_worker(
        "--queues", "default", POLL_INTERVAL=0.3, env={"PGOPTIONS": "-c lock_timeout=100"}
    )
    wait_for(worker.listening, timeout=30)

    def untouched() -> bool:
        """no job of the paused queue is claimed"""
        return not Job.objects.filter(attempts__gt=0).exists()

    holds_for(untouched, 1)
    with psycopg.connect(**raw_connection_params("default")) as holder:
        holder.execute("LOCK TABLE queue_controls IN ACCESS EXCLUSIVE MODE")
        holds_for(untouched, 3)
        holder.rollback()
    holds_for(untouched, 1)
    assert worker.process.poll() is None


def test_a_hundred_pauses_and_resizes_within_milliseconds_lose_and_repeat_no_job(
    start_worker: Any,
) -> None:
    import random

    from django.db.models import Count

    from django_pgoutbox.queue_controls import pause_queue, resize_queue, resume_queue
    from testproject.testjobs.models import SideEffect

    rng = random.Random(7)
    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.005}}] * 800)
    workers = [start_worker("--concurrency", "4", "--queues", "default") for _ in range(2)]
    wait_for(lambda: SideEffect.objects.filter(event="end").count() > 50, timeout=60)
    last = 4
    for _ in range(100):
        pause_queue("default")
        if rng.random() < 0.5:
            # Each handler of tests.behave holds a connection of its own: two workers at 200
            # threads each would pass the server's max_connections, and their jobs would retry.
            last = rng.choice([1, 2, 3, 8, 20])
            resize_queue("default", concurrency=last)
        resume_queue("default")
        time.sleep(rng.choice([0, 0, 0.001, 0.01]))

    def drained() -> bool:
        """every job completed"""
        return not Job.objects.exclude(status=JobStatus.COMPLETED).exists()

    wait_for(drained, timeout=120)
    starts = SideEffect.objects.filter(event="start").values("job_id").annotate(n=Count("id"))
    assert len(starts) == 800
    assert max(row["n"] for row in starts) == 1
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    # The last write is what each worker runs with: three jobs at once, no more, on each.
    resize_queue("default", concurrency=3)
    SideEffect.objects.all().delete()
    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.3}}] * 30)
    wait_for(drained, timeout=60)
    for worker in workers:
        assert worker.process.poll() is None
    most = {pid: _most_at_once(pid) for pid in SideEffect.objects.values_list("pid", flat=True)}
    assert max(most.values()) <= 3, most  # never more than the last write allows
    assert max(most.values()) >= 2, most  # (a machine under load may not fill all three)


def _most_at_once(pid: int) -> int:
    """The most jobs process ``pid`` ran at once (from the test handler's start and end rows)."""
    from testproject.testjobs.models import SideEffect

    edges = sorted(
        (at, 1 if event == "start" else -1)
        for at, event in SideEffect.objects.filter(pid=pid).values_list("at", "event")
    )
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def _running_now() -> int:
    """Jobs whose handler has started and not ended, as the test handler records them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE event = 'start') - count(*) FILTER (WHERE event = 'end')"
            " FROM testjobs_sideeffect"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize(
    "queue",
    [
        {"CONNECTIONS": 1},
        {"CONNECTIONS": 2},
        {"FAIR": True},
        {"LIMIT_BY": "organization", "MAX_RUNNING": 50},
    ],
    ids=["one-connection", "two-connections", "fair", "by-organization"],
)
def test_a_cap_set_at_run_time_holds_on_two_workers_within_seconds(
    start_worker: Any, queue: dict[str, Any]
) -> None:
    from django_pgoutbox.queue_controls import DEFAULT, resize_queue

    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.05}}] * 1500)
    workers = [
        start_worker(
            "--concurrency",
            "4",
            "--queues",
            "default",
            QUEUES={"default": queue},
        )
        for _ in range(2)
    ]
    wait_for(lambda: _running_now() >= 4, timeout=60)
    resize_queue("default", max_running=1)
    time.sleep(2)
    seen = []
    for _ in range(60):
        seen.append(_running_now())
        time.sleep(0.03)
    assert max(seen) <= 1, seen
    assert Job.objects.filter(status=JobStatus.PENDING).exists()
    # Lifted again: the settings apply, and the workers run several jobs at once again.
    resize_queue("default", max_running=DEFAULT)
    wait_for(lambda: _running_now() >= 4, timeout=10)
    for worker in workers:
        assert worker.process.poll() is None


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line")


def _settled_threads(pid: int) -> int:
    """The process's thread count once it has held for half a second (a thread of its own may
    come and go: a connection's, a timer's)."""
    seen = [_threads(pid)]
    while len(seen) < 10 or len(set(seen[-10:])) > 1:
        time.sleep(0.05)
        seen.append(_threads(pid))
        assert len(seen) < 600, seen[-20:]
    return seen[-1]


def test_resizing_up_to_a_thousand_and_down_to_one_leaves_one_thread_per_worker(
    start_worker: Any,
) -> None:
    from django_pgoutbox.queue_controls import resize_queue

    worker = start_worker("--concurrency", "1", "--queues", "default", POLL_INTERVAL=0.5)
    wait_for(worker.listening, timeout=30)
    base = _settled_threads(worker.pid)
    for _ in range(4):
        enqueue_many(_jobs(300, sleep=0.01))
        resize_queue("default", concurrency=1000)
        wait_for(lambda: _threads(worker.pid) >= base + 999, timeout=30)
        resize_queue("default", concurrency=1)

        def back_to_one() -> Any:
            """the worker is back to one handler thread"""
            count = _threads(worker.pid)
            return count <= base or print(count, base, worker.output()[-2000:])

        wait_for(back_to_one, timeout=30, interval=1)
    wait_for(lambda: not Job.objects.exclude(status=JobStatus.COMPLETED).exists(), timeout=60)
    holds_for(lambda: _threads(worker.pid) <= base, 1)
    enqueue_many(_jobs(3))
    wait_for(lambda: completed_jobs() == 1203, timeout=30)
    assert worker.process.poll() is None


def test_a_stop_right_after_a_pause_ends_cleanly_and_leaves_no_lease(start_worker: Any) -> None:
    import signal

    from django_pgoutbox.queue_controls import pause_queue

    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.3}}] * 200)
    worker = start_worker("--concurrency", "3", "--queues", "default")
    wait_for(lambda: _running_now() >= 3, timeout=60)
    pause_queue("default")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert not Job.objects.filter(status=JobStatus.LEASED).exists()
    # Every job started finished; none that went back lost an attempt.
    assert _running_now() == 0
    assert not Job.objects.filter(status=JobStatus.PENDING, attempts__gt=0).exists()
    assert "Traceback" not in worker.output()


def test_a_shrink_while_handlers_hang_past_their_timeout_ends_at_the_new_size(
    start_worker: Any,
) -> None:
    from django_pgoutbox.queue_controls import resize_queue

    worker = start_worker("--concurrency", "4", "--queues", "default", POLL_INTERVAL=0.5)
    wait_for(worker.listening, timeout=30)
    base = _settled_threads(worker.pid)  # four handler threads
    enqueue_many([{"job_type": "tests.poison_hang", "payload": {"seconds": 4}}] * 4)
    # Past the timeout, four threads stand in for the four held by the hung handlers.
    wait_for(lambda: _threads(worker.pid) >= base + 4, timeout=30)
    resize_queue("default", concurrency=1)
    enqueue_many(_jobs(20, sleep=0.05))
    wait_for(lambda: completed_jobs() == 20, timeout=30)
    # Once the hung handlers return: one handler thread, as the resize said.
    time.sleep(4)
    assert _settled_threads(worker.pid) == base - 3
    enqueue_many(_jobs(5))
    wait_for(lambda: completed_jobs() == 25, timeout=30)
    assert worker.process.poll() is None


def test_a_table_gone_while_workers_run_stops_none_and_is_said_once(start_worker: Any) -> None:
    worker = start_worker("--concurrency", "2", "--queues", "default", POLL_INTERVAL=0.2)
    wait_for(worker.listening, timeout=30)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_controls RENAME TO queue_controls_away")
    try:
        time.sleep(2)  # ten periodic reads
        enqueue_many(_jobs(5))
        wait_for(lambda: completed_jobs() == 5, timeout=30)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, 'default')", [CONTROL_CHANNEL])
        time.sleep(0.5)
        assert worker.process.poll() is None
        assert worker.output().count("queue_controls could not be read") == 1, worker.output()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE queue_controls_away RENAME TO queue_controls")


@pytest.mark.parametrize("then", ["pause", "resume"])
def test_a_change_made_while_the_worker_is_cut_off_applies_once_it_is_back(
    start_worker: Any, then: str
) -> None:
    """The worker's connections are cut (its lanes back off, its LISTEN is gone) and the queue
    is paused or resumed meanwhile: the notification is lost, yet the change applies."""
    from django_pgoutbox.queue_controls import pause_queue, resume_queue
    from tests.processes import other_backends

    if then == "resume":
        pause_queue("default")
    worker = start_worker("--concurrency", "2", "--queues", "default", POLL_INTERVAL=60.0)
    wait_for(worker.listening, timeout=30)
    where = f"application_name = '{worker.application_name}'"
    assert other_backends(where, "pg_terminate_backend(pid)") > 0
    (pause_queue if then == "pause" else resume_queue)("default")
    enqueue_many(_jobs(5))
    if then == "pause":
        wait_for(worker.listening, timeout=30)
        holds_for(lambda: not Job.objects.filter(attempts__gt=0).exists(), 2)
    else:
        wait_for(lambda: completed_jobs() == 5, timeout=30)
    assert worker.process.poll() is None


def test_a_lock_held_on_queue_controls_does_not_stall_the_queue(start_worker: Any) -> None:
    """A migration holds queue_controls (ACCESS EXCLUSIVE) for seconds: the workers' reads of
    the row wait on it, and the jobs enqueued meanwhile must not wait with them."""
    import psycopg

    from django_pgoutbox.db import raw_connection_params

    worker = start_worker("--concurrency", "2", "--queues", "default", POLL_INTERVAL=0.3)
    wait_for(worker.listening, timeout=30)
    with psycopg.connect(**raw_connection_params("default")) as holder:
        holder.execute("LOCK TABLE queue_controls IN ACCESS EXCLUSIVE MODE")
        time.sleep(1)  # the periodic read waits on the lock
        enqueue_many(_jobs(5))
        wait_for(lambda: completed_jobs() == 5, timeout=3)
        with connection.cursor() as cursor:  # a change notified: its read waits on the lock too
            cursor.execute("SELECT pg_notify(%s, 'default')", [CONTROL_CHANNEL])
        time.sleep(0.5)
        enqueue_many(_jobs(5))
        wait_for(lambda: completed_jobs() == 10, timeout=3)
        holder.rollback()
    assert worker.process.poll() is None
