"""The admin as a hostile or hurried staff user meets it: filters and searches that do not scan
whole tables, only the lookups the admin offers, hostile paging and ordering."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_pgoutbox.models import Job, JobStatus

pytestmark = pytest.mark.django_db

DEAD = "/admin/pgoutbox/deadletter/"
JOBS = "/admin/pgoutbox/job/"
EVENTS = "/admin/pgoutbox/outboxevent/"
CURSORS = "/admin/pgoutbox/schedulecursor/"


# -- helpers -------------------------------------------------------------------------------------


def insert_jobs(
    count: int,
    *,
    status: str = JobStatus.DEAD,
    queue: str = "webhooks",
    job_type: str = "tests.behave",
    code: str | None = "PermanentError",
    finished: str = "now() - make_interval(secs => n)",
) -> list[uuid.UUID]:
    """``count`` jobs in one statement; dead ones finished a second apart, newest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, attempts, finished_at, "
            "last_error_code, last_error_summary) "
            f"SELECT %s, %s, jsonb_build_object('n', n), %s, 3, {finished}, %s::text, "
            "%s::text || ': failed' "
            "FROM generate_series(1, %s) AS n RETURNING id",
            [queue, job_type, status, code, code, count],
        )
        return [row[0] for row in cursor.fetchall()]


def insert_events(count: int, *, event_type: str = "tests.projected", state: str) -> list[Any]:
    processed = "now()" if state == "processed" else "NULL"
    dead = "now()" if state == "dead" else "NULL"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, schema_version, "
            f"payload, processed_at, dead_at, attempts) SELECT 'order', gen_random_uuid(), %s, 1, "
            f"'{{}}', {processed}, {dead}, 0 FROM generate_series(1, %s) RETURNING id",
            [event_type, count],
        )
        return [row[0] for row in cursor.fetchall()]


# -- filters that do not scan whole tables ----------------------------------------------------


def _scans(queries: CaptureQueriesContext, table: str) -> list[str]:
    """Statements over ``table`` that read all of it: DISTINCT, facets' counts, LIKE."""
    return [
        q["sql"]
        for q in queries.captured_queries
        if f'FROM "{table}"' in q["sql"]
        and any(word in q["sql"].upper() for word in ("DISTINCT", "LIKE", "FILTER (WHERE"))
    ]


class TestFilters:
    def test_the_outbox_changelist_lists_registered_event_types(self, admin_client: Client) -> None:
        insert_events(3, event_type="tests.projected", state="processed")
        insert_events(2, event_type="nobody.listens", state="processed")
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(EVENTS)
        assert page.status_code == 200
        assert _scans(queries, "outbox_events") == []
        text = page.content.decode()
        assert "?event_type=tests.projected" in text  # a subscriber's event type
        assert "?event_type=nobody.listens" not in text
        # A type no subscriber takes can still be filtered on, by its exact name.
        chosen = admin_client.get(EVENTS + "?event_type=nobody.listens")
        assert chosen.content.count(b'name="_selected_action"') == 2

    def test_the_dead_letters_filters_read_a_bounded_sample(self, admin_client: Client) -> None:
        insert_jobs(3, job_type="reports.legacy", code="unknown_job_type")
        insert_jobs(1, job_type="tests.behave", code="myapp.PaymentDeclined")
        insert_jobs(50, status=JobStatus.COMPLETED, code=None, job_type="bulk.done")
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(DEAD)
        assert _scans(queries, "jobs") == []
        text = page.content.decode()
        for choice in (
            "?job_type=reports.legacy",  # dead letters of a type no code handles any more
            "?job_type=tests.noop",  # a registered job type
            "?last_error_code=unknown_job_type",
            "?last_error_code=myapp.PaymentDeclined",
        ):
            assert choice in text, choice
        assert "bulk.done" not in text
        sample = [q["sql"] for q in queries.captured_queries if "LIMIT 200" in q["sql"]]
        assert sample, queries.captured_queries

    @pytest.mark.parametrize("url", [DEAD, JOBS, EVENTS, CURSORS])
    def test_no_facet_counts(self, admin_client: Client, url: str) -> None:
        insert_jobs(3)
        insert_events(3, state="dead")
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(url + "?_facets=True")
        assert page.status_code == 200
        assert [q["sql"] for q in queries.captured_queries if "FILTER (WHERE" in q["sql"]] == []

    def test_status_and_state_filters(self, admin_client: Client) -> None:
        insert_jobs(2, status=JobStatus.PENDING, code=None, finished="NULL")
        insert_jobs(1, status=JobStatus.COMPLETED, code=None)
        insert_events(2, state="dead")
        insert_events(1, state="pending")

        def rows(url: str) -> int:
            page = admin_client.get(url)
            assert page.status_code == 200, url
            return page.content.count(b'name="_selected_action"')

        assert rows(JOBS + "?status=pending") == 2
        assert rows(JOBS + "?status=completed") == 1
        assert rows(JOBS + "?status=nonsense") == 0
        assert rows(EVENTS + "?state=dead") == 2
        assert rows(EVENTS + "?state=pending") == 1
        with CaptureQueriesContext(connection) as queries:
            assert rows(JOBS + "?status=nonsense") == 0
        assert not [q for q in queries.captured_queries if 'FROM "jobs"' in q["sql"]]


