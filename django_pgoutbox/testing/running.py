"""Running jobs in a test, on the test's own thread and connection, through the worker's own
path: the claim statement (``worker.claims.RecordAndClaim``: priorities, ``run_at``, FAIR and
limits, paused queues), ``worker.execute.execute()`` (the JSON round trip of payloads and
results, hooks, the retry policy) and the outcome statement (``RECORD_OUTCOMES``: retries,
dead letters, a workflow's steps released by their parents, sequences). The relay's own code
projects outbox events (``worker.relay.Relay``).

Inside a test's transaction (Django's ``TestCase``, pytest-django's ``db``), every statement
and every handler runs in a savepoint of its own: a handler's database error, or a statement
refused, rolls back that savepoint only, never the test's transaction. Outside one
(``transactional_db``), statements commit as a worker's do and handlers run outside any
transaction, as in a worker.

In a test's transaction ``now()`` stands still at its start: before each claim the jobs (and
the events) due by the clock are made due (``_catch_up``), as a worker's claim would see them.
What a handler ``SET``s on the connection is undone after its attempt
(``_restore_session_settings``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import unittest
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from django.db import connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from django_pgoutbox import queries, session_settings
from django_pgoutbox.conf import QueueSettings, RetrySettings, get_settings
from django_pgoutbox.context import CancelFlag
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.ids import uuid7
from django_pgoutbox.models import Job
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.registry import JobDefinition, get_job
from django_pgoutbox.testing.outcomes import (
    AttemptFailed,
    DrainLimitExceeded,
    JobRun,
    RunSummary,
    SubscriberFailed,
    SubscriberFailure,
)
from django_pgoutbox.validation import json_object, optional_uuid
from django_pgoutbox.worker import outcomes
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.execute import ClaimedJob, Outcome, execute
from django_pgoutbox.worker.handlers import AttemptRunner
from django_pgoutbox.worker.mailbox import Mailbox
from django_pgoutbox.worker.relay import Relay

#: The ``locked_by`` of the jobs the helpers claim, and the relay id of the events they project.
WORKER_ID = f"testing:{socket.gethostname()}:{os.getpid()}"

#: The most jobs one claim of a queue takes in ``run_jobs()`` (its default ``limit``).
CLAIM_LIMIT = 1000
#: ``drain()``'s default bounds: attempts run, and events projected.
MAX_JOBS = 1000
MAX_EVENTS = 1000


class TaskLike(Protocol):
    """A ``django.tasks`` task, as far as the helpers use it: its jobs' type is its module path."""

    @property
    def module_path(self) -> str: ...


#: What the helpers take as a job type: its name, its ``@job`` handler, or a django.tasks task.
JobType = str | JobDefinition | TaskLike


def job_type_name(job_type: JobType) -> str:
    """The job type of ``job_type``: a name, the ``@job`` handler itself, or a ``django.tasks``
    task (whose jobs the backend enqueues under its module path)."""
    if isinstance(job_type, JobDefinition):
        return job_type.name
    if isinstance(job_type, str):
        return job_type
    module_path = getattr(job_type, "module_path", None)
    if isinstance(module_path, str):
        return module_path
    raise TypeError(
        "job_type must be a job type's name, its @job handler or a django.tasks task, not "
        f"{type(job_type).__name__}"
    )


def database(using: str | None) -> str:
    """The alias the helpers work on: ``using``, or where the routers write jobs."""
    return using if using is not None else router.db_for_write(Job)


def run_jobs(
    *,
    queues: Iterable[str] | str | None = None,
    job_types: Iterable[JobType] | JobType | None = None,
    using: str | None = None,
    raise_on_failure: bool = True,
    with_scheduled: bool = False,
    limit: int = CLAIM_LIMIT,
) -> RunSummary:
    """Run, once, the jobs due now: one claim per queue (as a worker's claim: in priority order,
    cut by the queue's FAIR and limits; none in a paused queue), each job's handler, each
    outcome written. Jobs that these enqueue or retry wait for the next call.

    ``queues``: the queues to run (default: every queue with jobs due). ``job_types``: only
    these (names or ``@job`` handlers); the jobs of other types that a claim takes are given
    back. ``with_scheduled``: jobs whose ``run_at`` is in the future are due now.
    ``raise_on_failure``: raise ``AttemptFailed`` at the first attempt that does not complete
    its job (the handler's exception as its cause), after writing its outcome.
    """
    summary = RunSummary()
    _round(
        database(using),
        _names(queues),
        _types(job_types),
        summary,
        limit=_bound("limit", limit, 1),
        raise_on_failure=raise_on_failure,
        with_scheduled=with_scheduled,
    )
    return summary


