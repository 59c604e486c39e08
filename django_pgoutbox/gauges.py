"""Database gauges: counts by state, oldest due age, outbox lag, the subscribers' undelivered
deliveries, the xmin horizon and the notification queue, read when asked at a cost that does not
grow with the tables: each count reads a partial index of live rows and stops at ``EXACT_COUNT``,
above which it is the planner's estimate (docs/observability.md), or (deliveries) a lower bound.
And who holds the xmin horizon (``horizon_holder``), with the warning the reports give when it
has held it too long (``horizon_warnings``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, router, transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.metrics import UNREGISTERED

#: Counts up to this are exact. A count that would go past it reads no further: the gauge then
#: shows the planner's estimate from the table's statistics (at least this much, and never less
#: than what was counted), so that a scrape costs the same at a thousand rows as at a billion.
EXACT_COUNT = 1000
#: The priorities of one queue whose waiting jobs the gauges walk, highest first (one index
#: probe each). Past them, the queue's pending and scheduled counts are estimates and its
#: oldest due age covers the highest ones only.
MAX_PRIORITIES = 100
#: Queues not configured (since removed from ``PGOUTBOX["QUEUES"]``, or written by hand) that
#: the gauges count one by one, together as ``unregistered``; past them, that row is estimated.
MAX_UNREGISTERED_QUEUES = 20
#: Subscribers not registered (since renamed or removed, or written by hand) whose undelivered
#: deliveries the gauges read one by one, together as ``unregistered``; past them, that row is a
#: lower bound.
MAX_UNREGISTERED_SUBSCRIBERS = 20


@dataclass(frozen=True)
class QueueGauges:
    queue: str
    pending: int = 0  # due now
    scheduled: int = 0  # pending with run_at in the future
    leased: int = 0
    retrying: int = 0
    dead: int = 0
    #: Seconds since the oldest job waiting to be claimed (pending, or retrying after its
    #: back-off) became due.
    oldest_pending_age: float = 0.0
    #: The fields above that are estimates (each count over ``EXACT_COUNT``); the others are
    #: exact.
    estimated: tuple[str, ...] = ()


@dataclass(frozen=True)
class SubscriberGauges:
    """One subscriber's undelivered deliveries (``outbox_deliveries``), by state."""

    subscriber: str
    #: Undelivered, not dead, never failed: written behind an earlier delivery of the aggregate
    #: (or by a replay), or due to run.
    waiting: int = 0
    #: Undelivered, not dead, failed at least once: retried with back-off.
    failing: int = 0
    #: Gave up after ``OUTBOX["MAX_ATTEMPTS"]`` (or refused the schema version): each holds back
    #: this subscriber's later deliveries of its aggregate until re-driven or discarded.
    dead: int = 0
    #: Seconds since the event of the oldest waiting or failing delivery occurred (0 when none):
    #: how far behind this subscriber is.
    lag: float = 0.0
    #: Deliveries due for over ``OUTBOX["OVERDUE_SECONDS"]``, first undelivered one of their
    #: (aggregate, subscriber), that no relay has claimed for as long; and the seconds the
    #: longest of them has waited untouched (0 when none).
    abandoned: int = 0
    abandoned_age: float = 0.0
    #: The fields above that are lower bounds: each subscriber's first ``EXACT_COUNT``
    #: undelivered deliveries (oldest written first) are read, no more.
    estimated: tuple[str, ...] = ()

    @property
    def undelivered(self) -> int:
        return self.waiting + self.failing + self.dead


#: The fields of ``SubscriberGauges`` that are summed, and those of which the largest is kept,
#: where several subscribers are reported as one (``unregistered``).
_DELIVERY_COUNTS = ("waiting", "failing", "dead", "abandoned")
_DELIVERY_AGES = ("lag", "abandoned_age")


