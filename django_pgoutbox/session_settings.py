"""Session settings that user code may ``SET`` on a connection the package's own statements
run on next, read before that code runs and put back after it.

A subscriber runs on the relay's own connection, in the relay's transaction. A ``SET`` of its
(not ``SET LOCAL``) outlives that transaction once it commits: ``SET search_path TO tenant``
would make the relay's next statement fail (``relation "jobs" does not exist``) in every batch
after it, until the same error stopped the relay; ``default_transaction_read_only``,
``session_replication_role`` (the jobs' triggers off), a ``ROLE`` without the relay's grants,
``statement_timeout`` or ``standard_conforming_strings`` (how Django quotes its parameters) as
much. So the relay reads these settings when a connection first serves it (``arm``, before any
subscriber ran on it) and, after the subscribers of a batch ran and before its own statements,
puts back whichever differ (``restore``: one statement). The subscriber's own work stands: what it
wrote under its settings is written. The state is kept on the thread's own connection wrapper,
which no other thread touches. ``django_pgoutbox.testing`` does the same around each handler it
runs on a test's connection (``read``, ``put_back``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connections

logger = logging.getLogger("django_pgoutbox.worker")

#: What is read and put back; ``role`` first: putting back the others may need its rights.
WATCHED = (
    "role",
    "search_path",
    "session_replication_role",
    "default_transaction_read_only",
    "default_transaction_isolation",
    "default_transaction_deferrable",
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
    "standard_conforming_strings",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
)

_READ = "SELECT " + ", ".join(f"current_setting('{name}')" for name in WATCHED)
#: ``OFFSET 0`` keeps the comparison below the ``set_config()`` calls, so that only the settings
#: that differ are set, and named.
_PUT_BACK = (
    "SELECT name, set_config(name, value, false) FROM ("
    " SELECT name, value, n"
    " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS s(name, value, n)"
    " WHERE current_setting(name) IS DISTINCT FROM value OFFSET 0) AS changed ORDER BY n"
)

#: The attribute of Django's connection wrapper (one per thread and alias) holding the psycopg
#: connection the relay's settings were read on, and their values.
_ATTRIBUTE = "_pgoutbox_session_settings"


def read(raw: Any) -> tuple[str, ...]:
    """The ``WATCHED`` settings of the psycopg connection ``raw`` (one statement on it, outside
    Django's cursor: nothing logged, nothing opened)."""
    row = raw.execute(_READ).fetchone()
    return tuple(row) if row is not None else ()


def put_back(raw: Any, values: tuple[str, ...]) -> list[str]:
    """Set back each ``WATCHED`` setting of ``raw`` that differs from ``values`` (what ``read``
    returned); the names of those set, in one statement."""
    return [row[0] for row in raw.execute(_PUT_BACK, [list(WATCHED), list(values)]).fetchall()]


def arm(using: str) -> None:
    """Read the settings if the connection of ``using`` is new to this module; call before any
    subscriber runs on it (a batch's first statement has opened it)."""
    wrapper = connections[using]
    raw = wrapper.connection
    if raw is None:
        return
    known = getattr(wrapper, _ATTRIBUTE, None)
    if known is not None and known[0] is raw:
        return
    setattr(wrapper, _ATTRIBUTE, (raw, read(raw)))


def restore(using: str, what: str) -> list[str]:
    """Put back the settings that differ from those ``arm`` read (none if it read none on this
    connection); the names of those put back, logged once with what ran (the subscribers of a
    batch, say)."""
    wrapper = connections[using]
    known: Any = getattr(wrapper, _ATTRIBUTE, None)
    if known is None or known[0] is not wrapper.connection:
        return []
    changed = put_back(known[0], known[1])
    if changed:
        logger.warning(
            "%s changed the relay connection's session settings (%s) with SET rather than "
            "SET LOCAL; they are put back (use SET LOCAL, or a connection of the subscriber's "
            "own, to change them)",
            what,
            ", ".join(changed),
        )
    return changed
