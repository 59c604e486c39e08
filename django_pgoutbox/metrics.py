"""In-process measures recorded by the workers.

Counters are cumulative per process, labelled only by queue, job type, outcome or status: never
by organization or payload values. ``snapshot()`` reads them all (tests and ``pgoutbox stats``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence


class Counter:
    """A monotonically increasing count per combination of label values."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        """The count for these label values; with no labels given, the sum over all."""
        with self._lock:
            if not labels:
                return sum(self._values.values())
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> dict[tuple[str, ...], float]:
        with self._lock:
            return dict(self._values)

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, not {tuple(labels)}")
        return tuple(str(labels[name]) for name in self.labelnames)


REGISTRY: dict[str, Counter] = {}


def counter(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
    metric = Counter(name, documentation, labelnames)
    REGISTRY[name] = metric
    return metric


def snapshot() -> dict[str, dict[tuple[str, ...], float]]:
    return {name: metric.samples() for name, metric in REGISTRY.items()}


JOBS_CLAIMED = counter("pgoutbox_jobs_claimed_total", "Attempts leased by this process.", ["queue"])
JOB_OUTCOMES = counter(
    "pgoutbox_job_outcomes_total",
    "Outcomes recorded, by job type and outcome (completed, retrying, dead, cancelled).",
    ["queue", "job_type", "outcome"],
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
NOTIFICATION_FAILURES = counter(
    "pgoutbox_notification_failures_total",
    "Failures of the LISTEN connection (each one is followed by a reconnect and a full poll).",
)
