"""A job's attempts on its admin pages and in ``pgoutbox deadletters show``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from django_pgoutbox.admin.jobs import DeadLetterAdmin, JobAdmin
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.worker.execute import Outcome
from tests.integration.test_attempt_history import claim, failed, record

pytestmark = pytest.mark.django_db

HOSTILE = '<script>alert("x")</script> & <b>'


def failed_then(last: str) -> Job:
    """A job of the queue ``reports`` that failed once, then ended ``last``."""
    job = claim(max_attempts=3)
    record(failed(job, f"TransientError: {HOSTILE}"))
    job = claim()
    if last == "completed":
        record(Outcome.completed(job, "null"))
    else:
        record(Outcome(job, JobStatus.DEAD, code="PermanentError", summary="PermanentError: no"))
    return Job.objects.get(pk=job.id)


def test_a_completed_job_says_its_last_error_is_a_previous_failure(admin_client: Client) -> None:
    job = failed_then("completed")
    page = admin_client.get(f"/admin/pgoutbox/job/{job.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Previous failure (not the current state: a later attempt completed the job)" in text
    assert "Last error</strong>" not in text
    assert text.count("<td>retrying</td>") == 1
    assert text.count("<td>completed</td>") == 1
    assert HOSTILE not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;" in text


def test_a_dead_letter_shows_its_last_error_and_every_attempt(admin_client: Client) -> None:
    job = failed_then("dead")
    page = admin_client.get(f"/admin/pgoutbox/deadletter/{job.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Last error</strong>: <code>PermanentError</code>" in text
    assert "Previous failure" not in text
    assert [text.count(f"<td>{outcome}</td>") for outcome in ("retrying", "dead")] == [1, 1]
    assert HOSTILE not in text


def test_a_job_never_attempted(admin_client: Client) -> None:
    job = claim(max_attempts=3)
    Job.objects.filter(pk=job.id).update(status=JobStatus.PENDING, attempts=0)
    text = admin_client.get(f"/admin/pgoutbox/job/{job.id}/change/").content.decode()
    assert "No error recorded." in text
    assert "No attempt kept." in text


def test_the_list_pages_do_not_read_the_log(admin_client: Client) -> None:
    failed_then("dead")
    for page in ("job", "deadletter"):
        assert admin_client.get(f"/admin/pgoutbox/{page}/").status_code == 200
    assert "attempt_log" in JobAdmin.heavy_fields
    assert "attempt_log" in DeadLetterAdmin.heavy_fields


def test_deadletters_show_prints_the_attempts() -> None:
    job = failed_then("dead")
    out = StringIO()
    call_command("pgoutbox", "deadletters", "show", str(job.pk), stdout=out)
    lines = out.getvalue().splitlines()
    start = lines.index("   attempts kept:")
    header, first, second = lines[start + 1 :]
    for title in ("attempt", "worker", "started (UTC)", "ended (UTC)", "outcome", "summary"):
        assert title in header
    assert "retrying" in first
    assert "TransientError" in first
    assert "dead" in second
    assert "PermanentError: no" in second
