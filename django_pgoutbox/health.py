"""Heartbeats of the worker processes, and the health report built from them.

Every ``runworkers`` process upserts a row of ``worker_heartbeats`` every ``HEARTBEAT_SECONDS``
and deletes it when it stops. A role (jobs of a queue, relay, scheduler) is healthy when at
least one process running it was seen within ``max_age`` seconds (by the database clock). A
queue's dispatcher marks its queue in its process's row while the queue is stuck (each of its
handler threads held by an attempt that outlived its timeout): the report is then unhealthy.

The report also says who holds the database's xmin horizon, with a warning past
``PGOUTBOX["HORIZON_WARNING_SECONDS"]``: a warning only, since the workers are alive and
draining, only slower; restarting them would release nothing. And it counts the outbox events
that no relay has touched for ``OUTBOX["OVERDUE_SECONDS"]`` though they are due (abandoned), with
a warning: a relay that is alive but far behind leaves them too, and restarting it would not
catch up sooner. And, per subscriber, its undelivered deliveries of outbox events, with a
warning for the dead ones (each holds back that subscriber's later deliveries of its aggregate,
until an operator acts) and for the abandoned ones; warnings only: the other subscribers, and
the workers, go on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import DatabaseError, connections, router

from django_pgoutbox import gauges, queries, queue_controls
from django_pgoutbox.models import WorkerHeartbeat
from django_pgoutbox.queue_minutes import OutcomeCounts

logger = logging.getLogger("django_pgoutbox.worker")

#: What a ``runworkers`` process may do; each is a role the health report can require.
ROLES = ("jobs", "relay", "scheduler")

HEARTBEAT_SECONDS = 10.0
#: A role not seen for this long is reported unhealthy: three missed heartbeats.
DEFAULT_MAX_AGE = 3 * HEARTBEAT_SECONDS
#: The longest ``max_age`` a report takes: a killed process's row is pruned after a day.
MAX_AGE_LIMIT = 24 * 3600.0


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: repr'd, and cut short."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def parse_roles(value: str, name: str = "require") -> list[str]:
    """The roles of a comma-separated list (``jobs,relay``), each once.

    Raises ``ValueError`` naming the parameter ``name`` for a list that names no role (an empty
    one would require nothing, and report healthy with no worker at all) or an unknown role.
    """
    roles = [part.strip() for part in value.split(",")]
    named = [role for role in roles if role]
    if not named:
        raise ValueError(
            f"{name} names no role; give one or more of {', '.join(ROLES)} "
            "(or leave it out for all three)"
        )
    for role in named:
        if role not in ROLES:
            raise ValueError(
                f"{name}: {_shown(role)} is not a role; the roles are {', '.join(ROLES)}"
            )
    return list(dict.fromkeys(named))


def parse_max_age(value: object, name: str = "max_age") -> float:
    """A number of seconds ``> 0`` and ``<= MAX_AGE_LIMIT``; ``ValueError`` naming ``name``."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_AGE_LIMIT):
        raise ValueError(
            f"{name} must be a number of seconds > 0 and <= {MAX_AGE_LIMIT:g}, not {_shown(value)}"
        )
    return seconds


def publish_stuck(connection: Any, worker_id: str, queue: str, stuck: bool) -> None:
    """Record in ``worker_id``'s heartbeat row whether its ``queue`` is stuck: every handler
    thread held by an attempt that outlived its timeout (``QueueRunner._stuck``).

    ``connection``: the queue's dispatcher's own (psycopg, autocommit), which owns that state.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            queries.SET_STUCK_QUEUE, {"queue": queue, "stuck": stuck, "worker_id": worker_id}
        )


class Heartbeat:
    """Keeps this process's ``worker_heartbeats`` row fresh while it runs."""

    def __init__(self, worker_id: str, roles: Iterable[str], queues: Iterable[str], using: str):
        queues = list(queues)
        self.worker_id = worker_id
        self.using = using
        self._params: dict[str, Any] = {
            "worker_id": worker_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "roles": json.dumps(list(roles)),
            "queues": json.dumps(list(queues)),
        }
        #: What this process's workers wrote, added to ``queue_minutes`` with each beat: this
        #: thread's own.
        self._outcomes = OutcomeCounts(queues)
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgoutbox-heartbeat", daemon=True)

    @property
    def params(self) -> dict[str, Any]:
        """HEARTBEAT's parameters for this process."""
        return dict(self._params)

    def start(self) -> None:
        """Write the first beat (on the heartbeat thread's own connection), then beat on."""
        self._thread.start()
        self._first.wait(timeout=10)

    def beat(self) -> None:
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(queries.HEARTBEAT, self._params)
                self._outcomes.add(cursor)
        except DatabaseError as error:
            logger.warning("heartbeat failed (%s); will try again", error)
            connections[self.using].close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            # Its own row only: never one that another process wrote under this id.
            WorkerHeartbeat.objects.using(self.using).filter(
                worker_id=self.worker_id,
                hostname=self._params["hostname"],
                pid=self._params["pid"],
            ).delete()
        except DatabaseError:
            pass  # the row ages out of the report on its own
        finally:
            connections[self.using].close()

    def _run(self) -> None:
        try:
            try:
                self.beat()
            finally:
                self._first.set()
            while not self._stop.wait(HEARTBEAT_SECONDS):
                self.beat()
        finally:
            connections[self.using].close()


