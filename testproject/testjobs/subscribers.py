"""Subscribers that tests (and relay subprocesses started by tests) run, steered by the payload."""

from __future__ import annotations

import time

from django_pgoutbox import enqueue, subscriber
from django_pgoutbox.models import OutboxEvent
from testproject.testjobs.models import Projection


@subscriber("tests.projected")
def project(event: OutboxEvent) -> None:
    """Record the projection and enqueue a job for it, in the relay's transaction.

    With ``fail``, it raises after both: what it wrote and what it enqueued (a deferred job of
    the relay's batch) must both be undone.
    """
    if event.payload.get("sleep"):
        time.sleep(event.payload["sleep"])
    Projection.objects.create(
        event_id=event.id,
        aggregate_id=event.aggregate_id,
        sequence=event.payload.get("sequence", 0),
        relay=event.claimed_by or "",
    )
    enqueue("tests.noop", {"event": str(event.id)})
    if event.payload.get("fail"):
        raise ValueError(f"cannot project {event.payload.get('sequence')}")


@subscriber("tests.stamped")
def stamp(event: OutboxEvent) -> None:
    """Enqueue a job that carries when the projection ran (wall clock), for lag measurements."""
    enqueue("tests.noop", {"event": str(event.id), "projected": time.time()})


@subscriber("tests.to_job")
def to_job(event: OutboxEvent) -> None:
    """Project the event into one job, and nothing else: the outbox benchmark's projection."""
    enqueue("tests.noop", {"event": str(event.id)})
