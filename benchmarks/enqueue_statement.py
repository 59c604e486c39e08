"""What each part of the single-job insert costs the server, committed, one row at a time.

    python benchmarks/enqueue_statement.py [--rows 150] [--rounds 8]

Interleaves, round after round, autocommitted one-row inserts: into a table of one column with
no index (the commit's floor), into ``jobs`` with four columns, with every column of
``ENQUEUE_JOB``, then with its ``RETURNING``, its ``pg_notify`` and its ``ON CONFLICT``
(``ENQUEUE_JOB`` itself); and ``ENQUEUE_JOB_UNKEYED``, what ``enqueue()`` sends for a job without
an idempotency key. Prints the median µs per row of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django, truncate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    setup_django()
    import psycopg

    from django_pgoutbox import ids, queries
    from django_pgoutbox.db import raw_connection_params

    truncate("jobs")

    def row() -> dict[str, Any]:
        return {
            "id": ids.uuid7(),
            "organization_id": None,
            "queue": "default",
            "job_type": "tests.noop",
            "payload": "{}",
            "idempotency_key": None,
            "priority": 0,
            "run_at": None,
            "delay": 0.0,
            "max_attempts": 25,
        }

    def notifying() -> dict[str, Any]:
        return row() | {"notify": True, "channel": "pgoutbox"}

    values = queries.ENQUEUE_JOB_UNKEYED.split("RETURNING")[0]
    variants: dict[str, tuple[str, Any]] = {
        "one column, no index (the commit)": ("INSERT INTO bench_floor VALUES (1)", list),
        "jobs, four columns": (
            "INSERT INTO jobs (id, queue, job_type, payload) "
            "VALUES (%b, 'default', 'tests.noop', '{}')",
            lambda: [ids.uuid7()],
        ),
        "jobs, ENQUEUE_JOB's columns": (values, row),
        "  + RETURNING run_at, created_at": (values + "RETURNING run_at, created_at", row),
        "  + pg_notify (ENQUEUE_JOB_UNKEYED)": (
            queries.ENQUEUE_JOB_UNKEYED,
            notifying,
        ),
        "  + ON CONFLICT (ENQUEUE_JOB)": (queries.ENQUEUE_JOB, notifying),
    }
    timings: dict[str, list[float]] = {name: [] for name in variants}
    with psycopg.connect(**raw_connection_params("default"), autocommit=True) as db:
        db.execute("CREATE TABLE bench_floor (n int)")
        try:
            for _ in range(args.rounds):
                for name, (sql, params) in variants.items():
                    started = time.perf_counter()
                    for _ in range(args.rows):
                        db.execute(sql, params())
                    timings[name].append((time.perf_counter() - started) / args.rows)
        finally:
            db.execute("DROP TABLE bench_floor")
    for name, seconds in timings.items():
        print(f"{name:<40} {statistics.median(seconds) * 1e6:>6.0f} µs")


if __name__ == "__main__":
    main()
