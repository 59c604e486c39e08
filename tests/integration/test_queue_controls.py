"""Queues paused, resumed and resized at run time: the API, what it refuses, what it tells the
workers, a row that no worker can use, the command and the admin's overview."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgoutbox.conf import CONTROL_CHANNEL
from django_pgoutbox.db import raw_connection_params
from django_pgoutbox.queue_controls import (
    DEFAULT,
    Control,
    QueueControlError,
    pause_queue,
    paused_queues,
    queue_statuses,
    resize_queue,
    resume_queue,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_and_resume_keep_who_and_when() -> None:
    first = pause_queue("reports", by="alice")
    again = pause_queue("reports", by="bob")
    assert again.paused
    assert (again.paused_at, again.paused_by) == (first.paused_at, "alice")
    assert again.updated_by == "bob"
    assert paused_queues() == ["reports"]
    assert not resume_queue("reports").paused
    assert not resume_queue("reports").paused  # resuming a running queue changes nothing
    assert paused_queues() == []


def test_resize_sets_lifts_and_resets_values() -> None:
    status = resize_queue("default", concurrency=9, max_running=None, rate_limit=2)
    assert (status.concurrency, status.max_running, status.rate_limit) == (9, None, 2.0)
    assert status.overridden == {"CONCURRENCY", "MAX_RUNNING", "RATE_LIMIT"}
    status = resize_queue("default", rate_limit=DEFAULT)
    assert status.overridden == {"CONCURRENCY", "MAX_RUNNING"}
    assert status.rate_limit == status.settings.rate_limit
    status = resize_queue("default", concurrency=DEFAULT, max_running=DEFAULT)
    assert status.overridden == frozenset()
    assert status.concurrency == status.settings.concurrency


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: pause_queue("nope"), "name"),
        (lambda: pause_queue(None), "name"),  # type: ignore[arg-type]
        (lambda: pause_queue("x" * 10_000), "name"),
        (lambda: pause_queue("default", using="nowhere"), "using"),
        (lambda: pause_queue("default", by="\x00"), "by"),
        (lambda: resize_queue("default"), "resize_queue"),
        (lambda: resize_queue("default", concurrency=0), "concurrency"),
        (lambda: resize_queue("default", concurrency=True), "concurrency"),
        (lambda: resize_queue("default", concurrency=None), "concurrency"),  # type: ignore[arg-type]
        (lambda: resize_queue("default", concurrency=10**6), "concurrency"),
        (lambda: resize_queue("default", max_running=0), "max_running"),
        (lambda: resize_queue("default", max_running=2**40), "max_running"),
        (lambda: resize_queue("default", max_running=1.5), "max_running"),  # type: ignore[arg-type]
        (lambda: resize_queue("default", rate_limit=float("nan")), "rate_limit"),
        (lambda: resize_queue("default", rate_limit=-1), "rate_limit"),
        (lambda: resize_queue("default", rate_limit="5"), "rate_limit"),  # type: ignore[arg-type]
    ],
)
def test_refusals_name_the_argument_and_write_nothing(call: Any, field: str) -> None:
    with pytest.raises(QueueControlError) as raised:
        call()
    assert raised.value.field == field
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM queue_controls")
        assert cursor.fetchone()[0] == 0


def test_each_change_notifies_the_workers_at_commit() -> None:
    with psycopg.connect(**raw_connection_params("default"), autocommit=True) as listener:
        listener.execute(f"LISTEN {CONTROL_CHANNEL}")
        pause_queue("reports")
        resize_queue("default", concurrency=2)
        resume_queue("reports")
        resume_queue("reports")  # nothing changed: nothing said
        heard = [n.payload for n in listener.notifies(timeout=1.0, stop_after=4)]
    assert heard == ["reports", "default", "reports"]


@pytest.mark.parametrize(
    ("overrides", "usable", "problems"),
    [
        ({}, {}, 0),
        ({"CONCURRENCY": 3, "MAX_RUNNING": None}, {"CONCURRENCY": 3, "MAX_RUNNING": None}, 0),
        ({"CONCURRENCY": "many", "RATE_LIMIT": 2}, {"RATE_LIMIT": 2.0}, 1),
        ({"CONCURRENCY": 0, "LEASE_SECONDS": 1, "MAX_RUNNING": -1}, {}, 3),
        ([1, 2], {}, 1),
        ("not json", {}, 1),
        (None, {}, 1),
    ],
)
def test_a_row_written_by_hand_is_used_as_far_as_it_can_be(
    overrides: Any, usable: dict[str, Any], problems: int
) -> None:
    control = Control.from_row("default", None, overrides)
    assert dict(control.overrides) == usable
    assert len(control.problems) == problems
    assert not control.paused


def test_a_row_written_by_hand_shows_what_applies() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_controls (queue, paused_at, overrides) "
            """VALUES ('default', now(), '{"CONCURRENCY": -5, "RATE_LIMIT": 1}')"""
        )
    status = queue_statuses()["default"]
    assert status.paused
    assert status.concurrency == status.settings.concurrency
    assert status.rate_limit == 1.0
    assert len(status.problems) == 1


def test_the_command_lists_pauses_and_resizes() -> None:
    out = StringIO()
    call_command("pgoutbox", "queues", "pause", "reports", stdout=out)
    call_command(
        "pgoutbox",
        "queues",
        "resize",
        "default",
        "--max-running",
        "none",
        "--concurrency",
        "7",
        stdout=out,
    )
    call_command("pgoutbox", "queues", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "queue",
        "state",
        "concurrency",
        "max",
        "running",
        "rate",
        "limit",
        "changed",
        "by",
    ]
    listed = {line.split()[0]: line for line in lines[-8:]}
    assert "paused" in listed["reports"]
    assert "pgoutbox queues pause" in listed["reports"]
    assert "7 (set)" in listed["default"]
    assert "none (set)" in listed["default"]
    with pytest.raises(CommandError, match="no queue 'nope'"):
        call_command("pgoutbox", "queues", "pause", "nope")
    with pytest.raises(CommandError, match="concurrency"):
        call_command("pgoutbox", "queues", "resize", "default", "--concurrency", "0")


def _user(*permissions: str) -> Client:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def _act(client: Client, queue: str, action: str, **data: str) -> Any:
    url = reverse("admin:pgoutbox_queue_action", kwargs={"name": queue, "action": action})
    return client.post(url, data, follow=True)


def test_the_overview_pauses_resumes_resizes_and_resets() -> None:
    client = _user("view_job", "change_job")
    page = client.get(reverse("admin:pgoutbox_overview"))
    assert b'id="pause-reports"' in page.content
    response = _act(client, "reports", "pause")
    assert b"Queue reports is paused" in response.content
    assert b'id="resume-reports"' in response.content
    assert queue_statuses()["reports"].paused_by == "admin user op"
    # Only the fields changed on the page are set; a blank limit is none.
    was = {"was_concurrency": "1", "was_max_running": "", "was_rate_limit": ""}
    _act(client, "reports", "resize", concurrency="1", max_running="3", rate_limit="", **was)
    status = queue_statuses()["reports"]
    assert status.overridden == {"MAX_RUNNING"}
    assert status.max_running == 3
    response = _act(
        client, "reports", "resize", concurrency="zero", max_running="3", rate_limit="", **was
    )
    assert b"Nothing was changed: concurrency: must be a whole number" in response.content
    _act(client, "reports", "reset")
    _act(client, "reports", "resume")
    status = queue_statuses()["reports"]
    assert not status.paused
    assert status.overridden == frozenset()


def test_the_overview_refuses_who_may_not_change_jobs_and_what_is_not_a_post() -> None:
    client = _user("view_job")
    page = client.get(reverse("admin:pgoutbox_overview"))
    assert page.status_code == 200
    assert b'id="pause-' not in page.content
    assert _act(client, "reports", "pause").status_code == 403
    url = reverse("admin:pgoutbox_queue_action", kwargs={"name": "reports", "action": "pause"})
    assert not queue_statuses()["reports"].paused
    assert Client().post(url).status_code == 302  # not logged in: to the login page
    staff = User.objects.create_user("ch", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="change_job"))
    other = Client()
    other.force_login(staff)
    assert other.get(url).status_code == 405
    response = _act(other, "nope\x00", "pause")
    assert response.status_code == 200
    assert b"Nothing was changed" in response.content
    response = _act(other, "reports", "explode")
    assert b"is not pause, resume, resize or reset" in response.content
    assert not queue_statuses()["reports"].paused


def test_health_and_metrics_show_paused_queues_and_the_values_in_effect() -> None:
    from django_pgoutbox.health import health_report
    from django_pgoutbox.prometheus import queue_control_gauges

    pause_queue("reports", by="alice")
    resize_queue("default", max_running=5)
    report = health_report(require=["jobs"])
    assert report.paused_queues == ["reports"]
    assert any("queue reports is paused (by alice" in w for w in report.warnings)
    assert report.as_dict()["paused_queues"] == ["reports"]
    families = {family.name: family for family in queue_control_gauges(None)}
    paused = {s.labels["queue"]: s.value for s in families["pgoutbox_queue_paused"].samples}
    assert paused["reports"] == 1.0
    assert paused["default"] == 0.0
    limits = {
        (s.labels["queue"], s.labels["limit"]): s.value
        for s in families["pgoutbox_queue_limit"].samples
    }
    assert limits[("default", "max_running")] == 5.0
    assert ("default", "rate_limit") not in limits


def test_stats_marks_paused_queues() -> None:
    pause_queue("reports")
    out = StringIO()
    call_command("pgoutbox", "stats", stdout=out)
    assert "reports (paused)" in out.getvalue()
    out = StringIO()
    call_command("pgoutbox", "stats", "--json", stdout=out)
    assert json.loads(out.getvalue())["paused_queues"] == ["reports"]
