"""A job's attempt history: the attempts logged in ``jobs.attempt_log``, then the row's own.

The statements that end an attempt without completing its job append its entry to the log
(``queries.attempts`` says which, and why a completion appends none); this module reads the
entries back as ``AttemptRecord`` values. The log is a column anyone could write by hand, so an
entry is read leniently: a value of the wrong type reads as unknown (``None``), and an entry that
is no JSON object is left out, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django_pgoutbox.queries.attempts import MAX_LOGGED_ATTEMPTS, MAX_LOGGED_SUMMARY

if TYPE_CHECKING:
    from django_pgoutbox.models import Job

__all__ = [
    "MAX_LOGGED_ATTEMPTS",
    "MAX_LOGGED_SUMMARY",
    "AttemptRecord",
    "attempt_history",
]

#: The outcome of the row's own attempt while it runs.
RUNNING = "running"
#: The outcome of the attempt that completed the job (the row's own: never logged).
COMPLETED = "completed"


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt of a job.

    ``outcome`` says how it ended: ``retrying`` (it failed, and the job is retried later),
    ``snoozed`` (``Snooze``: the attempt given back), ``dead``, ``cancelled``, ``lost`` (its
    lease expired with its worker), ``released`` (given back at a worker's shutdown), or, for the
    row's own attempt, ``completed`` or ``running``. ``attempt`` is the attempt's number as it was
    claimed: an attempt given back (snoozed, lost) leaves its number to the next one. ``started_at``
    is when it was claimed, ``ended_at`` when its end was written (``None`` while it runs).
    ``summary`` is cut to ``MAX_LOGGED_SUMMARY`` characters; full tracebacks go to the log.
    """

    attempt: int | None
    worker: str | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    error_code: str | None
    summary: str | None


def attempt_history(job: Job) -> list[AttemptRecord]:
    """Every attempt of ``job`` that is kept, oldest first: the logged ones (the newest
    ``MAX_LOGGED_ATTEMPTS``), then the row's own attempt if it runs or completed the job."""
    log = job.attempt_log if isinstance(job.attempt_log, list) else []
    records = [_record(entry) for entry in log if isinstance(entry, dict)]
    if job.status == "leased":
        records.append(_own(job, ended_at=None, outcome=RUNNING))
    elif job.status == "completed":
        records.append(_own(job, ended_at=job.completed_at or job.finished_at, outcome=COMPLETED))
    return records


def _own(job: Job, *, ended_at: datetime | None, outcome: str) -> AttemptRecord:
    """The attempt the row's own columns describe: no error is its own (``last_error_*`` of a
    completed job are those of an earlier attempt)."""
    return AttemptRecord(
        attempt=job.attempts,
        worker=job.locked_by,
        started_at=job.locked_at,
        ended_at=ended_at,
        outcome=outcome,
        error_code=None,
        summary=None,
    )


def _record(entry: dict[str, Any]) -> AttemptRecord:
    attempt = entry.get("attempt")
    return AttemptRecord(
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        worker=_text(entry.get("worker")),
        started_at=_moment(entry.get("started_at")),
        ended_at=_moment(entry.get("ended_at")),
        outcome=_text(entry.get("outcome")),
        error_code=_text(entry.get("error_code")),
        summary=_text(entry.get("summary"), MAX_LOGGED_SUMMARY),
    )


def _text(value: object, limit: int | None = None) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def _moment(value: object) -> datetime | None:
    """A timestamp as ``to_jsonb`` writes it (ISO 8601 with its offset), else ``None``."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None
