"""Acting on jobs and events already written: cancelling jobs, the dead letters (retry, give up,
re-drive, discard) that the admin and ``manage.py pgoutbox`` operate on, and a subscriber's
deliveries (re-drive, discard, replay)."""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connections, router
from django.db.models import Exists, OuterRef, QuerySet

from django_pgoutbox import outbox, queries
from django_pgoutbox.conf import CANCEL_CHANNEL, get_settings
from django_pgoutbox.db import tables_required
from django_pgoutbox.errors import EnqueueError, InvalidInput
from django_pgoutbox.job_rows import job_database
from django_pgoutbox.models import Job, OutboxDelivery, OutboxEvent
from django_pgoutbox.validation import checked_moment, optional_uuid, short_repr, utc_offset

# -- cancellation --------------------------------------------------------------------------------


def cancel(job_id: uuid.UUID | str, *, using: str | None = None) -> str:
    """Cancel one job and return what became of it.

    A job not running yet (``pending``, ``retrying``) is ``"cancelled"`` at once and never runs.
    A running one returns ``"cancelling"``: its handler sees ``ctx.cancelled`` (and
    ``ctx.renew_lease()`` raises ``Cancelled``) from the worker's next lease renewal, which a
    notification makes immediate; whatever the attempt's outcome, the job then ends
    ``cancelled`` (a result it returned is kept) and is never retried. A finished job keeps its
    state (``"completed"``, ``"dead"``, ``"cancelled"``). Raises ``Job.DoesNotExist`` for an
    unknown id.

    Joins the caller's transaction, like ``enqueue()``.
    """
    parsed = optional_uuid(job_id, "job_id", EnqueueError)
    if parsed is None:
        raise EnqueueError("job_id", "is required")
    result = cancel_jobs([parsed], using=using)
    if parsed not in result:
        raise Job.DoesNotExist(f"no job {parsed} in database {job_database(using)!r}")
    return result[parsed]


def cancel_jobs(
    job_ids: Iterable[uuid.UUID], *, using: str | None = None, by: str = "cancel()"
) -> dict[uuid.UUID, str]:
    """Cancel many jobs in one statement; returns job id -> state, as :func:`cancel` does."""
    alias = job_database(using)
    ids = list(job_ids)
    if not ids:
        return {}
    with tables_required(alias, EnqueueError), connections[alias].cursor() as cursor:
        cursor.execute(
            queries.CANCEL_JOBS,
            [ids, f"cancelled by {by} before it ran", CANCEL_CHANNEL, get_settings().notify],
        )
        return {job_id: state for job_id, state, _ in cursor.fetchall()}


# -- dead letters (the admin and ``pgoutbox deadletters``) ------------------------------------


def _update(sql: str, ids: list[Any], using: str | None) -> int:
    alias = using or router.db_for_write(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [list(ids)])
        count: int = cursor.rowcount
    return count


def retry_dead_jobs(ids: list[Any], *, using: str | None = None) -> int:
    """Put dead jobs back in their queue, due now, with a fresh attempt budget."""
    return _update(queries.RETRY_DEAD_JOBS, ids, using)


def cancel_dead_jobs(ids: list[Any], *, using: str | None = None) -> int:
    """Give up on dead jobs for good: they become ``cancelled`` (and are pruned later)."""
    return _update(queries.CANCEL_DEAD_JOBS, ids, using)


def redrive_dead_events(ids: list[Any], *, using: str | None = None) -> int:
    """Make dead outbox events claimable again, with a fresh attempt budget."""
    return _update(queries.REDRIVE_DEAD_EVENTS, ids, using)


def discard_dead_events(ids: list[Any], *, using: str | None = None) -> int:
    """Mark dead events processed without projecting them: their aggregate's later events go on."""
    return _update(queries.DISCARD_DEAD_EVENTS, ids, using)


# -- deliveries (the admin and ``pgoutbox deliveries``, ``pgoutbox outbox replay``) -------------


def redrive_dead_deliveries(ids: list[Any], *, using: str | None = None) -> int:
    """Make dead deliveries due again, with a fresh attempt budget: their subscriber runs on the
    event again, then on its later deliveries of the aggregate. Deliveries that are not dead
    (any more) are left as they are; returns how many were re-driven."""
    return _update(queries.REDRIVE_DEAD_DELIVERIES, ids, using)


def discard_dead_deliveries(ids: list[Any], *, using: str | None = None) -> int:
    """Give up on dead deliveries: marked delivered without running, so that their subscriber's
    later deliveries of the aggregate go on. Deliveries that are not dead (any more) are left as
    they are; returns how many were discarded."""
    return _update(queries.DISCARD_DEAD_DELIVERIES, ids, using)


#: Subscribers named in the error of an unknown one: the first few, sorted.
NAMED_SUBSCRIBERS = 10


