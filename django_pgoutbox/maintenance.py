"""Maintenance: lease recovery, retention pruning, outbox reconciliation.

Each is a plain function (also run by ``manage.py pgoutbox``) and a built-in job that the
scheduler runs on a built-in schedule (see ``schedules.BUILTIN_SCHEDULES``).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, router

from django_pgoutbox import gauges, metrics, queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.context import JobContext
from django_pgoutbox.models import Job
from django_pgoutbox.registry import job

logger = logging.getLogger("django_pgoutbox.maintenance")


@dataclass(frozen=True)
class RecoveredLease:
    job_id: uuid.UUID
    queue: str
    status: str  # 'retrying' (claimable again) or 'dead' (that was its last attempt)


def recover_expired_leases(
    queue: str | None = None, *, using: str | None = None, connection: Any = None
) -> list[RecoveredLease]:
    """Return jobs whose lease expired to be claimed again (or dead-letter them); count each.

    Safe to run from any number of processes at once: each expiry is recovered, and counted, once.
    ``connection``: a psycopg connection to use instead of Django's (a worker's dispatcher).
    """
    if connection is None:
        connection = connections[using or router.db_for_write(Job)]
    with connection.cursor() as cursor:
        cursor.execute(
            queries.RECOVER_EXPIRED_LEASES, {"queue": queue, "notify": get_settings().notify}
        )
        recovered = [RecoveredLease(job_id, q, status) for job_id, q, status in cursor.fetchall()]
    for lease in recovered:
        metrics.LEASE_EXPIRATIONS.inc(queue=lease.queue)
        logger.warning(
            "lease of job %s expired; it is now %s",
            lease.job_id,
            lease.status,
            extra={"job_id": str(lease.job_id), "queue": lease.queue, "outcome": "lease_expired"},
        )
    return recovered


#: Dead letters given their cause per run of :func:`fill_dead_causes`.
FILL_CAUSES_BATCH = 1000


#: :func:`fill_dead_causes` stops after this many seconds and goes on at its next run.
FILL_CAUSES_TIME_BUDGET = 10.0


def fill_dead_causes(*, using: str | None = None, limit: int = FILL_CAUSES_BATCH) -> int:
    """Give dead letters without a cause theirs (``jobs.dead_cause``), ``limit`` per statement
    (and transaction), for ``FILL_CAUSES_TIME_BUDGET`` seconds at most; return how many. The
    app's own ways of killing a job write it; this catches those of a worker of a release
    before migration 0014 (while it applied) and an ``UPDATE`` of yours. The lease recovery's
    job and ``pgoutbox recover-leases`` run it: a read of an empty index when there is none."""
    alias = using or router.db_for_write(Job)
    deadline = time.monotonic() + FILL_CAUSES_TIME_BUDGET
    filled = _in_batches(alias, queries.FILL_DEAD_CAUSES, {}, limit, deadline)
    if filled:
        logger.info("gave %d dead letter(s) their cause", filled, extra={"filled": filled})
    return filled


#: Rows deleted per statement when pruning: small enough to keep each transaction short.
PRUNE_BATCH = 5000
#: Pruning stops after this many seconds and goes on at its next run.
PRUNE_TIME_BUDGET = 60.0


@dataclass(frozen=True)
class PruneResult:
    completed_jobs: int
    cancelled_jobs: int
    processed_events: int
    inbox_messages: int = 0
    stale_heartbeats: int = 0
    workflows: int = 0
    stale_waiters: int = 0


def prune(*, using: str | None = None, batch: int = PRUNE_BATCH) -> PruneResult:
    """Delete finished rows older than ``PGOUTBOX['RETENTION']`` says, in bounded batches.

    Only ``completed`` and ``cancelled`` jobs, processed events and inbox messages are ever
    deleted: pending, leased, retrying and dead rows are left alone, whatever their age.
    Heartbeats of processes not seen for a day go too (a killed process never deletes its own),
    workflows older than the completed jobs' retention whose steps are all gone, and what
    listeners gone waited for (``job_waiters``).
    """
    alias = using or router.db_for_write(Job)
    retention = get_settings().retention
    deadline = time.monotonic() + PRUNE_TIME_BUDGET
    counts = [
        _in_batches(alias, queries.PRUNE_JOBS, {"status": "completed", "age": age}, batch, deadline)
        if (age := retention.completed_jobs) is not None
        else 0,
        _in_batches(alias, queries.PRUNE_JOBS, {"status": "cancelled", "age": age}, batch, deadline)
        if (age := retention.cancelled_jobs) is not None
        else 0,
        _in_batches(alias, queries.PRUNE_EVENTS, {"age": age}, batch, deadline)
        if (age := retention.processed_events) is not None
        else 0,
        _in_batches(alias, queries.PRUNE_INBOX_MESSAGES, {"age": age}, batch, deadline)
        if (age := retention.inbox_messages) is not None
        else 0,
    ]
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.PRUNE_HEARTBEATS)
        counts.append(cursor.rowcount)
    counts.append(
        _in_batches(alias, queries.PRUNE_WORKFLOWS, {"age": age}, batch, deadline)
        if (age := retention.completed_jobs) is not None
        else 0
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.PRUNE_WAITERS)
        counts.append(cursor.rowcount)
    result = PruneResult(*counts)
    if any(counts):
        logger.info("pruned %s", result)
    return result


def _in_batches(alias: str, sql: str, params: dict[str, Any], batch: int, deadline: float) -> int:
    """Run ``sql`` (a statement over at most ``%(limit)s`` rows) again and again, each on its
    own (in autocommit, its own transaction), until it touches fewer than ``batch`` rows or
    ``deadline`` has passed; return how many rows it touched in all."""
    total = 0
    params = {
        name: value.total_seconds() if isinstance(value, timedelta) else value
        for name, value in params.items()
    }
    while True:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql, {**params, "limit": batch})
            touched: int = cursor.rowcount
        total += touched
        if touched < batch or time.monotonic() > deadline:
            return total


@dataclass(frozen=True)
class Reconciliation:
    released_claims: int
    #: Events unprocessed ``OUTBOX["OVERDUE_SECONDS"]`` after they occurred: failing, dead,
    #: held back behind an earlier event of their aggregate, or abandoned.
    overdue_events: int
    oldest_overdue_seconds: float | None
    #: Of those, the abandoned ones: due, heading their aggregate, touched by no relay for as
    #: long (``gauges.abandoned_events``).
    abandoned_events: int = 0


def reconcile_outbox(*, using: str | None = None) -> Reconciliation:
    """Release expired relay claims and report events that are unprocessed for too long."""
    alias = using or router.db_for_write(Job)
    outbox = get_settings().outbox
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.RELEASE_EXPIRED_EVENT_CLAIMS, [outbox.claim_seconds])
        released = cursor.rowcount
        cursor.execute(queries.OVERDUE_EVENTS, [outbox.overdue_seconds])
        overdue, oldest = cursor.fetchone()
    abandoned = gauges.abandoned_events(alias) if overdue else None
    result = Reconciliation(
        released,
        overdue,
        float(oldest) if oldest is not None else None,
        abandoned.count if abandoned is not None else 0,
    )
    if released:
        logger.warning("outbox: released %d expired relay claim(s)", released)
    if abandoned is not None and abandoned.count:
        for warning in gauges.abandoned_warnings(abandoned):
            logger.warning("outbox: %s", warning)
    elif overdue:
        logger.warning(
            "outbox: %d event(s) unprocessed for more than %.0fs (oldest %.0fs), none of them "
            "abandoned: they are failing (retried with back-off), dead, or held back behind a "
            "dead or failing event of their aggregate",
            overdue,
            outbox.overdue_seconds,
            result.oldest_overdue_seconds or 0,
        )
    return result


# -- the built-in maintenance jobs (schedules.BUILTIN_SCHEDULES runs them) ----------------------


@job("pgoutbox.recover_leases")
def recover_leases_job(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    return {
        "recovered": len(recover_expired_leases(using=ctx.using)),
        "causes_filled": fill_dead_causes(using=ctx.using),
    }


@job("pgoutbox.prune")
def prune_job(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    return asdict(prune(using=ctx.using))


@job("pgoutbox.reconcile_outbox")
def reconcile_outbox_job(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return asdict(reconcile_outbox(using=ctx.using))