@dataclass(frozen=True)
class DatabaseGauges:
    queues: dict[str, QueueGauges]
    outbox_pending: int
    outbox_dead: int
    outbox_lag: float  # seconds since the oldest unprocessed, available event occurred
    oldest_transaction_age: float  # the xmin horizon that holds back vacuum
    notification_queue_usage: float  # fraction of the NOTIFY queue in use
    #: Events that no relay has touched for ``OUTBOX["OVERDUE_SECONDS"]`` though they are due
    #: and head their aggregate (neither failing nor held back behind an earlier event), and
    #: the seconds the longest of them has waited so (0 when none).
    outbox_abandoned: int = 0
    outbox_abandoned_age: float = 0.0
    #: The outbox fields above that are estimates (``outbox_pending``, ``outbox_dead``), an
    #: upper bound (``outbox_lag``, when more than ``EXACT_COUNT`` dead or backing-off events
    #: come before the first available one) or a lower bound (``outbox_abandoned``, looked for
    #: among the first ``EXACT_COUNT`` waiting events, the dead ones stepped over).
    estimated: tuple[str, ...] = ()
    #: The subscribers' undelivered deliveries, by subscriber: every registered subscriber (with
    #: zeros when it has none), then ``unregistered`` for the others' when they have any.
    deliveries: dict[str, SubscriberGauges] = field(default_factory=dict)


_STATUSES = ("pending", "scheduled", "leased", "retrying", "dead")


class _Estimates:
    """The planner's row estimates of the counts that reached their limit, asked for together and
    read from one ``EXPLAIN (FORMAT JSON)`` of their ``UNION ALL``: one round trip, no row read.
    """

    def __init__(self) -> None:
        self._asked: list[tuple[str, list[Any], Callable[[int], None]]] = []

    def ask(self, sql: str, params: list[Any], then: Callable[[int], None]) -> None:
        """Call ``then`` with the estimated rows of ``sql`` once ``run`` has run."""
        self._asked.append((sql, params, then))

    def run(self, cursor: Any) -> None:
        if not self._asked:
            return
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + " UNION ALL ".join(f"({sql})" for sql, _, _ in self._asked),
            [param for _, params, _ in self._asked for param in params],
        )
        top = _plan(cursor.fetchone()[0])
        branches = top.get("Plans", []) if len(self._asked) > 1 else [top]
        if len(self._asked) > 1 and (
            top["Node Type"] != "Append" or len(branches) != len(self._asked)
        ):
            branches = []  # a plan of another shape: each on its own
            for sql, params, _ in self._asked:
                cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
                branches.append(_plan(cursor.fetchone()[0]))
        for (_, _, then), branch in zip(self._asked, branches, strict=True):
            then(int(branch["Plan Rows"]))


def _plan(output: Any) -> dict[str, Any]:
    """The top node of an ``EXPLAIN (FORMAT JSON)`` output."""
    plan: dict[str, Any] = (json.loads(output) if isinstance(output, str) else output)[0]["Plan"]
    return plan


@dataclass
class _Counted:
    """One queue's counts as the gauge statement read them (each stopped at its limit)."""

    priorities: int
    oldest_due_age: float | None
    retry_due: int
    retry_later: int
    due: int
    later: int
    dead: int
    leased: int


def _queue_values(counted: _Counted, leased_total: int) -> tuple[dict[str, int], set[str]]:
    """One queue's counts, and the names of those that are not exact and must be estimated.

    Each count stopped at ``limit`` rows (the waiting ones at ``limit`` + the retrying ones on
    the same side of now, which are among them), so that a count under its limit is exact. The
    value given for one that must be estimated is what is known of it at least: an estimate
    below it is raised to it.
    """
    limit = EXACT_COUNT + 1
    values: dict[str, int] = {}
    unknown: set[str] = set()
    walked = counted.priorities <= MAX_PRIORITIES
    for status, waiting, retrying in (
        ("pending", counted.due, counted.retry_due),
        ("scheduled", counted.later, counted.retry_later),
    ):
        # Pending = waiting - retrying, known while the retrying jobs are: at least that.
        values[status] = max(0, waiting - retrying) if retrying < limit else 0
        if not (walked and retrying < limit and waiting < limit + retrying):
            unknown.add(status)
    values["retrying"] = counted.retry_due + counted.retry_later
    if counted.retry_due >= limit or counted.retry_later >= limit:
        unknown.add("retrying")
    values["dead"] = counted.dead
    if counted.dead >= limit:
        unknown.add("dead")
    values["leased"] = counted.leased
    if leased_total >= limit:
        unknown.add("leased")
    return values, unknown


