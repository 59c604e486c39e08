"""Real worker processes: crashes, stalls, shutdowns, isolation and wake-ups.

transaction=True throughout: the workers are other processes and see only committed rows.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from django_pgoutbox import enqueue, enqueue_many
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Short leases and polls, so that recovery happens within the test's patience.
QUICK = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.2}


def statuses() -> Counter[str]:
    return Counter(Job.objects.values_list("status", flat=True))


def events(event: str) -> Counter[Any]:
    return Counter(SideEffect.objects.filter(event=event).values_list("job_id", flat=True))


def first_start(job_id: Any) -> Callable[[], SideEffect | None]:
    def find() -> SideEffect | None:
        return SideEffect.objects.filter(job_id=job_id, event="start").first()

    return find


def test_sigkill_mid_handler_loses_nothing(start_worker: Any) -> None:
    jobs = enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.3}}] * 24)
    victim = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(event="end").count() >= 4)
    wait_for(lambda: Job.objects.filter(status=JobStatus.LEASED).exists())
    victim.kill()
    killed_mid_handler = Job.objects.filter(status=JobStatus.LEASED).count()
    assert killed_mid_handler > 0

    rescuer = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    wait_for(lambda: statuses() == Counter({JobStatus.COMPLETED: 24}), timeout=30)
    rescuer.signal(signal.SIGTERM)
    rescuer.wait(timeout=10)

    starts, ends = events("start"), events("end")
    assert set(ends) == {j.pk for j in jobs}  # every job ran to its end at least once
    recovered = set(
        Job.objects.filter(last_error_code="lease_expired").values_list("pk", flat=True)
    )
    assert len(recovered) >= killed_mid_handler
    for job in Job.objects.filter(pk__in=recovered):
        # Two claims; the one lost with the worker (beside others) was given back.
        assert (job.attempts, len(job.worker_ids)) == (1, 2)
        # Its history: the attempt lost with the victim, then the one that completed it.
        history = [(r.attempt, r.worker, r.outcome, r.error_code) for r in job.attempt_history]
        assert history == [
            (1, job.worker_ids[0], "lost", "lease_expired"),
            (1, job.worker_ids[1], "completed", None),
        ]
    # At-least-once, with bounded duplicates: only the jobs in flight when the worker died (at
    # most one per handler thread) ran again, once each. A job may even have reached its end
    # twice: killed after its side effects, before its outcome was written.
    again = {pk for pk, count in starts.items() if count > 1}
    assert all(count <= 2 for count in starts.values())
    assert all(count <= 2 for count in ends.values())
    assert again <= recovered
    assert len(again) <= 4


def test_sigkill_mid_drain_of_fast_jobs_loses_nothing(start_worker: Any) -> None:
    """A backlog of fast jobs: the worker claims ahead, on both of the queue's connections, and
    writes outcomes in batches. Killed mid-drain, every job still runs to its end, and only the
    jobs whose leases it held ran again."""
    total = 3000
    jobs = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * total)
    victim = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(event="end").count() >= 300, timeout=30)
    victim.kill()  # and its backends: a claim or outcome write in flight has committed
    held = set(Job.objects.filter(status=JobStatus.LEASED).values_list("pk", flat=True))
    assert held, "the worker held no job when it was killed"

    rescuer = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    wait_for(lambda: statuses() == Counter({JobStatus.COMPLETED: total}), timeout=60)
    rescuer.signal(signal.SIGTERM)
    rescuer.wait(timeout=10)

    starts, ends = events("start"), events("end")
    assert set(ends) == {j.pk for j in jobs}
    recovered = set(
        Job.objects.filter(last_error_code="lease_expired").values_list("pk", flat=True)
    )
    # each lease it held expired and was recovered, none was lost
    assert held <= recovered, runs_of(held - recovered, victim, rescuer)
    again = {pk for pk, count in starts.items() if count > 1}
    # only a job it held ran twice, and at most twice
    assert again <= held, runs_of(again - held, victim, rescuer)
    assert all(count <= 2 for count in starts.values())


def runs_of(job_ids: set[Any], *workers: Any) -> str:
    """What a failed assertion needs to tell a lost lease from a lost job: each job's row and
    starts (by which process), and the workers' last lines."""
    lines = []
    for job in Job.objects.filter(pk__in=sorted(job_ids)[:5]):
        runs = SideEffect.objects.filter(job_id=job.pk).order_by("at")
        lines.append(
            f"{job.pk} {job.status} attempts={job.attempts} error={job.last_error_code} "
            f"workers={job.worker_ids}: "
            + ", ".join(f"{run.event}#{run.attempt}@{run.pid} {run.at:%S.%f}" for run in runs)
        )
    pids = ", ".join(f"{worker.pid}" for worker in workers)
    return f"{len(job_ids)} jobs (workers {pids}):\n" + "\n".join(lines)


