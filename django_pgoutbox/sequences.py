"""Sequences: jobs of one key that run one at a time, in the order they were enqueued.

``enqueue(..., sequence="account:42")`` (or ``@job(sequence_by="account_id")``) puts the job at
the end of its key's sequence: under the key's advisory lock, taken for the caller's
transaction, it reads the newest job of the key not finished yet (its tail) and waits for it,
by an edge of ``job_dependencies``, as a workflow's step waits for its parent. Only the head of
each sequence is ever claimable, so the claim is that of plain jobs. The triggers of migrations
0016 and 0018 release the next job when the head completes or is cancelled; a dead head holds
its sequence until it is retried or skipped (``control.skip_dead_jobs``).

The lock held to the commit makes the sequence's order that of the enqueues' commits: a
transaction that enqueued into a sequence makes the other enqueuers of that key wait until it
ends (workers never take it).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db import transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.db import server_side_cursor, tables_required
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.insert_rows import existing_job, one_row_params
from django_pgoutbox.job_rows import JobRow, job_from_row
from django_pgoutbox.models import Job

#: What ``on_upstream_failure`` holds for a sequence job: released when the job before it
#: completes or is cancelled, held while it is dead.
HOLD = "hold"


def enqueue_in_sequence(alias: str, rows: Sequence[JobRow]) -> list[Job]:
    """Write ``rows`` (each with its ``sequence_key``), in order, each at the end of its
    sequence, in the caller's transaction: the keys' locks first, in one statement and a fixed
    order, then one statement per row."""
    keys = sorted({row.sequence_key for row in rows if row.sequence_key is not None})
    notify = get_settings().notify
    jobs: list[Job] = []
    isolation = "read committed"
    with tables_required(alias, EnqueueError), transaction.atomic(using=alias, savepoint=False):
        with server_side_cursor(alias) as cursor:
            cursor.execute(queries.LOCK_SEQUENCES, [keys])
            locked = cursor.fetchone()
            assert locked is not None
            isolation = locked[1]
        if isolation == "read committed":
            edges: list[tuple[uuid.UUID, uuid.UUID]] = []
            for row in rows:
                job, parent = _write(alias, row, notify)
                jobs.append(job)
                if parent is not None:
                    edges.append((parent, job.pk))
            if edges:
                # In parent order, as a workflow's (workflow_rows.write_steps): the commit's
                # trigger of each edge locks its parent, as a worker and a cancel lock them.
                edges.sort()
                with server_side_cursor(alias) as cursor:
                    cursor.execute(
                        queries.INSERT_EDGES,
                        [[p for p, _ in edges], [c for _, c in edges], [True] * len(edges)],
                    )
    if isolation != "read committed":
        # Raised out of the block, which wrote nothing: the caller's transaction stays usable.
        raise EnqueueError(
            "sequence",
            f"needs a READ COMMITTED transaction, not {isolation.upper()}: in this one the end "
            "of the sequence would be read from a snapshot taken before its lock",
        )
    return jobs


def _write(alias: str, row: JobRow, notify: bool) -> tuple[Job, uuid.UUID | None]:
    """Write ``row`` at the end of its sequence: the job, and the tail it waits for (the edge
    is the caller's to insert)."""
    with server_side_cursor(alias) as cursor:
        cursor.execute(
            queries.ENQUEUE_IN_SEQUENCE,
            {**one_row_params(row, notify), "sequence_key": row.sequence_key},
        )
        written = cursor.fetchone()
    if written is None:  # a repeated idempotency key: the job that holds it
        existing = existing_job(alias, row)
        if existing is None:
            raise EnqueueError(
                "idempotency_key",
                f"{row.idempotency_key!r} conflicts with a job that keeps disappearing; try again",
            )
        return existing, None
    _, status, run_at, created_at, position, parent, _ = written
    job = job_from_row(alias, row, run_at, created_at)
    job.status = status
    job.waiting_for = None if parent is None else 1
    job.has_dependants = None
    job.on_upstream_failure = HOLD
    job.sequence_key = row.sequence_key
    job.sequence_position = position
    return job, parent
