"""Acting on jobs and events already written: cancelling jobs, and the dead letters (retry,
give up, re-drive, discard) that the admin and ``manage.py pgoutbox`` operate on."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connections, router

from django_pgoutbox import queries
from django_pgoutbox.conf import CANCEL_CHANNEL, get_settings
from django_pgoutbox.db import tables_required
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.job_rows import job_database
from django_pgoutbox.models import Job
from django_pgoutbox.validation import optional_uuid

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
        raise Job.DoesNotExist(f"no job {parsed} in database {job_database(using)!r}")
    return result[parsed]


def cancel_jobs(
    job_ids: Iterable[uuid.UUID], *, using: str | None = None, by: str = "cancel()"
) -> dict[uuid.UUID, str]:
    """Cancel many jobs in one statement; returns job id -> state, as :func:`cancel` does."""
    alias = job_database(using)
    ids = list(job_ids)
    if not ids:
        return {}
    with tables_required(alias, EnqueueError), connections[alias].cursor() as cursor:
        cursor.execute(
            queries.CANCEL_JOBS,
            [ids, f"cancelled by {by} before it ran", CANCEL_CHANNEL, get_settings().notify],
        )
        return {job_id: state for job_id, state, _ in cursor.fetchall()}


# -- dead letters (the admin and ``pgoutbox deadletters``) ------------------------------------


def _update(sql: str, ids: list[Any], using: str | None) -> int:
    alias = using or router.db_for_write(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [list(ids)])
        count: int = cursor.rowcount
    return count


def retry_dead_jobs(ids: list[Any], *, using: str | None = None) -> int:
    """Put dead jobs back in their queue, due now, with a fresh attempt budget."""
    return _update(queries.RETRY_DEAD_JOBS, ids, using)


def cancel_dead_jobs(ids: list[Any], *, using: str | None = None) -> int:
    """Give up on dead jobs for good: they become ``cancelled`` (and are pruned later)."""
    return _update(queries.CANCEL_DEAD_JOBS, ids, using)


def redrive_dead_events(ids: list[Any], *, using: str | None = None) -> int:
    """Make dead outbox events claimable again, with a fresh attempt budget."""
    return _update(queries.REDRIVE_DEAD_EVENTS, ids, using)


def discard_dead_events(ids: list[Any], *, using: str | None = None) -> int:
    """Mark dead events processed without projecting them: their aggregate's later events go on."""
    return _update(queries.DISCARD_DEAD_EVENTS, ids, using)
