"""Writing a unique job (docs/uniqueness.md): insert it unless another job holds its key; else
update the job that waits with it (``on_conflict="replace"``, ``debounce``), try the next window
(``throttle``), or return the job that holds it. Each step is one statement; the key is PostgreSQL's
to enforce (``jobs_unique_uq``), so concurrent enqueuers of one key get one job."""

from __future__ import annotations

from typing import Any

from django_pgoutbox import queries
from django_pgoutbox.db import server_side_cursor
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.insert_rows import existing_job, one_row_params
from django_pgoutbox.job_rows import JobRow, job_from_row
from django_pgoutbox.models import Job
from django_pgoutbox.uniqueness import UniquePolicy

#: Rounds of insert-then-find before giving up: the job that holds a key can finish (and free
#: it) or be pruned between the insert that met it and the read that looks for it; the next
#: insert then takes the key. A round either writes, updates or finds, barring such a race each
#: time.
ROUNDS = 3


def insert_unique(alias: str, row: JobRow, notify: bool) -> Job:
    """Write ``row`` (a unique job); return it (``created`` True) or the job that holds its key
    (``created`` False), updated if the policy says so."""
    policy = row.unique
    assert policy is not None
    params = _params(row, notify)
    windows = (False, True) if policy.throttle else (False,)
    statements = _PERIOD if policy.period is not None else _NO_PERIOD
    insert = statements[0]
    for _ in range(ROUNDS):
        for next_window in windows:
            if policy.period is not None:
                params["next_window"] = next_window
            with server_side_cursor(alias) as cursor:
                cursor.execute(insert, params)
                written = cursor.fetchone()
            if written is not None:
                job = job_from_row(alias, row, written[0], written[1])
                job.unique_key, job.unique_states, job.created = written[2], policy.states, True
                return job
        if row.idempotency_key is not None:
            # A repeated idempotency key is this very request again: its job is the answer, even
            # if another job holds the unique key now (its own finished), and is left as it is.
            existing = existing_job(alias, row)
            if existing is not None:
                return existing
        found = _update_or_find(alias, params, statements, policy)
        if found is not None:
            return found
    raise EnqueueError("unique", "conflicts with a job that keeps finishing; try again")


#: The statements of a job without a period and of one with: insert, update the waiting job,
#: find the holder.
_NO_PERIOD = (
    queries.ENQUEUE_UNIQUE_JOB,
    queries.UPDATE_WAITING_UNIQUE_JOB,
    queries.FIND_UNIQUE_JOB,
)
_PERIOD = (
    queries.ENQUEUE_UNIQUE_PERIOD_JOB,
    queries.UPDATE_WAITING_UNIQUE_PERIOD_JOB,
    queries.FIND_UNIQUE_PERIOD_JOB,
)


def _update_or_find(
    alias: str, params: dict[str, Any], statements: tuple[str, ...], policy: UniquePolicy
) -> Job | None:
    """The job that holds the key, updated first if it waits and the policy changes it."""
    job_id = None
    replace = policy.on_conflict == "replace"
    if replace or policy.debounce is not None:
        params["replace"] = replace
        params["move"] = not policy.throttle  # a throttled job keeps its window's start
        with server_side_cursor(alias) as cursor:
            cursor.execute(statements[1], params)
            updated = cursor.fetchone()
        job_id = None if updated is None else updated[0]
    if job_id is None:
        with server_side_cursor(alias) as cursor:
            cursor.execute(statements[2], params)
            held = cursor.fetchone()
        job_id = None if held is None else held[0]
    if job_id is None:
        return None
    job = Job.objects.using(alias).filter(pk=job_id).first()
    if job is not None:
        job.created = False
    return job


def _params(row: JobRow, notify: bool) -> dict[str, Any]:
    policy = row.unique
    assert policy is not None
    return {
        **one_row_params(row, notify),
        # debounce: the job runs that long after the last enqueue of its key
        "delay": row.delay + (policy.debounce or 0.0),
        "unique_key": row.unique_key,
        "unique_states": policy.states,
        **({"period": policy.period, "next_window": False} if policy.period is not None else {}),
    }
