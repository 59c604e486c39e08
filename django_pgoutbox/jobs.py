"""The ``@job`` registry and ``enqueue()`` / ``enqueue_many()``.

Enqueueing writes through the Django connection of the chosen database, so it joins whatever
transaction the caller has open: roll it back and the job never existed. Every argument is checked
before anything is written, and a bad one raises :class:`~django_pgoutbox.errors.EnqueueError`
naming the argument.
"""

from __future__ import annotations

import inspect
import logging
import operator
import struct
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeAlias, overload

from django.conf import settings
from django.db import connections, router, transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import CANCEL_CHANNEL, JOBS_CHANNEL, PgOutboxSettings, get_settings
from django_pgoutbox.db import server_side_cursor
from django_pgoutbox.errors import Cancelled, EnqueueError, JobRegistrationError
from django_pgoutbox.ids import uuid7, uuid7_many
from django_pgoutbox.models import Job, JobStatus, empty_row, instance_from_row
from django_pgoutbox.validation import json_object, non_empty_text, optional_uuid, reject_nul

Payload: TypeAlias = dict[str, Any]
Handler: TypeAlias = Callable[[Payload, "JobContext"], Any]

#: Rows per INSERT statement in ``enqueue_many``; bounds the size of one statement.
ENQUEUE_CHUNK_SIZE = 5000

#: Batches without idempotency keys from this size on are written with ``COPY``, which spares
#: the client the arrays of ``INSERT ... SELECT FROM unnest(...)`` but costs two more round
#: trips; smaller ones go in one ``INSERT``.
COPY_MIN_ROWS = 64

#: Rows encoded and sent to ``COPY`` at a time: the server writes one chunk while the client
#: checks and encodes the next.
COPY_CHUNK_SIZE = 2000

_INT32 = (-(2**31), 2**31 - 1)


