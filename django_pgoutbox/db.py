"""Connections that live outside Django's per-thread connection handling."""

from __future__ import annotations

import enum
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db import connections

if TYPE_CHECKING:
    from django_pgoutbox.errors import InvalidInput


def write_database(using: str | None, model: Any, error: type[InvalidInput]) -> str:
    """The alias to write ``model``'s rows to: ``using``, checked, or the routers' choice;
    refused with ``error`` on ``using`` unless it is a PostgreSQL alias of ``DATABASES``."""
    from django.db import router

    if using is None:
        alias: str = router.db_for_write(model)
    elif not isinstance(using, str) or using not in settings.DATABASES:
        raise error(
            "using", f"no database {using!r} in DATABASES ({', '.join(settings.DATABASES)})"
        )
    else:
        alias = using
    postgresql_required(alias, error)
    return alias


def postgresql_required(alias: str, error: type[InvalidInput]) -> None:
    """Refuse database ``alias`` with one clear error (``error`` on the ``using`` argument)
    unless it is PostgreSQL: before any statement, which on another database would fail with
    the driver's own words (SQLite has no ``pgconn``)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise error(
            "using",
            f"database {alias!r} is {connection.display_name}, not PostgreSQL: the tables of "
            "django-pgoutbox live in PostgreSQL. Pass using= a PostgreSQL alias of DATABASES, "
            "or route the pgoutbox app to one (DATABASE_ROUTERS).",
        )


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error, read through Django's wrapping; None if it has none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.Error) and current.sqlstate:
            return current.sqlstate
        current = current.__cause__ or current.__context__
    return None


#: SQLSTATE undefined_table: "relation ... does not exist".
UNDEFINED_TABLE = "42P01"
#: SQLSTATE undefined_column: "column ... does not exist" (tables older than the code).
UNDEFINED_COLUMN = "42703"


@contextmanager
def tables_required(
    alias: str, error: type[InvalidInput], *, added_later: bool = False
) -> Iterator[None]:
    """Turn "relation does not exist" or "column does not exist", from a statement on the
    package's tables, into one clear error that says which command creates them (a database not
    migrated yet, or not since an upgrade added a column). ``added_later``: the statement's
    table came with a later migration than the first, so a database that lacks it may well have
    the others, and is said to lack migrations rather than to have no tables."""
    from django.db import DatabaseError

    try:
        yield
    except DatabaseError as exc:
        state = sqlstate(exc)
        if state not in (UNDEFINED_TABLE, UNDEFINED_COLUMN):
            raise
        command = "manage.py migrate pgoutbox"
        if alias != "default":
            command += f" --database {alias}"
        reason = str(exc).splitlines()[0] if str(exc) else "a table is missing"
        lacks = (
            "has no django-pgoutbox tables"
            if state == UNDEFINED_TABLE and not added_later
            else "lacks django-pgoutbox migrations"
        )
        raise error("using", f"database {alias!r} {lacks} ({reason}): run `{command}`.") from exc


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


class ErrorKind(enum.Enum):
    """What a database error says about the statement that raised it (see ``classify_error``)."""

    #: The connection is gone or unusable (or the server is shutting down, or refuses new
    #: sessions for now): reconnect after a back-off and send the same work again.
    CONNECTION = "connection"
    #: A value of this statement cannot be stored (out of range, bad encoding, too large):
    #: sending the same statement again fails the same way. Retry its rows one by one.
    DATA = "data"
    #: The transaction lost a conflict (serialization failure, deadlock) or was cancelled
    #: (``statement_timeout``, ``pg_cancel_backend``): try again as is, after a back-off.
    CONFLICT = "conflict"
    #: A feature the server does not support (0A000). Among them: a statement prepared on this
    #: connection whose result a migration changed since ("cached plan must not change result
    #: type"), which fails at every run until the connection goes: a worker's own statements
    #: reconnect (preparing them again) and try again; anywhere else it is ``OTHER``.
    UNSUPPORTED = "unsupported"
    #: Anything else: a bug or a schema the code does not expect. Not retried blindly.
    OTHER = "other"


#: The errors after which a worker loop's own connection (``DispatcherConnection``) is closed,
#: and opened again for the next statement: a lost one, and one whose prepared statements a
#: migration made stale.
RECONNECT = frozenset({ErrorKind.CONNECTION, ErrorKind.UNSUPPORTED})

#: SQLSTATE classes (first two characters) and codes, by what they say (PostgreSQL's appendix A).
_SQLSTATE_KINDS: dict[str, ErrorKind] = {
    "08": ErrorKind.CONNECTION,  # connection exception
    "53": ErrorKind.CONNECTION,  # insufficient resources (too many connections, out of memory)
    "57P01": ErrorKind.CONNECTION,  # admin_shutdown (pg_terminate_backend, a fast shutdown)
    "57P02": ErrorKind.CONNECTION,  # crash_shutdown
    "57P03": ErrorKind.CONNECTION,  # cannot_connect_now (starting up, recovering)
    "57P05": ErrorKind.CONNECTION,  # idle_session_timeout
    "25P03": ErrorKind.CONNECTION,  # idle_in_transaction_session_timeout
    "22": ErrorKind.DATA,  # data exception (out of range, invalid text, NUL in text, …)
    "54": ErrorKind.DATA,  # program limit exceeded (a value or row too large)
    "40": ErrorKind.CONFLICT,  # transaction rollback (serialization failure, deadlock)
    "57014": ErrorKind.CONFLICT,  # query_canceled (statement_timeout, pg_cancel_backend)
    "0A000": ErrorKind.UNSUPPORTED,  # feature_not_supported (a stale prepared statement)
}


def classify_error(error: BaseException) -> ErrorKind:
    """The one place that says what a failed statement's error means, by SQLSTATE.

    Never by psycopg's exception classes: ``ProgramLimitExceeded`` (54000, a value too large) is
    an ``OperationalError`` there, like a lost connection, yet retrying it can only fail again.
    Django's wrapped errors are read through their ``__cause__``. Errors raised on the client
    before anything is sent (a string PostgreSQL cannot hold, an integer the binary format
    cannot carry) are ``DATA``; psycopg's own errors without a SQLSTATE are ``CONNECTION`` when
    the connection is closed or broken, else ``OTHER``.
    """
    import psycopg

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.Error):
            state = current.sqlstate
            if state:
                return _SQLSTATE_KINDS.get(state) or _SQLSTATE_KINDS.get(state[:2], ErrorKind.OTHER)
            if isinstance(current, psycopg.DataError | psycopg.errors.DataError):
                return ErrorKind.DATA  # e.g. a NUL refused by the client's text dumper
            if isinstance(current, psycopg.OperationalError | psycopg.InterfaceError):
                return ErrorKind.CONNECTION
            return ErrorKind.OTHER
        if isinstance(current, UnicodeError | OverflowError | struct.error):
            return ErrorKind.DATA
        current = current.__cause__ or current.__context__
    from django.db import DataError, InterfaceError, OperationalError

    if isinstance(error, DataError):
        return ErrorKind.DATA
    if isinstance(error, OperationalError | InterfaceError):
        return ErrorKind.CONNECTION
    return ErrorKind.OTHER


#: SQLSTATE idle_in_transaction_session_timeout: the server ended the session, idle inside a
#: transaction for longer than that setting (a ``CONNECTION`` error). On the relay's connection
#: it says that subscriber code paused that long between two statements of the batch: the same
#: batch tried again would end the same way.
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"


def ended_idle_in_transaction(error: BaseException) -> bool:
    """Whether the server ended the session for idleness inside a transaction (25P03)."""
    return sqlstate(error) == IDLE_IN_TRANSACTION_TIMEOUT


#: SQLSTATEs of a prepared statement that the server session does not have
#: (invalid_sql_statement_name, "prepared statement ... does not exist") or has from another
#: client (duplicate_prepared_statement, "... already exists"): the connection goes through a
#: transaction-pooling proxy that does not carry prepared statements from one server connection
#: to the next (PgBouncer before 1.21, or with ``max_prepared_statements = 0``).
PREPARED_STATEMENT_LOST = frozenset({"26000", "42P05"})


#: SQLSTATE read_only_sql_transaction: a write on a hot standby, or in a session whose
#: ``default_transaction_read_only`` is on (a primary being demoted, a role or database set so).
READ_ONLY = "25006"


def error_hint(error: BaseException, alias: str) -> str:
    """What to change when ``error``, by its SQLSTATE, is a setting's fault; else ``""``."""
    state = sqlstate(error)
    if state == READ_ONLY:
        return (
            f"database {alias!r} is read-only (a hot standby, or default_transaction_read_only "
            "on): point it at the primary; with several hosts in one setting, libpq's "
            "target_session_attrs=read-write picks it"
        )
    if state in PREPARED_STATEMENT_LOST:
        return (
            f"database {alias!r} looks as if it goes through a transaction-pooling proxy that "
            "does not keep prepared statements (PgBouncer before 1.21, or its "
            'max_prepared_statements = 0): set "DISABLE_SERVER_SIDE_CURSORS": True on it, as '
            'Django asks behind such a proxy (the workers then prepare nothing), or "OPTIONS": '
            '{"prepare_threshold": None}; docs/databases.md, "Behind a transaction-pooling '
            'proxy (PgBouncer)"'
        )
    return ""


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
    # (DEBUG, assertNumQueries), changed: making a cursor and its wrapper each time was a part of a
    # single enqueue worth saving (docs/benchmarks.md, "What profiling found", item 8). Callers read
    # their results before they leave the block.
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