# -- only the lookups the admin offers --------------------------------------------------------

HOSTILE = [
    "payload__a__b=1",
    "payload__has_key=a",
    "payload__contains=%7B%7D",
    "job_type__regex=(a%2B)%2B%24",
    "job_type__iregex=.*",
    "job_type__icontains=x",
    "queue__exact=webhooks",
    "status__in=dead,pending",
    "status__exact=dead",
    "id__in=" + ",".join(str(uuid.UUID(int=n)) for n in range(400)),
    "pk=00000000-0000-0000-0000-000000000001",
    "worker_ids__contains=%5B%5D",
    "organization_id__isnull=True",
    "finished_at__year=2020",
    "idempotency_key__startswith=a",
    "queue__job__id=1",
    "logentry__user__password__startswith=p",
]


class TestLookups:
    @pytest.mark.parametrize("url", [DEAD, JOBS])
    @pytest.mark.parametrize("query", HOSTILE)
    def test_jobs_refuse_lookups_they_do_not_offer(
        self, admin_client: Client, url: str, query: str
    ) -> None:
        assert admin_client.get(f"{url}?{query}").status_code == 400

    @pytest.mark.parametrize(
        "query",
        [
            "payload__a=1",
            "event_type__regex=.*",
            "event_type__icontains=x",
            "aggregate_id__in=" + ",".join(str(uuid.UUID(int=n)) for n in range(400)),
            "processed_at__isnull=True",
            "dead_at__isnull=False",
            "last_error__contains=x",
        ],
    )
    def test_events_refuse_lookups_they_do_not_offer(
        self, admin_client: Client, query: str
    ) -> None:
        assert admin_client.get(f"{EVENTS}?{query}").status_code == 400

    def test_cursors_refuse_every_lookup(self, admin_client: Client) -> None:
        assert admin_client.get(f"{CURSORS}?name__regex=.*").status_code == 400
        assert admin_client.get(f"{CURSORS}?last_slot_at__isnull=True").status_code == 400

    @pytest.mark.parametrize(
        "url",
        [
            DEAD + "?queue=webhooks&job_type=tests.behave&last_error_code=x&q=k&o=-8&p=1",
            JOBS + "?status=dead&queue=webhooks&q=k&o=1",
            EVENTS + "?state=dead&event_type=tests.projected&q=" + str(uuid.uuid4()),
            CURSORS + "?o=2",
            DEAD + "?_facets=True&e=1",
        ],
    )
    def test_what_the_admin_offers_is_allowed(self, admin_client: Client, url: str) -> None:
        assert admin_client.get(url).status_code == 200


# -- searches, ordering, paging ---------------------------------------------------------------


