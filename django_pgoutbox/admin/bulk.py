"""Bulk actions: every selected row acted on, ``CHUNK`` ids per transaction, each chunk locked,
checked and logged; "select all" only with the signed confirmation of its page."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any, cast

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.core import signing
from django.db import transaction
from django.db.models import Model, QuerySet
from django.forms import BooleanField
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from django_pgoutbox import scheduler
from django_pgoutbox.admin.common import (
    CHUNK,
    CONFIRMATION_SALT,
    LISTED,
    ReadOnlyAdmin,
    breadcrumbs_as_list,
    counted,
)


@dataclass(frozen=True)
class Bulk:
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


def bulk_action(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, eligible: QuerySet[Any], action: Bulk
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
    done = act_on(request, rows, action)
    message = f"{action.verb} {counted(done, action.noun)}."
    skipped = expected - done
    if skipped > 0:
        left = "was left as it is" if skipped == 1 else "were left as they are"
        message = (
            f"{action.verb} {counted(done, action.noun)}; {skipped} of the {expected} confirmed "
            f"{action.gone[skipped != 1]} and {left}."
        )
    modeladmin.message_user(
        request, message, messages.SUCCESS if skipped <= 0 else messages.WARNING
    )
    return None


def _since(rows: QuerySet[Any], action: Bulk, as_of: datetime | None) -> QuerySet[Any]:
    if action.since is None or as_of is None:
        return rows
    return rows.filter(**{f"{action.since}__lte": as_of})


def _ask(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, eligible: QuerySet[Any], action: Bulk
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
            salt=CONFIRMATION_SALT,
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
            "breadcrumbs_as_list": breadcrumbs_as_list(),
        },
    )


def _confirmation(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, action: Bulk
) -> tuple[datetime | None, int] | None:
    """The moment and the count of the confirmation page that this POST answers, if it is one
    of this action on this page with these filters."""
    try:
        page, name, query, as_of, count = signing.loads(
            request.POST.get("confirmation", ""), salt=CONFIRMATION_SALT
        )
        moment = datetime.fromisoformat(as_of) if as_of is not None else None
    except (signing.BadSignature, TypeError, ValueError):
        return None
    if (page, name, query) != (modeladmin.opts.label_lower, action.name, request.GET.urlencode()):
        return None
    return (moment, count) if isinstance(count, int) else None


def act_on(
    request: HttpRequest,
    rows: QuerySet[Any],
    action: Bulk,
    chunks: Iterable[list[Any]] | None = None,
) -> int:
    """Act on ``rows`` a chunk at a time; each chunk locks the rows that still qualify (a row
    that changed since is left out), acts on them and logs them, in one transaction. ``chunks``:
    the ids to take, a list per chunk, where reading them from ``rows`` would not follow an
    index (the dead letters of a cause)."""
    alias = rows.db
    done = 0
    for chunk in _chunks(rows) if chunks is None else chunks:
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


def _log(request: HttpRequest, objects: list[Model], action: Bulk) -> None:
    """One admin log entry per row ("Recent actions", ``django_admin_log``): who did what."""
    LogEntry.objects.log_actions(
        user_id=cast(int, request.user.pk),
        queryset=objects,
        action_flag=action.log_flag,
        change_message=action.title,
    )
