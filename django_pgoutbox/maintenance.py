"""Maintenance: lease recovery (and, with the scheduler, retention and reconciliation)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.db import connections, router

from django_pgoutbox import metrics, queries
from django_pgoutbox.models import Job

logger = logging.getLogger("django_pgoutbox.maintenance")


@dataclass(frozen=True)
class RecoveredLease:
    job_id: uuid.UUID
    queue: str
    status: str  # 'retrying' (claimable again) or 'dead' (that was its last attempt)


def recover_expired_leases(
    queue: str | None = None, *, using: str | None = None
) -> list[RecoveredLease]:
    """Return jobs whose lease expired to be claimed again (or dead-letter them); count each.

    Safe to run from any number of processes at once: each expiry is recovered, and counted, once.
    """
    alias = using or router.db_for_write(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.RECOVER_EXPIRED_LEASES, [queue, queue])
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