def require_postgresql(alias: str) -> None:
    """Raise ``CommandError`` if ``alias`` (a command's ``--database``) is not a PostgreSQL
    database of ``DATABASES``."""
    from django.core.management.base import CommandError

    if alias not in settings.DATABASES:
        raise CommandError(
            f"--database {alias!r} is not in DATABASES "
            f"(it has {', '.join(map(repr, settings.DATABASES))})"
        )
    if connections[alias].vendor != "postgresql":
        raise CommandError(
            f"--database {alias!r} is a {connections[alias].vendor} database; "
            "django-pgoutbox needs PostgreSQL"
        )


def require_migrated(alias: str) -> None:
    """Raise ``CommandError`` naming the missing migrations, if ``alias`` lacks any (or is not
    a PostgreSQL database of ``DATABASES``)."""
    from django.core.management.base import CommandError

    require_postgresql(alias)
    missing = unapplied_migrations(alias)
    if missing:
        raise CommandError(
            f"The database {alias!r} lacks django-pgoutbox's migrations {', '.join(missing)}: "
            f"run 'manage.py migrate --database {alias}' first."
        )


#: Back-off bounds (seconds) of a worker loop's connection after a database error: the first
#: wait, doubled at each failure in a row up to the second.
ERROR_BACKOFF = (0.2, 10.0)


