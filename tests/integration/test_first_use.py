"""What a new user meets first: an alias that is not PostgreSQL, a database not migrated yet,
a job type no ``@job`` declares. Each gets one clear error (or warning) naming what to do."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import warnings
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.db import connections
from django.test import override_settings

import django_pgoutbox
from django_pgoutbox import EnqueueError, PublishError, cancel, enqueue, enqueue_many, publish
from django_pgoutbox.db import raw_connection_params
from django_pgoutbox.errors import UnknownJobTypeWarning
from django_pgoutbox.models import Job
from testproject.demo.models import TrackingSession
from testproject.testjobs import tasks
from tests.processes import ROOT, database_url_for_tests

pytestmark = pytest.mark.django_db


class TestNotPostgreSQL:
    def test_enqueue(self, lite: str) -> None:
        with pytest.raises(EnqueueError) as raised:
            enqueue("tests.noop", {}, using=lite)
        assert raised.value.field == "using"
        assert "'lite' is SQLite, not PostgreSQL" in str(raised.value)

    def test_enqueue_many(self, lite: str) -> None:
        with pytest.raises(EnqueueError, match="'lite' is SQLite, not PostgreSQL"):
            enqueue_many([{"job_type": "tests.noop", "payload": {}}], using=lite)

    def test_publish(self, lite: str) -> None:
        with pytest.raises(PublishError, match="'lite' is SQLite, not PostgreSQL"):
            publish(
                "tests.projected",
                aggregate_type="t",
                aggregate_id=uuid.uuid4(),
                payload={},
                using=lite,
            )

    def test_cancel(self, lite: str) -> None:
        with pytest.raises(EnqueueError, match="'lite' is SQLite, not PostgreSQL"):
            cancel(uuid.uuid4(), using=lite)

    def test_the_routers_choice(self, lite: str, settings: Any) -> None:
        settings.DATABASE_ROUTERS = ["tests.integration.test_first_use.ToLite"]
        with pytest.raises(EnqueueError, match="'lite' is SQLite"):
            enqueue("tests.noop", {})

    def test_a_model_saved_to_it_names_the_model_not_using(self, lite: str) -> None:
        """The save hook writes the events in the save's transaction, on the model's database:
        neither ``using=`` nor routing the pgoutbox app elsewhere can help, and the error says
        what can."""
        session = TrackingSession(organization_id=uuid.uuid4(), device="phone")
        # Refused before anything is sent to 'lite' (which this test may not query).
        with pytest.raises(PublishError) as raised:
            session.save(using=lite)
        message = str(raised.value)
        assert "demo.TrackingSession is saved to database 'lite', which is SQLite" in message
        assert "Pass using=" not in message
        with pytest.raises(PublishError, match=r"TrackingSession is saved to database 'lite'"):
            session.delete(using=lite)


class ToLite:
    def db_for_write(self, model: Any, **hints: Any) -> str:
        return "lite"


#: Run in a fresh process on a database that exists but was never migrated, as a user's shell
#: would: each attempt prints the error's class and message.
NOT_MIGRATED_SCRIPT = """
import uuid
import django
django.setup()
from django.db import transaction
from django_pgoutbox import cancel, enqueue, enqueue_many, publish
from django_pgoutbox.copy_rows import COPY_MIN_ROWS

attempts = {
    "enqueue": lambda: enqueue("tests.noop", {}),
    "enqueue with a key": lambda: enqueue("tests.noop", {}, idempotency_key="k"),
    "enqueue_many 1": lambda: enqueue_many([{"job_type": "tests.noop", "payload": {}}]),
    "enqueue_many COPY": lambda: enqueue_many(
        [{"job_type": "tests.noop", "payload": {"n": n}} for n in range(COPY_MIN_ROWS)]
    ),
    "cancel": lambda: cancel(uuid.uuid4()),
    "publish": lambda: publish(
        "tests.projected", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={}
    ),
}

def in_a_transaction():
    with transaction.atomic():
        enqueue("tests.noop", {})

attempts["in a transaction"] = in_a_transaction
for name, attempt in attempts.items():
    try:
        attempt()
    except Exception as error:
        print(f"{name}|{type(error).__name__}|{error}")
    else:
        print(f"{name}|no error|")
