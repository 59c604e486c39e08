"""Sequences run by a real ``runworkers`` process, with heads that hang past their timeout or
raise what cannot even be inspected: each ends dead and holds its key, the worker goes on with
the other keys, and a skip lets the next job of the key run. transaction=True: the worker is
another process."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_pgoutbox import enqueue
from django_pgoutbox.control import skip_dead_jobs
from django_pgoutbox.models import Job
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_hostile_heads_hold_their_keys_until_skipped(start_worker: Any) -> None:
    hung = enqueue("tests.poison_hang", {"seconds": 4}, sequence="hang")
    after_hung = enqueue("tests.sequence_step", {"key": "hang", "n": 1}, sequence="hang")
    broken = enqueue("tests.hostile_raise", {"kind": "class_raises"}, sequence="broken")
    after_broken = enqueue("tests.sequence_step", {"key": "broken", "n": 1}, sequence="broken")
    free = [
        enqueue("tests.sequence_step", {"key": "free", "n": n}, sequence="free") for n in range(3)
    ]
    worker = start_worker("--queues", "default", "--concurrency", "4", POLL_INTERVAL=0.2)
    wait_for(
        lambda: Job.objects.filter(pk__in=[f.pk for f in free], status="completed").count() == 3
    )
    wait_for(lambda: Job.objects.get(pk=hung.pk).status == "dead", timeout=30)
    wait_for(lambda: Job.objects.get(pk=broken.pk).status == "dead", timeout=30)
    # while the hung handler still sleeps in its thread, and after: the next job waits
    late = enqueue("tests.sequence_step", {"key": "hang", "n": 2}, sequence="hang")
    time.sleep(5)
    assert Job.objects.get(pk=after_hung.pk).status == "waiting"
    assert Job.objects.get(pk=late.pk).status == "waiting"
    assert Job.objects.get(pk=after_broken.pk).status == "waiting"
    assert not SideEffect.objects.filter(job_id__in=[after_hung.pk, after_broken.pk]).exists()
    assert skip_dead_jobs([hung.pk, broken.pk], reason="skipped by the test") == 2
    wait_for(
        lambda: (
            Job.objects.filter(
                pk__in=[after_hung.pk, late.pk, after_broken.pk], status="completed"
            ).count()
            == 3
        ),
        timeout=30,
    )
    assert worker.process.poll() is None, worker.output()[-2000:]
