"""One scrape of ``/pgoutbox/metrics`` on a million jobs and a million outbox events.

    python benchmarks/metrics_scrape.py [--jobs 1000000] [--events 1000000] [--scrapes 30]
                                        [--database pgoutbox_bench]

Fills a fresh database (``--database``, dropped and created again) with jobs in every state and
outbox events waiting, processed and dead, then times the database gauges alone
(``gauges.database_gauges()``) and the whole view through Django's test client, as a staff
user, twice: after ``ANALYZE`` only (the visibility map is empty, so every index-only scan still
reads the heap) and after ``VACUUM ANALYZE``. Prints the fastest, the median and the 95th
percentile of each, and the machine's load average (other work on it slows every figure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import BENCH_DB, ROOT, percentile, setup_django, write_results

#: Shares of the jobs table, by (queue, status, run_at offset). Four queues; most rows finished.
JOB_MIX = [
    ("default", "pending", "-1 minute", 0.20),
    ("webhooks", "pending", "-5 minutes", 0.08),
    ("reports", "pending", "-1 hour", 0.02),
    ("default", "pending", "1 hour", 0.04),  # scheduled
    ("webhooks", "retrying", "10 minutes", 0.015),
    ("default", "retrying", "-1 second", 0.005),
    ("default", "leased", "-1 minute", 0.001),
    ("default", "dead", "-1 day", 0.20),
    ("webhooks", "dead", "-1 day", 0.10),
    ("default", "completed", "-1 day", 0.20),
    ("notifications", "completed", "-1 day", 0.119),
    ("notifications", "cancelled", "-1 day", 0.02),
]
assert round(sum(share for *_, share in JOB_MIX), 9) == 1.0
#: Shares of the outbox: processed, waiting, waiting in back-off, dead.
EVENT_MIX = [("processed", 0.55), ("waiting", 0.40), ("backoff", 0.04), ("dead", 0.01)]


def fill(jobs: int, events: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for queue, status, offset, share in JOB_MIX:
            finished = status in ("completed", "dead", "cancelled")
            cursor.execute(
                "INSERT INTO jobs (queue, job_type, payload, status, priority, run_at, attempts, "
                "locked_at, locked_by, lease_expires_at, finished_at, completed_at) "
                "SELECT %(queue)s, 'bench.job', jsonb_build_object('n', n), %(status)s, "
                "n %% 3, now() + %(offset)s::interval, 1, "
                "CASE WHEN %(status)s = 'leased' THEN now() END, "
                "CASE WHEN %(status)s = 'leased' THEN 'bench-worker' END, "
                "CASE WHEN %(status)s = 'leased' THEN now() + interval '1 minute' END, "
                "CASE WHEN %(finished)s THEN now() - interval '1 hour' END, "
                "CASE WHEN %(status)s = 'completed' THEN now() - interval '1 hour' END "
                "FROM generate_series(1, %(rows)s) AS n",
                {
                    "queue": queue,
                    "status": status,
                    "offset": offset,
                    "finished": finished,
                    "rows": round(jobs * share),
                },
            )
        for state, share in EVENT_MIX:
            cursor.execute(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, "
                "schema_version, payload, occurred_at, available_at, processed_at, dead_at, "
                "attempts) SELECT 'order', gen_random_uuid(), 'order.placed', 1, "
                "jsonb_build_object('n', n), now() - interval '1 hour', "
                "now() + CASE WHEN %(state)s = 'backoff' THEN interval '5 minutes' "
                "ELSE interval '-1 hour' END, "
                "CASE WHEN %(state)s = 'processed' THEN now() END, "
                "CASE WHEN %(state)s = 'dead' THEN now() END, "
                "CASE WHEN %(state)s IN ('backoff', 'dead') THEN 3 ELSE 0 END "
                "FROM generate_series(1, %(rows)s) AS n",
                {"state": state, "rows": round(events * share)},
            )


def timed(run: Callable[[], object], times: int) -> tuple[float, float, float]:
    """The fastest, the median and the 95th percentile of ``times`` runs, in milliseconds (after
    one warm-up run)."""
    run()
    timings = []
    for _ in range(times):
        begin = time.perf_counter()
        run()
        timings.append((time.perf_counter() - begin) * 1000)
    return min(timings), statistics.median(timings), percentile(timings, 0.95)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--database", default=BENCH_DB, help=f"default {BENCH_DB}")
    args = parser.parse_args()
    setup_django(args.database)
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    from django_pgoutbox import gauges as db_gauges

    started = time.perf_counter()
    fill(args.jobs, args.events)
    print(
        f"filled {args.jobs:,} jobs and {args.events:,} outbox events "
        f"in {time.perf_counter() - started:.0f}s"
    )
    client = Client()
    client.force_login(User.objects.create_user("bench", is_staff=True))

    def scrape() -> None:
        response = client.get("/pgoutbox/metrics")
        assert response.status_code == 200, response.status_code

    results: dict[str, dict[str, float]] = {}
    print(f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    print(
        f"{'':<24}{'gauges min':>11}{'median':>8}{'p95':>8}{'view min':>10}{'median':>8}{'p95':>8}"
    )
    for state, statement in (("analyzed", "ANALYZE"), ("vacuumed", "VACUUM ANALYZE")):
        with connection.cursor() as cursor:
            cursor.execute(f"{statement} jobs")
            cursor.execute(f"{statement} outbox_events")
        gauges = timed(db_gauges.database_gauges, args.scrapes)
        view = timed(scrape, args.scrapes)
        results[state] = {
            "gauges_min_ms": gauges[0],
            "gauges_median_ms": gauges[1],
            "gauges_p95_ms": gauges[2],
            "view_min_ms": view[0],
            "view_median_ms": view[1],
            "view_p95_ms": view[2],
        }
        print(
            f"{'after ' + statement:<24}{gauges[0]:>11.1f}{gauges[1]:>8.1f}{gauges[2]:>8.1f}"
            f"{view[0]:>10.1f}{view[1]:>8.1f}{view[2]:>8.1f}"
        )
    print(f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    snapshot = db_gauges.database_gauges()
    for queue in snapshot.queues.values():
        print(
            f"  {queue.queue:<20} pending {queue.pending:>8} scheduled {queue.scheduled:>7} "
            f"leased {queue.leased:>5} retrying {queue.retrying:>6} dead {queue.dead:>7} "
            f"oldest due {queue.oldest_pending_age:>6.0f}s"
        )
    print(
        f"  outbox: pending {snapshot.outbox_pending}, dead {snapshot.outbox_dead}, "
        f"lag {snapshot.outbox_lag:.0f}s"
    )
    path = write_results(
        "metrics_scrape", {"jobs": args.jobs, "events": args.events, "results": results}
    )
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
