"""The Django admin: dead letters one click from a fix, and every queue at a glance.

- Dead letters (jobs): filters by queue, job type and error code; search by id or idempotency
  key; pretty-printed payload; actions retry now, cancel and delete, each confirmed and logged.
- Jobs: every job, with an action that cancels them (running ones are asked to stop).
- Jobs, outbox events (with re-drive and discard for dead events), schedules (with "run now"):
  read-only changelists.
- An overview page (``admin/pgoutbox/job/overview/``): per queue, counts by state, oldest due age
  and a link to its dead letters; outbox lag; schedules due.

Changelists never count a big table: the paginator uses the planner's estimate, and the default
orderings follow an index (``id`` is a time-ordered UUIDv7, so "newest first" is a backward scan
of the primary key).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.paginator import Paginator
from django.db import connections, router
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from django_pgoutbox import control, metrics, scheduler
from django_pgoutbox.models import DeadLetter, Job, OutboxEvent, ScheduleCursor


class EstimatedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts with the planner's row estimate: no ``COUNT(*)`` over a million finished jobs."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet):
            return len(queryset)
        alias = queryset.db
        sql, params = queryset.order_by().values("pk").query.sql_with_params()
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


def _pretty_json(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap">{}</pre>',
        json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True),
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


class QueueFilter(admin.SimpleListFilter):
    """The configured queues, without a ``SELECT DISTINCT queue`` over a million rows."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        from django_pgoutbox.conf import get_settings

        return [(name, name) for name in get_settings().queues]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class _ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    paginator = EstimatedCountPaginator
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        hidden = set(self.exclude or ())  # shown pretty-printed by a readonly_fields method
        fields = [f.name for f in self.model._meta.fields if f.name not in hidden]
        return fields + list(self.readonly_fields)


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
    list_filter = (QueueFilter, "job_type", "last_error_code")
    search_help_text = "A job id, or an idempotency key."
    search_fields = ("idempotency_key",)
    ordering = ("-finished_at",)
    readonly_fields = ("pretty_payload",)
    actions = ("retry_now", "cancel", "delete_selected")
    exclude = ("payload",)

    @admin.display(description="error summary")
    def error(self, obj: Job) -> str:
        summary = obj.last_error_summary or ""
        return summary if len(summary) <= 120 else summary[:117] + "..."

    @admin.display(description="payload")
    def pretty_payload(self, obj: Job) -> str:
        return _pretty_json(obj.payload)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        import uuid

        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return queryset.filter(idempotency_key=term), False

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
    list_filter = ("status", QueueFilter)
    search_fields = ("idempotency_key",)
    search_help_text = "A job id, or an idempotency key."
    ordering = ("-id",)  # UUIDv7: newest first, straight from the primary key index
    readonly_fields = ("pretty_payload", "pretty_result")
    exclude = ("payload", "result")
    change_list_template = "admin/django_pgoutbox/job_change_list.html"
    get_search_results = DeadLetterAdmin.get_search_results
    actions = ("cancel_jobs",)

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
        return _pretty_json(obj.payload)

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> str:
        return _pretty_json(obj.result)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        overview = self.admin_site.admin_view(self.overview_view)
        return [path("overview/", overview, name="pgoutbox_overview"), *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

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


class EventStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("pending", "pending"), ("processed", "processed"), ("dead", "dead")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "pending":
            return queryset.filter(processed_at__isnull=True, dead_at__isnull=True)
        if self.value() == "processed":
            return queryset.filter(processed_at__isnull=False)
        if self.value() == "dead":
            return queryset.filter(processed_at__isnull=True, dead_at__isnull=False)
        return queryset


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
    list_filter = (EventStateFilter, "event_type")
    search_fields = ("event_type",)
    ordering = ("-id",)
    readonly_fields = ("pretty_payload",)
    exclude = ("payload",)
    actions = ("redrive", "discard")

    @admin.display(description="payload")
    def pretty_payload(self, obj: OutboxEvent) -> str:
        return _pretty_json(obj.payload)

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
