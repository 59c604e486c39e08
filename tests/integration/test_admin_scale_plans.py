"""The plans behind the admin's pages at scale (docs/admin.md, "Ten million jobs"): each page's
statements follow an index, checked with EXPLAIN on a small table with sequential scans off;
benchmarks/admin_scale.py measures them at ten million jobs."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgoutbox import enqueue
from django_pgoutbox.models import Job, JobStatus

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "/admin/pgoutbox/deadletter/"
JOBS = "/admin/pgoutbox/job/"


def _plans(client: Client, url: str, needle: str) -> list[str]:
    """The EXPLAIN of each statement of the page at ``url`` that mentions ``needle``."""
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    plans = []
    for query in captured.captured_queries:
        sql = query["sql"]
        if needle in sql and sql.lstrip().upper().startswith("SELECT") and "EXPLAIN" not in sql:
            with transaction.atomic(), connection.cursor() as cursor:
                # A small table: without these, a bitmap scan and a sort cost as little.
                for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
                    cursor.execute(f"SET LOCAL {setting} = off")
                cursor.execute(f"EXPLAIN {sql}")
                plans.append("\n".join(row[0] for row in cursor.fetchall()))
    assert plans, f"no statement of {url} mentions {needle}"
    return plans


def _dead_letters() -> None:
    for code in ("TimeoutError", "KeyError"):
        job = enqueue("tests.behave", {}, queue="webhooks", idempotency_key=f"k-{code}")
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.DEAD, last_error_code=code, finished_at=timezone.now()
        )


@pytest.mark.parametrize(
    ("query", "index"),
    [
        ("", "jobs_dead_finished_idx"),
        ("?p=2", "jobs_dead_finished_idx"),
        ("?job_type=tests.behave", "jobs_dead_type_idx"),
        ("?last_error_code=KeyError", "jobs_dead_code_idx"),
    ],
)
def test_the_dead_letters_pages_read_an_index_in_their_order(
    admin_client: Client, query: str, index: str
) -> None:
    _dead_letters()
    plans = _plans(admin_client, DEAD + query, "ORDER BY")
    for plan in plans:
        assert index in plan, plan
        assert "Sort" not in plan, plan  # the index's order is the page's


def test_a_key_search_descends_the_unique_index(admin_client: Client) -> None:
    """First among the jobs of no organization and of a known job type: a descent of the
    unique index per type, not a read of the whole index (the dead letters' page may take a
    partial index of dead jobs instead, which a small table makes as cheap)."""
    _dead_letters()
    plans = _plans(admin_client, f"{JOBS}?q=k-KeyError", "idempotency_key")
    first = plans[0]
    assert "jobs_idempotency_uq" in first, first
    assert "organization_id IS NULL" in first.split("Index Cond")[1], first
    for plan in _plans(admin_client, f"{DEAD}?q=k-KeyError", "idempotency_key"):
        assert "Seq Scan" not in plan, plan


def test_the_job_type_filter_looks_among_the_newest_jobs(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_pgoutbox.admin import filters

    monkeypatch.setattr(filters, "JOB_TYPE_WINDOW", 4)
    old = [enqueue("tests.noop", {}).pk for _ in range(3)]
    new = [enqueue("tests.behave", {}).pk for _ in range(3)] + [enqueue("tests.noop", {}).pk]
    page = admin_client.get(f"{JOBS}?job_type=tests.noop").content.decode()
    assert str(new[-1]) in page
    assert not any(str(pk) in page for pk in old)  # older than the newest four
    page = admin_client.get(f"{JOBS}?job_type=tests.behave").content.decode()
    assert all(str(pk) in page for pk in new[:3])


def test_a_queue_and_the_finished_statuses_look_among_the_newest_jobs(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue with no job, or a status with none, read every row of ten million: with no
    status an index finds by queue, the page looks among the newest jobs; with one it does
    (pending, retrying, dead, leased), the queue's every job of it."""
    from django_pgoutbox.admin import filters

    monkeypatch.setattr(filters, "JOB_TYPE_WINDOW", 4)
    old = [enqueue("tests.noop", {}, queue="webhooks").pk for _ in range(3)]
    Job.objects.filter(pk=old[0]).update(status=JobStatus.CANCELLED, finished_at=timezone.now())
    new = [enqueue("tests.noop", {}).pk for _ in range(4)]
    page = admin_client.get(f"{JOBS}?queue=webhooks&maintenance=included").content.decode()
    assert not any(str(pk) in page for pk in old)  # older than the newest four
    page = admin_client.get(f"{JOBS}?queue=default").content.decode()
    assert all(str(pk) in page for pk in new)
    # Pending: every one of the queue, through the claim index.
    page = admin_client.get(f"{JOBS}?queue=webhooks&status=pending").content.decode()
    assert all(str(pk) in page for pk in old[1:])
    # Cancelled: among the newest four, where it is not.
    page = admin_client.get(f"{JOBS}?status=cancelled").content.decode()
    assert str(old[0]) not in page
    assert "cancelled (among the newest 4)" in page
    # Each windowed page bounds its list by the primary key; the pending one does not.
    for url, bounded in (
        (f"{JOBS}?queue=webhooks", True),
        (f"{JOBS}?status=cancelled", True),
        (f"{JOBS}?queue=webhooks&status=pending", False),
    ):
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        listed = [
            q["sql"]
            for q in captured.captured_queries
            if "ORDER BY" in q["sql"] and " WHERE " in q["sql"] and "jobs" in q["sql"]
        ]
        assert listed, url
        assert all(('"jobs"."id" >=' in sql) is bounded for sql in listed), (url, listed)
