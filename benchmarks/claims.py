"""What a claim costs: the plain claim, the fair claim, and the limited claim, by backlog shape.

    python benchmarks/claims.py [--repeat 50]

On a fresh ``pgoutbox_bench`` database, for each backlog shape (pending jobs spread over a
number of organizations), times each claim taking 4 jobs (with the statements that precede it in
its transaction: the advisory lock and allowance of a capped queue, the planner settings of the
fair claim), in a transaction that is rolled back so that every run sees the same backlog, and
prints the median in milliseconds.
The table is vacuumed and analyzed first, as autovacuum would have it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, setup_django, write_results

SHAPES = [(10_000, 1), (10_000, 2), (10_000, 100), (100_000, 1_000)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    setup_django()
    from django.db import connection, transaction

    from django_pgoutbox import enqueue_many, queries

    def median_ms(sql: str, params: Any, *, lock: bool = False, fair: bool = False) -> float:
        times = []
        for _ in range(args.repeat):
            with transaction.atomic(), connection.cursor() as cursor:
                started = time.perf_counter()
                if lock:
                    cursor.execute(queries.CLAIM_LOCK, ["default"])
                    cursor.execute(
                        queries.QUEUE_ALLOWANCE, {"queue": "default", "rate": None, "burst": 1.0}
                    )
                    cursor.fetchone()
                if fair:
                    cursor.execute(queries.FAIR_PLAN)
                cursor.execute(sql, params)
                cursor.fetchall()
                times.append((time.perf_counter() - started) * 1000)
                transaction.set_rollback(True)
        return statistics.median(times)

    fair = {
        "queue": "default",
        "limit": 4,
        "worker_id": "bench",
        "lease": 60,
        "max_running": None,
        "rate": None,
        "burst": None,
    }
    rows = []
    print(f"{'pending':>8} {'orgs':>6} {'plain ms':>9} {'capped ms':>10} {'fair ms':>8}")
    for total, organizations in SHAPES:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobs")
        ids = [uuid.uuid4() for _ in range(organizations)]
        enqueue_many(
            {"job_type": "tests.noop", "payload": {}, "organization_id": ids[i % organizations]}
            for i in range(total)
        )
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE jobs")
        plain_params = {"queue": "default", "limit": 4, "worker_id": "bench", "lease": 60}
        row = {
            "pending": total,
            "organizations": organizations,
            "plain_ms": round(median_ms(queries.CLAIM_JOBS, plain_params), 3),
            "capped_ms": round(median_ms(queries.CLAIM_JOBS, plain_params, lock=True), 3),
            "fair_ms": round(median_ms(queries.FAIR_CLAIM, fair, fair=True), 3),
        }
        rows.append(row)
        print(
            f"{total:>8} {organizations:>6} {row['plain_ms']:>9.2f} {row['capped_ms']:>10.2f} "
            f"{row['fair_ms']:>8.2f}"
        )
    path = write_results("claims", {"repeat": args.repeat, "rows": rows})
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
