"""What PostgreSQL alone spends inserting jobs: the floor under ``enqueue_many``.

    python benchmarks/insert_floor.py [--jobs 100000]

Inserts ``--jobs`` rows into the migrated ``jobs`` table with one ``INSERT ... SELECT`` from
``generate_series`` (time-ordered ids, as ``uuid7`` makes them; no client, no parameters), and
with one binary ``COPY`` of the same rows read back beforehand (what ``enqueue_many()`` sends,
with no Python work left), best of three each, committed; then both without
``jobs_fair_claim_idx``, to show what that index costs. Runs on the benchmarks' own fresh
database.
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


COLUMNS = "id, organization_id, queue, job_type, payload, priority, run_at, max_attempts"


def best_of_three(jobs: int, copy_data: bytes | None = None) -> float:
    from django.db import connection, transaction

    times = []
    for _ in range(3):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobs")
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            if copy_data is None:
                cursor.execute(INSERT, [jobs])
            else:
                with cursor.copy(f"COPY jobs ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(copy_data)
        times.append(time.perf_counter() - started)
    return min(times)


def copy_rows(jobs: int) -> bytes:
    """The rows of INSERT in COPY's binary format, as the server writes them out."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE jobs")
        cursor.execute(INSERT, [jobs])
        data = bytearray()
        with cursor.copy(f"COPY jobs ({COLUMNS}) TO STDOUT (FORMAT BINARY)") as copy:
            for chunk in copy:
                data += chunk
    return bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    setup_django()
    from django.db import connection

    data = copy_rows(args.jobs)
    for indexes in ("every index", "without the fair index"):
        if indexes != "every index":
            with connection.cursor() as cursor:
                cursor.execute("DROP INDEX jobs_fair_claim_idx")
        for how, copy_data in (("INSERT ... SELECT", None), ("binary COPY", data)):
            took = best_of_three(args.jobs, copy_data)
            print(
                f"{args.jobs:,} jobs, {how:<17} {indexes:<22} {took:.3f} s "
                f"({args.jobs / took:,.0f}/s)"
            )


if __name__ == "__main__":
    main()
