"""Each queue's activity minute by minute, for the charts of the admin's overview
(``queue_minutes``): a small rollup, never a scan of finished jobs at each page view.

- **Outcomes.** Every ``runworkers`` process adds what its workers wrote (completed, failed,
  dead) to the current minute's row of each queue, with each heartbeat (every 10 s): the
  deltas of its own counters (``metrics.JOB_OUTCOMES``) since the last write that went through.
  The heartbeat thread owns what it last wrote; a write that fails is carried to the next.
- **Backlog.** The maintenance job ``pgoutbox.sample_queues`` (every minute) records each
  queue's backlog (due and retrying jobs) and the oldest one's wait, from the bounded gauges
  (``gauges.database_gauges``), and deletes the minutes older than ``KEPT_HOURS``.
- **Reading.** ``recent_minutes()`` returns the last hours of every queue, a minute per point
  (minutes with no row are gaps): at most ``KEPT_HOURS * 60`` rows per queue, read by the unique
  index.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router

from django_pgoutbox import gauges, metrics, queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.context import JobContext
from django_pgoutbox.models import Job
from django_pgoutbox.registry import job

#: How long minutes are kept, and the longest window the charts show.
KEPT_HOURS = 24
#: The windows the overview offers, in hours.
WINDOWS = (1, 3, 12, 24)
#: Outcomes by what they count as.
FAILED = ("retrying", "dead")


class OutcomeCounts:
    """What this process's workers wrote, not yet added to ``queue_minutes``: the heartbeat
    thread's own (``health.Heartbeat``)."""

    def __init__(self, queues: Iterable[str]) -> None:
        self._queues = set(queues)
        #: The totals of the last write that went through: (queue, outcome) -> count.
        self._written: dict[tuple[str, str], float] = {}

    def _totals(self) -> dict[tuple[str, str], float]:
        totals: dict[tuple[str, str], float] = {}
        for (queue, _job_type, outcome), count in metrics.JOB_OUTCOMES.samples().items():
            if queue in self._queues:
                totals[queue, outcome] = totals.get((queue, outcome), 0.0) + count
        return totals

    def add(self, cursor: Any) -> int:
        """Add the counts since the last write to this minute's rows; returns how many queues
        it wrote (0: nothing new)."""
        totals = self._totals()
        rows: dict[str, list[int]] = {}
        for (queue, outcome), count in totals.items():
            delta = int(count - self._written.get((queue, outcome), 0.0))
            if delta <= 0:
                continue
            row = rows.setdefault(queue, [0, 0, 0])
            if outcome == "completed":
                row[0] += delta
            elif outcome in FAILED:
                row[1] += delta
                if outcome == "dead":
                    row[2] += delta
        rows = {queue: row for queue, row in rows.items() if any(row)}
        if rows:
            names = sorted(rows)
            cursor.execute(
                queries.ADD_QUEUE_OUTCOMES,
                {
                    "queues": names,
                    "completed": [rows[name][0] for name in names],
                    "failed": [rows[name][1] for name in names],
                    "dead": [rows[name][2] for name in names],
                },
            )
        self._written = totals
        return len(rows)


def sample_backlogs(*, using: str | None = None) -> int:
    """Record each configured queue's backlog in this minute's row, and delete the minutes
    older than ``KEPT_HOURS``; returns how many queues it sampled."""
    alias = using or router.db_for_write(Job)
    configured = get_settings().queues
    sampled = [g for g in gauges.database_gauges(alias).queues.values() if g.queue in configured]
    names = sorted(g.queue for g in sampled)
    by_name = {g.queue: g for g in sampled}
    with connections[alias].cursor() as cursor:
        if names:
            cursor.execute(
                queries.SAMPLE_QUEUE_BACKLOGS,
                {
                    "queues": names,
                    "backlogs": [by_name[n].pending + by_name[n].retrying for n in names],
                    "ages": [float(by_name[n].oldest_pending_age) for n in names],
                },
            )
        cursor.execute(queries.PRUNE_QUEUE_MINUTES, [float(KEPT_HOURS)])
    return len(names)


@job("pgoutbox.sample_queues")
def sample_queues_job(payload: dict[str, Any], ctx: JobContext) -> dict[str, int]:
    return {"sampled": sample_backlogs(using=ctx.using)}


@dataclass(frozen=True)
class Minute:
    """One point of a chart: a queue's minute (None where no row was written)."""

    at: datetime
    completed: int | None = None
    failed: int | None = None
    dead: int | None = None
    backlog: int | None = None
    oldest_pending_age: float | None = None


def recent_minutes(hours: int, *, using: str | None = None) -> dict[str, list[Minute]]:
    """Each queue's last ``hours`` (at most ``KEPT_HOURS``), one ``Minute`` per minute from the
    oldest to the current one, gaps included: every configured queue, and any other that has
    rows."""
    hours = max(1, min(KEPT_HOURS, int(hours)))
    alias = using or router.db_for_read(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.QUEUE_MINUTES, [float(hours)])
        rows = cursor.fetchall()
    now: datetime = rows[0][7]
    first = now - timedelta(hours=hours)
    found: dict[str, dict[datetime, Minute]] = {}
    for queue, at, completed, failed, dead, backlog, age, _ in rows:
        if queue is None:  # no minute at all: the row only says what time it is
            continue
        found.setdefault(queue, {})[at] = Minute(at, completed, failed, dead, backlog, age)
    names = list(get_settings().queues) + sorted(set(found) - set(get_settings().queues))
    span = [first + timedelta(minutes=i) for i in range(hours * 60 + 1)]
    return {name: [found.get(name, {}).get(at) or Minute(at) for at in span] for name in names}