def test_sigstop_past_the_lease_cannot_overwrite_the_new_holder(start_worker: Any) -> None:
    job = enqueue("tests.behave", {"sleep": 2.0})
    stalled = start_worker("--queues", "default", "--worker-id", "stalled", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=job.pk, event="start").exists())
    stalled.signal(signal.SIGSTOP)

    rescuer = start_worker("--queues", "default", "--worker-id", "rescuer", **QUICK)
    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists(), timeout=30)
    stalled.signal(signal.SIGCONT)
    # The stalled worker's handler wakes up, finishes, and tries to record its outcome.
    wait_for(
        lambda: SideEffect.objects.filter(job_id=job.pk, event="end", pid=stalled.pid).exists()
    )
    wait_for(lambda: "discarded" in stalled.output(), timeout=10)

    job.refresh_from_db()
    # The stalled attempt was lost beside nothing it ran alone: given back, so the rescuer's
    # claim is attempt 1 again, and the fence (locked_by) still tells the two apart.
    assert (job.status, job.locked_by, job.attempts) == (JobStatus.COMPLETED, "rescuer", 1)
    assert job.worker_ids == ["stalled", "rescuer"]
    assert job.result == {"pid": rescuer.pid}


def test_a_worker_that_claims_back_a_job_it_still_runs_does_not_run_it_twice(
    start_worker: Any,
) -> None:
    """Frozen past its lease, the job recovered meanwhile (its attempt given back), the worker
    wakes and claims it again, the same attempt number: the run it still has goes on under the
    new lease and writes the outcome; no second run starts."""
    job = enqueue("tests.behave", {"sleep": 2.5})
    worker = start_worker("--queues", "default", "--worker-id", "alone", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=job.pk, event="start").exists())
    worker.signal(signal.SIGSTOP)
    wait_for(lambda: [lease.job_id for lease in recover_expired_leases()] == [job.pk], timeout=10)
    worker.signal(signal.SIGCONT)
    wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists())
    job.refresh_from_db()
    assert (job.attempts, job.worker_ids) == (1, ["alone", "alone"])
    assert SideEffect.objects.filter(job_id=job.pk, event="start").count() == 1
    assert SideEffect.objects.filter(job_id=job.pk, event="end").count() == 1
    assert "goes on under the new lease" in worker.output()


def test_sigterm_drains_gracefully(start_worker: Any) -> None:
    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.2}}] * 40)
    worker = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(event="end").count() >= 8)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    counts = statuses()
    assert counts[JobStatus.LEASED] == 0
    assert counts[JobStatus.COMPLETED] + counts[JobStatus.PENDING] == 40
    assert counts[JobStatus.COMPLETED] < 40
    assert set(events("end").values()) == {1}
    assert len(events("end")) == counts[JobStatus.COMPLETED]


