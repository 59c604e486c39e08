"""The benchmark suite: django-pgoutbox and its peers, side by side, in one run.

    ./run bench            # the full run (documented in docs/benchmarks.md)
    ./run bench --quick    # a smaller run, for CI

``./run bench`` makes ``.venv-bench`` (this package, and the peers installed from PyPI) and
runs this script in it. Everything runs on one fresh database, ``pgoutbox_bench``, of the server
the tests would use, one measurement at a time. Prints a table and writes JSON to
``benchmarks/results/suite-*.json``.

Measures, each defined the same way for every system:

- enqueue, one job per transaction (jobs/s) and in bulk (jobs/s);
- drain: N pending no-op jobs, one worker process, then two; the rate is N over the time from
  the first job's start to the last job's completion, from each system's own timestamps;
- wake-up latency: an idle worker, jobs enqueued 10 ms apart, each committed on its own;
  enqueue commit to the handler's first line, p50/p95/p99 in ms;
- outbox (django-pgoutbox only: the peers have none): N published events projected into jobs,
  events/s, and commit-to-projection lag;
- the SQL-only ceiling: the worker's claim/complete statement driven without a worker;
- memory and decay over a long drain (full run only): the worker's RSS, and the rate in the last
  tenth of the drain against the first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, pending_noops, runworkers, setup_django, truncate, write_results

PEERS = {
    "procrastinate": "benchmarks/peers/procrastinate_bench.py",
    "pgqueuer": "benchmarks/peers/pgqueuer_bench.py",
    "django-tasks-db": "benchmarks/peers/tasksdb_bench.py",
}

# "peer_jobs": the peers' drains. The slowest peers drain a few hundred jobs a second, so 100,000
# would take hours; their rate does not depend on the backlog's size once the table has
# statistics (each peer's script analyzes it), so they drain 20,000.
FULL = {
    "jobs": 100_000,
    "peer_jobs": 20_000,
    "single": 2_000,
    "latency": 500,
    "events": 10_000,
    "long": 1_000_000,
}
QUICK = {
    "jobs": 10_000,
    # The slowest peers drain 64 to 400 jobs/s (docs/benchmarks.md): 2,000 jobs keep CI's quick
    # run within minutes; the rate is read once the table has statistics, whatever its size.
    "peer_jobs": 2_000,
    "single": 500,
    "latency": 100,
    "events": 2_000,
    "long": 0,
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- django-pgoutbox -------------------------------------------------------------------------------


def enqueue_rates(single: int, bulk: int) -> dict[str, float]:
    from django_pgoutbox import enqueue, enqueue_many

    truncate("jobs")
    started = time.perf_counter()
    for _ in range(single):
        enqueue("tests.noop", {})  # autocommit: each its own transaction
    single_rate = single / (time.perf_counter() - started)
    truncate("jobs")
    items = [{"job_type": "tests.noop", "payload": {}}] * bulk
    started = time.perf_counter()
    enqueue_many(items)
    bulk_rate = bulk / (time.perf_counter() - started)
    truncate("jobs")
    return {"single_per_s": single_rate, "bulk_per_s": bulk_rate}


def drain(jobs: int, processes: int, concurrency: int = 4) -> dict[str, float]:
    from benchmarks import worker as bench_worker

    return bench_worker.drain(jobs, concurrency, processes)


def wakeup(count: int, gap: float) -> dict[str, float]:
    from benchmarks import worker as bench_worker

    result = bench_worker.wakeup(count, gap)
    return {q: result[f"{q}_ms"] for q in ("p50", "p95", "p99", "mean")}


def outbox(events: int, lag_events: int) -> dict[str, Any]:
    from benchmarks import outbox as bench_outbox

    rate = bench_outbox.throughput(events, min(1_000, events))
    delay = bench_outbox.lag(lag_events, 0.01)
    return {
        "events_per_s": rate["events_per_second"],
        "lag_ms": {q: delay[f"{q}_ms"] for q in ("p50", "p95", "p99")},
    }


def ceiling(jobs: int) -> dict[str, float]:
    """The SQL-only ceiling on 1 and 2 connections, in batches of 100 (keys "1", "2") and of
    1,000 ("1@1000", "2@1000"): a worker claims up to 2,000 at a time on two connections."""
    from benchmarks import ceiling as bench_ceiling

    rates = {}
    for batch in (100, 1000):
        for connections in (1, 2):
            key = str(connections) if batch == 100 else f"{connections}@{batch}"
            rates[key] = bench_ceiling.ceiling(jobs, batch, connections)["jobs_per_second"]
    return rates


def top_ceiling(ours: dict[str, Any]) -> float:
    """The highest SQL-only ceiling of the run, which the drain's share is measured against."""
    return max(float(value) for value in ours["ceiling"].values())


