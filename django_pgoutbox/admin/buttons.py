"""A detail page's buttons: one of the page's bulk actions on that one row, posted with the
page's CSRF token to ``<id>/<button>/``, and done as in bulk: the row locked, checked again,
acted on and logged, then back to the page with a message that says what happened."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import path, reverse

from django_pgoutbox.admin.bulk import Bulk, act_on
from django_pgoutbox.admin.common import ReadOnlyAdmin

#: The rows of a queryset that a bulk action acts on, and the action: ``plan(admin, request,
#: queryset)``. A button runs its bulk action's plan on a queryset of its one row.
Plan = Callable[[Any, HttpRequest, QuerySet[Any]], tuple[QuerySet[Any], Bulk]]


@dataclass(frozen=True)
class Button:
    name: str  # the last part of its URL, ``<id>/<name>/``
    label: str
    plan: Plan
    permission: str = "change"  # as an admin action's: ``has_<permission>_permission(request)``


class ButtonsAdmin(ReadOnlyAdmin):
    """A read-only page whose detail page has buttons: each shown while its row is one the
    button acts on, to a user with its permission."""

    buttons: tuple[Button, ...] = ()

    def get_urls(self) -> list[Any]:
        own = [
            path(
                f"<path:object_id>/{button.name}/",
                self.admin_site.admin_view(self._button_view(button)),
                name=f"{self.opts.app_label}_{self.opts.model_name}_{button.name}",
            )
            for button in self.buttons
        ]
        return [*own, *super().get_urls()]

    def _button_view(self, button: Button) -> Callable[..., HttpResponse]:
        def view(request: HttpRequest, object_id: str) -> HttpResponse:
            return self.press(request, object_id, button)

        return view

    def may_press(self, request: HttpRequest, button: Button) -> bool:
        check: Callable[[HttpRequest], bool] = getattr(self, f"has_{button.permission}_permission")
        return check(request)

    def _pk(self, object_id: str) -> Any:
        """The row's primary key, or a 404 for an id that no row can have."""
        try:
            return self.opts.pk.to_python(unquote(object_id))
        except ValidationError:
            raise Http404(f"{object_id[:60]!r} is not a valid id") from None

    def press(self, request: HttpRequest, object_id: str, button: Button) -> HttpResponse:
        """Act on the one row: only a POST (the page's form, with its CSRF token), only with
        the button's permission, only if the row still is one the button acts on."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.may_press(request, button):
            raise PermissionDenied
        pk = self._pk(object_id)
        rows = self.get_queryset(request)
        if not self.model._base_manager.using(rows.db).filter(pk=pk).exists():
            raise Http404(f"no {self.opts.verbose_name} {pk}")
        eligible, action = button.plan(self, request, rows.filter(pk=pk))
        if act_on(request, eligible, action):
            self.message_user(request, self.pressed_message(action, pk), messages.SUCCESS)
        else:
            noun = action.noun[0]
            self.message_user(
                request,
                f"{noun[0].upper()}{noun[1:]} {pk} {action.gone[0]}: nothing was done.",
                messages.WARNING,
            )
        return HttpResponseRedirect(self.after_pressing(request, pk))

    def pressed_message(self, action: Bulk, pk: Any) -> str:
        return f"{action.verb} {action.noun[0]} {pk}."

    def after_pressing(self, request: HttpRequest, pk: Any) -> str:
        """The row's page, while this page still shows it; else the list."""
        if self.get_queryset(request).filter(pk=pk).exists():
            return reverse(
                f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_change",
                args=[quote(pk)],
            )
        return reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {**(extra_context or {}), "pgoutbox_buttons": self._shown(request, object_id)}
        return super().change_view(request, object_id, form_url, context)

    def _shown(self, request: HttpRequest, object_id: str) -> list[dict[str, str]]:
        try:
            pk = self._pk(object_id)
        except Http404:
            return []  # Django's own page says the row does not exist
        shown = []
        for button in self.buttons:
            if not self.may_press(request, button):
                continue
            eligible, action = button.plan(self, request, self.get_queryset(request).filter(pk=pk))
            if eligible.exists():
                shown.append(
                    {
                        "label": button.label,
                        "form": f"pgoutbox-{button.name}",
                        "explanation": action.explanation,
                        "url": reverse(
                            f"{self.admin_site.name}:{self.opts.app_label}_"
                            f"{self.opts.model_name}_{button.name}",
                            args=[quote(pk)],
                        ),
                    }
                )
        return shown
