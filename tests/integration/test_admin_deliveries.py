"""The deliveries' admin page, and an event's deliveries on the event's page, through Django's
test client on real rows: the list, its filters and search, the bounds the other pages keep,
re-drive and discard confirmed with the exact count."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_pgoutbox.admin import EstimatedCountPaginator
from django_pgoutbox.models import OutboxDelivery
from tests.integration.test_admin_boundaries import confirmation_form, messages_of
from tests.integration.test_delivery_operations import (
    FIRST,
    SECOND,
    delivery,
    event,
    register_two,
    states,
)

pytestmark = pytest.mark.django_db

DELIVERIES = "/admin/pgoutbox/outboxdelivery/"
EVENTS = "/admin/pgoutbox/outboxevent/"


@pytest.fixture
def rows(registry: None) -> dict[str, OutboxDelivery]:
    register_two()
    week = event(1, ago=8 * 86400)
    hours = event(2, ago=5 * 3600)
    now = event(3, ago=60)
    other = event(4, event_type="tests.ops.other", ago=30)
    return {
        "week": delivery(week, FIRST, "dead", dead_ago=7 * 86400 + 60),
        "hours": delivery(hours, SECOND, "dead", dead_ago=3 * 3600),
        "now": delivery(now, FIRST, "dead", dead_ago=5),
        "failing": delivery(week, SECOND, "failing"),
        "waiting": delivery(hours, FIRST, "waiting"),
        "delivered": delivery(now, SECOND, "delivered"),
        "other": delivery(other, "tests.ops.gone", "dead", dead_ago=10),
    }


def shown(page: Any) -> set[int]:
    """The deliveries a changelist lists, by their checkboxes."""
    return {
        int(pk)
        for pk in re.findall(r'name="_selected_action" value="(\d+)"', page.content.decode())
    }


def pks(rows: dict[str, OutboxDelivery], *names: str) -> set[int]:
    return {rows[name].pk for name in names}


def dead() -> set[int]:
    return {pk for pk, state in states().items() if state == "dead"}


class TestPages:
    def test_the_list_shows_each_delivery_with_its_event(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        page = admin_client.get(DELIVERIES)
        assert page.status_code == 200
        assert shown(page) == {d.pk for d in rows.values()}
        text = page.content.decode()
        week = rows["week"]
        assert f'<a href="{EVENTS}{week.event_id}/change/">{week.event_id}</a>' in text
        assert "tests.ops.other" in text  # the event's type
        for state in ("waiting", "failing", "dead", "delivered"):
            assert f'<td class="field-state">{state}</td>' in text
        assert "RuntimeError" in text  # last_error_code
        assert admin_client.get(DELIVERIES + "add/").status_code == 403
        assert admin.site._registry[OutboxDelivery].paginator is EstimatedCountPaginator

    def test_the_detail_page_is_read_only_and_links_to_the_event(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        url = f"{DELIVERIES}{rows['week'].pk}/change/"
        page = admin_client.get(url)
        assert page.status_code == 200
        text = page.content.decode()
        assert f'href="{EVENTS}{rows["week"].event_id}/change/"' in text
        assert "RuntimeError: no" in text  # the whole error, on its own page
        assert 'name="_save"' not in text
        assert admin_client.post(url, {"_save": "Save"}).status_code == 403
        assert OutboxDelivery.objects.get(pk=rows["week"].pk).state == "dead"
        assert b"Delete" not in admin_client.get(url).content.split(b'id="content-main"')[1]

    def test_the_event_page_lists_its_deliveries(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        week = rows["week"]
        page = admin_client.get(f"{EVENTS}{week.event_id}/change/")
        assert page.status_code == 200
        text = page.content.decode()
        for mine in (rows["week"], rows["failing"]):
            assert f'href="{DELIVERIES}{mine.pk}/change/"' in text
        assert f'href="{DELIVERIES}{rows["hours"].pk}/change/"' not in text  # another event's
        assert FIRST in text
        assert SECOND in text
        # Read-only: no form to add one, nor to delete one.
        assert 'name="deliveries-MAX_NUM_FORMS" value="0"' in text
        assert "-DELETE" not in text
        assert (
            admin_client.post(f"{EVENTS}{week.event_id}/change/", {"_save": "1"}).status_code == 403
        )

    def test_each_state_is_read_with_its_row(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        """A waiting or a failing delivery tells apart by its ``last_error``, which the pages
        defer: read as a column of the list's statement, not one statement per row."""
        week = rows["week"]
        for url in (DELIVERIES, f"{EVENTS}{week.event_id}/change/"):
            with CaptureQueriesContext(connection) as captured:
                text = admin_client.get(url).content.decode()
            assert re.search(r'class="field-state">\s*(<p>)?failing<', text), url
            per_row = [
                q["sql"]
                for q in captured.captured_queries
                if 'SELECT "outbox_deliveries"."id", "outbox_deliveries"."last_error"' in q["sql"]
            ]
            assert per_row == [], url
        assert (
            '<td class="field-state">waiting</td>' in admin_client.get(DELIVERIES).content.decode()
        )

    def test_an_event_without_deliveries(self, admin_client: Client, registry: None) -> None:
        register_two()
        made = event(9)
        assert admin_client.get(f"{EVENTS}{made.pk}/change/").status_code == 200


