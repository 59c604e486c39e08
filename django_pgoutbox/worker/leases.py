"""Leases: their renewal (which also delivers cancellation requests), their recovery, and
giving jobs back: unstarted ones at shutdown, unfinished ones when the grace period is over.

Each class here is a request that a lane runs; the coordinator reads its result.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg

from django_pgoutbox import health, queries
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.worker.attempt import Key

#: Renew a running attempt's lease when this fraction of it has passed.
RENEW_FRACTION = 1 / 3


@dataclass(eq=False)
class RenewalRequest:
    """A handler's ``ctx.renew_lease()``: posted to the coordinator, answered through ``done``."""

    key: Key
    done: Any = None  # a threading.Event, set once ``held`` is written
    held: bool = False


@dataclass(eq=False)
class Renew:
    """Extend the leases of ``keys``; the result: job id -> whether its cancellation was asked."""

    keys: list[Key]
    lease_seconds: float
    worker_id: str
    #: The handlers' own requests that this renewal answers.
    asked: list[RenewalRequest] = field(default_factory=list)

    def run(self, connection: psycopg.Connection[Any]) -> dict[uuid.UUID, bool]:
        if not self.keys:
            return {}
        with connection.cursor() as cursor:
            queries.send(
                cursor,
                "RENEW_LEASES",
                [
                    self.lease_seconds,
                    [key[0] for key in self.keys],
                    [key[1] for key in self.keys],
                    self.worker_id,
                ],
            )
            return {job_id: bool(cancelled) for job_id, cancelled in cursor.fetchall()}


@dataclass(eq=False)
class Recover:
    """Recover this queue's expired leases (``maintenance.recover_expired_leases``)."""

    queue: str

    def run(self, connection: psycopg.Connection[Any]) -> None:
        recover_expired_leases(self.queue, connection=connection)


@dataclass(eq=False)
class GiveBack:
    """Give jobs back: UNCLAIM_JOBS (unstarted: the attempt with them) or RELEASE_JOBS
    (unfinished at the end of the grace period). Returns how many rows it changed."""

    statement: str
    keys: list[Key]
    worker_id: str
    #: Why (for the coordinator's log): "shutdown", "suspects", "grace".
    reason: str

    def run(self, connection: psycopg.Connection[Any]) -> int:
        with connection.cursor() as cursor:
            queries.send(
                cursor,
                self.statement,
                [[key[0] for key in self.keys], [key[1] for key in self.keys], self.worker_id],
            )
            return cursor.rowcount


@dataclass(eq=False)
class MarkAlone:
    """Write in a suspect's row that this attempt counts should the process die (MARK_ALONE);
    returns whether the lease is still this worker's."""

    key: Key
    worker_id: str

    def run(self, connection: psycopg.Connection[Any]) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(queries.MARK_ALONE, [self.key[0], self.key[1], self.worker_id])
            return cursor.fetchone() is not None


@dataclass(eq=False)
class PublishHealth:
    """Tell this worker's heartbeat row whether the queue is stuck (``/pgoutbox/health``)."""

    worker_id: str
    queue: str
    stuck: bool

    def run(self, connection: psycopg.Connection[Any]) -> None:
        health.publish_stuck(connection, self.worker_id, self.queue, self.stuck)
