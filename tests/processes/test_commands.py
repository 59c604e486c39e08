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
        (["deliveries", "redrive", "--all", "--dead-for", "\x00"], r"'\\x00' is not an age"),
        (["deliveries", "discard", "--all", "--dead-for", "-5"], "100 years, not '-5'"),
        (["deliveries", "list", "--limit", "0"], "must be from 1 to 10,000, not 0"),
        (["deliveries", "list", "--subscriber", "a\x00"], "a NUL byte matches nothing"),
        (["outbox", "replay", "--subscriber", "x", "--since", "soon"], "'soon' is not a time"),
        (["outbox", "replay", "--since", "1d"], "arguments are required: --subscriber"),
    ],
)
def test_pgoutbox_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("pgoutbox", *args)


def test_ctrl_c_ends_stats_watch_quietly() -> None:
    """Ctrl-C is how ``stats --watch`` ends: exit status 0, no traceback."""
    import os
    import select
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests.processes import database_url_for_tests, scaled

    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        # faulthandler: a process that outlives Ctrl-C is shown where it is (SIGABRT below)
        [sys.executable, "-X", "faulthandler", "manage.py", "pgoutbox", "stats", "--watch", "0.2"],
        cwd=root,
        env={**os.environ, "DATABASE_URL": database_url_for_tests()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a suite run in the background of a shell ignores SIGINT, and its
        # children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Ctrl-C once the first refresh is out (Django's start-up is not what is tested), and a
        # few refreshes later
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], scaled(60))
        assert ready, "no refresh within 60 s"
        assert process.stdout.readline(), process.communicate()
        time.sleep(0.5)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        try:
            out, err = process.communicate(timeout=scaled(10))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            out, err = process.communicate(timeout=scaled(10))
            raise AssertionError(f"still running 10 s after Ctrl-C:\n{err}") from None
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
def test_demo_runs_the_batch_to_the_end(caplog: pytest.LogCaptureFixture) -> None:
    from django.db import connection

    out = StringIO()
    with caplog.at_level("INFO", logger="django_pgoutbox"):
        call_command("demo", stdout=out)
    text = out.getvalue()
    # which database on which server, first (DATABASE_URL names the test's)
    assert text.startswith(f"Database {connection.settings_dict['NAME']!r} on ")
    assert "0 job(s) still open" in text
    # the dead letter it means to show, as the failure on purpose that it is: no traceback
    assert "  PermanentError: unknown export format 'xlsx'\n  (on purpose: " in text
    assert not [record for record in caplog.records if record.exc_info], "a traceback"
    assert "retried: jobs that needed more than one attempt" in text
    # and what to do next
    next_steps = text[text.index("\nNext:\n") :]
    for command in (
        "manage.py createsuperuser",
        "manage.py runserver",
        "http://127.0.0.1:8000/admin/pgoutbox/",
        "manage.py pgoutbox deadletters list",
        "manage.py runworkers",
        "/docs",
    ):
        assert command in next_steps
    assert "Outbox: 6 of 6 facts projected" in text
    demo_jobs = Job.objects.exclude(job_type__startswith="pgoutbox.")  # not the maintenance
    counts = {s: demo_jobs.filter(status=s).count() for s in JobStatus.values}
    # 126 jobs enqueued, plus a notification and a report for each of 3 completed sessions.
    assert counts == {
        "waiting": 0,
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
def test_demo_on_a_database_that_does_not_exist_says_so_in_one_line() -> None:
    """``DATABASE_URL`` naming a database that is not there: one line and exit status 1, no
    traceback, and no database made behind the user's back."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    from django_pgoutbox.db import raw_connection_params
    from tests.processes import database_url_for_tests, scaled

    url = database_url_for_tests()
    name = f"{urlsplit(url).path.lstrip('/')}_not_made"
    missing = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=root,
        env={**os.environ, "DATABASE_URL": missing},
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 1, done
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"CommandError: Database {name!r} does not exist on "), line
    assert "`createdb " in line
    assert line.endswith("makes its own, 'pgoutbox_demo'.")
    with psycopg.connect(**{**raw_connection_params("default"), "dbname": "postgres"}) as conn:
        query = "SELECT 1 FROM pg_database WHERE datname = %s"
        assert conn.execute(query, [name]).fetchone() is None


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
    # Every migration of the package, in order: those on disk (a new one joins the message).
    migrations = sorted(
        path.stem
        for path in (Path(__file__).parents[2] / "django_pgoutbox" / "migrations").glob("0*.py")
    )
    assert len(migrations) >= 20
    assert (
        "CommandError: The database 'default' lacks django-pgoutbox's migrations "
        + ", ".join(f"pgoutbox.{name}" for name in migrations)
        + ": run 'manage.py migrate --database default' first."
    ) in result.stderr
