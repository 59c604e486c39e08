"""The drain while a transaction holds the xmin horizon (issue 31), at the SQL level.

    python benchmarks/horizon.py --claim full --jobs 200000 --hold mid
    python benchmarks/horizon.py --claim seek --duration 240 --hold-at 30

Two connections (as two coordinators) drain the ``default`` queue with the package's own
statements, as a queue's lanes send them: RECORD_AND_CLAIM (the outcomes of the last batch, all
completed, and a claim of ``--batch``), or CLAIM_JOBS when there is nothing to record. With
``--claim seek`` each connection keeps a mark, the claim index's key of the last job it claimed,
and claims past it (SEEK_CLAIM_JOBS, RECORD_AND_SEEK_CLAIM), with the full claim under
``SeekPolicy``. No handler runs: this measures the database side only.

``--hold`` opens a REPEATABLE READ transaction on a third connection, takes its snapshot and
leaves it idle in transaction: from the start, from the midpoint (half the jobs done, or half the
duration), or at ``--hold-at`` seconds. It ends with the run.

Two shapes:

- ``--jobs N`` (default): N pending jobs, drained to the end; prints the rate of each tenth of
  the jobs and of each ``--window`` seconds.
- ``--duration S``: a sustained drain for S seconds: a producer keeps ``--backlog`` jobs or more
  pending (inserted in chunks, ids ascending as uuid7's), so that the drain never runs dry;
  prints the rate of each window.

The server this was written on runs with autovacuum off; ``--vacuum-every S`` runs ``VACUUM jobs``
every S seconds on a fourth connection, as autovacuum would under the tables' settings.

The database (``--db``, default ``pgoutbox_horizon``) is dropped and created, and migrated, once
per invocation; ``jobs`` is truncated before each run. ``--runs K`` repeats the run K times,
alternating ``--claim full`` and ``seek`` when ``--claim both``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import completed_outcomes, setup_django

WORKER = "bench-horizon"


@dataclass
class Shared:
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: int = 0
    claimed: int = 0
    inserted: int = 0
    #: (monotonic time, completed so far), appended by the workers
    marks: list[tuple[float, int]] = field(default_factory=list)
    full_claims: int = 0
    #: each coordinator's mark (seek), for --explain
    last_marks: dict[int, Any] = field(default_factory=dict)
    #: each coordinator's last batch, claimed and not recorded when it stopped, for --explain
    last_batches: dict[int, list[tuple[Any, int]]] = field(default_factory=dict)
    seek_claims: int = 0
    claim_seconds: float = 0.0
    full_seconds: float = 0.0
    claims: int = 0

    def add(self, done: int, claimed: int, seconds: float, *, full: bool) -> None:
        with self.lock:
            self.done += done
            self.claimed += claimed
            self.claim_seconds += seconds
            self.claims += 1
            if full:
                self.full_claims += 1
                self.full_seconds += seconds
            else:
                self.seek_claims += 1
            self.marks.append((time.monotonic(), self.done))


def connect(url: str) -> Any:
    import psycopg

    from django_pgoutbox.db import PREPARE_THRESHOLD

    return psycopg.connect(url, autocommit=True, prepare_threshold=PREPARE_THRESHOLD)


def drain(url: str, shared: Shared, args: argparse.Namespace, number: int) -> None:
    """One coordinator: record the last batch's outcomes and claim the next, until stopped or,
    with ``--jobs``, until every job is done."""
    from django_pgoutbox import queries
    from django_pgoutbox.queries import binary, claims

    statements = {
        "CLAIM_JOBS": (queries.DISPATCHED["CLAIM_JOBS"].sql, None),
        "RECORD_AND_CLAIM": (queries.DISPATCHED["RECORD_AND_CLAIM"].sql, False),
    }
    policy: Any = None
    if args.claim == "seek":  # imported only here: --claim full runs on a version without it
        from django_pgoutbox.worker.seek import SeekPolicy

        statements["SEEK_CLAIM_JOBS"] = (binary(claims.SEEK_CLAIM_JOBS), None)
        statements["RECORD_AND_SEEK_CLAIM"] = (binary(claims.RECORD_AND_SEEK_CLAIM), False)
        policy = SeekPolicy()
    worker_id = f"{WORKER}-{number}"
    batch: list[tuple[Any, int]] = []  # (id, attempt) of the jobs claimed last
    idle_since: float | None = None
    with connect(url) as conn, conn.cursor() as cursor:
        while not shared.stop.is_set():
            now = time.monotonic()
            seek = policy is not None and policy.seek(now)
            params: dict[str, Any] = {
                "queue": "default",
                "limit": args.batch,
                "worker_id": worker_id,
                "lease": 300.0,
            }
            if seek:
                params |= policy.params()
            if batch:
                params |= completed_outcomes([b[0] for b in batch], [b[1] for b in batch])
                name = "RECORD_AND_SEEK_CLAIM" if seek else "RECORD_AND_CLAIM"
            else:
                name = "SEEK_CLAIM_JOBS" if seek else "CLAIM_JOBS"
            sql, prepare = statements[name]
            started = time.perf_counter()
            cursor.execute(sql, params, prepare=prepare)
            result = cursor.fetchall()
            elapsed = time.perf_counter() - started
            if batch:
                applied = sum(1 for row in result if not row[0])
                rows = [row[1:] for row in result if row[0]]
            else:
                applied, rows = 0, result
            claimed = [queries.ClaimRow._make(row) for row in rows]
            if policy is not None:
                policy.claimed(
                    claimed, args.batch, full=not seek, seconds=elapsed, now=time.monotonic()
                )
            shared.add(applied, len(claimed), elapsed, full=not seek)
            if policy is not None:
                shared.last_marks[number] = policy.mark
            batch = [(row.id, row.attempt) for row in claimed]
            shared.last_batches[number] = batch
            if not claimed:
                if args.jobs and shared.done >= args.jobs:
                    return
                if idle_since is None:
                    idle_since = now
                time.sleep(0.005)
            else:
                idle_since = None


def relay(url: str, shared: Shared, args: argparse.Namespace, number: int) -> None:
    """One relay, as ``worker.relay`` runs at the SQL level: claim a batch (CLAIM_EVENTS_PLAN,
    CLAIM_EVENTS) in one transaction, then lock the claimed events and mark them processed in
    another (no subscriber runs). With ``--claim seek``, SEEK_CLAIM_EVENTS from the relay's mark,
    with the full claim under ``EventSeekPolicy``, as the relay runs them."""
    from django_pgoutbox import queries

    policy: Any = None
    if args.claim == "seek":  # imported only here: --claim full runs on a version without it
        from django_pgoutbox.worker.relay import EventSeekPolicy

        policy = EventSeekPolicy()

    relay_id = f"{WORKER}-relay-{number}"
    params = {
        "claim_seconds": 60.0,
        "limit": args.batch,
        "max_attempts": 10,
        "relay_id": relay_id,
        "crashed_code": "relay_crashed",
        "dead_summary": "dead",
        "summary": "crashed",
    }
    with connect(url) as conn, conn.cursor() as cursor:
        while not shared.stop.is_set():
            seek = policy is not None and policy.seek(time.monotonic())
            claim_params = params | policy.params() if seek else params
            started = time.perf_counter()
            with conn.transaction():
                cursor.execute(queries.CLAIM_EVENTS_PLAN)
                cursor.execute(
                    queries.SEEK_CLAIM_EVENTS if seek else queries.CLAIM_EVENTS, claim_params
                )
                rows = cursor.fetchall()
            elapsed = time.perf_counter() - started
            if policy is not None:
                keys = [argparse.Namespace(occurred_at=r[7], id=r[0]) for r in rows]
                policy.claimed(
                    keys, args.batch, full=not seek, seconds=elapsed, now=time.monotonic()
                )
            marked = 0
            if rows:
                with conn.transaction():
                    cursor.execute(
                        queries.LOCK_CLAIMED_EVENTS,
                        ["60s", [r[0] for r in rows], [r[10] for r in rows], relay_id],
                    )
                    held = [r[0] for r in cursor.fetchall()]
                    cursor.execute(queries.MARK_EVENTS_PROCESSED, [held])
                    marked = len(held)
            shared.add(marked, len(rows), elapsed, full=not seek)
            if not rows:
                if args.jobs and shared.done >= args.jobs:
                    return
                time.sleep(0.005)


def produce(url: str, shared: Shared, args: argparse.Namespace, start_id: int) -> None:
    """Keep at least ``--backlog`` jobs pending: chunks of ``--backlog // 2``, ids ascending."""
    chunk = max(1, args.backlog // 2)
    next_id = start_id
    with connect(url) as conn:
        while not shared.stop.is_set():
            with shared.lock:
                pending = shared.inserted - shared.claimed
            if pending >= args.backlog:
                time.sleep(0.02)
                continue
            insert(conn, next_id, chunk, outbox=args.outbox, per_aggregate=args.per_aggregate)
            next_id += chunk
            with shared.lock:
                shared.inserted += chunk


def insert(
    conn: Any, first: int, count: int, *, outbox: bool = False, per_aggregate: int = 1
) -> None:
    """``count`` pending no-op jobs of ``default`` (or, ``outbox``, events, ``per_aggregate``
    consecutive ones of each aggregate), ids ``first`` on (uuid7-like: ascending)."""
    if outbox and per_aggregate > 1:
        conn.execute(
            """
            INSERT INTO outbox_events (
                id, aggregate_type, aggregate_id, event_type, schema_version, payload
            )
            SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid,
                   'bench', md5('aggregate ' || (n / %s))::uuid, 'bench.happened', 1,
                   '{}'::jsonb
            FROM generate_series(%s::bigint, %s::bigint) AS n
            """,
            [per_aggregate, first, first + count - 1],
        )
        return
    if outbox:
        conn.execute(
            """
            INSERT INTO outbox_events (
                id, aggregate_type, aggregate_id, event_type, schema_version, payload
            )
            SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid,
                   'bench', gen_random_uuid(), 'bench.happened', 1, '{}'::jsonb
            FROM generate_series(%s::bigint, %s::bigint) AS n
            """,
            [first, first + count - 1],
        )
        return
    conn.execute(
        """
        INSERT INTO jobs (id, queue, job_type, payload)
        SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid,
               'default', 'bench.noop', '{}'::jsonb
        FROM generate_series(%s::bigint, %s::bigint) AS n
        """,
        [first, first + count - 1],
    )


def vacuum(url: str, shared: Shared, every: float, args: argparse.Namespace) -> None:
    with connect(url) as conn:
        while not shared.stop.wait(every):
            conn.execute("VACUUM outbox_events" if args.outbox else "VACUUM jobs")


def held_horizon_info(url: str) -> str:
    with connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), max(age(backend_xmin)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND state = 'idle in transaction'"
            " AND backend_xmin IS NOT NULL"
        ).fetchone()
    return f"{row[0]} idle-in-transaction session(s) holding xmin (age {row[1]})"


