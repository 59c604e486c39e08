"""Tenant fairness and cluster-wide limits, with real worker processes.

The figures these tests measure are printed (``pytest -s``) and quoted in docs/limits.md.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _jobs(count: int, organization: uuid.UUID | None, **payload: Any) -> list[dict[str, Any]]:
    return [
        {"job_type": "tests.behave", "payload": payload, "organization_id": organization}
    ] * count


def _starts_by_organization() -> list[tuple[int, uuid.UUID | None]]:
    """(side effect id, organization) of every start, in the order the starts were recorded."""
    organizations = dict(Job.objects.values_list("id", "organization_id"))
    return [
        (pk, organizations[job_id])
        for pk, job_id in SideEffect.objects.filter(event="start")
        .order_by("id")
        .values_list("id", "job_id")
    ]


class _Sampler:
    """Samples, from the table, how many jobs of each organization are leased, every 5 ms."""

    def __init__(self) -> None:
        self.highest: Counter[Any] = Counter()
        self.highest_total = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psycopg

        from django_pgoutbox.db import raw_connection_params

        with psycopg.connect(**raw_connection_params("default"), autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT organization_id, count(*) FROM jobs WHERE status = 'leased' GROUP BY 1"
                ).fetchall()
                for organization, count in rows:
                    self.highest[organization] = max(self.highest[organization], count)
                self.highest_total = max(self.highest_total, sum(c for _, c in rows))
                self.samples += 1
                time.sleep(0.005)


def test_fair_queue_bounds_the_delay_a_flood_causes(start_worker: Any) -> None:
    flood, other = uuid.uuid4(), uuid.uuid4()
    enqueue_many(_jobs(10_000, flood, sleep=0.01))
    start_worker(
        "--queues",
        "default",
        "--concurrency",
        "4",
        QUEUES={"default": {"FAIR": True}},
        POLL_INTERVAL=0.5,
    )
    wait_for(lambda: SideEffect.objects.filter(event="start").count() >= 200)
    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM testjobs_sideeffect")
        mark = cursor.fetchone()[0]
    enqueued_at = time.monotonic()
    late = enqueue_many(_jobs(20, other, sleep=0.01))
    late_ids = {job.pk for job in late}

    def all_started() -> bool:
        return SideEffect.objects.filter(job_id__in=late_ids, event="start").count() >= 20

    wait_for(all_started, timeout=30)
    waited = time.monotonic() - enqueued_at
    left = Job.objects.filter(organization_id=flood, status=JobStatus.PENDING).count()
    after = [(pk, org) for pk, org in _starts_by_organization() if pk > mark]
    first_other = next(i for i, (_, org) in enumerate(after) if org == other)
    last_other = max(i for i, (_, org) in enumerate(after) if org == other)
    flood_before_first = sum(1 for _, org in after[:first_other] if org == flood)
    flood_before_last = sum(1 for _, org in after[:last_other] if org == flood)
    print(
        f"\nfairness: {flood_before_first} flood jobs started between the other organization's "
        f"enqueue and its first start; {flood_before_last} before its 20th; all 20 started "
        f"within {waited:.2f}s, with {left} flood jobs still waiting"
    )
    # Without FAIR, the other organization's jobs would wait behind every one of the thousands
    # of flood jobs left. With it, a free slot goes to the organization with fewer jobs running:
    # its first job waits for at most the claims already under way (one per handler thread),
    # and its twenty jobs share the threads with the flood from then on.
    assert flood_before_first <= 4
    assert flood_before_last <= 20 + 8
    assert left > 5_000


def test_max_running_holds_across_four_workers(start_worker: Any) -> None:
    enqueue_many(_jobs(60, None, sleep=0.15, record=False))
    settings = {"QUEUES": {"default": {"MAX_RUNNING": 3}}, "POLL_INTERVAL": 0.2}
    with _Sampler() as sampler:
        for _ in range(4):
            start_worker("--queues", "default", "--concurrency", "4", **settings)
        wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 60, timeout=60)
    print(
        f"\nMAX_RUNNING 3, four workers of 4 threads: at most {sampler.highest_total} running "
        f"in {sampler.samples} samples"
    )
    assert sampler.samples > 100
    assert sampler.highest_total == 3  # reached, never passed


def test_max_running_per_organization(start_worker: Any) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    enqueue_many(_jobs(20, first, sleep=0.15, record=False) + _jobs(20, second, sleep=0.15))
    settings = {
        "QUEUES": {"default": {"MAX_RUNNING": 2, "LIMIT_BY": "organization"}},
        "POLL_INTERVAL": 0.2,
    }
    with _Sampler() as sampler:
        for _ in range(3):
            start_worker("--queues", "default", "--concurrency", "4", **settings)
        wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 40, timeout=60)
    print(f"\nMAX_RUNNING 2 per organization: highest per organization {dict(sampler.highest)}")
    assert sampler.highest[first] == 2
    assert sampler.highest[second] == 2


def _claim_rate(jobs: Sequence[Job], skip: int) -> float:
    """Claims per second after the first ``skip`` (the bucket's initial burst)."""
    claimed = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("locked_at", flat=True)
    times = sorted(t for t in claimed if t is not None)[skip:]
    return (len(times) - 1) / (times[-1] - times[0]).total_seconds()


def test_rate_limit_across_two_workers(start_worker: Any) -> None:
    jobs = enqueue_many(_jobs(120, None, record=False))
    settings = {"QUEUES": {"default": {"RATE_LIMIT": 20}}, "POLL_INTERVAL": 0.5}
    started = time.monotonic()
    for _ in range(2):
        start_worker("--queues", "default", "--concurrency", "4", **settings)
    wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 120, timeout=60)
    elapsed = time.monotonic() - started
    rate = _claim_rate(jobs, skip=20)
    print(f"\nRATE_LIMIT 20/s, two workers: {rate:.2f} jobs/s observed ({elapsed:.1f}s for 120)")
    assert 18 <= rate <= 22


def test_rate_limit_per_organization(start_worker: Any) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    jobs_first = enqueue_many(_jobs(50, first, record=False))
    jobs_second = enqueue_many(_jobs(50, second, record=False))
    settings = {
        "QUEUES": {"default": {"RATE_LIMIT": 10, "LIMIT_BY": "organization"}},
        "POLL_INTERVAL": 0.5,
    }
    for _ in range(2):
        start_worker("--queues", "default", "--concurrency", "4", **settings)
    wait_for(lambda: Job.objects.filter(status=JobStatus.COMPLETED).count() == 100, timeout=60)
    rates = (_claim_rate(jobs_first, skip=10), _claim_rate(jobs_second, skip=10))
    print(f"\nRATE_LIMIT 10/s per organization: {rates[0]:.2f} and {rates[1]:.2f} jobs/s")
    assert all(9 <= rate <= 11 for rate in rates)
