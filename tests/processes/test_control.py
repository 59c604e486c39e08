"""Cancellation, snooze, timeouts and process isolation, with real worker processes."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_pgoutbox import Snooze, cancel, enqueue
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import holds_for, scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: A lease far longer than any test: a cancellation seen within a second was not seen at a
#: renewal (every 10 s) but through the notification.
LONG_LEASE = {"LEASE_SECONDS": 30, "POLL_INTERVAL": 0.2, "RETRY": {"BASE_DELAY": 0.1}}


def status_of(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def started(job: Job, attempt: int = 1) -> Any:
    def find() -> bool:
        return SideEffect.objects.filter(job_id=job.pk, attempt=attempt, event="start").exists()

    return find


def effects(job: Job) -> list[tuple[int, str]]:
    return list(
        SideEffect.objects.filter(job_id=job.pk).order_by("id").values_list("attempt", "event")
    )


# -- cancellation --------------------------------------------------------------------------------


def test_cancel_pending_job_never_runs(start_worker: Any) -> None:
    doomed = enqueue("tests.behave", {})
    kept = enqueue("tests.behave", {})
    assert cancel(doomed.pk) == "cancelled"
    assert cancel(str(doomed.pk)) == "cancelled"  # again: already cancelled, no error
    worker = start_worker("--queues", "default", "--burst", **LONG_LEASE)
    assert worker.wait(timeout=30) == 0
    assert status_of(doomed) == JobStatus.CANCELLED
    assert status_of(kept) == JobStatus.COMPLETED
    assert not SideEffect.objects.filter(job_id=doomed.pk).exists()
    row = Job.objects.get(pk=doomed.pk)
    assert row.last_error_code == "cancelled"
    assert row.finished_at is not None


def test_cancel_a_retrying_job_and_finished_ones() -> None:
    job = enqueue("tests.behave", {})
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RETRYING, attempts=1)
    assert cancel(job.pk) == "cancelled"
    done = enqueue("tests.behave", {})
    Job.objects.filter(pk=done.pk).update(status=JobStatus.COMPLETED)
    assert cancel(done.pk) == "completed"
    assert status_of(done) == JobStatus.COMPLETED


def test_cancel_rejects_bad_and_unknown_ids() -> None:
    with pytest.raises(EnqueueError, match="job_id"):
        cancel("not-a-uuid")
    with pytest.raises(Job.DoesNotExist):
        cancel(uuid.uuid4())


@pytest.mark.parametrize("mode", ["flag", "renew"])
def test_cancel_running_job_is_seen_by_the_handler(start_worker: Any, mode: str) -> None:
    job = enqueue("tests.cancellable", {"mode": mode, "seconds": 20})
    start_worker("--queues", "default", **LONG_LEASE)
    wait_for(started(job))
    asked = time.monotonic()
    assert cancel(job.pk) == "cancelling"
    wait_for(lambda: status_of(job) == JobStatus.CANCELLED, timeout=10)
    seen_after = time.monotonic() - asked
    row = Job.objects.get(pk=job.pk)
    assert row.last_error_code == "cancelled"
    assert row.attempts == 1  # never retried
    assert row.cancel_requested_at is not None
    events = [event for _, event in effects(job)]
    assert "end" not in events
    if mode == "flag":
        assert events == ["start", "saw-cancel"]
        assert row.result == {"stopped": "cancelled"}
    else:
        assert events == ["start"]
        assert "Cancelled" in (row.last_error_summary or "")
    # The cancellation travels by notification, not waiting for a renewal.
    assert seen_after < scaled(3), seen_after


def test_cancel_from_the_command_and_the_admin(admin_client: Any) -> None:
    first = enqueue("tests.behave", {})
    second = enqueue("tests.behave", {})
    out = StringIO()
    call_command("pgoutbox", "cancel", str(first.pk), str(uuid.uuid4()), stdout=out)
    text = out.getvalue()
    assert f"{first.pk}: cancelled" in text
    assert "not found" in text
    assert status_of(first) == JobStatus.CANCELLED

    url = "/admin/pgoutbox/job/"
    ask = admin_client.post(url, {"action": "cancel_jobs", "_selected_action": [second.pk]})
    assert ask.status_code == 200  # the confirmation page
    assert b"Cancel jobs" in ask.content
    admin_client.post(
        url, {"action": "cancel_jobs", "_selected_action": [second.pk], "confirmed": "yes"}
    )
    assert status_of(second) == JobStatus.CANCELLED


# -- snooze --------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["raise", "return"])
def test_snooze_keeps_the_attempt(start_worker: Any, form: str) -> None:
    job = enqueue("tests.snooze", {"times": 3, "seconds": 0.2, "return": form == "return"})
    start_worker("--queues", "default", **LONG_LEASE)
    wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=20)
    row = Job.objects.get(pk=job.pk)
    assert row.attempts == 1
    assert row.result == {"attempt": 1, "starts": 3}
    assert [a for a, event in effects(job) if event == "start"] == [1, 1, 1]
    assert len(row.worker_ids) == 3  # three claims, one attempt


def test_snooze_rejects_bad_seconds() -> None:
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(TypeError, match="Snooze"):
            Snooze(bad)  # type: ignore[arg-type]


# -- timeouts ------------------------------------------------------------------------------------


def test_timed_out_attempt_is_retried_and_its_late_result_rejected(start_worker: Any) -> None:
    job = enqueue("tests.timeout", {"sleep": 3, "slow_attempts": 1})
    worker = start_worker("--queues", "default", **LONG_LEASE)
    wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=20)
    row = Job.objects.get(pk=job.pk)
    assert row.attempts == 2
    assert row.result == {"attempt": 2}
    assert row.last_error_code == "timeout"
    # The first attempt's thread was left running: it reaches its end about 3 s after it
    # started, and its result is refused by the fence (the attempt number moved on).
    wait_for(lambda: (1, "end") in effects(job), timeout=10)
    wait_for(lambda: "came after the attempt's timeout" in worker.output(), timeout=5)
    assert Job.objects.get(pk=job.pk).result == {"attempt": 2}


def test_timeout_dead_letters_when_attempts_run_out(start_worker: Any) -> None:
    job = enqueue("tests.timeout", {"sleep": 1.5, "slow_attempts": 9})
    start_worker("--queues", "default", **LONG_LEASE)
    wait_for(lambda: status_of(job) == JobStatus.DEAD, timeout=20)
    row = Job.objects.get(pk=job.pk)
    assert (row.attempts, row.last_error_code) == (3, "timeout")


def test_isolated_timeout_kills_the_handler(start_worker: Any) -> None:
    job = enqueue("tests.isolated", {"sleep": 4})
    worker = start_worker("--queues", "default", **LONG_LEASE)
    try:
        wait_for(lambda: status_of(job) == JobStatus.COMPLETED, timeout=30)
    except AssertionError:
        print(worker.output(), Job.objects.filter(pk=job.pk).values().get())
        raise
    row = Job.objects.get(pk=job.pk)
    assert row.attempts == 2
    assert row.last_error_code == "timeout"
    assert row.result is not None
    assert row.result["pid"] != worker.pid  # ran in a child process
    # Past the moment attempt 1 would have woken up, it has not: it was killed.
    holds_for(lambda: effects(job) == [(1, "start"), (2, "start"), (2, "end")], 4)


def test_isolated_cancel_kills_the_handler(start_worker: Any) -> None:
    job = enqueue("tests.isolated", {"sleep": 30})
    start_worker("--queues", "default", **LONG_LEASE)
    wait_for(started(job))
    assert cancel(job.pk) == "cancelling"
    wait_for(lambda: status_of(job) == JobStatus.CANCELLED, timeout=10)
    assert effects(job) == [(1, "start")]


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"fail": "permanent"}, JobStatus.DEAD, "PermanentError"),
        ({"fail": "rate_limited", "retry_after": 60}, JobStatus.RETRYING, "RateLimited"),
        ({"exit": True}, JobStatus.RETRYING, "HandlerProcessDied"),
    ],
)
def test_isolated_failures_reach_the_retry_policy(
    start_worker: Any, payload: dict[str, Any], status: str, code: str
) -> None:
    job = enqueue("tests.isolated", {**payload, "slow_attempts": 0}, run_at=timedelta(0))
    start_worker("--queues", "default", **LONG_LEASE)
    wait_for(lambda: Job.objects.get(pk=job.pk).last_error_code == code, timeout=20)
    assert status_of(job) == status


def test_ctrl_c_lets_an_isolated_attempt_finish(start_worker: Any) -> None:
    """SIGINT to the whole process group, as Ctrl-C in a terminal: a graceful stop, children too."""
    import os
    import signal

    job = enqueue("tests.isolated_untimed", {"sleep": 0.8})
    worker = start_worker("--queues", "default", "--grace-period", "10", **LONG_LEASE)
    wait_for(lambda: effects(job) == [(1, "start")])
    os.killpg(worker.pid, signal.SIGINT)
    assert worker.wait(timeout=15) == 0
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == (JobStatus.COMPLETED, 1)
    assert effects(job) == [(1, "start"), (1, "end")]


def test_an_isolated_attempt_past_the_grace_period_is_killed(start_worker: Any) -> None:
    """Its job is released for another worker: the old attempt must not run on beside the next.

    The handler sleeps long enough (scaled) that a loaded machine's SIGTERM and shutdown come
    well within it: with 0.9 s it once finished before the grace period ended."""
    import signal

    sleep = scaled(1.5)
    job = enqueue("tests.isolated_untimed", {"sleep": sleep})
    worker = start_worker("--queues", "default", "--grace-period", "0.2", **LONG_LEASE)
    wait_for(lambda: effects(job) == [(1, "start")])
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    # Past when it would have finished.
    holds_for(lambda: effects(job) == [(1, "start")], sleep + 0.6)
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.last_error_code) == (JobStatus.PENDING, "worker_shutdown")
