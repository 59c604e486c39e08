"""The admin as a hostile or hurried staff user meets it: bulk actions on every selected row,
no deletes of unfinished rows, filters and searches that do not scan whole tables, only the
lookups the admin offers, hostile paging and ordering."""

from __future__ import annotations

import uuid
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgoutbox import control, enqueue, publish
from django_pgoutbox.models import Job, JobStatus, OutboxEvent, ScheduleCursor

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


class _Forms(HTMLParser):
    """The POST forms of a page, each as a list of (name, value) of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[list[tuple[str, str]]] = []
        self._current: list[tuple[str, str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "form" and (values.get("method") or "").lower() == "post":
            self._current = []
            self.forms.append(self._current)
        elif (
            tag == "input"
            and self._current is not None
            and values.get("name")
            and values.get("type") != "submit"
        ):
            self._current.append((values["name"] or "", values.get("value") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._current = None


def confirmation_form(page: Any) -> dict[str, list[str]]:
    """What the browser posts when the confirmation page's button is pressed."""
    parser = _Forms()
    parser.feed(page.content.decode())
    forms = [form for form in parser.forms if any(name == "action" for name, _ in form)]
    assert len(forms) == 1, parser.forms
    data: dict[str, list[str]] = {}
    for name, value in forms[0]:
        data.setdefault(name, []).append(value)
    return data


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def statuses(ids: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in Job.objects.filter(pk__in=ids).values_list("status", flat=True):
        counts[status] = counts.get(status, 0) + 1
    return counts


# -- bulk actions act on every selected row -----------------------------------------------------


class TestBulkActions:
    def test_select_across_retries_every_matching_row_in_chunks(self, admin_client: Client) -> None:
        webhooks = insert_jobs(700, queue="webhooks")
        reports = insert_jobs(30, queue="reports")
        url = DEAD + "?queue=webhooks"
        first_page = [str(pk) for pk in webhooks[:100]]  # what the page's checkboxes hold
        ask = admin_client.post(
            url,
            {
                "action": "retry_now",
                "index": "0",
                "select_across": "1",
                "_selected_action": first_page,
            },
        )
        assert ask.status_code == 200
        assert "<strong>700</strong> dead letters" in ask.content.decode()
        with CaptureQueriesContext(connection) as queries:
            done = admin_client.post(url, confirmation_form(ask))
        assert done.status_code == 302
        assert statuses(webhooks) == {JobStatus.PENDING: 700}
        assert statuses(reports) == {JobStatus.DEAD: 30}
        assert messages_of(done) == ["Retried 700 dead letters."]
        assert LogEntry.objects.count() == 700
        updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("\nUPDATE")]
        assert len(updates) == 2  # 500 ids, then 200

    def test_every_explicitly_selected_row_is_acted_on(self, admin_client: Client) -> None:
        ids = insert_jobs(700)
        ask = admin_client.post(
            DEAD, {"action": "cancel", "index": "0", "_selected_action": [str(i) for i in ids]}
        )
        assert "<strong>700</strong> dead letters" in ask.content.decode()
        form = confirmation_form(ask)
        assert len(form["_selected_action"]) == 700
        done = admin_client.post(DEAD, form)
        assert statuses(ids) == {JobStatus.CANCELLED: 700}
        assert messages_of(done) == ["Cancelled 700 dead letters."]

    def test_rows_changed_since_the_confirmation_page_are_counted_and_left_alone(
        self, admin_client: Client
    ) -> None:
        ids = insert_jobs(10)
        ask = admin_client.post(
            DEAD,
            {"action": "retry_now", "index": "0", "select_across": "1", "_selected_action": ids[0]},
        )
        assert "<strong>10</strong> dead letters" in ask.content.decode()
        # Meanwhile: an operator retries two from the command line, and three more jobs die.
        assert control.retry_dead_jobs(ids[:2]) == 2
        later = insert_jobs(3, finished="clock_timestamp() + interval '1 second'")
        done = admin_client.post(DEAD, confirmation_form(ask))
        assert messages_of(done) == [
            "Retried 8 dead letters; 2 of the 10 confirmed were no longer dead or their unique "
            "keys were held by other jobs and were left as they are."
        ]
        assert statuses(ids) == {JobStatus.PENDING: 10}
        assert statuses(later) == {JobStatus.DEAD: 3}
        assert LogEntry.objects.count() == 8

    def test_explicit_selection_changed_since_the_confirmation_page(
        self, admin_client: Client
    ) -> None:
        ids = insert_jobs(4)
        ask = admin_client.post(
            DEAD, {"action": "cancel", "index": "0", "_selected_action": [str(i) for i in ids]}
        )
        control.retry_dead_jobs(ids[:1])
        done = admin_client.post(DEAD, confirmation_form(ask))
        assert messages_of(done) == [
            "Cancelled 3 dead letters; 1 of the 4 confirmed was no longer dead "
            "and was left as it is."
        ]
        assert statuses(ids) == {JobStatus.PENDING: 1, JobStatus.CANCELLED: 3}

    def test_a_select_across_confirmation_must_come_from_its_page(
        self, admin_client: Client
    ) -> None:
        ids = insert_jobs(5, queue="webhooks")
        others = insert_jobs(5, queue="reports")
        # Straight to "confirmed" with every row selected: no page said how many.
        done = admin_client.post(
            DEAD,
            {
                "action": "retry_now",
                "select_across": "1",
                "_selected_action": [str(ids[0])],
                "confirmed": "yes",
            },
        )
        assert statuses(ids + others) == {JobStatus.DEAD: 10}
        assert messages_of(done) == [
            "This confirmation does not match its page (the filters or the action changed): "
            "nothing was done. Select the rows again."
        ]
        # A confirmation of "webhooks" replayed on the unfiltered list.
        ask = admin_client.post(
            DEAD + "?queue=webhooks",
            {
                "action": "retry_now",
                "index": "0",
                "select_across": "1",
                "_selected_action": [str(ids[0])],
            },
        )
        form = confirmation_form(ask)
        replay = admin_client.post(DEAD, form)
        assert statuses(ids + others) == {JobStatus.DEAD: 10}
        assert "nothing was done" in messages_of(replay)[0]
        form["action"] = ["cancel"]
        admin_client.post(DEAD + "?queue=webhooks", form)
        assert statuses(ids + others) == {JobStatus.DEAD: 10}
        form["action"] = ["retry_now"]
        token = form["confirmation"][0]
        form["confirmation"] = [token[:-1] + ("A" if token[-1] != "A" else "B")]
        admin_client.post(DEAD + "?queue=webhooks", form)
        assert statuses(ids + others) == {JobStatus.DEAD: 10}
        form["confirmation"] = [token]
        admin_client.post(DEAD + "?queue=webhooks", form)
        assert statuses(ids) == {JobStatus.PENDING: 5}
        assert statuses(others) == {JobStatus.DEAD: 5}

    def test_cancel_across_jobs_leaves_finished_ones(self, admin_client: Client) -> None:
        pending = insert_jobs(5, status=JobStatus.PENDING, code=None, finished="NULL")
        completed = insert_jobs(3, status=JobStatus.COMPLETED, code=None)
        with CaptureQueriesContext(connection) as queries:
            ask = admin_client.post(
                JOBS,
                {
                    "action": "cancel_jobs",
                    "index": "0",
                    "select_across": "1",
                    "_selected_action": [str(pending[0])],
                },
            )
        assert "<strong>5</strong> jobs" in ask.content.decode()
        counts = [q["sql"] for q in queries.captured_queries if "COUNT(*)" in q["sql"]]
        # The unfinished jobs as the claim and lease indexes' predicates name them.
        assert any("IN ('pending', 'retrying') OR" in sql for sql in counts), counts
        done = admin_client.post(JOBS, confirmation_form(ask))
        assert messages_of(done) == ["Cancelled 5 jobs."]
        assert statuses(pending) == {JobStatus.CANCELLED: 5}
        assert statuses(completed) == {JobStatus.COMPLETED: 3}

    def test_redrive_across_dead_events(self, admin_client: Client) -> None:
        dead = insert_events(12, state="dead")
        pending = insert_events(3, state="pending")
        url = EVENTS + "?state=dead"
        ask = admin_client.post(
            url,
            {
                "action": "redrive",
                "index": "0",
                "select_across": "1",
                "_selected_action": [str(dead[0])],
            },
        )
        assert "<strong>12</strong> dead events" in ask.content.decode()
        done = admin_client.post(url, confirmation_form(ask))
        assert messages_of(done) == ["Re-drove 12 dead events."]
        assert not OutboxEvent.objects.filter(dead_at__isnull=False).exists()
        assert OutboxEvent.objects.filter(pk__in=pending).count() == 3

    def test_a_listed_page_is_bounded(self, admin_client: Client) -> None:
        ids = insert_jobs(700)
        ask = admin_client.post(
            DEAD,
            {"action": "retry_now", "index": "0", "select_across": "1", "_selected_action": ids[0]},
        )
        text = ask.content.decode()
        assert text.count("<li>tests.behave [webhooks] dead") == 100
        assert "and 600 more." in text

    def test_a_malformed_id_is_refused_without_an_error_page(self, admin_client: Client) -> None:
        ids = insert_jobs(1)
        response = admin_client.post(
            DEAD, {"action": "retry_now", "index": "0", "_selected_action": ["nope", str(ids[0])]}
        )
        assert response.status_code == 302
        assert messages_of(response) == ["'nope' is not a valid id: nothing was done."]
        assert statuses(ids) == {JobStatus.DEAD: 1}


