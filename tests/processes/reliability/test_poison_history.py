"""Poison against the attempt history: a job that fails at every attempt with a megabyte of
hostile text, beside innocent jobs in the same claim, under a real ``runworkers`` process.

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import control, enqueue_many
from django_pgoutbox.attempts import MAX_LOGGED_ATTEMPTS, MAX_LOGGED_SUMMARY
from django_pgoutbox.models import Job, JobStatus
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Retried at once, as often as its budget allows: more attempts than the log keeps.
ATTEMPTS = MAX_LOGGED_ATTEMPTS + 5
RETRY = {"BASE_DELAY": 0.01, "MAX_DELAY": 0.01, "JITTER": 0, "UNKNOWN_ERROR_RETRIES": ATTEMPTS}


def test_a_poison_failing_with_a_hostile_megabyte_keeps_a_bounded_history(
    start_worker: Any,
) -> None:
    """Each failure raises 1.2 million characters of NUL bytes, lone surrogates and markup. The
    poison ends dead with the newest 20 attempts, each summary bounded and storable; the
    innocent jobs of its claim complete at their first attempt and log nothing."""
    innocent = {"job_type": "tests.behave", "payload": {"sleep": 0.05}}
    poison = {"job_type": "tests.misbehave", "payload": {"how": "hostile_megabyte"}}
    jobs = enqueue_many([innocent] * 3 + [poison] + [innocent] * 3)
    dead = jobs[3]
    innocents = [*jobs[:3], *jobs[4:]]
    Job.objects.filter(pk=dead.pk).update(max_attempts=ATTEMPTS)
    # Each retry is due 10 ms later, after the claim that wrote it: the poll finds it.
    worker = start_worker(
        "--queues", "default", "--concurrency", "4", RETRY=RETRY, POLL_INTERVAL=0.2
    )

    def finished() -> bool:
        return not Job.objects.exclude(status__in=(JobStatus.COMPLETED, JobStatus.DEAD)).exists()

    wait_for(finished, timeout=60)
    assert worker.process.poll() is None

    dead.refresh_from_db()
    assert (dead.status, dead.attempts) == (JobStatus.DEAD, ATTEMPTS)
    history = dead.attempt_history
    assert [r.attempt for r in history] == list(range(6, ATTEMPTS + 1))  # the newest 20
    assert len({r.worker for r in history}) == 1  # the one worker's id
    assert history[0].worker
    assert [r.outcome for r in history] == ["retrying"] * (MAX_LOGGED_ATTEMPTS - 1) + ["dead"]
    for record in history:
        assert record.error_code == "ValueError"
        assert record.summary is not None
        assert len(record.summary) <= MAX_LOGGED_SUMMARY
        assert "ValueError: \\x00\\ud800<b>&" in record.summary
        record.summary.encode("utf-8")  # storable: no lone surrogate, no NUL
        assert record.started_at is not None
        assert record.ended_at is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT jsonb_array_length(attempt_log), pg_column_size(attempt_log) "
            "FROM jobs WHERE id = %s",
            [dead.pk],
        )
        entries, size = cursor.fetchone()
    assert entries == MAX_LOGGED_ATTEMPTS
    assert size < MAX_LOGGED_ATTEMPTS * (MAX_LOGGED_SUMMARY + 400)
    # Its cause, worked out from the summary it kept, groups it on the causes page.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary) "
            "FROM jobs WHERE id = %s",
            [dead.pk],
        )
        (cause,) = cursor.fetchone()
    assert dead.dead_cause == cause
    (grouped,) = control.dead_letter_causes().causes
    assert (grouped.fingerprint, grouped.example_id, grouped.count) == (cause, dead.pk, 1)
    assert control.count_dead_cause(cause) == 1

    for job in innocents:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1)
        assert job.attempt_log is None
        assert job.dead_cause is None
        (own,) = job.attempt_history
        assert (own.attempt, own.outcome, own.error_code) == (1, "completed", None)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND attempt_log IS NULL",
            [[job.pk for job in innocents]],
        )
        assert cursor.fetchone()[0] == len(innocents)
