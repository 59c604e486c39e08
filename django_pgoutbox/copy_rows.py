"""Writing a batch of rows without idempotency keys with one binary ``COPY``, and
``EnqueuedJobs``, the lazy sequence of the jobs it wrote."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import overload

from django.db import connections

from django_pgoutbox import queries
from django_pgoutbox.conf import JOBS_CHANNEL
from django_pgoutbox.db import server_side_cursor
from django_pgoutbox.job_rows import JobRow, job_from_row, jobs_from_rows, scheduled_run_at
from django_pgoutbox.models import Job

#: Batches without idempotency keys from this size on are written with ``COPY``, which spares
#: the client the arrays of ``INSERT ... SELECT FROM unnest(...)`` but costs two more round
#: trips; smaller ones go in one ``INSERT``.
COPY_MIN_ROWS = 64

#: Rows encoded and sent to ``COPY`` at a time: the server writes one chunk while the client
#: checks and encodes the next.
COPY_CHUNK_SIZE = 2000


def copyable(rows: Sequence[JobRow]) -> bool:
    return len(rows) >= COPY_MIN_ROWS and all(
        row.idempotency_key is None and row.unique is None for row in rows
    )


def copy_unkeyed(alias: str, rows: Iterable[JobRow], notify: bool) -> tuple[datetime, list[JobRow]]:
    """Write rows without idempotency keys with one ``COPY``, in the caller's transaction.

    Returns the transaction's ``now()`` and the rows written. ``COPY_JOBS_NOW`` first reads that
    ``now()``; each row's ``run_at`` is computed from it as the column's default would, and
    ``created_at`` is left to that default, which is the same ``now()``. The rows go out
    ``COPY_CHUNK_SIZE`` at a time, so that the server writes one chunk while the client makes
    the next (``rows`` may be a generator that checks each row as it comes).
    ``WAKE_QUEUES`` then queues one wake-up per queue, sent at commit.
    """
    wrapper = connections[alias]
    written: list[JobRow] = []
    with server_side_cursor(alias) as cursor:
        cursor.execute(queries.COPY_JOBS_NOW)
        fetched = cursor.fetchone()
        assert fetched is not None
        now: datetime = fetched[0]
        encoder = _CopyRows(now)
        encode = encoder.row
        # COPY bypasses Django's execute(); log it as execute() would (DEBUG, assertNumQueries).
        logged = cursor.debug_sql(queries.COPY_JOBS) if wrapper.queries_logged else nullcontext()
        with logged, wrapper.wrap_database_errors, cursor.cursor.copy(queries.COPY_JOBS) as copy:
            chunk: list[bytes] = [encoder.HEADER]
            for row in rows:
                chunk.append(encode(row))
                written.append(row)
                if len(chunk) >= COPY_CHUNK_SIZE:
                    copy.write(b"".join(chunk))
                    chunk.clear()
            chunk.append(encoder.TRAILER)
            copy.write(b"".join(chunk))
        if notify:
            cursor.execute(
                queries.WAKE_QUEUES, [JOBS_CHANNEL, sorted({row.queue for row in written})]
            )
    return now, written


class EnqueuedJobs(Sequence[Job]):
    """The jobs that ``enqueue_many()`` wrote with ``COPY``, in input order.

    A read-only sequence (``len()``, indexing, slicing, iteration, ``==`` with a list) whose
    saved ``Job`` instances are built when first read: making 100,000 model instances took
    longer than writing their rows, and most callers of a bulk enqueue never read them. ``list()``
    it for a list.
    """

    __slots__ = ("_alias", "_jobs", "_now", "_rows")

    def __init__(self, alias: str, rows: Sequence[JobRow], now: datetime) -> None:
        self._alias = alias
        self._rows = rows
        self._now = now
        self._jobs: list[Job | None] = [None] * len(rows)

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...

    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._rows)))]
        job = self._jobs[index]
        if job is None:
            row = self._rows[index]
            job = self._jobs[index] = job_from_row(
                self._alias, row, scheduled_run_at(row, self._now), self._now
            )
        return job

    def __iter__(self) -> Iterator[Job]:
        missing = [index for index, job in enumerate(self._jobs) if job is None]
        if missing:
            # All at once: one template row for every Job, rather than one per Job.
            now = self._now
            built = jobs_from_rows(
                self._alias,
                [self._rows[i] for i in missing],
                lambda r: scheduled_run_at(r, now),
                now,
            )
            for index, job in zip(missing, built, strict=True):
                self._jobs[index] = job
        return iter(self._jobs)  # type: ignore[arg-type]  # every entry is a Job now

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EnqueuedJobs | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like a list

    def __repr__(self) -> str:
        return f"<EnqueuedJobs: {len(self._rows)} jobs>"


class _CopyRows:
    """Rows in the binary format of ``COPY_JOBS``: no text for the server to parse, no escaping.

    Each field is its length then its bytes (``-1``: NULL). The parts that repeat from row to row
    (organization, queue and job type; priority, ``run_at`` and attempt budget) are encoded
    once per distinct value and reused.
    """

    #: The binary COPY header: signature, flags, header extension length.
    HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
    TRAILER = b"\xff\xff"
    _ID = struct.Struct(">hiQQ").pack  # 10 fields, then the id: 16 bytes as two halves
    _JSONB = struct.Struct(">ib").pack  # length, jsonb format version 1
    _TAIL = struct.Struct(">iiiqii").pack  # priority, run_at (microseconds), max_attempts
    _NULL = b"\xff\xff\xff\xff"
    _UUID = b"\x00\x00\x00\x10"
    _LENGTH = struct.Struct(">i").pack

    def __init__(self, now: datetime) -> None:
        self._now = now
        self._now_us = _micros(now)
        self._middles: dict[tuple[uuid.UUID | None, str, str], bytes] = {}
        self._tails: dict[tuple[int, int, int, uuid.UUID | None, str | None], bytes] = {}

    def row(self, row: JobRow) -> bytes:
        key = (row.organization_id, row.queue, row.job_type)
        middle = self._middles.get(key)
        if middle is None:
            middle = self._middles[key] = self._middle(*key)
        run_at = (
            self._now_us
            if row.run_at is None and not row.delay
            else _micros(scheduled_run_at(row, self._now))
        )
        tail_key = (row.priority, run_at, row.max_attempts, row.event_id, row.trace_context)
        tail = self._tails.get(tail_key)
        if tail is None:
            event = self._NULL if row.event_id is None else self._UUID + row.event_id.bytes
            tail = self._tails[tail_key] = (
                self._TAIL(4, row.priority, 8, run_at, 4, row.max_attempts)
                + event
                + self._jsonb(row.trace_context)
            )
        payload = row.payload_json.encode()
        return b"".join(
            (
                self._ID(10, 16, row.id.int >> 64, row.id.int & 0xFFFF_FFFF_FFFF_FFFF),
                middle,
                self._JSONB(len(payload) + 1, 1),
                payload,
                tail,
            )
        )

    def _jsonb(self, text: str | None) -> bytes:
        if text is None:
            return self._NULL
        encoded = text.encode()
        return self._JSONB(len(encoded) + 1, 1) + encoded

    def _middle(self, organization_id: uuid.UUID | None, queue: str, job_type: str) -> bytes:
        org = (
            b"\xff\xff\xff\xff"
            if organization_id is None
            else b"\x00\x00\x00\x10" + organization_id.bytes
        )
        queue_bytes, type_bytes = queue.encode(), job_type.encode()
        return b"".join(
            (
                org,
                self._LENGTH(len(queue_bytes)),
                queue_bytes,
                self._LENGTH(len(type_bytes)),
                type_bytes,
            )
        )


#: PostgreSQL's timestamps count microseconds from 2000-01-01 UTC.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _PG_EPOCH) // _MICROSECOND
