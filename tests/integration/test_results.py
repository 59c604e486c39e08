"""``Job.wait()`` and ``Job.await_result()``: outcomes, errors, timeouts, waking and polling."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_pgoutbox import (
    JobCancelled,
    JobFailed,
    JobNotCompleted,
    WaitInTransaction,
    WaitTimeout,
    cancel,
    enqueue,
    enqueue_many,
)
from django_pgoutbox import results as results_module
from django_pgoutbox.db import raw_connection_params
from django_pgoutbox.ids import uuid7
from django_pgoutbox.maintenance import prune
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.queries import RECORD_OUTCOMES
from django_pgoutbox.results import ResultListener, read_job, seconds, tag
from tests.conftest import drain

pytestmark = pytest.mark.django_db

#: The notification must wake a waiter well before its first poll (1 s) would.
WOKEN_WITHIN = 0.5


def finished(job: Job, status: str, **fields: Any) -> Job:
    """``job`` ended ``status`` by hand (no worker): the state a waiter reads."""
    Job.objects.filter(pk=job.pk).update(status=status, **fields)
    return job


def settings_with(**values: Any) -> Any:
    from django.conf import settings

    return override_settings(PGOUTBOX={**settings.PGOUTBOX, **values})


class TestFinishedJobs:
    """A job already finished: the outcome at once, the instance read again."""

    def test_completed_returns_the_result(self) -> None:
        job = enqueue("tests.behave", {})
        finished(job, JobStatus.COMPLETED, result={"sent": [1, 2]})
        assert job.wait(timeout=0) == {"sent": [1, 2]}
        assert job.status == JobStatus.COMPLETED  # the instance was refreshed
        assert job.result == {"sent": [1, 2]}

    def test_completed_without_a_result_returns_none(self) -> None:
        job = finished(enqueue("tests.behave", {}), JobStatus.COMPLETED)
        assert job.wait() is None

    def test_dead_raises_job_failed_with_code_and_summary(self) -> None:
        job = enqueue("tests.behave", {})
        finished(job, JobStatus.DEAD, last_error_code="KeyError", last_error_summary="'id'")
        with pytest.raises(JobFailed) as raised:
            job.wait(timeout=5)
        error = raised.value
        assert (error.code, error.summary, error.job_id) == ("KeyError", "'id'", job.pk)
        assert error.job is job
        assert job.status == JobStatus.DEAD
        assert isinstance(error, JobNotCompleted)
        assert "KeyError" in str(error)
        assert str(job.pk) in str(error)

    def test_cancelled_raises_job_cancelled(self) -> None:
        job = enqueue("tests.behave", {})
        assert cancel(job.pk) == "cancelled"
        with pytest.raises(JobCancelled) as raised:
            job.wait()
        assert raised.value.code == "cancelled"
        assert isinstance(raised.value, JobNotCompleted)
        assert not isinstance(raised.value, JobFailed)

    def test_unknown_id_raises_does_not_exist(self) -> None:
        with pytest.raises(Job.DoesNotExist):
            Job(id=uuid7()).wait(timeout=1)

    def test_a_job_read_with_only_its_id_is_filled_in(self) -> None:
        job = finished(enqueue("tests.behave", {"a": 1}), JobStatus.COMPLETED, result=[1])
        bare = Job.objects.only("id").get(pk=job.pk)
        assert bare.wait() == [1]
        assert bare.payload == {"a": 1}

    def test_the_exceptions_pickle(self) -> None:
        import pickle

        job = enqueue("tests.behave", {})
        finished(job, JobStatus.DEAD, last_error_code="X", last_error_summary="y")
        with pytest.raises(JobFailed) as raised:
            job.wait()
        again = pickle.loads(pickle.dumps(raised.value))
        assert (type(again), again.code, str(again)) == (JobFailed, "X", str(raised.value))


class TestTimeouts:
    def test_zero_checks_once(self) -> None:
        job = enqueue("tests.behave", {})
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as raised:
            job.wait(timeout=0)
        assert time.monotonic() - started < 0.5
        assert isinstance(raised.value, TimeoutError)
        assert raised.value.job.status == JobStatus.PENDING

    @pytest.mark.parametrize("bad", [-1, -0.001, math.nan, timedelta(seconds=-1)])
    def test_negative_or_nan_is_refused(self, bad: Any) -> None:
        job = enqueue("tests.behave", {})
        with pytest.raises(ValueError, match="timeout"):
            job.wait(timeout=bad)

    @pytest.mark.parametrize("bad", ["1", True, [1]])
    def test_not_a_number_is_refused(self, bad: Any) -> None:
        with pytest.raises(TypeError, match="timeout"):
            Job(id=uuid7()).wait(timeout=bad)

    def test_values(self) -> None:
        assert seconds(None) is None
        assert seconds(math.inf) is None
        assert seconds(10**30) is None  # beyond 365 days: no limit, no overflow
        assert seconds(timedelta(milliseconds=1500)) == 1.5
        assert seconds(0) == 0.0


class TestInsideATransaction:
    """pytest-django runs these tests inside ``transaction.atomic()``."""

    def test_a_job_not_finished_is_refused_at_once(self) -> None:
        job = enqueue("tests.behave", {})  # in this transaction: it cannot run before commit
        assert connection.in_atomic_block
        started = time.monotonic()
        with pytest.raises(WaitInTransaction, match="on_commit"):
            job.wait(timeout=30)
        assert time.monotonic() - started < 0.5

    def test_a_finished_job_still_answers(self) -> None:
        with transaction.atomic():
            job = finished(enqueue("tests.behave", {}), JobStatus.COMPLETED, result=3)
            assert job.wait(timeout=30) == 3


class TestReadJob:
    def test_the_backend_reads_through_it(self) -> None:
        """``get_result()`` (and so ``TaskResult.refresh()``) reads the row as ``wait()``."""
        import inspect

        from django_pgoutbox import backend

        assert "read_job(" in inspect.getsource(backend.PgOutboxBackend.get_result)
        job = enqueue("tests.behave", {})
        found = read_job(job.pk, "default")
        assert found is not None
        assert found.pk == job.pk
        assert read_job(uuid.uuid4(), "default") is None

    def test_tags_are_the_ids_random_tail(self) -> None:
        first, second = uuid7(), uuid7()
        assert tag(first) == first.hex[-8:]
        assert tag(first) != tag(second)
        assert str(first).endswith(tag(first))  # what the SQL takes: right(id::text, 8)


# -- waiting for a job that finishes while one waits --------------------------------------------
# transaction=True from here on: the job is finished by another connection (a worker thread,
# or a statement sent on a connection of its own), which must see the committed job, and the
# waiter's LISTEN connection must see that commit's notification.


def record_later(
    ids: list[uuid.UUID], status: str, delay: float, notify: bool = True, result: Any = None
) -> threading.Thread:
    """Finish ``ids`` with ``status`` after ``delay`` seconds, by RECORD_OUTCOMES (as a worker
    writes a batch), on a connection of its own."""

    def run() -> None:
        time.sleep(delay)
        with psycopg.connect(**raw_connection_params("default"), autocommit=True) as conn:
            conn.execute(
                "UPDATE jobs SET status = 'leased', locked_by = 'w', attempts = 1 "
                "WHERE id = ANY(%s)",
                [ids],
            )
            n = len(ids)
            conn.execute(
                RECORD_OUTCOMES,
                {
                    "ids": ids,
                    "attempts": [1] * n,
                    "statuses": [status] * n,
                    "gives_back_attempt": [False] * n,
                    "delays": [0.0] * n,
                    "codes": [None if status == "completed" else "Boom"] * n,
                    "summaries": [None if status == "completed" else "it broke"] * n,
                    "results": [json.dumps(result)] * n,
                    "progress": [None] * n,
                    "meta": [None] * n,
                    "traces": [],
                    "worker_id": "w",
                    "notify": notify,
                },
            )

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def drain_soon() -> None:
    time.sleep(0.2)
    drain()


@pytest.fixture
def quiet_listener() -> Iterator[None]:
    """No listener kept from an earlier test: this one starts its own."""
    ResultListener.close_all()
    yield
    ResultListener.close_all()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_listener")
class TestWaking:
    def test_a_worker_completes_it(self) -> None:
        job = enqueue("tests.behave", {"result": {"ok": True}})
        worker = threading.Thread(target=drain_soon)
        worker.start()
        assert job.wait(timeout=30) == {"ok": True}
        worker.join()
        assert job.status == JobStatus.COMPLETED
        assert job.completed_at is not None

    def test_a_worker_kills_it(self) -> None:
        job = enqueue("tests.behave", {"fail": "permanent"})
        worker = threading.Thread(target=drain_soon)
        worker.start()
        with pytest.raises(JobFailed) as raised:
            job.wait(timeout=30)
        worker.join()
        assert raised.value.code == "PermanentError"

    def test_the_notification_wakes_it_before_any_poll(self) -> None:
        job = enqueue("tests.behave", {})
        finisher = record_later([job.pk], "completed", 0.3, result=7)
        started = time.monotonic()
        assert job.wait(timeout=10) == 7
        finisher.join()
        assert time.monotonic() - started < 0.3 + WOKEN_WITHIN

    def test_a_waiter_of_another_job_in_the_batch_is_not_disturbed(self) -> None:
        waited, other = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 2)
        finisher = record_later([other.pk], "completed", 0.2)
        with pytest.raises(WaitTimeout):
            waited.wait(timeout=0.8)
        finisher.join()
        assert waited.status == JobStatus.PENDING

    def test_without_notifications_a_poll_finds_it(self) -> None:
        job = enqueue("tests.behave", {})
        with settings_with(NOTIFY=False, POLL_INTERVAL=0.3):
            finisher = record_later([job.pk], "completed", 0.2, notify=False, result="late")
            started = time.monotonic()
            assert job.wait(timeout=10) == "late"
            finisher.join()
        assert time.monotonic() - started < 0.2 + 0.3 + WOKEN_WITHIN

    def test_a_lost_notification_costs_a_poll(self) -> None:
        """The listener listens, but the outcome is written without a notification."""
        job = enqueue("tests.behave", {})
        with settings_with(POLL_INTERVAL=0.4):
            finisher = record_later([job.pk], "completed", 0.2, notify=False, result=1)
            assert job.wait(timeout=10) == 1
            finisher.join()

    def test_the_listener_connection_killed_mid_wait(self) -> None:
        job = enqueue("tests.behave", {})
        box: dict[str, Any] = {}
        waiter = threading.Thread(target=lambda: box.update(result=job.wait(timeout=20)))
        waiter.start()
        listener = ResultListener.of("default")
        deadline = time.monotonic() + 5
        while listener.backend_pid is None and time.monotonic() < deadline:
            time.sleep(0.02)
        killed = listener.backend_pid
        assert killed is not None
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [killed])
        # written while the listener is away: no one hears it, and a reconnect or a poll finds it
        record_later([job.pk], "completed", 0.0, result="found").join()
        waiter.join(timeout=10)
        assert box == {"result": "found"}
        deadline = time.monotonic() + 5
        while listener.backend_pid in (None, killed) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert listener.backend_pid not in (None, killed)  # it reconnected

    def test_a_timeout_while_it_runs(self) -> None:
        job = enqueue("tests.behave", {})
        started = time.monotonic()
        with pytest.raises(WaitTimeout, match=r"still pending after 0\.4s"):
            job.wait(timeout=timedelta(seconds=0.4))
        assert 0.4 <= time.monotonic() - started < 0.4 + WOKEN_WITHIN

    def test_cancel_wakes_it(self) -> None:
        job = enqueue("tests.behave", {})
        canceller = threading.Timer(0.2, lambda: cancel(job.pk))
        canceller.start()
        started = time.monotonic()
        with pytest.raises(JobCancelled):
            job.wait(timeout=10)
        canceller.join()
        assert time.monotonic() - started < 0.2 + WOKEN_WITHIN

    def test_await_result(self) -> None:
        jobs = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 3)
        ok, dead, slow = jobs
        record_later([ok.pk], "completed", 0.2, result="a")
        record_later([dead.pk], "dead", 0.2)

        async def main() -> tuple[Any, ...]:
            ticks = 0

            async def tick() -> None:  # the loop keeps running while they wait
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticker = asyncio.create_task(tick())
            outcomes = await asyncio.gather(
                ok.await_result(timeout=10),
                dead.await_result(timeout=10),
                slow.await_result(timeout=0.6),
                return_exceptions=True,
            )
            ticker.cancel()
            assert ticks > 20
            return tuple(outcomes)

        started = time.monotonic()
        value, failed, timed_out = asyncio.run(main())
        assert value == "a"
        assert isinstance(failed, JobFailed)
        assert failed.code == "Boom"
        assert isinstance(timed_out, WaitTimeout)
        assert time.monotonic() - started < 0.6 + WOKEN_WITHIN

    def test_many_waiters_share_one_listen_connection(self) -> None:
        # each waiting thread polls on its own Django connection: as many as the test server
        # can spare (its max_connections is 100), not the 200 a web server might have
        n = 40
        jobs = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * n)
        outcomes: list[Any] = [None] * n

        def wait(i: int) -> None:
            try:
                outcomes[i] = jobs[i].wait(timeout=30)
            except JobFailed as error:
                outcomes[i] = error.code
            finally:
                connection.close()

        threads = [threading.Thread(target=wait, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        with connection.cursor() as cursor:
            # one listener registered every job its waiters wait for (job_waiters)
            cursor.execute(
                "SELECT count(*), count(DISTINCT listener_pid) FROM job_waiters"
                " WHERE job_id = ANY(%s)",
                [[job.pk for job in jobs]],
            )
            assert cursor.fetchone() == (n, 1)
        half = [job.pk for job in jobs[: n // 2]]
        rest = [job.pk for job in jobs[n // 2 :]]
        record_later(half, "completed", 0.0, result=1).join()
        record_later(rest, "dead", 0.0).join()
        started = time.monotonic()
        for thread in threads:
            thread.join(timeout=30)
        assert time.monotonic() - started < 5
        assert outcomes[: n // 2] == [1] * (n // 2)
        assert outcomes[n // 2 :] == ["Boom"] * (n - n // 2)

    def test_retried_from_dead_a_new_wait_waits_again(self) -> None:
        from django_pgoutbox.control import retry_dead_jobs

        job = enqueue("tests.behave", {})
        record_later([job.pk], "dead", 0.0).join()
        with pytest.raises(JobFailed):
            job.wait(timeout=5)
        assert retry_dead_jobs([job.pk]) == 1
        record_later([job.pk], "completed", 0.2, result="second").join()
        assert job.wait(timeout=5) == "second"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("quiet_listener")
def test_latency_from_completion_to_return(capsys: Any) -> None:
    """The time from the commit of a completion to ``wait()`` returning, notified and polled:
    printed for docs/benchmarks.md (``-s``); the notified one must beat the first poll."""
    figures = {}
    for label, notify in (("notified", True), ("polled", False)):
        lags: list[float] = []
        for _ in range(10):
            job = enqueue("tests.behave", {})
            committed: list[float] = []

            def finish(
                job_id: uuid.UUID = job.pk, notify: bool = notify, done: list[float] = committed
            ) -> None:
                record_later([job_id], "completed", 0.1, notify=notify).join()
                done.append(time.monotonic())

            thread = threading.Thread(target=finish)
            thread.start()
            job.wait(timeout=10)
            returned = time.monotonic()
            thread.join()
            lags.append(returned - committed[0])
        figures[label] = statistics.median(lags)
    with capsys.disabled():
        print(f"\nwait() after a completion: {figures}")
    assert figures["notified"] < 0.2 < figures["polled"]


@pytest.mark.django_db(databases=[])
def test_a_closed_event_loop_does_not_stop_the_listener() -> None:
    """A callback that raises (its loop closed) is the waiter's problem only."""
    loop = asyncio.new_event_loop()
    loop.close()

    def wake() -> None:
        loop.call_soon_threadsafe(lambda: None)

    results_module._call(wake)


