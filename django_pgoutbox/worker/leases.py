"""Leases: their renewal (which also delivers cancellation requests), their recovery, and
giving jobs back: unstarted ones at shutdown, unfinished ones when the grace period is over.

Each class here is a request that a lane runs; the coordinator reads its result.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import psycopg

from django_pgoutbox import health, queries
from django_pgoutbox.aging import age_priorities
from django_pgoutbox.conf import PriorityAging, QueueSettings
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.retry import summarize
from django_pgoutbox.worker.attempt import Key
from django_pgoutbox.worker.controls import ReadControl

logger = logging.getLogger("django_pgoutbox.worker")

#: Renew a running attempt's lease when this fraction of it has passed.
RENEW_FRACTION = 1 / 3
#: A queue's next lease recovery comes no sooner than this many times the last one's duration
#: after it (and no sooner than its poll interval).
RECOVERY_SPACING = 10.0


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
    """Recover this queue's expired leases (``maintenance.recover_expired_leases``), after
    reading the queue's row of ``queue_controls`` (``control``) if asked: the once per poll
    interval read that finds a change whose notification was lost. Then, on a queue with
    ``PRIORITY_AGING``, a pass of aging if none ran on the queue lately (``aging``): the
    workers that serve a queue age it, whatever runs the maintenance queue."""

    #: A held xmin horizon can make it slow: then the other lanes do not wait for it
    #: (``lanes.SLOW_FIRST``).
    held_by_locks: ClassVar[bool] = True
    queue: str
    control: ReadControl | None = None
    #: What ``control`` read, filled in on the lane.
    read: Control | None = None
    #: How long the recovery took (seconds), filled in on the lane.
    seconds: float = 0.0
    aging: PriorityAging | None = None
    #: How many jobs the pass of aging raised, filled in on the lane.
    raised: int = 0

    def run(self, connection: psycopg.Connection[Any]) -> None:
        if self.control is not None:
            self.read = self.control.run(connection)
        started = time.perf_counter()
        try:
            recover_expired_leases(self.queue, connection=connection)
        finally:
            self.seconds = time.perf_counter() - started
        # Not in ``seconds``, which spaces the recoveries: a pass has its own spacing and budget
        if self.aging is not None:
            self._age(connection)

    def _age(self, connection: psycopg.Connection[Any]) -> None:
        """A pass of aging. Its failure is logged, not the request's: the leases were recovered
        and the row read, and a pass that fails again (a table missing before ``migrate``)
        must not hold them back. A lost connection is the lane's to handle."""
        assert self.aging is not None
        try:
            self.raised = age_priorities(self.queue, self.aging, connection=connection)
        except psycopg.Error as error:
            if connection.broken or connection.closed:
                raise
            logger.warning(
                "queue %s: priority aging failed (%s); it runs again with the next recovery",
                self.queue,
                summarize(error),
                extra={"queue": self.queue},
            )


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

    def answered(self, queue: str, released: Any, error: BaseException | None) -> None:
        """Log what the coordinator should know of its answer: jobs released at the end of
        the grace period, or jobs that could not be given back."""
        if error is not None:
            logger.warning(
                "queue %s: %d job(s) could not be given back (%s); their leases will expire",
                *(queue, len(self.keys), summarize(error)),
                extra={"queue": queue},
            )
        elif self.reason == "grace":
            logger.warning(
                "queue %s: grace period over; released %d unfinished job(s) for another worker",
                *(queue, released),
                extra={"queue": queue},
            )


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


class Upkeep:
    """When a queue renews its leases (and delivers cancellations) and recovers expired ones:
    the coordinator's own."""

    def __init__(self, settings: QueueSettings, worker_id: str, now: float) -> None:
        self.settings = settings
        self.worker_id = worker_id
        self.lease_seconds = settings.lease_seconds
        #: The handlers' own renewal requests (``ctx.renew_lease()``) not sent yet.
        self.asked: list[RenewalRequest] = []
        self.check_cancel = False  # a cancellation was requested: renew now to learn of it
        self.renewing = self.recovering = False
        #: The last statement answered was a renewal: the next turn with a lane free writes
        #: and claims first (until the next renewal is sent).
        self.renewed_last = False
        self.next_renewal = now + self.lease_seconds * RENEW_FRACTION
        self.next_recovery = now
        self.recovery_sent = now
        self.reporting = False
        #: Whether the queue is stuck, as the heartbeat row was last told (None: tell it again).
        self.reported_stuck: bool | None = False

    def renewal_due(self, now: float, running: bool) -> bool:
        return not self.renewing and (
            bool(self.asked) or (running and (self.check_cancel or now >= self.next_renewal))
        )

    def renew(self, now: float, keys: list[Key]) -> Renew:
        asked, self.asked = self.asked, []
        self.check_cancel = False
        self.renewing, self.renewed_last = True, False
        self.next_renewal = now + self.lease_seconds * RENEW_FRACTION
        return Renew(keys, self.lease_seconds, self.worker_id, asked)

    def replied(self, request: Any, *, failed: bool, now: float) -> None:
        """A renewal, a recovery or a health report came back. A renewal that failed goes
        again once the lane is ready, not a third of a lease later: another failure then would
        leave the leases to expire while their attempts run."""
        if isinstance(request, Renew):
            self.renewing, self.renewed_last = False, not failed
            if failed:
                self.asked[:0] = request.asked
                self.next_renewal = now
        elif isinstance(request, Recover):
            self.recovering = False
            # Its scan of jobs_leased_idx steps over an entry for every job claimed while the
            # xmin horizon is held: seconds, after minutes of it. Spaced, it takes at most a
            # tenth of a lane's time; leases last far longer than the wait it adds. (A failure
            # says nothing of the scan: the next goes after the poll interval, as ever.)
            if not failed:
                spaced = now + RECOVERY_SPACING * request.seconds
                self.next_recovery = max(self.next_recovery, spaced)
        elif isinstance(request, PublishHealth):
            self.reporting = False
            if failed:
                self.reported_stuck = None

    def health_due(self, stuck: bool) -> bool:
        return stuck != self.reported_stuck and not self.reporting

    def report(self, stuck: bool) -> PublishHealth:
        """Tell this worker's heartbeat row whether the queue is stuck: every handler thread
        held by an attempt that outlived its timeout (``/pgoutbox/health`` reads it)."""
        self.reporting, self.reported_stuck = True, stuck
        if stuck:
            logger.error(
                "queue %s: every handler thread is held by an attempt that outlived its "
                "timeout; reported unhealthy until they return",
                self.settings.name,
                extra={"queue": self.settings.name},
            )
        return PublishHealth(self.worker_id, self.settings.name, stuck)

    def recovery_due(self, now: float) -> bool:
        return not self.recovering and now >= self.next_recovery

    def recover(self, now: float, control: ReadControl | None = None) -> Recover:
        self.recovering = True
        self.recovery_sent = now
        self.next_recovery = now + self.settings.poll_interval
        return Recover(self.settings.name, control, aging=self.settings.priority_aging)

    def deadlines(self, running: bool, *, recovering: bool) -> list[float]:
        """When to look again, while a lane is free (``recovering``: recovery may be sent)."""
        deadlines = [self.next_recovery] if recovering and not self.recovering else []
        if running and not self.renewing:
            deadlines.append(self.next_renewal)
        return deadlines
