"""The overview's queues: paused or not, the values in effect, and the forms that pause, resume
and resize one at run time (``queue_controls``), for users who may change jobs."""

from __future__ import annotations

import math
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse

from django_pgoutbox import queue_controls
from django_pgoutbox.queue_controls import DEFAULT, KEEP, QueueControlError, QueueStatus

#: The resize form's fields: the form's name, the API's keyword, the key of ``overridden``.
FIELDS = (
    ("concurrency", "concurrency", "CONCURRENCY"),
    ("max_running", "max_running", "MAX_RUNNING"),
    ("rate_limit", "rate_limit", "RATE_LIMIT"),
)


def shown(value: float | None) -> str:
    """A value as the form shows it: blank for no limit."""
    return "" if value is None else f"{value:g}"


def queue_row(status: QueueStatus) -> dict[str, Any]:
    """What the overview shows of one queue."""
    values = {
        "concurrency": status.concurrency,
        "max_running": status.max_running,
        "rate_limit": status.rate_limit,
    }
    return {
        "status": status,
        "fields": [
            {
                "name": name,
                "label": name.replace("_", " "),
                "value": shown(values[name]),
                "overridden": key in status.overridden,
                "setting": shown(getattr(status.settings, name)),
            }
            for name, _, key in FIELDS
        ],
    }


def _parse(name: str, text: str) -> Any:
    """A form's value: blank is no limit (refused for the concurrency)."""
    text = text.strip()
    if not text:
        if name == "concurrency":
            raise QueueControlError(name, "must be a whole number from 1 up; it cannot be blank")
        return None
    try:
        if name == "rate_limit":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
        return int(text)
    except ValueError:
        kind = "a number" if name == "rate_limit" else "a whole number"
        shown_text = text if len(text) <= 40 else text[:37] + "..."
        raise QueueControlError(name, f"must be {kind}, not {shown_text!r}") from None


def queue_action(
    modeladmin: admin.ModelAdmin,  # type: ignore[type-arg]
    request: HttpRequest,
    name: str,
    action: str,
) -> HttpResponse:
    """POST ``pause``, ``resume``, ``resize`` (the form's changed fields) or ``reset`` (back to
    the settings) of queue ``name``; back to the overview with a message."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    opts = modeladmin.model._meta
    if not request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"):
        raise PermissionDenied
    by = f"admin user {request.user}"
    overview = HttpResponseRedirect(reverse("admin:pgoutbox_overview") + "#queues")
    try:
        if action == "pause":
            queue_controls.pause_queue(name, by=by)
            done = f"Queue {name} is paused: workers claim none of its jobs until it is resumed."
        elif action == "resume":
            queue_controls.resume_queue(name, by=by)
            done = f"Queue {name} is resumed."
        elif action == "reset":
            queue_controls.resize_queue(
                name, concurrency=DEFAULT, max_running=DEFAULT, rate_limit=DEFAULT, by=by
            )
            done = f"Queue {name} runs with its settings again."
        elif action == "resize":
            given: dict[str, Any] = {}
            for field, keyword, _ in FIELDS:
                posted = request.POST.get(field, "")
                if posted.strip() == request.POST.get(f"was_{field}", "").strip():
                    continue  # unchanged on the page: left as it is
                given[keyword] = _parse(field, posted)
            if not given:
                modeladmin.message_user(
                    request, f"Nothing of queue {name} was changed.", messages.WARNING
                )
                return overview
            status = queue_controls.resize_queue(name, by=by, **given)
            done = (
                f"Queue {name}: concurrency {status.concurrency} per worker, max running "
                f"{shown(status.max_running) or 'none'}, rate limit "
                f"{shown(status.rate_limit) or 'none'}; workers apply it within seconds."
            )
        else:
            raise QueueControlError("action", f"{action!r} is not pause, resume, resize or reset")
    except QueueControlError as error:
        modeladmin.message_user(request, f"Nothing was changed: {error}", messages.ERROR)
        return overview
    modeladmin.message_user(request, done, messages.SUCCESS)
    return overview


__all__ = ["KEEP", "queue_action", "queue_row"]
