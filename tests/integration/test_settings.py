"""PGOUTBOX parsing and the system checks that report it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_pgoutbox import checks, job
from django_pgoutbox.conf import DEFAULTS, get_settings, parse_settings


def problems_of(raw: Any) -> list[tuple[str, str, str]]:
    _, problems = parse_settings(raw)
    return [(p.check_id, p.key, p.message) for p in problems]


class TestDefaults:
    def test_absent_setting_gives_documented_defaults(self) -> None:
        parsed, problems = parse_settings(None)
        assert problems == []
        assert list(parsed.queues) == ["default"]
        default = parsed.queues["default"]
        assert (default.concurrency, default.lease_seconds, default.poll_interval) == (4, 60.0, 5.0)
        assert parsed.max_attempts == 10
        assert parsed.retry.base_delay == 1.0
        assert parsed.retry.max_delay == 3600.0
        assert parsed.retry.jitter == 0.1
        assert parsed.retry.unknown_error_retries == 3
        assert parsed.retention.completed_jobs == timedelta(days=7)
        assert parsed.notify is True
        assert parsed.schedule_tz == "UTC"

    def test_queues_inherit_top_level_values(self) -> None:
        parsed, problems = parse_settings(
            {
                "CONCURRENCY": 8,
                "LEASE_SECONDS": timedelta(minutes=2),
                "QUEUES": {"a": {}, "b": {"CONCURRENCY": 1, "POLL_INTERVAL": 0.5}},
                "MAINTENANCE_QUEUE": "a",
            }
        )
        assert problems == []
        assert (parsed.queues["a"].concurrency, parsed.queues["a"].lease_seconds) == (8, 120.0)
        assert (parsed.queues["b"].concurrency, parsed.queues["b"].poll_interval) == (1, 0.5)

    def test_async_concurrency_is_inherited_and_overridden(self) -> None:
        parsed, problems = parse_settings(
            {"ASYNC_CONCURRENCY": 20, "QUEUES": {"default": {}, "b": {"ASYNC_CONCURRENCY": 500}}}
        )
        assert problems == []
        assert parsed.queues["default"].async_concurrency == 20
        assert parsed.queues["b"].async_concurrency == 500

    def test_partial_sections_merge_over_defaults(self) -> None:
        parsed, problems = parse_settings(
            {"RETRY": {"MAX_DELAY": 60}, "RETENTION": {"COMPLETED_JOBS": None}}
        )
        assert problems == []
        assert (parsed.retry.base_delay, parsed.retry.max_delay) == (1.0, 60.0)
        assert parsed.retention.completed_jobs is None
        assert parsed.retention.cancelled_jobs == timedelta(days=7)

    def test_every_default_key_is_documented(self) -> None:
        from pathlib import Path

        reference = (Path(__file__).parents[2] / "docs" / "settings.md").read_text()
        for key in DEFAULTS:
            assert f"`{key}`" in reference
        for section in ("RETRY", "RETENTION", "OUTBOX"):
            for key in DEFAULTS[section]:
                assert f"`{key}`" in reference


class TestProblems:
    @pytest.mark.parametrize(
        ("raw", "check_id", "key", "message"),
        [
            ([], "pgoutbox.E003", "PGOUTBOX", "must be a dict"),
            ({"QUEUE": {}}, "pgoutbox.E003", "PGOUTBOX['QUEUE']", "is not a setting"),
            (
                {"RETRY": {"BASE": 1}},
                "pgoutbox.E003",
                "PGOUTBOX['RETRY']['BASE']",
                "is not a setting",
            ),
            (
                {"QUEUES": {"a": {"CONCURENCY": 2}}},
                "pgoutbox.E003",
                "PGOUTBOX['QUEUES']['a']['CONCURENCY']",
                "is not a setting",
            ),
            ({"QUEUES": {"a": 3}}, "pgoutbox.E003", "PGOUTBOX['QUEUES']['a']", "must be a dict"),
            (
                {"STRICT_JOB_TYPES": 1},
                "pgoutbox.E004",
                "PGOUTBOX['STRICT_JOB_TYPES']",
                "must be True or False",
            ),
            (
                {"REMOTE_JOB_TYPES": "billing.invoice"},
                "pgoutbox.E004",
                "PGOUTBOX['REMOTE_JOB_TYPES']",
                "must be a list of job type names",
            ),
            (
                {"REMOTE_JOB_TYPES": ["ok", ""]},
                "pgoutbox.E004",
                "PGOUTBOX['REMOTE_JOB_TYPES']",
                "must be a list of job type names",
            ),
            ({"QUEUES": []}, "pgoutbox.E004", "PGOUTBOX['QUEUES']", "must be a dict"),
            ({"QUEUES": {}}, "pgoutbox.E004", "PGOUTBOX['QUEUES']", "names no queue"),
            (
                {"QUEUES": {"bad name": {}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['bad name']",
                "not a valid queue name",
            ),
            (
                {"QUEUES": {"default": {"FAIR": "yes"}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['FAIR']",
                "must be True or False",
            ),
            (
                {"QUEUES": {"default": {"MAX_RUNNING": 0}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['MAX_RUNNING']",
                "integer >= 1",
            ),
            (
                {"ASYNC_CONCURRENCY": 0},
                "pgoutbox.E004",
                "PGOUTBOX['ASYNC_CONCURRENCY']",
                "integer >= 1",
            ),
            (
                {"QUEUES": {"default": {"ASYNC_CONCURRENCY": "many"}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['ASYNC_CONCURRENCY']",
                "integer >= 1",
            ),
            (
                {"QUEUES": {"default": {"ASYNC_CONCURRENCY": 10_001}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['ASYNC_CONCURRENCY']",
                "integer <= 10000",
            ),
            (
                {"QUEUES": {"default": {"CONNECTIONS": 0}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['CONNECTIONS']",
                "integer >= 1",
            ),
            (
                {"QUEUES": {"default": {"RATE_LIMIT": -2}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['RATE_LIMIT']",
                "jobs per second > 0",
            ),
            (
                {"QUEUES": {"default": {"LIMIT_BY": "tenant", "MAX_RUNNING": 1}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['LIMIT_BY']",
                "must be None or 'organization'",
            ),
            (
                {"QUEUES": {"default": {"LIMIT_BY": "organization"}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['LIMIT_BY']",
                "has nothing to apply to",
            ),
            (
                {"LISTEN_DATABASES": {"default": "nowhere"}},
                "pgoutbox.E003",
                "PGOUTBOX['LISTEN_DATABASES']['default']",
                "'nowhere', which is not in DATABASES",
            ),
            (
                {"LISTEN_DATABASES": ["default"]},
                "pgoutbox.E004",
                "PGOUTBOX['LISTEN_DATABASES']",
                "must be a dict of database alias",
            ),
            (
                {"QUEUES": {"a": {"CONCURRENCY": 0}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['a']['CONCURRENCY']",
                "integer >= 1",
            ),
            ({"CONCURRENCY": "4"}, "pgoutbox.E004", "PGOUTBOX['CONCURRENCY']", "integer >= 1"),
            ({"CONCURRENCY": True}, "pgoutbox.E004", "PGOUTBOX['CONCURRENCY']", "integer >= 1"),
            ({"LEASE_SECONDS": 0}, "pgoutbox.E004", "PGOUTBOX['LEASE_SECONDS']", "> 0 seconds"),
            ({"LEASE_SECONDS": -5}, "pgoutbox.E004", "PGOUTBOX['LEASE_SECONDS']", "> 0 seconds"),
            (
                {"LEASE_SECONDS": 1e-9},
                "pgoutbox.E004",
                "PGOUTBOX['LEASE_SECONDS']",
                "at least 0.5 seconds",
            ),
            (
                {"QUEUES": {"default": {"LEASE_SECONDS": 0.1}}},
                "pgoutbox.E004",
                "PGOUTBOX['QUEUES']['default']['LEASE_SECONDS']",
                "at least 0.5 seconds",
            ),
            (
                {"POLL_INTERVAL": "5s"},
                "pgoutbox.E004",
                "PGOUTBOX['POLL_INTERVAL']",
                "number of seconds",
            ),
            (
                {"POLL_INTERVAL": float("nan")},
                "pgoutbox.E004",
                "PGOUTBOX['POLL_INTERVAL']",
                "> 0 seconds",
            ),
            ({"MAX_ATTEMPTS": 0}, "pgoutbox.E004", "PGOUTBOX['MAX_ATTEMPTS']", "integer >= 1"),
            (
                {"RETRY": {"JITTER": 1.5}},
                "pgoutbox.E004",
                "PGOUTBOX['RETRY']['JITTER']",
                "between 0 and 1",
            ),
            (
                {"RETRY": {"UNKNOWN_ERROR_RETRIES": -1}},
                "pgoutbox.E004",
                "PGOUTBOX['RETRY']['UNKNOWN_ERROR_RETRIES']",
                "integer >= 0",
            ),
            (
                {"RETRY": {"BASE_DELAY": 10, "MAX_DELAY": 5}},
                "pgoutbox.E004",
                "PGOUTBOX['RETRY']['MAX_DELAY']",
                "smaller than BASE_DELAY",
            ),
            (
                {"RETENTION": {"COMPLETED_JOBS": "7d"}},
                "pgoutbox.E004",
                "PGOUTBOX['RETENTION']['COMPLETED_JOBS']",
                "number of seconds",
            ),
            ({"NOTIFY": "yes"}, "pgoutbox.E004", "PGOUTBOX['NOTIFY']", "True or False"),
            ({"SCHEDULES": []}, "pgoutbox.E004", "PGOUTBOX['SCHEDULES']", "must be a dict"),
            (
                {"SCHEDULE_TZ": "Europe/Berln"},
                "pgoutbox.E004",
                "PGOUTBOX['SCHEDULE_TZ']",
                "'Europe/Berln' is not a time zone of the IANA database",
            ),
            ({"SCHEDULE_TZ": None}, "pgoutbox.E004", "PGOUTBOX['SCHEDULE_TZ']", "IANA time zone"),
        ],
    )
    def test_bad_value_is_named(self, raw: Any, check_id: str, key: str, message: str) -> None:
        found = problems_of(raw)
        assert any((c, k) == (check_id, key) and message in m for c, k, m in found), found

    def test_every_problem_is_reported_at_once(self) -> None:
        found = problems_of({"CONCURRENCY": 0, "NOTIFY": 1, "EXTRA": 2})
        assert {key for _, key, _ in found} == {
            "PGOUTBOX['CONCURRENCY']",
            "PGOUTBOX['NOTIFY']",
            "PGOUTBOX['EXTRA']",
        }

    def test_unknown_key_hint_suggests_the_close_one(self) -> None:
        _, problems = parse_settings({"MAX_ATTEMPT": 3})
        assert problems[0].hint == "Did you mean 'MAX_ATTEMPTS'?"


class TestChecks:
    def test_valid_project_passes(self) -> None:
        assert [m for m in run_checks() if m.id and m.id.startswith("pgoutbox.")] == []

    @override_settings(PGOUTBOX={"CONCURENCY": 2})
    def test_settings_errors_become_system_checks(self) -> None:
        messages = checks.check_settings(None)
        assert [m.id for m in messages] == ["pgoutbox.E003"]
        assert "PGOUTBOX['CONCURENCY']" in messages[0].msg
        assert messages[0].hint == "Did you mean 'CONCURRENCY'?"
        with pytest.raises(ImproperlyConfigured, match=r"PGOUTBOX\['CONCURENCY'\]"):
            get_settings()

    @override_settings(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
            "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        }
    )
    @pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
    def test_non_postgresql_engine(self) -> None:
        messages = checks.check_database_engines(None)
        assert [m.id for m in messages] == ["pgoutbox.E001"]
        assert "DATABASES['other']" in messages[0].msg

    def test_psycopg3_is_in_use(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from django.db.backends.postgresql import psycopg_any

        assert checks.check_driver(None) == []
        monkeypatch.setattr(psycopg_any, "is_psycopg3", False)
        messages = checks.check_driver(None)
        assert [m.id for m in messages] == ["pgoutbox.E002"]

    def test_job_on_unconfigured_queue(self, registry: None) -> None:
        @job("test.misplaced", queue="nowhere")
        def misplaced(payload: dict[str, Any], ctx: Any) -> None:
            pass

        messages = checks.check_job_queues(None)
        assert [m.id for m in messages] == ["pgoutbox.E005"]
        assert "'test.misplaced'" in messages[0].msg
        assert "'nowhere'" in messages[0].msg

    @pytest.mark.django_db
    def test_server_version_check(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from django.db import connection, connections

        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('autovacuum')::boolean")
            autovacuum = cursor.fetchone()[0]
        expected = [] if autovacuum else ["pgoutbox.W001"]
        assert [m.id for m in checks.check_server_version(None, databases=["default"])] == expected
        monkeypatch.setattr(connections["default"], "pg_version", 140010)
        messages = checks.check_server_version(None, databases=["default"])
        assert [m.id for m in messages] == [*expected, "pgoutbox.E006"]


class TestDurationsAndCounts:
    """Every duration a setting gives is finite and at most 365 days; every count fits the
    32-bit columns: what ``manage.py check`` accepts, PostgreSQL and Python accept too."""

    @pytest.mark.parametrize(
        ("raw", "key"),
        [
            ({"RETRY": {"MAX_DELAY": 1e300}}, "PGOUTBOX['RETRY']['MAX_DELAY']"),
            ({"RETRY": {"MAX_DELAY": timedelta(days=400)}}, "PGOUTBOX['RETRY']['MAX_DELAY']"),
            ({"LEASE_SECONDS": 1e300}, "PGOUTBOX['LEASE_SECONDS']"),
            ({"POLL_INTERVAL": 1e300}, "PGOUTBOX['POLL_INTERVAL']"),
            ({"OUTBOX": {"CLAIM_SECONDS": 1e12}}, "PGOUTBOX['OUTBOX']['CLAIM_SECONDS']"),
            (
                {"QUEUES": {"default": {"LEASE_SECONDS": 1e300}}},
                "PGOUTBOX['QUEUES']['default']['LEASE_SECONDS']",
            ),
        ],
    )
    def test_a_duration_over_365_days_is_refused(self, raw: Any, key: str) -> None:
        found = [(k, m) for _, k, m in problems_of(raw) if k == key]
        assert found
        assert "must be at most 31536000 seconds (365 days)" in found[0][1]

    def test_a_retention_of_1e300_seconds_is_refused_not_an_overflow(self) -> None:
        found = problems_of({"RETENTION": {"COMPLETED_JOBS": 1e300}})
        assert [k for _, k, _ in found] == ["PGOUTBOX['RETENTION']['COMPLETED_JOBS']"]
        assert problems_of({"RETENTION": {"COMPLETED_JOBS": timedelta(days=3650)}}) == []

    @pytest.mark.parametrize(
        "raw",
        [
            {"MAX_ATTEMPTS": 2**40},
            {"OUTBOX": {"MAX_ATTEMPTS": 2**31}},
        ],
    )
    def test_a_count_beyond_32_bits_is_refused(self, raw: Any) -> None:
        messages = [m for _, _, m in problems_of(raw)]
        assert messages
        assert "must be an integer <= 2147483647" in messages[0]

    @pytest.mark.parametrize(
        ("raw", "key"),
        [
            ({"QUEUES": {"default": {"CONCURRENCY": 10**12}}}, "['QUEUES']['default']"),
            ({"CONCURRENCY": 1001}, "['CONCURRENCY']"),
        ],
    )
    def test_concurrency_beyond_a_thousand_threads_is_refused(self, raw: Any, key: str) -> None:
        found = [(k, m) for _, k, m in problems_of(raw)]
        assert found
        assert key in found[0][0]
        assert "must be an integer <= 1000" in found[0][1]

    def test_max_delay_of_365_days_is_accepted(self) -> None:
        assert problems_of({"RETRY": {"MAX_DELAY": timedelta(days=365)}}) == []


class TestPriorityAging:
    _KEY = "PGOUTBOX['QUEUES']['default']['PRIORITY_AGING']"

    def aging(self, value: Any) -> tuple[Any, list[tuple[str, str, str]]]:
        parsed, problems = parse_settings({"QUEUES": {"default": {"PRIORITY_AGING": value}}})
        return parsed.queues["default"].priority_aging, [
            (p.check_id, p.key, p.message) for p in problems
        ]

    def test_off_by_default_and_on_with_both_keys(self) -> None:
        assert parse_settings(None)[0].queues["default"].priority_aging is None
        aging, problems = self.aging({"EVERY": timedelta(minutes=5), "UP_TO": 10})
        assert problems == []
        assert (aging.every, aging.up_to) == (300.0, 10)
        aging, _ = self.aging({"EVERY": 1, "UP_TO": -(2**31)})
        assert (aging.every, aging.up_to) == (1.0, -(2**31))

    @pytest.mark.parametrize(
        ("value", "key", "message"),
        [
            (5, "", "must be a dict"),
            ({"EVERY": 60}, "['UP_TO']", "is required"),
            ({"UP_TO": 3}, "['EVERY']", "is required"),
            ({"EVERY": 60, "UP_TO": 3, "MAX": 4}, "['MAX']", "is not a setting"),
            ({"EVERY": 0.5, "UP_TO": 3}, "['EVERY']", "at least 1 seconds"),
            ({"EVERY": -1, "UP_TO": 3}, "['EVERY']", "> 0 seconds"),
            ({"EVERY": float("inf"), "UP_TO": 3}, "['EVERY']", "> 0 seconds"),
            ({"EVERY": "5m", "UP_TO": 3}, "['EVERY']", "number of seconds"),
            ({"EVERY": 10**9, "UP_TO": 3}, "['EVERY']", "at most"),
            ({"EVERY": 60, "UP_TO": 2**31}, "['UP_TO']", "must be a priority"),
            ({"EVERY": 60, "UP_TO": -(2**31) - 1}, "['UP_TO']", "must be a priority"),
            ({"EVERY": 60, "UP_TO": 2.5}, "['UP_TO']", "must be a priority"),
            ({"EVERY": 60, "UP_TO": True}, "['UP_TO']", "must be a priority"),
        ],
    )
    def test_a_bad_value_is_named_and_leaves_aging_off_or_bounded(
        self, value: Any, key: str, message: str
    ) -> None:
        aging, problems = self.aging(value)
        assert any(k == self._KEY + key and message in m for _, k, m in problems), problems
        assert aging is None or 1.0 <= aging.every <= 365 * 86400

    def test_a_bad_value_fails_the_checks_by_name(self) -> None:
        with override_settings(PGOUTBOX={"QUEUES": {"default": {"PRIORITY_AGING": {"EVERY": 5}}}}):
            messages = checks.check_settings(None)
        assert any(self._KEY + "['UP_TO']" in m.msg for m in messages), messages
