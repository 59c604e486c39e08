"""The deliveries' page (a subscriber's delivery of an event, when it could not run with the
others), and the list of an event's deliveries on the event's page."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.db.models import Model, Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse

from django_pgoutbox import control
from django_pgoutbox.admin.bulk import Bulk, bulk_action
from django_pgoutbox.admin.buttons import Button, ButtonsAdmin
from django_pgoutbox.admin.common import change_link, preformatted
from django_pgoutbox.admin.filters import (
    DeliveryDeadForFilter,
    DeliveryEventTypeFilter,
    DeliveryStateFilter,
    SubscriberFilter,
)
from django_pgoutbox.delivery_states import DELIVERY_STATES, state_column
from django_pgoutbox.models import OutboxDelivery, OutboxEvent
from django_pgoutbox.validation import BIGINT_MAX


def _state(obj: OutboxDelivery) -> str:
    """The state read with the row (``state_column``): no statement per row for its error."""
    return str(getattr(obj, "delivery_state", None) or obj.state)


@admin.register(OutboxDelivery)
class OutboxDeliveryAdmin(ButtonsAdmin):
    list_display = (
        "id",
        "event_link",
        "event_type",
        "subscriber",
        "state",
        "attempts",
        "available_at",
        "last_error_code",
        "dead_at",
    )
    list_filter = (
        DeliveryStateFilter,
        DeliveryDeadForFilter,
        SubscriberFilter,
        DeliveryEventTypeFilter,
    )
    search_fields = ("id",)
    search_help_text = "A delivery id, or an event id (its deliveries)."
    ordering = ("-id",)  # newest first, straight from the primary key index
    sortable_by = ("id",)
    heavy_fields = ("last_error",)
    readonly_fields = ("event_link", "event_type", "state", "error_in_full")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "event_link",
                    "event_type",
                    "subscriber",
                    "state",
                    "aggregate_type",
                    "aggregate_id",
                )
            },
        ),
        ("Attempts", {"fields": ("attempts", "claimed_by")}),
        (
            "Times",
            {
                "fields": (
                    "occurred_at",
                    "created_at",
                    "available_at",
                    "claimed_at",
                    "dead_at",
                    "delivered_at",
                )
            },
        ),
        ("Error", {"fields": ("last_error_code", "error_in_full")}),
    )
    actions = ("redrive", "discard")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """With the events' types read apart, in one statement for the rows of the page: a join
        in the list's statement would read an event for each row that an ``OFFSET`` skips."""
        events = OutboxEvent._base_manager.only("event_type")
        rows: QuerySet[Any] = super().get_queryset(request).annotate(delivery_state=state_column())
        return rows.prefetch_related(Prefetch("event", queryset=events))

    @admin.display(description="event")
    def event_link(self, obj: OutboxDelivery) -> str:
        return change_link(self.admin_site, OutboxEvent, obj.event_id, obj.event_id)

    @admin.display(description="event type")
    def event_type(self, obj: OutboxDelivery) -> str:
        return obj.event.event_type

    @admin.display(description="state")
    def state(self, obj: OutboxDelivery) -> str:
        return _state(obj)

    @admin.display(description="error")
    def error_in_full(self, obj: OutboxDelivery) -> str:
        return preformatted(obj.last_error)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """A delivery id through the primary key, or an event id through
        ``outbox_deliveries_uq``: no ``LIKE`` over the deliveries."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isascii() and term.isdigit() and len(term) <= 19 and int(term) <= BIGINT_MAX:
            return queryset.filter(pk=int(term)), False
        try:
            return queryset.filter(event_id=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False

    def _dead(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The dead deliveries of the selection, without the event's join: the bulk action locks
        the rows it reads (``FOR UPDATE``), and the events are not its to lock."""
        selected = queryset.order_by().values("pk")
        return (
            OutboxDelivery._base_manager.using(queryset.db)
            .filter(pk__in=selected)
            .filter(DELIVERY_STATES["dead"]())
            .defer(*self.heavy_fields)
        )

    def _dead_deliveries(self, **fields: Any) -> Bulk:
        return Bulk(
            noun=("dead delivery", "dead deliveries"),
            left_out=("is not dead", "are not dead"),
            gone=("was no longer dead", "were no longer dead"),
            since="dead_at",
            **fields,
        )

    def _redrive_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        return self._dead(queryset), self._dead_deliveries(
            name="redrive",
            title="Re-drive dead deliveries",
            explanation="These dead deliveries become due again with a fresh attempt budget: "
            "the relay runs their subscriber on the event, then on that subscriber's later "
            "deliveries of the same aggregate.",
            verb="Re-drove",
            infinitive="re-drive",
            perform=lambda ids: control.redrive_dead_deliveries(ids, using=alias),
        )

    def _discard_plan(
        self, request: HttpRequest, queryset: QuerySet[Any]
    ) -> tuple[QuerySet[Any], Bulk]:
        alias = queryset.db
        return self._dead(queryset), self._dead_deliveries(
            name="discard",
            title="Discard dead deliveries",
            explanation="These dead deliveries are marked delivered without running their "
            "subscriber, so that its later deliveries of the same aggregates go on.",
            verb="Discarded",
            infinitive="discard",
            perform=lambda ids: control.discard_dead_deliveries(ids, using=alias),
        )

    buttons = (
        Button("redrive", "Re-drive", _redrive_plan),
        Button("discard", "Discard (mark delivered)", _discard_plan),
    )

    @admin.action(description="Re-drive dead deliveries", permissions=["change"])
    def redrive(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._redrive_plan(request, queryset))

    @admin.action(description="Discard dead deliveries (mark delivered)", permissions=["change"])
    def discard(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return bulk_action(self, request, *self._discard_plan(request, queryset))


class DeliveryInline(admin.TabularInline):  # type: ignore[type-arg]
    """An event's deliveries, read-only, on the event's page: at most one per subscriber."""

    model = OutboxDelivery
    fields = (
        "subscriber",
        "state",
        "attempts",
        "available_at",
        "dead_at",
        "delivered_at",
        "last_error_code",
    )
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    verbose_name_plural = "deliveries (the subscribers that could not run with the others)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rows: QuerySet[Any] = (
            super()
            .get_queryset(request)
            .defer("last_error")
            .annotate(delivery_state=state_column())
        )
        return rows.order_by("subscriber")

    @admin.display(description="state")
    def state(self, obj: OutboxDelivery) -> str:
        return _state(obj)

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False
