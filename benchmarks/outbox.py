"""Outbox throughput and lag: published facts projected into jobs by one relay process.

    python benchmarks/outbox.py [--events 10000] [--aggregates 1000] [--lag-events 500] [--three]

- throughput: N events over A aggregates, published beforehand; one ``runworkers --roles relay``
  projects each into a job (the test subscriber ``tests.to_job``). The rate is N over the time
  from the first claim to the last processed_at (database clock).
- with ``--three``: three subscribers per event (``tests.to_three``), each enqueuing a job; the
  third fails 1% of the events the first time it sees them (its delivery is retried after 50 ms
  and succeeds). The window ends at the last processed_at or delivered_at.
- lag: an idle relay (5 s poll); events published 10 ms apart, each in its own transaction;
  lag is from the publish's commit to the subscriber's run (it stamps the job it enqueues).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, percentile, runworkers, setup_django, truncate, write_results


def throughput(
    events: int, aggregates: int, *, three: bool = False, failing: float = 1.0
) -> dict[str, float]:
    from django.db import connection, transaction

    from django_pgoutbox import publish
    from django_pgoutbox.models import Job, OutboxDelivery

    truncate("outbox_events", "jobs")
    ids = [uuid.uuid4() for _ in range(aggregates)]
    with transaction.atomic():
        for n in range(events):
            publish(
                "tests.to_three" if three else "tests.to_job",
                aggregate_type="bench",
                aggregate_id=ids[n % aggregates],
                payload={
                    "sequence": n // aggregates,
                    "fail": three and (n * failing) % 100 < failing,
                },
            )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE outbox_events")
    settings = {"RETRY": {"BASE_DELAY": 0.05, "JITTER": 0}} if three else None
    process = runworkers("--roles", "relay", settings=settings)
    try:
        deadline = time.monotonic() + 600
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    "SELECT (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL)"
                    " + (SELECT count(*) FROM outbox_deliveries WHERE delivered_at IS NULL)"
                )
                if cursor.fetchone()[0] == 0:
                    break
                assert time.monotonic() < deadline, "projection did not finish"
                time.sleep(0.2)
            # Processed rows have claimed_at cleared: the window starts at the first job the
            # first batch enqueued (its transaction's start).
            cursor.execute(
                "SELECT extract(epoch FROM greatest((SELECT max(processed_at) FROM outbox_events),"
                " (SELECT max(delivered_at) FROM outbox_deliveries))"
                " - (SELECT min(created_at) FROM jobs))"
            )
            window = float(cursor.fetchone()[0])
    finally:
        process.terminate()
        process.wait()
    assert Job.objects.count() == events * (3 if three else 1)
    if three:
        assert OutboxDelivery.objects.count() == sum(
            (n * failing) % 100 < failing for n in range(events)
        )
    return {
        "events": events,
        "aggregates": aggregates,
        "seconds": window,
        "events_per_second": events / window,
    }


def lag(count: int, gap: float) -> dict[str, float]:
    from django_pgoutbox import publish
    from django_pgoutbox.models import Job

    truncate("outbox_events", "jobs")
    process = runworkers("--roles", "relay", settings={"POLL_INTERVAL": 5})
    try:
        time.sleep(3)
        committed: dict[str, float] = {}
        for _ in range(count):
            event = publish(
                "tests.stamped", aggregate_type="bench", aggregate_id=uuid.uuid4(), payload={}
            )
            committed[str(event.id)] = time.time()
            time.sleep(gap)
        deadline = time.monotonic() + 60
        while Job.objects.count() < count:
            assert time.monotonic() < deadline, "lag events were not projected"
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait()
    lags = [
        (payload["projected"] - committed[payload["event"]]) * 1000
        for payload in Job.objects.values_list("payload", flat=True)
    ]
    return {
        "events": count,
        "p50_ms": percentile(lags, 0.5),
        "p95_ms": percentile(lags, 0.95),
        "p99_ms": percentile(lags, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--aggregates", type=int, default=1_000)
    parser.add_argument("--lag-events", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument(
        "--three",
        action="store_true",
        help="three subscribers per event, one failing 1%% of the events once (throughput only)",
    )
    parser.add_argument(
        "--failing",
        type=float,
        default=1.0,
        help="with --three: the percentage of events the third subscriber fails once (1)",
    )
    args = parser.parse_args()
    setup_django()
    rate = throughput(args.events, args.aggregates, three=args.three, failing=args.failing)
    subscribers = f", 3 subscribers, one failing {args.failing:g}% once" if args.three else ""
    print(
        f"{f'project {args.events} events ({args.aggregates} aggregates{subscribers})':<44}"
        f"{rate['events_per_second']:>10,.0f} events/s"
    )
    if args.three:
        return
    delay = lag(args.lag_events, args.gap_ms / 1000)
    print(
        f"{'commit -> projection lag p50 / p95 / p99':<44}{delay['p50_ms']:>8.1f} / "
        f"{delay['p95_ms']:.1f} / {delay['p99_ms']:.1f} ms"
    )
    path = write_results("outbox", {"throughput": rate, "lag": delay})
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
