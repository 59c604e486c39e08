"""Prometheus exposition (``pip install 'django-pgoutbox[prometheus]'``).

- ``runworkers --metrics-port 9400`` serves this process's counters and histograms at
  ``http://127.0.0.1:9400/metrics`` (``--metrics-host`` for another address);
- the view ``django_pgoutbox.views.metrics`` (included with
  ``path("pgoutbox/", include("django_pgoutbox.urls"))``) serves the database gauges, read when
  scraped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django_pgoutbox import gauges as db_gauges
from django_pgoutbox import metrics, queue_controls

try:
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector
except ImportError as error:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "Prometheus exposition needs prometheus-client: pip install 'django-pgoutbox[prometheus]'"
    ) from error

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ProcessCollector(Collector):
    """This process's counters and histograms (the workers', relay's and scheduler's)."""

    def collect(self) -> Iterator[Any]:
        for metric in metrics.REGISTRY.values():
            if isinstance(metric, metrics.Counter):
                counter = CounterMetricFamily(
                    metric.name.removesuffix("_total"),
                    metric.documentation,
                    labels=metric.labelnames,
                )
                for key, value in metric.samples().items():
                    counter.add_metric(list(key), value)
                yield counter
            else:
                histogram = HistogramMetricFamily(
                    metric.name, metric.documentation, labels=metric.labelnames
                )
                for key, state in metric.samples().items():
                    cumulative, buckets = 0, []
                    for bound, count in zip(metric.buckets, state.bucket_counts, strict=True):
                        cumulative += count
                        buckets.append((repr(float(bound)), float(cumulative)))
                    buckets.append(("+Inf", float(state.count)))
                    histogram.add_metric(list(key), buckets, state.total)
                yield histogram


class DatabaseCollector(Collector):
    """The database gauges, read from the database at each scrape."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def collect(self) -> Iterator[Any]:
        gauges = db_gauges.database_gauges(self.using)
        jobs = GaugeMetricFamily(
            "pgoutbox_jobs",
            "Jobs by queue and status (pending = due now; scheduled = pending, due later). "
            f"Exact up to {db_gauges.EXACT_COUNT}; above, the planner's estimate.",
            labels=["queue", "status"],
        )
        oldest = GaugeMetricFamily(
            "pgoutbox_oldest_pending_age_seconds",
            "Seconds since the oldest job of the queue waiting to be claimed (pending, or "
            "retrying after its back-off) became due.",
            labels=["queue"],
        )
        for queue in gauges.queues.values():
            name = metrics.label_value("queue", queue.queue)
            for status in ("pending", "scheduled", "leased", "retrying", "dead"):
                jobs.add_metric([name, status], getattr(queue, status))
            oldest.add_metric([name], queue.oldest_pending_age)
        yield jobs
        yield oldest
        yield from queue_control_gauges(self.using)
        yield GaugeMetricFamily(
            "pgoutbox_outbox_events_pending",
            "Outbox events not yet projected (not dead).",
            value=gauges.outbox_pending,
        )
        yield GaugeMetricFamily(
            "pgoutbox_outbox_events_dead",
            "Outbox events whose projection gave up.",
            value=gauges.outbox_dead,
        )
        yield GaugeMetricFamily(
            "pgoutbox_outbox_events_abandoned",
            "Outbox events due for over OUTBOX['OVERDUE_SECONDS'] that no relay has claimed "
            "(heading their aggregate: neither failing nor held back).",
            value=gauges.outbox_abandoned,
        )
        yield GaugeMetricFamily(
            "pgoutbox_outbox_lag_seconds",
            "High-watermark lag: age of the oldest available, unprojected event.",
            value=gauges.outbox_lag,
        )
        yield from _delivery_families(gauges.deliveries)
        yield GaugeMetricFamily(
            "pgoutbox_oldest_transaction_age_seconds",
            "Age of the oldest open transaction of this database: the xmin horizon that "
            "stalls vacuum.",
            value=gauges.oldest_transaction_age,
        )
        yield GaugeMetricFamily(
            "pgoutbox_notification_queue_usage_ratio",
            "pg_notification_queue_usage(): the fraction of the NOTIFY queue in use.",
            value=gauges.notification_queue_usage,
        )