def drain(
    *,
    queues: Iterable[str] | str | None = None,
    job_types: Iterable[JobType] | JobType | None = None,
    using: str | None = None,
    raise_on_failure: bool = True,
    retry_at_once: bool = True,
    with_scheduled: bool = False,
    relay: bool = False,
    max_jobs: int = MAX_JOBS,
    max_events: int = MAX_EVENTS,
) -> RunSummary:
    """Run jobs until none is due: ``run_jobs()`` again and again, so that the jobs the jobs
    enqueue run too, and a workflow's steps once their parents completed.

    ``retry_at_once``: a job an attempt left ``retrying`` (a failure, a ``Snooze``) is due at
    once rather than after its back-off. ``relay``: project the outbox's pending events first,
    and again before each round (``run_relay()``), so that the jobs their subscribers enqueue
    run too. ``max_jobs`` (attempts) and ``max_events`` bound the drain: past them, with work
    still due, ``DrainLimitExceeded``.
    """
    alias = database(using)
    names, types = _names(queues), _types(job_types)
    _bound("max_jobs", max_jobs, 0)
    _bound("max_events", max_events, 0)
    summary = RunSummary()
    while True:
        if relay:
            summary.events += _relay(
                alias, max_events - summary.events, summary, raise_on_failure=raise_on_failure
            )
        ran = len(summary.runs)
        if ran >= max_jobs:
            _catch_up(alias, names, types, with_scheduled=with_scheduled)
            if _due(alias, names, types):
                raise DrainLimitExceeded(max_jobs, "attempts", summary)
            return _unprojected(alias, summary, relay)
        claimed = _round(
            alias,
            names,
            types,
            summary,
            limit=max_jobs - ran,
            raise_on_failure=raise_on_failure,
            with_scheduled=with_scheduled,
        )
        if not claimed:
            return _unprojected(alias, summary, relay)
        if retry_at_once:
            _retry_now(
                alias, [run.job_id for run in summary.runs[ran:] if run.status == "retrying"]
            )


def run_relay(
    *, using: str | None = None, raise_on_failure: bool = True, max_events: int = MAX_EVENTS
) -> int:
    """Project the outbox's pending events to their subscribers with the relay's own code, in
    batches until none is left; return how many events it projected. The jobs the subscribers
    enqueue are then there to run (``drain()``). A subscriber that raises gets a delivery that
    waits for its back-off, as in a worker (``OutboxDelivery``); ``raise_on_failure``: then
    raise ``SubscriberFailed``, once the batch is written."""
    summary = RunSummary()
    return _relay(
        database(using),
        _bound("max_events", max_events, 0),
        summary,
        raise_on_failure=raise_on_failure,
    )


def perform_job(
    job_type: JobType,
    payload: dict[str, Any] | None = None,
    *,
    attempt: int = 1,
    max_attempts: int | None = None,
    organization_id: Any = None,
    queue: str | None = None,
    priority: int | None = None,
    using: str | None = None,
    raise_on_failure: bool = True,
) -> JobRun:
    """Run one job's handler through ``execute()``, as a worker's attempt, without writing a row.

    ``payload`` is checked as ``enqueue()`` checks it (an ``EnqueueError`` names the first key
    that JSON cannot carry: a datetime, a set, NaN, a lone surrogate), and the handler gets it
    after a JSON round trip, as from a worker. The result goes through the same round trip
    (``JobRun.result``). ``raise_on_failure``: raise ``AttemptFailed`` if the attempt does not
    complete (the handler's exception as its cause); else the ``JobRun`` says what became of it.
    """
    name = job_type_name(job_type)
    settings = get_settings()
    definition = get_job(name)
    text = json_object(
        {} if payload is None else payload, "payload", EnqueueError, settings.max_payload_bytes
    )
    job = ClaimedJob(
        id=uuid7(),
        job_type=name,
        payload=json.loads(text),
        attempt=attempt,
        max_attempts=max_attempts
        or (definition.max_attempts if definition is not None else None)
        or settings.max_attempts,
        organization_id=optional_uuid(organization_id, "organization_id", EnqueueError),
        queue=queue or (definition.queue if definition is not None else "default"),
        priority=priority if priority is not None else (definition.priority if definition else 0),
        created_at=timezone.now(),
        worker_ids=(WORKER_ID,),
    )
    alias = database(using)
    errors: list[BaseException] = []
    outcome = _execute(alias, job, errors.append)
    run = _job_run(job, outcome, errors)
    _interrupted(run)
    if raise_on_failure and run.failed:
        raise AttemptFailed(run) from run.error
    return run


