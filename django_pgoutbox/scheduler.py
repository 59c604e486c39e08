"""Recurring schedules: each slot enqueued exactly once, however many schedulers run.

Coordination, as the source text asks, is a lock *plus* idempotency:

- for each due schedule, a scheduler takes ``pg_try_advisory_xact_lock`` on a stable key made from
  the schedule's name, in a transaction that reads the schedule's cursor (``schedule_cursors``),
  enqueues the slot's job, advances the cursor and commits. A replica that does not get the lock
  skips the schedule this time; the lock is held only while checking and enqueuing, and being
  transaction-scoped it is released at commit, also behind a transaction-pooling proxy;
- the job's idempotency key is ``schedule:<name>:<slot>``, so that even two schedulers that both
  got past the cursor (a cursor deleted by hand, a clock jump) enqueue the slot once.

Slots come from the database clock (``now()``), never a host's, so replicas agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import datetime

from django.db import connections, router, transaction

from django_pgoutbox import metrics, queries
from django_pgoutbox.cron import CronError
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.enqueueing import enqueue
from django_pgoutbox.models import Job, ScheduleCursor
from django_pgoutbox.retry import summarize
from django_pgoutbox.schedules import BUILTIN_SCHEDULES, Schedule

logger = logging.getLogger("django_pgoutbox.scheduler")


# -- running them --------------------------------------------------------------------------------


def database_now(using: str) -> datetime:
    with connections[using].cursor() as cursor:
        cursor.execute(queries.DATABASE_NOW)
        value: datetime = cursor.fetchone()[0]
    return value


def enqueue_due(schedule: Schedule, *, using: str, now: datetime | None = None) -> list[Job] | None:
    """Enqueue the due slots of one schedule, under its advisory lock; None if another has it.

    ``now`` replaces the database clock (tests use it to travel in time).
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(queries.SCHEDULE_LOCK, [schedule.lock_key])
        locked, db_now = cursor.fetchone()
        if not locked:
            return None
        now = now or db_now
        cursor.execute(queries.SCHEDULE_CURSOR, [schedule.name])
        row = cursor.fetchone()
        latest = schedule.latest_due(now)
        if row is None or row[0] is None:
            # First sight: start from now; a schedule added today does not run for yesterday.
            cursor.execute(
                queries.START_SCHEDULE_CURSOR, {"name": schedule.name, "last_slot_at": latest}
            )
            return []
        last = row[0]
        if latest <= last:
            return []
        slots = schedule.slots_to_enqueue(last, now)
        previous = schedule._previous(latest)
        skipped = schedule.catch_up != "all" and previous is not None and previous > last
        jobs = [
            enqueue(
                schedule.job_type,
                dict(schedule.payload),
                idempotency_key=schedule.idempotency_key(slot),
                queue=schedule.queue,
                priority=schedule.priority,
                using=using,
            )
            for slot in slots
        ]
        cursor.execute(
            queries.ADVANCE_SCHEDULE_CURSOR, {"name": schedule.name, "last_slot_at": latest}
        )
    for slot, job in zip(slots, jobs, strict=True):
        metrics.SCHEDULE_SLOTS.inc(schedule=schedule.name)
        logger.info(
            "schedule %s: slot %s enqueued as job %s",
            schedule.name,
            slot.isoformat(),
            job.id,
            extra={"job_id": str(job.id), "schedule": schedule.name},
        )
    if skipped:
        enqueued = (
            f"enqueued only the latest, {slots[-1].isoformat()}, and skipped the others"
            if slots
            else "skipped them all"
        )
        # The built-in maintenance misses nothing by skipping slots (the next run does all the
        # work that is due): a note, not a warning at every start after a pause.
        logger.log(
            logging.INFO if schedule.name in BUILTIN_SCHEDULES else logging.WARNING,
            "schedule %s: missed its slots after %s (no scheduler was running at those times); "
            "CATCH_UP %r %s. Set this schedule's CATCH_UP to 'all' to enqueue every missed slot "
            "(docs/scheduling.md).",
            schedule.name,
            last.isoformat(),
            schedule.catch_up,
            enqueued,
            extra={"schedule": schedule.name},
        )
    return jobs


def run_now(schedule: Schedule, *, using: str | None = None) -> Job:
    """Enqueue a schedule's job at once, outside its slots (the cursor does not move)."""
    alias = using or router.db_for_write(Job)
    return enqueue(
        schedule.job_type,
        dict(schedule.payload),
        idempotency_key=schedule.manual_key(database_now(alias)),
        queue=schedule.queue,
        priority=schedule.priority,
        using=alias,
    )


def cursors(using: str | None = None) -> dict[str, datetime | None]:
    alias = using or router.db_for_write(ScheduleCursor)
    return dict(ScheduleCursor.objects.using(alias).values_list("name", "last_slot_at"))


class Scheduler:
    """The scheduler role: wakes at each slot (or the poll interval) and enqueues what is due."""

    def __init__(
        self,
        schedules: Mapping[str, Schedule],
        *,
        using: str,
        poll_interval: float,
        burst: bool = False,
    ) -> None:
        self.schedules = dict(schedules)
        self.using = using
        self.poll_interval = poll_interval
        self.burst = burst
        self._stopping = threading.Event()
        self.finished = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run_once(self, now: datetime | None = None) -> datetime:
        """Enqueue every due slot; return the database time it ran at.

        One schedule that fails (any exception but a lost connection) is logged, counted in
        ``pgoutbox_schedule_failures_total`` and skipped until its next slot; the others run.
        A lost connection raises, for ``run()`` to reconnect.
        """
        started = time.perf_counter()
        db_now = database_now(self.using)
        current = now or db_now
        known = cursors(self.using)
        for schedule in self.schedules.values():
            try:
                last = known.get(schedule.name)
                if last is not None and schedule.latest_due(current) <= last:
                    continue  # not due: no transaction, no lock
                enqueue_due(schedule, using=self.using, now=now)
            except Exception as error:
                if classify_error(error) == ErrorKind.CONNECTION:
                    raise
                metrics.SCHEDULE_FAILURES.inc(schedule=schedule.name)
                logger.exception(
                    "schedule %s: enqueuing its due slot failed (%s); skipped, the other "
                    "schedules run",
                    schedule.name,
                    summarize(error),
                    extra={"schedule": schedule.name},
                )
        metrics.BATCH_DB_DURATION.observe(time.perf_counter() - started, role="scheduler")
        return current

    def run(self) -> None:
        pause = 0.2
        try:
            while not self._stopping.is_set():
                try:
                    now = self.run_once()
                    pause = 0.2
                except Exception as error:
                    if classify_error(error) == ErrorKind.CONNECTION:
                        logger.warning("scheduler: database unavailable (%s); retrying", error)
                    else:
                        logger.exception("scheduler: its turn failed; retrying")
                    connections[self.using].close()
                    self._stopping.wait(pause)
                    pause = min(pause * 2, 10.0)
                    continue
                if self.burst:
                    return
                self._stopping.wait(self._until_next_slot(now))
        finally:
            connections[self.using].close()
            self.finished.set()

    def _until_next_slot(self, now: datetime) -> float:
        upcoming = []
        for schedule in self.schedules.values():
            try:
                upcoming.append(schedule.next_after(now))
            except (ArithmeticError, CronError, ValueError):  # none before year 9999
                continue
        if not upcoming:
            return self.poll_interval
        # A few milliseconds late, so that the database's clock has reached the slot.
        return max(0.005, min((min(upcoming) - now).total_seconds() + 0.005, self.poll_interval))
