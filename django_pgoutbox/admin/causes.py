"""Dead letters by cause: the page that groups them (job type, error code, the summary with its
numbers, ids and quoted values taken out), the dead letters' filter by cause, and the retry or
cancel of a whole cause, confirmed with its exact count and acted on as the bulk actions act."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from django_pgoutbox import control
from django_pgoutbox.admin.bulk import Bulk, act_on
from django_pgoutbox.admin.common import (
    CONFIRMATION_SALT,
    LISTED,
    breadcrumbs_as_list,
    counted,
)
from django_pgoutbox.admin.filters import LinkedFilter
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import Job

if TYPE_CHECKING:
    from django_pgoutbox.admin.jobs import DeadLetterAdmin

#: The most dead letters of one cause that the dead letters' changelist shows (ten pages): their
#: ids go into the page's statement, and 10,000 of them made it take over half a second at ten
#: million jobs. Retry all and Cancel all act on every one.
CAUSE_ROWS = 1_000

#: The most causes that the page lists, the biggest first (the command lists them all).
SHOWN_CAUSES = 100

#: The most of a normalised summary that the page shows (it keeps up to 500 characters).
PATTERN_CHARS = 300

#: The two actions on a whole cause: (title, explanation, verb, infinitive, perform).
ACTIONS = {
    "retry": (
        "Retry the dead letters of a cause",
        "These jobs go back to their queue, due now, with their attempts reset to zero. Their "
        "handlers must be idempotent.",
        "Retried",
        "retry",
        control.retry_dead_jobs,
    ),
    "discard": (
        "Cancel the dead letters of a cause",
        "These jobs become cancelled: they never run again, and retention deletes them with the "
        "other finished jobs.",
        "Cancelled",
        "cancel",
        control.cancel_dead_jobs,
    ),
}


class CauseFilter(LinkedFilter):
    """``?cause=FINGERPRINT``: the newest ``CAUSE_ROWS`` dead letters of one cause, read from
    ``jobs_dead_cause_idx`` (a link of the causes page and of each dead letter's page). A value
    that is not a fingerprint matches nothing."""

    title = "cause"
    parameter_name = "cause"

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        try:
            ids = control.newest_dead_of_cause(
                str(self.value()), limit=CAUSE_ROWS, using=queryset.db
            )
        except InvalidInput:
            return queryset.none()
        return queryset.filter(pk__in=ids) if ids else queryset.none()


def cause_urls(model_admin: DeadLetterAdmin) -> list[URLPattern]:
    site = model_admin.admin_site
    return [
        path(
            "causes/",
            site.admin_view(lambda request: causes_view(model_admin, request)),
            name="pgoutbox_dead_causes",
        ),
        path(
            "causes/<str:fingerprint>/<str:action>/",
            site.admin_view(
                lambda request, fingerprint, action: cause_action_view(
                    model_admin, request, fingerprint, action
                )
            ),
            name="pgoutbox_dead_cause_action",
        ),
    ]


def causes_view(model_admin: DeadLetterAdmin, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    found = control.dead_letter_causes(using=router.db_for_read(Job))
    shown = found.causes[:SHOWN_CAUSES]
    # Each URL made once and completed per row: a reverse() per row and link was most of the
    # page's time at a few hundred causes.
    changelist = reverse("admin:pgoutbox_deadletter_changelist")
    example = reverse("admin:pgoutbox_deadletter_change", args=["ID"]).split("ID")
    action = _action_url("0" * 16, "ACTION").split("0" * 16)
    rows = [
        {
            "cause": cause,
            "example_url": f"{example[0]}{cause.example_id}{example[1]}",
            "list_url": f"{changelist}?cause={cause.fingerprint}",
            "retry_url": f"{action[0]}{cause.fingerprint}{action[1].replace('ACTION', 'retry')}",
            "discard_url": (
                f"{action[0]}{cause.fingerprint}{action[1].replace('ACTION', 'discard')}"
            ),
            # Formatted here: the template's localised date filter was a third of the page.
            "first_seen": _utc(cause.first_seen),
            "last_seen": _utc(cause.last_seen),
            "pattern": _cut(cause.pattern, PATTERN_CHARS),
        }
        for cause in shown
    ]
    hidden = found.causes[SHOWN_CAUSES:]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Dead letters by cause",
        "rows": rows,
        "more": found.more,
        "hidden": len(hidden),
        "hidden_letters": sum(cause.count for cause in hidden),
        "hidden_estimated": any(not cause.exact for cause in hidden),
        "estimated": found.estimated,
        "cap": control.CAUSE_COUNT_CAP,
        "limit": control.MAX_CAUSES,
        "shown_rows": CAUSE_ROWS,
        "can_act": model_admin.has_change_permission(request),
        "opts": model_admin.model._meta,
        "breadcrumbs_as_list": breadcrumbs_as_list(),
    }
    return TemplateResponse(request, "admin/django_pgoutbox/dead_causes.html", context)


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _action_url(fingerprint: str, action: str) -> str:
    return reverse(
        "admin:pgoutbox_dead_cause_action", kwargs={"fingerprint": fingerprint, "action": action}
    )


def cause_action_view(
    model_admin: DeadLetterAdmin, request: HttpRequest, fingerprint: str, action: str
) -> HttpResponse:
    """GET: the confirmation page, with the exact count of the cause's dead letters now. POST
    (with that page's signed confirmation): act on those that are still dead and died no later
    than the page was shown, ``CHUNK`` at a time, each chunk locked, checked and logged."""
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    if action not in ACTIONS:
        return HttpResponseBadRequest("No such action on a cause: retry or discard.")
    try:
        fingerprint = control.checked_fingerprint(fingerprint)
    except InvalidInput:
        return HttpResponseBadRequest("Not a cause's fingerprint: 16 hex digits.")
    title, explanation, verb, infinitive, perform = ACTIONS[action]
    alias = router.db_for_write(Job)
    bulk = Bulk(
        name=f"{action}_cause",
        title=title,
        explanation=explanation,
        noun=("dead letter", "dead letters"),
        verb=verb,
        infinitive=infinitive,
        left_out=("is not dead", "are not dead"),
        gone=("was no longer dead", "were no longer dead"),
        perform=lambda ids: perform(ids, using=alias),
        since="finished_at",
    )
    causes_url = reverse("admin:pgoutbox_dead_causes")
    if request.method != "POST":
        return _ask(model_admin, request, fingerprint, bulk, alias)
    confirmed = _confirmation(model_admin, request, fingerprint, bulk)
    if confirmed is None:
        model_admin.message_user(
            request,
            "This confirmation does not match its page: nothing was done. Open the cause's "
            f"{infinitive} again.",
            messages.ERROR,
        )
        return HttpResponseRedirect(causes_url)
    as_of, expected = confirmed
    rows = model_admin.get_queryset(request).using(alias).filter(finished_at__lte=as_of)
    done = act_on(
        request,
        rows,
        bulk,
        control.dead_cause_batches(fingerprint, as_of=as_of, using=alias),
    )
    skipped = expected - done
    message = f"{verb} {counted(done, bulk.noun)}."
    if skipped > 0:
        left = "was left as it is" if skipped == 1 else "were left as they are"
        message = (
            f"{verb} {counted(done, bulk.noun)}; {skipped} of the {expected} confirmed "
            f"{bulk.gone[skipped != 1]} and {left}."
        )
    model_admin.message_user(
        request, message, messages.SUCCESS if skipped <= 0 else messages.WARNING
    )
    return HttpResponseRedirect(causes_url)


def _ask(
    model_admin: DeadLetterAdmin, request: HttpRequest, fingerprint: str, bulk: Bulk, alias: str
) -> HttpResponse:
    as_of = control.database_now(alias)
    count = control.count_dead_cause(fingerprint, as_of=as_of, using=alias)
    if count == 0:
        model_admin.message_user(
            request,
            f"No dead letters of this cause to {bulk.infinitive}: nothing was done.",
            messages.WARNING,
        )
        return HttpResponseRedirect(reverse("admin:pgoutbox_dead_causes"))
    first = next(
        control.dead_cause_batches(fingerprint, as_of=as_of, batch=LISTED, using=alias), []
    )
    listed = list(model_admin.get_queryset(request).using(alias).filter(pk__in=first))
    listed.sort(key=lambda job: (job.finished_at, job.pk))
    token = signing.dumps(
        [model_admin.opts.label_lower, bulk.name, fingerprint, as_of.isoformat(), count],
        salt=CONFIRMATION_SALT,
    )
    return TemplateResponse(
        request,
        "admin/django_pgoutbox/confirm_action.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": bulk.title,
            "explanation": bulk.explanation,
            "left_out": "",
            "count": count,
            "noun": bulk.noun[0] if count == 1 else bulk.noun[1],
            "objects": listed,
            "more": count - len(listed),
            "ids": [],
            "select_across": True,
            "confirmation": token,
            "action": bulk.name,
            "opts": model_admin.model._meta,
            "action_checkbox_name": "",
            "breadcrumbs_as_list": breadcrumbs_as_list(),
        },
    )


def _confirmation(
    model_admin: DeadLetterAdmin, request: HttpRequest, fingerprint: str, bulk: Bulk
) -> tuple[datetime, int] | None:
    """The moment and the count of the confirmation page that this POST answers, if it is one
    of this action on this cause."""
    try:
        page, name, cause, as_of, count = signing.loads(
            request.POST.get("confirmation", ""), salt=CONFIRMATION_SALT
        )
        moment = datetime.fromisoformat(as_of)
    except (signing.BadSignature, TypeError, ValueError):
        return None
    if (page, name, cause) != (model_admin.opts.label_lower, bulk.name, fingerprint):
        return None
    if request.POST.get("confirmed") != "yes" or not isinstance(count, int):
        return None
    return moment, count