# -- a round ---------------------------------------------------------------------------------------


def _round(
    alias: str,
    queues: list[str] | None,
    job_types: list[str] | None,
    summary: RunSummary,
    *,
    limit: int,
    raise_on_failure: bool,
    with_scheduled: bool,
) -> int:
    """One claim per queue and its jobs run; returns how many jobs were claimed (and run)."""
    settings = get_settings()
    _settle_new_edges(alias)
    _catch_up(alias, queues, job_types, with_scheduled=with_scheduled)
    claimed = 0
    for name in queues if queues is not None else _due_queues(alias, job_types):
        base = settings.queues.get(name) or QueueSettings(
            name, settings.concurrency, settings.lease_seconds, settings.poll_interval
        )
        control = _control(alias, name)
        if control.paused:
            if _due(alias, [name], job_types):
                summary.paused.add(name)
            continue
        rows = _claim(alias, control.settings(base), limit, job_types)
        if not rows and _due(alias, [name], job_types):
            summary.held_back.add(name)
        claimed += len(rows)
        _run_rows(alias, rows, summary, raise_on_failure)
    return claimed


def _run_rows(
    alias: str, rows: list[ClaimRow], summary: RunSummary, raise_on_failure: bool
) -> None:
    """Run claimed ``rows`` in claim order; what is left when one raises is given back."""
    policy = get_settings().retry
    left = list(rows)
    try:
        while left:
            row = left.pop(0)
            run = _attempt(alias, row, policy)
            summary.runs.append(run)
            _interrupted(run)
            if raise_on_failure and run.failed:
                raise AttemptFailed(run, summary) from run.error
    finally:
        if left:
            _give_back(alias, left)


def _attempt(alias: str, row: ClaimRow, policy: RetrySettings) -> JobRun:
    """One claimed attempt: its handler, then its outcome written."""
    attempt = Attempt(row)
    errors: list[BaseException] = []
    try:
        job = attempt.job()
    except BaseException as error:  # a row that cannot be read: the worker's own outcome
        runner = AttemptRunner(
            queue=row.queue, policy=policy, using=alias, mailbox=Mailbox(), renew=_no_renewal
        )
        outcome = runner.worker_error(attempt, error)
        errors.append(error)
    else:
        outcome = _execute(alias, job, errors.append, cancel=attempt.cancel)
    outcome = _record(alias, outcome, row.queue)
    return _job_run(outcome.job, outcome, errors, _written(alias, row))


def _job_run(
    job: ClaimedJob,
    outcome: Outcome,
    errors: list[BaseException],
    written: tuple[str, str | None, str | None] | None = None,
) -> JobRun:
    """The run of ``job``: its outcome, or what the statement wrote in its place (``written``:
    the row's status, code and summary: a cancellation requested while it ran wins)."""
    status, code, summary = outcome.status.value, outcome.code, outcome.summary
    if written is not None and written[0] != status:
        status, code, summary = written
    return JobRun(
        job_id=job.id,
        job_type=job.job_type,
        queue=job.queue,
        attempt=job.attempt,
        payload=job.payload,
        status=status,
        code=code,
        summary=summary,
        result_json=outcome.result_json,
        delay=outcome.delay,
        snoozed=outcome.gives_back_attempt,
        error=errors[-1] if errors else None,
    )


def _interrupted(run: JobRun) -> None:
    """Raise again what the handler raised to stop the test run or end the test, rather than
    to fail its job: Ctrl-C (``KeyboardInterrupt``, which a worker's handler thread never gets,
    lands in a test's handler, which runs on the main thread), and a test framework's own
    outcomes (``pytest.fail()``, ``pytest.skip()``, ``pytest.exit()``, ``unittest``'s
    ``skipTest()``) in a handler a test defines. Its outcome is written, as any failure's; then
    it is raised, whatever ``raise_on_failure``, rather than becoming one more failed attempt."""
    if run.error is not None and _ends_the_test(run.error):
        raise run.error


def _ends_the_test(error: BaseException) -> bool:
    if isinstance(error, KeyboardInterrupt | unittest.SkipTest):
        return True
    pytest_outcomes = sys.modules.get("_pytest.outcomes")  # pytest is not imported for this
    return pytest_outcomes is not None and isinstance(
        error, pytest_outcomes.OutcomeException | pytest_outcomes.Exit
    )


def _no_renewal(*_: Any) -> None:
    """``ctx.renew_lease()`` in a test: nothing to renew (no lease expires while the handler
    runs on the test's thread)."""


# -- running a handler ---------------------------------------------------------------------------


