"""Unique jobs run by a real ``runworkers`` process: poison unique jobs beside innocent ones, in
the same batches, each ending on its own while the keys they hold behave (freed by the worker's
outcome, held while a job retries); a debounced burst run once, after its last enqueue.

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue
from django_pgoutbox.models import Job
from django_pgoutbox.uniqueness import Unique
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Longer than the test: every job here is claimed on its wake-up, not by a poll.
SLOW_POLL = {"POLL_INTERVAL": 60, "LEASE_SECONDS": 5}
#: Retries wait longer than the test: a retrying job stays retrying while it is looked at.
SLOW_RETRY = {"RETRY": {"BASE_DELAY": 600, "MAX_DELAY": 600, "JITTER": 0}}


def test_poison_unique_jobs_beside_innocent_ones(start_worker: Any) -> None:
    innocent = [
        enqueue("tests.step", {"name": f"ok-{n}"}, unique=Unique(keys=["name"])) for n in range(6)
    ]
    poison = {
        "exit": enqueue("tests.misbehave", {"how": "system_exit"}, unique=True),
        "unprintable": enqueue("tests.poison_raise", {"kind": "unprintable"}, unique=True),
        "bad_result": enqueue("tests.bad_result", {}, unique=True),
        "surrogate": enqueue("tests.misbehave", {"how": "surrogate_result"}, unique=True),
    }
    start_worker("--queues", "default", "--concurrency", "8", **SLOW_POLL, **SLOW_RETRY)

    def ran() -> bool:
        """every job had its attempt"""
        return not Job.objects.filter(status__in=["pending", "leased"]).exists()

    wait_for(ran, timeout=30)
    for job in innocent:
        job.refresh_from_db()
        assert (job.status, job.attempts) == ("completed", 1), job.payload
    ended = {name: Job.objects.get(pk=job.pk) for name, job in poison.items()}
    assert {name: job.status for name, job in ended.items()} == {
        "exit": "retrying",
        "unprintable": "retrying",
        "bad_result": "dead",
        "surrogate": "dead",
    }

    # The worker's outcomes moved the keys: freed by a completion and a death, held by a retry.
    again = enqueue("tests.step", {"name": "ok-0"}, unique=Unique(keys=["name"]))
    assert again.created
    assert enqueue("tests.misbehave", {"how": "system_exit"}, unique=True).pk == ended["exit"].pk
    assert enqueue("tests.bad_result", {}, unique=True).created

    # ... and the process keeps on: the new jobs run.
    def new_ones_ran() -> bool:
        """the jobs enqueued after the poison completed"""
        return Job.objects.filter(pk=again.pk, status="completed").exists()

    wait_for(new_ones_ran, timeout=20)


def test_a_debounced_burst_runs_once_after_its_last_enqueue(start_worker: Any) -> None:
    # A job due later is started by a poll (as any job with a run_at to come): a short one here.
    start_worker("--queues", "default", "--concurrency", "4", POLL_INTERVAL=0.3)
    burst = [
        enqueue(
            "tests.step",
            {"name": "doc-7", "n": n},
            unique=Unique(keys=["name"]),
            debounce=timedelta(seconds=1),
            on_conflict="replace",
        )
        for n in range(20)
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (last_enqueue,) = cursor.fetchone()
    assert len({job.pk for job in burst}) == 1
    beside = enqueue("tests.step", {"name": "beside"})  # an innocent plain job, run at once

    def ran() -> bool:
        """the burst's job completed"""
        return Job.objects.filter(pk=burst[0].pk, status="completed").exists()

    wait_for(ran, timeout=20)
    done = Job.objects.get(pk=burst[0].pk)
    assert done.payload == {"name": "doc-7", "n": 19}  # the newest payload
    starts = list(SideEffect.objects.filter(job_id=done.pk, event="start").values_list("at"))
    assert len(starts) == 1
    assert starts[0][0] >= last_enqueue + timedelta(seconds=1)
    assert Job.objects.get(pk=beside.pk).status == "completed"
    assert Job.objects.filter(job_type="tests.step").count() == 2
