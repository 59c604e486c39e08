"""Writing checked rows with ``INSERT`` statements: one row, a batch without idempotency keys,
or a batch with keys, whose repeated keys return the jobs that already hold them."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django_pgoutbox import queries
from django_pgoutbox.conf import JOBS_CHANNEL, get_settings
from django_pgoutbox.db import server_side_cursor
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.job_rows import JobRow, job_from_row, jobs_from_rows
from django_pgoutbox.models import Job

#: Rows per INSERT statement in ``enqueue_many``; bounds the size of one statement.
ENQUEUE_CHUNK_SIZE = 5000

#: Characters of payload per INSERT statement, which also bound it: a statement's parameters
#: travel in one message, which PostgreSQL refuses (closing the connection) past 1 GB. 64 Mi
#: characters are at most 256 MiB of UTF-8; 5,000 payloads of 1 MiB would have been 5 GB.
ENQUEUE_CHUNK_CHARACTERS = 64 * 2**20


def chunk_bounds(rows: Sequence[JobRow]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each INSERT statement's rows: at most ``ENQUEUE_CHUNK_SIZE`` rows and
    ``ENQUEUE_CHUNK_CHARACTERS`` characters of payload, at least one row."""
    start = characters = 0
    for index, row in enumerate(rows):
        size = len(row.payload_json)
        if index > start and (
            index - start >= ENQUEUE_CHUNK_SIZE or characters + size > ENQUEUE_CHUNK_CHARACTERS
        ):
            yield start, index
            start, characters = index, 0
        characters += size
    if start < len(rows):
        yield start, len(rows)


def insert_rows(alias: str, rows: Sequence[JobRow]) -> list[Job]:
    """Insert ``rows`` (at most one chunk); return their jobs, existing ones for repeated keys."""
    conf = get_settings()
    if len(rows) == 1 and rows[0].unique is None:  # the common enqueue(): no scan of the rows
        return [_insert_one(alias, rows[0], conf.notify)]
    if any(row.unique is not None for row in rows):
        return _with_unique(alias, rows, conf.notify)
    if all(row.idempotency_key is None for row in rows):
        return _insert_unkeyed(alias, rows, conf.notify)
    created: dict[uuid.UUID, Job] = {}
    pending = list(rows)
    # A conflicting job can vanish between our insert and our read (retention pruned it, an
    # operator deleted it); its rows are then inserted again. Three rounds is plenty: each
    # round either inserts or finds every row, barring a deletion racing us each time.
    for _ in range(3):
        with server_side_cursor(alias) as cursor:
            params = row_params(pending, conf.notify)
            cursor.execute(
                queries.ENQUEUE_JOBS_FROM_EVENT if "event_ids" in params else queries.ENQUEUE_JOBS,
                params,
            )
            returned = {job_id: (run_at, created_at) for job_id, run_at, created_at, _ in cursor}
        for row in pending:
            if row.id in returned:
                run_at, created_at = returned[row.id]
                created[row.id] = job_from_row(alias, row, run_at, created_at)
        conflicting = [r for r in pending if r.id not in returned]
        existing = _existing_jobs(alias, conflicting)
        pending = [r for r in conflicting if _key(r) not in existing]
        if not pending:
            return [created.get(r.id) or existing[_key(r)] for r in rows]
    raise EnqueueError(
        "idempotency_key",
        f"{pending[0].idempotency_key!r} conflicts with a job that keeps disappearing; try again",
    )


def _with_unique(alias: str, rows: Sequence[JobRow], notify: bool) -> list[Job]:
    """Insert ``rows``, some unique: those one by one, in order (a later one may meet the key of
    an earlier one), the others together."""
    from django_pgoutbox.unique_rows import insert_unique

    others = [row for row in rows if row.unique is None]
    written = iter(insert_rows(alias, others) if others else [])
    return [
        next(written) if row.unique is None else insert_unique(alias, row, notify) for row in rows
    ]