def long_drain(jobs: int) -> dict[str, Any]:
    """One worker drains ``jobs``: its RSS every second, and the rate by tenths of the drain."""
    from django.db import connection

    pending_noops(jobs)
    worker = runworkers("--roles", "jobs", "--burst", "--queues", "default")
    rss: list[float] = []
    while worker.poll() is None:
        try:
            status = Path(f"/proc/{worker.pid}/status").read_text()
        except FileNotFoundError:
            break
        for line in status.splitlines():
            # The first reads can come before the interpreter has loaded: skip those.
            if line.startswith("VmRSS:") and int(line.split()[1]) > 10_240:
                rss.append(int(line.split()[1]) / 1024)
        time.sleep(1)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM finished_at) FROM jobs WHERE status = 'completed' "
            "ORDER BY finished_at"
        )
        finished = [row[0] for row in cursor.fetchall()]
    assert len(finished) == jobs, f"only {len(finished)} of {jobs} completed"
    tenth = jobs // 10
    first = tenth / float(finished[tenth - 1] - finished[0])
    last = tenth / float(finished[-1] - finished[-tenth])
    return {
        "jobs": jobs,
        "rss_mb": {
            "start": rss[0] if rss else None,
            "max": max(rss, default=None),
            "end": rss[-1] if rss else None,
        },
        "first_tenth_per_s": first,
        "last_tenth_per_s": last,
        "last_over_first": last / first,
        "overall_per_s": jobs / float(finished[-1] - finished[0]),
    }


# -- the peers -------------------------------------------------------------------------------------


