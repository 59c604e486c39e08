"""The management commands: argument validation and the demo."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_pgoutbox.models import Job, JobStatus


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be at least 1"),
        (["--concurrency", "many"], "is not an integer"),
        (["--grace-period", "-1"], "must be >= 0"),
        (["--queues", ","], "expected comma-separated queue names"),
        (["--queues", "nope"], "unknown queue(s) 'nope'"),
        (
            [
                "--exclude-queues",
                "default,critical_alerts,notifications,webhooks,location_derivation,"
                "reports,exports,maintenance",
            ],
            "no queue left to run",
        ),
    ],
)
def test_runworkers_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("runworkers", *args)


@pytest.mark.django_db(transaction=True)  # the demo's worker threads must see its commits
def test_demo_runs_the_batch_to_the_end() -> None:
    out = StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "0 job(s) still open" in text
    assert "Outbox: 6 of 6 facts projected" in text
    demo_jobs = Job.objects.exclude(job_type__startswith="pgoutbox.")  # not the maintenance
    counts = {s: demo_jobs.filter(status=s).count() for s in JobStatus.values}
    # 126 jobs enqueued, plus a notification and a report for each of 3 completed sessions.
    assert counts == {
        "pending": 0,
        "leased": 0,
        "retrying": 0,
        "completed": 131,
        "dead": 1,
        "cancelled": 0,
    }
    assert Job.objects.get(status="dead").job_type == "demo.export"
    assert (
        Job.objects.filter(attempts=2, status="completed").count() == 6
    )  # five flaky notifications, one throttled webhook


@pytest.mark.django_db
@pytest.mark.parametrize("command", [["runworkers", "--burst"], ["pgoutbox", "stats"]])
def test_commands_refuse_an_unmigrated_database(command: list[str]) -> None:
    """Before `migrate`, or after an upgrade without it: a clear error, not a missing relation."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from urllib.parse import urlsplit, urlunsplit

    import psycopg
    from psycopg import sql

    from django_pgoutbox.db import raw_connection_params
    from tests.processes import database_url_for_tests

    name = "pgoutbox_unmigrated"
    with psycopg.connect(**{**raw_connection_params("default"), "dbname": "postgres"}) as conn:
        conn.autocommit = True
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            parts = urlsplit(database_url_for_tests())
            url = urlunsplit(parts._replace(path=f"/{name}"))
            result = subprocess.run(
                [sys.executable, "manage.py", *command],
                cwd=Path(__file__).resolve().parent.parent,
                env={**os.environ, "DATABASE_URL": url},
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        "CommandError: The database 'default' lacks django-pgoutbox's migrations "
        "pgoutbox.0001_initial, pgoutbox.0002_limits_cancellation: "
        "run 'manage.py migrate --database default' first."
    ) in result.stderr
