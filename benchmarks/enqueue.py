"""What one enqueue costs, through each path: the checks alone, enqueue(), enqueue_many().

    python benchmarks/enqueue.py [--rounds 5] [--single 2000] [--bulk 100000] [--database NAME]

Each round measures, in this order: the checks of one job (``validate_job``, CPU time per job, no
database); ``enqueue()`` in autocommit, one transaction per job; ``enqueue()`` inside one
transaction; ``enqueue_many()`` of 63 items (its ``INSERT`` path) and of ``--bulk`` items (its
``COPY`` path). The payload is a small dict of three keys, as most jobs have. Prints each round and
the median of each measure. Runs on a fresh database of its own (``--database``, dropped and
created again), so that two checkouts can be measured one after the other on the same server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django, truncate

PAYLOAD = {"user_id": 12345, "kind": "welcome", "locale": "en-GB"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--single", type=int, default=2000, help="jobs of each enqueue() measure")
    parser.add_argument("--bulk", type=int, default=100_000, help="items of the COPY measure")
    parser.add_argument("--database", default="pgoutbox_bench_enqueue")
    args = parser.parse_args()
    setup_django(args.database)
    from django.db import transaction

    from django_pgoutbox import enqueue, enqueue_many
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.job_rows import validate_job

    conf = get_settings()

    def checks() -> float:
        """µs of CPU per job for the checks of ``enqueue()``, the best of five runs."""
        runs: list[float] = []
        for _ in range(5):
            started = time.process_time()
            for _ in range(args.single * 5):
                validate_job(
                    "tests.noop",
                    PAYLOAD,
                    idempotency_key=None,
                    organization_id=None,
                    priority=None,
                    run_at=None,
                    queue=None,
                    prefix="",
                    conf=conf,
                )
            runs.append((time.process_time() - started) / (args.single * 5) * 1e6)
        return min(runs)

    def rate(jobs: int, run: Callable[[], object]) -> float:
        truncate("jobs")
        started = time.perf_counter()
        run()
        return jobs / (time.perf_counter() - started)

    def autocommit() -> None:
        for _ in range(args.single):
            enqueue("tests.noop", PAYLOAD)

    def one_transaction() -> None:
        with transaction.atomic():
            for _ in range(args.single):
                enqueue("tests.noop", PAYLOAD)

    small = [{"job_type": "tests.noop", "payload": PAYLOAD}] * 63
    bulk = [{"job_type": "tests.noop", "payload": PAYLOAD}] * args.bulk

    def inserts() -> None:
        for _ in range(args.single // 63):
            enqueue_many(small)

    measures: dict[str, list[float]] = {
        "checks of one job (µs CPU)": [],
        "enqueue(), autocommit (jobs/s)": [],
        "enqueue(), one transaction (jobs/s)": [],
        "enqueue_many() of 63, INSERT (jobs/s)": [],
        f"enqueue_many() of {args.bulk:,}, COPY (jobs/s)": [],
    }
    names = list(measures)
    for round_number in range(1, args.rounds + 1):
        values = [
            checks(),
            rate(args.single, autocommit),
            rate(args.single, one_transaction),
            rate(args.single // 63 * 63, inserts),
            rate(args.bulk, lambda: enqueue_many(bulk)),
        ]
        for name, value in zip(names, values, strict=True):
            measures[name].append(value)
        print(f"round {round_number}: " + ", ".join(f"{v:,.1f}" for v in values), flush=True)
    truncate("jobs")
    print()
    for name, values in measures.items():
        print(f"{name:<44} median {statistics.median(values):>12,.1f}")


if __name__ == "__main__":
    main()
