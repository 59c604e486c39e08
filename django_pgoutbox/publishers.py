"""Publishers: what sends an outbox event to another system, as a job.

A publisher has a ``name`` and a ``publish(event)`` that returns once the other side has the
event, or raises what the retry policy reads: ``TransientError`` (retried with back-off),
``RateLimited(retry_after)`` (retried after the other side's hint) or ``PermanentError`` (dead
at once). ``send_events(publisher, *event_types)`` registers it and a subscriber that enqueues,
in the relay's transaction, one ``pgoutbox.publish`` job per event (keyed by publisher and event,
so that an event projected twice is sent by one job); the job reads the event and calls
``publish``. So a publication retries, dead-letters and shows in the admin as any job does
(docs/howto/webhooks-out.md). ``WebhookPublisher`` (``django_pgoutbox.webhooks``) is one.

Each publisher sends an aggregate's events in order (``ordered=True``, the default): the relay
enqueues an aggregate's jobs in its events' order (a subscriber sees an aggregate's events in
order), and a job whose publisher has an earlier job of the same aggregate not done yet, or dead,
snoozes (``Snooze``: no attempt spent) until that one is done or cancelled.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from django.db import connections

from django_pgoutbox import queries
from django_pgoutbox.errors import PermanentError, Snooze
from django_pgoutbox.models import OutboxEvent
from django_pgoutbox.registry import job
from django_pgoutbox.webhooks import (
    InvalidSignature,
    WebhookPublisher,
    retry_after,
    sign,
    verify_webhook,
    webhook_secret,
)

__all__ = [
    "PUBLISH_JOB",
    "InvalidSignature",
    "Publisher",
    "WebhookPublisher",
    "get_publisher",
    "register",
    "retry_after",
    "send_events",
    "sign",
    "unregister",
    "verify_webhook",
    "webhook_secret",
]

#: The job that sends an event through a publisher.
PUBLISH_JOB = "pgoutbox.publish"


class Publisher(Protocol):
    """What sends an event to another system (see the module's docstring)."""

    name: str

    def publish(self, event: OutboxEvent) -> None: ...


_publishers: dict[str, Publisher] = {}


def register(publisher: Publisher) -> Publisher:
    """Make ``publisher`` known by its name to the ``pgoutbox.publish`` job of this process."""
    name = getattr(publisher, "name", None)
    if (
        type(name) is not str
        or not name.strip()
        or not name.isprintable()  # no NUL, control character or lone surrogate
        or len(name.encode()) > 255
    ):
        shown = repr(name)[:100]
        raise ValueError(f"a publisher's name must be printable text of 1 to 255 bytes: {shown}")
    if not callable(getattr(publisher, "publish", None)):
        raise ValueError(f"publisher {name!r} has no publish(event) method")
    known = _publishers.get(name)
    if known is not None and known is not publisher:
        raise ValueError(f"a publisher named {name!r} is registered already")
    _publishers[name] = publisher
    return publisher


def unregister(name: str) -> None:
    """Forget a publisher (for tests)."""
    _publishers.pop(name, None)


def get_publisher(name: str) -> Publisher:
    try:
        return _publishers[name]
    except KeyError:
        raise PermanentError(
            f"no publisher named {name!r} is registered in this process (send_events() at "
            "import time, in a module every worker imports)",
            code="unknown_publisher",
        ) from None


def send_events(
    publisher: Publisher,
    *event_types: str,
    versions: tuple[int, ...] = (1,),
    queue: str | None = None,
    priority: int | None = None,
    ordered: bool = True,
) -> Publisher:
    """Register ``publisher`` and send it every event of ``event_types`` (of the schema
    ``versions`` it takes), each by a ``pgoutbox.publish`` job on ``queue`` (default: the
    job's, ``"default"``).

    The subscriber enqueues in the relay's transaction, so the job exists once the event is
    processed, exactly once. With ``ordered`` (the default), an aggregate's events are sent one
    at a time, in order: a job waits (snoozes) while an earlier job of its publisher and
    aggregate is pending, retrying, running or dead, so a dead one holds back the later ones of
    its aggregate until it is retried or cancelled. Without, events are sent in parallel, and
    those of one aggregate may arrive out of order.
    """
    from django_pgoutbox.enqueueing import enqueue
    from django_pgoutbox.outbox import subscribed_event_types, subscriber, subscribers_for

    register(publisher)
    name = publisher.name
    # One subscriber per publisher: another call would replace it, and the event types of the
    # first would silently no longer be sent. The same call again (a module imported twice) is
    # harmless.
    for earlier in {
        s
        for t in subscribed_event_types()
        for s in subscribers_for(t)
        if s.name == f"pgoutbox.publish:{name}"
    }:
        if set(earlier.event_types) != set(event_types) or earlier.versions != set(versions):
            raise ValueError(
                f"send_events() was called for publisher {name!r} already (event types "
                f"{sorted(earlier.event_types)}): give all its event types in one call"
            )

    def send(event: OutboxEvent) -> None:
        payload = {"publisher": name, "event": str(event.id)}
        if ordered:
            payload["aggregate"] = f"{event.aggregate_type}/{event.aggregate_id}"
        enqueue(
            PUBLISH_JOB,
            payload,
            queue=queue,
            priority=priority,
            idempotency_key=f"{name}:{event.id}",
        )

    send.__name__ = send.__qualname__ = f"send_to_{name}"
    subscriber(*event_types, versions=versions, name=f"pgoutbox.publish:{name}")(send)
    return publisher


@job(PUBLISH_JOB, max_attempts=10)
def publish_event(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Send one event through one publisher (enqueued by ``send_events``)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("publisher"), str):
        # Changed by hand: nothing keeps a payload a JSON object, nor its values strings.
        raise PermanentError(
            "the payload is not {'publisher': <name>, 'event': <event id>}: "
            f"{str(payload)[:200]}",
            code="invalid_payload",
        )
    publisher = get_publisher(payload["publisher"])
    aggregate = payload.get("aggregate")
    if isinstance(aggregate, str):
        _wait_for_earlier(publisher.name, aggregate, ctx.job_id, ctx.using)
    try:
        event_id = uuid.UUID(str(payload.get("event")))
    except ValueError:
        raise PermanentError(f"not an event id: {repr(payload.get('event'))[:200]}") from None
    event = OutboxEvent.objects.filter(pk=event_id).first()
    if event is None:
        raise PermanentError(
            f"event {event_id} is gone (pruned by RETENTION['PROCESSED_EVENTS'] before it was "
            "sent?)",
            code="event_gone",
        )
    publisher.publish(event)
    return {"publisher": publisher.name, "event": str(event_id)}


#: How long an ordered publisher's job snoozes behind an earlier one: half a second, growing
#: with its own age (a quarter of it), at most a minute: a job behind one that is merely
#: running goes soon after it, one behind a dead job does not wake a worker every half second.
SNOOZE_FIRST, SNOOZE_MOST = 0.5, 60.0


def _wait_for_earlier(publisher: str, aggregate: str, job_id: Any, using: str) -> None:
    """Snooze if an earlier job of ``publisher`` and ``aggregate`` is not done yet."""
    with connections[using].cursor() as cursor:
        cursor.execute(queries.PUBLISH_AHEAD, [publisher, aggregate, job_id])
        row = cursor.fetchone()
    if row is not None and row[0]:
        raise Snooze(min(SNOOZE_MOST, SNOOZE_FIRST + max(0.0, float(row[1])) / 4))
