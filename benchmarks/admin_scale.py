"""Every admin page at scale: ten million jobs, a million of them dead, and a million events.

    python benchmarks/admin_scale.py [--jobs 100000] [--events 10000] [--database NAME]
        [--reuse] [--timeout 30] [--runs 5] [--explain] [--page SUBSTRING ...]

Fills a database of its own (``pgoutbox_bench_scale`` unless ``--database``; dropped and made
again unless ``--reuse`` finds it filled with as many rows) with ``--jobs`` jobs: a tenth dead
across the configured queues, job types and error codes (with ids and numbers in their
summaries), a few per thousand pending or retrying, one in ten thousand leased, a few cancelled,
the rest completed, each with a payload of about 300 bytes, and one dead letter whose payload is
a megabyte; ``--events`` outbox events (a few per thousand pending, failing or dead, the rest
processed), a delivery for one event in twenty, an inbox message for one in ten, a few schedule
cursors, heartbeats and a paused queue. Indexes are dropped while the rows go in and made again
after; then ``VACUUM ANALYZE``. The default sizes make a quick run; the figures of docs/admin.md
are of ``--jobs 10000000 --events 1000000``.

Then it renders every page of every model that the admin site registers, each ``--runs`` times
through Django's test client: the changelist, each choice of each of its filters, the search by
a row's id and by each searched column, the deepest page served, the sort by each sortable column
(both ways), the confirmation page of each bulk action with "select all", a row's detail, history
and delete pages; the queues overview and the admin index. It prints the status and the median,
flagging a page over ``--limit`` ms (a page whose first render takes over ``--patience`` ms is
rendered once, and marked so); with ``--explain`` it then prints, for each flagged page, its
statements over 20 ms with their ``EXPLAIN (ANALYZE, BUFFERS)`` plans. A statement that runs
longer than ``--timeout`` seconds is cancelled and its page reported as such.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Ids that grow with ``n``, as the app's UUIDv7 ids grow with time ("newest first" is a
#: backward scan of the primary key), where ``gen_random_uuid()`` would scatter them.
ORDERED_ID = "('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid"
#: The queues as often as their jobs come (index 1 + hash % 16): a mix, every queue in it.
QUEUE_MIX = (
    "(ARRAY['default', 'default', 'default', 'default', 'notifications', 'notifications', "
    "'notifications', 'webhooks', 'webhooks', 'webhooks', 'critical_alerts', "
    "'location_derivation', 'location_derivation', 'reports', 'exports', 'maintenance'])"
    "[1 + (n * 7) %% 16]"
)
ERROR_CODES = (
    "(ARRAY['TransientError', 'TimeoutError', 'ConnectionError', 'HTTPError', 'ValueError', "
    "'KeyError', 'unknown_job_type', 'lease_expired', 'IntegrityError', 'PermanentError'])"
    "[1 + (n / 10) %% 10]"
)
SPREAD_SECONDS = 30 * 86400  # the jobs and events of the last thirty days
CHUNK_ROWS = 1_000_000


def setup(database: str, reuse: bool, expected: str) -> bool:
    """Point Django at ``database`` and migrate it; True if it holds the rows of ``expected``."""
    import psycopg
    from psycopg import sql

    from testproject.database import database_url, maintenance_url

    base = maintenance_url(database_url())
    os.environ["DATABASE_URL"] = urlunsplit(urlsplit(base)._replace(path=f"/{database}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("PGOUTBOX_DEBUG", "0")
    filled = False
    with psycopg.connect(base, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if reuse and exists:
            with psycopg.connect(os.environ["DATABASE_URL"]) as db:
                found = db.execute("SELECT obj_description(to_regclass('jobs'), 'pg_class')")
                filled = found.fetchone() == (expected,)
        if not filled:
            ident = sql.Identifier(database)
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return filled


@contextmanager
def indexes_rebuilt(cursor: Any, table: str) -> Iterator[None]:
    """Drop ``table``'s indexes and unique constraints but its primary key, then make them again
    from their own definitions: one sorted build each, not ten million random insertions."""
    cursor.execute(
        "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), c.conname, "
        "pg_get_constraintdef(c.oid) FROM pg_index i "
        "LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid "
        "WHERE i.indrelid = %s::regclass AND NOT i.indisprimary",
        [table],
    )
    found = cursor.fetchall()
    for index, _, constraint, _ in found:
        if constraint:
            cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{constraint}"')
        else:
            cursor.execute(f"DROP INDEX {index}")
    yield
    for _, definition, constraint, constraint_definition in found:
        if constraint:
            cursor.execute(
                f'ALTER TABLE {table} ADD CONSTRAINT "{constraint}" {constraint_definition}'
            )
        else:
            cursor.execute(definition)


def _chunks(total: int) -> Iterator[tuple[int, int]]:
    for start in range(1, total + 1, CHUNK_ROWS):
        yield start, min(total, start + CHUNK_ROWS - 1)


def fill_jobs(cursor: Any, jobs: int) -> None:
    # The newest jobs are the unfinished ones: about one in two hundred pending or retrying,
    # one in ten thousand leased. Of the others, one in ten dead, one in two hundred cancelled.
    active = max(1, jobs // 180)
    leased = max(1, jobs // 10_000)
    when = "now() - make_interval(secs => (%(jobs)s - n)::float8 * %(spread)s / %(jobs)s)"
    status = (
        "CASE WHEN n %% 10 = 3 THEN 'dead' "
        "WHEN n > %(jobs)s - %(leased)s THEN 'leased' "
        "WHEN n > %(jobs)s - %(active)s THEN "
        "CASE WHEN n %% 5 = 0 THEN 'retrying' ELSE 'pending' END "
        "WHEN n %% 200 = 7 THEN 'cancelled' ELSE 'completed' END"
    )
    statement = f"""
        INSERT INTO jobs (id, organization_id, queue, job_type, payload, idempotency_key, status,
            priority, run_at, attempts, max_attempts, locked_at, locked_by, last_error_code,
            last_error_summary, completed_at, created_at, lease_expires_at, finished_at,
            worker_ids)
        SELECT {ORDERED_ID}, organization_id, queue, queue || '.' || (ARRAY['deliver', 'build',
            'send', 'sync'])[1 + (n / 3) %% 4], payload, key, status, (n %% 3) - 1,
            CASE WHEN status = 'retrying' THEN now() + make_interval(secs => n %% 600)
                ELSE created END,
            CASE status WHEN 'completed' THEN 1 WHEN 'dead' THEN 10 WHEN 'cancelled' THEN 0
                WHEN 'pending' THEN 0 ELSE 1 + n %% 3 END,
            10,
            CASE WHEN status = 'leased' THEN now() END,
            CASE WHEN status = 'leased' THEN 'host-' || n %% 4 || ':' || 1000 + n %% 7 END,
            CASE WHEN status IN ('dead', 'retrying') THEN code END,
            CASE WHEN status IN ('dead', 'retrying') THEN code || ': order ' || n %% 1000003
                || ' of customer ' || n %% 65537 || ' failed at https://partner-' || n %% 97
                || '.example.com/hooks/' || n || ': 503 Service Unavailable after 30 s' END,
            CASE WHEN status = 'completed' THEN created + interval '2 seconds' END,
            created,
            CASE WHEN status = 'leased' THEN now() + interval '5 minutes' END,
            CASE WHEN status IN ('completed', 'dead', 'cancelled')
                THEN created + interval '2 seconds' END,
            CASE WHEN status IN ('pending', 'cancelled') THEN '[]'::jsonb
                ELSE jsonb_build_array('host-' || n %% 4 || ':' || 1000 + n %% 7) END
        FROM (
            SELECT n, {QUEUE_MIX} AS queue, {when} AS created, {status} AS status,
                {ERROR_CODES} AS code,
                CASE WHEN n %% 3 = 0 THEN NULL ELSE ('00000000-0000-4000-8000-'
                    || lpad(to_hex(n %% 50), 12, '0'))::uuid END AS organization_id,
                CASE WHEN n %% 4 <> 1 THEN 'order-' || n || '-paid' END AS key,
                jsonb_build_object('order_id', n, 'customer_id', n %% 65537, 'url',
                    'https://partner-' || n %% 97 || '.example.com/hooks/' || n, 'amount_cents',
                    (n * 7) %% 100000, 'currency', 'EUR', 'note', repeat('lorem ipsum ', 16))
                    AS payload
            FROM generate_series(%(start)s, %(end)s) AS n
        ) AS rows
    """
    with indexes_rebuilt(cursor, "jobs"):
        for start, end in _chunks(jobs):
            cursor.execute(
                statement,
                {
                    "jobs": jobs,
                    "active": active,
                    "leased": leased,
                    "spread": SPREAD_SECONDS,
                    "start": start,
                    "end": end,
                },
            )
            print(f"  jobs: {end:,} of {jobs:,}", flush=True)
        # A dead letter whose payload is a megabyte of hex that does not compress much.
        cursor.execute(
            f"""
            INSERT INTO jobs (id, queue, job_type, payload, status, attempts, last_error_code,
                last_error_summary, finished_at)
            SELECT {ORDERED_ID}, 'exports', 'exports.build',
                jsonb_build_object('blob', (SELECT string_agg(md5(i::text), '')
                    FROM generate_series(1, 32768) AS i)),
                'dead', 10, 'PermanentError', 'PermanentError: export ' || n || ' too big', now()
            FROM (SELECT %s::bigint AS n) AS one
            """,
            [jobs + 1],
        )
        print("  jobs: indexes", flush=True)


def fill_outbox(cursor: Any, events: int) -> None:
    # The newest events are the unprocessed ones (one in five hundred, a third of them failing);
    # one in a thousand is dead, scattered. Five events an aggregate; one in twenty of them of a
    # subscriber's type ('tests.projected'), the others of types no subscriber takes.
    pending = max(1, events // 500)
    when = "now() - make_interval(secs => (%(events)s - n)::float8 * %(spread)s / %(events)s)"
    statement = f"""
        INSERT INTO outbox_events (id, organization_id, aggregate_type, aggregate_id, event_type,
            schema_version, payload, occurred_at, available_at, claimed_at, claimed_by,
            processed_at, attempts, last_error, last_error_code, dead_at)
        SELECT {ORDERED_ID}, NULL, aggregate_type,
            ('00000000-0000-4000-9000-' || lpad(to_hex(n / 5), 12, '0'))::uuid,
            CASE WHEN n %% 20 = 0 THEN 'tests.projected'
                ELSE aggregate_type || '.' || (ARRAY['created', 'updated', 'paid', 'shipped',
                    'cancelled', 'refunded'])[1 + n %% 6] END,
            1,
            jsonb_build_object('id', n / 5, 'customer_id', n %% 65537, 'total_cents',
                (n * 7) %% 100000, 'currency', 'EUR', 'lines', jsonb_build_array(
                jsonb_build_object('sku', 'SKU-' || n %% 9973, 'quantity', 1 + n %% 4),
                jsonb_build_object('sku', 'SKU-' || n %% 7919, 'quantity', 1)),
                'note', repeat('lorem ipsum ', 8)),
            occurred, occurred + CASE WHEN failing THEN interval '10 minutes' ELSE '0' END,
            CASE WHEN failing OR dead THEN occurred END,
            CASE WHEN failing OR dead THEN 'relay-' || n %% 2 END,
            CASE WHEN NOT (dead OR n > %(events)s - %(pending)s) THEN occurred
                + interval '1 second' END,
            CASE WHEN dead THEN 10 WHEN failing THEN 1 + n %% 5 ELSE 1 END,
            CASE WHEN dead OR failing THEN 'TimeoutError: projection of event ' || n
                || ' timed out after 30 s' END,
            CASE WHEN dead OR failing THEN 'TimeoutError' END,
            CASE WHEN dead THEN occurred + interval '5 minutes' END
        FROM (
            SELECT n, {when} AS occurred, (ARRAY['order', 'customer', 'invoice'])[1 + n %% 3]
                AS aggregate_type, n %% 1000 = 500 AS dead,
                n %% 1000 <> 500 AND n > %(events)s - %(pending)s AND n %% 3 = 0 AS failing
            FROM generate_series(%(start)s, %(end)s) AS n
        ) AS rows
    """
    with indexes_rebuilt(cursor, "outbox_events"):
        for start, end in _chunks(events):
            cursor.execute(
                statement,
                {
                    "events": events,
                    "pending": pending,
                    "spread": SPREAD_SECONDS,
                    "start": start,
                    "end": end,
                },
            )
            print(f"  events: {end:,} of {events:,}", flush=True)
        print("  events: indexes", flush=True)
    # A delivery of every twentieth event (those of 'tests.projected') to one of its subscribers;
    # one in a hundred dead, the undelivered ones the newest.
    with indexes_rebuilt(cursor, "outbox_deliveries"):
        cursor.execute(
            f"""
            INSERT INTO outbox_deliveries (event_id, subscriber, aggregate_type, aggregate_id,
                occurred_at, created_at, available_at, attempts, delivered_at, dead_at,
                last_error_code, last_error)
            SELECT e.id, (ARRAY['tests.projected', 'audit.orders', 'search.index',
                    'mail.receipts'])[1 + (n / 20) %% 4],
                e.aggregate_type, e.aggregate_id, e.occurred_at, e.occurred_at, e.occurred_at,
                CASE WHEN n %% 2000 = 100 THEN 10 ELSE 1 END,
                CASE WHEN n %% 2000 <> 100 AND n <= %(events)s - %(pending)s
                    THEN e.occurred_at + interval '3 seconds' END,
                CASE WHEN n %% 2000 = 100 THEN e.occurred_at + interval '5 minutes' END,
                CASE WHEN n %% 2000 = 100 THEN 'HTTPError' END,
                CASE WHEN n %% 2000 = 100 THEN 'HTTPError: 503 from the search index for '
                    || n END
            FROM generate_series(20, %(events)s, 20) AS n
            JOIN outbox_events AS e ON e.id = {ORDERED_ID}
            """,
            {"events": events, "pending": pending},
        )
    print("  deliveries", flush=True)
    with indexes_rebuilt(cursor, "inbox_messages"):
        cursor.execute(
            """
            INSERT INTO inbox_messages (source, message_id, received_at)
            SELECT (ARRAY['stripe', 'github', 'shopify', 'twilio', 'sendgrid'])[1 + n %% 5],
                'evt_' || md5(n::text), now() - make_interval(secs => (%(inbox)s - n)::float8
                * 604800 / %(inbox)s)
            FROM generate_series(1, %(inbox)s) AS n
            """,
            {"inbox": max(1, events // 10)},
        )
    print("  inbox", flush=True)


def fill_small_tables() -> None:
    from django_pgoutbox.models import QueueControl, ScheduleCursor, WorkerHeartbeat
    from django_pgoutbox.schedules import load_schedules

    names = [*load_schedules()[0], *(f"legacy.nightly_{i}" for i in range(5))]
    ScheduleCursor.objects.bulk_create(ScheduleCursor(name=name) for name in names)
    WorkerHeartbeat.objects.bulk_create(
        WorkerHeartbeat(worker_id=f"host-{i}:{1000 + i}", hostname=f"host-{i}", pid=1000 + i)
        for i in range(4)
    )
    QueueControl.objects.create(queue="exports", paused_by="admin_scale")


def fill(jobs: int, events: int, expected: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute("SET synchronous_commit = off")
        fill_jobs(cursor, jobs)
        fill_outbox(cursor, events)
        fill_small_tables()
        for table in ("jobs", "outbox_events", "outbox_deliveries", "inbox_messages"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("VACUUM ANALYZE")
        cursor.execute(f"COMMENT ON TABLE jobs IS '{expected}'")


# -- the pages -----------------------------------------------------------------------------------


class Page:
    def __init__(self, label: str, url: str, data: dict[str, Any] | None = None) -> None:
        self.label = label
        self.url = url
        self.data = data  # a POST's form, or None for a GET


def _sample(queryset: Any, column: str | None = None) -> Any:
    """A row a thousand from the top of ``queryset`` (not the newest), with ``column`` set."""
    if column:
        queryset = queryset.exclude(**{f"{column}__isnull": True})
    rows = list(queryset[1000:1001]) or list(queryset[:1])
    return rows[0] if rows else None


def pages_of(model_admin: Any, user: Any) -> list[Page]:
    """Every page of one model's admin, found from the admin itself: its filters' choices, its
    search columns, its sortable columns, its actions."""
    from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR, SEARCH_VAR
    from django.test import RequestFactory
    from django.urls import reverse

    from django_pgoutbox.admin.common import MAX_PAGE

    opts = model_admin.model._meta
    name = f"{opts.app_label}.{opts.model_name}"
    base = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    request = RequestFactory().get(base)
    request.user = user
    changelist = model_admin.get_changelist_instance(request)
    found = [Page(f"{name}: list", base)]
    seen = {base}

    def add(label: str, url: str, data: dict[str, Any] | None = None) -> None:
        if data is not None or url not in seen:
            seen.add(url)
            found.append(Page(f"{name}: {label}", url, data))

    for spec in changelist.filter_specs:
        for choice in spec.choices(changelist):
            query = choice["query_string"]
            if query not in ("", "?"):
                add(f"{spec.title} = {choice['display']}", base + query)
    queryset = changelist.queryset  # in the page's order
    row = _sample(queryset)
    if row is not None and model_admin.search_fields:
        add("search by id", f"{base}?{SEARCH_VAR}={row.pk}")
        columns = [f for f in model_admin.search_fields if f not in ("id", "pk")]
        if opts.model_name == "outboxdelivery":
            columns.append("event_id")  # its search also takes an event's id
        for column in columns:
            # Else another row's value, that this page's rows lack: a search that finds none.
            keyed = _sample(queryset, column) or _sample(model_admin.model._base_manager, column)
            if keyed is not None:
                add(f"search by {column}", f"{base}?{SEARCH_VAR}={getattr(keyed, column)}")
    add(f"page {MAX_PAGE}", f"{base}?{PAGE_VAR}={MAX_PAGE}")
    for index, field in enumerate(changelist.list_display):
        if field != "action_checkbox" and changelist.get_ordering_field(field) is not None:
            add(f"sorted by {field}", f"{base}?{ORDER_VAR}={index}")
            add(f"sorted by {field}, descending", f"{base}?{ORDER_VAR}=-{index}")
    if row is not None:
        for action in model_admin.get_actions(request):
            form = {"action": action, "select_across": "1", "index": "0"}
            add(f"select all, {action}", base, {**form, "_selected_action": [str(row.pk)]})
        for view in ("change", "history", "delete"):
            url = reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[row.pk])
            add(f"{view} a row", url)
    return found


def all_pages(user: Any) -> list[Page]:
    from django.contrib import admin
    from django.urls import reverse

    from django_pgoutbox.models import DeadLetter

    found = [Page("admin index", reverse("admin:index"))]
    for model_admin in admin.site._registry.values():
        found.extend(pages_of(model_admin, user))
    big = DeadLetter.objects.filter(job_type="exports.build", queue="exports").order_by("-id")
    biggest = big.filter(last_error_summary__startswith="PermanentError: export").first()
    if biggest is not None:
        for model in ("deadletter", "job"):
            url = reverse(f"admin:pgoutbox_{model}_change", args=[biggest.pk])
            found.append(Page(f"pgoutbox.{model}: a row with a 1 MB payload", url))
    found.append(Page("queues overview", reverse("admin:pgoutbox_overview")))
    return found


def render(client: Any, page: Page) -> Any:
    if page.data is None:
        return client.get(page.url)
    return client.post(page.url, page.data)


def explain(client: Any, page: Page) -> None:
    """The statements of ``page`` over 20 ms, each with its plan."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        render(client, page)
    for query in captured.captured_queries:
        if float(query["time"]) < 0.020 or not query["sql"].lstrip().upper().startswith("SELECT"):
            continue
        print(f"\n-- {page.label}: {float(query['time']) * 1000:.0f} ms\n{query['sql']}")
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + query["sql"])
            print("\n".join(line for (line,) in cursor.fetchall()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--database", default="pgoutbox_bench_scale")
    parser.add_argument("--reuse", action="store_true", help="keep the rows of an earlier run")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per statement")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit", type=float, default=300.0, help="flag pages slower (ms)")
    parser.add_argument(
        "--patience", type=float, default=2000.0, help="render once a page slower (ms) than this"
    )
    parser.add_argument("--explain", action="store_true", help="plans of the flagged pages")
    parser.add_argument("--page", action="append", help="only pages whose label has this")
    args = parser.parse_args()
    expected = f"admin_scale: {args.jobs} jobs, {args.events} events"
    if not setup(args.database, args.reuse, expected):
        started = time.perf_counter()
        fill(args.jobs, args.events, expected)
        print(f"filled in {time.perf_counter() - started:.0f}s", flush=True)

    from django.contrib.auth.models import User
    from django.db import connection
    from django.db.backends.signals import connection_created
    from django.test import Client

    def statement_timeout(connection: Any, **kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {int(args.timeout * 1000)}")

    connection_created.connect(statement_timeout, weak=False)
    statement_timeout(connection)  # the test client keeps the connection that set up
    user, _ = User.objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    flagged = []
    print(f"{'page':<88}{'status':>7}{'median ms':>11}", flush=True)
    for page in all_pages(user):
        if args.page and not any(part in page.label for part in args.page):
            continue
        timings: list[float] = []
        try:
            while len(timings) < args.runs and not (timings and timings[0] > args.patience):
                begin = time.perf_counter()
                response = render(client, page)
                timings.append((time.perf_counter() - begin) * 1000)
        except Exception as error:  # a statement cancelled by the timeout
            print(f"{page.label[:87]:<88}{'-':>7}  > {args.timeout:.0f} s ({type(error).__name__})")
            flagged.append(page)
            continue
        median = statistics.median(timings)
        flag = "  > limit" if median > args.limit else ""
        if len(timings) == 1 < args.runs:
            flag += " (one run)"
        print(f"{page.label[:87]:<88}{response.status_code:>7}{median:>11.0f}{flag}", flush=True)
        if flag:
            flagged.append(page)
    print(f"\n{len(flagged)} pages over {args.limit:.0f} ms", flush=True)
    if args.explain:
        for page in flagged:
            explain(client, page)


if __name__ == "__main__":
    main()
