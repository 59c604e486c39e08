"""A handler that calls ``ctx.set_progress()`` in a tight loop, beside innocent jobs of its
batch, in a real ``runworkers`` process: about one write a second, its last values stored, and
the others' outcomes unharmed.

The writes are counted by a trigger made in the test database for this test alone (dropped
after it): every UPDATE that changes a row's ``progress`` adds a row to ``progress_writes``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SPIN_SECONDS = 3.0


@pytest.fixture
def progress_writes() -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE TABLE progress_writes (job_id uuid, done bigint, status text);
            CREATE FUNCTION count_progress_write() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO progress_writes
                VALUES (NEW.id, (NEW.progress ->> 'done')::bigint, NEW.status);
                RETURN NEW;
            END $$;
            CREATE TRIGGER count_progress_write AFTER UPDATE OF progress ON jobs
                FOR EACH ROW WHEN (OLD.progress IS DISTINCT FROM NEW.progress)
                EXECUTE FUNCTION count_progress_write();
            """
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER count_progress_write ON jobs; "
                "DROP FUNCTION count_progress_write(); DROP TABLE progress_writes"
            )


def writes(job_id: Any) -> list[tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT done, status FROM progress_writes WHERE job_id = %s", [job_id])
        return list(cursor.fetchall())


def test_a_tight_loop_of_set_progress_costs_a_write_a_second(
    start_worker: Any, progress_writes: None
) -> None:
    spinner, *innocent = enqueue_many(
        [{"job_type": "tests.progress", "payload": {"seconds": SPIN_SECONDS}}]
        + [{"job_type": "tests.behave", "payload": {"sleep": 0.05}}] * 40
    )
    started = time.monotonic()
    worker = start_worker("--queues", "default", "--concurrency", "4", POLL_INTERVAL=0.2)
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in innocent], status="completed").count()
            == len(innocent)
        ),
        timeout=20,  # scaled by wait_for (PGOUTBOX_TEST_TIME_SCALE)
    )
    # The innocent jobs of its batch did not wait for the spinning one.
    assert Job.objects.get(pk=spinner.pk).status == JobStatus.LEASED
    wait_for(lambda: Job.objects.get(pk=spinner.pk).status == JobStatus.COMPLETED, timeout=20)
    elapsed = time.monotonic() - started
    worker.stop()

    job = Job.objects.get(pk=spinner.pk)
    calls = job.result
    assert isinstance(calls, int)
    assert calls > 10_000  # a million a second on a fast machine
    assert job.progress == {"done": calls, "total": 10**9, "message": "done"}
    assert job.meta == {"calls": calls}
    written = writes(spinner.pk)
    # While it ran, about one write a second (the first at once); then the outcome's.
    while_leased = [done for done, status in written if status == "leased"]
    assert 2 <= len(while_leased) <= elapsed + 1
    assert while_leased == sorted(while_leased)
    assert written[-1] == (calls, "completed")
