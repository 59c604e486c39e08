"""The Django admin: dead letters one click from a fix, and every queue at a glance.

- Dead letters (jobs): filters by queue, job type and error code; search by id or idempotency
  key; pretty-printed payload; actions retry now, cancel and delete, each confirmed and logged.
- Jobs: every job, with an action that cancels them (running ones are asked to stop).
- Jobs, outbox events (with re-drive and discard for dead events), schedules (with "run now"):
  read-only changelists.
- An overview page (``admin/pgoutbox/job/overview/``): per queue, counts by state, oldest due age
  and a link to its dead letters; outbox lag; schedules due.

Every page is bounded by what it reads, whatever its query string says:

- Changelists never count a big table: the paginator uses the planner's estimate, and the default
  orderings follow an index (``id`` is a time-ordered UUIDv7, so "newest first" is a backward scan
  of the primary key). Columns sort only where an index or a small set makes it cheap; facet
  counts are off. Payloads and results are read on detail pages only, at most ``PREVIEW_CHARS``
  of each.
- Filters offer names the app knows (configured queues, registered job types, subscribers' event
  types, a bounded sample of the newest dead letters), never ``SELECT DISTINCT`` over the rows.
  The query string takes these filters and nothing else: any other lookup is a 400.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from math import ceil
from typing import Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import EmptyResultSet, PermissionDenied
from django.core.paginator import Paginator
from django.db import connections, router
from django.db.models import Model, Q, QuerySet, TextField
from django.db.models.functions import Cast, Left, Length
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from django_pgoutbox import control, metrics, outbox, scheduler
from django_pgoutbox.conf import get_settings
from django_pgoutbox.models import (
    DeadLetter,
    Job,
    JobStatus,
    OutboxEvent,
    ScheduleCursor,
)
from django_pgoutbox.registry import registered_jobs

#: The newest dead letters of each configured queue that the dead letters' filters read to offer
#: job types and error codes (an index scan of ``jobs_dead_idx`` each).
SAMPLE = 200
#: The deepest page a changelist serves: page N reads N x 100 rows before its own.
MAX_PAGE = 100
#: The most of a payload or a result that a detail page shows (characters of its JSON).
PREVIEW_CHARS = 256 * 1024


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts with the planner's row estimate: no ``COUNT(*)`` over a million finished jobs.

    Pages deeper than ``MAX_PAGE`` are not served (the admin's usual "?e=1" for a page out of
    range): an OFFSET reads every row before its page, and a filter or the search finds a row deep
    in a big table instead.
    """

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        alias = queryset.db
        try:
            sql, params = queryset.order_by().values("pk").query.sql_with_params()
        except EmptyResultSet:  # a filter that matches nothing by construction (.none())
            return 0
        with connections[alias].cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        estimate = int(plan[0]["Plan"]["Plan Rows"])
        # Small results are counted exactly: cheap, and the numbers then add up.
        if estimate < 10_000:
            return int(queryset.count())
        return estimate

    @cached_property
    def num_pages(self) -> int:
        """At most ``MAX_PAGE``: the pager links no deeper, and a deeper ``?p=`` is refused."""
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        return min(MAX_PAGE, ceil(max(1, self.count - self.orphans) / self.per_page))


def _pretty_json(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True),
    )


def _json_preview(obj: Model, column: str) -> str:
    """``column`` of ``obj`` pretty-printed, read apart from the row; one bigger than
    ``PREVIEW_CHARS`` characters of JSON is shown as the first of them, and the rest is never
    read from the database."""
    text = Cast(column, TextField())
    rows = type(obj)._base_manager.using(obj._state.db).filter(pk=obj.pk)
    found = rows.values_list(Length(text), Left(text, PREVIEW_CHARS)).first()
    if found is None or found[0] is None:  # deleted since, or SQL NULL
        return _pretty_json(None)
    size, head = found
    if size <= PREVIEW_CHARS:
        return _pretty_json(json.loads(head))
    return format_html(
        '<p>{} characters of JSON; the first {} are shown.</p><pre style="white-space: pre-wrap">'
        "{}</pre>",
        f"{size:,}",
        f"{PREVIEW_CHARS:,}",
        head,
    )


def _confirmed(
    modeladmin: admin.ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    action: str,
    title: str,
    explanation: str,
    perform: Callable[[list[Any]], int],
) -> HttpResponse | None:
    """Ask first; on confirmation run ``perform`` on the ids and log it for each object."""
    if request.POST.get("confirmed") != "yes":
        return TemplateResponse(
            request,
            "admin/django_pgoutbox/confirm_action.html",
            {
                **modeladmin.admin_site.each_context(request),
                "title": title,
                "explanation": explanation,
                "objects": list(queryset[:500]),
                "count": queryset.count(),
                "action": action,
                "opts": modeladmin.model._meta,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            },
        )
    objects = list(queryset)
    done = perform([obj.pk for obj in objects])
    for obj in objects:
        modeladmin.log_change(request, obj, title)  # the admin log: who did what, to which
    modeladmin.message_user(request, f"{title}: {done} of {len(objects)} done.", messages.SUCCESS)
    return None


