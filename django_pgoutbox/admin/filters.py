"""The changelists' filters: names the app knows (configured queues, registered job types,
subscribers' event types and names, a bounded sample of dead letters, the inbox's sources and
the subscribers of undelivered deliveries read one index descent each), never ``SELECT
DISTINCT`` over rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from django_pgoutbox import outbox, queries
from django_pgoutbox.admin.common import SAMPLE
from django_pgoutbox.conf import get_settings
from django_pgoutbox.delivery_states import DELIVERY_STATES
from django_pgoutbox.event_states import EVENT_STATES
from django_pgoutbox.models import (
    JobStatus,
)
from django_pgoutbox.registry import registered_jobs
from django_pgoutbox.schedules import BUILTIN_SCHEDULES
from django_pgoutbox.validation import storable

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices
    from django.contrib.admin.views.main import ChangeList


class _NamesFilter(admin.SimpleListFilter):
    """Choices from names the app knows, never ``SELECT DISTINCT`` over the rows.

    Any value filters by exact match (rows of a job type that no code registers any more are
    still found), and the chosen value is listed beside the known ones.
    """

    field = ""

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = {name for name in self.names(request, model_admin) if name}
        if self.value():
            names.add(str(self.value()))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        if not storable(str(self.value())):
            return queryset.none()  # no row has it, and PostgreSQL refuses to compare it
        return queryset.filter(**{self.field: self.value()})


class QueueFilter(_NamesFilter):
    """The configured queues, without a ``SELECT DISTINCT queue`` over a million rows."""

    title = "queue"
    parameter_name = field = "queue"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return get_settings().queues


def _dead_letter_sample(model_admin: Any, request: HttpRequest, column: str) -> set[str]:
    """``column`` of the newest ``SAMPLE`` dead letters of each configured queue."""
    base = model_admin.get_queryset(request).order_by("-finished_at").values_list(column, flat=True)
    parts = [base.filter(queue=queue)[:SAMPLE] for queue in get_settings().queues]
    if not parts:
        return set()
    union = parts[0].union(*parts[1:]).order_by() if len(parts) > 1 else parts[0]
    return {value for value in union if value}


class DeadJobTypeFilter(_NamesFilter):
    """Registered job types, and those of the newest dead letters (types no code handles)."""

    title = "job type"
    parameter_name = field = "job_type"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return set(registered_jobs()) | _dead_letter_sample(model_admin, request, "job_type")


#: The Jobs page's job type filter looks among this many of the newest jobs: no index of the
#: jobs table serves the job type, and a type with few jobs was looked for in every row (four
#: to five seconds at ten million jobs; docs/admin.md, "Ten million jobs").
JOB_TYPE_WINDOW = 50_000


class JobTypeFilter(_NamesFilter):
    """The registered job types: no sample of the rows, which no index of the jobs table
    serves by job type. A type's jobs are looked for among the newest ``JOB_TYPE_WINDOW`` jobs
    (by id, a UUIDv7: the order they were made in), which the primary key's index bounds."""

    title = f"job type (among the newest {JOB_TYPE_WINDOW:,} jobs)"
    parameter_name = field = "job_type"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return registered_jobs()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filtered = super().queryset(request, queryset)
        return newest(filtered, JOB_TYPE_WINDOW) if self.value() else filtered


def newest(queryset: QuerySet[Any], count: int) -> QuerySet[Any]:
    """``queryset`` among the newest ``count`` rows of its table, by primary key (a UUIDv7 or an
    identity: the order rows were made in): one read of ``count`` entries of the primary key's
    index finds the oldest of them, and the page then reads no row older."""
    rows = queryset.model._base_manager.using(queryset.db).order_by("-pk")
    floor = list(rows.values_list("pk", flat=True)[count - 1 : count])
    return queryset.filter(pk__gte=floor[0]) if floor else queryset


#: The job types of the built-in maintenance schedules (lease recovery, the outbox's
#: reconciliation, pruning): a job every 30 seconds, hidden from the Jobs page unless asked for.
MAINTENANCE_JOB_TYPES = tuple(sorted({options["JOB"] for options in BUILTIN_SCHEDULES.values()}))


