"""enqueue_many() repeated: the spread of the suite's bulk measure, and what building Jobs costs.

    python benchmarks/bulk.py [--jobs 100000] [--runs 5]

Each run enqueues ``--jobs`` no-op jobs with one ``enqueue_many()`` call (as the suite does),
then the same followed by ``list()`` of its result, which builds every ``Job`` instance. Prints
each run's rate and the median of each. Runs on the benchmarks' own fresh database.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django, truncate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup_django()
    from django_pgoutbox import enqueue_many

    items = [{"job_type": "tests.noop", "payload": {}}] * args.jobs
    rates: dict[str, list[float]] = {"enqueue_many()": [], "list(enqueue_many())": []}
    for _ in range(args.runs):
        for label, rate_list in rates.items():
            truncate("jobs")
            started = time.perf_counter()
            result = enqueue_many(items)
            if label.startswith("list"):
                result = list(result)
            rate_list.append(args.jobs / (time.perf_counter() - started))
            del result
    truncate("jobs")
    for label, rate_list in rates.items():
        runs = " ".join(f"{rate:,.0f}" for rate in rate_list)
        print(f"{label:<22} median {statistics.median(rate_list):>9,.0f} jobs/s  ({runs})")


if __name__ == "__main__":
    main()
