"""The overview's charts: the minutes that workers and maintenance write (``queue_minutes``),
what is read back, and the SVG drawn from it."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgoutbox import enqueue_many, metrics
from django_pgoutbox.admin import charts
from django_pgoutbox.queue_minutes import (
    KEPT_HOURS,
    Minute,
    OutcomeCounts,
    recent_minutes,
    sample_backlogs,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _rows() -> dict[str, tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, completed, failed, dead, backlog, oldest_pending_age FROM queue_minutes"
        )
        return {row[0]: row[1:] for row in cursor.fetchall()}


def test_a_process_adds_what_its_workers_wrote_since_its_last_write() -> None:
    counts = OutcomeCounts(["default", "reports"])
    with connection.cursor() as cursor:
        counts.add(cursor)  # what earlier tests of this process counted: the starting point
        cursor.execute("DELETE FROM queue_minutes")
        metrics.JOB_OUTCOMES.inc_key(("default", "tests.noop", "completed"), 5)
        metrics.JOB_OUTCOMES.inc_key(("default", "tests.noop", "retrying"), 2)
        metrics.JOB_OUTCOMES.inc_key(("default", "tests.noop", "dead"), 1)
        metrics.JOB_OUTCOMES.inc_key(("reports", "tests.noop", "cancelled"), 4)
        metrics.JOB_OUTCOMES.inc_key(("webhooks", "tests.noop", "completed"), 9)  # not its queue
        assert counts.add(cursor) == 1
        assert counts.add(cursor) == 0  # nothing new: nothing written
        metrics.JOB_OUTCOMES.inc_key(("default", "tests.noop", "completed"), 1)
        counts.add(cursor)
    assert _rows() == {"default": (6, 3, 1, None, None)}


def test_maintenance_samples_the_backlog_and_prunes_old_minutes() -> None:
    enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 7)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_minutes (queue, minute, completed) "
            "VALUES ('default', now() - make_interval(hours => %s), 1)",
            [KEPT_HOURS + 1],
        )
    assert sample_backlogs() == 8  # the configured queues
    rows = _rows()
    assert rows["default"][3] == 7
    assert rows["reports"][3] == 0
    assert len(rows) == 8  # the old minute is gone
    enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 3)
    sample_backlogs()
    assert _rows()["default"][3] == 10  # the largest sample of the minute


def test_recent_minutes_has_a_point_per_minute_with_gaps() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_minutes (queue, minute, completed, failed) VALUES "
            "('default', date_trunc('minute', now()) - interval '5 minutes', 10, 1), "
            "('gone', date_trunc('minute', now()), 3, 0)"
        )
    minutes = recent_minutes(1)
    assert list(minutes)[-1] == "gone"  # a queue no longer configured, after the configured
    default = minutes["default"]
    assert len(default) == 61
    assert default[-1].at - default[0].at == timedelta(hours=1)
    assert [m.completed for m in default[-7:]] == [None, 10, None, None, None, None, None]
    assert recent_minutes(10_000)["default"][0].at == default[-1].at - timedelta(hours=KEPT_HOURS)


def test_a_chart_draws_gaps_escapes_and_says_what_it_shows() -> None:
    points = [Minute(at=None, completed=v) for v in (1, 2, None, 4)]  # type: ignore[arg-type]
    svg = str(
        charts.chart(
            "<b>Jobs</b>", [charts.Series("done & <ok>", [m.completed for m in points], "red")], 3
        )
    )
    assert "<b>" not in svg
    assert "&lt;b&gt;Jobs&lt;/b&gt;" in svg
    assert "done &amp; &lt;ok&gt;" in svg
    assert "max 4, last 4" in svg
    (path,) = re.findall(r'd="([^"]*)"', svg)
    assert path.count("M") == 2  # the gap starts a new segment
    assert path.endswith("l0.5 0")  # the last minute, alone after the gap: a dot
    empty = str(charts.chart("Backlog", [charts.Series("waiting", [None, None], "red")], 3))
    assert "no data yet" in empty
    assert "<path" not in empty


@pytest.mark.parametrize("hours", ["3", "abc", "-1", "100000", "1e9", ""])
def test_the_overview_draws_the_charts_for_any_window_asked(hours: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_minutes (queue, minute, completed, failed, backlog) "
            "VALUES ('default', date_trunc('minute', now()), 10, 2, 5)"
        )
    admin = User.objects.create_superuser("admin", password="pw")
    client = Client()
    client.force_login(admin)
    page = client.get(reverse("admin:pgoutbox_overview"), {"hours": hours})
    assert page.status_code == 200
    content = page.content.decode()
    assert 'id="charts-default"' in content
    assert content.count('<svg class="pgoutbox-chart"') == 3 * 8
    assert "completed: max 10, last 10" in content
    shown = hours if hours in ("3",) else "3"
    assert f"<strong>{shown} h</strong>" in content