def _estimate(
    estimates: _Estimates,
    statements: dict[str, str],
    params: list[Any],
    values: dict[str, int],
    unknown: set[str],
) -> None:
    """Ask for the estimate of each count of ``unknown``, to replace it in ``values`` (never
    below the value it has: what was counted of it at least)."""

    def at_least(status: str, exact: int = 0) -> Callable[[int], None]:
        def replace(estimate: int) -> None:
            values[status] = max(values[status], estimate - exact)

        return replace

    sides = {"pending", "scheduled"}
    if len(sides & unknown) == 1:
        # One side of now was counted exactly: the other is the rest of the pending jobs.
        (status,) = sides & unknown
        exact = values[(sides - {status}).pop()]
        estimates.ask(statements["waiting"], params, at_least(status, exact))
        unknown = unknown - {status}
    for status in sorted(unknown):
        estimates.ask(statements[status], params, at_least(status))


def database_gauges(using: str | None = None) -> DatabaseGauges:
    """Read the gauges from the database: a fixed amount of work, whatever the tables hold.

    Two statements read partial indexes of live rows, each count stopping at
    ``EXACT_COUNT + 1`` rows; the counts that reached it are replaced by the planner's
    estimates (one ``EXPLAIN`` for all). Queues that are not configured are reported together
    as ``unregistered``.
    """
    from django_pgoutbox.models import Job

    alias = using or router.db_for_write(Job)
    configured = list(get_settings().queues)
    limit = EXACT_COUNT + 1
    queues: dict[str, QueueGauges] = {}
    # In a transaction (a savepoint, inside the caller's) that is rolled back: the plan's
    # settings end with it, and the reads have nothing to keep.
    estimates = _Estimates()
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(queries.GAUGES_PLAN)
        cursor.execute(
            queries.JOB_GAUGES,
            {
                "queues": configured,
                "limit": limit,
                "priorities": MAX_PRIORITIES,
                "probes": len(configured) + MAX_UNREGISTERED_QUEUES + 1,
                "unregistered": MAX_UNREGISTERED_QUEUES,
            },
        )
        rows = cursor.fetchall()
        cursor.execute(
            queries.OUTBOX_AND_SERVER_GAUGES,
            {"limit": limit, "overdue": get_settings().outbox.overdue_seconds},
        )
        (
            dead,
            unprocessed,
            lag,
            lag_bound,
            dead_estimate,
            xmin_age,
            notify_usage,
            abandoned,
            abandoned_age,
        ) = cursor.fetchone()
        by_queue: dict[str, tuple[dict[str, int], set[str], float]] = {}
        other_values = dict.fromkeys(_STATUSES, 0)
        other_unknown: set[str] = set()
        other_oldest = 0.0
        for queue, is_configured, priorities, oldest, *counts, leased_total, more in rows:
            counted = _Counted(priorities, oldest, *counts)
            values, unknown = _queue_values(counted, leased_total)
            if priorities > MAX_PRIORITIES:
                unknown.add("oldest_pending_age")
            if is_configured:
                statuses = unknown & set(_STATUSES)
                _estimate(estimates, queries.ESTIMATE_QUEUE_JOBS, [queue], values, statuses)
                by_queue[queue] = (values, unknown, float(oldest or 0.0))
                continue
            for status in _STATUSES:
                other_values[status] += values[status]
            other_unknown |= unknown
            if more > 0:  # more such queues than counted one by one
                other_unknown |= {*_STATUSES, "oldest_pending_age"}
            other_oldest = max(other_oldest, float(oldest or 0.0))
        if len(by_queue) < len(rows):  # queues that are not configured hold jobs
            _estimate(
                estimates,
                queries.ESTIMATE_UNREGISTERED_JOBS,
                [configured],
                other_values,
                other_unknown & set(_STATUSES),
            )
        # Unprocessed events were counted up to the limit + the dead ones (which are among them)
        # while those were under the limit.
        outbox = {"pending": unprocessed - dead, "dead": dead}
        outbox_estimated: list[str] = []
        if dead >= limit or unprocessed >= limit + dead:
            outbox_estimated.append("outbox_pending")
            # With the dead under the limit, at least the events counted past them wait.
            floor = outbox["pending"] if dead < limit else 0

            def pending(estimate: int) -> None:
                outbox["pending"] = max(estimate, floor)

            estimates.ask(queries.ESTIMATE_OUTBOX_PENDING, [], pending)
        if dead >= limit:
            outbox_estimated.append("outbox_dead")
            outbox["dead"] = max(int(dead_estimate or 0), dead)
        if lag is None and lag_bound is not None:
            outbox_estimated.append("outbox_lag")
            lag = lag_bound
        if dead >= limit or unprocessed >= limit + dead:
            outbox_estimated.append("outbox_abandoned")
        deliveries = _read_deliveries(cursor)
        estimates.run(cursor)
        transaction.set_rollback(True, using=alias)
    order = (*_STATUSES, "oldest_pending_age")
    for queue, (values, unknown, oldest_age) in by_queue.items():
        queues[queue] = QueueGauges(
            queue=queue,
            oldest_pending_age=oldest_age,
            estimated=tuple(s for s in order if s in unknown),
            **values,
        )
    if len(by_queue) < len(rows):
        unregistered = QueueGauges(
            queue=UNREGISTERED,
            oldest_pending_age=other_oldest,
            estimated=tuple(s for s in order if s in other_unknown),
            **other_values,
        )
        queues[UNREGISTERED] = _merged(queues.get(UNREGISTERED), unregistered)
    return DatabaseGauges(
        queues=queues,
        outbox_pending=int(outbox["pending"]),
        outbox_dead=int(outbox["dead"]),
        outbox_lag=float(lag or 0.0),
        oldest_transaction_age=float(xmin_age),
        notification_queue_usage=float(notify_usage),
        outbox_abandoned=int(abandoned),
        outbox_abandoned_age=float(abandoned_age or 0.0),
        estimated=tuple(outbox_estimated),
        deliveries=deliveries,
    )


