"""Connections that live outside Django's per-thread connection handling."""

from __future__ import annotations

from typing import Any

from django.db import connections


def raw_connection_params(alias: str) -> dict[str, Any]:
    """psycopg ``connect()`` arguments for database ``alias``, as Django would connect.

    For connections that must not be Django's: a LISTEN connection that stays open for the
    process's life, outside any transaction and any connection pooler's recycling.
    """
    params: dict[str, Any] = connections[alias].get_connection_params()
    # Django's own cursor class and adapters expect a Django connection wrapper around them.
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params