class MaintenanceFilter(admin.SimpleListFilter):
    """The maintenance jobs: hidden by default (a search or a job type shows them), included,
    or alone.

    Hidden is ``job_type NOT IN (...)`` on the list's backward scan of the primary key, which
    reads past the few maintenance jobs among the newest. Alone reads them through
    ``jobs_idempotency_uq``: the schedules enqueue each with its slot's idempotency key and no
    organization.
    """

    title = "maintenance jobs"
    parameter_name = "maintenance"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("included", "all jobs, maintenance included"), ("only", "maintenance only")]

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "hidden",
        }
        for value, label in self.lookup_choices:
            yield {
                "selected": self.value() == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "included":
            return queryset
        if value == "only":
            return queryset.filter(
                organization_id__isnull=True,
                idempotency_key__isnull=False,
                job_type__in=MAINTENANCE_JOB_TYPES,
            )
        if value is not None:
            return queryset.none()
        if request.GET.get("q", "").strip() or request.GET.get("job_type"):
            return queryset  # looking for a job by its id, key or type: whatever it is
        return queryset.exclude(job_type__in=MAINTENANCE_JOB_TYPES)


class LinkedFilter(admin.SimpleListFilter):
    """A filter that another page links to with its value (a cause, an event), and that offers
    no choices of its own: the sidebar shows the value given, as ``this <title>``."""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(str(value), f"this {self.title}")] if value else []


class FromEventFilter(LinkedFilter):
    """``?event=EVENT_ID``: the jobs that an event's subscribers enqueued, read from
    ``jobs_event_idx`` (a link of the event's page). A value that is not a UUID matches
    nothing."""

    title = "event"
    parameter_name = "event"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        try:
            return queryset.filter(event_id=uuid.UUID(str(self.value())))
        except ValueError:
            return queryset.none()


class ErrorCodeFilter(_NamesFilter):
    """The error codes of the newest dead letters."""

    title = "error code"
    parameter_name = field = "last_error_code"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return _dead_letter_sample(model_admin, request, "last_error_code")


#: The event type filters look among this many of the newest events (or deliveries): no index
#: serves the event type, and a type with few events was looked for in every row (half a second
#: to a second at a million events; docs/admin.md, "Ten million jobs").
EVENT_TYPE_WINDOW = 50_000


class EventTypeFilter(_NamesFilter):
    """The event types that subscribers take, among the newest ``EVENT_TYPE_WINDOW`` rows."""

    title = f"event type (among the newest {EVENT_TYPE_WINDOW:,})"
    parameter_name = field = "event_type"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return outbox.subscribed_event_types()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filtered = super().queryset(request, queryset)
        return newest(filtered, EVENT_TYPE_WINDOW) if self.value() else filtered


#: The most sources the inbox's filter offers (and its search looks in by index).
MAX_SOURCES = 100


def inbox_sources(alias: str) -> list[str]:
    """The sources of the inbox's messages, in order, at most ``MAX_SOURCES`` of them."""
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.INBOX_SOURCES, [MAX_SOURCES])
        return [source for (source,) in cursor.fetchall()]


class SourceFilter(_NamesFilter):
    """The sources the inbox holds, found by a loose scan of its unique index."""

    title = "source"
    parameter_name = field = "source"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return inbox_sources(model_admin.get_queryset(request).db)


#: The statuses whose jobs an index finds by queue: pending and retrying (``jobs_claim_idx``),
#: dead (``jobs_dead_idx``), leased (``jobs_leased_idx``: the few running), waiting
#: (``jobs_waiting_idx``). Completed and
#: cancelled jobs, most of the table, are in no index by queue or by status alone.
QUEUE_INDEXED_STATUSES = frozenset(
    {JobStatus.WAITING, JobStatus.PENDING, JobStatus.RETRYING, JobStatus.DEAD, JobStatus.LEASED}
)


