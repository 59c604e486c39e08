"""Queues paused, resumed and resized at run time, attacked through the API, the command, the
admin, health and metrics: rows written by hand, odd values, odd names."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgoutbox.queue_controls import queue_statuses

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = '{"CONCURRENCY": 2, "X": ' + "[" * 3000 + "]" * 3000 + "}"


def _write_by_hand(overrides: str, queue: str = "default") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_controls (queue, paused_at, overrides) "
            "VALUES (%s, now(), %s::jsonb)",
            [queue, overrides],
        )


def _staff(*permissions: str) -> Client:
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "overrides",
    [
        '{"RATE_LIMIT": 1e400}',
        '{"RATE_LIMIT": ' + "9" * 5000 + "}",
        DEEP,
        '{"' + "k" * 100_000 + '": 1}',
    ],
    ids=["huge-number", "past-int-digits", "deep-nesting", "huge-key"],
)
def test_a_row_python_cannot_decode_breaks_no_page_report_or_command(overrides: str) -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_pgoutbox.health import health_report
    from django_pgoutbox.prometheus import queue_control_gauges

    _write_by_hand(overrides)
    status = queue_statuses()["default"]
    assert status.paused  # the pause applies; the values that cannot be read do not
    assert status.concurrency == status.settings.concurrency
    assert status.problems
    assert all(len(problem) < 300 for problem in status.problems)
    assert health_report(require=["jobs"]).paused_queues == ["default"]
    assert list(queue_control_gauges(None))
    out = StringIO()
    call_command("pgoutbox", "queues", stdout=out)
    assert "default" in out.getvalue()
    page = _staff("view_job", "change_job").get(reverse("admin:pgoutbox_overview"))
    assert page.status_code == 200


def _act(client: Client, queue: str, action: str, **data: str) -> Any:
    url = reverse("admin:pgoutbox_queue_action", kwargs={"name": queue, "action": action})
    return client.post(url, data, follow=True)


def _rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM queue_controls")
        return int(cursor.fetchone()[0])


def test_who_paused_is_shown_escaped_on_the_overview() -> None:
    from django_pgoutbox.queue_controls import pause_queue, resize_queue

    pause_queue("reports", by='<script>alert("p")</script>')
    resize_queue("default", concurrency=3, by="<img src=x onerror=alert(1)>")
    page = _staff("view_job").get(reverse("admin:pgoutbox_overview"))
    assert page.status_code == 200
    assert b"<script>alert" not in page.content
    assert b"<img src=x" not in page.content
    assert b"&lt;script&gt;alert" in page.content


@pytest.mark.parametrize(
    "form",
    [
        {"concurrency": "1.5"},
        {"concurrency": "-1"},
        {"concurrency": " "},
        {"concurrency": "1e3"},
        {"concurrency": "9" * 5000},
        {"concurrency": "1001"},
        {"max_running": "-0"},
        {"max_running": "99999999999999999999"},
        {"max_running": "2.0"},
        {"rate_limit": "inf"},
        {"rate_limit": "nan"},
        {"rate_limit": "1e400"},
        {"rate_limit": "0"},
        {"rate_limit": "-3"},
        {"rate_limit": "1" * 400},
        {"rate_limit": "\x00"},
    ],
)
def test_the_resize_form_refuses_odd_values_and_writes_nothing(form: dict[str, str]) -> None:
    client = _staff("view_job", "change_job")
    was = {"was_concurrency": "1", "was_max_running": "", "was_rate_limit": ""}
    fields = {"concurrency": "1", "max_running": "", "rate_limit": "", **form}
    response = _act(client, "reports", "resize", **fields, **was)
    assert response.status_code == 200
    assert b"Nothing was changed" in response.content
    assert _rows() == 0


def test_the_overview_forms_refuse_without_csrf_permission_or_a_queue() -> None:
    csrf = Client(enforce_csrf_checks=True)
    user = User.objects.create_user("ch", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_job"))
    csrf.force_login(user)
    url = reverse("admin:pgoutbox_queue_action", kwargs={"name": "reports", "action": "pause"})
    assert csrf.post(url).status_code == 403
    other = User.objects.create_user("other", password="pw", is_staff=True)
    other.user_permissions.add(Permission.objects.get(codename="change_user"))
    client = Client()
    client.force_login(other)
    assert client.post(url).status_code == 403
    changer = Client()
    changer.force_login(user)
    for name in ["x" * 5000, "réports", "reports\x00", " reports", "reports%2F.."]:
        response = _act(changer, name, "pause")
        assert response.status_code == 200
        assert b"Nothing was changed" in response.content
    assert changer.post(url.replace("/reports/", "/a/b/")).status_code in (302, 404)
    assert _rows() == 0


def test_a_paused_queue_no_longer_configured_is_not_shown_as_running() -> None:
    """A queue paused, then taken out of PGOUTBOX['QUEUES'] while its jobs wait: the overview
    shows their row (unregistered) without claiming that a worker runs them."""
    import uuid

    from django_pgoutbox.models import Job

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_controls (queue, paused_at, paused_by) "
            "VALUES ('retired', now(), 'ops')"
        )
    Job.objects.create(id=uuid.uuid4(), job_type="tests.noop", queue="retired", payload={})
    page = _staff("view_job", "change_job").get(reverse("admin:pgoutbox_overview"))
    assert page.status_code == 200
    text = page.content.decode()
    rows = [row for row in text.split("<tr") if "queue-state" in row]
    configured = set(queue_statuses())
    unconfigured = [row for row in rows if not any(f'id="queue-{n}"' in row for n in configured)]
    assert unconfigured, "the unregistered jobs' row is shown"
    assert all(">running<" not in row for row in unconfigured), unconfigured


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "1e3"],
        ["--concurrency", "none"],
        ["--concurrency", "0x10"],
        ["--rate-limit", "inf"],
        ["--rate-limit", "nan"],
        ["--rate-limit", "-0"],
        ["--max-running", "-0"],
        ["--max-running", "1.0"],
        ["--max-running", "9" * 5000],
    ],
)
def test_the_command_refuses_odd_values_and_writes_nothing(args: list[str]) -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises((CommandError, SystemExit)):
        call_command("pgoutbox", "queues", "resize", "default", *args)
    assert _rows() == 0


def test_the_command_takes_none_and_default_in_any_case() -> None:
    from io import StringIO

    from django.core.management import call_command

    call_command(
        "pgoutbox", "queues", "resize", "default", "--max-running", "NONE", stdout=StringIO()
    )
    assert queue_statuses()["default"].overridden == {"MAX_RUNNING"}
    call_command(
        "pgoutbox", "queues", "resize", "default", "--max-running", "Default", stdout=StringIO()
    )
    assert queue_statuses()["default"].overridden == frozenset()


def test_health_metrics_and_overview_answer_without_the_queue_controls_table() -> None:
    """A release with queue_controls served against a database whose migration 0009 is not
    applied yet (the workers run their queues as the settings say): health and metrics still
    answer, and say why paused queues are unknown, rather than fail with a 500."""
    from django.test import override_settings

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_controls RENAME TO queue_controls_away")
    try:
        client = _staff("view_job", "change_job")
        with override_settings(PGOUTBOX={**_pgoutbox(), "VIEWS_AUTH": {"STAFF": True}}):
            health = client.get("/pgoutbox/health?require=jobs")
            metrics = client.get("/pgoutbox/metrics")
        assert health.status_code in (200, 503), health.content[:300]
        assert "queue_controls" in " ".join(health.json().get("warnings", [])), health.json()
        assert metrics.status_code == 200, metrics.content[:300]
        assert b"pgoutbox_jobs" in metrics.content
        page = client.get(reverse("admin:pgoutbox_overview"))
        assert page.status_code == 200
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE queue_controls_away RENAME TO queue_controls")


def _pgoutbox() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.PGOUTBOX)