class TestSiblings:
    def test_ordering_only_by_indexed_columns(self, admin_client: Client) -> None:
        insert_jobs(2)
        insert_events(2, state="dead")
        for url, column, table, order in (
            (JOBS, 2, "jobs", '"jobs"."id" DESC'),  # ?o=2: job type
            (JOBS, 4, "jobs", '"jobs"."id" DESC'),  # status
            (EVENTS, 2, "outbox_events", '"outbox_events"."id" DESC'),  # event type
            (DEAD, 3, "jobs", '"jobs"."finished_at" DESC'),  # queue
        ):
            with CaptureQueriesContext(connection) as queries:
                page = admin_client.get(f"{url}?o={column}")
            assert page.status_code == 200
            orders = [
                q["sql"].split("ORDER BY")[1]
                for q in queries.captured_queries
                if f'FROM "{table}"' in q["sql"] and "ORDER BY" in q["sql"]
                if "UNION" not in q["sql"]  # the dead letters' filters read their sample
            ]
            assert orders, url
            for sql in orders:
                assert sql.strip().startswith(order), (url, sql)
        page = admin_client.get(JOBS)
        assert b"?o=2" not in page.content  # no sorting link in the job type's header
        assert b"?o=-1" in page.content or b"?o=1" in page.content  # the id's

    @pytest.mark.parametrize("page", ["-1", "0", "abc", "1e9", "99999999999", "9" * 5000, ""])
    def test_hostile_page_numbers(self, admin_client: Client, page: str) -> None:
        insert_jobs(3)
        response = admin_client.get(f"{DEAD}?p={page}")
        assert response.status_code in (200, 302)
        if response.status_code == 302:
            assert response["Location"].endswith("?e=1")

    def test_deep_pages_are_refused(self, admin_client: Client) -> None:
        insert_jobs(120, status=JobStatus.COMPLETED, code=None)
        assert admin_client.get(f"{JOBS}?p=2").status_code == 200
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO jobs (queue, job_type, payload, status) "
                "SELECT 'default', 'x', '{}', 'completed' FROM generate_series(1, 12000)"
            )
            cursor.execute("ANALYZE jobs")
        first = admin_client.get(JOBS)
        assert b'href="?p=100"' in first.content  # the pager's last link
        assert b"?p=101" not in first.content
        assert b"?p=122" not in first.content
        assert admin_client.get(f"{JOBS}?p=100").status_code == 200
        deep = admin_client.get(f"{JOBS}?p=101")
        assert deep.status_code == 302
        assert deep["Location"].endswith("?e=1")

    def test_show_all_is_ignored_beyond_a_page(self, admin_client: Client) -> None:
        insert_jobs(250, status=JobStatus.COMPLETED, code=None)
        page = admin_client.get(JOBS + "?all=")
        assert page.content.count(b'name="_selected_action"') == 100

    def test_event_search_is_by_exact_id(self, admin_client: Client) -> None:
        [first, _second] = insert_events(2, state="processed")
        with CaptureQueriesContext(connection) as queries:
            found = admin_client.get(f"{EVENTS}?q={first}")
            text = admin_client.get(f"{EVENTS}?q=tests.projected")
        assert found.content.count(b'name="_selected_action"') == 1
        assert text.content.count(b'name="_selected_action"') == 0
        assert [q["sql"] for q in queries.captured_queries if "LIKE" in q["sql"].upper()] == []

    def test_changelists_do_not_read_payloads(self, admin_client: Client) -> None:
        insert_jobs(3)
        insert_events(3, state="dead")
        for url, table in ((JOBS, "jobs"), (DEAD, "jobs"), (EVENTS, "outbox_events")):
            with CaptureQueriesContext(connection) as queries:
                admin_client.get(url)
            rows = [
                q["sql"]
                for q in queries.captured_queries
                if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]
            ]
            assert rows, url
            assert not [sql for sql in rows if f'"{table}"."payload"' in sql], url
        page = admin_client.get(f"{DEAD}{Job.objects.first().pk}/change/")  # type: ignore[union-attr]
        assert b"&quot;n&quot;: " in page.content

    def test_a_big_payload_is_shown_in_part_and_read_in_part(self, admin_client: Client) -> None:
        [pk] = insert_jobs(1)
        Job.objects.filter(pk=pk).update(payload={"blob": "x" * 300_000}, result=[1, 2])
        with CaptureQueriesContext(connection) as queries:
            page = admin_client.get(f"{DEAD}{pk}/change/")
        text = page.content.decode()
        assert "300,012 characters of JSON; the first 262,144 are shown." in text
        assert len(page.content) < 300_000
        assert "[\n  1,\n  2\n]" in text  # the result, small, pretty-printed
        whole = [
            q["sql"]
            for q in queries.captured_queries
            if '"jobs"."payload"' in q["sql"] and "LEFT(" not in q["sql"].upper()
        ]
        assert whole == []
