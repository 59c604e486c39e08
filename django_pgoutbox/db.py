"""Connections that live outside Django's per-thread connection handling."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.conf import settings
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


#: The port PgBouncer listens on by default.
PGBOUNCER_PORT = "6432"

#: A worker's dispatcher prepares its statements once they have run this many times.
PREPARE_THRESHOLD = 2


def pooling_signs(alias: str) -> list[str]:
    """Why database ``alias`` looks as if it goes through a transaction-pooling proxy, if it does.

    The signs are those of PgBouncer: its default port, and the setting Django's documentation
    asks for behind it (``DISABLE_SERVER_SIDE_CURSORS``).
    """
    config = settings.DATABASES[alias]
    signs = []
    if str(config.get("PORT") or "") == PGBOUNCER_PORT:
        signs.append(f"PORT {PGBOUNCER_PORT} (PgBouncer's)")
    if config.get("DISABLE_SERVER_SIDE_CURSORS"):
        signs.append("DISABLE_SERVER_SIDE_CURSORS")
    return signs


def dispatcher_connection_params(alias: str) -> dict[str, Any]:
    """Connection arguments for a worker's dispatcher: as Django's, with prepared statements.

    Django turns psycopg's prepared statements off unless ``OPTIONS`` asks for them, because a
    transaction-pooling proxy older than PgBouncer 1.21 cannot carry them. A dispatcher sends the
    same few statements thousands of times, so it prepares them, unless ``OPTIONS`` sets
    ``prepare_threshold`` (honoured as given) or the database looks pooled (``pooling_signs``).
    """
    params = raw_connection_params(alias)
    if "prepare_threshold" not in settings.DATABASES[alias].get("OPTIONS", {}) and not (
        pooling_signs(alias)
    ):
        params["prepare_threshold"] = PREPARE_THRESHOLD
    return params


@contextmanager
def server_side_cursor(alias: str) -> Iterator[Any]:
    """A cursor with server-side parameters on Django's connection of ``alias``.

    Django's cursors bind parameters on the client: every element of an array parameter is
    quoted into the SQL text in Python. For the hot statements that pass arrays of thousands of
    values, this cursor sends them as parameters instead. It is a psycopg ``Cursor`` wrapped as
    Django wraps its own (``_prepare_cursor``): it runs in Django's transaction, raises Django's
    database exceptions, goes through execute wrappers, and is counted and logged as any query
    (``assertNumQueries``, ``connection.queries``).
    """
    wrapper = connections[alias]
    wrapper.ensure_connection()
    # One cursor per connection, made again when the connection, or whether Django logs queries
    # (DEBUG, assertNumQueries), changed: making a cursor and its wrapper each time was a twentieth
    # of a single enqueue. Callers read their results before they leave the block.
    logged = wrapper.queries_logged
    cached = getattr(wrapper, "_pgoutbox_cursor", None)
    if cached is None or cached[0] is not wrapper.connection or cached[1] != logged:
        cursor = wrapper._prepare_cursor(psycopg.Cursor(wrapper.connection))  # type: ignore[attr-defined]
        cached = (wrapper.connection, logged, cursor)
        wrapper._pgoutbox_cursor = cached  # type: ignore[attr-defined]
    yield cached[2]


def unapplied_migrations(alias: str) -> list[str]:
    """django-pgoutbox's migrations that the database ``alias`` lacks (``["pgoutbox.0002_…"]``).

    The commands refuse to run against such a database with an error that says to migrate, rather
    than failing later on a missing table or column (after an upgrade, say).
    """
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == "pgoutbox"]
    return [
        f"{migration.app_label}.{migration.name}"
        for migration, backwards in executor.migration_plan(targets)
        if not backwards
    ]


def require_migrated(alias: str) -> None:
    """Raise ``CommandError`` naming the missing migrations, if ``alias`` lacks any."""
    from django.core.management.base import CommandError

    missing = unapplied_migrations(alias)
    if missing:
        raise CommandError(
            f"The database {alias!r} lacks django-pgoutbox's migrations {', '.join(missing)}: "
            f"run 'manage.py migrate --database {alias}' first."
        )