def explain(url: str, mark: Any, batch: list[tuple[Any, int]]) -> None:
    """EXPLAIN ANALYZE the full claim and, with a mark, the seek claim, rolled back."""
    import psycopg

    from django_pgoutbox import queries
    from django_pgoutbox.queries import claims

    params: dict[str, Any] = {"queue": "default", "limit": 100, "worker_id": "x", "lease": 1.0}
    plans = [("CLAIM_JOBS", queries.CLAIM_JOBS, params)]
    if batch:
        plans.append(
            (
                "RECORD_OUTCOMES",
                queries.RECORD_OUTCOMES,
                {
                    **completed_outcomes([b[0] for b in batch], [b[1] for b in batch]),
                    "worker_id": f"{WORKER}-0",
                },
            )
        )
    if mark is not None:
        plans.append(
            (
                "SEEK_CLAIM_JOBS",
                claims.SEEK_CLAIM_JOBS,
                params
                | dict(
                    zip(
                        ("mark_priority", "mark_run_at", "mark_created_at", "mark_id"),
                        mark,
                        strict=True,
                    )
                ),
            )
        )
    with connect(url) as conn:
        for name, sql, p in plans:
            try:
                with conn.transaction():
                    lines = [
                        r[0]
                        for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, p)
                    ]
                    raise psycopg.Rollback()
            finally:
                pass
            keep = [
                line
                for line in lines
                if "Scan" in line or "Buffers" in line or "Execution" in line or "Join" in line
            ]
            print(f"  EXPLAIN {name}:\n    " + "\n    ".join(keep[:14] + keep[-1:]))


