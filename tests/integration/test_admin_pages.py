"""The admin's pages as Django's own look, on the installed Django (5.2 or 6.x): breadcrumbs,
read-only detail pages, the buttons of a detail page, what a detail page shows and links to, the
jobs' filters. Through Django's test client on real rows."""

from __future__ import annotations

import re
import uuid
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_pgoutbox import control, enqueue, outbox, publish, scheduler
from django_pgoutbox.inbox import accept_message
from django_pgoutbox.models import (
    InboxMessage,
    Job,
    JobStatus,
    OutboxDelivery,
    OutboxEvent,
    ScheduleCursor,
)
from django_pgoutbox.publishers import PUBLISH_JOB, send_events, unregister
from django_pgoutbox.registry import registered_jobs
from django_pgoutbox.schedules import load_schedules
from tests.integration.test_admin import dead_job
from tests.integration.test_admin_boundaries import messages_of
from tests.integration.test_delivery_operations import FIRST, delivery, event, register_two

pytestmark = pytest.mark.django_db

ADMIN = "/admin/pgoutbox/"


def breadcrumbs(page: Any) -> str:
    (found,) = re.findall(r'<nav aria-label="Breadcrumbs">(.*?)</nav>', page.content.decode(), re.S)
    return " ".join(found.split())


def container(crumbs: str) -> str:
    """The element that holds the breadcrumbs: ``ol`` or ``div``."""
    match = re.match(r'<(ol|div) class="breadcrumbs">', crumbs)
    assert match, crumbs
    return match.group(1)


def changer(client: Client) -> Client:
    """A staff user with every permission of the app but delete."""
    user = User.objects.create_user("changer", password="pw", is_staff=True)
    for permission in Permission.objects.filter(content_type__app_label="pgoutbox"):
        if not permission.codename.startswith("delete_"):
            user.user_permissions.add(permission)
    client.force_login(user)
    return client


class TestBreadcrumbs:
    def test_the_apps_own_pages_draw_them_as_djangos_pages_do(self, admin_client: Client) -> None:
        job = dead_job()
        django_page = breadcrumbs(admin_client.get(f"{ADMIN}job/{job.pk}/change/"))
        overview = breadcrumbs(admin_client.get(f"{ADMIN}job/overview/"))
        confirm = breadcrumbs(
            admin_client.post(
                f"{ADMIN}deadletter/", {"action": "retry_now", "_selected_action": [job.pk]}
            )
        )
        kind = container(django_page)
        assert container(overview) == container(confirm) == kind
        if kind == "ol":
            assert '<li aria-current="page">Queues overview</li>' in overview
            assert '<li><a href="/admin/pgoutbox/deadletter/">Dead letters</a></li>' in confirm
            assert '<li aria-current="page">Retry dead letters</li>' in confirm
            assert "&rsaquo;" not in overview + confirm
        else:
            assert overview.endswith("&rsaquo; Queues overview </div>")
            assert '&rsaquo; <a href="/admin/pgoutbox/deadletter/">Dead letters</a>' in confirm
            assert confirm.endswith("&rsaquo; Retry dead letters </div>")
        assert '<a href="/admin/pgoutbox/">Outbox and jobs</a>' in overview


class TestReadOnlyDetailPages:
    @pytest.mark.parametrize("who", ["superuser", "changer"])
    def test_every_detail_page_is_a_view_without_save(
        self, client: Client, admin_user: User, registry: None, who: str
    ) -> None:
        if who == "superuser":
            client.force_login(admin_user)
        else:
            changer(client)
        register_two()
        dead = dead_job()
        pending = enqueue("tests.behave", {})
        made = event(1)
        ScheduleCursor.objects.create(name="pgoutbox.prune", last_slot_at=timezone.now())
        with transaction.atomic():
            accept_message("stripe", "m-1")
        pages = {
            f"deadletter/{dead.pk}": "View dead letter",
            f"job/{pending.pk}": "View job",
            f"outboxevent/{made.pk}": "View outbox event",
            f"outboxdelivery/{delivery(made, FIRST, 'dead').pk}": "View outbox delivery",
            "schedulecursor/pgoutbox.prune": "View schedule cursor",
            f"inboxmessage/{InboxMessage.objects.get().pk}": "View inbox message",
        }
        for path, title in pages.items():
            page = admin_client_get(client, f"{ADMIN}{path}/change/")
            text = page.content.decode()
            assert f"<h1>{title}</h1>" in text, path
            assert f"| {title} |" in text, path  # the <title>
            for name in ("_save", "_continue", "_addanother", "_saveasnew"):
                assert f'name="{name}"' not in text, (path, name)
            assert 'class="closelink"' in text, path