class TestFilters:
    def test_state(self, admin_client: Client, rows: dict[str, OutboxDelivery]) -> None:
        expected = {
            "dead": pks(rows, "week", "hours", "now", "other"),
            "failing": pks(rows, "failing"),
            "waiting": pks(rows, "waiting"),
            "delivered": pks(rows, "delivered"),
            "nope": set(),
        }
        for state, chosen in expected.items():
            assert shown(admin_client.get(f"{DELIVERIES}?state={state}")) == chosen, state

    def test_subscriber_offers_registered_and_undelivered_names(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        page = admin_client.get(DELIVERIES)
        text = page.content.decode()
        for name in (FIRST, SECOND, "tests.ops.gone"):  # the last: no code registers it
            assert f"?subscriber={name}" in text, name
        assert shown(admin_client.get(f"{DELIVERIES}?subscriber={SECOND}")) == pks(
            rows, "hours", "failing", "delivered"
        )
        assert shown(admin_client.get(f"{DELIVERIES}?subscriber=tests.ops.gone")) == pks(
            rows, "other"
        )
        assert shown(admin_client.get(f"{DELIVERIES}?subscriber=a%00b")) == set()
        assert shown(admin_client.get(f"{DELIVERIES}?subscriber=nobody")) == set()

    def test_the_subscribers_offered_are_bounded_and_read_by_index(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO outbox_deliveries (event_id, subscriber, aggregate_type, "
                "aggregate_id, occurred_at) SELECT %s, 'tests.many.' || lpad(n::text, 4, '0'), "
                "'ops', gen_random_uuid(), now() FROM generate_series(1, 150) AS n",
                [rows["week"].event_id],
            )
        with CaptureQueriesContext(connection) as captured:
            text = admin_client.get(DELIVERIES).content.decode()
        assert "?subscriber=tests.many.0001" in text
        assert "?subscriber=tests.many.0150" not in text  # past the first 100 names
        assert not [
            q["sql"]
            for q in captured.captured_queries
            if "DISTINCT" in q["sql"].upper() and "outbox_deliveries" in q["sql"]
        ]

    def test_the_events_types_are_read_for_the_page_alone(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        """The list's statement reads no event: a join there read one for every row that an
        ``OFFSET`` skips (10,000 of them on page 100); the page's types come in one statement."""
        with CaptureQueriesContext(connection) as captured:
            text = admin_client.get(DELIVERIES).content.decode()
        assert "tests.ops.other" in text
        statements = [q["sql"] for q in captured.captured_queries]
        listed = [sql for sql in statements if 'ORDER BY "outbox_deliveries"."id" DESC' in sql]
        assert len(listed) == 1, statements
        assert "outbox_events" not in listed[0]
        events = [sql for sql in statements if 'FROM "outbox_events"' in sql]
        assert len(events) == 1, events
        assert '"payload"' not in events[0]

    def test_dead_for_and_event_type(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        def chosen(query: str) -> set[int]:
            return shown(admin_client.get(f"{DELIVERIES}?{query}"))

        assert chosen("dead_for=1h") == pks(rows, "week", "hours")
        assert chosen("dead_for=7d") == pks(rows, "week")
        assert chosen("dead_for=1y") == set()
        assert chosen("event_type=tests.ops.other") == pks(rows, "other")
        assert chosen("event_type=tests.ops&state=dead") == pks(rows, "week", "hours", "now")
        # A discarded delivery keeps its dead_at: not dead any more, not offered.
        OutboxDelivery.objects.filter(pk=rows["week"].pk).update(delivered_at=rows["week"].dead_at)
        assert chosen("dead_for=1h") == pks(rows, "hours")

    def test_search_by_delivery_or_event_id(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        def found(term: str) -> set[int]:
            return shown(admin_client.get(DELIVERIES, {"q": term}))

        assert found(str(rows["now"].pk)) == pks(rows, "now")
        assert found(str(rows["week"].event_id)) == pks(rows, "week", "failing")
        for hostile in ("nope", str(2**64), "1" * 400, "-1", "٣", str(uuid.uuid4())):
            assert found(hostile) == set(), hostile
        # Django's search form refuses a NUL, and lists every row, as on the other pages.
        assert admin_client.get(DELIVERIES, {"q": "x\x00"}).status_code == 200

    @pytest.mark.parametrize(
        "query",
        [
            "subscriber__regex=.*",
            "last_error__contains=x",
            "event__payload__a=1",
            "dead_at__isnull=False",
            "id__in=" + ",".join(str(n) for n in range(400)),
        ],
    )
    def test_other_lookups_are_refused(
        self, admin_client: Client, rows: dict[str, OutboxDelivery], query: str
    ) -> None:
        assert admin_client.get(f"{DELIVERIES}?{query}").status_code == 400

    def test_no_facet_counts(self, admin_client: Client, rows: dict[str, OutboxDelivery]) -> None:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(f"{DELIVERIES}?_facets=True").status_code == 200
        assert [q["sql"] for q in captured.captured_queries if "FILTER (WHERE" in q["sql"]] == []


class TestActions:
    def test_redrive_asks_with_the_count_then_acts_and_logs(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        selected = [rows[name].pk for name in ("week", "hours", "waiting", "delivered")]
        ask = admin_client.post(DELIVERIES, {"action": "redrive", "_selected_action": selected})
        text = ask.content.decode()
        assert "<strong>2</strong> dead deliveries" in text
        assert "2 of the 4 selected rows are not dead: they are left out." in text
        assert dead() == pks(rows, "week", "hours", "now", "other")  # not yet
        done = admin_client.post(DELIVERIES, confirmation_form(ask))
        assert messages_of(done) == ["Re-drove 2 dead deliveries."]
        assert dead() == pks(rows, "now", "other")
        redriven = OutboxDelivery.objects.get(pk=rows["week"].pk)
        assert (redriven.state, redriven.attempts) == ("failing", 0)
        assert states()[rows["waiting"].pk] == "waiting"
        assert states()[rows["delivered"].pk] == "delivered"
        assert {e.get_change_message() for e in LogEntry.objects.all()} == {
            "Re-drive dead deliveries"
        }
        assert LogEntry.objects.count() == 2

    def test_nothing_dead_among_the_selection(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        response = admin_client.post(
            DELIVERIES,
            {"action": "discard", "_selected_action": [rows["waiting"].pk, rows["failing"].pk]},
        )
        assert response.status_code == 302
        assert messages_of(response) == [
            "No dead deliveries to discard among the selected rows: nothing was done."
        ]
        assert dead() == pks(rows, "week", "hours", "now", "other")

    def test_discard_across_a_filter_counts_exactly_and_leaves_the_rest(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        url = f"{DELIVERIES}?subscriber={FIRST}"
        ask = admin_client.post(
            url,
            {
                "action": "discard",
                "index": "0",
                "select_across": "1",
                "_selected_action": [str(rows["week"].pk)],
            },
        )
        assert "<strong>2</strong> dead deliveries" in ask.content.decode()
        # A delivery that dies after the confirmation page is not discarded with the others.
        late = delivery(event(5), FIRST, "dead", dead_ago=-60)
        with CaptureQueriesContext(connection) as captured:
            done = admin_client.post(url, confirmation_form(ask))
        assert messages_of(done) == ["Discarded 2 dead deliveries."]
        assert dead() == pks(rows, "hours", "other") | {late.pk}
        discarded = OutboxDelivery.objects.get(pk=rows["now"].pk)
        assert (discarded.last_error or "").startswith("discarded by an operator")
        # The rows it locks are the deliveries', never their events'.
        locking = [q["sql"] for q in captured.captured_queries if "FOR UPDATE" in q["sql"]]
        assert locking
        # (A subquery of the WHERE clause may join the events: FOR UPDATE does not lock them.)
        assert all('FROM "outbox_deliveries" WHERE' in sql for sql in locking), locking

    def test_a_delivery_redriven_since_the_confirmation_page_is_left_alone(
        self, admin_client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        selected = [rows["week"].pk, rows["now"].pk]
        ask = admin_client.post(DELIVERIES, {"action": "discard", "_selected_action": selected})
        from django_pgoutbox import control

        assert control.redrive_dead_deliveries([rows["week"].pk]) == 1  # a colleague, meanwhile
        done = admin_client.post(DELIVERIES, confirmation_form(ask))
        assert messages_of(done) == [
            "Discarded 1 dead delivery; 1 of the 2 confirmed was no longer dead and was left "
            "as it is."
        ]
        assert states()[rows["week"].pk] == "failing"


class TestPermissions:
    def test_a_viewer_sees_the_page_and_no_action(
        self, client: Client, rows: dict[str, OutboxDelivery]
    ) -> None:
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_outboxdelivery"))
        client.force_login(user)
        page = client.get(DELIVERIES)
        assert page.status_code == 200
        assert b'name="action"' not in page.content
        client.post(
            DELIVERIES,
            {"action": "redrive", "_selected_action": [rows["week"].pk], "confirmed": "yes"},
        )
        assert states()[rows["week"].pk] == "dead"
        user.user_permissions.add(Permission.objects.get(codename="change_outboxdelivery"))
        assert b'value="redrive"' in client.get(DELIVERIES).content
        assert b'value="delete_selected"' not in client.get(DELIVERIES).content
