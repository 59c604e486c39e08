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
the events) due by the clock are made due (``statements.catch_up``), as a worker's claim would
see them. A handler runs as ``handlers.run_handler`` runs it: what it ``SET``s on the
connection is undone after its attempt.

The statements live in ``statements``, a handler's run in ``handlers``; this module holds the
helpers themselves and their rounds.
"""

from __future__ import annotations

import json
import sys
import unittest
from collections.abc import Iterable
from typing import Any, Protocol

from django.db import router
from django.utils import timezone

from django_pgoutbox.conf import QueueSettings, RetrySettings, get_settings
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.ids import uuid7
from django_pgoutbox.models import Job
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.registry import JobDefinition, get_job
from django_pgoutbox.testing import handlers, statements
from django_pgoutbox.testing.outcomes import (
    AttemptFailed,
    DrainLimitExceeded,
    JobRun,
    RunSummary,
)
from django_pgoutbox.validation import json_object, optional_uuid
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.execute import ClaimedJob, Outcome
from django_pgoutbox.worker.handlers import AttemptRunner
from django_pgoutbox.worker.mailbox import Mailbox

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
            summary.events += statements.project_events(
                alias, max_events - summary.events, summary, raise_on_failure=raise_on_failure
            )
        ran = len(summary.runs)
        if ran >= max_jobs:
            statements.catch_up(alias, names, types, with_scheduled=with_scheduled)
            if statements.due(alias, names, types):
                raise DrainLimitExceeded(max_jobs, "attempts", summary)
            return statements.unprojected(alias, summary, relay)
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
            return statements.unprojected(alias, summary, relay)
        if retry_at_once:
            statements.retry_now(
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
    return statements.project_events(
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
        worker_ids=(statements.WORKER_ID,),
    )
    alias = database(using)
    errors: list[BaseException] = []
    outcome = handlers.run_handler(alias, job, errors.append)
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
    statements.settle_new_edges(alias)
    statements.catch_up(alias, queues, job_types, with_scheduled=with_scheduled)
    claimed = 0
    for name in queues if queues is not None else statements.due_queues(alias, job_types):
        base = settings.queues.get(name) or QueueSettings(
            name, settings.concurrency, settings.lease_seconds, settings.poll_interval
        )
        control = statements.control(alias, name)
        if control.paused:
            if statements.due(alias, [name], job_types):
                summary.paused.add(name)
            continue
        rows = statements.claim(alias, control.settings(base), limit, job_types)
        if not rows and statements.due(alias, [name], job_types):
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
            statements.give_back(alias, left)


def _attempt(alias: str, row: ClaimRow, policy: RetrySettings) -> JobRun:
    """One claimed attempt: its handler, then its outcome written."""
    attempt = Attempt(row)
    errors: list[BaseException] = []
    try:
        job = attempt.job()
    except BaseException as error:  # a row that cannot be read: the worker's own outcome
        runner = AttemptRunner(
            queue=row.queue,
            policy=policy,
            using=alias,
            mailbox=Mailbox(),
            renew=handlers.no_renewal,
        )
        outcome = runner.worker_error(attempt, error)
        errors.append(error)
    else:
        outcome = handlers.run_handler(alias, job, errors.append, cancel=attempt.cancel)
    outcome = statements.record(alias, outcome, row.queue)
    return _job_run(outcome.job, outcome, errors, statements.written(alias, row))


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
