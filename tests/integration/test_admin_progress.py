"""The admin shows what handlers said of their progress and metadata: in full on the job's
page, compactly in the job list, and whatever a row holds without failing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client

from django_pgoutbox import enqueue
from django_pgoutbox.admin.jobs import progress_text
from django_pgoutbox.models import Job

pytestmark = pytest.mark.django_db

ADMIN = "/admin/pgoutbox/"


def with_progress(progress: Any, meta: Any = None) -> Job:
    job = enqueue("tests.behave", {})
    Job.objects.filter(pk=job.pk).update(progress=progress, meta=meta)
    return job


def test_the_job_page_shows_progress_and_metadata(admin_client: Client) -> None:
    job = with_progress(
        {"done": 3, "total": 10, "message": "copying <files>"}, {"source": "s3://bucket"}
    )
    page = admin_client.get(f"{ADMIN}job/{job.pk}/change/").content.decode()
    assert "Progress and metadata" in page
    assert "3 / 10 (30%): copying &lt;files&gt;" in page
    assert "s3://bucket" in page


def test_the_job_list_shows_a_compact_progress(admin_client: Client) -> None:
    with_progress({"done": 1, "total": 4, "message": "a long message left out of the list"})
    page = admin_client.get(f"{ADMIN}job/").content.decode()
    assert "1 / 4 (25%)" in page
    assert "a long message left out" not in page


def test_the_list_reads_no_metadata(admin_client: Client) -> None:
    with_progress(None, {"big": "x" * 50_000})
    with connection.execute_wrapper(_refuse_meta):
        assert admin_client.get(f"{ADMIN}job/").status_code == 200


def _refuse_meta(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    assert '"jobs"."meta"' not in sql, sql
    return execute(sql, params, many, context)


@pytest.mark.parametrize(
    ("progress", "shown"),
    [
        (None, "-"),
        ({"done": 5, "total": None, "message": None}, "5"),
        ({"done": 2.5, "total": 0}, "2.5 / 0"),
        ({"done": 0, "total": 0}, "0 / 0"),
        ("written by hand", "'written by hand'"),
        ({"done": "x", "total": "y"}, "'x' / 'y'"),
        ({"done": 1, "total": 10**400}, "1 / 1"),
    ],
)
def test_any_row_is_shown(progress: Any, shown: str, admin_client: Client) -> None:
    assert progress_text(progress, with_message=False).startswith(shown)
    job = with_progress(progress)
    assert admin_client.get(f"{ADMIN}job/{job.pk}/change/").status_code == 200
    assert admin_client.get(f"{ADMIN}job/").status_code == 200
