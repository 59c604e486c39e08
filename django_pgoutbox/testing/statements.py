"""The worker's statements, and the relay's code, on a test's own connection, and what the
testing helpers ask of the tables (what is due, made due now) (``django_pgoutbox.testing``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections, transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import QueueSettings, get_settings
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.testing.outcomes import (
    DrainLimitExceeded,
    RunSummary,
    SubscriberFailed,
    SubscriberFailure,
)
from django_pgoutbox.worker import outcomes
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.relay import Relay

#: The ``locked_by`` of the jobs the helpers claim, and the relay id of the events they project.
WORKER_ID = f"testing:{socket.gethostname()}:{os.getpid()}"


@contextmanager
def _lane(alias: str) -> Iterator[psycopg.Connection[Any]]:
    """The test's psycopg connection of ``alias``, as a lane's: its cursors bind parameters on
    the server (Django's bind them on the client, which the worker's binary statements cannot
    use), inside a savepoint of the test's transaction if there is one (a refused statement
    rolls it back alone), else as autocommit statements."""
    wrapper = connections[alias]
    with transaction.atomic(using=alias):
        wrapper.ensure_connection()
        raw = wrapper.connection
        factory = raw.cursor_factory
        raw.cursor_factory = psycopg.Cursor
        try:
            yield raw
        finally:
            raw.cursor_factory = factory


def claim(
    alias: str, settings: QueueSettings, limit: int, job_types: list[str] | None
) -> list[ClaimRow]:
    """One claim of the queue, as a worker's (``RecordAndClaim``); the jobs of other types
    than ``job_types`` given back at once."""
    with _lane(alias) as raw:
        rows = RecordAndClaim(settings, WORKER_ID, [], limit).run(raw).rows
    if job_types is None:
        return rows
    wanted = [row for row in rows if row.job_type in job_types]
    others = [row for row in rows if row.job_type not in job_types]
    if others:
        give_back(alias, others)
    return wanted


def give_back(alias: str, rows: list[ClaimRow]) -> None:
    """Return claimed jobs not run (``UNCLAIM_JOBS``, a worker's give-back)."""
    with _lane(alias) as raw, raw.cursor() as cursor:
        queries.send(
            cursor,
            "UNCLAIM_JOBS",
            [[row.id for row in rows], [row.attempt for row in rows], WORKER_ID],
        )


def record(alias: str, outcome: Outcome, queue: str) -> Outcome:
    """Write ``outcome`` (``RECORD_OUTCOMES``); one PostgreSQL refuses to store becomes the
    dead letter a worker writes in its place (``unwritable_outcome``)."""
    try:
        _send_outcome(alias, outcome)
    except outcomes.STATEMENT_ERRORS as error:
        if classify_error(error) is not ErrorKind.DATA:
            raise
        outcome = outcomes.unwritable(outcome, error, queue)
        _send_outcome(alias, outcome)
    return outcome


def written(alias: str, row: ClaimRow) -> tuple[str, str | None, str | None] | None:
    """The status, code and summary of the job of ``row``, as its outcome left them."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT status, last_error_code, last_error_summary FROM jobs WHERE id = %s",
            [row.id],
        )
        found = cursor.fetchone()
    return None if found is None else (found[0], found[1], found[2])


def _send_outcome(alias: str, outcome: Outcome) -> None:
    with _lane(alias) as raw, raw.cursor() as cursor:
        queries.send(cursor, "RECORD_OUTCOMES", outcomes.params([outcome], WORKER_ID))
        cursor.fetchall()


def control(alias: str, queue: str) -> Control:
    """The queue's row of ``queue_controls`` (paused, resized), as its workers read it."""
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.READ_QUEUE_CONTROL, [queue])
        row = cursor.fetchone()
    return Control() if row is None else Control.from_row(queue, *row)


def project_events(
    alias: str, max_events: int, summary: RunSummary, *, raise_on_failure: bool
) -> int:
    """Project pending events, batch by batch, with the relay's own code."""
    settings = get_settings()
    projected = 0
    seen = _last_delivery(alias)
    _catch_up_events(alias)
    while True:
        if projected >= max_events:
            if _events_due(alias):
                summary.events += projected  # the drain's bound, reached in all its rounds
                raise DrainLimitExceeded(summary.events, "events", summary)
            return projected
        # A relay of its own for each batch: its first claim is the full claim, from the
        # start of the index (a relay's later claims seek past its mark).
        relay = Relay(
            settings.outbox, relay_id=WORKER_ID, using=alias, policy=settings.retry, burst=True
        )
        done = relay.run_once()
        if not done:
            return projected
        projected += done
        failures, seen = _subscriber_failures(alias, seen)
        summary.subscriber_failures += failures
        if failures and raise_on_failure:
            summary.events += projected
            raise SubscriberFailed(failures, summary)


