"""Queues on several databases: ``using=``, ``runworkers --database``, the LISTEN connection."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connections

from django_pgoutbox import cancel, enqueue, enqueue_many, publish
from django_pgoutbox.checks import check_pooling_proxy
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from tests.processes import database_url_for_tests, wait_for

#: Polls far apart: a job that starts within a second was woken by its notification.
SLOW_POLL = {"POLL_INTERVAL": 30, "LEASE_SECONDS": 5}


def status(job: Job, using: str) -> str:
    return Job.objects.using(using).values_list("status", flat=True).get(pk=job.pk)


@pytest.mark.django_db(transaction=True, databases=["default", "secondary"])
def test_two_databases_with_a_worker_each(start_worker: Any) -> None:
    secondary_url = database_url_for_tests("secondary")
    primary = start_worker("--queues", "default", "--worker-id", "primary-worker", **SLOW_POLL)
    secondary = start_worker(
        "--queues",
        "default",
        "--database",
        "secondary",
        "--worker-id",
        "secondary-worker",
        database_url=database_url_for_tests(),
        env={"SECONDARY_DATABASE_URL": secondary_url},
        **SLOW_POLL,
    )
    wait_for(lambda: primary.listening() and secondary.listening())
    here = enqueue("tests.stamp", {})
    there = enqueue("tests.stamp", {}, using="secondary")
    many = enqueue_many([{"job_type": "tests.stamp", "payload": {}}] * 5, using="secondary")
    assert not Job.objects.filter(pk=there.pk).exists()  # written to the secondary alone
    wait_for(lambda: status(here, "default") == JobStatus.COMPLETED, timeout=5)
    wait_for(lambda: status(there, "secondary") == JobStatus.COMPLETED, timeout=5)
    wait_for(
        lambda: Job.objects.using("secondary").filter(status=JobStatus.COMPLETED).count() == 6,
        timeout=5,
    )
    assert Job.objects.get(pk=here.pk).worker_ids == ["primary-worker"]
    assert Job.objects.using("secondary").get(pk=there.pk).worker_ids == ["secondary-worker"]
    assert {
        j.worker_ids[0] for j in Job.objects.using("secondary").filter(pk__in=[m.pk for m in many])
    } == {"secondary-worker"}
    event = publish(
        "thing.happened",
        aggregate_type="thing",
        aggregate_id=there.pk,
        payload={},
        using="secondary",
    )
    assert OutboxEvent.objects.using("secondary").filter(pk=event.pk).exists()
    assert not OutboxEvent.objects.filter(pk=event.pk).exists()
    pending = enqueue(
        "tests.stamp", {}, using="secondary", run_at=there.created_at.replace(year=2100)
    )
    assert cancel(pending.pk, using="secondary") == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_listen_on_a_direct_connection(start_worker: Any) -> None:
    worker = start_worker(
        "--queues", "default", LISTEN_DATABASES={"default": "direct"}, **SLOW_POLL
    )
    wait_for(worker.listening)
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%%' "
            "AND datname = current_database()"
        )
        assert cursor.fetchone()[0] >= 1
    job = enqueue("tests.stamp", {})
    wait_for(lambda: status(job, "default") == JobStatus.COMPLETED, timeout=5)
    assert "LISTEN connection failed" not in worker.output()


def test_pooling_proxy_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_pgoutbox import conf

    assert check_pooling_proxy(None) == []
    monkeypatch.setitem(settings.DATABASES["default"], "PORT", "6432")
    warnings = check_pooling_proxy(None)
    assert [w.id for w in warnings] == ["pgoutbox.W002"]
    # No wake-ups, no LISTEN: nothing to warn about.
    from django.test import override_settings

    with override_settings(PGOUTBOX={**settings.PGOUTBOX, "NOTIFY": False}):
        assert check_pooling_proxy(None) == []
    assert "PORT 6432" in warnings[0].msg
    assert "LISTEN_DATABASES" in (warnings[0].hint or "")
    monkeypatch.setitem(settings.DATABASES["default"], "PORT", "5432")
    monkeypatch.setitem(settings.DATABASES["secondary"], "DISABLE_SERVER_SIDE_CURSORS", True)
    assert "DISABLE_SERVER_SIDE_CURSORS" in check_pooling_proxy(None)[0].msg
    monkeypatch.setattr(
        settings, "PGOUTBOX", {**settings.PGOUTBOX, "LISTEN_DATABASES": {"secondary": "direct"}}
    )
    conf._cached.cache_clear()
    try:
        assert check_pooling_proxy(None) == []
    finally:
        monkeypatch.undo()
        conf._cached.cache_clear()
