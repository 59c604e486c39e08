"""What the outcome statement costs when it completes workflow parents and releases their steps.

    python benchmarks/release_statement.py [--parents 3000] [--rounds 5] [--plain]
        [--database NAME]

One workflow of ``--parents`` roots, each with one child; then, on an autocommit connection as a
worker's lane has, claims of 100 (``CLAIM_JOBS``) and ``RECORD_OUTCOMES`` completing them, whose
trigger releases each child. Prints the time of the outcome statements per parent completed, per
round, and the median: the release's cost at the SQL level, without a worker's threads. With
``--plain``, the same number of plain jobs, for the statement's cost without a release. Runs on
a fresh database of its own, so that two checkouts can be measured one after the other.
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parents", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plain", action="store_true", help="plain jobs, no release")
    parser.add_argument("--database", default="pgoutbox_bench_release")
    args = parser.parse_args()
    setup_django(args.database)
    import psycopg

    from django_pgoutbox import enqueue_many, queries, workflow
    from django_pgoutbox.db import raw_connection_params
    from django_pgoutbox.worker.execute import Outcome
    from django_pgoutbox.worker.outcomes import params

    per_parent: list[float] = []
    for round_number in range(1, args.rounds + 1):
        truncate("jobs", "job_dependencies", "workflows")
        if args.plain:
            enqueue_many([{"job_type": "tests.noop", "payload": {}}] * args.parents)
        else:
            flow = workflow("release")
            roots = [flow.add("tests.noop", {}, name=f"r{i}") for i in range(args.parents)]
            for i, root in enumerate(roots):
                flow.add("tests.noop", {}, name=f"c{i}", after=[root])
            flow.enqueue()
        spent = 0.0
        done = 0
        with psycopg.connect(**raw_connection_params("default"), autocommit=True) as conn:
            while done < args.parents:
                rows = conn.execute(
                    queries.CLAIM_JOBS,
                    {"queue": "default", "limit": 100, "worker_id": "bench", "lease": 60.0},
                ).fetchall()
                if not rows:
                    break
                outcomes = [
                    Outcome.completed(_claimed(row), "null") for row in rows[: args.parents - done]
                ]
                sql_params = params(outcomes, "bench")
                started = time.perf_counter()
                conn.execute(queries.RECORD_OUTCOMES, sql_params)
                spent += time.perf_counter() - started
                done += len(outcomes)
        per_parent.append(spent / done * 1e6)
        print(f"round {round_number}: {per_parent[-1]:.1f} µs per job completed", flush=True)
    truncate("jobs", "job_dependencies", "workflows")
    what = "plain job" if args.plain else "parent completed, its child released"
    print(f"\nmedian {statistics.median(per_parent):.1f} µs per {what}")


def _claimed(row: tuple[Any, ...]) -> Any:
    """The claimed job of a claim's row, as a worker builds it (only what the outcome reads)."""
    from django.utils import timezone

    from django_pgoutbox.worker.execute import ClaimedJob

    return ClaimedJob(
        id=row[0],
        job_type="tests.noop",
        payload={},
        attempt=row[3],
        max_attempts=row[4],
        organization_id=None,
        queue="default",
        priority=0,
        created_at=timezone.now(),
    )


if __name__ == "__main__":
    main()
