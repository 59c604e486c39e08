"""The demo's projection: a completed session becomes a notification and a report job."""

from __future__ import annotations

from django_pgoutbox import subscriber
from django_pgoutbox.models import OutboxEvent
from testproject.demo.jobs import build_report, send_notification


@subscriber("tracking_session.completed")
def on_session_completed(event: OutboxEvent) -> None:
    # Both jobs commit with the event's processed mark: exactly one of each per event.
    send_notification.enqueue(
        {"user": f"owner-of-{event.payload['device']}"},
        organization_id=event.organization_id,
        idempotency_key=f"session-completed:{event.aggregate_id}",
    )
    build_report.enqueue(
        {"session": str(event.aggregate_id)},
        organization_id=event.organization_id,
        idempotency_key=f"session-report:{event.aggregate_id}",
    )
