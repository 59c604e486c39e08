"""The charts' minutes, written by real ``runworkers`` processes: each adds what its workers
wrote with its heartbeat, once (a SIGKILL loses at most the counts of its last ten seconds)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _totals() -> tuple[int, int, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(completed), 0), coalesce(sum(failed), 0), "
            "coalesce(sum(dead), 0) FROM queue_minutes WHERE queue = 'default'"
        )
        row = cursor.fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def test_two_workers_add_their_outcomes_to_the_minutes(start_worker: Any) -> None:
    enqueue_many([{"job_type": "tests.behave", "payload": {"record": False}}] * 300)
    enqueue_many(
        [{"job_type": "tests.behave", "payload": {"record": False, "fail": "permanent"}}] * 20
    )
    start_worker("--queues", "default")
    start_worker("--queues", "default")

    def all_counted() -> tuple[int, int, int] | None:
        """the minutes hold every outcome: 300 completed, 20 dead"""
        totals = _totals()
        return totals if totals == (300, 20, 20) else None

    wait_for(all_counted, timeout=40)  # a heartbeat every 10 s