class LaneConnection(psycopg.Connection[Any]):
    """A worker loop's psycopg connection, which knows whether it plans every run of its
    prepared statements anew (``plan_cache_mode = force_custom_plan``): ``queries.send``
    prepares the outcomes' statements only where it does."""

    plans_each_run = False


class DispatcherConnection:
    """A worker loop's own psycopg connection (autocommit, with ``dispatcher_connection_params``):
    opened on first use, and again after ``close()`` (the loop closes it on a lost connection)."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._db: LaneConnection | None = None

    @property
    def opened(self) -> bool:
        return self._db is not None

    def get(self) -> psycopg.Connection[Any]:
        if self._db is None or self._db.closed:
            params = dispatcher_connection_params(self.using)
            db = LaneConnection.connect(**params, autocommit=True)
            if params.get("prepare_threshold") is not None and not pooling_signs(self.using):
                # Prepared statements planned at each run with its values (queries.Dispatched):
                # parsed once, never given a generic plan. Not behind a pooling proxy, whose
                # server connections other clients share, and whose next transaction may not
                # have the setting.
                try:
                    db.execute("SET plan_cache_mode = force_custom_plan")
                except BaseException:
                    db.close()
                    raise
                db.plans_each_run = True
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            with suppress(psycopg.Error):  # closing a broken connection
                self._db.close()
            self._db = None

    def cancel(self) -> None:
        """Ask the server to cancel the statement in flight, if any, without waiting: from any
        thread, as psycopg's cancellation goes on a connection of its own (on a thread here,
        since an unreachable server would make it wait)."""
        db = self._db
        if db is not None and not db.closed:
            threading.Thread(
                target=_cancel, args=(db,), name="pgoutbox-cancel", daemon=True
            ).start()


def _cancel(db: psycopg.Connection[Any]) -> None:
    with suppress(Exception):  # the statement may have ended meanwhile, the server be gone
        db.cancel_safe(timeout=CANCEL_TIMEOUT)


#: How long (seconds) a cancellation request may wait for the server.
CANCEL_TIMEOUT = 5.0