"""


def test_a_database_not_migrated_yet_gets_one_clear_error(tmp_path: Any) -> None:
    """enqueue(), enqueue_many() (INSERT and COPY) and publish() in a process whose database
    exists but has no tables yet: an error that names the command to run, not the driver's
    'relation "jobs" does not exist'."""
    name = f"pgoutbox_bare_{uuid.uuid4().hex[:8]}"
    admin = {**raw_connection_params("default"), "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = urlunsplit(urlsplit(database_url_for_tests())._replace(path=f"/{name}"))
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
        result = subprocess.run(
            [sys.executable, "-c", NOT_MIGRATED_SCRIPT],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    assert result.returncode == 0, result.stderr
    lines = [line.split("|", 2) for line in result.stdout.splitlines() if "|" in line]
    assert len(lines) == 7, result.stdout
    for attempt, kind, message in lines:
        expected = "PublishError" if attempt == "publish" else "EnqueueError"
        assert kind == expected, (attempt, kind, message)
        assert message.startswith("using: database 'default' has no django-pgoutbox tables"), (
            attempt,
            message,
        )
        assert message.endswith("run `manage.py migrate pgoutbox`."), (attempt, message)


class TestPartlyMigrated:
    """A database whose tables predate a migration that added a column (an upgrade that was
    not migrated yet): the same clear error as a database with no tables. The column is dropped
    in the test's transaction, which rolls back."""

    def drop_column(self, column: str) -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute(f"ALTER TABLE jobs DROP COLUMN {column}")

    def test_cancel(self) -> None:
        self.drop_column("cancel_requested_at")  # added by 0002
        with pytest.raises(EnqueueError) as raised:
            cancel(uuid.uuid4())
        assert raised.value.field == "using"
        message = str(raised.value)
        assert "database 'default' lacks django-pgoutbox migrations" in message
        assert "cancel_requested_at" in message
        assert message.endswith("run `manage.py migrate pgoutbox`.")

    def test_enqueue_of_a_key_already_used(self) -> None:
        enqueue("tests.noop", {}, idempotency_key="partly-migrated")
        self.drop_column("lost_attempts")  # added by 0004: the existing job is read back
        with pytest.raises(EnqueueError, match="lacks django-pgoutbox migrations"):
            enqueue("tests.noop", {}, idempotency_key="partly-migrated")


class TestTablesDropped:
    """The tables dropped in the test's transaction, which rolls back: a database not migrated."""

    @override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_pgoutbox.backend.PgOutboxBackend",
                "OPTIONS": {"ENQUEUE_ON_COMMIT": True},
            }
        }
    )
    def test_a_task_enqueued_on_commit(self, django_capture_on_commit_callbacks: Any) -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("DROP TABLE jobs CASCADE")
        with (
            pytest.raises(EnqueueError, match="database 'default' has no django-pgoutbox tables"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            tasks.add.enqueue(1, 2)


class TestUnknownJobType:
    def test_a_misspelt_job_type_warns_with_a_suggestion(self) -> None:
        with pytest.warns(UnknownJobTypeWarning) as caught:
            job = enqueue("tests.nop", {})
        assert Job.objects.filter(id=job.id).exists()  # written all the same
        message = str(caught[0].message)
        assert "no @job named 'tests.nop'" in message
        assert "did you mean 'tests.noop'" in message
        assert "unknown_job_type" in message

    def test_enqueue_many_warns_once_per_type(self) -> None:
        with pytest.warns(UnknownJobTypeWarning) as caught:
            enqueue_many([{"job_type": "elsewhere.thing", "payload": {}}] * 3)
        assert len([w for w in caught if "elsewhere.thing" in str(w.message)]) == 1

    def test_the_warning_points_at_the_callers_line(self) -> None:
        with pytest.warns(UnknownJobTypeWarning) as caught:
            enqueue("elsewhere.pointed", {})
        assert caught[0].filename == __file__

    def test_the_warning_points_at_a_package_whose_name_starts_alike(self) -> None:
        """A caller in ``django_pgoutbox_contrib/`` is outside the package all the same."""
        package = os.path.dirname(django_pgoutbox.__file__)
        caller = os.path.join(f"{package}_contrib", "tasks.py")
        code = compile("enqueue('elsewhere.sibling', {})", caller, "exec")
        with pytest.warns(UnknownJobTypeWarning) as caught:
            exec(code, {"enqueue": enqueue})
        assert caught[0].filename == caller

    def test_a_registered_job_type_does_not_warn(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnknownJobTypeWarning)
            enqueue("tests.noop", {})

    def test_strict_refuses_it_and_writes_nothing(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "STRICT_JOB_TYPES": True}
        before = Job.objects.count()
        with pytest.raises(EnqueueError) as raised:
            enqueue("tests.nop", {})
        assert raised.value.field == "job_type"
        assert "did you mean 'tests.noop'" in str(raised.value)
        with pytest.raises(EnqueueError, match=r"items\[1\]\.job_type"):
            enqueue_many(
                [
                    {"job_type": "tests.noop", "payload": {}},
                    {"job_type": "tests.nop", "payload": {}},
                ]
            )
        assert Job.objects.count() == before

    def test_remote_job_types_neither_warn_nor_are_refused(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "STRICT_JOB_TYPES": True,
            "REMOTE_JOB_TYPES": ["billing.invoice"],
        }
        with warnings.catch_warnings():
            warnings.simplefilter("error", UnknownJobTypeWarning)
            enqueue("billing.invoice", {})
