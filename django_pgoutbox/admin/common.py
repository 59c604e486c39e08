"""What every page of the admin shares: its bounds, the estimated paginator, the read-only
base of every page and the helpers that show a row's JSON."""

from __future__ import annotations

import json
from functools import cache
from math import ceil
from pathlib import Path
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import EmptyResultSet, PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import connections, router, transaction
from django.db.models import Model, QuerySet, TextField
from django.db.models.functions import Cast, Left, Length
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html

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

CONFIRMATION_SALT = "django_pgoutbox.admin.select-across"


@cache
def breadcrumbs_as_list() -> bool:
    """Whether the installed admin draws its breadcrumbs as a list, ``<ol class="breadcrumbs">``
    (the markup its stylesheet styles from Django 6 on), rather than Django 5.2's ``div``: this
    app's own pages draw theirs the same way, as Django's base template does."""
    base = Path(admin.__file__).parent / "templates" / "admin" / "base.html"
    return '<ol class="breadcrumbs">' in base.read_text(encoding="utf-8")


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


def json_preview(obj: Model, column: str) -> str:
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


def preformatted(text: str | None) -> str:
    """``text`` whole, its lines kept and wrapped: an error summary, a traceback."""
    if not text:
        return "-"
    return format_html('<pre style="white-space: pre-wrap">{}</pre>', text)


def change_link(admin_site: admin.AdminSite, model: type[Model], pk: Any, text: Any) -> str:
    """A link to the page of ``model``'s row ``pk``."""
    opts = model._meta
    url = reverse(f"{admin_site.name}:{opts.app_label}_{opts.model_name}_change", args=[quote(pk)])
    return format_html('<a href="{}">{}</a>', url, text)


def counted(count: int, noun: tuple[str, str]) -> str:
    return f"{count} {noun[0] if count == 1 else noun[1]}"


def _short(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


class SortableChangeList(ChangeList):
    """Sorts only by the columns of ``sortable_by``: Django checks it for the headers alone, and
    sorts by any column of the list that ``?o=`` names."""

    def get_ordering_field(self, field_name: Any) -> Any:
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a facet is a count over every row of the table
    #: Columns that no page reads with the row (payloads, results): a detail page reads a
    #: bounded preview of them apart (``json_preview``).
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
        return SortableChangeList

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
