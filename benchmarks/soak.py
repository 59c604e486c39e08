"""A soak: steady enqueue for N minutes with retention on; is anything growing that should not?

    python benchmarks/soak.py [--minutes 10] [--rate 200]

One ``runworkers`` process (jobs, relay, scheduler; prune every 10 s, completed jobs kept 30 s)
on a fresh ``pgoutbox_bench`` database, while this script enqueues ``rate`` jobs per second and
publishes a tenth as many events. Every 30 s it prints: the mean claim time over the window
(from the worker's own metrics endpoint), the jobs table's live and dead tuples and size, the
backlog, and the worker's resident memory.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, runworkers, setup_django, write_results

SETTINGS = {
    "RETENTION": {"COMPLETED_JOBS": 30, "PROCESSED_EVENTS": 30},
    "SCHEDULES": {"pgoutbox.prune": {"JOB": "pgoutbox.prune", "EVERY": 10}},
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _claim_totals(port: int) -> tuple[float, float]:
    """(sum, count) of pgoutbox_claim_duration_seconds over every queue."""
    total = count = 0.0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        for line in page.read().decode().splitlines():
            if line.startswith("pgoutbox_claim_duration_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("pgoutbox_claim_duration_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
    return total, count


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200, help="jobs enqueued per second")
    args = parser.parse_args()
    setup_django()
    from django.db import connection

    from django_pgoutbox import enqueue_many, publish

    port = _free_port()
    worker = runworkers("--metrics-port", str(port), settings=SETTINGS)
    time.sleep(3)
    samples = []
    tick = 0.1
    per_tick = max(1, round(args.rate * tick))
    started = time.monotonic()
    next_sample = started + 30
    last_sum, last_count = _claim_totals(port)
    print(
        f"{'t (s)':>6} {'claim ms':>9} {'live':>9} {'dead':>8} {'size MB':>8} "
        f"{'backlog':>8} {'RSS MB':>7}"
    )
    try:
        while time.monotonic() - started < args.minutes * 60:
            enqueue_many([{"job_type": "tests.noop", "payload": {}}] * per_tick)
            if int((time.monotonic() - started) / tick) % 10 == 0:
                publish(
                    "soak.happened", aggregate_type="soak", aggregate_id=uuid.uuid4(), payload={}
                )
            time.sleep(tick)
            if time.monotonic() >= next_sample:
                next_sample += 30
                total, count = _claim_totals(port)
                claim_ms = (total - last_sum) / max(count - last_count, 1) * 1000
                last_sum, last_count = total, count
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT n_live_tup, n_dead_tup, pg_total_relation_size('jobs') "
                        "FROM pg_stat_user_tables WHERE relname = 'jobs'"
                    )
                    live, dead, size = cursor.fetchone()
                    cursor.execute("SELECT count(*) FROM jobs WHERE status = 'pending'")
                    backlog = cursor.fetchone()[0]
                sample = {
                    "t": round(time.monotonic() - started),
                    "claim_ms": round(claim_ms, 3),
                    "live": live,
                    "dead": dead,
                    "size_mb": round(size / 2**20, 1),
                    "backlog": backlog,
                    "rss_mb": round(_rss_mb(worker.pid), 1),
                }
                samples.append(sample)
                print(
                    f"{sample['t']:>6} {sample['claim_ms']:>9.3f} {live:>9} {dead:>8} "
                    f"{sample['size_mb']:>8} {backlog:>8} {sample['rss_mb']:>7}"
                )
    finally:
        worker.terminate()
        worker.wait()
    path = write_results("soak", {"minutes": args.minutes, "rate": args.rate, "samples": samples})
    print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
