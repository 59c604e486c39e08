"""The admin through Django's test client: pages, actions, permissions, the log; the command."""

from __future__ import annotations

import time
import uuid
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_pgoutbox import enqueue, publish
from django_pgoutbox.models import Job, JobStatus, OutboxEvent, ScheduleCursor
from tests.processes import scaled

pytestmark = pytest.mark.django_db

DEAD = "/admin/pgoutbox/deadletter/"


def dead_job(**fields: Any) -> Job:
    job = enqueue(
        fields.pop("job_type", "tests.behave"),
        fields.pop("payload", {"n": 1}),
        queue=fields.pop("queue", "default"),
        **fields,
    )
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.DEAD,
        attempts=3,
        last_error_code="PermanentError",
        last_error_summary="PermanentError: invalid payload",
        finished_at=timezone.now(),
    )
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def viewer(client: Client) -> Client:
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for model in ("deadletter", "job", "outboxevent", "schedulecursor"):
        user.user_permissions.add(Permission.objects.get(codename=f"view_{model}"))
    client.force_login(user)
    return client


class TestPages:
    def test_dead_letters_changelist_filters_and_search(self, admin_client: Client) -> None:
        first = dead_job(queue="webhooks", idempotency_key="order-7")
        dead_job(queue="reports", job_type="reports.nightly")
        enqueue("tests.behave", {})  # pending: not a dead letter
        page = admin_client.get(DEAD)
        assert page.status_code == 200
        assert page.content.count(b'class="action-checkbox"') == 2
        assert (
            admin_client.get(DEAD + "?queue=webhooks").content.count(b'name="_selected_action"')
            == 1
        )
        assert (
            admin_client.get(DEAD + "?job_type=reports.nightly").content.count(
                b'name="_selected_action"'
            )
            == 1
        )
        assert (
            admin_client.get(DEAD + "?last_error_code=PermanentError").content.count(
                b'name="_selected_action"'
            )
            == 2
        )
        assert admin_client.get(DEAD + "?q=order-7").content.count(b'name="_selected_action"') == 1
        assert (
            admin_client.get(DEAD + f"?q={first.pk}").content.count(b'name="_selected_action"') == 1
        )

    def test_detail_shows_the_payload_pretty_printed(self, admin_client: Client) -> None:
        job = dead_job(payload={"device": "d1", "nested": {"k": [1, 2]}})
        page = admin_client.get(f"{DEAD}{job.pk}/change/")
        assert page.status_code == 200
        assert b"&quot;device&quot;: &quot;d1&quot;" in page.content
        assert b"<pre" in page.content
        assert b"{&quot;device&quot;: &quot;d1&quot;" not in page.content  # not also raw

    def test_read_only_changelists(self, admin_client: Client) -> None:
        enqueue("tests.behave", {})
        publish("x.y", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
        for url in (
            "/admin/pgoutbox/job/",
            "/admin/pgoutbox/job/?status=pending",
            "/admin/pgoutbox/outboxevent/",
            "/admin/pgoutbox/outboxevent/?state=dead",
            "/admin/pgoutbox/schedulecursor/",
        ):
            assert admin_client.get(url).status_code == 200, url
        assert admin_client.get("/admin/pgoutbox/job/add/").status_code == 403

    def test_overview(self, admin_client: Client, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "SCHEDULES": {
                "morning": {"JOB": "tests.noop", "CRON": "0 8 * * *", "TZ": "Europe/Berlin"}
            },
        }
        ScheduleCursor.objects.create(name="morning", last_slot_at=timezone.now())
        dead_job(queue="exports")
        enqueue("tests.behave", {}, queue="reports")
        page = admin_client.get("/admin/pgoutbox/job/overview/")
        assert page.status_code == 200
        text = page.content.decode()
        assert f'href="{DEAD}?queue=exports"' in text
        assert "pgoutbox.recover_leases" in text
        assert "Outbox" in text
        assert "0 8 * * * (Europe/Berlin)" in text  # a schedule's zone, where it is listed
        changelist = admin_client.get("/admin/pgoutbox/schedulecursor/").content.decode()
        assert "0 8 * * * (Europe/Berlin)" in changelist

    def test_changelist_does_not_count_a_big_table(self, admin_client: Client) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO jobs (queue, job_type, payload, status, finished_at) "
                "SELECT 'default', 'x', '{}', 'completed', now() FROM generate_series(1, 200000)"
            )
            cursor.execute("ANALYZE jobs")
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            page = admin_client.get("/admin/pgoutbox/job/")
            elapsed = time.perf_counter() - started
        assert page.status_code == 200
        assert not [
            q
            for q in queries.captured_queries
            if "COUNT(" in q["sql"].upper()
            and 'FROM "jobs"' in q["sql"]
            and "LIMIT" not in q["sql"].upper()
        ]
        assert elapsed < scaled(2.0), elapsed


