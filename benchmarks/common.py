"""What the benchmarks share: a fresh database, runworkers processes, percentiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
#: The benchmarks' database (dropped and made again by most): ``PGOUTBOX_BENCH_DB`` if set.
BENCH_DB = os.environ.get("PGOUTBOX_BENCH_DB", "pgoutbox_bench")


def setup_django(name: str = BENCH_DB) -> None:
    """Point DATABASE_URL at a fresh database ``name`` (default ``pgoutbox_bench``), set Django
    up, migrate."""
    use_database(name, keep=False)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def use_database(name: str, *, keep: bool) -> bool:
    """Point DATABASE_URL at database ``name`` and set Django up (not migrated). ``keep``: a
    database of that name is kept as it is (a benchmark's ``--reuse``), else it is dropped and
    made again. Returns whether it was kept."""
    sys.path.insert(0, str(ROOT))
    import psycopg
    from psycopg import sql

    from testproject.database import database_url, maintenance_url

    base = maintenance_url(database_url())
    with psycopg.connect(base, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        kept = keep and exists is not None
        if not kept:
            ident = sql.Identifier(name)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    os.environ["DATABASE_URL"] = urlunsplit(urlsplit(base)._replace(path=f"/{name}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("PGOUTBOX_DEBUG", "0")
    import django

    django.setup()
    return kept


def truncate(*tables: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        # CASCADE: outbox_deliveries refers to outbox_events.
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


def pending_noops(
    jobs: int, job_type: str = "tests.noop", payload: dict[str, Any] | None = None
) -> None:
    """An empty jobs table, then ``jobs`` pending no-op jobs (or of ``job_type`` with
    ``payload``) with fresh statistics.

    Enqueued 100,000 at a time; ``VACUUM ANALYZE`` after, since this development server runs
    with autovacuum off and a claim planned without statistics may sort the whole backlog.
    """
    from django.db import connection

    from django_pgoutbox import enqueue_many

    truncate("jobs")
    for start in range(0, jobs, 100_000):
        batch = min(100_000, jobs - start)
        enqueue_many([{"job_type": job_type, "payload": payload or {}}] * batch)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs")


def drain_seconds(jobs: int) -> float:
    """The drain's time by the database clock, first claim to last outcome; checks that all
    ``jobs`` completed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'completed'), "
            "extract(epoch FROM max(finished_at) - min(locked_at)) FROM jobs"
        )
        total, completed, window = cursor.fetchone()
    assert completed == total == jobs, f"{completed} of {jobs} completed ({total} in the table)"
    return float(window)


def runworkers(*args: str, settings: dict[str, Any] | None = None) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PGOUTBOX_TEST_SETTINGS": json.dumps(settings or {}),
        "PGOUTBOX_DEBUG": "0",
    }
    command = [sys.executable, str(ROOT / "manage.py"), "runworkers", "-v", "0", *args]
    return subprocess.Popen(command, cwd=ROOT, env=env)


def completed_outcomes(ids: list[Any], attempts: list[int]) -> dict[str, Any]:
    """RECORD_OUTCOMES's parameters (but ``worker_id``) for attempts that all completed."""
    n = len(ids)
    return {
        "ids": ids,
        "attempts": attempts,
        "statuses": ["completed"] * n,
        "gives_back_attempt": [False] * n,
        "delays": [0.0] * n,
        "codes": [None] * n,
        "summaries": [None] * n,
        "results": [None] * n,
        "notify": True,
        "progress": [None] * n,
        "meta": [None] * n,
        "traces": [],
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def write_results(name: str, results: dict[str, Any]) -> Path:
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps({"when": datetime.now(UTC).isoformat(), **results}, indent=2))
    return path
