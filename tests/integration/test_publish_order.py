"""An ordered publisher sends an aggregate's events one at a time, in order: its job for an
event snoozes (no attempt spent) while an earlier job of the same publisher and aggregate is
pending, retrying, running or dead, and goes once that one is completed or cancelled. Other
aggregates, and other publishers, are not held back."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import publish
from django_pgoutbox.conf import get_settings
from django_pgoutbox.errors import Snooze
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from django_pgoutbox.publishers import (
    PUBLISH_JOB,
    SNOOZE_FIRST,
    publish_event,
    send_events,
    unregister,
)
from django_pgoutbox.worker.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)


class Recording:
    """A publisher that records what it sends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[uuid.UUID] = []

    def publish(self, event: OutboxEvent) -> None:
        self.sent.append(event.id)


@pytest.fixture
def publishers(registry: None) -> Any:
    ordered, unordered = Recording("tests.ordered"), Recording("tests.unordered")
    send_events(ordered, "tests.order")
    send_events(unordered, "tests.order", ordered=False)
    yield SimpleNamespace(ordered=ordered, unordered=unordered)
    unregister("tests.ordered")
    unregister("tests.unordered")


def fact(aggregate: uuid.UUID) -> OutboxEvent:
    return publish("tests.order", aggregate_type="order", aggregate_id=aggregate, payload={})


def project() -> None:
    conf = get_settings()
    Relay(conf.outbox, relay_id="r", using="default", policy=conf.retry, burst=True).run()


def job_of(publisher: str, event: OutboxEvent) -> Job:
    return Job.objects.get(job_type=PUBLISH_JOB, idempotency_key=f"{publisher}:{event.id}")


def run(job: Job) -> Any:
    context = SimpleNamespace(job_id=job.id, using="default")  # what the job reads of it
    return publish_event(job.payload, context)  # type: ignore[arg-type]


def test_a_job_waits_for_the_earlier_ones_of_its_aggregate(publishers: Any) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    first, second, third = fact(a), fact(a), fact(a)
    elsewhere = fact(b)
    project()
    jobs = [job_of("tests.ordered", e) for e in (first, second, third)]
    assert jobs[0].payload == {
        "publisher": "tests.ordered",
        "event": str(first.id),
        "aggregate": f"order/{a}",
    }
    # The third and second wait for the first, pending.
    for later in (jobs[2], jobs[1]):
        with pytest.raises(Snooze) as snoozed:
            run(later)
        assert SNOOZE_FIRST <= snoozed.value.seconds < SNOOZE_FIRST + 5
    run(job_of("tests.ordered", elsewhere))  # another aggregate: at once
    # The unordered publisher's jobs go at once, in any order.
    for e in (third, second, first):
        run(job_of("tests.unordered", e))
    assert publishers.unordered.sent == [third.id, second.id, first.id]
    run(jobs[0])
    Job.objects.filter(pk=jobs[0].pk).update(status=JobStatus.COMPLETED)
    with pytest.raises(Snooze):
        run(jobs[2])  # the second is not done yet
    run(jobs[1])
    Job.objects.filter(pk=jobs[1].pk).update(status=JobStatus.COMPLETED)
    run(jobs[2])
    assert publishers.ordered.sent == [elsewhere.id, first.id, second.id, third.id]


@pytest.mark.parametrize(
    ("status", "holds"),
    [
        (JobStatus.LEASED, True),
        (JobStatus.RETRYING, True),
        (JobStatus.DEAD, True),
        (JobStatus.CANCELLED, False),
        (JobStatus.COMPLETED, False),
    ],
)
def test_what_an_earlier_job_holds_back(publishers: Any, status: str, holds: bool) -> None:
    a = uuid.uuid4()
    first, second = fact(a), fact(a)
    project()
    Job.objects.filter(pk=job_of("tests.ordered", first).pk).update(status=status)
    if holds:
        with pytest.raises(Snooze):
            run(job_of("tests.ordered", second))
    else:
        run(job_of("tests.ordered", second))
        assert publishers.ordered.sent == [second.id]


def test_a_job_written_before_ordering_goes_at_once(publishers: Any) -> None:
    """A payload without ``aggregate`` (enqueued by an earlier version) is not held back."""
    a = uuid.uuid4()
    first, second = fact(a), fact(a)
    project()
    older = job_of("tests.ordered", second)
    payload = {k: v for k, v in older.payload.items() if k != "aggregate"}
    run(Job(id=older.id, payload=payload))
    assert publishers.ordered.sent == [second.id]
    assert first.id not in publishers.ordered.sent


def test_the_wait_is_one_probe_of_its_index(publishers: Any) -> None:
    from django_pgoutbox import queries

    a = uuid.uuid4()
    fact(a)
    project()
    job = job_of("tests.ordered", OutboxEvent.objects.get())
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("EXPLAIN " + queries.PUBLISH_AHEAD, ["tests.ordered", f"order/{a}", job.id])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "jobs_publish_order_idx" in plan, plan
