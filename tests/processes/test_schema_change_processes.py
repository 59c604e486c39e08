"""A migration that changes the type of a column the worker's prepared statements return, run
while a real ``runworkers`` process drains: its statements fail with "cached plan must not
change result type" at every run on the connections that prepared them, and the worker must
reconnect, prepare them again and go on, not stop."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from tests.processes import completed_jobs, holds_for, wait_for

pytestmark = pytest.mark.django_db(transaction=True)  # the worker sees the test's commits


def _enqueue(count: int) -> None:
    enqueue_many([{"job_type": "tests.behave", "payload": {"record": False}}] * count)


def test_a_column_type_changed_under_a_draining_worker(start_worker: Any) -> None:
    worker = start_worker("--concurrency", "2", POLL_INTERVAL=0.5)
    wait_for(worker.listening, timeout=30)
    for round_ in range(1, 16):  # each statement runs often enough to be prepared
        _enqueue(2)
        expected = 2 * round_
        wait_for(lambda: completed_jobs() == expected, timeout=30)  # noqa: B023 (called at once)
    try:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs ALTER COLUMN priority TYPE bigint")
        _enqueue(6)

        def alive_and_done() -> bool:
            """the worker lives on and runs the jobs enqueued after the migration"""
            return worker.process.poll() is None and completed_jobs() == 36

        wait_for(alive_and_done, timeout=30)
        holds_for(lambda: worker.process.poll() is None, 1.0)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs ALTER COLUMN priority TYPE integer")
    assert "no longer fits the schema" in worker.output()
