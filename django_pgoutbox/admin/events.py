"""The outbox events' and the schedules' pages."""

from __future__ import annotations

import uuid
from contextvars import ContextVar
from typing import Any

from django.contrib import admin
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from django_pgoutbox import control, outbox, scheduler
from django_pgoutbox.admin.bulk import Bulk, bulk_action
from django_pgoutbox.admin.buttons import Button, ButtonsAdmin
from django_pgoutbox.admin.common import ReadOnlyAdmin, change_link, json_preview, preformatted
from django_pgoutbox.admin.deliveries import DeliveryInline
from django_pgoutbox.admin.filters import DeadForFilter, EventStateFilter, EventTypeFilter
from django_pgoutbox.models import Job, OutboxEvent, ScheduleCursor
from django_pgoutbox.publishers import PUBLISH_JOB
from django_pgoutbox.schedules import Schedule, load_schedules

#: The most jobs an event's page lists among those its subscribers enqueued (a link shows all).
SHOWN_JOBS = 20

#: The schedules of the changelist being rendered (``ScheduleAdmin.changelist_view``).
_PAGE_SCHEDULES: ContextVar[dict[str, Schedule] | None] = ContextVar(
    "pgoutbox_page_schedules", default=None
)


@admin.register(OutboxEvent)
class OutboxEventAdmin(ButtonsAdmin):
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
    list_filter = (EventStateFilter, DeadForFilter, EventTypeFilter)
    search_fields = ("id",)
    search_help_text = "An event id."
    ordering = ("-id",)
    sortable_by = ("id",)
    heavy_fields = ("payload", "last_error")
    readonly_fields = ("publisher_jobs", "enqueued_jobs", "error_in_full", "pretty_payload")
    exclude = ("payload",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "event_type",
                    "schema_version",
                    "aggregate_type",
                    "aggregate_id",
                    "organization_id",
                    "publisher_jobs",
                    "enqueued_jobs",
                )
            },
        ),
        ("Attempts", {"fields": ("attempts", "claimed_by")}),
        (
            "Times",
            {"fields": ("occurred_at", "available_at", "claimed_at", "dead_at", "processed_at")},
        ),
        ("Error", {"fields": ("last_error_code", "error_in_full")}),
        ("Payload", {"fields": ("pretty_payload",)}),
    )
    actions = ("redrive", "discard")
    inlines = (DeliveryInline,)

    @admin.display(description="payload")
    def pretty_payload(self, obj: OutboxEvent) -> str:
        return json_preview(obj, "payload")

    @admin.display(description="error")
    def error_in_full(self, obj: OutboxEvent) -> str:
        return preformatted(obj.last_error)

    @admin.display(description="publishers' jobs")
    def publisher_jobs(self, obj: OutboxEvent) -> str:
        """The job of each publisher that sends this event's type (``send_events``): found by
        its idempotency key, ``<publisher>:<event id>``, through ``jobs_idempotency_uq``. Jobs
        that other subscribers enqueued do not record the event."""
        prefix = f"{PUBLISH_JOB}:"
        keys = {
            f"{registered.name.removeprefix(prefix)}:{obj.pk}": registered.name.removeprefix(prefix)
            for registered in outbox.subscribers_for(obj.event_type)
            if registered.name.startswith(prefix)
        }
        if not keys:
            return "-"
        jobs = {
            key: (pk, status)
            for pk, key, status in Job._base_manager.using(router.db_for_read(Job))
            .filter(organization_id__isnull=True, job_type=PUBLISH_JOB, idempotency_key__in=keys)
            .order_by()
            .values_list("pk", "idempotency_key", "status")
        }
        lines = [
            format_html(
                "{}: {} ({})", name, change_link(self.admin_site, Job, job[0], job[0]), job[1]
            )
            if (job := jobs.get(key))
            else format_html("{}: no job (not projected yet, or deleted)", name)
            for key, name in sorted(keys.items(), key=lambda item: item[1])
        ]
        return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))

    @admin.display(description="jobs its subscribers enqueued")
    def enqueued_jobs(self, obj: OutboxEvent) -> str:
        """The jobs that the event's subscribers enqueued (``Job.event_id``, through
        ``jobs_event_idx``), publishers' jobs aside: the first ``SHOWN_JOBS``, then a link to
        the Jobs page filtered to the event."""
        alias = router.db_for_read(Job)
        found = list(
            Job._base_manager.using(alias)
            .filter(event_id=obj.pk)
            .exclude(job_type=PUBLISH_JOB)
            .order_by("id")
            .values_list("pk", "job_type", "status")[: SHOWN_JOBS + 1]
        )
        if not found:
            return "-"
        lines = [
            format_html("{} {} ({})", job_type, change_link(self.admin_site, Job, pk, pk), status)
            for pk, job_type, status in found[:SHOWN_JOBS]
        ]
        if len(found) > SHOWN_JOBS:
            url = reverse("admin:pgoutbox_job_changelist") + f"?event={obj.pk}"
            lines.append(format_html('<a href="{}">all of them</a>', url))
        return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))

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

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Processed events. A pending one is still to be projected, and a dead one holds back
        its aggregate's later events: discard it instead (retention then deletes it)."""
        return queryset.filter(processed_at__isnull=False)

    def _dead_events(self, **fields: Any) -> Bulk:
        return Bulk(
            noun=("dead event", "dead events"),
            left_out=("is not dead", "are not dead"),
            gone=("was no longer dead", "were no longer dead"),
            since="dead_at",
            **fields,
        )

    def _redrive_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        return queryset.filter(dead_at__isnull=False, processed_at__isnull=True), self._dead_events(
            name="redrive",
            title="Re-drive dead events",
            explanation="These dead events become claimable again with a fresh attempt "
            "budget; the relay projects them, then their aggregates' later events.",
            verb="Re-drove",
            infinitive="re-drive",
            perform=lambda ids: control.redrive_dead_events(ids, using=alias),
        )

    def _discard_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        return queryset.filter(dead_at__isnull=False, processed_at__isnull=True), self._dead_events(
            name="discard",
            title="Discard dead events",
            explanation="These dead events are marked processed without being projected, "
            "so the later events of their aggregates go on.",
            verb="Discarded",
            infinitive="discard",
            perform=lambda ids: control.discard_dead_events(ids, using=alias),
        )

    buttons = (
        Button("redrive", "Re-drive", _redrive_plan),
        Button("discard", "Discard (mark processed)", _discard_plan),
    )

    @admin.action(description="Re-drive dead events", permissions=["change"])
    def redrive(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._redrive_plan(request, queryset))

    @admin.action(description="Discard dead events (mark processed)", permissions=["change"])
    def discard(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._discard_plan(request, queryset))


