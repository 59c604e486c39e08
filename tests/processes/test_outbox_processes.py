"""Real relay processes: several at once, killed mid-batch, and a listener that goes away.

transaction=True throughout: the relays are other processes and see only committed rows.
"""

from __future__ import annotations

import signal
import uuid
from collections import defaultdict
from typing import Any

import pytest

from django_pgoutbox import enqueue, gauges, metrics, publish
from django_pgoutbox.event_states import EVENT_STATES
from django_pgoutbox.health import health_report
from django_pgoutbox.models import Job, JobStatus, OutboxDelivery, OutboxEvent
from django_pgoutbox.worker import Worker
from testproject.testjobs.models import Projection
from tests.processes import holds_for, other_backends, scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def bulk_publish(aggregates: list[uuid.UUID], per_aggregate: int, **payload: Any) -> None:
    """Publish ``per_aggregate`` events for each aggregate, interleaved, in a few transactions."""
    from django.db import transaction

    with transaction.atomic():
        for sequence in range(per_aggregate):
            for aggregate in aggregates:
                publish(
                    "tests.projected",
                    aggregate_type="test",
                    aggregate_id=aggregate,
                    payload={"sequence": sequence, **payload},
                )


def unprocessed() -> int:
    return OutboxEvent.objects.filter(processed_at__isnull=True).count()


def test_three_relays_project_each_event_once_and_each_aggregate_in_order(
    start_worker: Any,
) -> None:
    aggregates = [uuid.uuid4() for _ in range(100)]
    bulk_publish(aggregates, 100)
    assert unprocessed() == 10_000
    # Batches of 10 heads, so that the three relays work on different aggregates at once.
    relays = [
        start_worker("--roles", "relay", "--worker-id", f"relay-{n}", OUTBOX={"BATCH_SIZE": 10})
        for n in range(3)
    ]
    wait_for(lambda: unprocessed() == 0, timeout=120, interval=0.5)
    for relay in relays:
        relay.signal(signal.SIGTERM)
        assert relay.wait(timeout=15) == 0

    assert Projection.objects.count() == 10_000  # event_id is unique: each projected once
    assert Job.objects.filter(job_type="tests.noop").count() == 10_000  # no duplicate jobs
    sequences: dict[uuid.UUID, list[int]] = defaultdict(list)
    for aggregate_id, sequence in Projection.objects.order_by("id").values_list(
        "aggregate_id", "sequence"
    ):
        sequences[aggregate_id].append(sequence)
    assert all(seq == list(range(100)) for seq in sequences.values())  # in order, per aggregate
    used = set(Projection.objects.values_list("relay", flat=True))
    assert len(used) >= 2, used  # the relays really shared the backlog


def test_sigkill_mid_batch_then_restart_projects_each_event_once(start_worker: Any) -> None:
    aggregates = [uuid.uuid4() for _ in range(20)]
    bulk_publish(aggregates, 5, sleep=0.02)  # 100 events; a batch of 100 heads takes 0.4 s
    victim = start_worker("--roles", "relay", OUTBOX={"CLAIM_SECONDS": 1})
    wait_for(lambda: OutboxEvent.objects.filter(claimed_by__isnull=False).exists())
    wait_for(victim.in_transaction)  # inside the batch's transaction, subscribers running
    victim.kill()
    killed_with = unprocessed()
    assert killed_with > 0

    start_worker("--roles", "relay", OUTBOX={"CLAIM_SECONDS": 1})
    wait_for(lambda: unprocessed() == 0, timeout=60)
    assert Projection.objects.count() == 100
    assert Job.objects.filter(job_type="tests.noop").count() == 100
    # Only the events the killed relay held were taken over (at most a batch of 20 heads), each
    # counted one attempt for it, and projected alone; no other event counts one.
    reclaimed = OutboxEvent.objects.filter(attempts__gt=0)
    assert set(reclaimed.values_list("attempts", "last_error_code")) <= {(1, "relay_crashed")}
    assert 0 < reclaimed.count() <= 20


def _terminate_listeners() -> int:
    return other_backends("query LIKE 'LISTEN%%'", count="pg_terminate_backend(pid)")


def test_lost_listener_reconnects_and_polls_everything(settings: Any) -> None:
    # A 30 s poll: only the listener (or its reconnect) can explain work done within seconds.
    settings.PGOUTBOX = {**settings.PGOUTBOX, "POLL_INTERVAL": 30}
    worker = Worker(roles=["jobs", "relay"], queues=["default"])
    import threading

    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        # run() takes its worker id first, then starts its listener
        listener = wait_for(lambda: worker.listener)
        assert listener.connected.wait(10)
        # The start-up claims are done: the loops now wait for 30 s.
        wait_for(lambda: other_backends("state <> 'idle'") == 0)
        failures = metrics.NOTIFICATION_FAILURES.value()
        assert _terminate_listeners() == 1
        # Sent while the listener is down: these notifications are lost.
        job = enqueue("tests.behave", {})
        event = publish(
            "tests.projected", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={}
        )
        wait_for(lambda: metrics.NOTIFICATION_FAILURES.value() > failures, timeout=10)
        # The reconnect wakes every loop, which finds the work in the tables.
        wait_for(
            lambda: Job.objects.filter(pk=job.pk, status=JobStatus.COMPLETED).exists(), timeout=10
        )
        wait_for(
            lambda: OutboxEvent.objects.filter(pk=event.pk, processed_at__isnull=False).exists(),
            timeout=10,
        )
    finally:
        worker.stop()
        thread.join(timeout=30)


def test_a_running_relay_abandons_nothing_beside_a_failing_event(
    start_worker: Any, settings: Any
) -> None:
    """A poison subscriber fails its delivery of an event again and again; the next event of
    the same aggregate, for another subscriber, is not held back by it; innocents of other
    aggregates go through. While the relay runs, nothing is abandoned. Killed, the next event it
    would have taken is abandoned once OVERDUE_SECONDS pass, and health says so."""
    overdue = scaled(3.0)
    settings.PGOUTBOX = {**settings.PGOUTBOX, "OUTBOX": {"OVERDUE_SECONDS": overdue}}
    poisoned = uuid.uuid4()
    poison = publish("poison.raise", aggregate_type="test", aggregate_id=poisoned, payload={})
    behind = publish("tests.projected", aggregate_type="test", aggregate_id=poisoned, payload={})
    bulk_publish([uuid.uuid4() for _ in range(5)], 2)
    relay = start_worker("--roles", "relay", OUTBOX={"OVERDUE_SECONDS": overdue, "BATCH_SIZE": 4})
    wait_for(lambda: Projection.objects.count() == 11)
    assert Projection.objects.filter(event_id=behind.pk).exists()
    failing = OutboxDelivery.objects.filter(event_id=poison.pk, last_error__isnull=False)
    wait_for(failing.exists)

    def nothing_abandoned() -> bool:
        """No event abandoned while the relay runs."""
        return gauges.abandoned_events().count == 0 and not chosen("abandoned")

    holds_for(nothing_abandoned, 1.5 * 3.0)
    relay.kill()
    late = publish("tests.projected", aggregate_type="test", aggregate_id=uuid.uuid4(), payload={})
    wait_for(lambda: late.pk in chosen("abandoned"), timeout=3 * 3.0)
    assert gauges.abandoned_events().count >= 1
    warnings = health_report(require=["relay"]).warnings
    assert [w for w in warnings if "no relay has claimed" in w], warnings


def chosen(state: str) -> set[uuid.UUID]:
    return set(OutboxEvent.objects.filter(EVENT_STATES[state]()).values_list("pk", flat=True))
