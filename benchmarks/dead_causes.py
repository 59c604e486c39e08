"""Dead letters by cause over a million dead letters among ten million jobs.

    python benchmarks/dead_causes.py [--jobs 10000000] [--dead-every 10]
        [--database pgoutbox_bench_causes] [--reuse]

Fills a database of its own (dropped and made again, unless ``--reuse`` finds it filled) at
migration 0011 with ``--jobs`` jobs, one in ``--dead-every`` of them dead with one of the causes
of ``CAUSES`` (ids, numbers, e-mail addresses and quoted values inside their summaries; a few
causes much more frequent than the others), the rest completed; ``VACUUM ANALYZE``; then
migrates to the latest migration, timing it: the upgrade of a table that holds a million dead
letters (0012 builds an index of their causes, 0013 three more, 0014 writes each one's cause
into ``dead_cause`` and indexes that column). Then prints ``EXPLAIN ANALYZE`` of the causes
page's statements, times the exact count of the biggest cause, and renders the page, a group's
changelist and the confirmation pages of a small and of the biggest cause five times each
through Django's test client, printing the medians.
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

#: (job type, queue, error code, summary): ``{n}`` a number, ``{uuid}``, ``{email}``, ``{hex}``
#: (12 hex digits), ``{token}`` (24 letters and digits), ``{word}`` (a quoted word), each drawn
#: per row.
CAUSES = [
    (
        "webhooks.deliver",
        "webhooks",
        "http_503",
        "WebhookError: https://partner{n}.example/hooks "
        "answered 503 Service Unavailable after {n}.{n}s",
    ),
    (
        "webhooks.deliver",
        "webhooks",
        "TransientError",
        "TransientError: HTTPSConnectionPool(host="
        "'api.partner.example', port=443): Read timed out. (read timeout={n}.{n})",
    ),
    ("webhooks.deliver", "webhooks", "http_410", "WebhookError: endpoint {uuid} answered 410 Gone"),
    (
        "webhooks.deliver",
        "webhooks",
        "SSLError",
        "SSLError: certificate verify failed: "
        "certificate has expired (_ssl.c:{n}) for partner{n}.example",
    ),
    (
        "pgoutbox.publish",
        "webhooks",
        "http_500",
        "WebhookError: https://hooks.example.com/{uuid} answered 500 Internal Server Error",
    ),
    (
        "emails.send",
        "emails",
        "SMTPRecipientsRefused",
        "SMTPRecipientsRefused: {'{email}': (550, "
        "b'5.1.1 <{email}>: Recipient address rejected: User unknown')}",
    ),
    (
        "emails.send",
        "emails",
        "SMTPServerDisconnected",
        "SMTPServerDisconnected: Connection unexpectedly closed: timed out",
    ),
    ("emails.send", "emails", "ValueError", "ValueError: invalid address {email} for user {n}"),
    (
        "reports.build",
        "reports",
        "DoesNotExist",
        "DoesNotExist: Order matching query does not exist. (id={n})",
    ),
    (
        "reports.build",
        "reports",
        "IntegrityError",
        "IntegrityError: duplicate key value violates "
        'unique constraint "reports_report_period_key" DETAIL: Key (period)=({n}-{n}) already '
        "exists.",
    ),
    ("reports.build", "reports", "MemoryError", "MemoryError"),
    (
        "billing.charge",
        "default",
        "CardError",
        "CardError: Your card was declined. (charge ch_{token}, customer cus_{n})",
    ),
    (
        "billing.charge",
        "default",
        "CardError",
        "CardError: Your card has insufficient funds. (charge ch_{token})",
    ),
    (
        "billing.charge",
        "default",
        "RateLimited",
        "RateLimited: 429 Too Many Requests, retry after {n}s",
    ),
    (
        "exports.csv",
        "reports",
        "OSError",
        "OSError: [Errno 28] No space left on device: '/var/tmp/export-{uuid}.csv'",
    ),
    (
        "exports.csv",
        "reports",
        "PermissionError",
        "PermissionError: [Errno 13] Permission denied: '/srv/exports/{n}/out.csv'",
    ),
    (
        "search.index",
        "default",
        "ConnectionError",
        "ConnectionError: Connection to search{n}.internal:9200 refused",
    ),
    (
        "search.index",
        "default",
        "TransportError",
        "TransportError(429, "
        "'es_rejected_execution_exception', 'rejected execution of coordinating operation "
        "[coordinating_and_primary_bytes={n}]')",
    ),
    (
        "media.thumbnail",
        "default",
        "UnidentifiedImageError",
        "UnidentifiedImageError: cannot identify image file <_io.BytesIO object at 0x{hex}>",
    ),
    (
        "media.thumbnail",
        "default",
        "DecompressionBombError",
        "DecompressionBombError: Image "
        "size ({n} pixels) exceeds limit of {n} pixels, could be decompression bomb DOS attack.",
    ),
    ("sync.crm", "default", "KeyError", "KeyError: 'account_id'"),
    ("sync.crm", "default", "KeyError", "KeyError: 'owner'"),
    (
        "sync.crm",
        "default",
        "ValidationError",
        "ValidationError: {'email': ['Enter a valid email address.']} for contact {n}",
    ),
    (
        "notifications.push",
        "default",
        "unknown_job_type",
        "no handler is registered for job type 'notifications.push'",
    ),
    (
        "notifications.push",
        "default",
        "lease_expired",
        "lease of attempt {n} held by worker-{hex}-{n} expired",
    ),
    (
        "imports.row",
        "reports",
        "DataError",
        'DataError: invalid input syntax for type integer: "{word}" LINE 1: ...',
    ),
    (
        "imports.row",
        "reports",
        "UnicodeDecodeError",
        "UnicodeDecodeError: 'utf-8' codec can't "
        "decode byte 0x{hex} in position {n}: invalid start byte",
    ),
    (
        "accounting.export",
        "reports",
        "TimeoutError",
        "TimeoutError: query canceled after {n} ms: SELECT * FROM ledger WHERE ledger_id = {n}",
    ),
    (
        "ledger.post",
        "default",
        "SerializationFailure",
        "SerializationFailure: could not serialize access due to concurrent update",
    ),
    (
        "ledger.post",
        "default",
        "DeadlockDetected",
        "DeadlockDetected: deadlock detected DETAIL: "
        "Process {n} waits for ShareLock on transaction {n}; blocked by process {n}.",
    ),
    (
        "ledger.post",
        "default",
        "Fehler",
        "Fehler: Buchung {n} für Kundin «{word}» abgelehnt \u2013 Saldo {n},{n} €",
    ),
    (
        "geo.lookup",
        "default",
        "GeocoderTimedOut",
        "GeocoderTimedOut: Service timed out for '{word} street {n}'",
    ),
    (
        "pdf.render",
        "reports",
        "CalledProcessError",
        "CalledProcessError: Command '['wkhtmltopdf', "
        "'/tmp/{uuid}.html', '/tmp/{uuid}.pdf']' returned non-zero exit status {n}.",
    ),
    (
        "pdf.render",
        "reports",
        "RuntimeError",
        "RuntimeError: " + "renderer said: page {n} of "
        "{n} overflowed its frame; " * 20 + "[... {n} more characters]",
    ),
    (
        "cache.warm",
        "default",
        "RedisError",
        "ConnectionError: Error {n} connecting to "
        "redis-{n}.cache.internal:6379. Connection refused.",
    ),
    (
        "audit.ship",
        "default",
        "ClientError",
        "ClientError: An error occurred (AccessDenied) "
        "when calling the PutObject operation: bucket audit-{n} key {uuid}/{hex}.json",
    ),
]

QUEUES = ["default", "webhooks", "reports", "emails"]

#: Ids that grow with ``n``, as the app's UUIDv7 ids grow with time.
ORDERED_ID = "('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid"


def setup(database: str, reuse: bool) -> bool:
    """Point Django at ``database`` and migrate it to 0011; True if it already holds the rows."""
    kept = use_database(database, keep=reuse)
    from django.core.management import call_command
    from django.db import connection

    if not kept:
        call_command("migrate", verbosity=0)
        call_command("migrate", "pgoutbox", "0011", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT FROM jobs)")
        return bool(kept and cursor.fetchone()[0])


def _summary_sql() -> str:
    """The SQL of a row's summary: its cause's template with each placeholder drawn."""
    drawn = {
        "{n}": "(random() * 100000)::int::text",
        "{uuid}": "gen_random_uuid()::text",
        "{email}": "'user' || (random() * 100000)::int || '@mail' || (random() * 9)::int "
        "|| '.example.com'",
        "{hex}": "substr(md5(random()::text), 1, 12)",
        "{token}": "translate(substr(encode(sha256(random()::text::bytea), 'base64'), 1, 24), "
        "'+/', 'Zz')",
        "{word}": "(ARRAY['Müller', 'O''Brien', 'x', 'abc', '東京'])[1 + (random() * 4)::int]",
    }
    expression = "c.template"
    for placeholder, value in drawn.items():
        # Each occurrence its own draw: split on the placeholder, join with fresh values.
        expression = (
            f"(SELECT string_agg(part, '' ORDER BY i) FROM (SELECT i, CASE WHEN i = 1 THEN p "
            f"ELSE {value} || p END AS part FROM unnest(string_to_array({expression}, "
            f"'{placeholder}')) WITH ORDINALITY AS u(p, i)) AS parts)"
        )
    return expression


def fill(jobs: int, dead_every: int) -> None:
    from django.db import connection

    causes = ", ".join(
        f"({k}, {_quote(job_type)}, {_quote(queue)}, {_quote(code)}, {_quote(template)})"
        for k, (job_type, queue, code, template) in enumerate(CAUSES)
    )
    step = 1_000_000
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.25)")
        for start in range(1, jobs + 1, step):
            end = min(jobs, start + step - 1)
            # A few causes are much more frequent than the others: k drawn as 36 * u^3.
            cursor.execute(
                "INSERT INTO jobs (id, queue, job_type, payload, status, attempts, created_at, "
                "finished_at, last_error_code, last_error_summary) "
                f"SELECT {ORDERED_ID}, "
                "CASE WHEN dead THEN c.queue ELSE (ARRAY['default', 'webhooks', 'reports', "
                "'emails'])[1 + n %% 4] END, "
                "CASE WHEN dead THEN c.job_type ELSE 'bench.job' END, "
                "jsonb_build_object('n', n), CASE WHEN dead THEN 'dead' ELSE 'completed' END, "
                "3, moment, moment, CASE WHEN dead THEN c.code END, "
                f"CASE WHEN dead THEN {_summary_sql()} END "
                "FROM (SELECT n, n %% %s = 3 AS dead, "
                f"floor({len(CAUSES)} * power(random(), 3))::int AS k, "
                "now() - make_interval(secs => (%s - n) * 0.25) AS moment "
                "FROM generate_series(%s, %s) AS n) AS s "
                f"LEFT JOIN (VALUES {causes}) AS c (k, job_type, queue, code, template) "
                "ON c.k = s.k AND s.dead",
                [dead_every, jobs, start, end],
            )
            print(f"  {end:,} jobs", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''").replace("%", "%%") + "'"


def explain(sql: str, params: Any) -> None:
    """``EXPLAIN ANALYZE`` of a statement of the causes, with the plan settings it runs with."""
    from django.db import connection, transaction

    from django_pgoutbox import queries

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries.DEAD_CAUSE_PLAN)
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        for (line,) in cursor.fetchall():
            print("    " + line)
        transaction.set_rollback(True)


def render(client: Any, url: str) -> None:
    timings = []
    status = 0
    for _ in range(5):
        begin = time.perf_counter()
        response = client.get(url)
        timings.append((time.perf_counter() - begin) * 1000)
        status = response.status_code
    print(f"{url[:70]:<72}{status:>5}{statistics.median(timings):>9.0f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000_000)
    parser.add_argument("--dead-every", type=int, default=10)
    parser.add_argument("--database", default="pgoutbox_bench_causes")
    parser.add_argument("--reuse", action="store_true", help="keep the rows of an earlier run")
    args = parser.parse_args()
    if not setup(args.database, args.reuse):
        started = time.perf_counter()
        fill(args.jobs, args.dead_every)
        print(f"filled {args.jobs:,} jobs in {time.perf_counter() - started:.0f} s", flush=True)
    from django.core.management import call_command
    from django.db import connection

    started = time.perf_counter()
    call_command("migrate", "pgoutbox", verbosity=0)
    print(f"migrate (0012 and later): {time.perf_counter() - started:.1f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM jobs")  # as autovacuum would after the fill's updates
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobs")
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status = 'dead'), count(*), "
            "pg_size_pretty(pg_relation_size('jobs_dead_cause_idx')) FROM jobs"
        )
        dead, total, size = cursor.fetchone()
    print(f"{dead:,} dead letters among {total:,} jobs; jobs_dead_cause_idx {size}", flush=True)

    from django.contrib.auth.models import User
    from django.test import Client

    from django_pgoutbox import control, queries

    print("EXPLAIN ANALYZE of queries.DEAD_CAUSES:")
    explain(queries.DEAD_CAUSES, {"limit": control.MAX_CAUSES + 1, "cap": control.CAUSE_COUNT_CAP})
    found = control.dead_letter_causes()
    print("EXPLAIN ANALYZE of queries.COUNT_DEAD_CAUSE, the biggest cause:")
    explain(
        queries.COUNT_DEAD_CAUSE,
        {"fingerprint": found.causes[0].fingerprint, "as_of": control.database_now()},
    )
    for _ in range(5):
        started = time.perf_counter()
        found = control.dead_letter_causes()
        print(
            f"control.dead_letter_causes(): {len(found.causes)} causes, {found.estimated} "
            f"estimated, in {(time.perf_counter() - started) * 1000:.0f} ms",
            flush=True,
        )
    for cause in found.causes[:5]:
        print(
            f"  {cause.count:>9,} {'exact' if cause.exact else 'estimated'} "
            f"{cause.fingerprint} {cause.job_type} {cause.error_code} {cause.pattern[:60]}"
        )
    biggest = found.causes[0]
    for _ in range(3):
        started = time.perf_counter()
        exact = control.count_dead_cause(biggest.fingerprint)
        print(
            f"control.count_dead_cause({biggest.fingerprint!r}): {exact:,} "
            f"(estimated {biggest.count:,}) in {(time.perf_counter() - started) * 1000:.0f} ms",
            flush=True,
        )
    user, _ = User.objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    base = "/admin/pgoutbox/deadletter/"
    small = next(cause for cause in found.causes if cause.exact and cause.count > 1)
    print(f"{'page':<72}{'status':>5}{'median':>9} (of 5)")
    render(client, base + "causes/")
    render(client, base)
    render(client, base + f"?cause={biggest.fingerprint}")
    render(client, base + f"?cause={small.fingerprint}")
    render(client, base + f"causes/{small.fingerprint}/retry/")
    render(client, base + f"causes/{biggest.fingerprint}/retry/")


if __name__ == "__main__":
    main()
