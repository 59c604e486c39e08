"""The states of an outbox event, as the admin's filter and ``pgoutbox events list`` select them.

An unprocessed event is *dead* (its projection gave up: an operator re-drives or discards it),
or waiting, and then one or more of: *failing* (a relay tried and failed; retried with
back-off), *held back* (an earlier unprocessed event of its aggregate comes first: the relay
projects an aggregate's events in order), *abandoned* (due, heading its aggregate, and touched
by no relay for ``OUTBOX["OVERDUE_SECONDS"]``: no relay runs, or none keeps up). The gauges count
the abandoned ones with ``queries.ABANDONED_EVENTS``, the same rule.

A processed event is *delivering* while a subscriber's delivery of it is undelivered (that
subscriber failed, or waits behind an earlier delivery of the aggregate: ``outbox_deliveries``),
and *processed* once none is.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from django_pgoutbox.conf import get_settings
from django_pgoutbox.models import OutboxDelivery, OutboxEvent


def earlier_waiting() -> Exists:
    """An earlier unprocessed event of the same aggregate, in the relay's order."""
    earlier = OutboxEvent.objects.filter(
        processed_at__isnull=True,
        aggregate_type=OuterRef("aggregate_type"),
        aggregate_id=OuterRef("aggregate_id"),
    ).filter(
        Q(occurred_at__lt=OuterRef("occurred_at"))
        | Q(occurred_at=OuterRef("occurred_at"), id__lt=OuterRef("id"))
    )
    return Exists(earlier)


def undelivered() -> Exists:
    """A subscriber's undelivered delivery of the event (dead or not)."""
    return Exists(OutboxDelivery.objects.filter(event=OuterRef("pk"), delivered_at__isnull=True))


def _waiting() -> Q:
    return Q(processed_at__isnull=True, dead_at__isnull=True)


def _abandoned() -> Q:
    since = timezone.now() - timedelta(seconds=get_settings().outbox.overdue_seconds)
    return (
        _waiting()
        & Q(available_at__lt=since)
        & (Q(claimed_at__isnull=True) | Q(claimed_at__lt=since))
        & ~Q(earlier_waiting())
    )


#: Each state's condition, made when asked (the abandoned one reads the clock).
EVENT_STATES: dict[str, Callable[[], Q]] = {
    "pending": _waiting,
    "failing": lambda: _waiting() & Q(last_error__isnull=False),
    "held_back": lambda: _waiting() & Q(earlier_waiting()),
    "abandoned": _abandoned,
    "dead": lambda: Q(processed_at__isnull=True, dead_at__isnull=False),
    "delivering": lambda: Q(processed_at__isnull=False) & Q(undelivered()),
    "processed": lambda: Q(processed_at__isnull=False) & ~Q(undelivered()),
}
