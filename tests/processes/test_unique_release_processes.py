"""A real ``runworkers`` releasing unique jobs at the end of its grace period, in one batch with
a plain job: the job held while pending only (debounce) goes back without its key, which a newer
job of its key took while it ran; the one held while leased keeps its key; nothing fails.

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

import signal
from datetime import timedelta
from typing import Any

import pytest

from django_pgoutbox import enqueue
from django_pgoutbox.models import Job
from django_pgoutbox.uniqueness import Unique
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.2}


def test_a_release_at_shutdown_beside_a_newer_holder(start_worker: Any) -> None:
    by_doc = Unique(keys=["doc"])
    debounced = enqueue("tests.behave", {"doc": 1, "sleep": 30}, unique=by_doc, debounce=0)
    held = enqueue("tests.behave", {"doc": 2, "sleep": 30}, unique=by_doc)
    plain = enqueue("tests.behave", {"doc": 3, "sleep": 30})
    worker = start_worker(
        "--queues", "default", "--concurrency", "4", "--grace-period", "0.5", **QUICK
    )
    wait_for(lambda: SideEffect.objects.filter(event="start").count() == 3, timeout=15)
    # While they run: a newer debounced request of doc 1 takes the key the running job left.
    newer = enqueue(
        "tests.behave", {"doc": 1, "sleep": 30}, unique=by_doc, debounce=timedelta(minutes=5)
    )
    assert newer.created
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    rows = {job.pk: Job.objects.get(pk=job.pk) for job in (debounced, held, plain, newer)}
    assert {pk: row.status for pk, row in rows.items()} == dict.fromkeys(rows, "pending")
    assert {pk: row.last_error_code for pk, row in rows.items() if pk != newer.pk} == dict.fromkeys(
        (debounced.pk, held.pk, plain.pk), "worker_shutdown"
    )
    assert rows[debounced.pk].unique_key is None  # released without its key
    assert rows[newer.pk].unique_key == debounced.unique_key  # the newer job keeps holding it
    assert rows[held.pk].unique_key == held.unique_key
    # the keys behave afterwards: doc 1's request meets the newer job, doc 2's the released one
    assert enqueue("tests.behave", {"doc": 1}, unique=by_doc, debounce=0).pk == newer.pk
    assert enqueue("tests.behave", {"doc": 2}, unique=by_doc).pk == held.pk