def delivery_gauges(using: str | None = None) -> dict[str, SubscriberGauges]:
    """The subscribers' undelivered deliveries alone (``DatabaseGauges.deliveries``): one
    statement, ``queries.DELIVERY_GAUGES``, whatever the table holds."""
    from django_pgoutbox.models import Job

    alias = using or router.db_for_write(Job)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(queries.GAUGES_PLAN)
        deliveries = _read_deliveries(cursor)
        transaction.set_rollback(True, using=alias)
    return deliveries


def _read_deliveries(cursor: Any) -> dict[str, SubscriberGauges]:
    """DELIVERY_GAUGES, on the gauges' cursor (after GAUGES_PLAN): every registered subscriber,
    then the others' deliveries together as ``unregistered``."""
    from django_pgoutbox.outbox import subscriber_names

    registered = subscriber_names()
    limit = EXACT_COUNT + 1
    cursor.execute(
        queries.DELIVERY_GAUGES,
        {
            "subscribers": registered,
            "limit": limit,
            "overdue": get_settings().outbox.overdue_seconds,
            "probes": len(registered) + MAX_UNREGISTERED_SUBSCRIBERS + 1,
            "unregistered": MAX_UNREGISTERED_SUBSCRIBERS,
        },
    )
    every = (*_DELIVERY_COUNTS, *_DELIVERY_AGES)
    by_name: dict[str, SubscriberGauges] = {}
    others: list[SubscriberGauges] = []
    more = 0
    rows = cursor.fetchall()
    for name, is_registered, waiting, failing, dead, lag, abandoned, age, beyond in rows:
        read = SubscriberGauges(
            subscriber=name if is_registered else UNREGISTERED,
            waiting=int(waiting),
            failing=int(failing),
            dead=int(dead),
            lag=float(lag or 0.0),
            abandoned=int(abandoned),
            abandoned_age=float(age or 0.0),
            # A read that reached its limit saw the first ones only.
            estimated=every if waiting + failing + dead >= limit else (),
        )
        more = max(more, int(beyond))
        if is_registered:
            by_name[name] = read
        else:
            others.append(read)
    if others or more > 0:
        if more > 0:  # more such subscribers than read one by one
            others.append(SubscriberGauges(UNREGISTERED, estimated=every))
        if UNREGISTERED in by_name:  # a registered subscriber of that name
            others.append(by_name[UNREGISTERED])
        by_name[UNREGISTERED] = _summed(others)
    return by_name