@dataclass
class HealthReport:
    healthy: bool
    roles: dict[str, bool] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)
    #: Queues that a live worker reports stuck (each of its handler threads held by an
    #: attempt that outlived its timeout): unhealthy, whatever the roles say.
    stuck_queues: list[str] = field(default_factory=list)
    #: The oldest holder of the xmin horizon, or None.
    horizon: gauges.HorizonHolder | None = None
    #: Outbox events that no relay has touched for ``OUTBOX["OVERDUE_SECONDS"]``, or None.
    abandoned_events: gauges.AbandonedEvents | None = None
    #: The subscribers' undelivered deliveries, by subscriber (``gauges.SubscriberGauges``), or
    #: None.
    deliveries: dict[str, gauges.SubscriberGauges] | None = None
    #: Queues paused at run time (``pause_queue()``): no worker claims their jobs. A warning,
    #: never unhealthy.
    paused_queues: list[str] = field(default_factory=list)
    #: What an operator should look at, which does not make the report unhealthy: the horizon
    #: held past ``PGOUTBOX["HORIZON_WARNING_SECONDS"]``, abandoned outbox events, dead and
    #: abandoned deliveries.
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "roles": self.roles,
            "workers": self.workers,
            "stuck_queues": self.stuck_queues,
            "paused_queues": self.paused_queues,
            "horizon": None if self.horizon is None else asdict(self.horizon),
            "abandoned_events": (
                None if self.abandoned_events is None else asdict(self.abandoned_events)
            ),
            "deliveries": (
                None
                if self.deliveries is None
                else {name: asdict(each) for name, each in self.deliveries.items()}
            ),
            "warnings": self.warnings,
        }


def health_report(
    *,
    max_age: float = DEFAULT_MAX_AGE,
    require: Iterable[str] = ("jobs", "relay", "scheduler"),
    using: str | None = None,
) -> HealthReport:
    """Which required roles were seen within ``max_age`` seconds, and by which processes.

    ``require`` must name at least one role, and ``max_age`` be a number of seconds from 0 to
    ``MAX_AGE_LIMIT``: ``ValueError`` otherwise, rather than a report that nothing could fail.
    """
    require = list(require)
    if not require:
        raise ValueError("require names no role: a report would be healthy with no worker")
    max_age = parse_max_age(max_age)
    alias = using or router.db_for_write(WorkerHeartbeat)
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.WORKER_HEARTBEATS)
        rows = cursor.fetchall()
    workers = []
    seen: set[str] = set()
    stuck: set[str] = set()
    for worker_id, hostname, pid, roles, queues, started_at, age, stuck_queues in rows:
        roles = json.loads(roles) if isinstance(roles, str) else roles
        queues = json.loads(queues) if isinstance(queues, str) else queues
        if isinstance(stuck_queues, str):
            stuck_queues = json.loads(stuck_queues)
        alive = age <= max_age
        if alive:
            seen.update(roles)
            stuck.update(stuck_queues)
        workers.append(
            {
                "worker_id": worker_id,
                "hostname": hostname,
                "pid": pid,
                "roles": roles,
                "queues": queues,
                "started_at": started_at.isoformat(),
                "seconds_since_seen": round(age, 3),
                "alive": alive,
                "stuck_queues": stuck_queues,
            }
        )
    roles_ok = {role: role in seen for role in require}
    holder = gauges.horizon_holder(alias)
    abandoned = gauges.abandoned_events(alias)
    deliveries = gauges.delivery_gauges(alias)
    statuses, controls_problem = queue_controls.statuses_for_monitoring(alias)
    paused = [status for status in statuses.values() if status.paused]
    return HealthReport(
        healthy=all(roles_ok.values()) and not stuck,
        roles=roles_ok,
        workers=workers,
        stuck_queues=sorted(stuck),
        paused_queues=[status.queue for status in paused],
        horizon=holder,
        abandoned_events=abandoned,
        deliveries=deliveries,
        warnings=(
            gauges.horizon_warnings(holder)
            + gauges.abandoned_warnings(abandoned)
            + gauges.delivery_warnings(deliveries)
            + [
                f"queue {status.queue} is paused (by {status.paused_by}, since "
                f"{status.paused_at.isoformat() if status.paused_at else 'unknown'}): no worker "
                "claims its jobs until it is resumed"
                for status in paused
            ]
            + ([controls_problem] if controls_problem else [])
        ),
    )
