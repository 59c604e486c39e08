"""The workflows' pages: the list with each workflow's states, and a workflow's page with its
steps as a graph and a table, its cancel and the retry of a dead step, each confirmed first.

Every page is bounded whatever the workflow holds: the list counts at most ``SUMMARY_STEPS``
steps of each of its workflows, in one statement; a workflow's page is read and laid out within
the bounds of ``admin.workflow_pages``.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import connections, router
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from django_pgoutbox import control, queries
from django_pgoutbox.admin.bulk import Bulk, act_on
from django_pgoutbox.admin.common import ReadOnlyAdmin, SortableChangeList, breadcrumbs_as_list
from django_pgoutbox.admin.filters import newest
from django_pgoutbox.admin.workflow_pages import read_page, summary
from django_pgoutbox.models import FINISHED_STATUSES, Job, JobStatus, Workflow

#: The most steps of each workflow that the list counts by status (a workflow with more says
#: so, and its page counts them).
SUMMARY_STEPS = 1_000
#: A name search looks among this many of the newest workflows.
NAME_WINDOW = 50_000


class _WorkflowList(SortableChangeList):
    """Counts the states of the page's workflows in one statement, once the page's rows are
    read, and hangs them on each row."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        if not rows:
            return
        counts: dict[uuid.UUID, dict[str, int]] = {row.pk: {} for row in rows}
        with connections[self.queryset.db].cursor() as cursor:
            cursor.execute(queries.WORKFLOW_STATES, [[row.pk for row in rows], SUMMARY_STEPS + 1])
            for workflow_id, status, count in cursor.fetchall():
                counts[workflow_id][status] = count
        for row in rows:
            row.pgoutbox_states = counts[row.pk]


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyAdmin):
    list_display = ("name", "id", "created_at", "steps", "states")
    list_display_links = ("name",)
    search_fields = ("name",)
    search_help_text = (
        f"A workflow id, or a part of its name (among the newest {NAME_WINDOW:,} workflows)."
    )
    ordering = ("-created_at", "id")  # workflows_created_idx
    sortable_by = ()
    actions = None

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[SortableChangeList]:
        return _WorkflowList

    @admin.display(description="states")
    def states(self, obj: Workflow) -> str:
        counts: dict[str, int] = getattr(obj, "pgoutbox_states", {})
        if not counts:
            return "no step kept"
        text = summary(counts)
        if sum(counts.values()) > SUMMARY_STEPS:
            return f"over {SUMMARY_STEPS:,} steps: see its page"
        if counts.get(JobStatus.DEAD):
            return format_html('<strong class="errornote-text">{}</strong>', text)
        return text

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """An id through the primary key; else a part of the name, among the newest
        ``NAME_WINDOW`` workflows (no index holds the names)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            pass
        return newest(queryset.filter(name__icontains=term), NAME_WINDOW), False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def may_act(self, request: HttpRequest) -> bool:
        """Cancelling a workflow and retrying a step change jobs: the Jobs page's cancel's
        permission."""
        return request.user.has_perm("pgoutbox.change_job")

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        return [
            path(
                "<path:object_id>/cancel/",
                site.admin_view(self.cancel_view),
                name="pgoutbox_workflow_cancel",
            ),
            path(
                "<path:object_id>/retry/<str:job_id>/",
                site.admin_view(self.retry_view),
                name="pgoutbox_workflow_retry",
            ),
            *super().get_urls(),
        ]

    def _workflow(self, request: HttpRequest, object_id: str) -> Workflow:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            pk = uuid.UUID(unquote(object_id))
        except ValueError:
            raise Http404(f"{object_id[:60]!r} is not a workflow's id") from None
        found = self.get_queryset(request).filter(pk=pk).first()
        if found is None:
            raise Http404(f"no workflow {pk}")
        return cast(Workflow, found)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        workflow = self._workflow(request, object_id)
        page = read_page(workflow, self.admin_site, request)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Workflow {workflow.name}",
            "workflow": workflow,
            "page": page,
            "can_act": self.may_act(request),
            "cancel_url": reverse("admin:pgoutbox_workflow_cancel", args=[quote(workflow.pk)]),
            "history_url": reverse("admin:pgoutbox_workflow_history", args=[quote(workflow.pk)]),
            "opts": self.opts,
            "breadcrumbs_as_list": breadcrumbs_as_list(),
        }
        return TemplateResponse(request, "admin/django_pgoutbox/workflow.html", context)

    def _confirm(
        self,
        request: HttpRequest,
        workflow: Workflow,
        title: str,
        explanation: str,
        listed: list[str],
    ) -> HttpResponse:
        return TemplateResponse(
            request,
            "admin/django_pgoutbox/confirm_workflow_action.html",
            {
                **self.admin_site.each_context(request),
                "title": title,
                "explanation": explanation,
                "listed": listed,
                "workflow_url": _workflow_url(workflow),
                "opts": self.opts,
                "breadcrumbs_as_list": breadcrumbs_as_list(),
            },
        )

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the confirmation, with the number of steps not finished now. POST (confirmed):
        ``control.cancel_workflow``, then back to the workflow's page."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        workflow = self._workflow(request, object_id)
        if not self.may_act(request):
            raise PermissionDenied
        alias = router.db_for_write(Job)
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            try:
                done = control.cancel_workflow(
                    workflow.pk, using=alias, by=f"admin user {request.user}"
                )
            except Workflow.DoesNotExist:
                raise Http404(f"no workflow {workflow.pk}") from None
            _log(request, workflow, "Cancelled the workflow")
            message = f"Cancelled {done['cancelled']} steps of workflow {workflow.name}."
            if done["cancelling"]:
                message += (
                    f" {done['cancelling']} running steps were asked to stop: they end "
                    "cancelled when their handlers see ctx.cancelled."
                )
            self.message_user(request, message, messages.SUCCESS)
            return HttpResponseRedirect(_workflow_url(workflow))
        unfinished = (
            Job._base_manager.using(alias)
            .filter(workflow_id=workflow.pk)
            .exclude(status__in=FINISHED_STATUSES)
            .count()
        )
        if unfinished == 0:
            self.message_user(
                request,
                "Every step of this workflow has finished: nothing to cancel.",
                messages.WARNING,
            )
            return HttpResponseRedirect(_workflow_url(workflow))
        return self._confirm(
            request,
            workflow,
            f"Cancel workflow {workflow.name}",
            "Its steps not finished yet become cancelled and never run; running ones are "
            "asked to stop, and end cancelled. Finished steps are left as they are.",
            [
                f"{unfinished} steps not finished now (and any that finish meanwhile are left "
                "as they end)."
            ],
        )

    def retry_view(self, request: HttpRequest, object_id: str, job_id: str) -> HttpResponse:
        """GET: the confirmation. POST (confirmed): retry the step if it is still a dead step
        of this workflow (``control.retry_dead_jobs``, locked, checked and logged as the dead
        letters' retry is); the triggers of migration 0016 put back to waiting the steps that
        its death cancelled."""
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        workflow = self._workflow(request, object_id)
        if not self.may_act(request):
            raise PermissionDenied
        try:
            step_id = uuid.UUID(job_id)
        except ValueError:
            raise Http404(f"{job_id[:60]!r} is not a job's id") from None
        alias = router.db_for_write(Job)
        rows = Job._base_manager.using(alias).filter(
            pk=step_id, workflow_id=workflow.pk, status=JobStatus.DEAD
        )
        found = rows.values_list("pk", "step").first()
        if found is None:
            steps = Job._base_manager.using(alias).filter(workflow_id=workflow.pk)
            if not steps.filter(pk=step_id).exists():
                raise Http404(f"no step {step_id} in workflow {workflow.pk}")
            self.message_user(
                request, f"Step {step_id} is not dead: nothing was done.", messages.WARNING
            )
            return HttpResponseRedirect(_workflow_url(workflow))
        step = found[1] or str(step_id)
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            action = Bulk(
                name="retry_step",
                title="Retry a dead step",
                explanation="",
                noun=("dead step", "dead steps"),
                verb="Retried",
                infinitive="retry",
                left_out=("is not dead", "are not dead"),
                gone=("was no longer dead", "were no longer dead"),
                perform=lambda ids: control.retry_dead_jobs(ids, using=alias),
            )
            if act_on(request, rows, action):
                self.message_user(
                    request,
                    f"Retried step {step}: the steps its death cancelled wait again.",
                    messages.SUCCESS,
                )
            else:
                self.message_user(
                    request, f"Step {step} was no longer dead: nothing was done.", messages.WARNING
                )
            return HttpResponseRedirect(_workflow_url(workflow))
        return self._confirm(
            request,
            workflow,
            f"Retry step {step}",
            "The step goes back to its queue, due now, with its attempts reset to zero (its "
            "handler must be idempotent). The steps that its death cancelled wait for it again.",
            [f"{step} ({step_id})"],
        )


def _workflow_url(workflow: Workflow) -> str:
    return reverse("admin:pgoutbox_workflow_change", args=[quote(workflow.pk)])


def _log(request: HttpRequest, workflow: Workflow, message: str) -> None:
    LogEntry.objects.log_actions(
        user_id=cast(int, request.user.pk),
        queryset=[workflow],
        action_flag=CHANGE,
        change_message=message,
    )
