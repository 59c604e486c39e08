"""``enqueue()`` and ``enqueue_many()``, and the relay's deferred enqueues.

Enqueueing writes through the Django connection of the chosen database, so it joins whatever
transaction the caller has open: roll it back and the job never existed. Every argument is checked
before anything is written, and a bad one raises :class:`~django_pgoutbox.errors.EnqueueError`
naming the argument (see ``job_rows``). Rows are written by ``insert_rows`` (``INSERT``) or, for
large batches without idempotency keys, by ``copy_rows`` (``COPY``).
"""

from __future__ import annotations

import operator
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from django_pgoutbox.conf import get_settings
from django_pgoutbox.copy_rows import COPY_MIN_ROWS, EnqueuedJobs, copy_unkeyed, copyable
from django_pgoutbox.db import tables_required
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.insert_rows import chunk_bounds, insert_rows
from django_pgoutbox.job_rows import (
    JobRow,
    job_database,
    job_from_row,
    scheduled_run_at,
    validate_items,
    validate_job,
)
from django_pgoutbox.models import Job
from django_pgoutbox.registry import Payload, statement_job_types
from django_pgoutbox.sequences import enqueue_in_sequence
from django_pgoutbox.tracing import current_context
from django_pgoutbox.uniqueness import Unique
from django_pgoutbox.workflows import UpstreamFailure, enqueue_after


def enqueue(
    job_type: str,
    payload: Payload,
    *,
    idempotency_key: str | None = None,
    organization_id: uuid.UUID | str | None = None,
    priority: int | None = None,
    run_at: datetime | timedelta | None = None,
    queue: str | None = None,
    using: str | None = None,
    after: Iterable[Job | uuid.UUID | str] | None = None,
    on_upstream_failure: UpstreamFailure = "cancel",
    unique: Unique | bool | None = None,
    on_conflict: str | None = None,
    debounce: timedelta | float | None = None,
    throttle: timedelta | float | None = None,
    sequence: str | None = None,
) -> Job:
    """Enqueue one job in the caller's transaction and return it.

    ``payload`` is a JSON object (a dict of JSON values). ``run_at`` is an aware datetime or a
    delay from now. ``queue``, ``priority`` and the attempt budget default to the job type's
    ``@job`` declaration, then to the ``default`` queue. A repeated ``idempotency_key`` for the
    same ``(organization_id, job_type)`` returns the job that already holds it, unchanged.

    One statement when the job is new; one more to read the existing job on a repeated key.
    Inside an outbox subscriber, a job without an idempotency key is written together with the
    other jobs of the relay's batch, in one statement before the batch commits (see
    :func:`deferred_enqueues`).

    ``after``: jobs (or their ids) enqueued before, that this one waits for: it is ``waiting``
    until all of them completed, then ``pending``. If one ends dead or cancelled, this job is
    cancelled (``upstream_failed``), unless ``on_upstream_failure="run"``: then it runs once
    all of them finished, whatever their outcome. An unknown job refuses the enqueue. See
    :mod:`django_pgoutbox.workflows` for graphs of new jobs.

    ``unique``, ``on_conflict``, ``debounce`` and ``throttle``: a unique job, written unless
    another job holds its key (docs/uniqueness.md); they default to the job type's ``@job``.
    ``job.created`` says whether this call wrote the job or returned the one holding the key.
    ``sequence``: a key (a non-empty string of at most 200 bytes): the jobs of one key run one at
    a time, in the order their enqueues committed, across every worker (or the job type's
    ``@job(sequence_by=...)`` gives the key). Written at once, also inside an outbox
    subscriber; not with ``after`` (``EnqueueError``). See :mod:`django_pgoutbox.sequences`.
    """
    prepared = prepare_job(
        job_type,
        payload,
        idempotency_key=idempotency_key,
        organization_id=organization_id,
        priority=priority,
        run_at=run_at,
        queue=queue,
        using=using,
        unique=unique,
        on_conflict=on_conflict,
        debounce=debounce,
        throttle=throttle,
        sequence=sequence,
    )
    waits = not (after is None or after == [] or after == ())
    if prepared._row.sequence_key is not None:
        if waits:
            raise EnqueueError(
                "after",
                "cannot be combined with sequence: a sequence job waits for the job of its key "
                "before it only (enqueue the sequence's jobs after the jobs they need instead)",
            )
        return enqueue_in_sequence(prepared.using, [prepared._row])[0]
    if after is None or not waits:  # a plain job (and after narrowed for the type checker)
        return enqueue_prepared(prepared)
    if prepared._row.unique is not None:
        raise EnqueueError(
            "after", "a unique job cannot wait for others (docs/uniqueness.md); pass unique=False"
        )
    return enqueue_after(prepared._row, after, on_upstream_failure, prepared.using)


