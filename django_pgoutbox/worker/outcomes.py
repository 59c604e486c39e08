"""Writing outcomes: a batch's parameters, the refused ones one by one, and counting what was
written (run on a lane's thread, except ``count_written``, which the coordinator calls)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import DatabaseError

from django_pgoutbox import metrics, queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.models import JobStatus
from django_pgoutbox.retry import bound, summarize
from django_pgoutbox.worker.execute import Outcome

logger = logging.getLogger("django_pgoutbox.worker")

#: Errors of a statement; ``db.classify_error`` says what each means (never its class here:
#: ``ProgramLimitExceeded``, a value too large, is a psycopg ``OperationalError``).
STATEMENT_ERRORS = (DatabaseError, psycopg.Error)

#: The error code of the dead letter written in place of an outcome PostgreSQL refuses.
UNWRITABLE_OUTCOME = "unwritable_outcome"


def second_outcome(outcome: Outcome, queue: str) -> None:
    """Log an outcome left out of its batch: its attempt had one already. The coordinator's
    states make it impossible; should a bug bring one, it is left out where the batch is built
    (and RECORD_OUTCOMES would still apply only the first), rather than have PostgreSQL apply
    either."""
    logger.error(
        "job %s attempt %d: a second outcome (%s) left out of its batch; a bug of the worker, "
        "please report it",
        outcome.job.id,
        outcome.job.attempt,
        outcome.status.value,
        extra={"job_id": str(outcome.job.id), "queue": queue},
    )


def params(batch: Sequence[Outcome], worker_id: str) -> dict[str, Any]:
    """RECORD_OUTCOMES's parameters for ``batch``. ``progress`` and ``meta`` are empty where no
    attempt set them, and ``traces`` where no attempt was traced, the common case: ``unnest``
    pads them with NULLs."""
    progress = [o.progress_json for o in batch]
    meta = [o.meta_json for o in batch]
    if not any(progress) and not any(meta):
        progress = meta = []
    traces = [o.attempt_trace for o in batch]
    if not any(traces):
        traces = []
    return {
        "ids": [o.job.id for o in batch],
        "attempts": [o.job.attempt for o in batch],
        "statuses": [o.status.value for o in batch],
        "gives_back_attempt": [o.gives_back_attempt for o in batch],
        "delays": [o.delay for o in batch],
        "codes": [o.code for o in batch],
        "summaries": [o.summary for o in batch],
        "results": [o.result_json for o in batch],
        "progress": progress,
        "meta": meta,
        "traces": traces,
        "worker_id": worker_id,
        "notify": get_settings().notify,  # wakes Job.wait() (queries.results)
    }


def record(
    cursor: psycopg.Cursor[Any], batch: list[Outcome], worker_id: str, queue: str
) -> tuple[list[Outcome], list[uuid.UUID]]:
    """Write ``batch``; returns the outcomes written (refused ones replaced) and the ids applied."""
    try:
        queries.send(cursor, "RECORD_OUTCOMES", params(batch, worker_id))
    except STATEMENT_ERRORS as error:
        return record_one_by_one(cursor, batch, error, worker_id, queue)
    return batch, [row[0] for row in cursor.fetchall()]


def record_one_by_one(
    cursor: psycopg.Cursor[Any],
    batch: list[Outcome],
    error: BaseException,
    worker_id: str,
    queue: str,
) -> tuple[list[Outcome], list[uuid.UUID]]:
    """After ``error`` failed the statement that carried ``batch``: if a value of it cannot be
    stored (a DATA error), write its outcomes one by one, so that only the attempt whose
    outcome PostgreSQL refuses loses it (``unwritable``); else raise ``error`` again.

    Returns the outcomes written (the refused ones replaced) and the ids applied.
    """
    if classify_error(error) is not ErrorKind.DATA:
        raise error
    written: list[Outcome] = []
    applied: list[uuid.UUID] = []
    for outcome in batch:
        try:
            queries.send(cursor, "RECORD_OUTCOMES", params([outcome], worker_id))
        except STATEMENT_ERRORS as row_error:
            if classify_error(row_error) is not ErrorKind.DATA:
                raise
            outcome = unwritable(outcome, row_error, queue)
            # Its code and summary are the worker's own, bounded: this one can be stored.
            queries.send(cursor, "RECORD_OUTCOMES", params([outcome], worker_id))
        applied.extend(row[0] for row in cursor.fetchall())
        written.append(outcome)
    return written, applied


def unwritable(outcome: Outcome, error: BaseException, queue: str) -> Outcome:
    """The dead letter in place of an outcome PostgreSQL refuses to store (its result or a
    delay out of range, say): written again it would fail again."""
    job = outcome.job
    summary = bound(
        f"the outcome of attempt {job.attempt} ({outcome.status.value}"
        f"{', ' + outcome.code if outcome.code else ''}) could not be stored, so its result "
        f"was dropped: {summarize(error)}"
    )
    logger.error(
        "job %s attempt %d: %s -> dead",
        job.id,
        job.attempt,
        summary,
        extra={
            "job_id": str(job.id),
            "job_type": job.job_type,
            "queue": queue,
            "attempt": job.attempt,
            "outcome": "dead",
            "error_code": UNWRITABLE_OUTCOME,
        },
    )
    return Outcome(
        job,
        JobStatus.DEAD,
        code=UNWRITABLE_OUTCOME,
        summary=summary,
        timed_out=outcome.timed_out,  # written by the coordinator: its thread still runs
    )


def count_written(queue: str, batch: Sequence[Outcome], applied: Sequence[uuid.UUID]) -> None:
    """Count the outcomes of ``batch`` that were written, and warn of those fenced off.

    ``applied``: the ids the statement wrote. As many as the batch holds means every one
    (the ids written are among the batch's, each once), the common case: no set to build.
    """
    written = None if len(applied) == len(batch) else set(applied)
    counts: dict[tuple[str, str, str], int] = {}
    for outcome in batch:
        job = outcome.job
        if written is None or job.id in written:
            labels = (queue, job.job_type, outcome.status.value)
            counts[labels] = counts.get(labels, 0) + 1
        else:
            stale(queue, outcome, "the lease was taken over")
    for labels, count in counts.items():
        metrics.JOB_OUTCOMES.inc_key(labels, count)


def stale(queue: str, outcome: Outcome, why: str) -> None:
    """Count and log an outcome that was not written: ``why`` it was discarded."""
    job = outcome.job
    metrics.STALE_OUTCOMES.inc(queue=queue)
    logger.warning(
        "job %s attempt %d: outcome %s discarded, %s",
        job.id,
        job.attempt,
        outcome.status.value,
        why,
        extra={
            "job_id": str(job.id),
            "job_type": job.job_type,
            "queue": queue,
            "attempt": job.attempt,
            "outcome": "stale",
        },
    )
