"""The monitoring views at their boundaries: who may read them, and every parameter refused
with a 400 that names it; ``pgoutbox health``'s arguments likewise. Django's test client
against the real views and a real database."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client, override_settings

from django_pgoutbox.conf import MIN_TOKEN_LENGTH, parse_settings
from django_pgoutbox.health import Heartbeat

pytestmark = pytest.mark.django_db

TOKEN = "t0ken-" + "x" * 26
VIEWS = ("/pgoutbox/metrics", "/pgoutbox/health")


def admitted_by(request: Any) -> bool:
    """A VIEWS_AUTH callable: admits requests from a header the test sets."""
    return bool(request.headers.get("X-Monitoring") == "yes")


def truthy_but_not_true(request: Any) -> Any:
    return "yes"


def views_auth(**rules: Any) -> Any:
    return override_settings(PGOUTBOX={**settings.PGOUTBOX, "VIEWS_AUTH": rules})


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("staff", is_staff=True))
    return client


@pytest.fixture
def user_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("someone"))
    return client


@pytest.fixture
def beating() -> Heartbeat:
    """One heartbeat row, written in the test's transaction (rolled back with it)."""
    beat = Heartbeat("w-secret-id", ["jobs"], ["default"], "default")
    beat.beat()
    return beat


class TestWhoMayRead:
    @pytest.mark.parametrize("url", VIEWS)
    def test_anonymous_is_refused_before_anything_is_read(
        self, client: Client, url: str, beating: Heartbeat
    ) -> None:
        response = client.get(url)
        assert response.status_code == 403
        body = response.content.decode()
        for secret in (socket.gethostname(), "w-secret-id", "pgoutbox_jobs"):
            assert secret not in body

    @pytest.mark.parametrize("url", VIEWS)
    def test_a_user_who_is_not_staff_is_refused(self, user_client: Client, url: str) -> None:
        assert user_client.get(url).status_code == 403

    @pytest.mark.parametrize("url", VIEWS)
    def test_staff_may_read_by_default(self, staff_client: Client, url: str) -> None:
        response = staff_client.get(url)
        assert response.status_code in (200, 503)  # health: no worker runs
        assert "no-store" in response["Cache-Control"]

    def test_an_inactive_staff_user_is_refused(self, client: Client) -> None:
        client.force_login(User.objects.create_user("gone", is_staff=True, is_active=False))
        assert client.get("/pgoutbox/metrics").status_code == 403

    def test_only_authorised_callers_see_hosts_pids_and_worker_ids(
        self, client: Client, staff_client: Client, beating: Heartbeat
    ) -> None:
        shown = staff_client.get("/pgoutbox/health?require=jobs")
        assert shown.status_code == 200
        assert shown.json()["workers"][0]["worker_id"] == "w-secret-id"
        assert shown.json()["workers"][0]["hostname"] == socket.gethostname()
        client.logout()
        assert client.get("/pgoutbox/health?require=jobs").status_code == 403

    def test_a_permission(self, user_client: Client, staff_client: Client) -> None:
        with views_auth(STAFF=False, PERMISSION="pgoutbox.view_job"):
            assert user_client.get("/pgoutbox/metrics").status_code == 403
            assert staff_client.get("/pgoutbox/metrics").status_code == 403  # STAFF is off
            user = User.objects.get(username="someone")
            user.user_permissions.add(Permission.objects.get(codename="view_job"))
            assert user_client.get("/pgoutbox/metrics").status_code == 200

    def test_a_callable_by_its_dotted_path(self, client: Client) -> None:
        with views_auth(CALLABLE=f"{__name__}.admitted_by"):
            assert client.get("/pgoutbox/metrics").status_code == 403
            assert client.get("/pgoutbox/metrics", headers={"X-Monitoring": "yes"}).status_code == (
                200
            )

    def test_a_callable_must_return_true_itself(self, client: Client) -> None:
        with views_auth(CALLABLE=truthy_but_not_true):
            assert client.get("/pgoutbox/metrics").status_code == 403

    def test_a_bearer_token(self, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("PGOUTBOX_TEST_TOKEN", TOKEN)
        with views_auth(BEARER_TOKEN_ENV="PGOUTBOX_TEST_TOKEN"):
            for scheme in ("Bearer", "bearer", "BEARER"):
                response = client.get(
                    "/pgoutbox/metrics", headers={"Authorization": f"{scheme} {TOKEN}"}
                )
                assert response.status_code == 200, scheme
            for header in (
                "",
                "Bearer",
                "Bearer ",
                f"Bearer {TOKEN[:-1]}",
                f"Bearer {TOKEN}x",
                f"Basic {TOKEN}",
                f"Token {TOKEN}",
                "Bearer " + "é" * 40,
                "Bearer \u2603\u2603",
                "Bearer " + "x" * 100_000,
            ):
                refused = client.get("/pgoutbox/health", headers={"Authorization": header})
                assert refused.status_code == 401, header[:20]
                assert refused["WWW-Authenticate"] == 'Bearer realm="pgoutbox"'
                assert refused.json() == {"error": "authentication required"}

    def test_a_token_of_any_characters(
        self, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        token = "jeton-secret-é-☃-" + "x" * 16
        monkeypatch.setenv("PGOUTBOX_TEST_TOKEN", token)
        with views_auth(BEARER_TOKEN_ENV="PGOUTBOX_TEST_TOKEN"):
            # As a client sends it: UTF-8 bytes, which WSGI hands over decoded as latin-1.
            sent = f"Bearer {token}".encode().decode("latin-1")
            response = client.get("/pgoutbox/metrics", HTTP_AUTHORIZATION=sent)
            assert response.status_code == 200
            wrong = f"Bearer {token[:-1]}y".encode().decode("latin-1")
            assert client.get("/pgoutbox/metrics", HTTP_AUTHORIZATION=wrong).status_code == 401

    def test_a_token_too_short_or_unset_admits_no_one(
        self, client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        short = "x" * (MIN_TOKEN_LENGTH - 1)
        with views_auth(BEARER_TOKEN_ENV="PGOUTBOX_TEST_TOKEN"):
            monkeypatch.setenv("PGOUTBOX_TEST_TOKEN", short)
            headers = {"Authorization": f"Bearer {short}"}
            assert client.get("/pgoutbox/metrics", headers=headers).status_code == 401
            monkeypatch.delenv("PGOUTBOX_TEST_TOKEN")
            assert client.get(
                "/pgoutbox/metrics", headers={"Authorization": "Bearer "}
            ).status_code == (401)

    def test_a_token_does_not_stop_staff(
        self, staff_client: Client, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PGOUTBOX_TEST_TOKEN", TOKEN)
        with views_auth(STAFF=True, BEARER_TOKEN_ENV="PGOUTBOX_TEST_TOKEN"):
            assert staff_client.get("/pgoutbox/metrics").status_code == 200
            staff_client.logout()
            assert staff_client.get("/pgoutbox/metrics").status_code == 401

    def test_other_methods_are_not_allowed(self, staff_client: Client) -> None:
        for url in VIEWS:
            assert staff_client.post(url).status_code == 405


class TestSettings:
    @pytest.mark.parametrize(
        ("rules", "key", "says"),
        [
            ({"STAFF": False}, "PGOUTBOX['VIEWS_AUTH']", "admits no request"),
            ({"STAFF": "yes"}, "PGOUTBOX['VIEWS_AUTH']['STAFF']", "True or False"),
            ({"PERMISSION": "view_job"}, "['PERMISSION']", "'app_label.codename'"),
            ({"PERMISSION": 7}, "['PERMISSION']", "'app_label.codename'"),
            ({"CALLABLE": "not a path"}, "['CALLABLE']", "dotted path"),
            ({"CALLABLE": 42}, "['CALLABLE']", "dotted path"),
            ({"BEARER_TOKEN_ENV": "MY-TOKEN"}, "['BEARER_TOKEN_ENV']", "environment variable"),
            ({"BEARER_TOKEN_ENV": ""}, "['BEARER_TOKEN_ENV']", "environment variable"),
            ({"TOKEN": "x"}, "PGOUTBOX['VIEWS_AUTH']['TOKEN']", "is not a setting"),
        ],
    )
    def test_bad_values_are_problems_naming_the_key(
        self, rules: dict[str, Any], key: str, says: str
    ) -> None:
        _, problems = parse_settings({"VIEWS_AUTH": rules})
        assert [p for p in problems if key in p.key and says in p.message], problems

    def test_an_unimportable_callable_fails_the_check(self) -> None:
        with views_auth(CALLABLE="tests.integration.nowhere.check"):
            errors = [m for m in run_checks() if m.id == "pgoutbox.E008"]
        assert len(errors) == 1
        assert "cannot import 'tests.integration.nowhere.check'" in errors[0].msg

    def test_a_missing_or_short_token_is_warned_of(self, monkeypatch: pytest.MonkeyPatch) -> None:
        with views_auth(BEARER_TOKEN_ENV="PGOUTBOX_TEST_TOKEN"):
            monkeypatch.delenv("PGOUTBOX_TEST_TOKEN", raising=False)
            (unset,) = [m for m in run_checks() if m.id == "pgoutbox.W003"]
            assert "'PGOUTBOX_TEST_TOKEN', which is not set" in unset.msg
            monkeypatch.setenv("PGOUTBOX_TEST_TOKEN", "short")
            (short,) = [m for m in run_checks() if m.id == "pgoutbox.W003"]
            assert "holds 5 characters" in short.msg
            monkeypatch.setenv("PGOUTBOX_TEST_TOKEN", TOKEN)
            assert not [m for m in run_checks() if m.id == "pgoutbox.W003"]


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
            ("&".join(f"f{n}=1" for n in range(1200)), "the query string is refused"),
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