class TestActions:
    def test_retry_asks_then_acts_and_logs(self, admin_client: Client) -> None:
        job = dead_job()
        ask = admin_client.post(DEAD, {"action": "retry_now", "_selected_action": [job.pk]})
        assert ask.status_code == 200
        assert b"Yes, I" in ask.content
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD  # not yet
        done = admin_client.post(
            DEAD, {"action": "retry_now", "_selected_action": [job.pk], "confirmed": "yes"}
        )
        assert done.status_code == 302
        job.refresh_from_db()
        assert (job.status, job.attempts, job.finished_at) == (JobStatus.PENDING, 0, None)
        entry = LogEntry.objects.get()
        assert entry.object_id == str(job.pk)
        assert entry.get_change_message() == "Retry dead letters"

    def test_bulk_cancel(self, admin_client: Client) -> None:
        jobs = [dead_job() for _ in range(3)]
        admin_client.post(
            DEAD, {"action": "cancel", "_selected_action": [j.pk for j in jobs], "confirmed": "yes"}
        )
        assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.CANCELLED}
        assert LogEntry.objects.count() == 3

    def test_delete_is_confirmed(self, admin_client: Client) -> None:
        job = dead_job()
        ask = admin_client.post(DEAD, {"action": "delete_selected", "_selected_action": [job.pk]})
        assert b"Yes, I" in ask.content
        assert Job.objects.exists()  # not yet
        admin_client.post(
            DEAD, {"action": "delete_selected", "_selected_action": [job.pk], "confirmed": "yes"}
        )
        assert not Job.objects.exists()
        assert LogEntry.objects.get().get_change_message() == "Delete dead letters"

    def test_retry_never_touches_a_job_that_is_no_longer_dead(self, admin_client: Client) -> None:
        job = dead_job()
        Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
        from django_pgoutbox.control import retry_dead_jobs

        assert retry_dead_jobs([job.pk]) == 0
        assert Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED

    def test_redrive_and_discard_dead_events(self, admin_client: Client) -> None:
        events = [
            publish("x.y", aggregate_type="x", aggregate_id=uuid.uuid4(), payload={})
            for _ in range(2)
        ]
        OutboxEvent.objects.update(dead_at=timezone.now(), attempts=10, last_error="boom")
        url = "/admin/pgoutbox/outboxevent/"
        admin_client.post(
            url, {"action": "redrive", "_selected_action": [events[0].pk], "confirmed": "yes"}
        )
        admin_client.post(
            url, {"action": "discard", "_selected_action": [events[1].pk], "confirmed": "yes"}
        )
        first, second = (OutboxEvent.objects.get(pk=e.pk) for e in events)
        assert (first.dead_at, first.attempts, first.processed_at) == (None, 0, None)
        assert second.processed_at is not None
        assert (second.last_error or "").startswith("discarded by an operator")

    def test_run_schedule_now(self, admin_client: Client) -> None:
        from django_pgoutbox.models import ScheduleCursor

        ScheduleCursor.objects.create(name="pgoutbox.prune", last_slot_at=timezone.now())
        admin_client.post(
            "/admin/pgoutbox/schedulecursor/",
            {"action": "run_now", "_selected_action": ["pgoutbox.prune"], "confirmed": "yes"},
        )
        assert Job.objects.filter(job_type="pgoutbox.prune").count() == 1


class TestPermissions:
    def test_without_change_permission_no_action(self, viewer: Client) -> None:
        job = dead_job()
        page = viewer.get(DEAD)
        assert page.status_code == 200
        assert b'name="action"' not in page.content  # no action menu at all
        viewer.post(DEAD, {"action": "retry_now", "_selected_action": [job.pk], "confirmed": "yes"})
        assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD

    def test_change_permission_grants_retry_but_not_delete(self, viewer: Client) -> None:
        user = User.objects.get(username="viewer")
        user.user_permissions.add(Permission.objects.get(codename="change_deadletter"))
        page = viewer.get(DEAD)
        assert b'value="retry_now"' in page.content
        assert b'value="delete_selected"' not in page.content

    def test_anonymous_is_sent_to_login(self, client: Client) -> None:
        assert client.get(DEAD).status_code == 302
        assert client.get("/admin/pgoutbox/job/overview/").status_code == 302


