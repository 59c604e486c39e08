"""Drain rate and wake-up latency of one ``runworkers`` process.

    python benchmarks/worker.py [--jobs 20000] [--concurrency 4 16] [--latency-jobs 500]

Runs on a fresh database ``pgoutbox_bench`` of the server that the tests would use
(DATABASE_URL, else 127.0.0.1:5432, else the embedded one). Prints a table and writes JSON to
benchmarks/results/.

- drain: N pending no-op jobs, then ``runworkers --burst``; the rate is N divided by the time
  from the first claim to the last outcome, as the database clock recorded them (the process's
  start-up is reported apart, as wall time).
- wake-up: an idle worker (5 s poll), jobs enqueued 10 ms apart, each in its own transaction;
  latency is from the enqueue's commit to the handler's first line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    ROOT,
    drain_seconds,
    pending_noops,
    percentile,
    runworkers,
    setup_django,
    truncate,
    write_results,
)


def drain(jobs: int, concurrency: int, processes: int = 1) -> dict[str, float]:
    pending_noops(jobs)
    started = time.monotonic()
    workers = [
        runworkers(
            "--roles", "jobs", "--burst", "--queues", "default", "--concurrency", str(concurrency)
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.wait()
    wall = time.monotonic() - started
    window = drain_seconds(jobs)
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "seconds": window,
        "jobs_per_second": jobs / window,
        "wall_seconds": wall,
    }


def wakeup(count: int, gap: float) -> dict[str, float]:
    from django_pgoutbox import enqueue
    from django_pgoutbox.models import Job

    truncate("jobs")
    process = runworkers("--roles", "jobs", "--queues", "default", settings={"POLL_INTERVAL": 5})
    try:
        time.sleep(3)  # start-up, first claim and the LISTEN connection: then it is idle
        committed: dict[object, float] = {}
        for _ in range(count):
            job = enqueue("tests.stamp", {})  # autocommit: committed when it returns
            committed[job.pk] = time.time()
            time.sleep(gap)
        deadline = time.monotonic() + 60
        while Job.objects.filter(status="completed").count() < count:
            assert time.monotonic() < deadline, "wake-up jobs did not complete"
            time.sleep(0.1)
    finally:
        process.terminate()
        process.wait()
    latencies = [
        (result["started"] - committed[pk]) * 1000
        for pk, result in Job.objects.values_list("pk", "result")
        if result is not None
    ]
    assert len(latencies) == count
    return {
        "jobs": count,
        "p50_ms": percentile(latencies, 0.5),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "mean_ms": statistics.fmean(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--runs", type=int, default=3, help="drain runs per concurrency (median)")
    parser.add_argument("--latency-jobs", type=int, default=500)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    args = parser.parse_args()

    setup_django()
    results: dict[str, object] = {"drain": [], "wakeup": None}
    print(f"{'measure':<34}{'value':>14}")
    for concurrency in args.concurrency:
        runs = [drain(args.jobs, concurrency) for _ in range(args.runs)]
        median = sorted(runs, key=lambda r: r["jobs_per_second"])[len(runs) // 2]
        results["drain"].append({"median": median, "runs": runs})  # type: ignore[attr-defined]
        print(
            f"{f'drain {args.jobs} no-op, concurrency {concurrency}':<34}"
            f"{median['jobs_per_second']:>10,.0f} j/s   (runs: "
            + ", ".join(f"{r['jobs_per_second']:,.0f}" for r in runs)
            + ")"
        )
    wake = wakeup(args.latency_jobs, args.gap_ms / 1000)
    results["wakeup"] = wake
    print(
        f"{'wake-up latency p50 / p95 / p99':<34}{wake['p50_ms']:>8.1f} / {wake['p95_ms']:.1f} / "
        f"{wake['p99_ms']:.1f} ms"
    )
    path = write_results("worker", results)
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