def test_grace_period_over_releases_the_rest(start_worker: Any) -> None:
    job = enqueue("tests.behave", {"sleep": 30})
    worker = start_worker("--queues", "default", "--grace-period", "0.5", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=job.pk).exists())
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - started < scaled(5)
    job.refresh_from_db()
    assert (job.status, job.last_error_code, job.attempts) == (
        JobStatus.PENDING,
        "worker_shutdown",
        1,
    )
    (released,) = job.attempt_history
    assert (released.attempt, released.outcome) == (1, "released")


def test_second_sigterm_exits_at_once(start_worker: Any) -> None:
    job = enqueue("tests.behave", {"sleep": 30})
    worker = start_worker("--queues", "default", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=job.pk).exists())
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "finishing running jobs, then exiting" in worker.output(), timeout=5)
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=5) != 0
    assert time.monotonic() - started < scaled(2)
    job.refresh_from_db()
    assert job.status == JobStatus.LEASED  # its lease will expire and another worker takes it


def test_saturated_reports_never_delay_critical_alerts(start_worker: Any) -> None:
    enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 4}, "queue": "reports"}] * 5)
    start_worker("--queues", "reports,critical_alerts", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(event="start").exists())  # reports are running
    delays = []
    for _ in range(5):
        enqueued_at = timezone.now()
        alert = enqueue("tests.behave", {}, queue="critical_alerts")
        started = wait_for(first_start(alert.pk), timeout=5)
        delays.append((started.at - enqueued_at).total_seconds())
    assert (
        Job.objects.filter(queue="reports", status=JobStatus.PENDING).count() >= 3
    )  # still saturated
    assert max(delays) < scaled(1.0), delays


def test_notify_wakes_an_idle_worker(start_worker: Any) -> None:
    # A 30 s poll: only the notification can explain a start within a second.
    worker = start_worker("--queues", "default", POLL_INTERVAL=30)
    first = enqueue("tests.behave", {})
    # The worker claims at start-up; wait for that claim, then it is idle until woken.
    wait_for(lambda: SideEffect.objects.filter(job_id=first.pk, event="end").exists(), timeout=15)
    wait_for(lambda: Job.objects.filter(pk=first.pk, status=JobStatus.COMPLETED).exists())
    wait_for(worker.idle)
    delays = []
    for _ in range(5):
        enqueued_at = timezone.now()
        woken = enqueue("tests.behave", {})
        started = wait_for(first_start(woken.pk), timeout=5)
        delays.append((started.at - enqueued_at).total_seconds())
    assert max(delays) < scaled(1.0), delays


def test_without_notify_polling_completes_everything(start_worker: Any) -> None:
    start_worker("--queues", "default", NOTIFY=False, POLL_INTERVAL=0.3)
    enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 10)
    wait_for(lambda: statuses() == Counter({JobStatus.COMPLETED: 10}), timeout=15)


def test_runworkers_rejects_unknown_queues(start_worker: Any) -> None:
    worker = start_worker("--queues", "nope")
    assert worker.wait(timeout=20) != 0
    assert "unknown queue(s) 'nope'" in worker.output()