def _execute(
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
        if wrapper.in_atomic_block and wrapper.connection is not None and not _aborted(wrapper)
    ]
    with _transactions_kept_open():
        outcome = execute(
            job, policy=policy, renew=_no_renewal, cancel=cancel, using=alias, on_error=on_error
        )
    for wrapper, savepoint in savepoints:
        if savepoint is None:
            continue
        if _aborted(wrapper):
            # As atomic() does on leaving a block marked for rollback: the mark first, or the
            # rollback's own statement is refused (an ORM write that failed inside the test's
            # atomic() marks it, even when the handler caught the error).
            wrapper.needs_rollback = False
            wrapper.savepoint_rollback(savepoint)
        else:
            wrapper.savepoint_commit(savepoint)
    _restore_session_settings(settings)
    return outcome


def _aborted(wrapper: BaseDatabaseWrapper) -> bool:
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
        if wrapper.vendor != "postgresql" or raw is None or raw.closed or _aborted(wrapper):
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
        if wrapper.connection is not raw or raw.closed or _aborted(wrapper):
            continue
        session_settings.put_back(raw, before)


def _keep(*_: Any) -> None:
    """In place of ``close()`` and ``close_if_unusable_or_obsolete()`` on a connection inside
    the test's transaction, while a handler runs."""


#: The methods of a connection that would close it, kept from doing so by ``_keep``.
_CLOSING = ("close", "close_if_unusable_or_obsolete")


@contextmanager
def _transactions_kept_open() -> Iterator[None]:
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


# -- the worker's statements on the test's connection ---------------------------------------------


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


def _claim(
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
        _give_back(alias, others)
    return wanted


def _give_back(alias: str, rows: list[ClaimRow]) -> None:
    """Return claimed jobs not run (``UNCLAIM_JOBS``, a worker's give-back)."""
    with _lane(alias) as raw, raw.cursor() as cursor:
        queries.send(
            cursor,
            "UNCLAIM_JOBS",
            [[row.id for row in rows], [row.attempt for row in rows], WORKER_ID],
        )


def _record(alias: str, outcome: Outcome, queue: str) -> Outcome:
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


def _written(alias: str, row: ClaimRow) -> tuple[str, str | None, str | None] | None:
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


def _control(alias: str, queue: str) -> Control:
    """The queue's row of ``queue_controls`` (paused, resized), as its workers read it."""
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.READ_QUEUE_CONTROL, [queue])
        row = cursor.fetchone()
    return Control() if row is None else Control.from_row(queue, *row)


def _relay(alias: str, max_events: int, summary: RunSummary, *, raise_on_failure: bool) -> int:
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
    the clock (``publish(available_at=timezone.now())``), as ``_catch_up`` does for jobs."""
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


def _unprojected(alias: str, summary: RunSummary, relay: bool) -> RunSummary:
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


def _due_queues(alias: str, job_types: list[str] | None) -> list[str]:
    """The queues with jobs due now (of ``job_types``), by name."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_DUE, {"queues": None, "types": job_types})
        return [row[0] for row in cursor.fetchall()]


def _due(alias: str, queues: list[str] | None, job_types: list[str] | None) -> bool:
    """Whether jobs (of ``queues``, of ``job_types``) are due now."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_DUE, {"queues": queues, "types": job_types})
        return cursor.fetchone() is not None


def _retry_now(alias: str, ids: list[Any]) -> None:
    """Make the jobs these attempts retried due now, rather than after their back-off."""
    if not ids:
        return
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET run_at = now() "
            "WHERE id = ANY(%s::uuid[]) AND status = 'retrying' AND run_at > now()",
            [ids],
        )


def _catch_up(
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


def _settle_new_edges(alias: str) -> None:
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


def _names(queues: Iterable[str] | str | None) -> list[str] | None:
    if queues is None:
        return None
    names = [queues] if isinstance(queues, str) else sorted(set(queues))
    if not names:
        raise ValueError("queues= names no queue: leave it out (None) to run every queue")
    return names


def _types(job_types: Iterable[JobType] | JobType | None) -> list[str] | None:
    if job_types is None:
        return None
    if isinstance(job_types, str) or not isinstance(job_types, Iterable):
        return [job_type_name(job_types)]
    names = [job_type_name(job_type) for job_type in job_types]
    if not names:
        raise ValueError("job_types= names no job type: leave it out (None) to run every type")
    return names


def _bound(name: str, value: int, minimum: int) -> int:
    """A count the caller gave (``limit=``, ``max_jobs=``, ``max_events=``), checked: a
    negative one, or one that is no whole number, would run nothing, or run past it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number from {minimum}, not {value!r}")
    return value
