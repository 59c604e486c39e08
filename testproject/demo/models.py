"""The demo's business model: the source text's tracking sessions."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import ClassVar

from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from django_pgoutbox import Event, OutboxModelMixin, publish


class TrackingSession(OutboxModelMixin, models.Model):
    outbox_aggregate_type: ClassVar[str | None] = "tracking_session"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    organization_id = models.UUIDField()
    device = models.TextField()
    status = models.TextField(default="active")
    ended_at = models.DateTimeField(null=True, blank=True)
    version = models.IntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.device} ({self.status})"

    def outbox_events_for_save(self, *, created: bool) -> Iterable[Event]:
        # The save hook: starting a session is a fact, committed with the row.
        if created:
            yield Event("tracking_session.started", {"device": self.device})


def complete_session(session_id: uuid.UUID) -> bool:
    """The source text's transaction: a guarded status change and its fact, in one commit.

    ``QuerySet.update()`` bypasses ``save()`` (and so the save hook): publish explicitly.
    """
    ended_at = timezone.now()
    with transaction.atomic():
        changed = TrackingSession.objects.filter(
            id=session_id, status__in=["active", "paused"]
        ).update(status="completed", ended_at=ended_at, version=F("version") + 1)
        if not changed:
            return False
        session = TrackingSession.objects.get(id=session_id)
        publish(
            "tracking_session.completed",
            aggregate_type="tracking_session",
            aggregate_id=session.id,
            organization_id=session.organization_id,
            payload={"device": session.device, "ended_at": ended_at.isoformat()},
        )
    return True