def enqueue_prepared(prepared: PreparedJob) -> Job:
    """Write a job that ``prepare_job`` checked: now, or with the relay batch's other jobs."""
    collector: DeferredEnqueues | None = getattr(_deferring, "collector", None)
    if (
        collector is not None
        and collector.using == prepared.using
        and prepared._row.idempotency_key is None
        and prepared._row.unique is None
    ):
        return collector.add(prepared._row)
    return prepared.insert()


#: The relay's state on this thread: the batch's ``collector`` (``deferred_enqueues``) and the
#: ``event_id`` whose subscriber runs (``for_event``).
_deferring = threading.local()


@contextmanager
def for_event(event_id: uuid.UUID) -> Iterator[None]:
    """Within this block (on this thread), every job enqueued records ``event_id`` as the event
    it came from (``Job.event_id``): the relay and the delivery runner call each subscriber in
    one, so an event's page lists the jobs its subscribers enqueued."""
    previous = getattr(_deferring, "event_id", None)
    _deferring.event_id = event_id
    try:
        yield
    finally:
        _deferring.event_id = previous


def current_collector() -> DeferredEnqueues | None:
    """The relay batch's collector on this thread (``deferred_enqueues``), if one is open."""
    collector: DeferredEnqueues | None = getattr(_deferring, "collector", None)
    return collector


def _current_event() -> uuid.UUID | None:
    """The event whose subscriber runs on this thread (``for_event``), if one does."""
    event_id: uuid.UUID | None = getattr(_deferring, "event_id", None)
    return event_id


