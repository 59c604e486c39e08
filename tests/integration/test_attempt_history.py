"""The attempt history (``jobs.attempt_log``, ``Job.attempt_history``) against PostgreSQL.

``TestThroughTheWorker`` drains jobs with a worker in this process, so it is ``transaction=True``:
the worker's threads see only what the test committed. The others send the worker's statements
themselves on the test's one connection, in its transaction, as tests/integration/
test_outcome_rules.py does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import enqueue, queries
from django_pgoutbox.attempts import MAX_LOGGED_ATTEMPTS, MAX_LOGGED_SUMMARY, AttemptRecord
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.worker.execute import ClaimedJob, Outcome
from django_pgoutbox.worker.outcomes import params
from tests.conftest import claimed_job, drain
from tests.processes import wait_for

WORKER = "history-worker"

FAST = {"POLL_INTERVAL": 0.2, "RETRY": {"BASE_DELAY": 0.01, "MAX_DELAY": 0.01, "JITTER": 0}}


def log_is_null(job_id: Any) -> bool:
    """Whether the column is SQL NULL (not a JSON ``null``, which the ORM reads the same)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT attempt_log IS NULL FROM jobs WHERE id = %s", [job_id])
        (null,) = cursor.fetchone()
    return bool(null)


def claim(worker: str = WORKER, **fields: Any) -> ClaimedJob:
    """Claim the one due job of the queue ``reports`` (made if ``fields`` says so) as ``worker``."""
    if fields:
        job = enqueue("tests.behave", {}, queue="reports")
        Job.objects.filter(pk=job.pk).update(**fields)
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CLAIM_JOBS, {"queue": "reports", "limit": 1, "worker_id": worker, "lease": 60.0}
        )
        (row,) = cursor.fetchall()
    made: ClaimedJob = claimed_job("tests.behave", id=row[0], attempt=row[3], max_attempts=row[4])
    return made


def record(outcome: Outcome, worker: str = WORKER) -> list[Any]:
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, params([outcome], worker))
        return [row[0] for row in cursor.fetchall()]


def failed(job: ClaimedJob, summary: str = "TransientError: upstream") -> Outcome:
    # delay 0: due at the transaction's now(), so the test's next claim takes it again
    return Outcome(job, JobStatus.RETRYING, delay=0.0, code="TransientError", summary=summary)


def expire_and_recover(job_id: Any) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    with connection.cursor() as cursor:
        cursor.execute(queries.RECOVER_EXPIRED_LEASES, {"queue": "reports", "notify": True})


@pytest.mark.django_db(transaction=True)
class TestThroughTheWorker:
    @pytest.fixture(autouse=True)
    def fast(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, **FAST}

    def drain_until(self, job: Job, status: str) -> None:
        def reached() -> bool:
            drain()
            job.refresh_from_db()
            return bool(job.status == status)

        wait_for(reached, timeout=30)

    def test_a_first_attempt_that_completes_logs_nothing(self) -> None:
        job = enqueue("tests.behave", {})
        drain()
        job.refresh_from_db()
        assert job.status == JobStatus.COMPLETED
        assert log_is_null(job.pk)
        (own,) = job.attempt_history
        assert own == AttemptRecord(
            1, job.locked_by, job.locked_at, job.completed_at, "completed", None, None
        )

    def test_two_failures_then_a_completion(self) -> None:
        job = enqueue("tests.behave", {"fail": "transient", "fail_attempts": 2})
        self.drain_until(job, JobStatus.COMPLETED)
        assert job.attempts == 3
        assert job.attempt_log is not None
        assert len(job.attempt_log) == 2
        history = job.attempt_history
        assert [(r.attempt, r.outcome, r.error_code) for r in history] == [
            (1, "retrying", "TransientError"),
            (2, "retrying", "TransientError"),
            (3, "completed", None),
        ]
        assert [r.summary for r in history] == [
            "TransientError: upstream timed out",
            "TransientError: upstream timed out",
            None,
        ]
        assert all(r.worker and r.worker in job.worker_ids for r in history)
        moments = [(r.started_at, r.ended_at) for r in history]
        assert all(start is not None and end is not None for start, end in moments)
        assert sorted(moments) == moments
        assert all(start <= end for start, end in moments)  # type: ignore[operator]
        assert history[-1].ended_at == job.completed_at
        # The row's last error is the previous failure's: the history says it was not the last.
        assert job.last_error_code == "TransientError"

    @pytest.mark.parametrize("how", ["print_megabyte", "surrogate_error", "hostile_megabyte"])
    def test_a_huge_or_unprintable_message_is_bounded(self, how: str) -> None:
        job = enqueue("tests.misbehave", {"how": how})
        self.drain_until(job, JobStatus.DEAD)  # an unknown error: retried 3 times, then dead
        assert (job.status, job.attempts) == (JobStatus.DEAD, 4)
        history = job.attempt_history
        assert [(r.attempt, r.outcome) for r in history] == [
            (1, "retrying"),
            (2, "retrying"),
            (3, "retrying"),
            (4, "dead"),
        ]
        for entry in history:
            assert entry.error_code == "ValueError"
            assert entry.summary is not None
            assert len(entry.summary) <= MAX_LOGGED_SUMMARY
            assert "\x00" not in entry.summary
            entry.summary.encode("utf-8")  # no lone surrogate
            assert entry.summary.startswith("ValueError: ")


