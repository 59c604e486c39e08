"""Progress and metadata against PostgreSQL: WRITE_PROGRESS's fence, the last values written
with the outcome (RECORD_OUTCOMES), a refused value costing its own row only, and a worker's
drain end to end.

``transaction=True``: the statements run as a lane sends them, on a connection of their own
(``DispatcherConnection``), which sees only committed rows; so does the in-process worker.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import enqueue, queries
from django_pgoutbox.db import DispatcherConnection
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.progress import Report
from django_pgoutbox.worker.execute import Outcome, with_report
from django_pgoutbox.worker.outcomes import params
from django_pgoutbox.worker.progress import WriteProgress
from tests.conftest import claimed_job, drain

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "progress-worker"


@pytest.fixture
def lane() -> Any:
    dispatcher = DispatcherConnection("default")
    yield dispatcher.get()
    dispatcher.close()


def claim(worker: str = WORKER) -> tuple[uuid.UUID, int]:
    """Claim the one pending job of queue 'reports' for ``worker``: its key."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CLAIM_JOBS, {"queue": "reports", "limit": 1, "worker_id": worker, "lease": 60}
        )
        (row,) = cursor.fetchall()
    return row[0], row[3]


def leased() -> tuple[uuid.UUID, int]:
    enqueue("tests.behave", {}, queue="reports")
    return claim()


def write(lane: Any, *rows: tuple[tuple[uuid.UUID, int], Report]) -> list[uuid.UUID]:
    return WriteProgress(list(rows), WORKER).run(lane)


def stored(key: tuple[uuid.UUID, int]) -> tuple[Any, Any]:
    job = Job.objects.get(pk=key[0])
    return job.progress, job.meta


def test_written_while_leased_by_this_attempt(lane: Any) -> None:
    key = leased()
    assert write(lane, (key, ((3, 10, "copying"), '{"rows":3}'))) == [key[0]]
    assert stored(key) == ({"done": 3, "total": 10, "message": "copying"}, {"rows": 3})
    write(lane, (key, ((4, 10, None), None)))  # no metadata set since: it stays
    assert stored(key) == ({"done": 4, "total": 10, "message": None}, {"rows": 3})


def test_a_stale_attempt_writes_nothing(lane: Any) -> None:
    key = leased()
    write(lane, (key, ((1, None, "first"), None)))
    # Its lease expires, the job is recovered and claimed again by another worker.
    Job.objects.filter(pk=key[0]).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    with connection.cursor() as cursor:
        cursor.execute(queries.RECOVER_EXPIRED_LEASES, {"queue": "reports", "notify": True})
    again = claim("another-worker")
    assert write(lane, (key, ((9, None, "stale"), '{"stale":true}'))) == []
    assert WriteProgress([(again, ((9, None, None), None))], WORKER).run(lane) == []
    assert stored(key) == ({"done": 1, "total": None, "message": "first"}, None)


def test_the_outcome_carries_the_last_values_and_a_later_write_is_dropped(lane: Any) -> None:
    key = leased()
    write(lane, (key, ((1, 3, None), None)))
    outcome = with_report(
        Outcome.completed(claimed_job("tests.behave", id=key[0], attempt=key[1])),
        ((3, 3, "done"), '{"rows":3}'),
    )
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, params([outcome], WORKER))
    # A write of older values that was in flight comes after the outcome: it finds nothing.
    assert write(lane, (key, ((2, 3, None), '{"rows":2}'))) == []
    job = Job.objects.get(pk=key[0])
    assert job.status == JobStatus.COMPLETED
    assert (job.progress, job.meta) == ({"done": 3, "total": 3, "message": "done"}, {"rows": 3})


def test_an_outcome_without_values_keeps_those_written(lane: Any) -> None:
    key = leased()
    write(lane, (key, ((2, 5, None), '{"step":2}')))
    failed = Outcome(
        claimed_job("tests.behave", id=key[0], attempt=key[1]),
        JobStatus.RETRYING,
        delay=60,
        code="transient",
        summary="later",
    )
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, params([failed], WORKER))
    assert stored(key) == ({"done": 2, "total": 5, "message": None}, {"step": 2})


def test_a_refused_value_costs_its_own_row_only(lane: Any, caplog: Any) -> None:
    """A value PostgreSQL refuses (the checks at the call make it impossible; here the check
    is skipped): the batch goes again row by row, the others are written."""
    first, second = leased(), leased()
    bad: Report = ((1, None, "nul \x00 here"), None)
    with caplog.at_level(logging.ERROR, logger="django_pgoutbox.worker"):
        written = write(lane, (first, bad), (second, ((2, None, "fine"), '{"ok":1}')))
    assert written == [second[0]]
    assert stored(second) == ({"done": 2, "total": None, "message": "fine"}, {"ok": 1})
    assert stored(first) == (None, None)
    assert "could not be stored" in caplog.text


def test_values_that_cannot_be_serialised_are_left_out(lane: Any, caplog: Any) -> None:
    first, second = leased(), leased()
    tampered: Any = ((object(), None, None), None)
    written = write(lane, (first, tampered), (second, ((1, None, None), None)))
    assert written == [second[0]]
    assert "cannot be written" in caplog.text


def test_a_drain_writes_the_last_values_with_the_outcome() -> None:
    job = enqueue("tests.progress", {"calls": 5000, "meta": {"source": "s3"}})
    failing = enqueue("tests.progress", {"calls": 10, "message": "gave up", "fail": True})
    drain()
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert job.progress == {"done": 5000, "total": 10**9, "message": "done"}
    assert job.meta == {"calls": 5000, "source": "s3"}
    failing.refresh_from_db()
    assert failing.status == JobStatus.RETRYING
    assert failing.progress == {"done": 10, "total": 10**9, "message": "gave up"}


def test_an_isolated_attempt_writes_its_last_values_with_the_outcome() -> None:
    job = enqueue("tests.progress_isolated", {})
    drain()
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert job.progress == {"done": 3, "total": 4, "message": "in a child process"}
    assert job.meta is not None
    assert isinstance(job.meta["pid"], int)
