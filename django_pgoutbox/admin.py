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
- Bulk actions act on every selected row, ``CHUNK`` ids per statement, each chunk locked, checked
  and logged in a transaction of its own; a row that changed since the confirmation page is left
  alone and counted in the message. "Select all" acts on the rows that matched the filters when
  the confirmation page was shown, and only with the signed confirmation of that page.
- Nothing unfinished is deleted: jobs once finished, events once processed, cursors once their
  schedule is gone. Detail pages are read-only: a save would write back a copy that a worker may
  have changed since.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from math import ceil
from typing import Any, ClassVar, cast

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.views.main import ChangeList
from django.core import signing
from django.core.exceptions import EmptyResultSet, PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import connections, router, transaction
from django.db.models import Model, Q, QuerySet, TextField
from django.db.models.functions import Cast, Left, Length
from django.forms import BooleanField
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html

from django_pgoutbox import control, metrics, outbox, scheduler
from django_pgoutbox.conf import get_settings
from django_pgoutbox.models import (
    CLAIMABLE_STATUSES,
    FINISHED_STATUSES,
    DeadLetter,
    Job,
    JobStatus,
    OutboxEvent,
    ScheduleCursor,
)
from django_pgoutbox.registry import registered_jobs

#: Ids per statement of a bulk action (and rows per transaction).
CHUNK = 500
#: Rows that a confirmation page names; it gives the exact count of all of them.
LISTED = 100
#: The newest dead letters of each configured queue that the dead letters' filters read to offer
#: job types and error codes (an index scan of ``jobs_dead_idx`` each).
SAMPLE = 200
#: The deepest page a changelist serves: page N reads N x 100 rows before its own.
MAX_PAGE = 100
#: The most of a payload or a result that a detail page shows (characters of its JSON).
PREVIEW_CHARS = 256 * 1024

_CONFIRMATION_SALT = "django_pgoutbox.admin.select-across"


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
        try:
            return _pretty_json(json.loads(head))
        except (ValueError, RecursionError):  # a 5,000-digit number, arrays 5,000 deep
            return format_html('<pre style="white-space: pre-wrap">{}</pre>', head)
    return format_html(
        '<p>{} characters of JSON; the first {} are shown.</p><pre style="white-space: pre-wrap">'
        "{}</pre>",
        f"{size:,}",
        f"{PREVIEW_CHARS:,}",
        head,
    )


def _counted(count: int, noun: tuple[str, str]) -> str:
    return f"{count} {noun[0] if count == 1 else noun[1]}"


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


# -- bulk actions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Bulk:
    """One bulk action: what it says, what it does to a chunk of ids, what it logs."""

    name: str  # the action's name, as the changelist posts it
    title: str  # the confirmation page's title; also each admin log entry's message
    explanation: str
    noun: tuple[str, str]  # what it acts on: ("dead letter", "dead letters")
    verb: str  # "Retried"
    infinitive: str  # "retry"
    # Why a selected row is left out at confirmation ("is not dead", "are not dead"), and why it
    # was left alone afterwards ("was no longer dead", "were no longer dead").
    left_out: tuple[str, str]
    gone: tuple[str, str]
    perform: Callable[[list[Any]], int]  # acts on locked rows' ids; returns how many it changed
    # With "select all": the column that a row gets when it enters the set (a job's finished_at
    # when it dies). Rows whose value is later than the confirmation page are left out.
    since: str | None = None
    log_flag: int = CHANGE


def _select_across(request: HttpRequest) -> bool:
    """Whether "select all N" was chosen, read as Django's action form reads it."""
    return bool(BooleanField(required=False).to_python(request.POST.get("select_across")))


