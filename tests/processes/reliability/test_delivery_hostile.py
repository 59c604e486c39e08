"""Per-subscriber delivery under a real ``runworkers --roles relay``: a subscriber that leaves
the relay's transaction aborted is its own failure, never the relay's.

``poison.swallow_database_error`` (``testproject/testjobs/subscribers.py``) enqueues a job, then
catches the error of a statement that failed: the transaction is aborted, and the relay's next
statement (writing the batch's jobs, marking the events) would fail, turn after turn, until the
relay stopped, and ``runworkers`` with it. The batch holds innocent events of other aggregates
(``tests.projected``) around it; the relay must still run at the end, each innocent projected
once, the poison event processed and its subscriber's delivery dead after its attempts.

transaction=True: the relay is another process and sees only committed rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.processes.reliability.test_poison_relay import (
    assert_dead,
    assert_innocents_projected_once,
    publish_batch,
    relay,
    wait_until_dead,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_subscriber_that_swallows_a_database_error_fails_its_delivery_only(
    start_worker: Any,
) -> None:
    innocents, [poison] = publish_batch(("poison.swallow_database_error", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    assert "caught the DatabaseError" in (
        assert_dead(poison, "aborted_transaction").last_error or ""
    )
    assert worker.process.poll() is None, worker.output()
