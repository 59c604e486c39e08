"""A second hostile pass at the queue's coordinator in a real ``runworkers`` process: innocent
jobs in the same batches as hostile ones, while the worker's connections are cut under it."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from django.db import connections

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def cut(worker: Any) -> int:
    """End the worker's backends but its listener's (``pg_terminate_backend``)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND query NOT ILIKE 'LISTEN%%'",
            [worker.application_name],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_innocents_beside_hostiles_survive_connections_cut_mid_drain(
    start_worker: Any, fair: bool
) -> None:
    """Batches mix innocents with jobs that return at their timeout's edge and jobs that renew
    their lease in a loop, on two connections, while the worker's backends are terminated again
    and again: every innocent completes once (an innocent whose own session is cut is retried:
    a lost connection is transient, however often), every edge job ends with one outcome, and
    the worker then stops cleanly within its grace period."""
    specs: list[dict[str, Any]] = []
    for index in range(60):
        specs.append({"job_type": "tests.behave", "payload": {"sleep": 0.02}})
        if index % 6 == 0:
            specs.append({"job_type": "tests.just_in_time", "payload": {"margin": 0.002}})
        if index % 20 == 0:
            specs.append({"job_type": "tests.renew_storm", "payload": {"seconds": scaled(2)}})
    jobs = enqueue_many(specs)
    innocents = [j.pk for j, s in zip(jobs, specs, strict=True) if s["job_type"] == "tests.behave"]
    edges = [
        j.pk for j, s in zip(jobs, specs, strict=True) if s["job_type"] == "tests.just_in_time"
    ]
    worker = start_worker(
        "--queues",
        "default",
        "--concurrency",
        "4",
        LEASE_SECONDS=4,
        POLL_INTERVAL=1,
        QUEUES={"default": {"CONNECTIONS": 2, "FAIR": fair}},
    )
    wait_for(lambda: SideEffect.objects.filter(event="end").exists())
    cuts = 0
    deadline = time.monotonic() + scaled(40)
    while time.monotonic() < deadline:
        cuts += cut(worker)
        time.sleep(0.15)
        if (
            not Job.objects.exclude(status__in=[JobStatus.COMPLETED, JobStatus.DEAD])
            .filter(pk__in=innocents + edges)
            .exists()
        ):
            break
    assert cuts, "no backend was cut"
    try:
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=innocents, status=JobStatus.COMPLETED).count()
                == len(innocents)
            ),
            timeout=60,
        )
    except AssertionError as error:
        left = Job.objects.filter(pk__in=innocents).exclude(status=JobStatus.COMPLETED)
        rows = list(left.values_list("status", "attempts", "run_at", "last_error_code"))
        raise AssertionError(f"{error}; innocents not completed: {rows}") from None
    ends = SideEffect.objects.filter(job_id__in=innocents, event="end")
    assert ends.count() == len(innocents), "an innocent ran twice"
    wait_for(
        lambda: (
            Job.objects.filter(
                pk__in=edges, status__in=[JobStatus.COMPLETED, JobStatus.DEAD]
            ).count()
            == len(edges)
        ),
        timeout=30,
    )
    assert worker.process.poll() is None, worker.output()[-3000:]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=40) == 0, worker.output()[-3000:]