class TestCommand:
    def test_list_show_retry_discard(self) -> None:
        keep = dead_job(queue="webhooks")
        other = dead_job(queue="reports")
        out = StringIO()
        call_command("pgoutbox", "deadletters", "list", "--queue", "webhooks", stdout=out)
        assert str(keep.pk) in out.getvalue()
        assert str(other.pk) not in out.getvalue()
        out = StringIO()
        call_command("pgoutbox", "deadletters", "show", str(keep.pk), stdout=out)
        assert '"n": 1' in out.getvalue()
        assert "PermanentError: invalid payload" in out.getvalue()
        out = StringIO()
        call_command("pgoutbox", "deadletters", "retry", str(keep.pk), stdout=out)
        assert "Retried 1 dead job(s)." in out.getvalue()
        out = StringIO()
        call_command(
            "pgoutbox", "deadletters", "discard", "--all", "--queue", "reports", stdout=out
        )
        assert "Discarded 1 dead job(s)." in out.getvalue()
        assert Job.objects.get(pk=keep.pk).status == JobStatus.PENDING
        assert Job.objects.get(pk=other.pk).status == JobStatus.CANCELLED

    def test_list_has_a_header_aligned_columns_and_an_ellipsis_where_it_cuts(self) -> None:
        short = dead_job(queue="webhooks")
        long = dead_job(queue="location_derivation", job_type="tests.a_much_longer_job_type")
        Job.objects.filter(pk=long.pk).update(
            last_error_summary="ValueError: " + "a long message, " * 10 + "\nand a second line"
        )
        out = StringIO()
        call_command("pgoutbox", "deadletters", "list", stdout=out)
        header, *rows = out.getvalue().splitlines()
        assert header.split("  ")[0] == "id"
        for title in ("queue", "job type", "error code", "dead since (UTC)", "error"):
            assert title in header
        assert len(rows) == 2
        # every column starts where its title does, whatever the width of the cells above
        for title, value in (("queue", "webhooks"), ("job type", "tests.behave")):
            row = next(row for row in rows if row.startswith(str(short.pk)))
            assert row.index(value) == header.index(title)
        row = next(row for row in rows if row.startswith(str(long.pk)))
        error = row[header.rindex("error") :]  # the last column, not "error code"
        assert error.startswith("ValueError: a long message,")
        assert error.endswith("…")
        assert len(error) == 60

    @pytest.mark.parametrize("use_tz", [True, False])
    def test_list_shows_utc_whatever_the_time_zone(self, settings: Any, use_tz: bool) -> None:
        """The column says UTC: with ``USE_TZ = False`` Django reads times in ``TIME_ZONE``."""
        settings.USE_TZ, settings.TIME_ZONE = use_tz, "Asia/Tokyo"
        job = dead_job(queue="webhooks")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
                "FROM jobs WHERE id = %s",
                [job.pk],
            )
            (utc,) = cursor.fetchone()
        out = StringIO()
        call_command("pgoutbox", "deadletters", "list", stdout=out)
        (row,) = [line for line in out.getvalue().splitlines() if str(job.pk) in line]
        assert utc in row

    @pytest.mark.parametrize("option", ["--queue", "--job-type", "--code"])
    def test_a_nul_byte_in_a_filter_is_a_usage_error(self, option: str) -> None:
        """It reached PostgreSQL, and the command died with a DataError traceback."""
        with pytest.raises(CommandError, match="NUL"):
            call_command("pgoutbox", "deadletters", "list", option, "x\x00y")

    def test_list_says_when_there_is_nothing(self) -> None:
        out = StringIO()
        call_command("pgoutbox", "deadletters", "list", stdout=out)
        assert out.getvalue() == "No dead jobs.\n"
        out = StringIO()
        call_command("pgoutbox", "deadletters", "list", "--queue", "webhooks", stdout=out)
        assert out.getvalue() == "No dead jobs match.\n"

    def test_bad_arguments(self) -> None:
        with pytest.raises(CommandError, match="give job ids, or --all"):
            call_command("pgoutbox", "deadletters", "retry")
        with pytest.raises(CommandError, match="is not a job id"):
            call_command("pgoutbox", "deadletters", "show", "nope")
        with pytest.raises(CommandError, match="no dead job"):
            call_command("pgoutbox", "deadletters", "show", str(uuid.uuid4()))
