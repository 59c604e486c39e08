"""Hostile jobs against the queue's coordinator, run by a real ``runworkers`` process beside
innocent jobs (the style of ``test_poison_hostile.py``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_handlers_renewing_in_a_loop_leave_the_queue_its_claims(start_worker: Any) -> None:
    """Two handlers call ``ctx.renew_lease()`` again as soon as answered. Jobs enqueued
    meanwhile still run at once: the renewals do not hold the queue's connection."""
    storm = scaled(20)
    storms = enqueue_many([{"job_type": "tests.renew_storm", "payload": {"seconds": storm}}] * 3)
    worker = start_worker(
        "--queues", "default", "--concurrency", "4", LEASE_SECONDS=5, POLL_INTERVAL=30
    )
    wait_for(
        lambda: (
            SideEffect.objects.filter(job_id__in=[j.pk for j in storms], event="start").count() == 3
        )
    )
    time.sleep(0.5)  # the storm is on
    innocents = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 8)
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in innocents], status=JobStatus.COMPLETED).count()
            == len(innocents)
        ),
        timeout=storm / scaled(1) / 3,
    )
    assert Job.objects.filter(pk__in=[j.pk for j in storms], status=JobStatus.LEASED).count() == 3
    assert worker.process.poll() is None
