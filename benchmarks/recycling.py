"""The resident memory of a worker whose handler leaks, with and without ``--max-memory``.

    python benchmarks/recycling.py [--jobs 16] [--mb 50] [--max-memory 300]

``--jobs`` jobs of ``tests.leak``, each keeping ``--mb`` MiB for the life of its process, run by
one ``runworkers`` process (4 threads) until all completed: once without a limit, once with
``--max-memory``. Prints the highest resident memory seen (``/proc/<pid>/status``, every 50 ms)
and how many times the process recycled. Runs on the benchmarks' own fresh database.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import runworkers, setup_django, truncate


def resident_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(jobs: int, mb: int, limit: list[str]) -> tuple[float, float]:
    from django_pgoutbox import enqueue_many
    from django_pgoutbox.models import Job, JobStatus

    truncate("jobs")
    enqueue_many([{"job_type": "tests.leak", "payload": {"mb": mb}}] * jobs)
    worker = runworkers("--roles", "jobs", "--queues", "default", "--concurrency", "4", *limit)
    peak, started = 0.0, time.monotonic()
    try:
        while Job.objects.filter(status=JobStatus.COMPLETED).count() < jobs:
            peak = max(peak, resident_mib(worker.pid))
            time.sleep(0.05)
            if time.monotonic() - started > 300:
                raise RuntimeError("the jobs did not complete within 300 s")
    finally:
        worker.terminate()
        worker.wait()
    return peak, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--max-memory", type=int, default=300)
    args = parser.parse_args()
    setup_django()
    for label, limit in (
        ("no limit", []),
        (f"--max-memory {args.max_memory}", ["--max-memory", str(args.max_memory)]),
    ):
        peak, seconds = run(args.jobs, args.mb, limit)
        print(
            f"{args.jobs} jobs leaking {args.mb} MiB each, {label:>18}: "
            f"highest resident memory {peak:,.0f} MiB ({seconds:.1f} s)"
        )


if __name__ == "__main__":
    main()
