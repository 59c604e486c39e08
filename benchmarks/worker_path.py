"""The worker's own Python per job, without the database: what a no-op job costs a runner.

    python benchmarks/worker_path.py [--jobs 100000] [--runs 5]

Builds N rows shaped like the claim's, then drives one ``QueueRunner``'s per-job path in this
thread: ``_Running`` (what ``_start()`` makes of each claimed row), ``_run_attempt()`` (the
``ClaimedJob``, ``execute()`` with its metrics, signals and ``JobContext``, the no-op handler,
the ``Outcome``) and ``_settle()`` (forgetting the attempts, counting outcomes). No statement is
sent: this is the part of a drain that no database tuning changes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup_django()
    import json

    from django_pgoutbox import ids
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.worker.runner import QueueRunner, _Running

    conf = get_settings()
    runner = QueueRunner(
        conf.queues["default"], worker_id="w-1", using="default", policy=conf.retry, concurrency=1
    )
    now = datetime.now(UTC)
    own = json.dumps(["w-1"])
    rows = [
        (ids.uuid7(), "tests.noop", "{}", 1, 25, None, "default", 0, now, 0.01, own)
        for _ in range(args.jobs)
    ]
    totals = []
    try:
        for _ in range(args.runs):
            runner._outcomes.clear()
            runner._running.clear()
            started = time.perf_counter()
            entries = []
            for row in rows:
                entry = _Running(row, ("w-1",))
                runner._running[(entry.id, entry.attempt)] = entry
                entries.append(entry)
            for entry in entries:
                runner._run_attempt(entry)
            batch = list(runner._outcomes)
            runner._outcomes.clear()
            runner._settle(batch, [outcome.job.id for outcome in batch])
            totals.append((time.perf_counter() - started) / args.jobs * 1e6)
            print(f"{totals[-1]:.2f} µs per job")
    finally:
        runner._threads.shutdown()
    print(f"median {statistics.median(totals):.2f} µs per job over {args.runs} runs")


if __name__ == "__main__":
    main()