@admin.register(ScheduleCursor)
class ScheduleAdmin(ReadOnlyAdmin):
    list_display = ("name", "job", "spec", "last_slot_at", "next_slot")
    actions = ("run_now",)
    ordering = ("name",)
    sortable_by = ("name", "last_slot_at")  # one row per schedule: a small table

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The page, rendered with the schedules loaded once for it (not once per cell, nor
        once for the life of the process: the admin is one object that every request shares)."""
        token = _PAGE_SCHEDULES.set(load_schedules()[0])
        try:
            response = super().changelist_view(request, extra_context)
            render = getattr(response, "render", None)
            if render is not None:
                render()
            return response
        finally:
            _PAGE_SCHEDULES.reset(token)

    @property
    def _schedules(self) -> dict[str, Schedule]:
        loaded = _PAGE_SCHEDULES.get()
        return loaded if loaded is not None else load_schedules()[0]

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

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Cursors of schedules no longer configured (as this process loads them). A configured
        schedule without its cursor would start again from its latest slot."""
        return queryset.exclude(name__in=list(load_schedules()[0]))

    @admin.action(description="Run now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        schedules = self._schedules

        def perform(names: list[Any]) -> int:
            for name in names:
                scheduler.run_now(schedules[name])
            return len(names)

        return bulk_action(
            self,
            request,
            queryset.filter(name__in=list(schedules)),
            Bulk(
                name="run_now",
                title="Run schedules now",
                explanation="Each schedule's job is enqueued once now; its slots are unchanged.",
                noun=("schedule", "schedules"),
                verb="Ran",
                infinitive="run",
                left_out=("is not configured", "are not configured"),
                gone=("was no longer configured", "were no longer configured"),
                perform=perform,
            ),
        )
