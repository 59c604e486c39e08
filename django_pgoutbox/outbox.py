"""The transactional outbox: ``publish()``, the model-save hook, and ``@subscriber``.

A fact is written in the same transaction as the business change that makes it true, so the two
commit (or roll back) together; the relay (``runworkers``) later projects each fact into jobs or
other views through its subscribers, exactly once.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from django.db import connections, models, router, transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import OUTBOX_CHANNEL, get_settings
from django_pgoutbox.db import tables_required, write_database
from django_pgoutbox.errors import PublishError, SubscriberRegistrationError
from django_pgoutbox.ids import uuid7
from django_pgoutbox.models import OutboxEvent, saved_instance
from django_pgoutbox.tracing import current_context
from django_pgoutbox.validation import (
    MAX_NAME_BYTES,
    check_text,
    checked_moment,
    json_object,
    non_empty_text,
    optional_uuid,
    utc_offset,
)

_INT32_MAX = 2**31 - 1


def publish(
    event_type: str,
    *,
    aggregate_type: str,
    aggregate_id: uuid.UUID | str,
    payload: dict[str, Any],
    schema_version: int = 1,
    organization_id: uuid.UUID | str | None = None,
    available_at: datetime | None = None,
    using: str | None = None,
) -> OutboxEvent:
    """Write a fact to ``outbox_events`` in the caller's transaction and return it.

    ``pg_notify('outbox_ready', <event type>)`` is sent in the same statement, so relays hear of
    the event when the transaction commits, never before and never after a rollback. PostgreSQL
    delivers a transaction's identical notifications once, so a transaction that publishes a
    thousand facts of one type wakes the relays once. One statement.
    """
    alias = write_database(using, OutboxEvent, PublishError)
    conf = get_settings()
    event_type = non_empty_text(event_type, "event_type", PublishError)
    aggregate_type = non_empty_text(aggregate_type, "aggregate_type", PublishError)
    if aggregate_id is None:
        raise PublishError("aggregate_id", "is required: the id of the entity the fact is about")
    aggregate = optional_uuid(aggregate_id, "aggregate_id", PublishError)
    payload_json = json_object(payload, "payload", PublishError, conf.max_payload_bytes)
    if isinstance(schema_version, bool) or not isinstance(schema_version, int):
        raise PublishError("schema_version", f"must be an int, not {type(schema_version).__name__}")
    if not 1 <= schema_version <= _INT32_MAX:
        raise PublishError(
            "schema_version",
            f"must be from 1 to {_INT32_MAX} (a 32-bit integer column), not {schema_version}",
        )
    organization = optional_uuid(organization_id, "organization_id", PublishError)
    if available_at is not None:
        if (
            not isinstance(available_at, datetime)
            or utc_offset(available_at, "available_at", PublishError) is None
        ):
            raise PublishError("available_at", f"must be an aware datetime, not {available_at!r}")
        checked_moment(available_at, "available_at", PublishError)

    event_id = uuid7()
    trace_context = current_context()
    with tables_required(alias, PublishError), connections[alias].cursor() as cursor:
        cursor.execute(
            queries.PUBLISH_EVENT,
            {
                "id": event_id,
                "organization_id": organization,
                "aggregate_type": aggregate_type,
                "aggregate_id": aggregate,
                "event_type": event_type,
                "schema_version": schema_version,
                "payload": payload_json,
                "occurred_at": None,
                "available_at": available_at,
                "trace_context": trace_context,
                "notify": conf.notify,
                "channel": OUTBOX_CHANNEL,
            },
        )
        occurred_at, stored_available_at, _ = cursor.fetchone()
    values = {
        "id": event_id,
        "organization_id": organization,
        "aggregate_type": aggregate_type,
        "aggregate_id": aggregate,
        "event_type": event_type,
        "schema_version": schema_version,
        "payload": payload,
        "occurred_at": occurred_at,
        "available_at": stored_available_at,
        "attempts": 0,
        "trace_context": None if trace_context is None else json.loads(trace_context),
    }
    return saved_instance(OutboxEvent, alias, values)


# -- the model-save hook -------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """A fact that a model's save or delete produces; see :class:`OutboxModelMixin`.

    ``aggregate_type``, ``aggregate_id`` and ``organization_id`` default to the model's
    ``outbox_aggregate_type``, its primary key and its ``organization_id`` attribute.
    """

    event_type: str
    payload: dict[str, Any] = field(default_factory=dict)
    schema_version: int = 1
    aggregate_type: str | None = None
    aggregate_id: uuid.UUID | str | None = None
    organization_id: uuid.UUID | str | None = None


class OutboxModelMixin(models.Model):
    """Publish facts atomically with a model's ``save()`` and ``delete()``.

    Override :meth:`outbox_events_for_save` and/or :meth:`outbox_events_for_delete` to return the
    :class:`Event` objects a change produces. They are written in the same transaction as the
    row, also when the caller is in autocommit mode (the save then runs in a transaction of its
    own). ``QuerySet.update()``, ``bulk_create()`` and raw SQL bypass ``save()``: call
    :func:`publish` yourself in those paths, in the same transaction.
    """

    #: The aggregate type of the events; defaults to ``app_label.model_name``.
    outbox_aggregate_type: ClassVar[str | None] = None

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        self._outbox_database_required(using)
        with transaction.atomic(using=using, savepoint=False):
            created = self._state.adding
            super().save(*args, **kwargs)
            self._outbox_publish(self.outbox_events_for_save(created=created), using, self.pk)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        using = kwargs.get("using") or router.db_for_write(type(self), instance=self)
        self._outbox_database_required(using)
        with transaction.atomic(using=using, savepoint=False):
            # Ask before deleting: afterwards the instance has no primary key.
            events = list(self.outbox_events_for_delete())
            pk = self.pk
            result = super().delete(*args, **kwargs)
            self._outbox_publish(events, using, pk)
        return result

    def outbox_events_for_save(self, *, created: bool) -> Iterable[Event]:
        """The events this save produces (``created`` tells an insert from an update)."""
        return ()

    def outbox_events_for_delete(self) -> Iterable[Event]:
        """The events this delete produces; the instance still has its primary key here."""
        return ()

    def _outbox_database_required(self, using: str) -> None:
        """Refuse a database that is not PostgreSQL before the row is written: ``publish()``'s
        own error would say to pass ``using=`` or to route the pgoutbox app, and neither helps
        here, where the events go to the model's own database, in the save's transaction."""
        connection = connections[using]
        if connection.vendor != "postgresql":
            raise PublishError(
                "using",
                f"{self._meta.label} is saved to database {using!r}, which is "
                f"{connection.display_name}, not PostgreSQL: its save hook writes the outbox "
                "events in the save's own transaction, on the same database. Keep the model in a "
                "PostgreSQL database that has the django-pgoutbox tables (DATABASE_ROUTERS).",
            )

    def _outbox_publish(self, events: Iterable[Event], using: str, pk: Any) -> None:
        for event in events:
            if not isinstance(event, Event):
                raise TypeError(
                    f"{type(self).__name__}.outbox_events_for_*() must yield Event objects, "
                    f"not {type(event).__name__}"
                )
            aggregate_id = event.aggregate_id if event.aggregate_id is not None else pk
            publish(
                event.event_type,
                aggregate_type=event.aggregate_type or self._outbox_aggregate_type(),
                aggregate_id=aggregate_id,
                payload=event.payload,
                schema_version=event.schema_version,
                organization_id=event.organization_id
                if event.organization_id is not None
                else getattr(self, "organization_id", None),
                using=using,
            )

    @classmethod
    def _outbox_aggregate_type(cls) -> str:
        return cls.outbox_aggregate_type or cls._meta.label_lower


# -- subscribers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscriber:
    """A projection of events into jobs or views, run by the relay inside its transaction."""

    name: str
    event_types: tuple[str, ...]
    versions: frozenset[int]
    func: Callable[[OutboxEvent], Any]

    def __call__(self, event: OutboxEvent) -> Any:
        return self.func(event)


_subscribers: dict[str, list[Subscriber]] = {}


def subscribers_for(event_type: str) -> list[Subscriber]:
    return list(_subscribers.get(event_type, ()))


def subscribed_event_types() -> list[str]:
    """The event types that have at least one subscriber, sorted."""
    return sorted(_subscribers)


def subscriber_names() -> list[str]:
    """The names of the registered subscribers, sorted: what the delivery gauges report by name
    (any other name a delivery carries is counted as ``unregistered``)."""
    return sorted({s.name for registered in _subscribers.values() for s in registered})


def has_subscribers(event_type: str) -> bool:
    """Whether a ``@subscriber`` projects ``event_type``."""
    return event_type in _subscribers


def unregister_subscriber(name: str) -> None:
    """Forget a subscriber (for tests that register their own)."""
    for event_type in list(_subscribers):
        _subscribers[event_type] = [s for s in _subscribers[event_type] if s.name != name]
        if not _subscribers[event_type]:
            del _subscribers[event_type]


def subscriber(
    *event_types: str, versions: Collection[int] = (1,), name: str | None = None
) -> Callable[[Callable[[OutboxEvent], Any]], Subscriber]:
    """Register ``func(event: OutboxEvent)`` as a projection of these event types.

    The relay calls it inside the transaction that marks the event processed: the jobs it
    enqueues and the rows it writes commit together with that mark, or not at all, so each
    event is projected exactly once. Keep external side effects (HTTP, e-mail) out of it: enqueue
    a job for them. ``versions`` lists the schema versions it understands; an event of another
    version is dead-lettered (``unsupported_schema_version``) rather than guessed at. ``name``
    (default: the function's module and qualified name) is at most 255 bytes of UTF-8, without
    NUL: each of its deliveries carries it.
    """
    if not event_types:
        raise SubscriberRegistrationError("@subscriber needs at least one event type")
    for event_type in event_types:
        if not isinstance(event_type, str) or not event_type.strip():
            raise SubscriberRegistrationError(
                f"event type must be a non-empty string, not {event_type!r}"
            )
        try:
            check_text(event_type, "event type", PublishError, MAX_NAME_BYTES)
        except PublishError as problem:
            # An event type publish() refuses: no event could ever reach this subscriber.
            raise SubscriberRegistrationError(
                f"{problem}, as publish() requires: {event_type[:100]!r}"
            ) from None
    try:
        accepted = frozenset(versions)
    except TypeError:
        accepted = frozenset()
    if not accepted or any(
        isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _INT32_MAX for v in accepted
    ):
        raise SubscriberRegistrationError(
            f"versions must be integers from 1 to {_INT32_MAX} (publish()'s schema_version), "
            f"not {versions!r}"
        )

    if name is not None and not isinstance(name, str):
        raise SubscriberRegistrationError(f"name must be a string, not {type(name).__name__}")

    def decorator(func: Callable[[OutboxEvent], Any]) -> Subscriber:
        subscriber_name = name or f"{func.__module__}.{func.__qualname__}"
        try:
            # Written in each of its deliveries, in three indexes: what PostgreSQL can store.
            subscriber_name = check_text(subscriber_name, "name", PublishError, MAX_NAME_BYTES)
        except PublishError as problem:
            raise SubscriberRegistrationError(
                f"subscriber {problem}: {subscriber_name[:100]!r}"
            ) from None
        try:
            inspect.signature(func).bind(object())
        except TypeError:
            raise SubscriberRegistrationError(
                f"@subscriber {subscriber_name!r} must accept one argument, the event"
            ) from None
        except ValueError:
            pass
        registered = Subscriber(subscriber_name, tuple(event_types), accepted, func)
        unregister_subscriber(subscriber_name)  # re-importing a module replaces, never doubles
        for event_type in event_types:
            _subscribers.setdefault(event_type, []).append(registered)
        return registered

    return decorator
