"""What a generic plan would cost the dispatcher's statements that join arrays to leased rows.

    python benchmarks/plans.py [--rows 2000]

20,000 pending jobs; one connection claims ``--rows`` of them, then times ``RENEW_LEASES``,
``RECORD_OUTCOMES`` and ``RECORD_AND_CLAIM`` over those rows, once with ``plan_cache_mode =
force_custom_plan`` (planned knowing the arrays, as the worker runs them: see
``runner._UNPREPARED``) and once with ``force_generic_plan`` (what PostgreSQL may switch a
prepared statement to after five executions).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import completed_outcomes, pending_noops, setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    setup_django()
    import psycopg

    from django_pgoutbox import queries
    from django_pgoutbox.db import dispatcher_connection_params

    pending_noops(20_000)
    sql = {
        name: queries.binary(getattr(queries, name))
        for name in ("CLAIM_JOBS", "RENEW_LEASES", "RECORD_OUTCOMES", "RECORD_AND_CLAIM")
    }
    claim = {"queue": "default", "limit": args.rows, "worker_id": "w", "lease": 60.0}
    for mode in ("force_custom_plan", "force_generic_plan"):
        params = dispatcher_connection_params("default")
        with psycopg.connect(**params, autocommit=True, options=f"-c plan_cache_mode={mode}") as db:

            def claimed() -> tuple[list[Any], list[Any], dict[str, Any]]:
                rows = db.execute(sql["CLAIM_JOBS"], claim).fetchall()
                ids = [row[0] for row in rows]
                outcomes = {**completed_outcomes(ids, [row[3] for row in rows]), "worker_id": "w"}
                return ids, [row[3] for row in rows], outcomes

            def timed(name: str, values: list[Any] | dict[str, Any]) -> float:
                started = time.perf_counter()
                db.execute(sql[name], values, prepare=True).fetchall()
                return (time.perf_counter() - started) * 1000

            ids, attempts, outcomes = claimed()
            renew = timed("RENEW_LEASES", [60.0, ids, attempts, "w"])
            record = timed("RECORD_OUTCOMES", outcomes)
            ids, attempts, outcomes = claimed()
            both = timed("RECORD_AND_CLAIM", outcomes | claim)
        print(
            f"{mode}: RENEW_LEASES {renew:.1f} ms, RECORD_OUTCOMES {record:.1f} ms, "
            f"RECORD_AND_CLAIM {both:.1f} ms ({args.rows:,} rows)"
        )


if __name__ == "__main__":
    main()