#: The states of an undelivered delivery, as ``pgoutbox_outbox_deliveries`` labels them: each
#: delivery is in one of them.
DELIVERY_STATES = ("waiting", "failing", "dead")


def _delivery_families(
    deliveries: dict[str, db_gauges.SubscriberGauges],
) -> Iterator[GaugeMetricFamily]:
    """The subscribers' undelivered deliveries: registered subscribers by name (zeros when they
    have none, so that their series go on), every other name as ``unregistered``."""
    counts = GaugeMetricFamily(
        "pgoutbox_outbox_deliveries_undelivered",
        "Undelivered deliveries of outbox events, by subscriber and state: waiting (behind an "
        "earlier delivery of the aggregate, or due), failing (retried with back-off), dead "
        "(holds back the subscriber's later deliveries of its aggregate). Read up to "
        f"{db_gauges.EXACT_COUNT} per subscriber: above, at least.",
        labels=["subscriber", "state"],
    )
    abandoned = GaugeMetricFamily(
        "pgoutbox_outbox_deliveries_abandoned",
        "Deliveries due for over OUTBOX['OVERDUE_SECONDS'] that no relay has claimed, first "
        "undelivered one of their aggregate for their subscriber (not dead, not held back).",
        labels=["subscriber"],
    )
    lag = GaugeMetricFamily(
        "pgoutbox_outbox_delivery_lag_seconds",
        "Seconds since the event of the subscriber's oldest undelivered, not dead delivery "
        "occurred (0 when none).",
        labels=["subscriber"],
    )
    # Two registered names cut to the same label value would be one series, added up (never in
    # practice: the cut keeps a digest of the whole).
    by_label: dict[str, list[db_gauges.SubscriberGauges]] = {}
    for name, each in deliveries.items():
        by_label.setdefault(metrics.label_value("subscriber", name), []).append(each)
    for label, parts in by_label.items():
        for state in DELIVERY_STATES:
            counts.add_metric([label, state], sum(getattr(part, state) for part in parts))
        abandoned.add_metric([label], sum(part.abandoned for part in parts))
        lag.add_metric([label], max(part.lag for part in parts))
    yield counts
    yield abandoned
    yield lag


def process_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessCollector())
    return registry


def database_exposition(using: str | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(using))
    registry.register(ProcessCollector())
    return generate_latest(registry)


def serve_process_metrics(port: int, address: str = "127.0.0.1") -> None:
    """Serve this process's metrics at ``http://address:port/metrics`` from a daemon thread."""
    start_http_server(port, addr=address, registry=process_registry())


def queue_control_gauges(using: str | None) -> Iterator[Any]:
    """Each queue paused or not, and the values in effect (``queue_controls``)."""
    paused = GaugeMetricFamily(
        "pgoutbox_queue_paused",
        "1 while the queue is paused (pause_queue(), pgoutbox queues pause): no worker claims "
        "its jobs.",
        labels=["queue"],
    )
    limits = GaugeMetricFamily(
        "pgoutbox_queue_limit",
        "The values in effect, set at run time or by the settings: concurrency (handler "
        "threads per worker process), max_running and rate_limit (jobs per second, across "
        "every worker); a limit that is not set has no sample.",
        labels=["queue", "limit"],
    )
    statuses, _ = queue_controls.statuses_for_monitoring(using)  # unknown: no samples
    for status in statuses.values():
        name = metrics.label_value("queue", status.queue)
        paused.add_metric([name], 1.0 if status.paused else 0.0)
        for limit in ("concurrency", "max_running", "rate_limit"):
            value = getattr(status, limit)
            if value is not None:
                limits.add_metric([name, limit], float(value))
    yield paused
    yield limits