# -- filters -------------------------------------------------------------------------------------


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
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


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


class ErrorCodeFilter(_NamesFilter):
    """The error codes of the newest dead letters."""

    title = "error code"
    parameter_name = field = "last_error_code"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return _dead_letter_sample(model_admin, request, "last_error_code")


class EventTypeFilter(_NamesFilter):
    """The event types that subscribers take."""

    title = "event type"
    parameter_name = field = "event_type"

    def names(self, request: HttpRequest, model_admin: Any) -> Iterable[str]:
        return outbox.subscribed_event_types()


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(status.value, status.label) for status in JobStatus]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        if self.value() not in JobStatus.values:
            return queryset.none()  # no job has it: not a scan to find none
        return queryset.filter(status=self.value())


class EventStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"
    STATES: ClassVar[dict[str, Q]] = {
        "pending": Q(processed_at__isnull=True, dead_at__isnull=True),
        "processed": Q(processed_at__isnull=False),
        "dead": Q(processed_at__isnull=True, dead_at__isnull=False),
    }

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in self.STATES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        state = self.STATES.get(str(self.value()))
        return queryset.none() if state is None else queryset.filter(state)


# -- the pages ------------------------------------------------------------------------------------


class _ChangeList(ChangeList):
    """Sorts only by the columns of ``sortable_by``: Django checks it for the headers alone, and
    sorts by any column of the list that ``?o=`` names."""

    def get_ordering_field(self, field_name: Any) -> Any:
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a facet is a count over every row of the table
    #: Columns that no page reads with the row (payloads, results): a detail page reads a
    #: bounded preview of them apart (``_json_preview``).
    heavy_fields: tuple[str, ...] = ()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer(*self.heavy_fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """Only the parameters of this page's own filters. Django's default also takes any
        lookup on a column (``?payload__a__b=``, ``?job_type__regex=``, ``?id__in=`` with
        thousands of ids): each a scan of the table that no index serves."""
        offered = {
            item.parameter_name
            for item in self.get_list_filter(request)
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter)
        }
        return lookup in offered

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ChangeList

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        hidden = set(self.exclude or ())  # shown pretty-printed by a readonly_fields method
        fields = [f.name for f in self.model._meta.fields if f.name not in hidden]
        return fields + list(self.readonly_fields)


def _job_search(queryset: QuerySet[Any], search_term: str) -> tuple[QuerySet[Any], bool]:
    term = search_term.strip()
    if not term:
        return queryset, False
    try:
        return queryset.filter(pk=uuid.UUID(term)), False
    except ValueError:
        return queryset.filter(idempotency_key=term), False


