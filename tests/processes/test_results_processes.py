"""``Job.wait()`` against a real ``runworkers`` process: woken by the batch's notification.

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import JobFailed, enqueue_many
from django_pgoutbox.results import ResultListener
from tests.processes import scaled

pytestmark = pytest.mark.django_db(transaction=True)


def test_waiters_of_a_batch_each_get_their_own_outcome(start_worker: Any) -> None:
    """A job that completes, one that dies and an innocent one, in one batch of outcomes: each
    waiter gets its own job's outcome (the notification's latency is measured in
    tests/integration/test_results.py; here, the worker's own statements send it)."""
    ResultListener.close_all()
    worker = start_worker("--queues", "default", "--concurrency", "4")
    ok, dies, innocent = enqueue_many(
        [
            {"job_type": "tests.behave", "payload": {"sleep": 0.3, "result": "ok"}},
            {"job_type": "tests.behave", "payload": {"sleep": 0.3, "fail": "permanent"}},
            {"job_type": "tests.behave", "payload": {"sleep": 0.3, "result": "innocent"}},
        ]
    )
    outcomes: dict[str, Any] = {}

    def wait(name: str, job: Any) -> None:
        started = time.monotonic()
        try:
            outcomes[name] = job.wait(timeout=scaled(10))
        except JobFailed as error:
            outcomes[name] = error.code
        finally:
            outcomes[name + "_seconds"] = time.monotonic() - started
            connection.close()

    waiters = [
        threading.Thread(target=wait, args=("ok", ok)),
        threading.Thread(target=wait, args=("dies", dies)),
    ]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(timeout=scaled(15))
    assert (outcomes["ok"], outcomes["dies"]) == ("ok", "PermanentError")
    assert innocent.wait(timeout=scaled(10)) == "innocent"
    assert outcomes["ok_seconds"] < scaled(5)  # the worker's start-up, then 0.3 s
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=scaled(10))
    ResultListener.close_all()