def peer(name: str, sizes: dict[str, int]) -> dict[str, Any]:
    script = ROOT / PEERS[name]
    command = [
        sys.executable,
        str(script),
        "--dsn",
        os.environ["DATABASE_URL"],
        "--jobs",
        str(sizes["peer_jobs"]),
        "--single",
        str(sizes["single"]),
        "--latency-jobs",
        str(sizes["latency"]),
    ]
    log(f"== {name}: {' '.join(command[1:])}")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        log(done.stderr[-3000:])
        return {"error": f"exit status {done.returncode}"}
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# -- the table -------------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def table(ours: dict[str, Any], peers: dict[str, dict[str, Any]]) -> str:
    names = list(peers)
    rows: list[tuple[str, str, list[str]]] = []

    def peer_value(data: dict[str, Any], *path: str) -> float | None:
        current: Any = data
        for key in path:
            if not isinstance(current, dict) or key not in current:
                return None
            current = current[key]
        return float(current) if isinstance(current, int | float) else None

    def best_drain(data: dict[str, Any], workers: str) -> float | None:
        return peer_value(data, "drain", workers, "best")

    rows.append(
        (
            "enqueue, one per transaction (jobs/s)",
            _fmt(ours["enqueue"]["single_per_s"]),
            [_fmt(peer_value(p, "enqueue_single_per_s")) for p in peers.values()],
        )
    )
    rows.append(
        (
            "enqueue, bulk (jobs/s)",
            _fmt(ours["enqueue"]["bulk_per_s"]),
            [_fmt(peer_value(p, "enqueue_bulk_per_s")) for p in peers.values()],
        )
    )
    for workers in ("1", "2"):
        rows.append(
            (
                f"drain, {workers} worker process(es), default (jobs/s)",
                _fmt(ours["drain"][workers]["default"]),
                [_fmt(peer_value(p, "drain", workers, "default")) for p in peers.values()],
            )
        )
        rows.append(
            (
                f"drain, {workers} worker process(es), best (jobs/s)",
                _fmt(ours["drain"][workers]["best"]),
                [_fmt(best_drain(p, workers)) for p in peers.values()],
            )
        )
    for q in ("p50", "p95", "p99"):
        rows.append(
            (
                f"wake-up latency {q} (ms)",
                _fmt(ours["latency_ms"][q], "ms"),
                [_fmt(peer_value(p, "latency_ms", q), "ms") for p in peers.values()],
            )
        )
    width = max(len(r[0]) for r in rows) + 2
    header = f"{'measure':<{width}}{'pgoutbox':>12}" + "".join(f"{n:>18}" for n in names)
    lines = [header, "-" * len(header)]
    for label, value, others in rows:
        lines.append(f"{label:<{width}}{value:>12}" + "".join(f"{o:>18}" for o in others))
    lines.append("")
    lines.append(
        f"outbox projection: {ours['outbox']['events_per_s']:,.0f} events/s; lag p50/p95/p99 "
        f"{ours['outbox']['lag_ms']['p50']:.1f} / {ours['outbox']['lag_ms']['p95']:.1f} / "
        f"{ours['outbox']['lag_ms']['p99']:.1f} ms"
    )
    cap = ours["ceiling"]
    lines.append(
        f"SQL-only ceiling: batches of 100 {cap['1']:,.0f} / {cap['2']:,.0f} jobs/s on 1 / 2 "
        + (
            f"connections, of 1,000 {cap['1@1000']:,.0f} / {cap['2@1000']:,.0f}; "
            if "1@1000" in cap
            else "connections; "
        )
        + f"one worker drains at {ours['drain']['1']['default'] / top_ceiling(ours):.0%} of "
        "the highest (default settings)"
    )
    for name, data in peers.items():
        best = best_drain(data, "1")
        if best:
            lines.append(
                f"drain, 1 process, ours / {name}'s best: "
                f"{ours['drain']['1']['default'] / best:.1f}x (ours with default settings)"
            )
    if ours.get("long"):
        long = ours["long"]
        lines.append(
            f"{long['jobs']:,} jobs, one worker: {long['overall_per_s']:,.0f} jobs/s; last tenth "
            f"at {long['last_over_first']:.0%} of the first; RSS {long['rss_mb']['start']:.0f} -> "
            f"max {long['rss_mb']['max']:.0f} MB"
        )
    lines.append("")
    lines.extend(targets(ours, peers))
    return "\n".join(lines)


