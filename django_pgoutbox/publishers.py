"""Publishers: what sends an outbox event to another system, as a job.

A publisher has a ``name`` and a ``publish(event)`` that returns once the other side has the
event, or raises what the retry policy reads: ``TransientError`` (retried with back-off),
``RateLimited(retry_after)`` (retried after the other side's hint) or ``PermanentError`` (dead
at once). ``send_events(publisher, *event_types)`` registers it and a subscriber that enqueues,
in the relay's transaction, one ``pgoutbox.publish`` job per event (keyed by publisher and event,
so that an event projected twice is sent by one job); the job reads the event and calls
``publish``. So a publication retries, dead-letters and shows in the admin as any job does
(docs/howto/webhooks-out.md). ``WebhookPublisher`` (``django_pgoutbox.webhooks``) is one.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from django_pgoutbox.errors import PermanentError
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
) -> Publisher:
    """Register ``publisher`` and send it every event of ``event_types`` (of the schema
    ``versions`` it takes), each by a ``pgoutbox.publish`` job on ``queue`` (default: the
    job's, ``"default"``).

    The subscriber enqueues in the relay's transaction, so the job exists once the event is
    processed, exactly once. Events are sent in parallel, so those of one aggregate may arrive
    out of order, and a retried one after later ones: receivers order by the event's ``time``
    (``occurred_at``) or dedupe by its ``id``.
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
        enqueue(
            PUBLISH_JOB,
            {"publisher": name, "event": str(event.id)},
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