def registered_subscribers() -> dict[str, tuple[str, ...]]:
    """Each subscriber this process registers (``@subscriber``), by name, with its event types."""
    found: dict[str, set[str]] = {}
    for event_type in outbox.subscribed_event_types():
        for registered in outbox.subscribers_for(event_type):
            found.setdefault(registered.name, set()).add(event_type)
    return {name: tuple(sorted(types)) for name, types in found.items()}


def subscriber_event_types(name: Any) -> tuple[str, ...]:
    """The event types that the subscriber ``name`` takes; ``InvalidInput`` (a ``ValueError``)
    naming ``subscriber`` unless this process registers it."""
    registered = registered_subscribers()
    if isinstance(name, str) and name in registered:
        return registered[name]
    names = sorted(registered)
    if not names:
        known = "this process registers no subscriber (are their modules imported?)"
    else:
        shown = ", ".join(short_repr(n, 60) for n in names[:NAMED_SUBSCRIBERS])
        more = len(names) - NAMED_SUBSCRIBERS
        known = f"registered: {shown}" + (f" (and {more:,} more)" if more > 0 else "")
        if isinstance(name, str):
            close = difflib.get_close_matches(name[:300], names, n=3, cutoff=0.8)
            if close:
                known = f"did you mean {' or '.join(short_repr(n, 60) for n in close)}? {known}"
    raise InvalidInput("subscriber", f"no subscriber {short_repr(name)} is registered; {known}")


def _aware(value: Any, where: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidInput(where, f"must be an aware datetime, not {short_repr(value)}")
    if utc_offset(value, where, InvalidInput) is None:
        raise InvalidInput(
            where, f"{value.isoformat()} has no time zone: give an aware datetime (tzinfo=UTC)"
        )
    return checked_moment(value, where, InvalidInput)


def _replay_window(
    subscriber: Any, since: Any, until: Any
) -> tuple[tuple[str, ...], datetime, datetime | None]:
    event_types = subscriber_event_types(subscriber)
    start = _aware(since, "since")
    end = None if until is None else _aware(until, "until")
    if end is not None and end <= start:
        raise InvalidInput("until", f"{end.isoformat()} must be after since, {start.isoformat()}")
    return event_types, start, end


def events_to_replay(
    subscriber: str,
    *,
    since: datetime,
    until: datetime | None = None,
    using: str | None = None,
) -> QuerySet[OutboxEvent]:
    """The events that :func:`replay_events` would give ``subscriber`` now, as a queryset (to
    count before acting); raises as it does."""
    event_types, start, end = _replay_window(subscriber, since, until)
    events = OutboxEvent.objects.using(using or router.db_for_write(Job)).filter(
        event_type__in=event_types,
        occurred_at__gte=start,
        processed_at__isnull=False,
        dead_at__isnull=True,
    )
    if end is not None:
        events = events.filter(occurred_at__lt=end)
    delivered = OutboxDelivery.objects.filter(event=OuterRef("pk"), subscriber=subscriber)
    return events.filter(~Exists(delivered))


def replay_events(
    subscriber: str,
    *,
    since: datetime,
    until: datetime | None = None,
    using: str | None = None,
    batch: int = 10_000,
) -> int:
    """Give the subscriber ``subscriber`` the processed events of its types that occurred at or
    after ``since`` (and before ``until``, if given): one waiting delivery each, in the events'
    order, which the relay then delivers as it does a failed subscriber's. Returns how many it
    wrote.

    For a subscriber added after the events were processed: the relay ran the subscribers of
    the time, and keeps no record of who ran on the fast path, so a subscriber that existed then
    would run again on them. An event that has a delivery of that subscriber already is left as
    it is, so a second replay writes nothing twice; so is a discarded event (never projected).
    ``batch`` events a statement, each committed on its own unless the caller's transaction
    holds them.

    Raises ``InvalidInput`` (a ``ValueError``) naming the argument: a subscriber this process
    does not register, a ``since`` or ``until`` that is not an aware datetime, an ``until`` not
    after ``since``, a ``batch`` under 1.
    """
    event_types, start, end = _replay_window(subscriber, since, until)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidInput("batch", f"must be an integer >= 1, not {short_repr(batch)}")
    alias = using or router.db_for_write(Job)
    params: dict[str, Any] = {
        "subscriber": subscriber,
        "event_types": list(event_types),
        "since": start,
        "until": end,
        "after_at": None,
        "after_id": None,
        "limit": batch,
    }
    total = 0
    with connections[alias].cursor() as cursor:
        while True:
            cursor.execute(queries.REPLAY_EVENTS, params)
            row = cursor.fetchone()
            if row is None:  # no event left past the last batch
                return total
            written, params["after_at"], params["after_id"] = row
            total += int(written)
