"""The states of a subscriber's delivery of an event (``OutboxDelivery.state``), as the admin's
filter and ``pgoutbox deliveries list`` select them.

A delivery is *delivered* (its subscriber ran, or an operator discarded it), *dead* (its
subscriber failed ``OUTBOX["MAX_ATTEMPTS"]`` times, or refused the event's schema version: an
operator re-drives or discards it; it holds back that subscriber's later deliveries of the
aggregate), *failing* (it failed and is retried with back-off) or *waiting* (not failed: behind an
earlier delivery of the aggregate to the same subscriber, or written by a replay).
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Case, Q, TextField, Value, When


def _undelivered() -> Q:
    return Q(delivered_at__isnull=True)


#: Each state's condition, in the order of ``OutboxDelivery.state``'s checks.
DELIVERY_STATES: dict[str, Callable[[], Q]] = {
    "waiting": lambda: _undelivered() & Q(dead_at__isnull=True, last_error__isnull=True),
    "failing": lambda: _undelivered() & Q(dead_at__isnull=True, last_error__isnull=False),
    "dead": lambda: _undelivered() & Q(dead_at__isnull=False),
    "delivered": lambda: Q(delivered_at__isnull=False),
}


def state_column() -> Case:
    """The state as a column, by the same conditions: read with the row, where
    ``OutboxDelivery.state`` would read ``last_error``, which the admin's lists defer."""
    return Case(
        *(When(condition(), then=Value(name)) for name, condition in DELIVERY_STATES.items()),
        output_field=TextField(),
    )