def _bulk(
    modeladmin: _ReadOnly, request: HttpRequest, eligible: QuerySet[Any], action: _Bulk
) -> HttpResponse | None:
    """Confirm, then act on every row of ``eligible`` (the selection, less the rows that
    ``action`` does not apply to), ``CHUNK`` at a time."""
    if request.POST.get("confirmed") != "yes":
        return _ask(modeladmin, request, eligible, action)
    if _select_across(request):
        confirmed = _confirmation(modeladmin, request, action)
        if confirmed is None:
            modeladmin.message_user(
                request,
                "This confirmation does not match its page (the filters or the action changed): "
                "nothing was done. Select the rows again.",
                messages.ERROR,
            )
            return None
        as_of, expected = confirmed
        rows = _since(eligible, action, as_of)
    else:
        rows = eligible  # Django filtered it to the posted ids
        expected = len(set(request.POST.getlist(ACTION_CHECKBOX_NAME)))
    done = _perform(request, rows, action)
    message = f"{action.verb} {_counted(done, action.noun)}."
    skipped = expected - done
    if skipped > 0:
        left = "was left as it is" if skipped == 1 else "were left as they are"
        message = (
            f"{action.verb} {_counted(done, action.noun)}; {skipped} of the {expected} confirmed "
            f"{action.gone[skipped != 1]} and {left}."
        )
    modeladmin.message_user(
        request, message, messages.SUCCESS if skipped <= 0 else messages.WARNING
    )
    return None


def _since(rows: QuerySet[Any], action: _Bulk, as_of: datetime | None) -> QuerySet[Any]:
    if action.since is None or as_of is None:
        return rows
    return rows.filter(**{f"{action.since}__lte": as_of})


def _ask(
    modeladmin: _ReadOnly, request: HttpRequest, eligible: QuerySet[Any], action: _Bulk
) -> HttpResponse | None:
    select_across = _select_across(request)
    token = None
    left_out = ""
    ids: list[Any] = []
    if select_across:
        as_of = scheduler.database_now(eligible.db) if action.since else None
        rows = _since(eligible, action, as_of)
        count = rows.count()
        token = signing.dumps(
            [
                modeladmin.opts.label_lower,
                action.name,
                request.GET.urlencode(),
                as_of.isoformat() if as_of else None,
                count,
            ],
            salt=_CONFIRMATION_SALT,
        )
    else:
        rows = eligible
        ids = list(eligible.order_by().values_list("pk", flat=True))  # at most the posted ids
        count = len(ids)
        posted = len(set(request.POST.getlist(ACTION_CHECKBOX_NAME)))
        if posted > count:
            extra = posted - count
            left_out = (
                f"{extra} of the {posted} selected rows {action.left_out[extra != 1]}: "
                f"{'it is' if extra == 1 else 'they are'} left out."
            )
    if count == 0:
        modeladmin.message_user(
            request,
            f"No {action.noun[1]} to {action.infinitive} among the selected rows: "
            "nothing was done.",
            messages.WARNING,
        )
        return None
    listed = list(rows[:LISTED])
    return TemplateResponse(
        request,
        "admin/django_pgoutbox/confirm_action.html",
        {
            **modeladmin.admin_site.each_context(request),
            "title": action.title,
            "explanation": action.explanation,
            "left_out": left_out,
            "count": count,
            "noun": action.noun[0] if count == 1 else action.noun[1],
            "objects": listed,
            "more": count - len(listed),
            # With "select all", Django needs one id to take the confirmation as an action.
            "ids": [obj.pk for obj in listed[:1]] if select_across else ids,
            "select_across": select_across,
            "confirmation": token,
            "action": action.name,
            "opts": modeladmin.model._meta,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        },
    )


def _confirmation(
    modeladmin: _ReadOnly, request: HttpRequest, action: _Bulk
) -> tuple[datetime | None, int] | None:
    """The moment and the count of the confirmation page that this POST answers, if it is one
    of this action on this page with these filters."""
    try:
        page, name, query, as_of, count = signing.loads(
            request.POST.get("confirmation", ""), salt=_CONFIRMATION_SALT
        )
        moment = datetime.fromisoformat(as_of) if as_of is not None else None
    except (signing.BadSignature, TypeError, ValueError):
        return None
    if (page, name, query) != (modeladmin.opts.label_lower, action.name, request.GET.urlencode()):
        return None
    return (moment, count) if isinstance(count, int) else None


