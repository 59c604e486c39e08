"""What PostgreSQL alone spends inserting jobs: the floor under ``enqueue_many``.

    python benchmarks/insert_floor.py [--jobs 100000]

Inserts ``--jobs`` rows into the migrated ``jobs`` table with one ``INSERT ... SELECT`` from
``generate_series`` (time-ordered ids, as ``uuid7`` makes them; no client, no parameters), best
of three, committed; then the same without ``jobs_fair_claim_idx``, to show what that index
costs. Runs on the benchmarks' own fresh database.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django

INSERT = """
INSERT INTO jobs (id, queue, job_type, payload, priority, run_at, max_attempts)
SELECT ('01a22a45-2222-7232-9f06-' || lpad(to_hex(n), 12, '0'))::uuid,
       'default', 'tests.noop', '{}'::jsonb, 0, now(), 10
FROM generate_series(1, %s) AS n
"""


def best_of_three(jobs: int) -> float:
    from django.db import connection, transaction

    times = []
    for _ in range(3):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobs")
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(INSERT, [jobs])
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    setup_django()
    from django.db import connection

    full = best_of_three(args.jobs)
    print(f"{args.jobs:,} jobs, every index:            {full:.3f} s ({args.jobs / full:,.0f}/s)")
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX jobs_fair_claim_idx")
    lean = best_of_three(args.jobs)
    print(f"{args.jobs:,} jobs, without the fair index: {lean:.3f} s ({args.jobs / lean:,.0f}/s)")


if __name__ == "__main__":
    main()