def row_params(rows: Sequence[JobRow], notify: bool) -> dict[str, Any]:
    """ENQUEUE_JOBS's (or ENQUEUE_JOBS_UNKEYED's) parameters for ``rows``; with ``event_ids``,
    those of the ``*_FROM_EVENT`` statements, if a subscriber enqueued any of them (a
    workflow's INSERT_STEPS adds its own to them)."""
    params = {
        "ids": [r.id for r in rows],
        "organization_ids": [r.organization_id for r in rows],
        "queues": [r.queue for r in rows],
        "job_types": [r.job_type for r in rows],
        "payloads": [r.payload_json for r in rows],
        "idempotency_keys": [r.idempotency_key for r in rows],
        "priorities": [r.priority for r in rows],
        "run_ats": [r.run_at for r in rows],
        "delays": [r.delay for r in rows],
        "max_attempts": [r.max_attempts for r in rows],
        "channel": JOBS_CHANNEL,
        "notify": notify,
    }
    if any(r.event_id is not None or r.trace_context is not None for r in rows):
        params["event_ids"] = [r.event_id for r in rows]
        params["trace_contexts"] = [r.trace_context for r in rows]
    return params


def _insert_one(alias: str, row: JobRow, notify: bool) -> Job:
    """Insert one row; return its job, or the existing one if its key is taken."""
    for _ in range(3):  # as in insert_rows: the holder of the key may vanish before we read it
        with server_side_cursor(alias) as cursor:
            cursor.execute(
                queries.ENQUEUE_JOB_UNKEYED if row.idempotency_key is None else queries.ENQUEUE_JOB,
                one_row_params(row, notify),
            )
            written = cursor.fetchone()
        if written is not None:
            return job_from_row(alias, row, written[0], written[1])
        existing = existing_job(alias, row)
        if existing is not None:
            return existing
    raise EnqueueError(
        "idempotency_key",
        f"{row.idempotency_key!r} conflicts with a job that keeps disappearing; try again",
    )


def one_row_params(row: JobRow, notify: bool) -> dict[str, Any]:
    """ENQUEUE_JOB's parameters for ``row``, which the one-row statements of unique jobs and
    sequences extend with their own."""
    return {
        "id": row.id,
        "organization_id": row.organization_id,
        "queue": row.queue,
        "job_type": row.job_type,
        "payload": row.payload_json,
        "idempotency_key": row.idempotency_key,
        "priority": row.priority,
        "run_at": row.run_at,
        "delay": row.delay,
        "max_attempts": row.max_attempts,
        "event_id": row.event_id,
        "trace_context": row.trace_context,
        "notify": notify,
        "channel": JOBS_CHANNEL,
    }


def _insert_unkeyed(alias: str, rows: Sequence[JobRow], notify: bool) -> list[Job]:
    """Insert rows without idempotency keys: nothing can conflict, nothing per row comes back."""
    with server_side_cursor(alias) as cursor:
        params = row_params(rows, notify)
        cursor.execute(
            queries.ENQUEUE_JOBS_UNKEYED_FROM_EVENT
            if "event_ids" in params
            else queries.ENQUEUE_JOBS_UNKEYED,
            params,
        )
        row = cursor.fetchone()
        assert row is not None
        now: datetime = row[0]
    # The statement's defaults, computed here: run_at = coalesce(run_at, now()) + delay.
    return jobs_from_rows(
        alias,
        rows,
        lambda r: (r.run_at or now) + timedelta(seconds=r.delay) if r.delay else (r.run_at or now),
        now,
    )


def existing_job(alias: str, row: JobRow) -> Job | None:
    """The job that holds the idempotency key of ``row`` (keyed), if one does."""
    return _existing_jobs(alias, [row]).get(_key(row))


def _key(row: JobRow) -> tuple[uuid.UUID | None, str, str | None]:
    return (row.organization_id, row.job_type, row.idempotency_key)


def _existing_jobs(
    alias: str, rows: Sequence[JobRow]
) -> dict[tuple[uuid.UUID | None, str, str | None], Job]:
    """The jobs that hold the idempotency keys of ``rows``, one query per (organization, type)."""
    groups: dict[tuple[uuid.UUID | None, str], set[str]] = defaultdict(set)
    for row in rows:
        assert row.idempotency_key is not None  # only keyed rows can conflict
        groups[(row.organization_id, row.job_type)].add(row.idempotency_key)
    found: dict[tuple[uuid.UUID | None, str, str | None], Job] = {}
    for (organization_id, job_type), keys in groups.items():
        matches = Job.objects.using(alias).filter(
            organization_id=organization_id, job_type=job_type, idempotency_key__in=keys
        )
        for existing in matches:
            existing.created = False
            found[(existing.organization_id, existing.job_type, existing.idempotency_key)] = (
                existing
            )
    return found
