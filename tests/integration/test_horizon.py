"""Who holds the xmin horizon: found by ``gauges.horizon_holder()``, shown with a warning past
``PGOUTBOX["HORIZON_WARNING_SECONDS"]`` by ``pgoutbox stats``, the health report (view and
command) and the admin's overview; never a reason to report unhealthy.

A second psycopg connection holds the horizon. The tests need no ``transaction=True``: the
holder commits nothing, and each test reads ``pg_stat_activity`` once it is in place (a
transaction keeps the first snapshot of it that it reads).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings

from django_pgoutbox import checks, gauges
from django_pgoutbox.conf import parse_settings
from django_pgoutbox.db import raw_connection_params
from django_pgoutbox.health import Heartbeat

pytestmark = pytest.mark.django_db

KEY = "PGOUTBOX['HORIZON_WARNING_SECONDS']"


def warning_after(seconds: Any) -> Any:
    return override_settings(PGOUTBOX={**settings.PGOUTBOX, "HORIZON_WARNING_SECONDS": seconds})


class Held:
    """A session holding the horizon: REPEATABLE READ, one query run, idle in transaction."""

    def __init__(self, conn: psycopg.Connection[Any], application_name: str, query: str):
        self.conn = conn
        self.pid = conn.info.backend_pid
        self.application_name = application_name
        self.query = query


def hold(alias: str = "default", query: str = "SELECT count(*) FROM jobs") -> Iterator[Held]:
    name = f"report-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**raw_connection_params(alias), application_name=name) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute(query)  # the snapshot is taken, and kept until the transaction ends
        yield Held(conn, name, query)
        conn.rollback()


@pytest.fixture
def held() -> Iterator[Held]:
    yield from hold()


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("staff", is_staff=True, is_superuser=True))
    return client


def stats_json() -> dict[str, Any]:
    out = StringIO()
    call_command("pgoutbox", "stats", "--json", stdout=out)
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def stats_text() -> str:
    out = StringIO()
    call_command("pgoutbox", "stats", stdout=out)
    return out.getvalue()


class TestTheHolder:
    def test_a_repeatable_read_session_idle_in_transaction(self, held: Held) -> None:
        holder = gauges.horizon_holder()
        assert holder is not None
        assert holder.kind == "session"
        assert holder.pid == held.pid
        assert holder.application_name == held.application_name
        assert holder.state == "idle in transaction"
        assert holder.query == held.query
        assert holder.user == connection.settings_dict["USER"]
        assert holder.age is not None
        assert holder.age >= 0
        assert holder.xmin_age >= 0
        assert f"session pid {held.pid}" in holder.describe()

    def test_nothing_holds_it(self) -> None:
        assert gauges.horizon_holder() is None

    def test_the_query_is_cut_to_200_characters(self) -> None:
        long_query = f"SELECT '{'x' * 300}'"
        for held in hold(query=long_query):
            holder = gauges.horizon_holder()
            assert holder is not None
            assert holder.pid == held.pid
            assert holder.query == long_query[:200]

    @pytest.mark.django_db(databases=["default", "secondary"])
    def test_a_session_of_another_database_holds_nothing_of_this_one(self) -> None:
        for held in hold("secondary", "SELECT 1"):
            assert held.pid  # its snapshot holds back the tables of its own database alone
            assert gauges.horizon_holder() is None

    def test_a_prepared_transaction(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('max_prepared_transactions')::int")
            if cursor.fetchone()[0] == 0:
                pytest.skip(
                    "the server has max_prepared_transactions = 0: no transaction can be prepared"
                )
        gid = f"pgoutbox-horizon-{uuid.uuid4().hex[:8]}"
        with psycopg.connect(**raw_connection_params("default")) as conn:
            conn.execute("SELECT pg_current_xact_id()")  # a transaction id, which it keeps
            conn.execute(f"PREPARE TRANSACTION '{gid}'")
            conn.autocommit = True  # ROLLBACK PREPARED runs outside a transaction block
            try:
                holder = gauges.horizon_holder()
                assert holder is not None
                assert (holder.kind, holder.name, holder.pid) == ("prepared", gid, None)
                assert holder.age is not None
                assert holder.age >= 0
                assert f"prepared transaction {gid!r}" in holder.describe()
            finally:
                conn.execute(f"ROLLBACK PREPARED '{gid}'")


class TestTheWarning:
    def test_stats_over_the_threshold(self, held: Held) -> None:
        with warning_after(0):
            data = stats_json()
            text = stats_text()
        assert data["horizon"]["pid"] == held.pid
        assert data["horizon"]["application_name"] == held.application_name
        assert data["horizon"]["kind"] == "session"
        [warning] = data["warnings"]
        assert f"session pid {held.pid} has held the xmin horizon" in warning
        assert "HORIZON_WARNING_SECONDS" in warning
        assert f"xmin horizon: held by session pid {held.pid}" in text
        assert f"application {held.application_name!r}" in text
        assert "idle in transaction" in text
        assert held.query in text
        assert f"WARNING: session pid {held.pid}" in text

    def test_stats_under_the_threshold_or_with_no_threshold(self, held: Held) -> None:
        for threshold in (3600, None):
            with warning_after(threshold):
                data = stats_json()
                text = stats_text()
            assert data["horizon"]["pid"] == held.pid
            assert data["warnings"] == []
            assert f"held by session pid {held.pid}" in text
            assert "WARNING" not in text

    def test_stats_with_nothing_holding_it(self) -> None:
        with warning_after(0):
            data = stats_json()
            text = stats_text()
        assert data["horizon"] is None
        assert data["warnings"] == []
        assert "xmin horizon: held by no one" in text
        assert "WARNING" not in text

    def test_the_health_view_warns_and_stays_healthy(
        self, held: Held, staff_client: Client, client: Client
    ) -> None:
        Heartbeat("w-horizon", ["jobs"], ["default"], "default").beat()
        with warning_after(0):
            response = staff_client.get("/pgoutbox/health?require=jobs")
        assert response.status_code == 200
        report = response.json()
        assert report["healthy"] is True
        assert report["horizon"]["pid"] == held.pid
        assert report["horizon"]["query"] == held.query
        [warning] = report["warnings"]
        assert f"session pid {held.pid}" in warning
        # The query text goes only to the callers VIEWS_AUTH admits.
        refused = client.get("/pgoutbox/health?require=jobs")
        assert refused.status_code == 403
        assert held.query not in refused.content.decode()

    def test_the_health_view_with_nothing_holding_it(self, staff_client: Client) -> None:
        with warning_after(0):
            report = staff_client.get("/pgoutbox/health").json()
        assert (report["healthy"], report["horizon"], report["warnings"]) == (False, None, [])

    def test_the_health_command_warns_and_exits_0(self, held: Held) -> None:
        Heartbeat("w-horizon", ["jobs"], ["default"], "default").beat()
        out = StringIO()
        with warning_after(0):
            call_command("pgoutbox", "health", "--require", "jobs", stdout=out)  # no exit 1
        report = json.loads(out.getvalue())
        assert report["healthy"] is True
        assert report["horizon"]["application_name"] == held.application_name
        assert len(report["warnings"]) == 1

    def test_the_admin_overview(self, held: Held, staff_client: Client) -> None:
        with warning_after(0):
            page = staff_client.get("/admin/pgoutbox/job/overview/").content.decode()
        assert '<p id="horizon" class="errornote">' in page
        assert f"session pid {held.pid}" in page
        assert held.application_name in page
        assert "Warning:" in page

    def test_the_admin_overview_under_the_threshold(self, held: Held, staff_client: Client) -> None:
        with warning_after(None):
            page = staff_client.get("/admin/pgoutbox/job/overview/").content.decode()
        assert '<p id="horizon">' in page
        assert f"session pid {held.pid}" in page
        assert "Warning:" not in page

    def test_the_admin_overview_with_nothing_holding_it(self, staff_client: Client) -> None:
        with warning_after(0):
            page = staff_client.get("/admin/pgoutbox/job/overview/").content.decode()
        assert '<p id="horizon">Held by no one.</p>' in page


class TestTheSetting:
    def test_the_default_and_the_accepted_values(self) -> None:
        assert parse_settings(None)[0].horizon_warning_seconds == 300.0
        for value, seconds in ((None, None), (0, 0.0), (90.5, 90.5), (timedelta(minutes=5), 300.0)):
            parsed, problems = parse_settings({"HORIZON_WARNING_SECONDS": value})
            assert problems == []
            assert parsed.horizon_warning_seconds == seconds

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("300", "must be a number of seconds or a timedelta, not '300'."),
            (True, "must be a number of seconds or a timedelta, not True."),
            (-1, "must be >= 0 seconds, not -1."),
            (math.nan, "must be >= 0 seconds, not nan."),
            (math.inf, "must be >= 0 seconds, not inf."),
            (1e12, "must be at most 31536000 seconds (365 days), not 1000000000000.0."),
        ],
    )
    def test_a_bad_value_is_named(self, value: Any, message: str) -> None:
        _, problems = parse_settings({"HORIZON_WARNING_SECONDS": value})
        assert [(p.check_id, p.key, p.message) for p in problems] == [
            ("pgoutbox.E004", KEY, message)
        ]

    def test_a_bad_value_fails_the_check(self) -> None:
        with warning_after(-5):
            messages = checks.check_settings(None)
        assert [(m.id, m.msg) for m in messages] == [
            ("pgoutbox.E004", f"{KEY} must be >= 0 seconds, not -5.")
        ]
