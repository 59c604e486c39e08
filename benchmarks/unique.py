"""What a unique job costs to enqueue, against a plain one (docs/uniqueness.md).

    python benchmarks/unique.py [--rounds 7] [--jobs 2000] [--transaction] [--database NAME]

Each round times ``enqueue()`` in autocommit, one transaction per job (with ``--transaction``,
all of a kind's jobs in one transaction: no commit per job, what the statements cost), ``--jobs``
times for each kind, in this order: a plain job; a unique job (``unique=True``) whose key is new
each time; the same with a period (``Unique(period=...)``); a unique job whose key is held (the
enqueue returns the job that holds it); a debounced job whose key is held (the enqueue pushes it
back). Every job has a payload of three keys, one of them a counter, so that each new key
differs. Prints each round and, per kind, the median rate and its ratio to the plain job's. Runs
on a fresh database of its own (``--database``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django, truncate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=2000, help="enqueues of each kind per round")
    parser.add_argument("--transaction", action="store_true", help="one transaction per kind")
    parser.add_argument("--database", default="pgoutbox_bench_unique")
    args = parser.parse_args()
    setup_django(args.database)

    from contextlib import nullcontext

    from django.db import transaction

    from django_pgoutbox import enqueue
    from django_pgoutbox.uniqueness import Unique

    hourly = Unique(period=timedelta(hours=1))

    def payload(n: int) -> dict[str, object]:
        return {"user_id": n, "kind": "welcome", "locale": "en-GB"}

    kinds: dict[str, Callable[[int], object]] = {
        "plain": lambda n: enqueue("tests.noop", payload(n)),
        "unique, new key": lambda n: enqueue("tests.noop", payload(n), unique=True),
        "unique with a period, new key": lambda n: enqueue("tests.noop", payload(n), unique=hourly),
        "unique, key held": lambda n: enqueue("tests.noop", payload(0), unique=True),
        "debounce, key held": lambda n: enqueue("tests.noop", payload(0), debounce=60),
    }
    rates: dict[str, list[float]] = {name: [] for name in kinds}
    for round_number in range(1, args.rounds + 1):
        values = []
        for name, run in kinds.items():
            truncate("jobs")
            run(0)  # the held key's holder (and a warm cache)
            block = transaction.atomic() if args.transaction else nullcontext()
            started = time.perf_counter()
            with block:
                for n in range(1, args.jobs + 1):
                    run(n)
            value = args.jobs / (time.perf_counter() - started)
            rates[name].append(value)
            values.append(value)
        print(f"round {round_number}: " + ", ".join(f"{v:,.0f}" for v in values), flush=True)
    truncate("jobs")
    print()
    plain = statistics.median(rates["plain"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<32} median {median:>8,.0f} jobs/s   {plain / median:.2f}x the plain's time")


if __name__ == "__main__":
    main()
