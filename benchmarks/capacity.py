"""What one job and one event cost the database: WAL, row versions and bytes, phase by phase.

    python benchmarks/capacity.py [--jobs 100000] [--single 5000] [--events 20000]

The figures that docs/operations.md ("Capacity") turns into jobs per day per primary. Runs on a
cluster of its own (``tests/reliability/cluster.py``: initdb on a free port, deleted at the end)
with production's durability settings (``fsync``, ``full_page_writes`` and ``synchronous_commit``
on, autovacuum on), never on the shared server. Each phase starts after a ``CHECKPOINT``, so
that the first write to each page carries its full-page image, as it does once per checkpoint
in production: the WAL figures are the upper side of steady state.

Phases, each measured by ``pg_current_wal_lsn()`` before and after and by the ``jobs`` table's
counters in ``pg_stat_user_tables`` (inserts, updates, deletes, hot updates):

- ``enqueue()`` one job per transaction (``--single`` of them);
- ``enqueue_many()`` of ``--jobs`` (one ``COPY``);
- the drain of all of them by one ``runworkers --burst`` process (claim, then outcome);
- ``prune()`` of the completed jobs (``RETENTION`` at one second), then ``VACUUM jobs``;
- ``publish()`` of ``--events`` events (100 per transaction), each projected into a job by one
  relay process (``tests.to_job``), and their jobs drained.

Prints one line per phase: WAL bytes per job (or event), row versions written per job, and the
table's and its indexes' size per pending job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, runworkers

#: Production's durability, and autovacuum on; the rest as initdb leaves it.
SETTINGS = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "autovacuum": "on",
}


def wal_lsn(cursor: Any) -> int:
    cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(cursor.fetchone()[0])


def counters(cursor: Any, table: str) -> dict[str, int]:
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute(
        "SELECT n_tup_ins, n_tup_upd, n_tup_del, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relname = %s",
        [table],
    )
    ins, upd, dele, hot = cursor.fetchone()
    return {"inserts": ins, "updates": upd, "deletes": dele, "hot_updates": hot}


class Phase:
    """WAL and the table's row counters around a block; ``per`` units of work done in it."""

    def __init__(self, name: str, per: int, table: str = "jobs") -> None:
        self.name, self.per, self.table = name, per, table

    def __enter__(self) -> Phase:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
            self.before = counters(cursor, self.table)
            self.lsn = wal_lsn(cursor)
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        from django.db import connection

        self.seconds = time.perf_counter() - self.started
        with connection.cursor() as cursor:
            self.wal = wal_lsn(cursor) - self.lsn
            after = counters(cursor, self.table)
        self.rows = {key: after[key] - self.before[key] for key in after}

    def report(self) -> dict[str, Any]:
        written = self.rows["inserts"] + self.rows["updates"] + self.rows["deletes"]
        line = {
            "phase": self.name,
            "units": self.per,
            "seconds": round(self.seconds, 2),
            "wal_bytes_per_unit": round(self.wal / self.per),
            "row_versions_per_unit": round(written / self.per, 2),
            "hot_share": round(self.rows["hot_updates"] / self.rows["updates"], 2)
            if self.rows["updates"]
            else None,
        }
        hot = "" if line["hot_share"] is None else f", HOT {line['hot_share']}"
        print(
            f"{self.name:<44} {line['wal_bytes_per_unit']:>7,} B WAL/unit  "
            f"{line['row_versions_per_unit']:>5} row versions/unit  "
            f"({self.per:,} in {self.seconds:.1f} s{hot})",
            flush=True,
        )
        return line


def wait_until(sql: str, timeout: float = 900) -> None:
    from django.db import connection

    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(sql)
            if cursor.fetchone()[0]:
                return
            assert time.monotonic() < deadline, f"not reached within {timeout} s: {sql}"
            time.sleep(0.2)


def burst(*args: str, settings: dict[str, Any] | None = None) -> None:
    process = runworkers("--burst", *args, settings=settings)
    assert process.wait(timeout=1800) == 0, "the worker failed"


def measure(jobs: int, single: int, events: int) -> dict[str, Any]:
    from django.db import connection, transaction
    from django.test import override_settings

    from django_pgoutbox import enqueue, enqueue_many, publish
    from django_pgoutbox.maintenance import prune

    lines = []
    with Phase("enqueue(), one job per transaction", single) as phase:
        for _ in range(single):
            enqueue("tests.noop", {})
    lines.append(phase.report())
    with Phase("enqueue_many() (COPY)", jobs) as phase:
        enqueue_many([{"job_type": "tests.noop", "payload": {}}] * jobs)
    lines.append(phase.report())
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs")
        cursor.execute(
            "SELECT pg_relation_size('jobs'), pg_indexes_size('jobs'), count(*) FROM jobs"
        )
        heap, indexes, pending = cursor.fetchone()
    sizes = {
        "heap_bytes_per_pending_job": round(heap / pending),
        "index_bytes_per_pending_job": round(indexes / pending),
    }
    print(
        f"{'pending jobs on disk':<44} {sizes['heap_bytes_per_pending_job']:>7,} B heap/job, "
        f"{sizes['index_bytes_per_pending_job']:,} B indexes/job ({pending:,} jobs)",
        flush=True,
    )
    total = jobs + single
    with Phase("drain: claim and outcome (one worker)", total) as phase:
        burst("--roles", "jobs", "--queues", "default")
    lines.append(phase.report())
    wait_until("SELECT count(*) = 0 FROM jobs WHERE status <> 'completed'")
    retention = {"COMPLETED_JOBS": timedelta(seconds=1), "PROCESSED_EVENTS": timedelta(seconds=1)}
    time.sleep(1.5)  # the retention's second, the shortest it takes
    with (
        Phase("prune() the completed jobs", total) as phase,
        override_settings(PGOUTBOX={"RETENTION": retention}),
    ):
        while prune().completed_jobs:
            pass
    lines.append(phase.report())
    with Phase("VACUUM jobs after the prune", total) as phase, connection.cursor() as cursor:
        cursor.execute("VACUUM jobs")
    lines.append(phase.report())

    aggregates = [uuid.uuid4() for _ in range(max(1, events // 20))]
    with Phase("publish(), 100 events per transaction", events, "outbox_events") as phase:
        for start in range(0, events, 100):
            with transaction.atomic():
                for n in range(start, min(events, start + 100)):
                    publish(
                        "tests.to_job",
                        aggregate_type="bench",
                        aggregate_id=aggregates[n % len(aggregates)],
                        payload={"n": n},
                    )
    lines.append(phase.report())
    with Phase("relay: event processed, its job enqueued", events, "outbox_events") as phase:
        relay = runworkers("--roles", "relay")
        try:
            wait_until("SELECT count(*) = 0 FROM outbox_events WHERE processed_at IS NULL")
        finally:
            relay.terminate()
            relay.wait(timeout=60)
    lines.append(phase.report())
    with Phase("the projected jobs drained", events) as phase:
        burst("--roles", "jobs", "--queues", "default")
    lines.append(phase.report())
    return {"phases": lines, "sizes": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=5_000)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()

    from tests.reliability.cluster import own_cluster

    with own_cluster(settings=SETTINGS) as cluster:
        os.environ["DATABASE_URL"] = cluster.migrated_database("capacity")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
        os.environ.setdefault("PGOUTBOX_DEBUG", "0")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        with cluster.connect() as conn:
            version = conn.execute("SHOW server_version").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}, {json.dumps(SETTINGS)}", flush=True)
        result = measure(args.jobs, args.single, args.events)
        from django.db import connections

        connections.close_all()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
