"""Queues paused, resumed and resized at run time, attacked through the API, the command, the
admin, health and metrics: rows written by hand, odd values, odd names."""

from __future__ import annotations

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
