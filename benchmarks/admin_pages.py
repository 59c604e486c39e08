"""Admin changelists over a million outbox events and a million jobs: filters, search, paging.

    python benchmarks/admin_pages.py [--rows 1000000] [--database pgoutbox_bench_admin] [--reuse]
        [--page /admin/pgoutbox/outboxevent/ ...]

Fills a database of its own (dropped and made again, unless ``--reuse`` finds it filled) with
``--rows`` events (twenty event types, one of them a subscriber's, and a rare one; 500 pending,
500 dead, the rest processed) and ``--rows`` finished jobs, each with an idempotency key, and a
thousand dead letters. Then renders each page five times through Django's test client and prints
the median, with the status code (302: the admin refused the parameters and sent the browser to
``?e=1``; 400: a lookup the admin does not offer). A statement that runs longer than
``--timeout`` seconds is cancelled and its page reported as such.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import use_database

EVENTS = "/admin/pgoutbox/outboxevent/"
JOBS = "/admin/pgoutbox/job/"
DEAD = "/admin/pgoutbox/deadletter/"


def pages(event_id: str, key: str) -> list[str]:
    return [
        EVENTS,
        EVENTS + "?state=pending",
        EVENTS + "?state=dead",
        EVENTS + "?event_type=tests.projected",
        EVENTS + "?event_type=bench.type.19",
        EVENTS + "?event_type=bench.rare",
        EVENTS + f"?q={event_id}",
        EVENTS + "?q=bench.type",
        EVENTS + "?_facets=True",
        JOBS,
        JOBS + "?o=2",
        JOBS + "?p=100",
        JOBS + "?p=5000",
        JOBS + f"?q={key}",
        JOBS + "?queue=nowhere",
        DEAD,
        DEAD + "?_facets=True",
    ]


def setup(database: str, reuse: bool) -> bool:
    """Point Django at ``database`` and migrate it; True if it already holds the rows."""
    kept = use_database(database, keep=reuse)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT FROM outbox_events)")
        return bool(kept and cursor.fetchone()[0])


#: Ids that grow with ``n``, as the app's UUIDv7 ids grow with time ("newest first" is a
#: backward scan of the primary key), where ``gen_random_uuid()`` would scatter them.
ORDERED_ID = "('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid"


def fill(rows: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, "
            "schema_version, payload, occurred_at, processed_at, dead_at, attempts) "
            f"SELECT {ORDERED_ID}, 'order', gen_random_uuid(), "
            "CASE WHEN n %% 100000 = 7 THEN 'bench.rare' WHEN n %% 20 = 0 THEN 'tests.projected' "
            "ELSE 'bench.type.' || n %% 20 END, 1, "
            "jsonb_build_object('n', n, 'text', repeat('x', 200)), "
            "now() - make_interval(secs => %s - n), "
            "CASE WHEN n <= %s - 1000 THEN now() END, "
            "CASE WHEN n > %s - 500 THEN now() END, 0 "
            "FROM generate_series(1, %s) AS n",
            [rows, rows, rows, rows],
        )
        cursor.execute(
            "INSERT INTO jobs (id, queue, job_type, payload, status, attempts, finished_at, "
            f"idempotency_key) SELECT {ORDERED_ID}, "
            "(ARRAY['default', 'webhooks', 'reports', 'notifications'])[1 + n %% 4], 'bench.job', "
            "jsonb_build_object('n', n), 'completed', 1, now(), 'key-' || n "
            "FROM generate_series(1, %s) AS n",
            [rows],
        )
        cursor.execute(
            "INSERT INTO jobs (id, queue, job_type, payload, status, attempts, finished_at, "
            f"last_error_code, last_error_summary) SELECT {ORDERED_ID}, 'webhooks', 'bench.job', "
            "'{}', 'dead', 3, now(), 'TransientError', 'TransientError: timeout' "
            "FROM generate_series(%s + 1, %s + 1000) AS n",
            [rows, rows],
        )
        cursor.execute("VACUUM ANALYZE outbox_events")
        cursor.execute("VACUUM ANALYZE jobs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database", default="pgoutbox_bench_admin")
    parser.add_argument("--reuse", action="store_true", help="keep the rows of an earlier run")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument(
        "--page", action="append", help="render only these pages (repeat it), as listed"
    )
    args = parser.parse_args()
    if not setup(args.database, args.reuse):
        started = time.perf_counter()
        fill(args.rows)
        print(
            f"filled {args.rows:,} events and {args.rows:,} jobs in "
            f"{time.perf_counter() - started:.0f}s"
        )
    from django.contrib.auth.models import User
    from django.db import connection
    from django.db.backends.signals import connection_created
    from django.test import Client

    def statement_timeout(connection: Any, **kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {int(args.timeout * 1000)}")

    connection_created.connect(statement_timeout, weak=False)
    statement_timeout(connection)  # the test client keeps the connection that set up

    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM outbox_events ORDER BY id LIMIT 1 OFFSET 1000")
        event_id = str(cursor.fetchone()[0])
    user, _ = User.objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    print(f"{'page':<60}{'status':>7}{'median ms':>11}", flush=True)
    for page in pages(event_id, key=f"key-{args.rows // 2}"):
        if args.page and page.replace(event_id, "<event id>") not in args.page:
            continue
        shown = page.replace(event_id, "<event id>")[:59]
        timings = []
        try:
            for _ in range(5):
                begin = time.perf_counter()
                response = client.get(page)
                timings.append((time.perf_counter() - begin) * 1000)
        except Exception as error:  # a statement cancelled by the timeout
            print(
                f"{shown:<60}{'-':>7}  > {args.timeout:.0f} s ({type(error).__name__})", flush=True
            )
            continue
        median = statistics.median(timings)
        print(f"{shown:<60}{response.status_code:>7}{median:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