@pytest.mark.django_db
class TestStatements:
    def test_the_newest_entries_are_kept(self) -> None:
        for n in range(MAX_LOGGED_ATTEMPTS + 5):
            job = claim(max_attempts=100) if n == 0 else claim()
            assert record(failed(job, f"TransientError: attempt {job.attempt}")) == [job.id]
        row = Job.objects.get(pk=job.id)
        assert row.attempts == MAX_LOGGED_ATTEMPTS + 5
        history = row.attempt_history
        assert len(history) == MAX_LOGGED_ATTEMPTS
        assert [r.attempt for r in history] == list(range(6, MAX_LOGGED_ATTEMPTS + 6))
        assert history[-1].summary == f"TransientError: attempt {MAX_LOGGED_ATTEMPTS + 5}"

    def test_a_lost_attempt(self) -> None:
        job = claim(max_attempts=3)
        expire_and_recover(job.id)
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts) == (JobStatus.RETRYING, 0)
        (entry,) = row.attempt_history
        assert (entry.attempt, entry.worker, entry.outcome, entry.error_code) == (
            1,
            WORKER,
            "lost",
            "lease_expired",
        )
        assert entry.summary == row.last_error_summary
        # given back: the next claim is attempt 1 again, and it completes
        again = claim("second-worker")
        assert again.attempt == 1
        assert record(Outcome.completed(again, "null"), "second-worker") == [job.id]
        row.refresh_from_db()
        assert [(r.attempt, r.worker, r.outcome) for r in row.attempt_history] == [
            (1, WORKER, "lost"),
            (1, "second-worker", "completed"),
        ]

    def test_a_stale_outcome_appends_nothing(self) -> None:
        job = claim(max_attempts=3)
        expire_and_recover(job.id)
        taken_over = claim("second-worker")
        assert (taken_over.id, taken_over.attempt) == (job.id, job.attempt)
        for outcome in (failed(job), Outcome.completed(job, "null")):
            assert record(outcome) == []  # WORKER's: fenced off
        row = Job.objects.get(pk=job.id)
        assert [r.outcome for r in row.attempt_history] == ["lost", "running"]
        assert row.attempt_history[-1].worker == "second-worker"

    def test_dead_snoozed_and_cancelled_are_logged(self) -> None:
        job = claim(max_attempts=3)
        snooze = Outcome(
            job, JobStatus.RETRYING, delay=0.0, code="snoozed", summary="s", gives_back_attempt=True
        )
        record(snooze)
        job = claim()
        Job.objects.filter(pk=job.id).update(cancel_requested_at=timezone.now())
        record(Outcome.completed(job, "null"))  # a cancellation wins: logged, cancelled
        row = Job.objects.get(pk=job.id)
        assert row.status == JobStatus.CANCELLED
        assert [(r.attempt, r.outcome, r.error_code) for r in row.attempt_history] == [
            (1, "snoozed", "snoozed"),
            (1, "cancelled", "cancelled"),
        ]
        assert row.attempt_history[-1].summary == row.last_error_summary

    def test_a_dead_letter_and_a_release(self) -> None:
        job = claim(max_attempts=3)
        with connection.cursor() as cursor:
            cursor.execute(queries.RELEASE_JOBS, [[job.id], [job.attempt], WORKER])
        job = claim()
        record(Outcome(job, JobStatus.DEAD, code="PermanentError", summary="PermanentError: no"))
        row = Job.objects.get(pk=job.id)
        assert [(r.attempt, r.outcome, r.error_code) for r in row.attempt_history] == [
            (1, "released", "worker_shutdown"),
            (2, "dead", "PermanentError"),
        ]

    def test_an_unstarted_attempt_given_back_is_not_one(self) -> None:
        job = claim(max_attempts=3)
        with connection.cursor() as cursor:
            cursor.execute(queries.UNCLAIM_JOBS, [[job.id], [job.attempt], WORKER])
        assert log_is_null(job.id)
        assert Job.objects.get(pk=job.id).attempt_history == []

    def test_a_long_summary_is_cut(self) -> None:
        job = claim(max_attempts=3)
        record(failed(job, "TransientError: " + "x" * 990))
        (entry,) = Job.objects.get(pk=job.id).attempt_history
        assert entry.summary is not None
        assert len(entry.summary) == MAX_LOGGED_SUMMARY
        assert entry.summary.endswith("x...")

    def test_a_log_written_by_hand_never_fails_an_outcome(self) -> None:
        job = claim(max_attempts=3)
        Job.objects.filter(pk=job.id).update(attempt_log={"not": "a list"})
        assert record(failed(job)) == [job.id]
        assert [r.outcome for r in Job.objects.get(pk=job.id).attempt_history] == ["retrying"]

    def test_entries_written_by_hand_read_leniently(self) -> None:
        job = enqueue("tests.behave", {})
        Job.objects.filter(pk=job.pk).update(
            attempt_log=[
                "not an object",
                {"attempt": "1", "started_at": "yesterday", "ended_at": "2030-01-01T00:00:00"},
                {"attempt": 2, "outcome": "dead", "summary": "y" * 10_000},
            ]
        )
        first, second = Job.objects.get(pk=job.pk).attempt_history
        assert first == AttemptRecord(None, None, None, None, None, None, None)
        assert (second.attempt, second.outcome) == (2, "dead")
        assert len(second.summary or "") == MAX_LOGGED_SUMMARY