class DeferredEnqueues:
    """Jobs enqueued during an outbox batch, written together by ``flush()``."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._rows: list[tuple[JobRow, Job]] = []
        #: Ids of jobs of ``_rows`` written already (``write_now``), which ``flush()`` skips.
        self._written: set[uuid.UUID] = set()
        #: The last mark taken: the jobs added since are in the savepoint open now.
        self._floor = 0

    def add(self, row: JobRow) -> Job:
        job = job_from_row(self.using, row, None, None)
        self._rows.append((row, job))
        return job

    def mark(self) -> int:
        self._floor = len(self._rows)
        return self._floor

    def discard_from(self, mark: int) -> None:
        """Forget the jobs added since ``mark`` (their subscriber's savepoint rolled back)."""
        self._written.difference_update(row.id for row, _ in self._rows[mark:])
        del self._rows[mark:]
        self._floor = min(self._floor, mark)

    def write_now(self, ids: Iterable[uuid.UUID]) -> None:
        """Write at once the jobs among ``ids`` added since the last mark: a job enqueued with
        ``after=`` names them, and its edges need their rows. They keep their place, so that
        ``discard_from`` forgets them with their savepoint; ``flush()`` skips them. (A job added
        before the last mark is left to the flush: written in a later savepoint, a rollback of
        that one would lose it.)"""
        wanted = set(ids) - self._written
        now = [(row, job) for row, job in self._rows[self._floor :] if row.id in wanted]
        if not now:
            return
        for (_, job), job_written in zip(
            now, insert_rows(self.using, [row for row, _ in now]), strict=True
        ):
            job.run_at, job.created_at = job_written.run_at, job_written.created_at
        self._written.update(row.id for row, _ in now)

    def flush(self) -> None:
        """Insert every job added since the last flush, and fill in the times the database gave
        them. Those rows are forgotten even if the statement fails: the caller rolls back (to a
        savepoint) what it wrote."""
        rows = [(row, job) for row, job in self._rows if row.id not in self._written]
        self._rows, self._written, self._floor = [], set(), 0
        written = [row for row, _ in rows]
        if copyable(written):
            now, _ = copy_unkeyed(self.using, written, get_settings().notify)
            for row, job in rows:
                job.run_at, job.created_at = scheduled_run_at(row, now), now
            return
        for start, end in chunk_bounds(written):
            for (_, job), job_written in zip(
                rows[start:end], insert_rows(self.using, written[start:end]), strict=True
            ):
                job.run_at, job.created_at = job_written.run_at, job_written.created_at


@contextmanager
def deferred_enqueues(using: str) -> Iterator[DeferredEnqueues]:
    """Within this block (on this thread), ``enqueue()`` without an idempotency key on ``using``
    only collects the job; ``flush()`` writes them all in one statement per 5,000 (or per
    64 Mi characters of payload).

    The outbox relay projects a batch of events inside one: the jobs its subscribers enqueue cost
    one statement for the whole batch instead of one each. The returned ``Job`` objects get their
    ``run_at`` and ``created_at`` at the flush; until then the rows do not exist, so a subscriber
    that reads back the job it just enqueued should pass an idempotency key (written at once).
    A job that a later ``enqueue(after=[...])`` names is written at once too (``write_now``).
    """
    previous = getattr(_deferring, "collector", None)
    collector = DeferredEnqueues(using)
    _deferring.collector = collector
    try:
        yield collector
    finally:
        _deferring.collector = previous


@dataclass(frozen=True)
class PreparedJob:
    """A validated job with its id, not written yet: ``insert()`` writes it (and returns it)."""

    id: uuid.UUID
    using: str
    _row: JobRow = field(repr=False)

    def insert(self) -> Job:
        # Here, not in enqueue(): the django.tasks backend inserts on commit, after it returned.
        with tables_required(self.using, EnqueueError):
            return insert_rows(self.using, [self._row])[0]


def prepare_job(
    job_type: str,
    payload: Payload,
    *,
    idempotency_key: str | None = None,
    organization_id: uuid.UUID | str | None = None,
    priority: int | None = None,
    run_at: datetime | timedelta | None = None,
    queue: str | None = None,
    using: str | None = None,
    declared: bool = False,
    unique: Unique | bool | None = None,
    on_conflict: str | None = None,
    debounce: timedelta | float | None = None,
    throttle: timedelta | float | None = None,
    sequence: str | None = None,
) -> PreparedJob:
    """Validate a job as :func:`enqueue` does and fix its id, to insert it later.

    For callers that must know the id before the row exists (an enqueue on commit).
    ``declared``: the caller vouches for ``job_type`` though no ``@job`` declares it (a
    django.tasks task), so that it is neither warned about nor refused.
    """
    alias = job_database(using)
    row = validate_job(
        job_type,
        payload,
        idempotency_key=idempotency_key,
        organization_id=organization_id,
        priority=priority,
        run_at=run_at,
        queue=queue,
        prefix="",
        declared=declared,
        unique=unique,
        on_conflict=on_conflict,
        debounce=debounce,
        throttle=throttle,
        sequence=sequence,
    )
    # The event whose subscriber is running, if one is: the job came from it, even if it is
    # written later (on commit).
    row.event_id = _current_event()
    row.trace_context = current_context()
    return PreparedJob(row.id, alias, row)


def enqueue_many(items: Iterable[Mapping[str, Any]], *, using: str | None = None) -> Sequence[Job]:
    """Enqueue many jobs atomically, in a few statements, and return them in input order.

    Each item is a mapping with ``job_type`` and ``payload`` and, optionally, the keyword arguments
    of :func:`enqueue` (``idempotency_key``, ``organization_id``, ``priority``, ``run_at``,
    ``queue``). One bad item refuses the whole batch with an error naming its index, and
    nothing of the batch is written; the caller's transaction stays usable. Items that repeat an
    idempotency key (of an existing job or of an earlier item) return the job that holds it.

    From ``COPY_MIN_ROWS`` (64) items without idempotency keys, the rows are written with one
    binary ``COPY``, checked as it goes (a bad item aborts it, and a savepoint takes back what
    it wrote), and the result is an :class:`EnqueuedJobs`, which builds each ``Job`` when it is
    first read. Otherwise every item is checked first, the rows are inserted 5,000 (or 64 Mi
    characters of payload) per statement, and the result is a list.
    """
    alias = job_database(using)
    conf = get_settings()
    items = items if isinstance(items, Sequence) else list(items)
    if not items:
        return []
    rows = validate_items(items, conf)
    event_id, trace_context = _current_event(), current_context()
    if event_id is not None or trace_context is not None:
        rows = _from_event(rows, event_id, trace_context)
    with tables_required(alias, EnqueueError):
        return _write_items(alias, items, rows, conf.notify)


def _write_items(
    alias: str, items: Sequence[Any], rows: Iterator[JobRow], notify: bool
) -> Sequence[Job]:
    if len(items) >= COPY_MIN_ROWS and not _any_key(items):
        # The items are checked as the COPY goes, so that the server parses one chunk while the
        # next is checked. A bad item aborts the COPY; the savepoint (or transaction) of this
        # block then rolls back what it wrote, and the caller's transaction goes on unharmed.
        with transaction.atomic(using=alias):
            now, written = copy_unkeyed(alias, rows, notify)
        return EnqueuedJobs(alias, written, now)
    checked = list(rows)
    if any(row.sequence_key is not None for row in checked):
        return _write_with_sequences(alias, checked, notify)
    with transaction.atomic(using=alias, savepoint=False):
        return _write(alias, checked, notify)


def _write_with_sequences(alias: str, rows: Sequence[JobRow], notify: bool) -> list[Job]:
    """The items without a sequence as ``_write`` writes them, then those with one, in item
    order (every key's lock first, in one fixed order: see ``sequences``)."""
    plain = [row for row in rows if row.sequence_key is None]
    with transaction.atomic(using=alias, savepoint=False):
        written = iter(_write(alias, plain, notify) if plain else [])
        in_sequence = iter(
            enqueue_in_sequence(alias, [row for row in rows if row.sequence_key is not None])
        )
    return [next(in_sequence if row.sequence_key is not None else written) for row in rows]


def _from_event(
    rows: Iterator[JobRow], event_id: uuid.UUID | None, trace_context: str | None
) -> Iterator[JobRow]:
    for row in rows:
        row.event_id = event_id
        row.trace_context = trace_context
        yield row


def _any_key(items: Sequence[Any]) -> bool:
    """Whether any item needs a statement of its own rather than ``COPY``, which has no
    ``ON CONFLICT`` and no sequence's lock: an idempotency key, an argument of uniqueness or a
    sequence, or a job type whose ``@job`` makes it unique or sequenced. A malformed item counts
    as one, so that the batch is checked whole before anything is written, and the error names
    it."""
    try:
        if any(map(_GET_KEY, items)):
            return True
        if any(len(item) > 2 and not _OWN_STATEMENT_KEYS.isdisjoint(item) for item in items):
            return True
        declared = statement_job_types()
        return bool(declared) and not declared.isdisjoint(map(_GET_JOB_TYPE, items))
    except (AttributeError, TypeError):
        return True


_GET_KEY = operator.methodcaller("get", "idempotency_key")
_GET_JOB_TYPE = operator.methodcaller("get", "job_type")
_OWN_STATEMENT_KEYS = frozenset({"unique", "on_conflict", "debounce", "throttle", "sequence"})


def _write(alias: str, rows: Sequence[JobRow], notify: bool) -> Sequence[Job]:
    """Insert ``rows`` (any number) in the caller's transaction; return their jobs in order.

    Batches without idempotency keys of ``COPY_MIN_ROWS`` or more go through ``COPY`` and come
    back as :class:`EnqueuedJobs`; the rest go through ``INSERT`` statements of at most
    ``ENQUEUE_CHUNK_SIZE`` rows and ``ENQUEUE_CHUNK_CHARACTERS`` of payload (keys need
    ``ON CONFLICT``).
    """
    if copyable(rows):
        now, written = copy_unkeyed(alias, rows, notify)
        return EnqueuedJobs(alias, written, now)
    jobs: list[Job] = []
    for start, end in chunk_bounds(rows):
        jobs.extend(insert_rows(alias, rows[start:end]))
    return jobs
