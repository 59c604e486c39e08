"""A handler run on a test's own thread and connection: in a savepoint of the test's
transaction on each of its databases, with the test's connections kept open and the session
settings the handler ``SET`` put back (``django_pgoutbox.testing``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_pgoutbox import session_settings
from django_pgoutbox.conf import get_settings
from django_pgoutbox.context import CancelFlag
from django_pgoutbox.worker.execute import ClaimedJob, Outcome, execute


def no_renewal(*_: Any) -> None:
    """``ctx.renew_lease()`` in a test: nothing to renew (no lease expires while the handler
    runs on the test's thread)."""


def run_handler(
    alias: str,
    job: ClaimedJob,
    on_error: Callable[[BaseException], None],
    cancel: CancelFlag | None = None,
) -> Outcome:
    """``execute(job)`` on this thread, in a savepoint of the test's transaction if there is one
    (of each database's): a handler that leaves a transaction aborted (it caught a database
    error) has that savepoint rolled back, and the test's transaction goes on."""
    policy = get_settings().retry
    settings = _session_settings()
    # a savepoint on each connection inside the test's transaction (a handler of one database
    # may write on another's)
    savepoints = [
        (wrapper, wrapper.savepoint())
        for wrapper in connections.all(initialized_only=True)
        if wrapper.in_atomic_block and wrapper.connection is not None and not aborted(wrapper)
    ]
    with transactions_kept_open():
        outcome = execute(
            job, policy=policy, renew=no_renewal, cancel=cancel, using=alias, on_error=on_error
        )
    for wrapper, savepoint in savepoints:
        if savepoint is None:
            continue
        if aborted(wrapper):
            # As atomic() does on leaving a block marked for rollback: the mark first, or the
            # rollback's own statement is refused (an ORM write that failed inside the test's
            # atomic() marks it, even when the handler caught the error).
            wrapper.needs_rollback = False
            wrapper.savepoint_rollback(savepoint)
        else:
            wrapper.savepoint_commit(savepoint)
    _restore_session_settings(settings)
    return outcome


def aborted(wrapper: BaseDatabaseWrapper) -> bool:
    """Whether the transaction of ``wrapper`` is aborted, or marked for rollback."""
    raw = wrapper.connection
    return wrapper.needs_rollback or (
        raw is not None and raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    )


#: This thread's open connections, each with its ``session_settings.WATCHED`` before a handler
#: ran: the settings a handler may ``SET`` that would change what the helpers' statements, or
#: the test's, do (where tables are found, how long a statement may take, who runs it, whether
#: triggers fire, how values are read and written).
Snapshot = list[tuple[BaseDatabaseWrapper, "psycopg.Connection[Any]", tuple[str, ...]]]


def _session_settings() -> Snapshot:
    """The watched settings of each of this thread's open PostgreSQL connections (a handler run
    by ``drain(using="secondary")`` may ``SET`` on ``default``'s), read on the psycopg
    connection itself: nothing is opened, and nothing logged."""
    snapshot: Snapshot = []
    for wrapper in connections.all(initialized_only=True):
        raw = wrapper.connection
        if wrapper.vendor != "postgresql" or raw is None or raw.closed or aborted(wrapper):
            continue
        snapshot.append((wrapper, raw, session_settings.read(raw)))
    return snapshot


def _restore_session_settings(snapshot: Snapshot) -> None:
    """Undo what a handler ``SET`` on a connection (a tenant's ``search_path``, a
    ``statement_timeout``, a ``ROLE``): in a worker it does not outlive the attempt, whose
    connection is closed after it (``CONN_MAX_AGE = 0``) and is never the one the outcome is
    written on; here it would run the helpers' next statements, and the test's, under it. A
    connection closed since, or whose transaction is aborted (a rollback undoes it), is left
    alone."""
    for wrapper, raw, before in snapshot:
        if wrapper.connection is not raw or raw.closed or aborted(wrapper):
            continue
        session_settings.put_back(raw, before)


def _keep(*_: Any) -> None:
    """In place of ``close()`` and ``close_if_unusable_or_obsolete()`` on a connection inside
    the test's transaction, while a handler runs."""


#: The methods of a connection that would close it, kept from doing so by ``_keep``.
_CLOSING = ("close", "close_if_unusable_or_obsolete")


@contextmanager
def transactions_kept_open() -> Iterator[None]:
    """Keep this thread's connections that are inside ``atomic()`` (the test's transaction) open
    while a handler runs: ``execute()``'s ``close_old_connections()`` closes a connection whose
    autocommit is not its setting's, as a worker's thread must after a job, and a handler may
    call ``connection.close()`` itself. In a worker, either only makes the thread's next query
    open a new connection; in a test it would end the test's transaction, and the class's with
    it (``TestCase``), so neither closes it. (Django's test client likewise disconnects
    ``close_old_connections`` from the request signals.) Only this thread's connection
    objects are touched, and only while the handler runs."""
    kept = [
        c
        for c in connections.all(initialized_only=True)
        if c.in_atomic_block and "close" not in c.__dict__  # not kept already: a handler's drain()
    ]
    for connection in kept:
        for name in _CLOSING:
            setattr(connection, name, _keep)
    try:
        yield
    finally:
        for connection in kept:
            for name in _CLOSING:
                connection.__dict__.pop(name, None)