def _summed(parts: list[SubscriberGauges]) -> SubscriberGauges:
    """Several subscribers' deliveries as one ``unregistered`` row: counts added, the largest
    ages kept."""
    estimated = {name for part in parts for name in part.estimated}
    return SubscriberGauges(
        subscriber=UNREGISTERED,
        **{name: sum(getattr(part, name) for part in parts) for name in _DELIVERY_COUNTS},
        **{name: max(getattr(part, name) for part in parts) for name in _DELIVERY_AGES},
        estimated=tuple(name for name in (*_DELIVERY_COUNTS, *_DELIVERY_AGES) if name in estimated),
    )


def _merged(configured: QueueGauges | None, other: QueueGauges) -> QueueGauges:
    """A configured queue that happens to be named ``unregistered``, with the others added."""
    if configured is None:
        return other
    return QueueGauges(
        queue=UNREGISTERED,
        oldest_pending_age=max(configured.oldest_pending_age, other.oldest_pending_age),
        estimated=tuple(dict.fromkeys((*configured.estimated, *other.estimated))),
        **{s: getattr(configured, s) + getattr(other, s) for s in _STATUSES},
    )


# -- the xmin horizon's holder -------------------------------------------------------------------

#: What each kind of holder is called in a report.
_HOLDER_KINDS = {
    "session": "session",
    "standby": "standby feedback through walsender",
    "prepared": "prepared transaction",
    "slot": "replication slot",
}


@dataclass(frozen=True)
class HorizonHolder:
    """The oldest holder of the jobs database's xmin horizon: while it holds it, vacuum cannot
    remove the dead row versions of the queue's tables, and claims slow down."""

    #: ``session`` (a backend of this database), ``standby`` (a standby's
    #: ``hot_standby_feedback``, through a walsender without a slot), ``prepared`` (a prepared
    #: transaction) or ``slot`` (a replication slot's ``xmin``).
    kind: str
    #: Seconds it has held the horizon; None where PostgreSQL does not say (a standby, a slot
    #: before PostgreSQL 17 or while active).
    age: float | None
    #: Transactions since the horizon it holds: ``age(xmin)``.
    xmin_age: int
    pid: int | None = None
    #: A prepared transaction's gid, a slot's name.
    name: str | None = None
    user: str | None = None
    application_name: str | None = None
    client_addr: str | None = None
    #: A session's state (``idle in transaction``, ``active``), a slot's ``active`` or
    #: ``inactive``.
    state: str | None = None
    #: The first 200 characters of a session's last query (its literal values included).
    query: str | None = None

    @property
    def title(self) -> str:
        """What it is, in a few words: ``session pid 4242``, ``replication slot 'standby1'``."""
        what = _HOLDER_KINDS.get(self.kind, self.kind)
        if self.name is not None:
            what += f" {self.name!r}"
        if self.pid is not None:
            what += f" pid {self.pid}"
        return what

    def describe(self) -> str:
        """One line for a person: what it is, for how long, and (a session) its last query."""
        what = self.title
        details = [
            f"{label} {value}"
            for label, value in (
                ("application", repr(self.application_name) if self.application_name else None),
                ("user", self.user),
                ("from", self.client_addr),
            )
            if value
        ]
        if details:
            what += f" ({', '.join(details)})"
        if self.state:
            what += f", {self.state}"
        held = "for an unknown time" if self.age is None else f"for {self.age:.1f}s"
        behind = "1 transaction" if self.xmin_age == 1 else f"{self.xmin_age:,} transactions"
        text = f"{what}, {held}, {behind} behind"
        if self.query:
            text += f": {' '.join(self.query.split())}"
        return text


def horizon_holder(using: str | None = None) -> HorizonHolder | None:
    """The oldest holder of the jobs database's xmin horizon (``queries.HORIZON_HOLDER``), or
    None when nothing holds it: one statement over the server's views, whatever the tables hold.
    """
    from django_pgoutbox.models import Job

    alias = using or router.db_for_write(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.HORIZON_HOLDER)
        row = cursor.fetchone()
    if row is None:
        return None
    kind, age, xmin_age, pid, name, user, application, client, state, query = row
    return HorizonHolder(
        kind=kind,
        age=None if age is None else float(age),
        xmin_age=int(xmin_age),
        pid=pid,
        name=name,
        user=user,
        application_name=application or None,
        client_addr=client,
        state=state,
        query=query or None,
    )


