"""The pytest plugin (``django_pgoutbox.testing.pytest_plugin``) in a project's own test run: a
pytest of its own, in a subprocess, on a test file of a user's, against the test project's
settings and a database of its own (the suite's test database is this process's)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from testproject.database import database_url

ROOT = Path(__file__).resolve().parents[2]

USERS_TESTS = """
import pytest
from django.core import mail
from django.db import connection

from django_pgoutbox import enqueue, job
from django_pgoutbox.registry import registered_jobs, restore_registry


@pytest.fixture
def receipt():
    saved = registered_jobs()

    @job("plugin.receipt", queue="notifications")
    def receipt(payload, ctx):
        mail.send_mail("Receipt", "Thank you.", "shop@example.com", [payload["email"]])
        return payload["email"]

    yield receipt
    restore_registry(saved)


def test_in_the_tests_transaction(pgoutbox, receipt):
    enqueue("plugin.receipt", {"email": "a@example.com"})
    pgoutbox.assert_enqueued(receipt, payload={"email": "a@example.com"})
    summary = pgoutbox.drain()
    assert summary.runs[0].result == "a@example.com"
    assert [m.to for m in mail.outbox] == [["a@example.com"]]
    assert connection.in_atomic_block
    pgoutbox.refute_enqueued(receipt)


@pytest.mark.django_db
def test_with_the_mark(pgoutbox, receipt):
    enqueue("plugin.receipt", {"email": "b@example.com"})
    assert pgoutbox.run_jobs().completed == 1


def test_transactional(transactional_db, pgoutbox, receipt):
    assert not connection.in_atomic_block
    enqueue("plugin.receipt", {"email": "c@example.com"})
    assert pgoutbox.drain().completed == 1
    pgoutbox.assert_enqueued(receipt, status="completed", count=1)


def test_a_test_without_the_fixture_has_no_database():
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        connection.ensure_connection()


def test_perform_job_needs_no_database(pgoutbox, receipt):
    assert pgoutbox.perform_job(receipt, {"email": "d@example.com"}).result == "d@example.com"
"""


def own_database_url() -> str:
    """The suite's server, with a database name of this test's own."""
    parts = urlsplit(database_url())
    return urlunsplit(parts._replace(path=f"{parts.path}_plugin"))


def test_the_fixture_in_a_projects_own_run(tmp_path: Path) -> None:
    (tmp_path / "test_users.py").write_text(textwrap.dedent(USERS_TESTS))
    # named again, as docs/howto/testing.md shows: loaded once
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["django_pgoutbox.testing.pytest_plugin"]\n'
    )
    env = {
        **os.environ,
        "DATABASE_URL": own_database_url(),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # the plugins by name: the installed package's entry point may predate this checkout's
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "pytest_django.plugin",
            "-p",
            "django_pgoutbox.testing.pytest_plugin",
            "--ds",
            "testproject.settings",
            "--create-db",
            "-p",
            "no:cacheprovider",
            "-q",
            str(tmp_path / "test_users.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 passed" in result.stdout


def test_importing_the_plugin_imports_nothing_of_django() -> None:
    """pytest loads the plugin before Django's settings are configured."""
    probe = (
        "import sys, django_pgoutbox.testing.pytest_plugin; "
        "print(sorted(m for m in sys.modules if m == 'django' or m.startswith('django.')))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_plugin_is_declared_as_an_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = "django_pgoutbox.testing.pytest_plugin"
    assert project["entry-points"]["pytest11"] == {name: name}