def _catch_up_events(alias: str) -> None:
    """Make available now, for the relay's ``available_at <= now()``, the events available by
    the clock (``publish(available_at=timezone.now())``), as ``catch_up`` does for jobs."""
    if not connections[alias].in_atomic_block:
        return
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE outbox_events SET available_at = now() "
            "WHERE processed_at IS NULL AND dead_at IS NULL "
            "  AND available_at > now() AND available_at <= clock_timestamp()"
        )


def _last_delivery(alias: str) -> int:
    """The id of the last delivery written so far (0: none)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM outbox_deliveries")
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _subscriber_failures(alias: str, after: int) -> tuple[list[SubscriberFailure], int]:
    """The failed deliveries written after the delivery ``after``, and the last id written."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT d.id, d.subscriber, e.event_type, d.event_id, d.last_error_code,"
            " d.last_error, d.dead_at IS NOT NULL"
            " FROM outbox_deliveries AS d JOIN outbox_events AS e ON e.id = d.event_id"
            " WHERE d.id > %s ORDER BY d.id",
            [after],
        )
        rows = cursor.fetchall()
    failures = [SubscriberFailure(*row[1:]) for row in rows if row[4] is not None]
    return failures, max([after, *(row[0] for row in rows)])


def unprojected(alias: str, summary: RunSummary, relay: bool) -> RunSummary:
    """``summary``, with the outbox events left for a relay when ``drain()`` projected none
    (``relay=False``): the jobs their subscribers would enqueue did not run."""
    if not relay:
        _catch_up_events(alias)
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM (SELECT 1 FROM outbox_events"
                " WHERE processed_at IS NULL AND dead_at IS NULL AND available_at <= now()"
                " LIMIT 10000) AS waiting"
            )
            row = cursor.fetchone()
        summary.events_waiting = int(row[0]) if row else 0
    return summary


def _events_due(alias: str) -> bool:
    """Whether outbox events wait to be projected now."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NULL"
            " AND available_at <= now() LIMIT 1"
        )
        return cursor.fetchone() is not None


# -- what is due -----------------------------------------------------------------------------------

_DUE = """
SELECT DISTINCT queue FROM jobs
WHERE status IN ('pending', 'retrying') AND run_at <= now()
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(types)s::text[] IS NULL OR job_type = ANY(%(types)s::text[]))
ORDER BY queue
"""


def due_queues(alias: str, job_types: list[str] | None) -> list[str]:
    """The queues with jobs due now (of ``job_types``), by name."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_DUE, {"queues": None, "types": job_types})
        return [row[0] for row in cursor.fetchall()]


def due(alias: str, queues: list[str] | None, job_types: list[str] | None) -> bool:
    """Whether jobs (of ``queues``, of ``job_types``) are due now."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_DUE, {"queues": queues, "types": job_types})
        return cursor.fetchone() is not None


def retry_now(alias: str, ids: list[Any]) -> None:
    """Make the jobs these attempts retried due now, rather than after their back-off."""
    if not ids:
        return
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET run_at = now() "
            "WHERE id = ANY(%s::uuid[]) AND status = 'retrying' AND run_at > now()",
            [ids],
        )


def catch_up(
    alias: str, queues: list[str] | None, job_types: list[str] | None, *, with_scheduled: bool
) -> None:
    """Make due now, for the claim's ``run_at <= now()``, the jobs due by the clock: inside the
    test's transaction ``now()`` stands still at its start (a ``TestCase``'s: its class's), so
    that a job enqueued with ``run_at=timezone.now()``, or a back-off or snooze that has since
    passed, would never be due. A worker's claim, in a transaction of its own, sees them due.
    ``with_scheduled``: every job scheduled for later too."""
    if not with_scheduled and not connections[alias].in_atomic_block:
        return  # a statement's now() is the clock's
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET run_at = now() "
            "WHERE status IN ('pending', 'retrying') AND run_at > now() "
            "  AND (%(every)s OR run_at <= clock_timestamp()) "
            "  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[])) "
            "  AND (%(types)s::text[] IS NULL OR job_type = ANY(%(types)s::text[]))",
            {"every": with_scheduled, "queues": queues, "types": job_types},
        )


def settle_new_edges(alias: str) -> None:
    """Inside the test's transaction, settle now the edges to jobs that had finished when the
    test enqueued their dependants (``enqueue(after=[a finished job])``): in production a
    deferred trigger settles them as the enqueuing transaction commits, which a test's never
    does."""
    wrapper = connections[alias]
    if not wrapper.in_atomic_block:
        return
    with transaction.atomic(using=alias), wrapper.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS job_dependencies_settle IMMEDIATE")
        cursor.execute("SET CONSTRAINTS job_dependencies_settle DEFERRED")