def run(url: str, args: argparse.Namespace, claim: str) -> dict[str, Any]:
    args = argparse.Namespace(**{**vars(args), "claim": claim})
    shared = Shared()
    with connect(url) as conn:
        table = "outbox_events" if args.outbox else "jobs"
        conn.execute(f"TRUNCATE {table} CASCADE")  # outbox_deliveries refers to outbox_events
        initial = args.jobs or args.backlog
        for start in range(0, initial, 100_000):
            insert(
                conn,
                start + 1,
                min(100_000, initial - start),
                outbox=args.outbox,
                per_aggregate=args.per_aggregate,
            )
        conn.execute(f"VACUUM ANALYZE {table}")
    shared.inserted = initial
    hold_at: float | None
    if args.hold == "none":
        hold_at = None
    elif args.hold == "start":
        hold_at = 0.0
    elif args.hold_at is not None:
        hold_at = args.hold_at
    else:
        hold_at = None if args.jobs else args.duration / 2  # --jobs: at half the jobs done
    holder = connect(url)
    held_from: float | None = None
    threads = [
        threading.Thread(
            target=relay if args.outbox else drain, args=(url, shared, args, i), daemon=True
        )
        for i in range(args.connections)
    ]
    if args.duration:
        threads.append(
            threading.Thread(target=produce, args=(url, shared, args, initial + 1), daemon=True)
        )
    if args.vacuum_every:
        threads.append(
            threading.Thread(
                target=vacuum, args=(url, shared, args.vacuum_every, args), daemon=True
            )
        )

    def hold() -> float:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class").fetchone()  # the snapshot is taken
        return time.monotonic()

    started = time.monotonic()
    if hold_at == 0.0:
        held_from = hold()
    for thread in threads:
        thread.start()
    windows: list[float] = []
    last_t, last_done, last_claims = started, 0, (0, 0.0, 0, 0.0)
    next_window = started + args.window
    hold_text = args.hold if args.hold_at is None else f"at {args.hold_at:g} s"
    what = "relay" if args.outbox else claim
    print(f"  {'t (s)':>6} {'rows/s':>8} {'done':>9}  ({what}, hold {hold_text})", flush=True)
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        with shared.lock:
            done = shared.done
            claims = (shared.claims, shared.claim_seconds, shared.full_claims, shared.full_seconds)
        if held_from is None and hold_at is not None and now - started >= hold_at:
            held_from = hold()
        mid = held_from is None and hold_at is None and args.hold == "mid" and args.jobs
        if mid and done >= args.jobs // 2:
            held_from = hold()
        finished = (args.jobs and done >= args.jobs) or (
            args.duration and now - started >= args.duration
        )
        if now >= next_window or finished:
            rate = (done - last_done) / (now - last_t)
            windows.append(rate)
            held = "" if held_from is None else f"  held {now - held_from:5.0f} s"
            n, secs, n_full, full_secs = (a - b for a, b in zip(claims, last_claims, strict=True))
            # per window: ms per claim; full claims (count, share of the window's time)
            detail = f"  {1000 * secs / max(1, n):6.1f} ms/claim"
            if n_full and n_full != n:
                detail += f", {n_full} full ({full_secs / (now - last_t):.0%} of the time)"
            print(f"  {now - started:6.1f} {rate:8.0f} {done:9d}{held}{detail}", flush=True)
            last_t, last_done, last_claims = now, done, claims
            next_window += args.window
        if finished:
            break
    shared.stop.set()
    for thread in threads:
        thread.join(timeout=60)
    horizon_note = held_horizon_info(url)
    if args.explain and not args.outbox:
        explain(url, shared.last_marks.get(0), shared.last_batches.get(0, []))
    holder.rollback()
    holder.close()
    elapsed = time.monotonic() - started
    result: dict[str, Any] = {
        "claim": claim,
        "seconds": elapsed,
        "done": shared.done,
        "rate": shared.done / elapsed,
        "windows": windows,
        "claims": shared.claims,
        "full_claims": shared.full_claims,
        "seek_claims": shared.seek_claims,
        "ms_per_claim": 1000 * shared.claim_seconds / max(1, shared.claims),
        "held_from": None if held_from is None else held_from - started,
        "note": horizon_note,
    }
    if args.jobs:
        tenths = []
        prev_t, prev_n = started, 0
        for k in range(1, 11):
            target = args.jobs * k // 10
            t = next(t for t, n in shared.marks if n >= target)
            tenths.append((target - prev_n) / (t - prev_t) if t > prev_t else float("inf"))
            prev_t, prev_n = t, target
        result["tenths"] = tenths
        print("  tenths (jobs/s): " + " ".join(f"{r:.0f}" for r in tenths))
    print(
        f"  {claim}: {result['rate']:.0f} jobs/s over {elapsed:.1f} s; {shared.claims} claims "
        f"({shared.full_claims} full, {shared.full_seconds:.1f} s), "
        f"{result['ms_per_claim']:.2f} ms each; {horizon_note}",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claim", choices=["full", "seek", "both"], default="both")
    parser.add_argument(
        "--outbox", action="store_true", help="the relay's claim of outbox events instead"
    )
    parser.add_argument(
        "--per-aggregate",
        type=int,
        default=1,
        help="--outbox: this many consecutive events of each aggregate (1: one each)",
    )
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--hold", choices=["none", "start", "mid"], default="mid")
    parser.add_argument("--hold-at", type=float, default=None, help="seconds into the run")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--connections", type=int, default=2)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--vacuum-every", type=float, default=0.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--explain", action="store_true", help="EXPLAIN the claims at the end")
    parser.add_argument("--db", default="pgoutbox_horizon")
    args = parser.parse_args()
    if not args.duration and not args.jobs:
        args.jobs = 200_000
    setup_django(args.db)
    from django.db import connection

    url = connection.settings_dict
    dsn = (
        f"host={url['HOST'] or '127.0.0.1'} port={url['PORT'] or 5432} "
        f"user={url['USER']} dbname={url['NAME']}"
    )
    if url.get("PASSWORD"):
        dsn += f" password={url['PASSWORD']}"
    connection.close()
    claims = ["full", "seek"] if args.claim == "both" else [args.claim]
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in claims}
    for i in range(args.runs):
        for claim in claims if i % 2 == 0 else claims[::-1]:
            results[claim].append(run(dsn, args, claim))
    if args.runs > 1:
        for claim, rs in results.items():
            print(
                f"{claim}: median {statistics.median(r['rate'] for r in rs):.0f} jobs/s "
                f"over {len(rs)} runs: " + ", ".join(f"{r['rate']:.0f}" for r in rs)
            )
            if rs and "tenths" in rs[0]:
                med = [statistics.median(r["tenths"][k] for r in rs) for k in range(10)]
                print("  median tenths: " + " ".join(f"{r:.0f}" for r in med))
            n = min(len(r["windows"]) for r in rs)
            med = [statistics.median(r["windows"][k] for r in rs) for k in range(n)]
            print("  median windows: " + " ".join(f"{r:.0f}" for r in med))


if __name__ == "__main__":
    main()
