"""The source text's measures: in-process counters and histograms, and database gauges.

In-process metrics are recorded by the workers, the relay and the scheduler of this process and
are cumulative for its life. Database gauges (counts by state, oldest pending age, outbox lag,
the xmin horizon, the notification queue) are read from the database when asked, by queries that
only touch partial indexes of live rows, never a ``COUNT(*)`` of the finished ones.

Labels are only ever queue, job type, event type, schedule, outcome, status or role: never an
organization id or a payload value. And a label's value is only ever a name the code or the
settings declare (``label_value``): a configured queue, a registered job type, an event type with
a subscriber; any other value that a row carries is ``unregistered``, and every value is cut to
``MAX_LABEL_LENGTH`` characters, so that the number of series and the size of each stay bounded
by the code, whatever the tables hold. ``django_pgoutbox.prometheus`` exposes all of it to
Prometheus.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, router, transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.registry import get_job

#: Bucket upper bounds (seconds) of the duration histograms: 1 ms to 5 min.
DEFAULT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


#: The label value of a job type, event type or queue that is not declared: a row's value, which
#: may be anything, never becomes a series of its own.
UNREGISTERED = "unregistered"
#: The longest label value: a longer one is cut, ending with a digest of the whole, so that two
#: long names that begin alike stay two series, and no line of the exposition grows with a name.
MAX_LABEL_LENGTH = 100

#: Job types that run though no ``@job`` declares them: the django.tasks tasks a worker found
#: (``register_label_value``). Only importable ``Task`` objects get here: bounded by the code.
_declared: dict[str, set[str]] = {"job_type": set()}


def _configured_queue(value: str) -> bool:
    return value in get_settings().queues


def _registered_job_type(value: str) -> bool:
    return get_job(value) is not None or value in _declared["job_type"]


def _subscribed_event_type(value: str) -> bool:
    from django_pgoutbox.outbox import has_subscribers  # models: imported once apps are ready

    return has_subscribers(value)


#: The labels whose values come from rows, and what makes a value declared.
_DECLARED: dict[str, Callable[[str], bool]] = {
    "queue": _configured_queue,
    "job_type": _registered_job_type,
    "event_type": _subscribed_event_type,
}


def register_label_value(label: str, value: str) -> None:
    """Declare ``value`` for ``label`` beside what the registries and settings declare: the
    django.tasks backend does for each task a worker resolved."""
    _declared.setdefault(label, set()).add(value)


def label_value(label: str, value: object) -> str:
    """What a metric shows for ``value`` of its label ``label``: the value itself if the code
    or the settings declare it (for ``queue``, ``job_type`` and ``event_type``, which rows
    carry), else ``unregistered``; cut to ``MAX_LABEL_LENGTH`` characters.

    Every metric of this module passes its label values through here.
    """
    text = value if type(value) is str else str(value)
    declared = _DECLARED.get(label)
    if declared is not None and not declared(text):
        return UNREGISTERED
    if len(text) > MAX_LABEL_LENGTH:
        whole = text.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(whole, digest_size=4).hexdigest()
        return f"{text[: MAX_LABEL_LENGTH - len(digest) - 1]}~{digest}"
    return text


class _Metric:
    """A metric whose values live in one shard per thread that updates it.

    Four handler threads update the same histograms at every attempt; with one lock per metric they
    queue behind whichever holds it when the interpreter switches threads (docs/benchmarks.md, "What
    profiling found", item 4). A shard is written only by its own thread, and a single dict
    operation is atomic under the interpreter lock, so writing takes no lock; reading sums the
    shards (taking the lock only to list them).
    """

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        #: Keys whose values ``label_value`` left as they were: bounded by what is declared.
        self._clean: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._shards: list[dict[tuple[str, ...], Any]] = []

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        # On every job's path: a list comprehension, no sets built.
        try:
            key = tuple([str(labels[name]) for name in self.labelnames])
        except KeyError:
            key = ()
        if len(key) != len(self.labelnames) or len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, not {tuple(labels)}")
        return self._sanitized(key)

    def _checked(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """Label values given by position: as many as there are label names."""
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, not {key!r:.200}")
        return self._sanitized(key)

    def _sanitized(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """``key`` with each value as ``label_value`` shows it.

        A key seen before is looked up once (on every job's path). Only keys of declared values
        are remembered (none made ``unregistered``), so that what is remembered is bounded by
        the code and the settings, not by the rows.
        """
        clean = self._clean.get(key)
        if clean is not None:
            return clean
        sanitized = tuple(
            [label_value(name, value) for name, value in zip(self.labelnames, key, strict=True)]
        )
        if UNREGISTERED not in sanitized:
            self._clean[key] = sanitized
        return sanitized

    def _shard(self) -> dict[tuple[str, ...], Any]:
        """This thread's values."""
        try:
            shard: dict[tuple[str, ...], Any] = self._local.shard
        except AttributeError:
            shard = self._local.shard = {}
            with self._lock:
                self._shards.append(shard)
        return shard

    def _all_shards(self) -> list[list[tuple[tuple[str, ...], Any]]]:
        """A copy of every shard's items (``list(dict.items())`` runs without a thread switch)."""
        with self._lock:
            shards = list(self._shards)
        return [list(shard.items()) for shard in shards]


class Counter(_Metric):
    """A monotonically increasing count per combination of label values."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._inc(self._key(labels), amount)

    def inc_key(self, key: tuple[str, ...], amount: float = 1.0) -> None:
        """``inc()`` with the label values given in ``labelnames`` order (the workers' path)."""
        self._inc(self._checked(key), amount)

    def _inc(self, key: tuple[str, ...], amount: float) -> None:
        shard = self._shard()
        shard[key] = shard.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        """The count for these label values; with no labels given, the sum over all."""
        samples = self.samples()
        if not labels:
            return sum(samples.values())
        return samples.get(self._key(labels), 0.0)

    def samples(self) -> dict[tuple[str, ...], float]:
        totals: dict[tuple[str, ...], float] = {}
        for items in self._all_shards():
            for key, value in items:
                totals[key] = totals.get(key, 0.0) + value
        return totals


@dataclass
class HistogramState:
    bucket_counts: list[int]
    count: int = 0
    total: float = 0.0


class Histogram(_Metric):
    """Observations counted into cumulative buckets, per combination of label values."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self.buckets = tuple(buckets)

    def observe(self, value: float, **labels: str) -> None:
        self._observe(self._key(labels), value)

    def observe_key(self, key: tuple[str, ...], value: float) -> None:
        """``observe()`` with the label values given in ``labelnames`` order (the workers' path)."""
        self._observe(self._checked(key), value)

    def _observe(self, key: tuple[str, ...], value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        shard = self._shard()
        state = shard.get(key)
        if state is None:
            state = shard[key] = HistogramState([0] * len(self.buckets))
        if index < len(self.buckets):
            state.bucket_counts[index] += 1
        state.count += 1
        state.total += value

    def count(self, **labels: str) -> int:
        samples = self.samples()
        if not labels:
            return sum(state.count for state in samples.values())
        state = samples.get(self._key(labels))
        return state.count if state else 0

    def samples(self) -> dict[tuple[str, ...], HistogramState]:
        merged: dict[tuple[str, ...], HistogramState] = {}
        for items in self._all_shards():
            for key, state in items:
                total = merged.get(key)
                if total is None:
                    total = merged[key] = HistogramState([0] * len(self.buckets))
                for index, n in enumerate(list(state.bucket_counts)):
                    total.bucket_counts[index] += n
                total.count += state.count
                total.total += state.total
        return merged


REGISTRY: dict[str, Counter | Histogram] = {}


def counter(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
    metric = Counter(name, documentation, labelnames)
    REGISTRY[name] = metric
    return metric


def histogram(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Histogram:
    metric = Histogram(name, documentation, labelnames)
    REGISTRY[name] = metric
    return metric


JOBS_CLAIMED = counter("pgoutbox_jobs_claimed_total", "Attempts leased by this process.", ["queue"])
JOB_OUTCOMES = counter(
    "pgoutbox_job_outcomes_total",
    "Outcomes recorded, by job type and outcome (completed, retrying, dead, cancelled).",
    ["queue", "job_type", "outcome"],
)
JOB_DURATION = histogram(
    "pgoutbox_job_duration_seconds",
    "Handler run time of an attempt (execution latency), by job type and outcome.",
    ["queue", "job_type", "outcome"],
)
JOB_START_DELAY = histogram(
    "pgoutbox_job_start_delay_seconds",
    "From the time a job was due (run_at) to its handler's start, by queue.",
    ["queue"],
)
STALE_OUTCOMES = counter(
    "pgoutbox_stale_outcomes_total",
    "Outcomes discarded because the attempt's lease had been taken over (fencing).",
    ["queue"],
)
LEASE_EXPIRATIONS = counter(
    "pgoutbox_lease_expirations_total",
    "Leases that expired and were recovered (the job became claimable again, or dead).",
    ["queue"],
)
CLAIM_DURATION = histogram(
    "pgoutbox_claim_duration_seconds",
    "Database time of one claim statement (with the outcomes it also writes), by queue.",
    ["queue"],
)
BATCH_DB_DURATION = histogram(
    "pgoutbox_batch_db_seconds",
    "Database time per batch: claims and outcomes of a dispatcher turn, a relay's batch "
    "transaction, a scheduler's pass; by role.",
    ["role"],
)
NOTIFICATION_FAILURES = counter(
    "pgoutbox_notification_failures_total",
    "Failures of the LISTEN connection (each one is followed by a reconnect and a full poll).",
)
EVENTS_PROJECTED = counter(
    "pgoutbox_events_projected_total",
    "Outbox events handled by the relay, by event type and outcome (processed, retrying, dead).",
    ["event_type", "outcome"],
)
SCHEDULE_SLOTS = counter(
    "pgoutbox_schedule_slots_total",
    "Slots this process's scheduler enqueued, by schedule.",
    ["schedule"],
)
SCHEDULE_FAILURES = counter(
    "pgoutbox_schedule_failures_total",
    "Turns in which enqueuing a schedule's due slot failed (logged and skipped), by schedule.",
    ["schedule"],
)


# -- database gauges -----------------------------------------------------------------------------

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
class DatabaseGauges:
    queues: dict[str, QueueGauges]
    outbox_pending: int
    outbox_dead: int
    outbox_lag: float  # seconds since the oldest unprocessed, available event occurred
    oldest_transaction_age: float  # the xmin horizon that holds back vacuum
    notification_queue_usage: float  # fraction of the NOTIFY queue in use
    #: The outbox fields above that are estimates (``outbox_pending``, ``outbox_dead``) or an
    #: upper bound (``outbox_lag``, when more than ``EXACT_COUNT`` dead or backing-off events
    #: come before the first available one).
    estimated: tuple[str, ...] = ()


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
        cursor.execute(queries.OUTBOX_AND_SERVER_GAUGES, {"limit": limit})
        dead, unprocessed, lag, lag_bound, dead_estimate, xmin_age, notify_usage = cursor.fetchone()
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
        estimated=tuple(outbox_estimated),
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
