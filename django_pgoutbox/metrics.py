"""The source text's measures: in-process counters and histograms, and database gauges.

In-process metrics are recorded by the workers, the relay and the scheduler of this process and
are cumulative for its life. Database gauges (counts by state, oldest pending age, outbox lag,
the subscribers' undelivered deliveries, the xmin horizon, the notification queue) are read from
the database when asked (``django_pgoutbox.gauges``), by queries that only touch partial indexes
of live rows, never a ``COUNT(*)`` of the finished ones.

Labels are only ever queue, job type, event type, subscriber, schedule, outcome, status, state or
role: never an organization id or a payload value. And a label's value is only ever a name the
code or the settings declare (``label_value``): a configured queue, a registered job type, an
event type with a subscriber, a registered subscriber; any other value that a row carries is
``unregistered``, and every value is cut to ``MAX_LABEL_LENGTH`` characters, so that the number of
series and the size of each stay bounded by the code, whatever the tables hold.
``django_pgoutbox.prometheus`` exposes all of it to Prometheus.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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


def _registered_subscriber(value: str) -> bool:
    from django_pgoutbox.outbox import subscriber_names

    return value in subscriber_names()


#: The labels whose values come from rows, and what makes a value declared.
_DECLARED: dict[str, Callable[[str], bool]] = {
    "queue": _configured_queue,
    "job_type": _registered_job_type,
    "event_type": _subscribed_event_type,
    "subscriber": _registered_subscriber,
}


def register_label_value(label: str, value: str) -> None:
    """Declare ``value`` for ``label`` beside what the registries and settings declare: the
    django.tasks backend does for each task a worker resolved."""
    _declared.setdefault(label, set()).add(value)


def label_value(label: str, value: object) -> str:
    """What a metric shows for ``value`` of its label ``label``: the value itself if the code
    or the settings declare it (for ``queue``, ``job_type``, ``event_type`` and ``subscriber``,
    which rows carry), else ``unregistered``; cut to ``MAX_LABEL_LENGTH`` characters.

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
    "Outbox events handled by the relay, by event type and outcome (processed; dead: its relays "
    "kept dying under it).",
    ["event_type", "outcome"],
)
DELIVERIES = counter(
    "pgoutbox_outbox_deliveries_total",
    "Subscribers' deliveries of outbox events that did not run with the event's batch, by "
    "subscriber (registered names; 'unregistered' for the rest) and outcome: waiting (behind "
    "an earlier delivery of the aggregate), retrying, dead, delivered.",
    ["subscriber", "outcome"],
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
