"""What sequences cost: the claim with 10,000 live sequence keys against a plain backlog, and
an enqueue into a sequence against a plain one.

    python benchmarks/sequences.py [--repeat 50] [--keys 10000] [--depth 3]

On a fresh ``seq_bench`` database: a backlog of ``keys`` pending plain jobs, then one of ``keys``
sequences of ``depth`` jobs each (a head pending, the rest waiting for it). Each claim of 4 jobs
runs in a transaction rolled back, so that every run sees the same backlog; the median is
printed in milliseconds. Then 1,000 enqueues one by one (each its own transaction), plain and
into 100 sequences, and their median. The table is vacuumed and analyzed first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, setup_django, write_results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()
    setup_django("seq_bench")
    from django.db import connection, transaction

    from django_pgoutbox import enqueue, enqueue_many, queries

    params: dict[str, Any] = {"queue": "default", "limit": 4, "worker_id": "bench", "lease": 60}

    def claim_ms() -> float:
        times = []
        for _ in range(args.repeat):
            with transaction.atomic(), connection.cursor() as cursor:
                started = time.perf_counter()
                cursor.execute(queries.CLAIM_JOBS, params)
                cursor.fetchall()
                times.append((time.perf_counter() - started) * 1000)
                transaction.set_rollback(True)
        return statistics.median(times)

    def fresh() -> None:
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE jobs, job_dependencies")

    def analyzed() -> None:
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE jobs")
            cursor.execute("VACUUM ANALYZE job_dependencies")

    fresh()
    enqueue_many({"job_type": "tests.noop", "payload": {}} for _ in range(args.keys))
    analyzed()
    plain = claim_ms()
    fresh()
    with transaction.atomic():
        enqueue_many(
            {"job_type": "tests.noop", "payload": {}, "sequence": f"key:{k}"}
            for _ in range(args.depth)
            for k in range(args.keys)
        )
    analyzed()
    sequenced = claim_ms()
    print(f"claim of 4, {args.keys:,} pending plain jobs:          {plain:.3f} ms (median)")
    print(
        f"claim of 4, {args.keys:,} sequences of {args.depth} ({args.keys:,} heads): "
        f"{sequenced:.3f} ms (median)"
    )

    def enqueue_ms(sequence: bool) -> float:
        times = []
        for i in range(1000):
            started = time.perf_counter()
            enqueue("tests.noop", {}, sequence=f"e:{i % 100}" if sequence else None)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    fresh()
    plain_enqueue = enqueue_ms(False)
    sequence_enqueue = enqueue_ms(True)
    print(f"enqueue, plain (own transaction):          {plain_enqueue:.3f} ms (median)")
    print(f"enqueue into one of 100 sequences:         {sequence_enqueue:.3f} ms (median)")
    path = write_results(
        "sequences",
        {
            "repeat": args.repeat,
            "keys": args.keys,
            "depth": args.depth,
            "claim_plain_ms": round(plain, 3),
            "claim_sequences_ms": round(sequenced, 3),
            "enqueue_plain_ms": round(plain_enqueue, 3),
            "enqueue_sequence_ms": round(sequence_enqueue, 3),
        },
    )
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
