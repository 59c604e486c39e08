"""Lease recovery while a transaction holds the xmin horizon (docs/operations.md, "How the
worker keeps draining").

    python benchmarks/recovery_scan.py --steps 5 --step 100000

A REPEATABLE READ session takes its snapshot and stays idle in transaction. Then, ``--steps``
times, ``--step`` pending jobs are claimed (``leased``, their lease already expired) and
completed, as a worker does; each leaves a dead entry in ``jobs_leased_idx`` that no vacuum can
remove while the horizon is held. After each step, the queue's lease recovery
(RECOVER_EXPIRED_LEASES, which finds nothing to recover) is timed: its cost grows with the dead
entries it steps over. Prints one line per step.

The database (``--db``, default ``pgoutbox_recovery``) is dropped, created and migrated.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="timings per step (the median)")
    parser.add_argument("--db", default="pgoutbox_recovery")
    args = parser.parse_args()
    setup_django(args.db)

    import psycopg
    from django.db import connection

    from django_pgoutbox import queries

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with (
        psycopg.connect(**params, autocommit=True) as conn,
        psycopg.connect(**params) as holder,
    ):
        conn.execute(
            "INSERT INTO jobs (queue, job_type, payload) "
            "SELECT 'default', 'bench.noop', '{}' FROM generate_series(1, %s)",
            [args.steps * args.step],
        )
        conn.execute("VACUUM ANALYZE jobs")
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM jobs")  # the snapshot is kept: the horizon is held
        for step in range(1, args.steps + 1):
            conn.execute(
                "UPDATE jobs SET status = 'leased', locked_by = 'bench', attempts = 1, "
                "lease_expires_at = now() - interval '1 minute' WHERE id IN "
                "(SELECT id FROM jobs WHERE status = 'pending' LIMIT %s)",
                [args.step],
            )
            conn.execute(
                "UPDATE jobs SET status = 'completed', lease_expires_at = NULL, "
                "completed_at = now(), finished_at = now() WHERE status = 'leased'"
            )
            timings = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                conn.execute(
                    queries.RECOVER_EXPIRED_LEASES, {"queue": "default", "notify": True}
                ).fetchall()
                timings.append(time.perf_counter() - started)
            median = sorted(timings)[len(timings) // 2]
            print(
                f"{step * args.step:>9,} jobs claimed while held: "
                f"lease recovery {median * 1000:7.1f} ms",
                flush=True,
            )
        holder.rollback()


if __name__ == "__main__":
    main()
