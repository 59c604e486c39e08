"""Priority aging's starvation bound: how long low-priority jobs wait behind a steady stream of
higher-priority work that keeps one worker busy, with aging off and on.

    python benchmarks/aging.py [--every 2] [--gap 5] [--low 5] [--off-seconds 60]
        [--poll 0.5] [--database pgoutbox_bench_aging]

One ``runworkers`` process, one handler thread, on a fresh database (of the server the tests
would use). A producer keeps about ``--ahead`` jobs of priority ``gap`` (5 ms each) due at all
times, so the worker is never idle and never far behind; a few seconds in, ``--low`` jobs of
priority 0 are enqueued. Each scenario prints the low jobs' waits (enqueue to claim, by the
database clock) against the bound of docs/workers.md:

- off: no ``PRIORITY_AGING``; the low jobs are still waiting when the scenario stops the stream
  after ``--off-seconds`` (then they run, and their wait is the scenario's length);
- ``UP_TO`` = the stream's priority: raised to it after ``gap`` steps, a low job then goes
  before the stream's jobs enqueued after it, behind those due before it;
- ``UP_TO`` = the stream's priority + 1: one step more, and it goes before all of them.

Also the pass itself on a backlog (``--backlog`` waiting jobs, none raised yet, then raised
again with nothing to do): its time and its plan's first lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import runworkers, setup_django, truncate

HANDLER_SECONDS = 0.005


def _stream(priority: int, ahead: int, stop: threading.Event) -> None:
    """Keep about ``ahead`` due jobs of ``priority`` waiting until ``stop``."""
    from django.db import connection

    from django_pgoutbox import enqueue_many

    item = {
        "job_type": "tests.behave",
        "payload": {"sleep": HANDLER_SECONDS, "record": False},
        "priority": priority,
    }
    while not stop.is_set():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = 'default' "
                "AND status = 'pending' AND priority >= %s LIMIT %s) AS w",
                [priority, ahead],
            )
            waiting = cursor.fetchone()[0]
        if waiting < ahead:
            enqueue_many([item] * (ahead - waiting))
        stop.wait(0.05)
    connection.close()


def scenario(args: argparse.Namespace, up_to: int | None) -> dict[str, Any]:
    from django.db import connection

    from django_pgoutbox import enqueue_many
    from django_pgoutbox.models import Job

    truncate("jobs", "queue_aging")
    queue: dict[str, Any] = {}
    if up_to is not None:
        queue["PRIORITY_AGING"] = {"EVERY": args.every, "UP_TO": up_to}
    settings = {"QUEUES": {"default": queue}, "POLL_INTERVAL": args.poll}
    stop = threading.Event()
    producer = threading.Thread(target=_stream, args=(args.gap, args.ahead, stop))
    producer.start()
    worker = runworkers(
        "--roles", "jobs", "--queues", "default", "--concurrency", "1", settings=settings
    )
    try:
        time.sleep(3.0)  # the stream runs, the worker has its pace
        low = [
            job.pk for job in enqueue_many([{"job_type": "tests.noop", "payload": {}}] * args.low)
        ]
        started = time.monotonic()
        limit = args.off_seconds if up_to is None else args.off_seconds * 3
        while time.monotonic() - started < limit:
            if Job.objects.filter(pk__in=low, status="completed").count() == len(low):
                break
            time.sleep(0.1)
        stopped_stream = not stop.is_set()
        stop.set()
        producer.join()
        while Job.objects.filter(pk__in=low, status="completed").count() < len(low):
            time.sleep(0.1)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM locked_at - created_at)::float8, priority, "
                "base_priority FROM jobs WHERE id = ANY(%s) ORDER BY created_at, id",
                [low],
            )
            rows = cursor.fetchall()
            cursor.execute(
                "SELECT count(*) FROM jobs WHERE priority = %s AND base_priority IS NULL "
                "AND status = 'completed' AND finished_at > (SELECT min(created_at) FROM jobs "
                "WHERE id = ANY(%s))",
                [args.gap, low],
            )
            stream_done = cursor.fetchone()[0]
    finally:
        stop.set()
        worker.terminate()
        worker.wait()
    waits = [row[0] for row in rows]
    return {
        "up_to": up_to,
        "waits": waits,
        "priorities": [(row[1], row[2]) for row in rows],
        "stream_jobs_run_meanwhile": stream_done,
        "stream_stopped_first": stopped_stream and up_to is None,
    }


def bound(args: argparse.Namespace, up_to: int) -> float:
    """docs/workers.md's bound, less what is ahead of the job at its new priority."""
    every, poll = float(args.every), float(args.poll)
    return up_to * every + max(poll, every / 4)  # the low jobs' priority is 0


def pass_on_backlog(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection

    from django_pgoutbox import enqueue_many
    from django_pgoutbox.aging import age_priorities
    from django_pgoutbox.conf import PriorityAging

    truncate("jobs", "queue_aging")
    for start in range(0, args.backlog, 100_000):
        enqueue_many(
            [
                {"job_type": "tests.noop", "payload": {}, "priority": n % 3}
                for n in range(min(100_000, args.backlog - start))
            ]
        )
    with connection.cursor() as cursor:
        # waited from 0 to 10 steps, spread over the backlog
        cursor.execute(
            "UPDATE jobs SET run_at = now() - make_interval(secs => %s * random() * 10)",
            [args.every],
        )
        cursor.execute("VACUUM ANALYZE jobs")
    aging = PriorityAging(every=args.every, up_to=5)
    timings = []
    for label in ("first pass", "second pass"):
        began = time.perf_counter()
        raised = age_priorities("default", aging, spaced=False, budget=3600.0)
        timings.append((label, raised, time.perf_counter() - began))
    return {"backlog": args.backlog, "passes": timings}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--every", type=float, default=2.0, help="PRIORITY_AGING's EVERY")
    parser.add_argument("--gap", type=int, default=5, help="the stream's priority (low: 0)")
    parser.add_argument("--low", type=int, default=5, help="low-priority jobs")
    parser.add_argument("--ahead", type=int, default=200, help="stream jobs kept waiting")
    parser.add_argument("--poll", type=float, default=0.5, help="the worker's POLL_INTERVAL")
    parser.add_argument("--off-seconds", type=float, default=60.0)
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--database", default="pgoutbox_bench_aging")
    args = parser.parse_args()
    setup_django(args.database)
    print(
        f"stream of priority {args.gap} ({HANDLER_SECONDS * 1000:g} ms jobs, ~{args.ahead} due), "
        f"one worker of one thread, POLL_INTERVAL {args.poll:g}s; {args.low} jobs of priority 0"
    )
    for up_to in (None, args.gap, args.gap + 1):
        result = scenario(args, up_to)
        waits = result["waits"]
        label = "aging off" if up_to is None else f"EVERY {args.every:g}s, UP_TO {up_to}"
        line = (
            f"{label:<24} low jobs waited {min(waits):6.2f} to {max(waits):6.2f}s "
            f"(median {statistics.median(waits):.2f}), {result['stream_jobs_run_meanwhile']} "
            "stream jobs run meanwhile"
        )
        if up_to is None:
            line += "; ran only once the stream stopped" if result["stream_stopped_first"] else ""
        else:
            line += f"; bound less what was ahead: {bound(args, up_to):.2f}s"
        print(line)
    result = pass_on_backlog(args)
    for label, raised, seconds in result["passes"]:
        print(
            f"pass over {result['backlog']:,} waiting jobs, {label}: "
            f"raised {raised:,} in {seconds:.2f}s"
        )


if __name__ == "__main__":
    main()