def test_sigterm_gives_back_prefetched_jobs_unstarted(start_worker: Any) -> None:
    """Fast jobs set the queue's pace, so the worker claims ahead of its two threads; two slow
    jobs then hold both threads, and the jobs claimed behind them wait, unstarted, whatever the
    machine's speed, until SIGTERM gives them back."""
    fast = [{"job_type": "tests.behave", "payload": {"sleep": 0.005}}]
    enqueue_many(fast * 300)
    slow = enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": scaled(3)}}] * 2)
    enqueue_many(fast * 2698)
    worker = start_worker("--queues", "default", "--concurrency", "2", **QUICK)

    def waiting_behind_the_slow_jobs() -> set[Any]:
        """both slow jobs run, and jobs claimed behind them wait unstarted"""
        running = SideEffect.objects.filter(job_id__in=[j.pk for j in slow], event="start")
        if running.count() < 2:
            return set()
        leased = set(Job.objects.filter(status=JobStatus.LEASED).values_list("pk", flat=True))
        return leased - set(events("start"))

    held = wait_for(waiting_behind_the_slow_jobs, timeout=60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    counts = statuses()
    assert counts[JobStatus.LEASED] == 0
    assert counts[JobStatus.COMPLETED] + counts[JobStatus.PENDING] == 3000
    # A job that no thread started is pending again as if never claimed: no attempt spent,
    # no worker recorded, no side effect.
    started = set(events("start"))
    pending = Job.objects.filter(status=JobStatus.PENDING)
    assert not pending.filter(pk__in=started).exists()
    assert set(pending.values_list("attempts", flat=True)) == {0}
    assert all(ids == [] for ids in pending.values_list("worker_ids", flat=True))
    assert not pending.filter(attempt_log__isnull=False).exists()  # no attempt to log
    # What it held unstarted when told to stop was given back, not run in the grace period.
    assert set(pending.filter(pk__in=held).values_list("pk", flat=True)) == held


def test_grace_period_over_on_the_last_attempt_is_dead(start_worker: Any) -> None:
    """Released at shutdown during its last attempt: dead, never a max_attempts + 1st attempt."""
    job = enqueue("tests.behave", {"sleep": 30})
    Job.objects.filter(pk=job.pk).update(max_attempts=1)
    worker = start_worker("--queues", "default", "--grace-period", "0.5", **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=job.pk).exists())
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    job.refresh_from_db()
    assert (job.status, job.last_error_code, job.attempts) == (
        JobStatus.DEAD,
        "worker_shutdown",
        1,
    )
    assert job.finished_at is not None


def test_a_failed_loop_stops_the_worker_with_an_error(start_worker: Any) -> None:
    """An unexpected error in a dispatcher is not left to a dead thread under a live heartbeat."""
    from django.db import connection

    worker = start_worker("--queues", "default", **QUICK)
    first = enqueue("tests.behave", {})  # once it has run, the loop is past its start-up
    wait_for(lambda: Job.objects.filter(pk=first.pk, status=JobStatus.COMPLETED).exists())
    try:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs RENAME TO jobs_elsewhere")
        assert worker.wait(timeout=15) == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs_elsewhere RENAME TO jobs")
    output = worker.output()
    assert "pgoutbox-dispatch-default failed; stopping this worker" in output
    assert "stopped because pgoutbox-dispatch-default failed" in output


def test_grace_end_cancels_a_claim_stuck_behind_another_sessions_lock(
    start_worker: Any, raw_connection_params: dict[str, Any]
) -> None:
    """A limited queue's claim waits on the queue's lock, which another session holds and never
    lets go. At SIGTERM the grace period ends, the statement is cancelled a second later, and the
    process exits: no lock anywhere on the server keeps it from stopping."""
    import psycopg

    job = enqueue("tests.behave", {})
    with psycopg.connect(**raw_connection_params) as holder:
        holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('pgoutbox.claim:' || %s, 0))",
            ["default"],
        )
        worker = start_worker(
            "--queues",
            "default",
            "--grace-period",
            "0.5",
            QUEUES={"default": {"MAX_RUNNING": 2}},
            **QUICK,
        )

        def claim_waits_on_the_lock() -> bool:
            """the worker's claim is waiting on the queue's lock"""
            return bool(worker.backends("wait_event_type = 'Lock' AND wait_event = 'advisory'") > 0)

        wait_for(claim_waits_on_the_lock)
        started = time.monotonic()
        worker.signal(signal.SIGTERM)
        status = worker.wait(timeout=15)
        took = time.monotonic() - started
        assert claim_waits_on_the_lock() is False
        holder.rollback()
    assert status == 0, worker.output()
    assert took < scaled(6), f"exited {took:.1f}s after SIGTERM"
    job.refresh_from_db()
    assert (job.status, job.attempts) == (JobStatus.PENDING, 0)
