"""The worker's own Python per job, without the database: what a no-op job costs a queue.

    python benchmarks/worker_path.py [--jobs 100000] [--runs 5]

Builds N rows shaped like the claim's, then drives one ``QueueRunner``'s coordinator in this
thread (``step()``) with a lane that answers each claim at once with the next rows, and handler
threads that run each attempt as it is handed out: the ``Attempt`` made of each row, the
``ClaimedJob``, ``execute()`` with its metrics, signals and ``JobContext``, the no-op handler,
the ``Outcome``, its message to the coordinator, the batch and its settling. No statement is
sent: this is the part of a drain that no database tuning changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    from django_pgoutbox.queries import ClaimRow
    from django_pgoutbox.worker.claims import RecordAndClaim
    from django_pgoutbox.worker.mailbox import FINISHED, REPLY, Mailbox
    from django_pgoutbox.worker.runner import QueueRunner

    now = datetime.now(UTC)
    own = json.dumps(["w-1"])
    rows = [
        ClaimRow(ids.uuid7(), "tests.noop", "{}", 1, 25, None, "default", 0, now, 0.01, own, False)
        for _ in range(args.jobs)
    ]

    class Handlers:
        """Runs each attempt as it is handed out, and posts its outcome as a thread would."""

        def __init__(self, size: int, mailbox: Mailbox, run: Any) -> None:
            self.mailbox, self.run = mailbox, run

        def submit(self, attempt: Any) -> None:
            self.mailbox.post((FINISHED, attempt, self.run(attempt)), urgent=False)

        def start(self) -> None: ...
        def take_waiting(self) -> list[Any]:
            return []

        def add_thread(self) -> None: ...
        def retire_thread(self) -> None: ...
        def shutdown(self) -> None: ...

    class Lane:
        """Answers each claim at once with the next rows; every other request with nothing."""

        def __init__(self, index: int, mailbox: Mailbox) -> None:
            self.index, self.mailbox, self.next, self.written = index, mailbox, 0, 0

        def send(self, request: Any) -> None:
            result = None
            if isinstance(request, RecordAndClaim):
                request.written = request.batch
                request.applied = [o.job.id for o in request.batch]
                self.written += len(request.batch)
                request.rows = rows[self.next : self.next + request.limit]
                self.next += len(request.rows)
                result = request
            self.mailbox.post((REPLY, self.index, request, result, None, True))

        def start(self) -> None: ...
        def stop(self, timeout: float | None = None) -> None: ...

    conf = get_settings()
    totals = []
    lanes: list[Lane] = []

    def lane(index: int, mailbox: Mailbox) -> Lane:
        lanes.append(Lane(index, mailbox))
        return lanes[-1]

    for _ in range(args.runs):
        lanes.clear()
        settings = dataclasses.replace(conf.queues["default"], prefetch=0, connections=1)
        runner = QueueRunner(
            settings,
            worker_id="w-1",
            using="default",
            policy=conf.retry,
            concurrency=1000,
            lane=lane,
            handlers=Handlers,
        )
        started = time.perf_counter()
        while lanes[0].written < args.jobs:
            runner.step()
        totals.append((time.perf_counter() - started) / args.jobs * 1e6)
        print(f"{totals[-1]:.2f} µs per job")
    print(f"median {statistics.median(totals):.2f} µs per job over {args.runs} runs")


if __name__ == "__main__":
    main()