@pytest.mark.django_db(transaction=True)  # the statements run on connections of their own
@pytest.mark.usefixtures("quiet_listener")
class TestOnlyWaitedJobsAreTold:
    def test_jobs_no_one_waits_for_are_finished_without_a_notification(self) -> None:
        waited, alone = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 2)
        with psycopg.connect(**raw_connection_params("default"), autocommit=True) as heard:
            heard.execute("LISTEN pgoutbox_results")
            record_later([alone.pk], "completed", 0.0).join()
            assert [n.payload for n in heard.notifies(timeout=0.5)] == []
            # a listener's registration (as ResultListener writes it) makes it told
            heard.execute("INSERT INTO job_waiters (job_id) VALUES (%s)", [waited.pk])
            record_later([waited.pk], "completed", 0.0).join()
            assert [n.payload for n in heard.notifies(timeout=2, stop_after=1)] == [tag(waited.pk)]

    def test_a_gone_listeners_registrations_are_pruned(self) -> None:
        job = enqueue("tests.behave", {})
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM job_waiters")  # no model: the flush between tests leaves it
            cursor.execute(
                "INSERT INTO job_waiters (job_id, listener_pid) VALUES (%s, -1), (%s, DEFAULT)",
                [job.pk, job.pk],
            )
        assert prune().stale_waiters == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT listener_pid = pg_backend_pid() FROM job_waiters")
            assert cursor.fetchall() == [(True,)]
