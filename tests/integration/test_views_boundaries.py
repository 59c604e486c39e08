"""The health view at its boundaries: every parameter refused with a 400 that names it;
``pgoutbox health``'s arguments likewise. Django's test client against the real view and a real
database."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client

from django_pgoutbox.health import Heartbeat

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("staff", is_staff=True))
    return client


@pytest.fixture
def beating() -> Heartbeat:
    """One heartbeat row, written in the test's transaction (rolled back with it)."""
    beat = Heartbeat("w-secret-id", ["jobs"], ["default"], "default")
    beat.beat()
    return beat


@pytest.fixture
def extra_databases(db: None) -> Iterator[None]:
    """A SQLite alias in DATABASES (added once the test's databases are set up)."""
    settings.DATABASES["lite"] = {
        **settings.DATABASES["default"],
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
    }
    try:
        yield
    finally:
        del settings.DATABASES["lite"]


class TestHealthParameters:
    @pytest.mark.parametrize(
        ("query", "error"),
        [
            ("require=", "require names no role"),
            ("require=,", "require names no role"),
            ("require=,,%20,", "require names no role"),
            ("require=jobs,workers", "require: 'workers' is not a role"),
            ("require=JOBS", "require: 'JOBS' is not a role"),
            ("require=" + "j" * 10_000, "require: 'jjjjjjjjj"),
            ("require=jobs&require=relay", "require is given 2 times"),
            ("max_age=nan", "max_age must be a number of seconds > 0 and <= 86400, not 'nan'"),
            ("max_age=NaN", "max_age must be"),
            ("max_age=inf", "max_age must be"),
            ("max_age=-1", "max_age must be"),
            ("max_age=0", "max_age must be"),
            ("max_age=86401", "max_age must be"),
            ("max_age=1e309", "max_age must be"),
            ("max_age=", "max_age must be"),
            ("max_age=soon", "max_age must be"),
            ("max_age=30&max_age=30", "max_age is given 2 times"),
            ("database=", "database must be the alias of a PostgreSQL database"),
            ("database=nope", "database must be the alias"),
            ("database=lite", "database must be the alias"),
            ("requires=jobs", "unknown parameter 'requires'"),
            ("max-age=30", "unknown parameter 'max-age'"),
            ("%C3%A9=1", "unknown parameter 'é'"),
        ],
    )
    def test_refused_with_a_400_naming_the_parameter(
        self, staff_client: Client, extra_databases: None, query: str, error: str
    ) -> None:
        response = staff_client.get(f"/pgoutbox/health?{query}")
        assert response.status_code == 400, response.content[:200]
        assert error in response.json()["error"]
        assert len(response.content) < 400

    def test_an_empty_require_is_not_healthy_without_workers(self, staff_client: Client) -> None:
        for query in ("require=", "require=,", "require=%20"):
            assert staff_client.get(f"/pgoutbox/health?{query}").status_code == 400

    def test_the_limits_themselves_are_accepted(self, staff_client: Client) -> None:
        for query in ("max_age=86400", "max_age=0.001", "max_age=1e1", "require=%20jobs%20,relay"):
            assert staff_client.get(f"/pgoutbox/health?{query}").status_code == 503, query

    @pytest.mark.django_db(databases=["default", "secondary"])
    def test_a_database_that_cannot_be_read_is_unhealthy(self, staff_client: Client) -> None:
        with connections["secondary"].cursor() as cursor:  # undone with the test's transaction
            cursor.execute("ALTER TABLE worker_heartbeats RENAME TO worker_heartbeats_away")
        response = staff_client.get("/pgoutbox/health?database=secondary")
        assert response.status_code == 503
        assert response.json() == {"healthy": False, "error": "the heartbeats could not be read"}

    @pytest.mark.django_db(transaction=True, databases=["default", "direct"])
    def test_a_mirror_of_the_default_database_is_accepted(self, staff_client: Client) -> None:
        Heartbeat("w-direct", ["jobs"], ["default"], "default").beat()  # committed
        response = staff_client.get("/pgoutbox/health?require=jobs&database=direct")
        assert response.status_code == 200


class TestHealthCommand:
    @pytest.mark.parametrize(
        ("arguments", "error"),
        [
            (["--require", ""], "--require names no role"),
            (["--require", ","], "--require names no role"),
            (["--require", "jobs,nope"], "--require: 'nope' is not a role"),
            (["--max-age", "nan"], "--max-age must be a number of seconds > 0 and <= 86400"),
            (["--max-age", "inf"], "--max-age must be"),
            (["--max-age", "-1"], "--max-age must be"),
            (["--max-age", "0"], "--max-age must be"),
        ],
    )
    def test_misuse_exits_2_naming_the_argument(self, arguments: list[str], error: str) -> None:
        out = StringIO()
        with pytest.raises(CommandError, match=error) as raised:
            call_command("pgoutbox", "health", *arguments, stdout=out)
        assert raised.value.returncode == 2
        assert out.getvalue() == ""

    def test_a_role_alive_exits_0(self, beating: Heartbeat) -> None:
        out = StringIO()
        call_command("pgoutbox", "health", "--require", "jobs", stdout=out)
        assert '"healthy": true' in out.getvalue()
