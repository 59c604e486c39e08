"""Writing workflows: a graph's checked steps and edges inserted, and the parents a new job
names checked to exist (``workflows`` builds and checks the graph; the triggers of migration
0016 settle it)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connections

from django_pgoutbox import queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.db import server_side_cursor
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.insert_rows import existing_job, row_params
from django_pgoutbox.job_rows import JobRow, jobs_from_rows
from django_pgoutbox.models import Job, JobStatus

#: Steps per INSERT statement of a workflow (a bigger one takes several).
STEPS_PER_STATEMENT = 5000


@dataclass(frozen=True)
class PlacedStep:
    """A checked job as a step: its row, its step name (None for ``enqueue(after=...)``), and
    whether it also runs when a parent ends dead or cancelled."""

    row: JobRow
    step: str | None
    runs_on_upstream_failure: bool

    @property
    def on_upstream_failure(self) -> str | None:
        """The column's value: ``run``, or NULL for a step that is cancelled then."""
        return "run" if self.runs_on_upstream_failure else None


def write_steps(
    alias: str,
    steps: Sequence[PlacedStep],
    edges: Sequence[tuple[uuid.UUID, uuid.UUID, bool]],
    workflow_id: uuid.UUID | None,
) -> list[Job]:
    """Insert the steps, then the edges of those written (a repeated key writes none)."""
    notify = get_settings().notify
    waiting: dict[uuid.UUID, int] = {}
    parents_of: set[uuid.UUID] = set()
    for parent, child, _ in edges:
        waiting[child] = waiting.get(child, 0) + 1
        parents_of.add(parent)
    written: dict[uuid.UUID, tuple[datetime, datetime]] = {}
    for start in range(0, len(steps), STEPS_PER_STATEMENT):
        chunk = steps[start : start + STEPS_PER_STATEMENT]
        rows = [s.row for s in chunk]
        with server_side_cursor(alias) as cursor:
            cursor.execute(
                queries.INSERT_STEPS,
                row_params(rows, notify)
                | {
                    "event_ids": [r.event_id for r in rows],
                    "trace_contexts": [r.trace_context for r in rows],
                    "waiting_for": [waiting.get(r.id, 0) for r in rows],
                    "has_dependants": [r.id in parents_of for r in rows],
                    "steps": [s.step for s in chunk],
                    "on_upstream_failure": [s.on_upstream_failure for s in chunk],
                    "workflow_id": workflow_id,
                },
            )
            for job_id, run_at, created_at, _ in cursor.fetchall():
                written[job_id] = (run_at, created_at)
    # In parent order: the constraint trigger of each edge to a job enqueued before locks that
    # job at the commit, edge by edge, and a worker writing the outcomes of several of them
    # locks them in id order too; in another order the two could deadlock.
    kept = sorted(((p, c, e) for p, c, e in edges if c in written), key=lambda edge: edge[0])
    if kept:
        with server_side_cursor(alias) as cursor:
            cursor.execute(
                queries.INSERT_EDGES,
                [[p for p, _, _ in kept], [c for _, c, _ in kept], [e for _, _, e in kept]],
            )
    new_rows = [s.row for s in steps if s.row.id in written]
    built = iter(jobs_from_rows(alias, new_rows, lambda r: written[r.id][0], None))
    jobs: list[Job] = []
    for s in steps:
        if s.row.id not in written:  # a repeated idempotency key: the job that holds it
            existing = existing_job(alias, s.row)
            if existing is None:
                raise EnqueueError(
                    "idempotency_key",
                    f"{s.row.idempotency_key!r} conflicts with a job that keeps disappearing;"
                    " try again",
                )
            jobs.append(existing)
            continue
        job = next(built)
        job.created_at = written[s.row.id][1]
        count = waiting.get(s.row.id, 0)
        job.status = JobStatus.WAITING if count else JobStatus.PENDING
        job.waiting_for = count or None
        job.has_dependants = True if s.row.id in parents_of else None
        job.workflow_id = workflow_id
        job.step = s.step
        job.on_upstream_failure = s.on_upstream_failure
        jobs.append(job)
    return jobs


def check_parents(alias: str, ids: set[uuid.UUID], where: str) -> None:
    """Refuse parents that are no job of ``alias``. Parents that an outbox subscriber enqueued
    just before, collected for the relay's batch (``deferred_enqueues``), are written first."""
    if not ids:
        return
    from django_pgoutbox import enqueueing  # it imports this module

    collector = enqueueing.current_collector()
    if collector is not None and collector.using == alias:
        collector.write_now(ids)
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.EXISTING_JOBS, [list(ids)])
        found = {row[0] for row in cursor.fetchall()}
    missing = sorted(str(job_id) for job_id in ids - found)
    if missing:
        raise EnqueueError(
            where,
            f"names job {missing[0]}, which does not exist in database {alias!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
        )