def _perform(request: HttpRequest, rows: QuerySet[Any], action: _Bulk) -> int:
    """Act on ``rows`` a chunk at a time; each chunk locks the rows that still qualify (a row
    that changed since is left out), acts on them and logs them, in one transaction."""
    alias = rows.db
    done = 0
    for chunk in _chunks(rows):
        with transaction.atomic(using=alias):
            locked = list(rows.filter(pk__in=chunk).order_by("pk").select_for_update())
            if not locked:
                continue
            if action.log_flag == DELETION:
                _log(request, locked, action)  # while the rows are there to be named
            done += action.perform([obj.pk for obj in locked])
            if action.log_flag != DELETION:
                _log(request, locked, action)
    return done


def _chunks(rows: QuerySet[Any]) -> Iterator[list[Any]]:
    """The ids of ``rows``, ``CHUNK`` at a time, from one read (a server-side cursor)."""
    ids = rows.order_by().values_list("pk", flat=True).iterator(chunk_size=CHUNK)
    while chunk := list(islice(ids, CHUNK)):
        yield chunk


def _log(request: HttpRequest, objects: list[Model], action: _Bulk) -> None:
    """One admin log entry per row ("Recent actions", ``django_admin_log``): who did what."""
    LogEntry.objects.log_actions(
        user_id=cast(int, request.user.pk),
        queryset=objects,
        action_flag=action.log_flag,
        change_message=action.title,
    )


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

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Actions need the change permission; a detail page never saves, since it would write
        back the copy it read over what a worker or the relay wrote since."""
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Only a finished row, from its own page: no bulk delete (``delete_selected``) here."""
        return (
            obj is not None
            and super().has_delete_permission(request, obj)
            and self.deletable_rows(self.model._base_manager.filter(pk=obj.pk)).exists()
        )

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The rows of ``queryset`` that may be deleted: none, unless a page says otherwise."""
        return queryset.none()

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        """Delete ``obj`` only if it still may be: the row is locked and checked again."""
        alias = obj._state.db or router.db_for_write(self.model)
        with transaction.atomic(using=alias):
            rows = self.model._base_manager.using(alias).filter(pk=obj.pk)
            if not list(self.deletable_rows(rows).select_for_update().values_list("pk")):
                raise PermissionDenied(f"{obj} may no longer be deleted")
            super().delete_model(request, obj)

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

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Django filters by the posted ids before an action runs, and a malformed one is a
        # server error there; a user without access gets Django's 403 instead of this message.
        if request.method == "POST" and self.has_view_or_change_permission(request):
            for value in request.POST.getlist(ACTION_CHECKBOX_NAME):
                try:
                    self.model._meta.pk.to_python(value)
                except ValidationError:
                    self.message_user(
                        request,
                        f"{_short(value)} is not a valid id: nothing was done.",
                        messages.ERROR,
                    )
                    return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)

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

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Dead letters may be deleted, one or many (this page's own delete action)."""
        if obj is None:
            return admin.ModelAdmin.has_delete_permission(self, request)
        return super().has_delete_permission(request, obj)

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(status=JobStatus.DEAD)

    def _dead_letters(self, **fields: Any) -> _Bulk:
        return _Bulk(
            noun=("dead letter", "dead letters"),
            left_out=("is not dead", "are not dead"),
            gone=("was no longer dead", "were no longer dead"),
            since="finished_at",
            **fields,
        )

    @admin.action(description="Retry now (fresh attempt budget)", permissions=["change"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        alias = queryset.db
        return _bulk(
            self,
            request,
            queryset,
            self._dead_letters(
                name="retry_now",
                title="Retry dead letters",
                explanation="These jobs go back to their queue, due now, with their attempts "
                "reset to zero. Their handlers must be idempotent.",
                verb="Retried",
                infinitive="retry",
                perform=lambda ids: control.retry_dead_jobs(ids, using=alias),
            ),
        )

    @admin.action(description="Cancel (never run again)", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        alias = queryset.db
        return _bulk(
            self,
            request,
            queryset,
            self._dead_letters(
                name="cancel",
                title="Cancel dead letters",
                explanation="These jobs become cancelled: they never run again, and retention "
                "deletes them with the other finished jobs.",
                verb="Cancelled",
                infinitive="cancel",
                perform=lambda ids: control.cancel_dead_jobs(ids, using=alias),
            ),
        )

    @admin.action(description="Delete", permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        """Django's own ``delete_selected`` lists every row on its page and deletes by id; this
        one is chunked and deletes only rows still dead."""
        alias = queryset.db

        def perform(ids: list[Any]) -> int:
            rows = Job.objects.using(alias).filter(pk__in=ids, status=JobStatus.DEAD)
            deleted: int = rows.delete()[0]
            return deleted

        return _bulk(
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

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Finished jobs: completed, cancelled, dead. Retention deletes the first two anyway."""
        return queryset.filter(status__in=FINISHED_STATUSES)

    @admin.action(description="Cancel (running ones are asked to stop)", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        alias = queryset.db

        def perform(ids: list[Any]) -> int:
            states = control.cancel_jobs(ids, using=alias, by=f"admin user {request.user}")
            return sum(1 for state in states.values() if state in ("cancelled", "cancelling"))

        return _bulk(
            self,
            request,
            # Not "exclude finished": this OR is what the partial indexes of both answer.
            queryset.filter(Q(status__in=CLAIMABLE_STATUSES) | Q(status=JobStatus.LEASED)),
            _Bulk(
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
            ),
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

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Processed events. A pending one is still to be projected, and a dead one holds back
        its aggregate's later events: discard it instead (retention then deletes it)."""
        return queryset.filter(processed_at__isnull=False)

    def _dead_events(self, **fields: Any) -> _Bulk:
        return _Bulk(
            noun=("dead event", "dead events"),
            left_out=("is not dead", "are not dead"),
            gone=("was no longer dead", "were no longer dead"),
            since="dead_at",
            **fields,
        )

    @admin.action(description="Re-drive dead events", permissions=["change"])
    def redrive(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        alias = queryset.db
        return _bulk(
            self,
            request,
            queryset.filter(dead_at__isnull=False, processed_at__isnull=True),
            self._dead_events(
                name="redrive",
                title="Re-drive dead events",
                explanation="These dead events become claimable again with a fresh attempt "
                "budget; the relay projects them, then their aggregates' later events.",
                verb="Re-drove",
                infinitive="re-drive",
                perform=lambda ids: control.redrive_dead_events(ids, using=alias),
            ),
        )

    @admin.action(description="Discard dead events (mark processed)", permissions=["change"])
    def discard(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        alias = queryset.db
        return _bulk(
            self,
            request,
            queryset.filter(dead_at__isnull=False, processed_at__isnull=True),
            self._dead_events(
                name="discard",
                title="Discard dead events",
                explanation="These dead events are marked processed without being projected, "
                "so the later events of their aggregates go on.",
                verb="Discarded",
                infinitive="discard",
                perform=lambda ids: control.discard_dead_events(ids, using=alias),
            ),
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

    def deletable_rows(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """Cursors of schedules no longer configured (as this process loads them). A configured
        schedule without its cursor would start again from its latest slot."""
        return queryset.exclude(name__in=list(scheduler.load_schedules()[0]))

    @admin.action(description="Run now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        schedules = self._schedules

        def perform(names: list[Any]) -> int:
            for name in names:
                scheduler.run_now(schedules[name])
            return len(names)

        return _bulk(
            self,
            request,
            queryset.filter(name__in=list(schedules)),
            _Bulk(
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