# -- no deletes of unfinished rows ---------------------------------------------------------------


class TestDeletes:
    @pytest.mark.parametrize("url", [JOBS, EVENTS, CURSORS])
    def test_no_bulk_delete_where_rows_can_be_unfinished(
        self, admin_client: Client, url: str
    ) -> None:
        enqueue("tests.behave", {})
        publish("x.y", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
        ScheduleCursor.objects.create(name="pgoutbox.prune", last_slot_at=timezone.now())
        page = admin_client.get(url)
        assert page.status_code == 200
        assert b'value="delete_selected"' not in page.content

    def test_posting_delete_selected_deletes_nothing(self, admin_client: Client) -> None:
        leased = insert_jobs(1, status=JobStatus.LEASED, code=None, finished="NULL")
        event = publish("x.y", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
        cursor = ScheduleCursor.objects.create(name="pgoutbox.prune", last_slot_at=None)
        for url, pk in ((JOBS, leased[0]), (EVENTS, event.pk), (CURSORS, cursor.pk)):
            admin_client.post(
                url,
                {"action": "delete_selected", "index": "0", "_selected_action": [str(pk)]},
            )
            admin_client.post(
                url, {"action": "delete_selected", "_selected_action": [str(pk)], "post": "yes"}
            )
        assert Job.objects.filter(pk=leased[0]).exists()
        assert OutboxEvent.objects.filter(pk=event.pk).exists()
        assert ScheduleCursor.objects.filter(pk=cursor.pk).exists()

    @pytest.mark.parametrize(
        ("status", "deletable"),
        [
            (JobStatus.PENDING, False),
            (JobStatus.LEASED, False),
            (JobStatus.RETRYING, False),
            (JobStatus.COMPLETED, True),
            (JobStatus.CANCELLED, True),
            (JobStatus.DEAD, True),
        ],
    )
    def test_one_job_is_deleted_only_once_finished(
        self, admin_client: Client, status: str, deletable: bool
    ) -> None:
        [pk] = insert_jobs(1, status=status, code=None)
        change = admin_client.get(f"{JOBS}{pk}/change/").content
        assert (f"{pk}/delete/".encode() in change) is deletable
        url = f"{JOBS}{pk}/delete/"
        assert admin_client.get(url).status_code == (200 if deletable else 403)
        response = admin_client.post(url, {"post": "yes"})
        assert response.status_code == (302 if deletable else 403)
        assert Job.objects.filter(pk=pk).exists() is not deletable

    @pytest.mark.parametrize(
        ("state", "deletable"), [("pending", False), ("dead", False), ("processed", True)]
    )
    def test_one_event_is_deleted_only_once_processed(
        self, admin_client: Client, state: str, deletable: bool
    ) -> None:
        [pk] = insert_events(1, state=state)
        url = f"{EVENTS}{pk}/delete/"
        assert admin_client.get(url).status_code == (200 if deletable else 403)
        admin_client.post(url, {"post": "yes"})
        assert OutboxEvent.objects.filter(pk=pk).exists() is not deletable

    @pytest.mark.parametrize(
        ("name", "deletable"), [("pgoutbox.prune", False), ("a.schedule.since.removed", True)]
    )
    def test_a_cursor_is_deleted_only_once_its_schedule_is_gone(
        self, admin_client: Client, name: str, deletable: bool
    ) -> None:
        ScheduleCursor.objects.create(name=name, last_slot_at=timezone.now())
        url = f"{CURSORS}{name}/delete/"
        assert admin_client.get(url).status_code == (200 if deletable else 403)
        admin_client.post(url, {"post": "yes"})
        assert ScheduleCursor.objects.filter(pk=name).exists() is not deletable

    def test_delete_dead_letters_in_chunks_only_while_dead(self, admin_client: Client) -> None:
        ids = insert_jobs(620)
        ask = admin_client.post(
            DEAD,
            {
                "action": "delete_selected",
                "index": "0",
                "select_across": "1",
                "_selected_action": [str(ids[0])],
            },
        )
        assert "<strong>620</strong> dead letters" in ask.content.decode()
        control.retry_dead_jobs(ids[:20])
        done = admin_client.post(DEAD, confirmation_form(ask))
        assert messages_of(done) == [
            "Deleted 600 dead letters; 20 of the 620 confirmed were no longer dead "
            "and were left as they are."
        ]
        assert statuses(ids) == {JobStatus.PENDING: 20}
        assert LogEntry.objects.filter(action_flag=3).count() == 600

    @pytest.mark.parametrize("url", [DEAD, EVENTS, CURSORS])
    def test_a_detail_page_never_saves(self, admin_client: Client, url: str) -> None:
        [job] = insert_jobs(1)
        [event] = insert_events(1, state="pending")
        ScheduleCursor.objects.create(name="pgoutbox.prune", last_slot_at=timezone.now())
        pk = {DEAD: job, EVENTS: event, CURSORS: "pgoutbox.prune"}[url]
        page = admin_client.get(f"{url}{pk}/change/")
        assert page.status_code == 200
        assert b'name="_save"' not in page.content
        # A save writes back the copy it read, over whatever a worker or the relay wrote since.
        response = admin_client.post(f"{url}{pk}/change/", {"_save": "Save"})
        assert response.status_code == 403


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

    @pytest.mark.parametrize(
        "url",
        [
            "/admin/pgoutbox/job/?queue=%00",
            "/admin/pgoutbox/deadletter/?job_type=a%00b",
            "/admin/pgoutbox/deadletter/?last_error_code=%00",
            "/admin/pgoutbox/outboxevent/?event_type=%00",
            "/admin/pgoutbox/inboxmessage/?source=%00",
        ],
    )
    def test_a_name_postgresql_cannot_compare_finds_nothing(
        self, admin_client: Client, url: str
    ) -> None:
        """A NUL in a filter's value: no row has it, and PostgreSQL refuses to compare text
        with one (it was a server error)."""
        page = admin_client.get(url)
        assert page.status_code == 200


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

    @pytest.mark.parametrize(
        ("json", "shown"),
        [
            ("'{\"n\": 1' || repeat('0', 5000) || '}'", "{&quot;n&quot;: 1000000"),
            ("repeat('[', 5000) || repeat(']', 5000)", "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]"),
        ],
    )
    def test_a_payload_that_python_cannot_load_is_shown_as_text(
        self, admin_client: Client, json: str, shown: str
    ) -> None:
        [pk] = insert_jobs(1)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE jobs SET payload = ({json})::jsonb WHERE id = %s", [pk])
        page = admin_client.get(f"{DEAD}{pk}/change/")
        assert page.status_code == 200
        assert shown in page.content.decode()
        assert admin_client.get(DEAD).status_code == 200

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


@pytest.mark.django_db(transaction=True)
def test_select_across_in_autocommit(admin_client: Client) -> None:
    """As in production, without a test's transaction around the request: the ids come from a
    server-side cursor that outlives each chunk's commit."""
    ids = insert_jobs(1_100)
    ask = admin_client.post(
        DEAD, {"action": "cancel", "index": "0", "select_across": "1", "_selected_action": ids[0]}
    )
    assert "<strong>1100</strong> dead letters" in ask.content.decode()
    done = admin_client.post(DEAD, confirmation_form(ask))
    assert messages_of(done) == ["Cancelled 1100 dead letters."]
    assert statuses(ids) == {JobStatus.CANCELLED: 1_100}
    assert LogEntry.objects.count() == 1_100
