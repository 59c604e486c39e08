"""One worker's drain, with the CPU time that the worker and PostgreSQL spent on it.

    python benchmarks/drain_cpu.py [--jobs 100000] [--concurrency 4] [--runs 3]
        [--settings '{"QUEUES": {"default": {"PREFETCH": 2000}}}'] [--gc-threshold N]
        [--job-type tests.async_noop] [--payload '{"seconds": 0.01}']

N pending no-op jobs, then one ``runworkers --burst`` process, as in ``benchmarks/worker.py``.
Besides the rate, it prints the worker process's CPU time (``wait4``) and the CPU time of the
server's processes (their ``/proc/<pid>/stat``, sampled every 50 ms while the worker runs, since
a backend's counters go with it when it exits), each per job and as a share of the drain's
time: a drain where neither is near 100% waits on round trips, not on either side. Needs the
server on this host (it reads its processes). ``--settings`` is merged into ``PGOUTBOX`` for the
worker (``QUEUES`` per queue), for sweeps of a setting; ``--gc-threshold`` goes to ``runworkers``
(``0``: Python's own collector settings). ``--job-type`` drains jobs of another type
(``tests.async_noop``: an ``async def`` no-op, run on the queue's event loop;
``tests.async_sleep`` with ``--payload '{"seconds": 0.01}'``: coroutines that each await a
sleep), with ``--payload`` as each job's payload. ``PGOUTBOX_BENCH_DB`` names the database.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, drain_seconds, pending_noops, setup_django


def _server_ticks() -> dict[str, int]:
    """utime + stime (clock ticks) of every process named postgres that this user can read."""
    ticks: dict[str, int] = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            stat = Path(path).read_text()
        except OSError:
            continue
        if "(postgres)" in stat:
            fields = stat.rsplit(")", 1)[1].split()
            ticks[path] = int(fields[11]) + int(fields[12])
    return ticks


def drain(
    jobs: int,
    concurrency: int,
    settings: dict[str, object],
    gc_threshold: int | None = None,
    job_type: str = "tests.noop",
    payload: dict[str, object] | None = None,
) -> dict[str, float]:
    pending_noops(jobs, job_type, payload)
    env = {**os.environ, "PGOUTBOX_TEST_SETTINGS": json.dumps(settings), "PGOUTBOX_DEBUG": "0"}
    command = [sys.executable, str(ROOT / "manage.py"), "runworkers", "-v", "0", "--roles"]
    command += ["jobs", "--burst", "--queues", "default", "--concurrency", str(concurrency)]
    if gc_threshold is not None:
        command += ["--gc-threshold", str(gc_threshold)]
    before = _server_ticks()
    seen = dict(before)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            seen.update(_server_ticks())

    sampler = threading.Thread(target=sample)
    sampler.start()
    process = subprocess.Popen(command, cwd=ROOT, env=env)
    _, _, usage = os.wait4(process.pid, 0)
    done.set()
    sampler.join()
    seen.update(_server_ticks())
    server = sum(v - before.get(k, 0) for k, v in seen.items()) / os.sysconf("SC_CLK_TCK")
    window = drain_seconds(jobs)
    worker = usage.ru_utime + usage.ru_stime
    return {
        "jobs_per_second": jobs / window,
        "seconds": window,
        "worker_cpu_us_per_job": worker / jobs * 1e6,
        "server_cpu_us_per_job": server / jobs * 1e6,
        "worker_share": worker / window,
        "server_share": server / window,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--settings", type=json.loads, default={}, help="JSON, into PGOUTBOX")
    parser.add_argument("--gc-threshold", type=int, help="runworkers --gc-threshold")
    parser.add_argument("--job-type", default="tests.noop", help="default tests.noop")
    parser.add_argument("--payload", type=json.loads, default={}, help="JSON, each job's")
    args = parser.parse_args()
    setup_django()
    rates = []
    for _ in range(args.runs):
        row = drain(
            args.jobs,
            args.concurrency,
            args.settings,
            args.gc_threshold,
            args.job_type,
            args.payload,
        )
        rates.append(row["jobs_per_second"])
        print(
            f"{row['jobs_per_second']:>9,.0f} jobs/s  worker {row['worker_cpu_us_per_job']:.1f} µs"
            f"/job ({row['worker_share']:.0%} of the drain's time, start-up included), "
            f"PostgreSQL {row['server_cpu_us_per_job']:.1f} µs/job ({row['server_share']:.0%})"
        )
    print(f"median {statistics.median(rates):,.0f} jobs/s over {args.runs} runs")


if __name__ == "__main__":
    main()
