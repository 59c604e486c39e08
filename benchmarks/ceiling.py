"""The SQL-only ceiling: the worker's own claim/complete statement, driven without the worker.

    python benchmarks/ceiling.py [--jobs 100000] [--batch 100] [--connections 1 2]

N pending no-op jobs; each client process loops on ``RECORD_AND_CLAIM`` (the statement a
worker's dispatcher sends: write the outcomes of the last batch as completed, claim the next
``batch``), over one psycopg connection with the statement prepared, and runs no handler. The
rate is N over the wall time until every job is completed: what PostgreSQL allows this claim
path on this machine, against which every drain figure is also given as a ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, pending_noops, setup_django, write_results


def _client(conninfo: dict[str, Any], batch: int, worker_id: str) -> None:
    import psycopg

    from django_pgoutbox import queries

    outcomes: list[Any] = []
    with psycopg.connect(**conninfo, autocommit=True) as conn:
        while True:
            ids = [row[0] for row in outcomes]
            params = {
                "ids": ids,
                "attempts": [row[3] for row in outcomes],
                "statuses": ["completed"] * len(ids),
                "gives_back_attempt": [False] * len(ids),
                "delays": [0.0] * len(ids),
                "codes": [None] * len(ids),
                "summaries": [None] * len(ids),
                "results": [None] * len(ids),
                "progress": [None] * len(ids),
                "meta": [None] * len(ids),
                "traces": [],
                "worker_id": worker_id,
                "notify": True,
                "queue": "default",
                "limit": batch,
                "lease": 60.0,
            }
            rows = conn.execute(queries.RECORD_AND_CLAIM, params).fetchall()
            outcomes = [row[1:] for row in rows if row[0]]
            if not outcomes:
                return


def ceiling(jobs: int, batch: int, clients: int) -> dict[str, float]:
    from django.db import connection

    from django_pgoutbox.db import dispatcher_connection_params

    pending_noops(jobs)
    conninfo = dispatcher_connection_params("default")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_client, args=(conninfo, batch, f"ceiling-{n}"))
        for n in range(clients)
    ]
    started = time.monotonic()
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    seconds = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM jobs WHERE status = 'completed'")
        completed = cursor.fetchone()[0]
    assert completed == jobs, f"only {completed} of {jobs} completed"
    return {
        "jobs": jobs,
        "batch": batch,
        "clients": clients,
        "seconds": seconds,
        "jobs_per_second": jobs / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    setup_django()
    results = [ceiling(args.jobs, args.batch, n) for n in args.connections]
    for row in results:
        print(
            f"SQL-only ceiling, batches of {row['batch']}, {row['clients']} connection(s): "
            f"{row['jobs_per_second']:,.0f} jobs/s"
        )
    path = write_results("ceiling", {"runs": results})
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