class CancelFlag:
    """Whether a running job's cancellation was requested: set by the worker, read by the handler.

    A bare attribute rather than a ``threading.Event``, which costs a lock and a condition for
    every job claimed; setting and reading one attribute is atomic in Python.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@dataclass
class JobContext:
    """What a handler knows about the attempt it is running."""

    job_id: uuid.UUID
    job_type: str
    attempt: int
    organization_id: uuid.UUID | None
    queue: str
    logger: logging.LoggerAdapter[logging.Logger]
    _renew: Callable[[], None] = field(repr=False)
    #: The worker id of every attempt so far, this one last.
    worker_ids: list[str] = field(default_factory=list)
    #: The database alias the job lives in (``runworkers --database``): where a handler that
    #: enqueues follow-up work, or reads the jobs tables, should do it.
    using: str = "default"
    #: Set by the worker when it learns that cancellation was requested.
    _cancel: CancelFlag = field(default_factory=CancelFlag, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once someone asked this job to stop (seen at the worker's next lease renewal).

        Cooperative: check it between steps, and return or ``raise_if_cancelled()`` to stop.
        """
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~django_pgoutbox.errors.Cancelled` if cancellation was requested."""
        if self._cancel.is_set():
            raise Cancelled(f"job {self.job_id} was cancelled while it ran")

    def renew_lease(self) -> None:
        """Extend this attempt's lease now (workers also renew it on their own while it runs).

        Raises :class:`~django_pgoutbox.errors.Cancelled` if the job's cancellation was requested,
        and :class:`~django_pgoutbox.errors.LeaseLost` if another worker took the job over.
        """
        self._renew()
        self.raise_if_cancelled()


class JobDefinition:
    """A registered handler with its defaults; calling it runs the handler in-process."""

    def __init__(
        self,
        func: Handler,
        *,
        name: str,
        queue: str,
        max_attempts: int | None,
        priority: int,
        timeout: float | None = None,
        isolation: str = "thread",
    ) -> None:
        self.func = func
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.priority = priority
        #: Seconds an attempt may run before it fails with code ``timeout``; None: no limit.
        self.timeout = timeout
        #: "thread" (the worker's handler threads) or "process" (a child process per attempt,
        #: killed at the timeout or on cancellation).
        self.isolation = isolation
        #: Optional ``error -> (code, summary)`` replacing the class name and message that the
        #: retry policy records (the django.tasks backend stores a class path and a traceback).
        self.error_details: Callable[[BaseException], tuple[str, str]] | None = None
        #: Optional hooks the worker calls around each attempt, as it sends ``job_started`` and
        #: ``job_finished``, with the same arguments (the django.tasks backend sends Django's
        #: task signals from them): hooks of the handler that need them, rather than receivers
        #: that every job of every type would go through.
        self.on_started: Callable[..., None] | None = None
        self.on_finished: Callable[..., None] | None = None
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__module__ = func.__module__

    def __repr__(self) -> str:
        return f"<JobDefinition {self.name!r} queue={self.queue!r}>"

    def __call__(self, payload: Payload, ctx: JobContext) -> Any:
        return self.func(payload, ctx)

    def enqueue(
        self,
        payload: Payload,
        *,
        idempotency_key: str | None = None,
        organization_id: uuid.UUID | str | None = None,
        priority: int | None = None,
        run_at: datetime | timedelta | None = None,
        queue: str | None = None,
        using: str | None = None,
    ) -> Job:
        """Enqueue this job type; see :func:`enqueue`."""
        return enqueue(
            self.name,
            payload,
            idempotency_key=idempotency_key,
            organization_id=organization_id,
            priority=priority,
            run_at=run_at,
            queue=queue,
            using=using,
        )


_registry: dict[str, JobDefinition] = {}


def registered_jobs() -> Mapping[str, JobDefinition]:
    """Every registered job type, by name."""
    return dict(_registry)


def get_job(name: str) -> JobDefinition | None:
    """The definition registered under ``name``, or None (a handler deployed elsewhere)."""
    return _registry.get(name)


@overload
def job(func: Handler, /) -> JobDefinition: ...


@overload
def job(
    name: str | None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    priority: int = 0,
    timeout: float | timedelta | None = None,
    isolation: str = "thread",
) -> Callable[[Handler], JobDefinition]: ...


def job(
    name: str | Handler | None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    priority: int = 0,
    timeout: float | timedelta | None = None,
    isolation: str = "thread",
) -> JobDefinition | Callable[[Handler], JobDefinition]:
    """Register ``handler(payload: dict, ctx: JobContext)`` as a job type.

    Use it bare (``@job``) or with options (``@job("emails.send", queue="notifications")``). The
    name defaults to ``module.function``; it is what is stored in ``jobs.job_type``, so keep it
    stable across deployments. ``max_attempts`` defaults to ``PGOUTBOX["MAX_ATTEMPTS"]``.

    ``timeout`` (seconds or a timedelta) fails an attempt that runs longer with code ``timeout``,
    retried by the policy. ``isolation="process"`` runs each attempt in a child process that is
    killed at the timeout or on cancellation (see docs/jobs.md, "Timeouts").
    """
    options = _Options(queue, max_attempts, priority, timeout, isolation)
    if callable(name):
        return _register(name, None, options)
    if name is not None and (not isinstance(name, str) or not name.strip() or "\x00" in name):
        raise JobRegistrationError(f"@job name must be a non-empty string, not {name!r}")

    def decorator(func: Handler) -> JobDefinition:
        return _register(func, name, options)

    return decorator


@dataclass(frozen=True)
class _Options:
    queue: str
    max_attempts: int | None
    priority: int
    timeout: float | timedelta | None
    isolation: str


ISOLATION_MODES = ("thread", "process")


def _register(func: Handler, name: str | None, options: _Options) -> JobDefinition:
    if not callable(func):
        raise JobRegistrationError(f"@job must decorate a function, not {func!r}")
    job_name = name or f"{func.__module__}.{func.__qualname__}"
    queue, max_attempts, priority = options.queue, options.max_attempts, options.priority
    if not isinstance(queue, str) or not queue:
        raise JobRegistrationError(f"@job {job_name!r}: queue must be a non-empty string")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        raise JobRegistrationError(
            f"@job {job_name!r}: max_attempts must be an integer >= 1, not {max_attempts!r}"
        )
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise JobRegistrationError(f"@job {job_name!r}: priority must be an int, not {priority!r}")
    timeout = options.timeout
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout < float("inf")
    ):
        raise JobRegistrationError(
            f"@job {job_name!r}: timeout must be a number of seconds > 0 or a timedelta, "
            f"not {options.timeout!r}"
        )
    if options.isolation not in ISOLATION_MODES:
        raise JobRegistrationError(
            f"@job {job_name!r}: isolation must be 'thread' or 'process', not {options.isolation!r}"
        )
    _check_signature(job_name, func)
    existing = _registry.get(job_name)
    if existing is not None and _qualified(existing.func) != _qualified(func):
        raise JobRegistrationError(
            f"job type {job_name!r} is already registered by {_qualified(existing.func)}; "
            "give one of them another name"
        )
    definition = JobDefinition(
        func,
        name=job_name,
        queue=queue,
        max_attempts=max_attempts,
        priority=priority,
        timeout=None if timeout is None else float(timeout),
        isolation=options.isolation,
    )
    _registry[job_name] = definition
    return definition


def _qualified(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{getattr(func, '__qualname__', repr(func))}"


def _check_signature(name: str, func: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        signature.bind(object(), object())
    except TypeError:
        raise JobRegistrationError(
            f"@job {name!r}: the handler must accept (payload, ctx); its signature is "
            f"{func.__name__}{signature}"
        ) from None


# -- enqueue -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Row:
    """One validated job, ready for ``ENQUEUE_JOBS``."""

    id: uuid.UUID
    organization_id: uuid.UUID | None
    queue: str
    job_type: str
    payload: Payload
    payload_json: str
    idempotency_key: str | None
    priority: int
    run_at: datetime | None
    delay: float  # seconds after run_at (or now)
    max_attempts: int


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
    )
    collector: _Deferred | None = getattr(_deferring, "collector", None)
    if collector is not None and collector.using == prepared.using and idempotency_key is None:
        return collector.add(prepared._row)
    return prepared.insert()


_deferring = threading.local()


class _Deferred:
    """Jobs enqueued during an outbox batch, written together by ``flush()``."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._rows: list[tuple[_Row, Job]] = []

    def add(self, row: _Row) -> Job:
        _check_writable(row)
        job = _job_from(self.using, row, None, None)
        self._rows.append((row, job))
        return job

    def mark(self) -> int:
        return len(self._rows)

    def discard_from(self, mark: int) -> None:
        """Forget the jobs added since ``mark`` (their subscriber's savepoint rolled back)."""
        del self._rows[mark:]

    def flush(self) -> None:
        """Insert every job added since the last flush, and fill in the times the database gave
        them. Those rows are forgotten even if the statement fails: the caller rolls back (to a
        savepoint) what it wrote."""
        rows, self._rows = self._rows, []
        written = [row for row, _ in rows]
        if _copyable(written):
            now, _ = _copy_unkeyed(self.using, written, get_settings().notify)
            for row, job in rows:
                job.run_at, job.created_at = _run_at(row, now), now
            return
        for start in range(0, len(rows), ENQUEUE_CHUNK_SIZE):
            chunk = rows[start : start + ENQUEUE_CHUNK_SIZE]
            for (_, job), job_written in zip(
                chunk, _insert(self.using, [r for r, _ in chunk]), strict=True
            ):
                job.run_at, job.created_at = job_written.run_at, job_written.created_at


#: The latest ``run_at`` a deferred job may have: a day short of Python's last date, so that the
#: row reads back as a ``datetime`` whatever its time zone (PostgreSQL would store later ones).
_LAST_RUN_AT = datetime.max.replace(tzinfo=UTC) - timedelta(days=1)


def _check_writable(row: _Row) -> None:
    """Refuse, inside the subscriber that enqueues it, a job that the batch's flush cannot write.

    ``enqueue()``'s checks let through a ``run_at`` of ``timedelta(days=3_000_000)`` (the date
    is only computed when the row is written) and a priority that comes from a ``@job``
    declaration. Raised here, in the subscriber, the error is that event's failure, rather than
    the failure of the statement that writes the jobs of every event of the batch.
    """
    try:
        late = _run_at(row, datetime.now(UTC)) > _LAST_RUN_AT
    except OverflowError:
        late = True
    if late:
        scheduled = row.run_at or f"now + {row.delay:g} seconds"
        raise EnqueueError(
            "run_at", f"{scheduled} is outside the dates a job can have (up to {_LAST_RUN_AT:%Y})"
        )
    for name, value in (("priority", row.priority), ("max_attempts", row.max_attempts)):
        if not _INT32[0] <= value <= _INT32[1]:
            raise EnqueueError(name, f"{value} is outside the 32-bit integer range")


@contextmanager
def deferred_enqueues(using: str) -> Iterator[_Deferred]:
    """Within this block (on this thread), ``enqueue()`` without an idempotency key on ``using``
    only collects the job; ``flush()`` writes them all in one statement per 5,000.

    The outbox relay projects a batch of events inside one: the jobs its subscribers enqueue cost
    one statement for the whole batch instead of one each. The returned ``Job`` objects get their
    ``run_at`` and ``created_at`` at the flush; until then the rows do not exist, so a subscriber
    that reads back the job it just enqueued should pass an idempotency key (written at once).
    """
    previous = getattr(_deferring, "collector", None)
    collector = _Deferred(using)
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
    _row: _Row = field(repr=False)

    def insert(self) -> Job:
        return _insert(self.using, [self._row])[0]


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
) -> PreparedJob:
    """Validate a job as :func:`enqueue` does and fix its id, to insert it later.

    For callers that must know the id before the row exists (an enqueue on commit).
    """
    alias = _database(using)
    row = _validate(
        job_type,
        payload,
        idempotency_key=idempotency_key,
        organization_id=organization_id,
        priority=priority,
        run_at=run_at,
        queue=queue,
        prefix="",
    )
    return PreparedJob(row.id, alias, row)


#: Keys an ``enqueue_many`` item may have.
_ITEM_KEYS = frozenset(
    {"job_type", "payload", "idempotency_key", "organization_id", "priority", "run_at", "queue"}
)


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
    first read. Otherwise every item is checked first, the rows are inserted 5,000 per
    statement, and the result is a list.
    """
    alias = _database(using)
    conf = get_settings()
    items = items if isinstance(items, Sequence) else list(items)
    if not items:
        return []
    rows = _validated(items, conf)
    if len(items) >= COPY_MIN_ROWS and not _any_key(items):
        # The items are checked as the COPY goes, so that the server parses one chunk while the
        # next is checked. A bad item aborts the COPY; the savepoint (or transaction) of this
        # block then rolls back what it wrote, and the caller's transaction goes on unharmed.
        with transaction.atomic(using=alias):
            now, written = _copy_unkeyed(alias, rows, conf.notify)
        return EnqueuedJobs(alias, written, now)
    checked = list(rows)
    with transaction.atomic(using=alias, savepoint=False):
        return _write(alias, checked, conf.notify)


def _any_key(items: Sequence[Any]) -> bool:
    """Whether any item may have an idempotency key (a malformed item counts as one, so that
    the batch is checked whole before anything is written, and the error names it)."""
    try:
        return any(map(_GET_KEY, items))
    except (AttributeError, TypeError):
        return True


_GET_KEY = operator.methodcaller("get", "idempotency_key")


def _validated(items: Sequence[Mapping[str, Any]], conf: PgOutboxSettings) -> Iterator[_Row]:
    """Each item of ``enqueue_many`` as a row, or ``EnqueueError`` naming the first bad one."""
    ids = uuid7_many(len(items))
    # An item of only job_type and payload takes its queue, priority and attempt budget from
    # its job type alone: after the first such item of a type, the next ones reuse what it
    # resolved to, and only their payload is checked (a third of the time of a full check).
    plain: dict[str, tuple[str, int, int]] = {}
    for index, item in enumerate(items):
        if type(item) is dict and len(item) == 2:
            job_type = item.get("job_type")
            payload = item.get("payload")
            defaults = plain.get(job_type) if type(job_type) is str else None
            if defaults is not None and type(payload) is dict:
                queue, priority, max_attempts = defaults
                yield _Row(
                    ids[index],
                    None,
                    queue,
                    job_type,  # type: ignore[arg-type]  # a str: it is a key of plain
                    payload,
                    json_object(payload, f"items[{index}].payload", EnqueueError),
                    None,
                    priority,
                    None,
                    0.0,
                    max_attempts,
                )
                continue
        if type(item) is not dict and not isinstance(item, Mapping):
            raise EnqueueError(f"items[{index}]", f"must be a dict, not {type(item).__name__}")
        if not _ITEM_KEYS.issuperset(item):
            unknown = sorted(set(item) - _ITEM_KEYS, key=str)
            raise EnqueueError(
                f"items[{index}]",
                f"unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_ITEM_KEYS))}",
            )
        if "job_type" not in item or "payload" not in item:
            missing = "job_type" if "job_type" not in item else "payload"
            raise EnqueueError(f"items[{index}].{missing}", "is required")
        row = _validate(
            item["job_type"],
            item["payload"],
            idempotency_key=item.get("idempotency_key"),
            organization_id=item.get("organization_id"),
            priority=item.get("priority"),
            run_at=item.get("run_at"),
            queue=item.get("queue"),
            prefix=f"items[{index}].",
            conf=conf,
            job_id=ids[index],
        )
        if len(item) == 2:
            plain[row.job_type] = (row.queue, row.priority, row.max_attempts)
        yield row


def _database(using: str | None) -> str:
    if using is None:
        return router.db_for_write(Job)
    if using not in settings.DATABASES:
        raise EnqueueError(
            "using", f"no database {using!r} in DATABASES ({', '.join(settings.DATABASES)})"
        )
    return using


def _write(alias: str, rows: Sequence[_Row], notify: bool) -> Sequence[Job]:
    """Insert ``rows`` (any number) in the caller's transaction; return their jobs in order.

    Batches without idempotency keys of ``COPY_MIN_ROWS`` or more go through ``COPY`` and come
    back as :class:`EnqueuedJobs`; the rest go through ``INSERT`` statements of
    ``ENQUEUE_CHUNK_SIZE`` rows (keys need ``ON CONFLICT``).
    """
    if _copyable(rows):
        now, written = _copy_unkeyed(alias, rows, notify)
        return EnqueuedJobs(alias, written, now)
    jobs: list[Job] = []
    for start in range(0, len(rows), ENQUEUE_CHUNK_SIZE):
        jobs.extend(_insert(alias, rows[start : start + ENQUEUE_CHUNK_SIZE]))
    return jobs


def _copyable(rows: Sequence[_Row]) -> bool:
    return len(rows) >= COPY_MIN_ROWS and all(row.idempotency_key is None for row in rows)


def _copy_unkeyed(alias: str, rows: Iterable[_Row], notify: bool) -> tuple[datetime, list[_Row]]:
    """Write rows without idempotency keys with one ``COPY``, in the caller's transaction.

    Returns the transaction's ``now()`` and the rows written. ``COPY_JOBS_NOW`` first reads that
    ``now()``; each row's ``run_at`` is computed from it as the column's default would, and
    ``created_at`` is left to that default, which is the same ``now()``. The rows go out
    ``COPY_CHUNK_SIZE`` at a time, so that the server writes one chunk while the client makes
    the next (``rows`` may be a generator that checks each row as it comes).
    ``WAKE_QUEUES`` then queues one wake-up per queue, sent at commit.
    """
    wrapper = connections[alias]
    written: list[_Row] = []
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

    def __init__(self, alias: str, rows: Sequence[_Row], now: datetime) -> None:
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
            job = self._jobs[index] = _job_from(
                self._alias, row, _run_at(row, self._now), self._now
            )
        return job

    def __iter__(self) -> Iterator[Job]:
        missing = [index for index, job in enumerate(self._jobs) if job is None]
        if missing:
            # All at once: one template row for every Job, rather than one per Job.
            now = self._now
            built = _jobs_from(
                self._alias, [self._rows[i] for i in missing], lambda r: _run_at(r, now), now
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


def _run_at(row: _Row, now: datetime) -> datetime:
    """The statement's default: ``coalesce(run_at, now()) + delay``."""
    start = row.run_at or now
    return start + timedelta(seconds=row.delay) if row.delay else start


class _CopyRows:
    """Rows in the binary format of ``COPY_JOBS``: no text for the server to parse, no escaping.

    Each field is its length then its bytes (``-1``: NULL). The parts that repeat from row to row
    (organization, queue and job type; priority, ``run_at`` and attempt budget) are encoded
    once per distinct value and reused.
    """

    #: The binary COPY header: signature, flags, header extension length.
    HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
    TRAILER = b"\xff\xff"
    _ID = struct.Struct(">hiQQ").pack  # 8 fields, then the id: 16 bytes as two halves
    _JSONB = struct.Struct(">ib").pack  # length, jsonb format version 1
    _TAIL = struct.Struct(">iiiqii").pack  # priority, run_at (microseconds), max_attempts
    _LENGTH = struct.Struct(">i").pack

    def __init__(self, now: datetime) -> None:
        self._now = now
        self._now_us = _micros(now)
        self._middles: dict[tuple[uuid.UUID | None, str, str], bytes] = {}
        self._tails: dict[tuple[int, int, int], bytes] = {}

    def row(self, row: _Row) -> bytes:
        key = (row.organization_id, row.queue, row.job_type)
        middle = self._middles.get(key)
        if middle is None:
            middle = self._middles[key] = self._middle(*key)
        run_at = (
            self._now_us
            if row.run_at is None and not row.delay
            else _micros(_run_at(row, self._now))
        )
        tail_key = (row.priority, run_at, row.max_attempts)
        tail = self._tails.get(tail_key)
        if tail is None:
            tail = self._tails[tail_key] = self._TAIL(
                4, row.priority, 8, run_at, 4, row.max_attempts
            )
        payload = row.payload_json.encode()
        return b"".join(
            (
                self._ID(8, 16, row.id.int >> 64, row.id.int & 0xFFFF_FFFF_FFFF_FFFF),
                middle,
                self._JSONB(len(payload) + 1, 1),
                payload,
                tail,
            )
        )

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


def _insert(alias: str, rows: Sequence[_Row]) -> list[Job]:
    """Insert ``rows`` (at most one chunk); return their jobs, existing ones for repeated keys."""
    conf = get_settings()
    if len(rows) == 1:
        return [_insert_one(alias, rows[0], conf.notify)]
    if all(row.idempotency_key is None for row in rows):
        return _insert_unkeyed(alias, rows, conf.notify)
    created: dict[uuid.UUID, Job] = {}
    pending = list(rows)
    # A conflicting job can vanish between our insert and our read (retention pruned it, an
    # operator deleted it); its rows are then inserted again. Three rounds is plenty: each
    # round either inserts or finds every row, barring a deletion racing us each time.
    for _ in range(3):
        with server_side_cursor(alias) as cursor:
            cursor.execute(
                queries.ENQUEUE_JOBS,
                [
                    [r.id for r in pending],
                    [r.organization_id for r in pending],
                    [r.queue for r in pending],
                    [r.job_type for r in pending],
                    [r.payload_json for r in pending],
                    [r.idempotency_key for r in pending],
                    [r.priority for r in pending],
                    [r.run_at for r in pending],
                    [r.delay for r in pending],
                    [r.max_attempts for r in pending],
                    JOBS_CHANNEL,
                    conf.notify,
                ],
            )
            returned = {job_id: (run_at, created_at) for job_id, run_at, created_at, _ in cursor}
        for row in pending:
            if row.id in returned:
                run_at, created_at = returned[row.id]
                created[row.id] = _job_from(alias, row, run_at, created_at)
        conflicting = [r for r in pending if r.id not in returned]
        existing = _existing_jobs(alias, conflicting)
        pending = [r for r in conflicting if _key(r) not in existing]
        if not pending:
            return [created.get(r.id) or existing[_key(r)] for r in rows]
    raise EnqueueError(
        "idempotency_key",
        f"{pending[0].idempotency_key!r} conflicts with a job that keeps disappearing; try again",
    )


def _insert_one(alias: str, row: _Row, notify: bool) -> Job:
    """Insert one row; return its job, or the existing one if its key is taken."""
    for _ in range(3):  # as in _insert: the holder of the key may vanish before we read it
        with server_side_cursor(alias) as cursor:
            cursor.execute(
                queries.ENQUEUE_JOB_UNKEYED if row.idempotency_key is None else queries.ENQUEUE_JOB,
                [
                    row.id,
                    row.organization_id,
                    row.queue,
                    row.job_type,
                    row.payload_json,
                    row.idempotency_key,
                    row.priority,
                    row.run_at,
                    row.delay,
                    row.max_attempts,
                    notify,
                    JOBS_CHANNEL,
                ],
            )
            written = cursor.fetchone()
        if written is not None:
            return _job_from(alias, row, written[0], written[1])
        existing = _existing_jobs(alias, [row]).get(_key(row))
        if existing is not None:
            return existing
    raise EnqueueError(
        "idempotency_key",
        f"{row.idempotency_key!r} conflicts with a job that keeps disappearing; try again",
    )


def _insert_unkeyed(alias: str, rows: Sequence[_Row], notify: bool) -> list[Job]:
    """Insert rows without idempotency keys: nothing can conflict, nothing per row comes back."""
    with server_side_cursor(alias) as cursor:
        cursor.execute(
            queries.ENQUEUE_JOBS_UNKEYED,
            [
                [r.id for r in rows],
                [r.organization_id for r in rows],
                [r.queue for r in rows],
                [r.job_type for r in rows],
                [r.payload_json for r in rows],
                [None] * len(rows),
                [r.priority for r in rows],
                [r.run_at for r in rows],
                [r.delay for r in rows],
                [r.max_attempts for r in rows],
                JOBS_CHANNEL,
                notify,
            ],
        )
        row = cursor.fetchone()
        assert row is not None
        now: datetime = row[0]
    # The statement's defaults, computed here: run_at = coalesce(run_at, now()) + delay.
    return _jobs_from(
        alias,
        rows,
        lambda r: (r.run_at or now) + timedelta(seconds=r.delay) if r.delay else (r.run_at or now),
        now,
    )


def _key(row: _Row) -> tuple[uuid.UUID | None, str, str | None]:
    return (row.organization_id, row.job_type, row.idempotency_key)


def _existing_jobs(
    alias: str, rows: Sequence[_Row]
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
            found[(existing.organization_id, existing.job_type, existing.idempotency_key)] = (
                existing
            )
    return found


def _job_from(alias: str, row: _Row, run_at: datetime | None, created_at: datetime | None) -> Job:
    return _jobs_from(alias, [row], lambda _: run_at, created_at)[0]


def _jobs_from(
    alias: str,
    rows: Sequence[_Row],
    run_at: Callable[[_Row], datetime | None],
    created_at: datetime | None,
) -> list[Job]:
    """The saved ``Job`` instances of rows just inserted (a fifth of a bulk enqueue's time)."""
    base: dict[str, Any] = {
        **empty_row(Job),
        "status": JobStatus.PENDING,
        "attempts": 0,
        "lost_attempts": 0,
        "created_at": created_at,
    }
    jobs: list[Job] = []
    for row in rows:
        values = base.copy()
        values["id"] = row.id
        values["organization_id"] = row.organization_id
        values["queue"] = row.queue
        values["job_type"] = row.job_type
        values["payload"] = row.payload
        values["idempotency_key"] = row.idempotency_key
        values["priority"] = row.priority
        values["run_at"] = run_at(row)
        values["max_attempts"] = row.max_attempts
        values["worker_ids"] = []
        jobs.append(instance_from_row(Job, alias, values))
    return jobs


# -- cancellation --------------------------------------------------------------------------------


def cancel(job_id: uuid.UUID | str, *, using: str | None = None) -> str:
    """Cancel one job and return what became of it.

    A job not running yet (``pending``, ``retrying``) is ``"cancelled"`` at once and never runs.
    A running one returns ``"cancelling"``: its handler sees ``ctx.cancelled`` (and
    ``ctx.renew_lease()`` raises ``Cancelled``) from the worker's next lease renewal, which a
    notification makes immediate; whatever the attempt's outcome, the job then ends
    ``cancelled`` (a result it returned is kept) and is never retried. A finished job keeps its
    state (``"completed"``, ``"dead"``, ``"cancelled"``). Raises ``Job.DoesNotExist`` for an
    unknown id.

    Joins the caller's transaction, like ``enqueue()``.
    """
    parsed = optional_uuid(job_id, "job_id", EnqueueError)
    if parsed is None:
        raise EnqueueError("job_id", "is required")
    result = cancel_jobs([parsed], using=using)
    if parsed not in result:
        raise Job.DoesNotExist(f"no job {parsed} in database {_database(using)!r}")
    return result[parsed]


def cancel_jobs(
    job_ids: Iterable[uuid.UUID], *, using: str | None = None, by: str = "cancel()"
) -> dict[uuid.UUID, str]:
    """Cancel many jobs in one statement; returns job id -> state, as :func:`cancel` does."""
    alias = _database(using)
    ids = list(job_ids)
    if not ids:
        return {}
    with connections[alias].cursor() as cursor:
        cursor.execute(
            queries.CANCEL_JOBS,
            [ids, f"cancelled by {by} before it ran", CANCEL_CHANNEL, get_settings().notify],
        )
        return {job_id: state for job_id, state, _ in cursor.fetchall()}


# -- validation ----------------------------------------------------------------------------------


def _validate(
    job_type: Any,
    payload: Any,
    *,
    idempotency_key: Any,
    organization_id: Any,
    priority: Any,
    run_at: Any,
    queue: Any,
    prefix: str,
    conf: PgOutboxSettings | None = None,
    job_id: uuid.UUID | None = None,
) -> _Row:
    """One job's arguments checked and resolved against its ``@job`` declaration and settings.

    ``enqueue_many`` passes the settings and an id made in bulk for each of its items.
    """
    if conf is None:
        conf = get_settings()
    # A registered job type's name was checked when it was registered.
    definition = _registry.get(job_type) if isinstance(job_type, str) else None
    if definition is None:
        non_empty_text(job_type, f"{prefix}job_type", EnqueueError)
    payload_json = json_object(payload, f"{prefix}payload", EnqueueError)

    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise EnqueueError(
                f"{prefix}idempotency_key",
                f"must be a non-empty string or None, not {idempotency_key!r}",
            )
        reject_nul(idempotency_key, f"{prefix}idempotency_key", EnqueueError)
    organization_id = optional_uuid(organization_id, f"{prefix}organization_id", EnqueueError)

    if priority is None:
        priority = definition.priority if definition else 0
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise EnqueueError(f"{prefix}priority", f"must be an int, not {priority!r}")
    elif not _INT32[0] <= priority <= _INT32[1]:
        raise EnqueueError(f"{prefix}priority", f"{priority} is outside the 32-bit integer range")

    absolute: datetime | None = None
    delay = 0.0
    if isinstance(run_at, datetime):
        if run_at.utcoffset() is None:
            raise EnqueueError(
                f"{prefix}run_at",
                f"{run_at!r} is naive; pass an aware datetime "
                "(django.utils.timezone.now() + timedelta(...)) or a timedelta",
            )
        absolute = run_at
    elif isinstance(run_at, timedelta):
        delay = run_at.total_seconds()
    elif run_at is not None:
        raise EnqueueError(
            f"{prefix}run_at",
            f"must be an aware datetime, a timedelta or None, not {type(run_at).__name__}",
        )

    if queue is None:
        queue = definition.queue if definition else "default"
    elif not isinstance(queue, str):
        raise EnqueueError(f"{prefix}queue", f"must be a string, not {queue!r}")
    if queue not in conf.queues:
        raise EnqueueError(
            f"{prefix}queue",
            f"unknown queue {queue!r}; PGOUTBOX['QUEUES'] has {', '.join(conf.queues) or 'none'}",
        )

    max_attempts = definition.max_attempts if definition else None
    return _Row(
        id=job_id or uuid7(),
        organization_id=organization_id,
        queue=queue,
        job_type=job_type,
        payload=payload,
        payload_json=payload_json,
        idempotency_key=idempotency_key,
        priority=priority,
        run_at=absolute,
        delay=delay,
        max_attempts=max_attempts or conf.max_attempts,
    )
