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
        (["--grace-period", "-1"], "must be a finite number >= 0"),
        # nan passed every comparison: SIGTERM then spun at 100% CPU, never releasing a job
        (["--grace-period", "nan"], "must be a finite number >= 0, not 'nan'"),
        (["--grace-period", "inf"], "must be a finite number >= 0, not 'inf'"),
        (["--grace-period", "1e300"], "must be at most 31536000 seconds"),
        (["--concurrency", "99999999"], "must be at most 1,000, not 99,999,999"),
        (["--metrics-port", "70000"], "must be at most 65,535, not 70,000"),
        (["--metrics-port", "0"], "must be at least 1"),
        (["--max-jobs", "0"], "must be at least 1"),
        (["--max-memory", "-5"], "must be at least 1"),
        (["--max-memory", "lots"], "'lots' is not an integer"),
        (["--max-abandoned-threads", "-1"], "must be >= 0"),
        (["--database", "nope"], "--database 'nope' is not in DATABASES"),
        (["--worker-id", "w" * 201], "worker id must be at most 200 characters, not 201"),
        (["--worker-id", "a\x00b"], "must hold printable characters only"),
        (["--worker-id", "a\nb"], "must hold printable characters only"),
        (["--worker-id", "  "], "worker id must be non-empty text"),
        (["--gc-threshold", "-1"], "must be >= 0"),
        (["--gc-threshold", "many"], "'many' is not an integer"),
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stats", "--watch", "-1"], "must be from 0.1 to 86400 seconds, not '-1'"),
        (["stats", "--watch", "nan"], "must be from 0.1 to 86400 seconds, not 'nan'"),
        (["stats", "--watch", "0"], "must be from 0.1 to 86400 seconds, not '0'"),
        (["deadletters", "list", "--limit", "-1"], "must be from 1 to 10,000, not -1"),
        (
            ["deadletters", "list", "--limit", "99999999999999999999"],
            "must be from 1 to 10,000",
        ),
        (["--database", "nope", "stats"], "--database 'nope' is not in DATABASES"),
    ],
)
def test_pgoutbox_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("pgoutbox", *args)


def test_ctrl_c_ends_stats_watch_quietly() -> None:
    """Ctrl-C is how ``stats --watch`` ends: exit status 0, no traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.processes import database_url_for_tests, scaled

    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "manage.py", "pgoutbox", "stats", "--watch", "0.2"],
        cwd=root,
        env={**os.environ, "DATABASE_URL": database_url_for_tests()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(scaled(2.0))  # Django's start-up, then a few refreshes
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=scaled(10))
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err, err
    assert "KeyboardInterrupt" not in err, err
    assert "queue" in out


@pytest.mark.parametrize(("threshold", "expected"), [("12345", 12345), ("0", None)])
def test_the_worker_tunes_the_garbage_collector(threshold: str, expected: int | None) -> None:
    """``--gc-threshold``: the objects of start-up frozen, the first threshold raised; 0 leaves
    the collector alone. In a process of its own: it would change this one's collector."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import gc, sys; "
        "from django_pgoutbox.management.commands.runworkers import tune_collector; "
        "before, frozen = gc.get_threshold(), gc.get_freeze_count(); "
        f"tune_collector({int(threshold)}); "
        "print(gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:], "
        "gc.get_freeze_count() - frozen, before[0])"
    )
    root = Path(__file__).resolve().parents[2]
    out = (
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.splitlines()[-1]
        .split()
    )
    first, others_kept, frozen, default = int(out[0]), out[1] == "True", int(out[2]), int(out[3])
    assert others_kept
    if expected is None:
        assert (first, frozen) == (default, 0)
    else:
        assert first == expected
        assert frozen > 10_000


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
                cwd=Path(__file__).resolve().parents[2],
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
        "pgoutbox.0001_initial, pgoutbox.0002_limits_cancellation, pgoutbox.0003_poison_isolation, "
        "pgoutbox.0004_suspects_alone, pgoutbox.0005_gauge_indexes: run 'manage.py migrate "
        "--database default' first."
    ) in result.stderr