@admin.register(DeadLetter)
class DeadLetterAdmin(_ReadOnly):
    list_display = (
        "id",
        "job_type",
        "queue",
        "attempts",
        "last_error_code",
        "error",
        "organization_id",
        "finished_at",
    )
    list_filter = (QueueFilter, DeadJobTypeFilter, ErrorCodeFilter)
    search_help_text = "A job id, or an idempotency key."
    search_fields = ("idempotency_key",)
    ordering = ("-finished_at",)
    sortable_by = ("finished_at",)
    heavy_fields = ("payload", "result", "worker_ids")
    readonly_fields = ("pretty_payload", "pretty_result")
    actions = ("retry_now", "cancel", "delete_selected")
    exclude = ("payload", "result")

    @admin.display(description="error summary")
    def error(self, obj: Job) -> str:
        summary = obj.last_error_summary or ""
        return summary if len(summary) <= 120 else summary[:117] + "..."

    @admin.display(description="payload")
    def pretty_payload(self, obj: Job) -> str:
        return _json_preview(obj, "payload")

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> str:
        return _json_preview(obj, "result")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return _job_search(queryset, search_term)

    @admin.action(description="Retry now (fresh attempt budget)", permissions=["change"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return _confirmed(
            self,
            request,
            queryset,
            action="retry_now",
            title="Retry dead letters",
            explanation="These jobs go back to their queue, due now, with their attempts reset "
            "to zero. Their handlers must be idempotent.",
            perform=control.retry_dead_jobs,
        )

    @admin.action(description="Cancel (never run again)", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return _confirmed(
            self,
            request,
            queryset,
            action="cancel",
            title="Cancel dead letters",
            explanation="These jobs become cancelled: they never run again, and retention "
            "deletes them with the other finished jobs.",
            perform=control.cancel_dead_jobs,
        )


@admin.register(Job)
class JobAdmin(_ReadOnly):
    list_display = (
        "id",
        "job_type",
        "queue",
        "status",
        "priority",
        "attempts",
        "run_at",
        "created_at",
    )
    list_filter = (StatusFilter, QueueFilter)
    search_fields = ("idempotency_key",)
    search_help_text = "A job id, or an idempotency key."
    ordering = ("-id",)  # UUIDv7: newest first, straight from the primary key index
    sortable_by = ("id",)
    heavy_fields = ("payload", "result", "worker_ids", "last_error_summary")
    readonly_fields = ("pretty_payload", "pretty_result")
    exclude = ("payload", "result")
    change_list_template = "admin/django_pgoutbox/job_change_list.html"
    actions = ("cancel_jobs",)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return _job_search(queryset, search_term)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancelling changes jobs, though the admin never edits one."""
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    @admin.action(description="Cancel (running ones are asked to stop)", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def perform(ids: list[Any]) -> int:
            states = control.cancel_jobs(ids, using=queryset.db, by=f"admin user {request.user}")
            return sum(1 for state in states.values() if state in ("cancelled", "cancelling"))

        return _confirmed(
            self,
            request,
            queryset,
            action="cancel_jobs",
            title="Cancel jobs",
            explanation="Jobs not running yet become cancelled and never run. Running jobs are "
            "asked to stop: their handlers see ctx.cancelled, and they end cancelled. Finished "
            "jobs are left as they are.",
            perform=perform,
        )

    @admin.display(description="payload")
    def pretty_payload(self, obj: Job) -> str:
        return _json_preview(obj, "payload")

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> str:
        return _json_preview(obj, "result")

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        overview = self.admin_site.admin_view(self.overview_view)
        return [path("overview/", overview, name="pgoutbox_overview"), *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        gauges = metrics.database_gauges(router.db_for_read(Job))
        dead_url = reverse("admin:pgoutbox_deadletter_changelist")
        queues = [
            {"gauges": g, "dead_url": f"{dead_url}?queue={g.queue}"} for g in gauges.queues.values()
        ]
        schedules, problems = scheduler.load_schedules()
        now = scheduler.database_now(router.db_for_read(Job))
        cursors = scheduler.cursors()
        rows = []
        for name, entry in sorted(schedules.items()):
            last = cursors.get(name)
            latest = entry.latest_due(now)
            rows.append(
                {
                    "name": name,
                    "spec": entry.spec,
                    "last": last,
                    "next": entry.next_after(now),
                    "due": last is not None and latest > last,
                }
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues overview",
            "queues": queues,
            "gauges": gauges,
            "schedules": rows,
            "schedule_problems": problems,
            "now": timezone.now(),
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/django_pgoutbox/overview.html", context)


@admin.register(OutboxEvent)
class OutboxEventAdmin(_ReadOnly):
    list_display = (
        "id",
        "event_type",
        "aggregate_type",
        "aggregate_id",
        "schema_version",
        "occurred_at",
        "processed_at",
        "attempts",
        "last_error_code",
        "dead_at",
    )
    list_filter = (EventStateFilter, EventTypeFilter)
    search_fields = ("id",)
    search_help_text = "An event id."
    ordering = ("-id",)
    sortable_by = ("id",)
    heavy_fields = ("payload", "last_error")
    readonly_fields = ("pretty_payload",)
    exclude = ("payload",)
    actions = ("redrive", "discard")

    @admin.display(description="payload")
    def pretty_payload(self, obj: OutboxEvent) -> str:
        return _json_preview(obj, "payload")

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """An event id, through the primary key: no ``LIKE`` over a million events."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False

    @admin.action(description="Re-drive dead events", permissions=["change"])
    def redrive(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return _confirmed(
            self,
            request,
            queryset.filter(dead_at__isnull=False, processed_at__isnull=True),
            action="redrive",
            title="Re-drive dead events",
            explanation="These dead events become claimable again with a fresh attempt budget; "
            "the relay projects them, then their aggregates' later events.",
            perform=control.redrive_dead_events,
        )

    @admin.action(description="Discard dead events (mark processed)", permissions=["change"])
    def discard(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return _confirmed(
            self,
            request,
            queryset.filter(dead_at__isnull=False, processed_at__isnull=True),
            action="discard",
            title="Discard dead events",
            explanation="These dead events are marked processed without being projected, so "
            "the later events of their aggregates go on.",
            perform=control.discard_dead_events,
        )


@admin.register(ScheduleCursor)
class ScheduleAdmin(_ReadOnly):
    list_display = ("name", "job", "spec", "last_slot_at", "next_slot")
    actions = ("run_now",)
    ordering = ("name",)
    sortable_by = ("name", "last_slot_at")  # one row per schedule: a small table

    @cached_property
    def _schedules(self) -> dict[str, scheduler.Schedule]:
        return scheduler.load_schedules()[0]

    @admin.display(description="job")
    def job(self, obj: ScheduleCursor) -> str:
        entry = self._schedules.get(obj.name)
        return entry.job_type if entry else "(no longer configured)"

    @admin.display(description="when")
    def spec(self, obj: ScheduleCursor) -> str:
        entry = self._schedules.get(obj.name)
        return entry.spec if entry else ""

    @admin.display(description="next slot")
    def next_slot(self, obj: ScheduleCursor) -> Any:
        entry = self._schedules.get(obj.name)
        return entry.next_after(timezone.now()) if entry else None

    @admin.action(description="Run now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        def perform(names: list[Any]) -> int:
            started = 0
            for name in names:
                if name in self._schedules:
                    scheduler.run_now(self._schedules[name])
                    started += 1
            return started

        return _confirmed(
            self,
            request,
            queryset,
            action="run_now",
            title="Run schedules now",
            explanation="Each schedule's job is enqueued once now; its slots are unchanged.",
            perform=perform,
        )
