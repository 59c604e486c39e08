"""The dead letters' and the jobs' pages."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import Model, Q, QuerySet
from django.db.models.fields.json import KeyTextTransform
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from django_pgoutbox import control, queries, queue_controls, queue_minutes, scheduler
from django_pgoutbox import gauges as db_gauges
from django_pgoutbox.admin.attempts import last_error_and_attempts
from django_pgoutbox.admin.bulk import Bulk, bulk_action
from django_pgoutbox.admin.buttons import Button, ButtonsAdmin
from django_pgoutbox.admin.causes import CauseFilter, cause_urls
from django_pgoutbox.admin.charts import queue_charts, window
from django_pgoutbox.admin.common import (
    breadcrumbs_as_list,
    change_link,
    json_preview,
)
from django_pgoutbox.admin.filters import (
    DeadJobTypeFilter,
    ErrorCodeFilter,
    FromEventFilter,
    JobQueueFilter,
    JobTypeFilter,
    MaintenanceFilter,
    QueueFilter,
    StatusFilter,
    newest,
)
from django_pgoutbox.admin.queues import queue_action, queue_row
from django_pgoutbox.admin.workflow_pages import is_step, relatives, workflow_link
from django_pgoutbox.models import (
    CLAIMABLE_STATUSES,
    FINISHED_STATUSES,
    DeadLetter,
    Job,
    JobStatus,
    OutboxEvent,
)
from django_pgoutbox.publishers import PUBLISH_JOB
from django_pgoutbox.registry import registered_jobs
from django_pgoutbox.schedules import BUILTIN_SCHEDULES, load_schedules
from django_pgoutbox.uniqueness import states_named
from django_pgoutbox.validation import short_repr

#: A key search that finds no job of no organization and of a known job type looks among this
#: many of the newest jobs.
KEY_WINDOW = 50_000


def _job_search(queryset: QuerySet[Any], search_term: str) -> tuple[QuerySet[Any], bool]:
    """A job id, ``sequence:KEY`` (the jobs of a sequence not finished yet, from
    ``jobs_sequence_tail_idx``), else an idempotency key.

    ``jobs_idempotency_uq`` leads with the organization and the job type: a key alone is found
    only by reading the whole index (half a second at ten million jobs, for the count and again
    for the rows). So the key is looked for first among the jobs of no organization and of a job
    type this process knows (one descent of the index per type), and, only if none is found
    there, among the newest ``KEY_WINDOW`` jobs (a job of an organization: search older ones by
    their id).
    """
    term = search_term.strip()
    if not term:
        return queryset, False
    try:
        return queryset.filter(pk=uuid.UUID(term)), False
    except ValueError:
        pass
    if term.startswith("sequence:"):
        return queryset.filter(sequence_key=term.removeprefix("sequence:")).exclude(
            status__in=[JobStatus.COMPLETED, JobStatus.CANCELLED]
        ), False
    known = sorted({*registered_jobs(), *(entry["JOB"] for entry in BUILTIN_SCHEDULES.values())})
    likely = queryset.filter(organization_id=None, job_type__in=known, idempotency_key=term)
    if likely.exists():
        return likely, False
    return newest(queryset.filter(idempotency_key=term), KEY_WINDOW), False


def progress_text(progress: Any, *, with_message: bool) -> str:
    """``jobs.progress`` in a line: ``3 / 10 (30%)``, ``3`` when the total is unknown, then the
    message if asked; "-" for none. The row is read as written by anyone: nothing is assumed."""
    try:
        if not isinstance(progress, dict) or "done" not in progress:
            return "-" if progress is None else short_repr(progress)
        done, total = progress.get("done"), progress.get("total")
        text = short_repr(done)
        if total is not None:
            text += f" / {short_repr(total)}"
            if isinstance(done, int | float) and isinstance(total, int | float) and total > 0:
                text += f" ({100 * done / total:.0f}%)"
        message = progress.get("message")
        if with_message and message:
            text += f": {message}"
        return text
    except (ValueError, OverflowError):  # numbers past what Python turns into text or floats
        return short_repr(progress)


class _JobPage(ButtonsAdmin):
    """A job's detail page: its times in the order they happen, the whole error, the payload
    and the result pretty-printed, and the event it came from: the one whose subscriber enqueued
    it, or the one that a publisher's job sends."""

    readonly_fields: ClassVar[tuple[str, ...]] = (
        "event",
        "unique",
        "workflow",
        "parents",
        "children",
        "attempts_and_errors",
        "pretty_payload",
        "pretty_result",
        "progress_shown",
        "pretty_meta",
        "base_priority_shown",
    )
    exclude = (
        "payload",
        "result",
        "attempt_log",
        "last_error_code",
        "last_error_summary",
        "progress",
        "meta",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "job_type",
                    "queue",
                    "status",
                    "event",
                    "organization_id",
                    "idempotency_key",
                    "priority",
                    "base_priority_shown",
                )
            },
        ),
        ("Uniqueness", {"fields": ("unique",)}),
        ("Workflow", {"fields": ("workflow", "parents", "children")}),
        ("Sequence", {"fields": ("sequence_key", "sequence_position")}),
        (
            "Attempts",
            {
                "fields": (
                    "attempts",
                    "max_attempts",
                    "lost_attempts",
                    "alone_attempt",
                    "locked_by",
                    "worker_ids",
                )
            },
        ),
        (
            "Times",
            {
                "fields": (
                    "created_at",
                    "run_at",
                    "locked_at",
                    "lease_expires_at",
                    "cancel_requested_at",
                    "completed_at",
                    "finished_at",
                )
            },
        ),
        ("Progress and metadata", {"fields": ("progress_shown", "pretty_meta")}),
        ("Errors and attempts", {"fields": ("attempts_and_errors",)}),
        ("Payload and result", {"fields": ("pretty_payload", "pretty_result")}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """The event only on a job that came from one; the workflow only on a step, a job
        that waited for others or one that others wait for."""
        first, *rest = self.fieldsets
        if not (isinstance(obj, Job) and is_step(obj)):
            rest = [(name, options) for name, options in rest if name != "Workflow"]
        if not (isinstance(obj, Job) and obj.unique_key is not None):
            rest = [(name, options) for name, options in rest if name != "Uniqueness"]
        if not (isinstance(obj, Job) and obj.sequence_key is not None):
            rest = [(name, options) for name, options in rest if name != "Sequence"]
        if isinstance(obj, Job) and (obj.event_id is not None or obj.job_type == PUBLISH_JOB):
            return (first, *rest)
        fields = tuple(name for name in first[1]["fields"] if name != "event")
        return ((first[0], {**first[1], "fields": fields}), *rest)

    @admin.display(description="unique key")
    def unique(self, obj: Job) -> str:
        """The key of a unique job, and the states in which it holds it (docs/uniqueness.md)."""
        if obj.unique_key is None:
            return "-"
        held = ", ".join(states_named(obj.unique_states)) or "none"
        return f"{obj.unique_key} (held while {held})"

    @admin.display(description="workflow")
    def workflow(self, obj: Job) -> str:
        return workflow_link(self.admin_site, obj)

    @admin.display(description="waits for")
    def parents(self, obj: Job) -> str:
        """The jobs it waits (or waited) for: the first 20, with their statuses."""
        return relatives(self.admin_site, obj, queries.JOB_PARENTS)

    @admin.display(description="waited for by")
    def children(self, obj: Job) -> str:
        """The jobs that wait (or waited) for it: the first 20, with their statuses."""
        return relatives(self.admin_site, obj, queries.JOB_CHILDREN)

    @admin.display(description="event")
    def event(self, obj: Job) -> str:
        """The event whose subscriber enqueued the job (``event_id``); else the event in a
        publisher's job's payload (``{"event": <id>}``, a job enqueued before the column was),
        read alone."""
        event_id = obj.event_id
        if event_id is None:
            found = (
                Job._base_manager.using(obj._state.db)
                .filter(pk=obj.pk)
                .values_list(KeyTextTransform("event", "payload"), flat=True)
                .first()
            )
            try:
                event_id = uuid.UUID(str(found))
            except ValueError:
                return "-"
        alias = router.db_for_read(OutboxEvent)
        if not OutboxEvent._base_manager.using(alias).filter(pk=event_id).exists():
            return f"{event_id} (no longer kept)"
        return change_link(self.admin_site, OutboxEvent, event_id, event_id)

    @admin.display(description="errors and attempts")
    def attempts_and_errors(self, obj: Job) -> str:
        """The last error in full (on a completed job: a previous failure), then every
        attempt kept."""
        return last_error_and_attempts(obj)

    @admin.display(description="payload")
    def pretty_payload(self, obj: Job) -> str:
        return json_preview(obj, "payload")

    @admin.display(description="result")
    def pretty_result(self, obj: Job) -> str:
        return json_preview(obj, "result")

    @admin.display(description="priority before aging")
    def base_priority_shown(self, obj: Job) -> str:
        """The priority the job was enqueued with, if priority aging raised it since."""
        if obj.base_priority is None:
            return "the same: not raised by priority aging"
        return f"{obj.base_priority} (raised to {obj.priority} by priority aging)"

    @admin.display(description="progress")
    def progress_shown(self, obj: Job) -> str:
        """What the handler said last (``ctx.set_progress()``): done of total, its message."""
        return progress_text(obj.progress, with_message=True)

    @admin.display(description="metadata")
    def pretty_meta(self, obj: Job) -> str:
        return json_preview(obj, "meta")


@admin.register(DeadLetter)
class DeadLetterAdmin(_JobPage):
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
    list_filter = (QueueFilter, DeadJobTypeFilter, ErrorCodeFilter, CauseFilter)
    change_list_template = "admin/django_pgoutbox/dead_letter_change_list.html"
    search_help_text = "A job id, sequence:KEY (a sequence's jobs), or an idempotency key."
    search_fields = ("idempotency_key",)
    ordering = ("-finished_at",)
    sortable_by = ("finished_at",)
    heavy_fields = ("payload", "result", "worker_ids", "attempt_log", "meta")
    actions = ("retry_now", "cancel", "skip", "delete_selected")
    readonly_fields = (*_JobPage.readonly_fields, "cause")

    def get_fieldsets(self, request: HttpRequest, obj: Model | None = None) -> Any:
        """A job's, with the dead letter's cause before its errors and attempts."""
        return [
            (name, {**options, "fields": ("cause", *options["fields"])})
            if name == "Errors and attempts"
            else (name, options)
            for name, options in super().get_fieldsets(request, obj)
        ]

    @admin.display(description="cause")
    def cause(self, obj: Job) -> str:
        """The dead letter's cause, a link to the dead letters of that cause."""
        if obj.dead_cause is None or obj.status != JobStatus.DEAD:
            return "-"
        url = reverse("admin:pgoutbox_deadletter_changelist") + f"?cause={obj.dead_cause}"
        causes = reverse("admin:pgoutbox_dead_causes") + f"#cause-{obj.dead_cause}"
        return format_html(
            '<a href="{}">{}</a>: the dead letters of this cause (<a href="{}">all causes</a>)',
            url,
            obj.dead_cause,
            causes,
        )

    @admin.display(description="error summary")
    def error(self, obj: Job) -> str:
        summary = obj.last_error_summary or ""
        return summary if len(summary) <= 120 else summary[:117] + "..."

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return _job_search(queryset, search_term)

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Dead letters may be deleted, one or many (this page's own delete action)."""
        if obj is None:
            return admin.ModelAdmin.has_delete_permission(self, request)
        return super().has_delete_permission(request, obj)

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(status=JobStatus.DEAD)

    def get_urls(self) -> list[Any]:
        return [*cause_urls(self), *super().get_urls()]

    def _dead_letters(self, **fields: Any) -> Bulk:
        return Bulk(
            noun=("dead letter", "dead letters"),
            left_out=fields.pop("left_out", ("is not dead", "are not dead")),
            gone=fields.pop("gone", ("was no longer dead", "were no longer dead")),
            since="finished_at",
            **fields,
        )

    def _retry_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        return queryset, self._dead_letters(
            name="retry_now",
            title="Retry dead letters",
            explanation="These jobs go back to their queue, due now, with their attempts "
            "reset to zero. Their handlers must be idempotent.",
            verb="Retried",
            infinitive="retry",
            perform=lambda ids: control.retry_dead_jobs(ids, using=alias),
            # a unique job stays dead while another job holds its key
            gone=(
                "was no longer dead or had its unique key taken",
                "were no longer dead or had their unique keys taken",
            ),
        )

    def _cancel_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        return queryset, self._dead_letters(
            name="cancel",
            title="Cancel dead letters",
            explanation="These jobs become cancelled: they never run again, and retention "
            "deletes them with the other finished jobs.",
            verb="Cancelled",
            infinitive="cancel",
            perform=lambda ids: control.cancel_dead_jobs(ids, using=alias),
        )

    def _skip_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        who = getattr(request.user, "get_username", lambda: "?")()
        # Only a sequence's job: for any other, Cancel does the same, and the button would
        # only add a choice that means nothing there.
        return queryset.filter(sequence_key__isnull=False), self._dead_letters(
            name="skip",
            left_out=("is not in a sequence", "are not in a sequence"),
            title="Skip dead letters",
            explanation="These jobs become cancelled (code skipped) and never run again; the "
            "next job of each one's sequence then runs. A dead job holds its sequence until "
            "it is retried or skipped.",
            verb="Skipped",
            infinitive="skip",
            perform=lambda ids: control.skip_dead_jobs(
                ids, reason="skipped in the admin", by=f"admin user {who}", using=alias
            ),
        )

    buttons = (
        Button("retry", "Retry now", _retry_plan),
        Button("cancel", "Cancel", _cancel_plan),
        Button("skip", "Skip", _skip_plan),
    )

    @admin.action(description="Retry now (fresh attempt budget)", permissions=["change"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._retry_plan(request, queryset))

    @admin.action(description="Cancel (never run again)", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._cancel_plan(request, queryset))

    @admin.action(description="Skip (let its sequence go on)", permissions=["change"])
    def skip(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._skip_plan(request, queryset))

    def after_pressing(self, request: HttpRequest, pk: Any) -> str:
        """A dead letter retried or cancelled is a job that is no longer dead: its job's page."""
        if self.get_queryset(request).filter(pk=pk).exists():
            return super().after_pressing(request, pk)
        job_admin = self.admin_site._registry.get(Job)
        if job_admin is not None and job_admin.has_view_permission(request):
            return reverse(f"{self.admin_site.name}:pgoutbox_job_change", args=[pk])
        return super().after_pressing(request, pk)

    @admin.action(description="Delete", permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        """Django's own ``delete_selected`` lists every row on its page and deletes by id; this
        one is chunked and deletes only rows still dead."""
        alias = queryset.db

        def perform(ids: list[Any]) -> int:
            rows = Job.objects.using(alias).filter(pk__in=ids, status=JobStatus.DEAD)
            deleted: int = rows.delete()[0]
            return deleted

        return bulk_action(
            self,
            request,
            queryset,
            self._dead_letters(
                name="delete_selected",
                title="Delete dead letters",
                explanation="These jobs are deleted, with their payloads and errors; only the "
                "admin log keeps their names. Cancel instead keeps them until retention "
                "deletes them with the other finished jobs.",
                verb="Deleted",
                infinitive="delete",
                perform=perform,
                log_flag=DELETION,
            ),
        )


@admin.register(Job)
class JobAdmin(_JobPage):
    list_display = (
        "id",
        "job_type",
        "queue",
        "status",
        "priority",
        "attempts",
        "progress_column",
        "run_at",
        "created_at",
    )
    list_filter = (StatusFilter, JobQueueFilter, JobTypeFilter, MaintenanceFilter, FromEventFilter)
    search_fields = ("idempotency_key",)
    search_help_text = "A job id, or an idempotency key."
    ordering = ("-id",)  # UUIDv7: newest first, straight from the primary key index
    sortable_by = ("id",)
    heavy_fields = (
        "payload",
        "result",
        "worker_ids",
        "last_error_summary",
        "attempt_log",
        "meta",
    )
    change_list_template = "admin/django_pgoutbox/job_change_list.html"
    actions = ("cancel_jobs",)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return _job_search(queryset, search_term)

    @admin.display(description="progress")
    def progress_column(self, obj: Job) -> str:
        return progress_text(obj.progress, with_message=False)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        """Cancelling changes jobs, though the admin never edits one."""
        opts = self.model._meta
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Finished jobs: completed, cancelled, dead. Retention deletes the first two anyway."""
        return queryset.filter(status__in=FINISHED_STATUSES)

    def _cancel_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db

        def perform(ids: list[Any]) -> int:
            states = control.cancel_jobs(ids, using=alias, by=f"admin user {request.user}")
            return sum(1 for state in states.values() if state in ("cancelled", "cancelling"))

        # Not "exclude finished": this OR is what the partial indexes of both answer.
        return queryset.filter(
            Q(status__in=CLAIMABLE_STATUSES) | Q(status__in=(JobStatus.LEASED, JobStatus.WAITING))
        ), Bulk(
            name="cancel_jobs",
            title="Cancel jobs",
            explanation="Jobs not running yet become cancelled and never run. Running jobs "
            "are asked to stop: their handlers see ctx.cancelled, and they end cancelled. "
            "Finished jobs are left as they are.",
            noun=("job", "jobs"),
            verb="Cancelled",
            infinitive="cancel",
            left_out=("has finished", "have finished"),
            gone=("had finished", "had finished"),
            perform=perform,
            since="created_at",
        )

    buttons = (Button("cancel", "Cancel", _cancel_plan, permission="cancel"),)

    @admin.action(description="Cancel (running ones are asked to stop)", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._cancel_plan(request, queryset))

    def pressed_message(self, action: Bulk, pk: Any) -> str:
        running = Job._base_manager.filter(pk=pk, status=JobStatus.LEASED).exists()
        if running:
            return (
                f"Job {pk} is running: it was asked to stop, and ends cancelled when its "
                "handler sees ctx.cancelled."
            )
        return super().pressed_message(action, pk)

    @admin.display(description="errors and attempts")
    def attempts_and_errors(self, obj: Job) -> str:
        return last_error_and_attempts(obj)

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        overview = self.admin_site.admin_view(self.overview_view)
        act = self.admin_site.admin_view(self.queue_action_view)
        return [
            path("overview/", overview, name="pgoutbox_overview"),
            path("overview/queue/<str:name>/<str:action>/", act, name="pgoutbox_queue_action"),
            *super().get_urls(),
        ]

    def queue_action_view(self, request: HttpRequest, name: str, action: str) -> HttpResponse:
        return queue_action(self, request, name, action)

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        gauges = db_gauges.database_gauges(router.db_for_read(Job))
        holder = db_gauges.horizon_holder(router.db_for_read(Job))
        dead_url = reverse("admin:pgoutbox_deadletter_changelist")
        statuses, controls_problem = queue_controls.statuses_for_monitoring(router.db_for_read(Job))
        if controls_problem:
            self.message_user(request, controls_problem, messages.WARNING)
        hours = window(request.GET.get("hours"))
        minutes = queue_minutes.recent_minutes(hours, using=router.db_for_read(Job))
        rows = [
            {
                "gauges": g,
                "dead_url": f"{dead_url}?queue={g.queue}",
                **(queue_row(statuses[g.queue]) if g.queue in statuses else {}),
            }
            for g in gauges.queues.values()
        ]
        schedules, problems = load_schedules()
        now = scheduler.database_now(router.db_for_read(Job))
        cursors = scheduler.cursors()
        schedule_rows = []
        for name, entry in sorted(schedules.items()):
            last = cursors.get(name)
            latest = entry.latest_due(now)
            schedule_rows.append(
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
            "queues": rows,
            "activity": [
                {"queue": name, "charts": queue_charts(points, hours)}
                for name, points in minutes.items()
            ],
            "hours": hours,
            "windows": queue_minutes.WINDOWS,
            "can_change": self.has_cancel_permission(request),
            "controls_unknown": bool(controls_problem),
            "gauges": gauges,
            "horizon": holder,
            "horizon_warnings": db_gauges.horizon_warnings(holder),
            "schedules": schedule_rows,
            "schedule_problems": problems,
            "causes_url": reverse("admin:pgoutbox_dead_causes"),
            "now": timezone.now(),
            "opts": self.model._meta,
            "breadcrumbs_as_list": breadcrumbs_as_list(),
        }
        return TemplateResponse(request, "admin/django_pgoutbox/overview.html", context)