class StatusFilter(admin.SimpleListFilter):
    """The seven statuses. Completed and cancelled jobs are looked for among the newest
    ``JOB_TYPE_WINDOW`` jobs: a status with none among ten million read every row."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            (
                status.value,
                status.label
                if status in QUEUE_INDEXED_STATUSES
                else f"{status.label} (among the newest {JOB_TYPE_WINDOW:,})",
            )
            for status in JobStatus
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        if self.value() not in JobStatus.values:
            return queryset.none()  # no job has it: not a scan to find none
        filtered = queryset.filter(status=self.value())
        if self.value() in QUEUE_INDEXED_STATUSES:
            return filtered
        return newest(filtered, JOB_TYPE_WINDOW)


class JobQueueFilter(QueueFilter):
    """The Jobs page's queue: with a status that an index finds by queue (pending, retrying,
    dead, leased), every job of the queue; else (every status, completed, cancelled) among the
    newest ``JOB_TYPE_WINDOW`` jobs: a queue with no job read every row of the table."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filtered = super().queryset(request, queryset)
        if not self.value() or request.GET.get(StatusFilter.parameter_name) in (
            QUEUE_INDEXED_STATUSES
        ):
            return filtered
        return newest(filtered, JOB_TYPE_WINDOW)


class EventStateFilter(admin.SimpleListFilter):
    """An event's state: pending (waiting: due, backing off or held back), failing (a relay
    tried and failed; retried with back-off), held back (behind an earlier unprocessed event of
    its aggregate), abandoned (no relay has touched it for ``OUTBOX["OVERDUE_SECONDS"]``),
    dead, processed."""

    title = "state"
    parameter_name = "state"
    STATES = EVENT_STATES

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state.replace("_", " ")) for state in self.STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        state = self.STATES.get(str(self.value()))
        return queryset.none() if state is None else queryset.filter(state())


class DeadForFilter(admin.SimpleListFilter):
    """Dead for at least so long: the dead letters old enough to re-drive in bulk once the
    cause is mended (the newer ones may still fail for it)."""

    title = "dead for"
    parameter_name = "dead_for"
    AGES: ClassVar[dict[str, tuple[str, timedelta]]] = {
        "1h": ("over an hour", timedelta(hours=1)),
        "1d": ("over a day", timedelta(days=1)),
        "7d": ("over a week", timedelta(days=7)),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, label) for value, (label, _) in self.AGES.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        age = self.AGES.get(str(self.value()))
        if age is None:
            return queryset.none()
        # Dead ones only (a discarded event keeps its ``dead_at``): through ``outbox_dead_idx``,
        # not a scan of every event.
        return queryset.filter(EVENT_STATES["dead"](), dead_at__lte=timezone.now() - age[1])


# -- deliveries ------------------------------------------------------------------------------


def delivery_subscribers(alias: str) -> list[str]:
    """The subscribers of undelivered deliveries, in order, at most ``MAX_SOURCES`` of them."""
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.DELIVERY_SUBSCRIBERS, [MAX_SOURCES])
        return [name for (name,) in cursor.fetchall()]


class SubscriberFilter(_NamesFilter):
    """The subscribers this process registers, and those of undelivered deliveries (one that no
    code registers any more among them), read one index descent each: at most ``MAX_SOURCES``."""

    title = "subscriber"
    parameter_name = field = "subscriber"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        registered = {
            registered.name
            for event_type in outbox.subscribed_event_types()
            for registered in outbox.subscribers_for(event_type)
        }
        return registered | set(delivery_subscribers(model_admin.get_queryset(request).db))


#: The deliveries' event type filter looks among this many of the newest deliveries: each is
#: matched through its event (a probe of the events' primary key each).
DELIVERY_EVENT_TYPE_WINDOW = 10_000


class DeliveryEventTypeFilter(EventTypeFilter):
    """The event types that subscribers take, matched against the delivery's event, among the
    newest ``DELIVERY_EVENT_TYPE_WINDOW`` deliveries."""

    title = f"event type (among the newest {DELIVERY_EVENT_TYPE_WINDOW:,})"
    field = "event__event_type"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        filtered = _NamesFilter.queryset(self, request, queryset)
        return newest(filtered, DELIVERY_EVENT_TYPE_WINDOW) if self.value() else filtered


class DeliveryStateFilter(EventStateFilter):
    """A delivery's state: waiting (behind an earlier delivery of its aggregate to the same
    subscriber, or replayed), failing (retried with back-off), dead, delivered."""

    STATES = DELIVERY_STATES


class DeliveryDeadForFilter(DeadForFilter):
    """Dead deliveries, dead for at least so long (a discarded one keeps its ``dead_at``, and is
    delivered: left out)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        age = self.AGES.get(str(self.value()))
        if age is None:
            return queryset.none()
        return queryset.filter(DELIVERY_STATES["dead"](), dead_at__lte=timezone.now() - age[1])