def admin_client_get(client: Client, url: str) -> Any:
    page = client.get(url)
    assert page.status_code == 200, url
    return page


# -- the buttons of a detail page ---------------------------------------------------------------


class _Buttons(HTMLParser):
    """A page's buttons that submit a form of their own (``form="..."``), and those forms."""

    def __init__(self) -> None:
        super().__init__()
        self.buttons: dict[str, str] = {}  # label -> form id
        self.forms: dict[str, tuple[str, dict[str, str]]] = {}  # id -> (action, inputs)
        self._form: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag == "input" and values.get("type") == "submit" and values.get("form"):
            self.buttons[values["value"]] = values["form"]
        elif tag == "form" and values.get("id", "").startswith("pgoutbox-"):
            assert values["method"] == "post"
            self._form = values["id"]
            self.forms[self._form] = (values["action"], {})
        elif tag == "input" and self._form is not None:
            self.forms[self._form][1][values["name"]] = values.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None


def buttons_of(page: Any) -> dict[str, tuple[str, dict[str, str]]]:
    """Each button's label -> the URL its form posts to and the form's inputs."""
    assert page.status_code == 200
    parser = _Buttons()
    parser.feed(page.content.decode())
    return {label: parser.forms[form] for label, form in parser.buttons.items()}


def press(client: Client, page_url: str, label: str) -> Any:
    """Open the page and press its button ``label``, as a browser posts it (with the token)."""
    url, data = buttons_of(client.get(page_url))[label]
    return client.post(url, data)


