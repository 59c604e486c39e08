"""The inbox's page: the messages ``accept_message()`` recorded, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from django_pgoutbox.admin.common import ReadOnlyAdmin
from django_pgoutbox.admin.filters import MAX_SOURCES, SourceFilter, inbox_sources
from django_pgoutbox.models import InboxMessage
from django_pgoutbox.validation import storable


@admin.register(InboxMessage)
class InboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("message_id", "source", "received_at")
    list_filter = (SourceFilter,)
    search_fields = ("message_id",)
    search_help_text = "A message id, exactly as its sender gave it."
    ordering = ("-id",)  # newest first, straight from the primary key index
    sortable_by = ("received_at",)  # inbox_received_idx

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """A message id, exactly, in each source: one probe of ``inbox_messages_uq`` per source,
        no ``LIKE`` over the messages of a week."""
        if not search_term.strip():
            return queryset, False
        ids = {term for term in (search_term, search_term.strip()) if storable(term)}
        sources = inbox_sources(queryset.db)
        if len(sources) < MAX_SOURCES:
            queryset = queryset.filter(source__in=sources)
        return queryset.filter(message_id__in=ids), False