def targets(ours: dict[str, Any], peers: dict[str, dict[str, Any]]) -> list[str]:
    """Each target of the suite (docs/benchmarks.md), with the figure that meets it or not."""

    def best(name: str) -> float | None:
        value = peers.get(name, {}).get("drain", {}).get("1", {}).get("best")
        return float(value) if value else None

    drain = ours["drain"]["1"]["default"]
    checks: list[tuple[str, bool | None, str]] = []
    for name, factor in (("pgqueuer", 2), ("procrastinate", 15)):
        theirs = best(name)
        checks.append(
            (
                f"drain >= {factor}x {name}'s best",
                None if theirs is None else drain >= factor * theirs,
                "-" if theirs is None else f"{drain / theirs:.1f}x",
            )
        )
    ratio = drain / top_ceiling(ours)
    checks.append(("drain >= 40% of the SQL-only ceiling", ratio >= 0.4, f"{ratio:.0%}"))
    bulk = ours["enqueue"]["bulk_per_s"]
    checks.append(("enqueue_many >= 100,000 jobs/s", bulk >= 100_000, f"{bulk:,.0f}"))
    single = ours["enqueue"]["single_per_s"]
    others = [p.get("enqueue_single_per_s") for p in peers.values()]
    top = max((float(v) for v in others if v), default=None)
    checks.append(
        (
            "single enqueue >= the best peer",
            None if top is None else single >= top,
            f"{single:,.0f} vs {top or 0:,.0f}",
        )
    )
    latency = ours["latency_ms"]
    checks.append(
        (
            "wake-up p50 <= 2 ms and p99 <= 5 ms",
            latency["p50"] <= 2 and latency["p99"] <= 5,
            f"{latency['p50']:.1f} / {latency['p99']:.1f} ms",
        )
    )
    peer_p50 = [p.get("latency_ms", {}).get("p50") for p in peers.values()]
    best_p50 = min((float(v) for v in peer_p50 if v), default=None)
    checks.append(
        (
            "wake-up p50 no worse than the best peer's",
            None if best_p50 is None else latency["p50"] <= best_p50,
            f"{latency['p50']:.1f} vs {best_p50 or 0:.1f} ms",
        )
    )
    events = ours["outbox"]["events_per_s"]
    checks.append(("outbox >= 10,000 events/s", events >= 10_000, f"{events:,.0f}"))
    if ours.get("long"):
        long = ours["long"]
        checks.append(
            (
                "worker RSS < 150 MB over the long drain",
                long["rss_mb"]["max"] < 150,
                f"max {long['rss_mb']['max']:.0f} MB",
            )
        )
        checks.append(
            (
                "last tenth within 20% of the first",
                long["last_over_first"] >= 0.8,
                f"{long['last_over_first']:.0%}",
            )
        )
    mark = {True: "met", False: "NOT met", None: "n/a"}
    width = max(len(c[0]) for c in checks) + 2
    return ["targets:"] + [
        f"  {label:<{width}}{mark[ok]:<9}{figure}" for label, ok, figure in checks
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run, for CI")
    parser.add_argument("--no-peers", action="store_true", help="django-pgoutbox alone")
    parser.add_argument("--peers", nargs="*", choices=list(PEERS), default=list(PEERS))
    parser.add_argument(
        "--long-only", action="store_true", help="only the 1,000,000-job drain (memory, decay)"
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    setup_django()
    if args.long_only:
        long = long_drain(FULL["long"])
        print(json.dumps(long, indent=2))
        write_results("long-drain", {"long": long, "machine": machine()})
        return

    ours: dict[str, Any] = {}
    log("== enqueue")
    ours["enqueue"] = enqueue_rates(sizes["single"], sizes["jobs"])
    log("== drain")
    ours["drain"] = {}
    for n in (1, 2):
        runs = {c: drain(sizes["jobs"], n, c) for c in (4, 16)}
        best = max(runs, key=lambda c: runs[c]["jobs_per_second"])
        ours["drain"][str(n)] = {
            "default": runs[4]["jobs_per_second"],
            "best": runs[best]["jobs_per_second"],
            "best_config": f"CONCURRENCY {best}",
        }
    log("== wake-up latency")
    ours["latency_ms"] = wakeup(sizes["latency"], 0.01)
    log("== outbox")
    ours["outbox"] = outbox(sizes["events"], sizes["latency"])
    log("== SQL-only ceiling")
    ours["ceiling"] = ceiling(sizes["jobs"])
    if sizes["long"]:
        log(f"== long drain of {sizes['long']:,} jobs")
        ours["long"] = long_drain(sizes["long"])
    peers = {} if args.no_peers else {name: peer(name, sizes) for name in args.peers}

    report = table(ours, peers)
    print(report)
    host = machine()
    print(
        f"server: round trip {host['round_trip_ms']:.3f} ms, one-row insert committed "
        f"{host['one_row_insert_commit_ms']:.3f} ms"
    )
    path = write_results(
        "suite",
        {
            "quick": args.quick,
            "sizes": sizes,
            "pgoutbox": ours,
            "peers": peers,
            "machine": host,
        },
    )
    print(f"written to {path.relative_to(ROOT)}")


def machine() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT version(), current_setting('synchronous_commit'), current_setting('autovacuum')"
        )
        version, sync, autovacuum = cursor.fetchone()
        # What a round trip and a committed one-row write cost on this server: the floor under
        # a single enqueue.
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit (n int)")
        started = time.perf_counter()
        for _ in range(500):
            cursor.execute("SELECT 1")
        round_trip = (time.perf_counter() - started) / 500
        started = time.perf_counter()
        for n in range(500):
            cursor.execute("INSERT INTO bench_commit VALUES (%s)", [n])  # autocommit
        commit = (time.perf_counter() - started) / 500
        cursor.execute("DROP TABLE bench_commit")
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "postgresql": version,
        "synchronous_commit": sync,
        "autovacuum": autovacuum,
        "round_trip_ms": round(round_trip * 1000, 3),
        "one_row_insert_commit_ms": round(commit * 1000, 3),
    }


if __name__ == "__main__":
    main()
