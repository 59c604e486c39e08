"""The rows of ``retry.py``'s table that the SQL enforces, checked against PostgreSQL.

Each test names its row. The outcomes are built as the worker builds them (``Outcome``, then
``outcomes.params``) and written with the statements the worker sends; one connection is
enough, so these run in the test's transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import enqueue, queries, retry
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.worker.execute import ClaimedJob, Outcome
from django_pgoutbox.worker.outcomes import params
from tests.conftest import claimed_job

pytestmark = pytest.mark.django_db

WORKER = "rules-worker"


def claim(max_attempts: int = 3, **fields: Any) -> ClaimedJob:
    """A job of its own queue, claimed by WORKER: the ``ClaimedJob`` of that attempt."""
    job = enqueue("tests.behave", {}, queue="reports")
    Job.objects.filter(pk=job.pk).update(max_attempts=max_attempts, **fields)
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CLAIM_JOBS, {"queue": "reports", "limit": 1, "worker_id": WORKER, "lease": 60.0}
        )
        (row,) = cursor.fetchall()
    attempt, claimed_max = row[3], row[4]
    claimed: ClaimedJob = claimed_job(
        "tests.behave", id=job.pk, attempt=attempt, max_attempts=claimed_max
    )
    return claimed


def record(outcome: Outcome) -> list[Any]:
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, params([outcome], WORKER))
        return [row[0] for row in cursor.fetchall()]


def recover(job: ClaimedJob) -> None:
    """Expire the lease of ``job`` and recover it (RECOVER_EXPIRED_LEASES)."""
    past = timezone.now() - timedelta(hours=1)  # before the transaction's now()
    Job.objects.filter(pk=job.id).update(lease_expires_at=past)
    with connection.cursor() as cursor:
        cursor.execute(queries.RECOVER_EXPIRED_LEASES, {"queue": "reports", "notify": True})


def snoozed(job: ClaimedJob, seconds: float = 60.0) -> Outcome:
    """The outcome ``execute()`` gives a handler that raised ``Snooze(seconds)``."""
    return Outcome(
        job,
        JobStatus.RETRYING,
        delay=seconds,
        code="snoozed",
        summary=f"snoozed for {seconds:g}s by attempt {job.attempt}",
        gives_back_attempt=True,
    )


#: One outcome of each kind the worker writes, by name.
OUTCOMES: dict[str, Callable[[ClaimedJob], Outcome]] = {
    "completed": lambda job: Outcome.completed(job, '{"sent": 1}'),
    "retrying": lambda job: Outcome(
        job, JobStatus.RETRYING, delay=30.0, code="TransientError", summary="TransientError: x"
    ),
    "dead": lambda job: Outcome(
        job, JobStatus.DEAD, code="PermanentError", summary="PermanentError: x"
    ),
    "cancelled": lambda job: Outcome(job, JobStatus.CANCELLED, code="Revoked", summary="x"),
    "snoozed": snoozed,
}


def test_the_table_names_statements_that_exist() -> None:
    """Every *SQL* row of the table names statements of ``queries``."""
    assert retry.__doc__ is not None
    named = set(re.findall(r"\b(?:RECORD|RECOVER|RELEASE)_[A-Z_]+\b", retry.__doc__))
    assert named == {"RECORD_OUTCOMES", "RECOVER_EXPIRED_LEASES", "RELEASE_JOBS"}
    assert all(isinstance(getattr(queries, name, None), str) for name in named)


class TestSnoozeGivesTheAttemptBack:
    """Row ``Snooze(seconds)``: retry after ``seconds``, the attempt given back, never dead."""

    def test_retrying_later_with_the_attempt_uncounted(self) -> None:
        job = claim()
        assert record(snoozed(job, 60.0)) == [job.id]
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts, row.last_error_code) == ("retrying", 0, "snoozed")
        assert row.finished_at is None
        assert row.run_at > timezone.now() + timedelta(seconds=50)

    def test_never_dead_even_at_the_last_attempt(self) -> None:
        job = claim(max_attempts=1)
        assert job.attempt == job.max_attempts == 1
        record(snoozed(job))
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts) == ("retrying", 0)

    def test_a_retry_that_does_not_give_it_back_counts(self) -> None:
        job = claim()
        record(OUTCOMES["retrying"](job))
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts) == ("retrying", 1)

    def test_the_status_sent_is_a_real_one(self) -> None:
        """SQL reads the flag, not a pseudo-status: the statuses sent are the table's own."""
        job = claim()
        sent = params([snoozed(job)], WORKER)
        statuses, gives_back = sent["statuses"], sent["gives_back_attempt"]
        assert (statuses, gives_back) == (["retrying"], [True])
        assert set(statuses) <= {status.value for status in JobStatus}


class TestCancellationWins:
    """Row ``cancellation requested while the attempt ran``: cancel, whatever the outcome."""

    @pytest.mark.parametrize("outcome", sorted(OUTCOMES))
    def test_over_any_outcome(self, outcome: str) -> None:
        job = claim()
        Job.objects.filter(pk=job.id).update(cancel_requested_at=timezone.now())
        assert record(OUTCOMES[outcome](job)) == [job.id]
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.last_error_code) == ("cancelled", "cancelled")
        assert row.finished_at is not None
        assert row.completed_at is None
        assert (row.last_error_summary or "").startswith(
            "cancelled on request while attempt 1 ran; it ended: "
        )

    def test_the_result_it_returned_is_kept(self) -> None:
        job = claim()
        Job.objects.filter(pk=job.id).update(cancel_requested_at=timezone.now())
        record(OUTCOMES["completed"](job))
        assert Job.objects.get(pk=job.id).result == {"sent": 1}

    def test_over_a_lost_lease(self) -> None:
        job = claim()
        Job.objects.filter(pk=job.id).update(cancel_requested_at=timezone.now())
        recover(job)
        row = Job.objects.get(pk=job.id)
        assert row.status == "cancelled"
        assert row.finished_at is not None

    def test_over_a_release_at_shutdown(self) -> None:
        job = claim()
        Job.objects.filter(pk=job.id).update(cancel_requested_at=timezone.now())
        with connection.cursor() as cursor:
            cursor.execute(queries.RELEASE_JOBS, [[job.id], [job.attempt], WORKER])
        assert Job.objects.get(pk=job.id).status == "cancelled"


class TestLeaseRecovery:
    """Row ``process crash (lease expired)``: the attempt given back; one that ran alone counts,
    and is a dead letter once ``attempts >= max_attempts``."""

    def test_the_attempt_is_given_back_even_at_the_last(self) -> None:
        job = claim(max_attempts=1)
        recover(job)
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts, row.last_error_code) == ("retrying", 0, "lease_expired")
        assert row.finished_at is None

    def test_an_attempt_that_ran_alone_counts(self) -> None:
        job = claim(max_attempts=3)
        mark_alone(job)
        recover(job)
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts) == ("retrying", 1)
        assert row.finished_at is None

    def test_dead_at_max_attempts_when_it_ran_alone(self) -> None:
        job = claim(max_attempts=2, attempts=1)
        assert job.attempt == job.max_attempts == 2
        mark_alone(job)
        recover(job)
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.attempts, row.last_error_code) == ("dead", 2, "lease_expired")
        assert row.finished_at is not None


def mark_alone(job: ClaimedJob) -> None:
    with connection.cursor() as cursor:
        cursor.execute(queries.MARK_ALONE, [job.id, job.attempt, WORKER])
        assert cursor.fetchall() == [(job.id,)]