@pytest.fixture
def csrf_admin(admin_user: User) -> Client:
    """A superuser's client that checks CSRF tokens, as a real request is checked."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    return client


class TestDeadLetterButtons:
    def test_retry_now_from_the_page(self, csrf_admin: Client) -> None:
        job = dead_job()
        page = f"{ADMIN}deadletter/{job.pk}/change/"
        buttons = buttons_of(csrf_admin.get(page))
        assert set(buttons) == {"Retry now", "Cancel"}  # Skip: only a sequence's job
        assert buttons["Retry now"][0] == f"{ADMIN}deadletter/{job.pk}/retry/"
        assert "csrfmiddlewaretoken" in buttons["Retry now"][1]
        done = press(csrf_admin, page, "Retry now")
        assert done.status_code == 302
        assert done["Location"] == f"{ADMIN}job/{job.pk}/change/"  # no longer a dead letter
        assert messages_of(done) == [f"Retried dead letter {job.pk}."]
        job.refresh_from_db()
        assert (job.status, job.attempts, job.finished_at) == (JobStatus.PENDING, 0, None)
        assert [(e.object_id, e.get_change_message()) for e in LogEntry.objects.all()] == [
            (str(job.pk), "Retry dead letters")
        ]

    def test_cancel_from_the_page(self, admin_client: Client) -> None:
        job = dead_job()
        done = press(admin_client, f"{ADMIN}deadletter/{job.pk}/change/", "Cancel")
        assert messages_of(done) == [f"Cancelled dead letter {job.pk}."]
        assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
        assert LogEntry.objects.get().get_change_message() == "Cancel dead letters"

    def test_a_job_retried_since_the_page_was_shown_is_left_alone(
        self, admin_client: Client
    ) -> None:
        job = dead_job()
        url, data = buttons_of(admin_client.get(f"{ADMIN}deadletter/{job.pk}/change/"))["Cancel"]
        control.retry_dead_jobs([job.pk])  # a colleague, meanwhile
        done = admin_client.post(url, data)
        assert done.status_code == 302
        assert messages_of(done) == [f"Dead letter {job.pk} was no longer dead: nothing was done."]
        assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING
        assert not LogEntry.objects.exists()

    def test_a_get_acts_on_nothing(self, admin_client: Client) -> None:
        job = dead_job()
        for name in ("retry", "cancel"):
            assert admin_client.get(f"{ADMIN}deadletter/{job.pk}/{name}/").status_code == 405
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    def test_a_post_without_the_csrf_token_is_refused(self, csrf_admin: Client) -> None:
        job = dead_job()
        assert csrf_admin.post(f"{ADMIN}deadletter/{job.pk}/retry/").status_code == 403
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    def test_a_viewer_sees_no_button_and_may_not_post(self, client: Client) -> None:
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        for codename in ("view_deadletter", "view_job"):
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client.force_login(user)
        job = dead_job()
        assert buttons_of(client.get(f"{ADMIN}deadletter/{job.pk}/change/")) == {}
        for name in ("retry", "cancel"):
            assert client.post(f"{ADMIN}deadletter/{job.pk}/{name}/").status_code == 403
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD
        assert not LogEntry.objects.exists()

    def test_anonymous_is_sent_to_log_in(self, client: Client) -> None:
        job = dead_job()
        response = client.post(f"{ADMIN}deadletter/{job.pk}/retry/")
        assert response.status_code == 302
        assert "/login/" in response["Location"]
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    @pytest.mark.parametrize(
        "object_id", ["nope", "1", "not-a-uuid-" + "x" * 500, "%00", str(uuid.uuid4())]
    )
    def test_an_id_of_no_row_is_a_404(self, admin_client: Client, object_id: str) -> None:
        assert admin_client.post(f"{ADMIN}deadletter/{object_id}/retry/").status_code == 404


class TestJobButtons:
    def test_cancel_a_pending_job(self, admin_client: Client) -> None:
        job = enqueue("tests.behave", {})
        page = f"{ADMIN}job/{job.pk}/change/"
        assert set(buttons_of(admin_client.get(page))) == {"Cancel"}
        done = press(admin_client, page, "Cancel")
        assert done["Location"] == page
        assert messages_of(done) == [f"Cancelled job {job.pk}."]
        assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
        assert LogEntry.objects.get().get_change_message() == "Cancel jobs"
        assert buttons_of(admin_client.get(page)) == {}  # finished: nothing to cancel

    def test_a_running_job_is_asked_to_stop(self, admin_client: Client) -> None:
        job = enqueue("tests.behave", {})
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.LEASED, locked_by="w1", locked_at=timezone.now()
        )
        done = press(admin_client, f"{ADMIN}job/{job.pk}/change/", "Cancel")
        assert messages_of(done) == [
            f"Job {job.pk} is running: it was asked to stop, and ends cancelled when its "
            "handler sees ctx.cancelled."
        ]
        job.refresh_from_db()
        assert job.cancel_requested_at is not None

    def test_a_finished_job_is_left_alone(self, admin_client: Client) -> None:
        job = enqueue("tests.behave", {})
        Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now())
        done = admin_client.post(f"{ADMIN}job/{job.pk}/cancel/")
        assert messages_of(done) == [f"Job {job.pk} had finished: nothing was done."]
        assert Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED
        assert not LogEntry.objects.exists()

    def test_cancel_needs_the_change_permission(self, client: Client) -> None:
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_job"))
        client.force_login(user)
        job = enqueue("tests.behave", {})
        assert buttons_of(client.get(f"{ADMIN}job/{job.pk}/change/")) == {}
        assert client.post(f"{ADMIN}job/{job.pk}/cancel/").status_code == 403
        assert client.get(f"{ADMIN}job/{job.pk}/cancel/").status_code == 405
        assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING


class TestOutboxButtons:
    def test_redrive_and_discard_a_dead_event(self, admin_client: Client) -> None:
        first, second = (
            publish("x.y", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
            for _ in range(2)
        )
        OutboxEvent.objects.update(dead_at=timezone.now(), attempts=10, last_error="boom")
        page = f"{ADMIN}outboxevent/{first.pk}/change/"
        assert set(buttons_of(admin_client.get(page))) == {"Re-drive", "Discard (mark processed)"}
        done = press(admin_client, page, "Re-drive")
        assert done["Location"] == page
        assert messages_of(done) == [f"Re-drove dead event {first.pk}."]
        assert buttons_of(admin_client.get(page)) == {}  # pending now
        again = admin_client.post(f"{ADMIN}outboxevent/{first.pk}/discard/")
        assert messages_of(again) == [
            f"Dead event {first.pk} was no longer dead: nothing was done."
        ]
        press(admin_client, f"{ADMIN}outboxevent/{second.pk}/change/", "Discard (mark processed)")
        first.refresh_from_db()
        second.refresh_from_db()
        assert (first.dead_at, first.attempts, first.processed_at) == (None, 0, None)
        assert second.processed_at is not None
        assert [entry.get_change_message() for entry in LogEntry.objects.order_by("pk")] == [
            "Re-drive dead events",
            "Discard dead events",
        ]

    def test_redrive_and_discard_a_dead_delivery(
        self, admin_client: Client, registry: None
    ) -> None:
        register_two()
        dead = delivery(event(1), FIRST, "dead")
        other = delivery(event(2), FIRST, "dead")
        page = f"{ADMIN}outboxdelivery/{dead.pk}/change/"
        assert set(buttons_of(admin_client.get(page))) == {
            "Re-drive",
            "Discard (mark delivered)",
        }
        done = press(admin_client, page, "Re-drive")
        assert messages_of(done) == [f"Re-drove dead delivery {dead.pk}."]
        assert OutboxDelivery.objects.get(pk=dead.pk).state != "dead"
        press(admin_client, f"{ADMIN}outboxdelivery/{other.pk}/change/", "Discard (mark delivered)")
        assert OutboxDelivery.objects.get(pk=other.pk).state == "delivered"
        assert LogEntry.objects.count() == 2

    @pytest.mark.parametrize("object_id", ["abc", "99999999999999999999", "-1", "1.5", "12345678"])
    def test_a_delivery_id_of_no_row_is_a_404(self, admin_client: Client, object_id: str) -> None:
        assert admin_client.post(f"{ADMIN}outboxdelivery/{object_id}/redrive/").status_code == 404

    def test_a_viewer_may_not_redrive(self, client: Client, registry: None) -> None:
        user = User.objects.create_user("viewer", password="pw", is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_outboxdelivery"))
        user.user_permissions.add(Permission.objects.get(codename="view_outboxevent"))
        client.force_login(user)
        register_two()
        made = event(1)
        OutboxEvent.objects.filter(pk=made.pk).update(
            processed_at=None, dead_at=timezone.now(), attempts=10
        )
        dead = delivery(made, FIRST, "dead")
        assert buttons_of(client.get(f"{ADMIN}outboxdelivery/{dead.pk}/change/")) == {}
        assert buttons_of(client.get(f"{ADMIN}outboxevent/{made.pk}/change/")) == {}
        assert client.post(f"{ADMIN}outboxdelivery/{dead.pk}/redrive/").status_code == 403
        assert client.post(f"{ADMIN}outboxevent/{made.pk}/redrive/").status_code == 403
        assert OutboxDelivery.objects.get(pk=dead.pk).state == "dead"


# -- what a detail page shows -------------------------------------------------------------------


def positions(page: Any, fields: list[str]) -> list[int]:
    text = page.content.decode()
    return [text.index(f"field-{name}") for name in fields]


class TestDetails:
    def test_a_job_page_shows_the_whole_error_and_its_times_in_order(
        self, admin_client: Client
    ) -> None:
        job = dead_job()
        summary = "ValueError: " + "a long line of an error, " * 40 + "\n  and <a second> line"
        Job.objects.filter(pk=job.pk).update(last_error_summary=summary)
        for url in (f"{ADMIN}deadletter/{job.pk}/change/", f"{ADMIN}job/{job.pk}/change/"):
            page = admin_client.get(url)
            pre = '<pre style="white-space: pre-wrap">'
            assert pre + summary.replace("<", "&lt;").replace(">", "&gt;") + "</pre>" in (
                page.content.decode()
            )
            times = [
                "created_at",
                "run_at",
                "locked_at",
                "lease_expires_at",
                "cancel_requested_at",
                "completed_at",
                "finished_at",
            ]
            assert positions(page, times) == sorted(positions(page, times)), url
            assert "field-event" not in page.content.decode()  # not a publisher's job

    def test_an_event_and_a_delivery_show_the_whole_error(
        self, admin_client: Client, registry: None
    ) -> None:
        register_two()
        made = event(1)
        error = "RuntimeError: no\nTraceback (most recent call last):\n  " + "x" * 3000
        OutboxEvent.objects.filter(pk=made.pk).update(last_error=error)
        dead = delivery(made, FIRST, "dead")
        OutboxDelivery.objects.filter(pk=dead.pk).update(last_error=error)
        for url in (f"{ADMIN}outboxevent/{made.pk}/change/", f"{ADMIN}outboxdelivery/{dead.pk}/"):
            page = admin_client.get(url if url.endswith("change/") else url + "change/")
            assert f'<pre style="white-space: pre-wrap">{error}</pre>' in page.content.decode()
        event_page = admin_client.get(f"{ADMIN}outboxevent/{made.pk}/change/")
        times = ["occurred_at", "available_at", "claimed_at", "dead_at", "processed_at"]
        assert positions(event_page, times) == sorted(positions(event_page, times))


class Quiet:
    """A publisher that sends nothing anywhere."""

    def __init__(self, name: str) -> None:
        self.name = name

    def publish(self, event: OutboxEvent) -> None:
        pass


class TestLinks:
    def test_an_event_links_to_its_publishers_jobs_and_back(
        self, admin_client: Client, registry: None
    ) -> None:
        send_events(Quiet("tests.hooks"), "tests.linked")
        send_events(Quiet("tests.audit"), "tests.linked")
        try:
            made = publish(
                "tests.linked", aggregate_type="order", aggregate_id=uuid.uuid4(), payload={}
            )
            other = publish(
                "tests.linked", aggregate_type="order", aggregate_id=uuid.uuid4(), payload={}
            )
            for projected in (made, other):  # as the relay runs them (it would close the test's
                for subscriber in outbox.subscribers_for("tests.linked"):  # connection)
                    subscriber(projected)
            hooks = Job.objects.get(idempotency_key=f"tests.hooks:{made.pk}")
            Job.objects.filter(idempotency_key=f"tests.audit:{made.pk}").delete()
            with CaptureQueriesContext(connection) as queries:
                page = admin_client.get(f"{ADMIN}outboxevent/{made.pk}/change/").content.decode()
            assert f'tests.hooks: <a href="{ADMIN}job/{hooks.pk}/change/">{hooks.pk}</a>' in page
            assert "tests.audit: no job (not projected yet, or deleted)" in page
            assert str(other.pk) not in page
            (lookup,) = [
                q["sql"] for q in queries.captured_queries if "idempotency_key" in q["sql"]
            ]
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL enable_seqscan = off")  # a table of two jobs
                cursor.execute(f"EXPLAIN {lookup}")
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "jobs_idempotency_uq" in plan, plan
            assert "Seq Scan" not in plan, plan
            job_page = admin_client.get(f"{ADMIN}job/{hooks.pk}/change/").content.decode()
            assert f'<a href="{ADMIN}outboxevent/{made.pk}/change/">{made.pk}</a>' in job_page
            OutboxEvent.objects.filter(pk=made.pk).delete()
            job_page = admin_client.get(f"{ADMIN}job/{hooks.pk}/change/").content.decode()
            assert f"{made.pk} (no longer kept)" in job_page
        finally:
            unregister("tests.hooks")
            unregister("tests.audit")

    def test_a_publisher_job_with_a_mangled_payload_links_nothing(
        self, admin_client: Client
    ) -> None:
        job = enqueue(PUBLISH_JOB, {"publisher": "tests.hooks", "event": "not an id"})
        page = admin_client.get(f"{ADMIN}job/{job.pk}/change/")
        assert page.status_code == 200
        assert "field-event" in page.content.decode()


# -- the jobs' list: job type, maintenance jobs -------------------------------------------------


def listed(page: Any) -> set[str]:
    assert page.status_code == 200
    return set(re.findall(r'name="_selected_action" value="([^"]+)"', page.content.decode()))


@pytest.fixture
def maintenance() -> list[str]:
    """One job of each built-in maintenance schedule, as "Run now" enqueues them."""
    schedules = load_schedules()[0]
    return [
        str(scheduler.run_now(schedules[name]).pk)
        for name in ("pgoutbox.prune", "pgoutbox.recover_leases", "pgoutbox.reconcile_outbox")
    ]


class TestJobsList:
    def test_maintenance_jobs_are_hidden_until_asked_for(
        self, admin_client: Client, maintenance: list[str]
    ) -> None:
        mine = {str(enqueue("tests.behave", {}).pk), str(dead_job().pk)}
        assert listed(admin_client.get(f"{ADMIN}job/")) == mine
        assert listed(admin_client.get(f"{ADMIN}job/?maintenance=included")) == mine | set(
            maintenance
        )
        assert listed(admin_client.get(f"{ADMIN}job/?maintenance=only")) == set(maintenance)
        assert listed(admin_client.get(f"{ADMIN}job/?maintenance=bogus")) == set()
        # Looking for one: found whatever it is.
        assert listed(admin_client.get(f"{ADMIN}job/?q={maintenance[0]}")) == {maintenance[0]}
        assert listed(admin_client.get(f"{ADMIN}job/?job_type=pgoutbox.prune")) == {maintenance[0]}
        page = admin_client.get(f"{ADMIN}job/").content.decode()
        for label in ("hidden", "all jobs, maintenance included", "maintenance only"):
            assert f">{label}</a>" in page, label

    def test_job_type_offers_the_registered_types(self, admin_client: Client) -> None:
        behave = str(enqueue("tests.behave", {}).pk)
        enqueue("tests.noop", {})
        page = admin_client.get(f"{ADMIN}job/?job_type=tests.behave")
        assert listed(page) == {behave}
        text = page.content.decode()
        for job_type in registered_jobs():
            assert f"?job_type={job_type}" in text or f"job_type={job_type}&" in text, job_type
        assert listed(admin_client.get(f"{ADMIN}job/?job_type=gone.type")) == set()

    def test_the_filters_read_by_index(self, admin_client: Client, maintenance: list[str]) -> None:
        """Hidden is the list's backward scan of the primary key, with a filter; maintenance
        only reads ``jobs_idempotency_uq``."""
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO jobs (queue, job_type, payload, status, finished_at) "
                "SELECT 'default', 'tests.behave', '{}', 'completed', now() "
                "FROM generate_series(1, 20000)"
            )
            cursor.execute("ANALYZE jobs")
        for query, index in (
            ("", "Index Scan Backward using jobs_pkey"),
            ("?maintenance=only", "jobs_idempotency_uq"),
        ):
            with CaptureQueriesContext(connection) as queries:
                admin_client.get(f"{ADMIN}job/{query}")
            (rows,) = [
                q["sql"]
                for q in queries.captured_queries
                if q["sql"].startswith('SELECT "jobs"."id"') and "ORDER BY" in q["sql"]
            ]
            with connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN {rows}")
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert index in plan, plan
            assert "Seq Scan" not in plan, plan


class TestUniqueDeadLetter:
    def test_retry_of_a_dead_letter_whose_unique_key_is_taken_says_so(
        self, admin_client: Client
    ) -> None:
        first = enqueue("tests.behave", {"a": 1}, unique=True)
        Job.objects.filter(pk=first.pk).update(status=JobStatus.DEAD, finished_at=timezone.now())
        holder = enqueue("tests.behave", {"a": 1}, unique=True)
        assert holder.created
        page = f"{ADMIN}deadletter/{first.pk}/change/"
        assert "Skip" not in buttons_of(admin_client.get(page))  # not in a sequence
        done = press(admin_client, page, "Retry now")
        assert messages_of(done) == [
            f"Dead letter {first.pk} was no longer dead or had its unique key taken: "
            "nothing was done."
        ]
        assert Job.objects.get(pk=first.pk).status == JobStatus.DEAD