@dataclass(frozen=True)
class AbandonedEvents:
    """Events that no relay has touched for ``OUTBOX["OVERDUE_SECONDS"]`` though they are due
    and head their aggregate (``queries.ABANDONED_EVENTS``)."""

    count: int
    #: Seconds the longest of them has waited untouched (0 when none).
    oldest_seconds: float
    #: The first ``EXACT_COUNT`` waiting events were looked at, and more wait: there may be
    #: more abandoned ones (``count`` is a lower bound).
    at_least: bool
    overdue_seconds: float


def abandoned_events(using: str | None = None) -> AbandonedEvents:
    """The abandoned events among the first ``EXACT_COUNT`` waiting ones: a read of that many
    rows of the outbox's claim index (and of the dead ones ahead of them), whatever else the
    table holds."""
    from django_pgoutbox.models import Job

    alias = using or router.db_for_write(Job)
    overdue = get_settings().outbox.overdue_seconds
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT a.n, a.age, (SELECT count(*) FROM (SELECT 1 FROM outbox_events "
            f"WHERE processed_at IS NULL AND dead_at IS NULL LIMIT %(limit)s + 1) c) > %(limit)s "
            f"FROM ({queries.ABANDONED_EVENTS}) a",
            {"limit": EXACT_COUNT, "overdue": overdue},
        )
        count, age, more = cursor.fetchone()
    return AbandonedEvents(int(count), float(age or 0.0), bool(more), overdue)


def abandoned_warnings(abandoned: AbandonedEvents) -> list[str]:
    """The warning about abandoned events, if any."""
    if not abandoned.count:
        return []
    many = "at least " if abandoned.at_least else ""
    return [
        f"{many}{abandoned.count} outbox event(s) due for over PGOUTBOX['OUTBOX']"
        f"['OVERDUE_SECONDS'] ({abandoned.overdue_seconds:g}s) that no relay has claimed (the "
        f"oldest untouched for {abandoned.oldest_seconds:.0f}s): is a relay running "
        "(runworkers' role relay), and keeping up? (docs/outbox.md, 'Failing, dead, held back, "
        "abandoned')"
    ]


def delivery_warnings(deliveries: dict[str, SubscriberGauges]) -> list[str]:
    """The warnings about the subscribers' deliveries: one per subscriber with dead deliveries,
    one per subscriber with abandoned ones."""
    overdue = get_settings().outbox.overdue_seconds
    warnings = []
    for name, gauges in deliveries.items():
        who = (
            "subscribers that no process here registers"
            if name == UNREGISTERED
            else f"subscriber {name!r}"
        )
        if gauges.dead:
            many = "at least " if "dead" in gauges.estimated else ""
            warnings.append(
                f"{who}: {many}{gauges.dead} dead outbox delivery(ies): each holds back this "
                "subscriber's later deliveries of its aggregate until an operator re-drives or "
                "discards it (docs/outbox.md)"
            )
        if gauges.abandoned:
            many = "at least " if "abandoned" in gauges.estimated else ""
            warnings.append(
                f"{who}: {many}{gauges.abandoned} outbox delivery(ies) due for over "
                f"PGOUTBOX['OUTBOX']['OVERDUE_SECONDS'] ({overdue:g}s) that no relay has claimed "
                f"(the oldest untouched for {gauges.abandoned_age:.0f}s): is a relay running "
                "(runworkers' role relay), and keeping up? (docs/outbox.md)"
            )
    return warnings


def horizon_warnings(holder: HorizonHolder | None) -> list[str]:
    """The warnings about ``holder``: one, when it has held the horizon longer than
    ``PGOUTBOX["HORIZON_WARNING_SECONDS"]``; none otherwise."""
    threshold = get_settings().horizon_warning_seconds
    if holder is None or holder.age is None or threshold is None or holder.age <= threshold:
        return []
    return [
        f"{holder.title} has held the xmin horizon for {holder.age:.0f}s, over "
        f"PGOUTBOX['HORIZON_WARNING_SECONDS'] ({threshold:g}s): vacuum cannot remove the queue's "
        "dead rows meanwhile, and claims slow down (docs/operations.md, 'When the queue slows')"
    ]
