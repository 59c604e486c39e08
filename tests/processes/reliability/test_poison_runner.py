"""Poison against the job runner: what a job can do to the worker's own paths.

Each case runs a real ``runworkers`` process with innocent jobs enqueued beside the poison in the
same ``enqueue_many`` (one claim takes them), and asserts: the process is still running, every
innocent job completed at its first attempt, the poison ended in its named state, nothing stays
leased. Paths that no handler can reach any more are driven in-process, on the real database.

transaction=True throughout: the workers are other processes (or threads with connections of
their own) and see only committed rows.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import cancel, enqueue_many, queries
from django_pgoutbox.conf import get_settings
from django_pgoutbox.db import DispatcherConnection
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.runner import QueueRunner
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Short leases and polls, so that recovery happens within the test's patience; four threads.
QUICK = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.2}
FOUR = ("--queues", "default", "--concurrency", "4")

INNOCENT = {"job_type": "tests.behave", "payload": {"sleep": 0.05}}


def innocents_and(poison: dict[str, Any], count: int = 3) -> tuple[Sequence[Job], Job]:
    """``count`` innocent jobs and the poison, in one ``enqueue_many``: one claim takes them."""
    jobs = enqueue_many([INNOCENT] * count + [poison])
    return jobs[:-1], jobs[-1]


def assert_innocents_completed_once(innocents: Sequence[Job]) -> None:
    for job in innocents:
        job.refresh_from_db()
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1), job.last_error_summary


def ended(job: Job, status: str) -> bool:
    """Whether ``job`` is ``status`` now (its columns but the payload are read again)."""
    fresh = Job.objects.defer("payload").get(pk=job.pk)
    for name in ("status", "attempts", "last_error_code", "last_error_summary", "result"):
        setattr(job, name, getattr(fresh, name))
    return job.status == status


def nothing_leased() -> bool:
    return not Job.objects.filter(status=JobStatus.LEASED).exists()


# -- 3: every attempt ends in an outcome, even when the worker's own path fails ------------------


def test_a_payload_too_deep_for_python_is_dead_and_the_threads_survive(start_worker: Any) -> None:
    """A payload of 3,000 nested arrays, written by raw SQL: PostgreSQL stores it, Python's
    parser raises RecursionError. It used to kill its handler thread and leave a lease renewed
    for ever; now it is dead, ``unreadable_job``, its payload intact, and the queue keeps its
    four threads."""
    innocents, poison = innocents_and({"job_type": "tests.behave", "payload": {}})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET payload = ('{\"deep\": ' || repeat('[', 3000) || repeat(']', 3000)"
            " || '}')::jsonb WHERE id = %s",
            [poison.pk],
        )
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: ended(poison, JobStatus.DEAD), timeout=15)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=15)
    assert poison.last_error_code == "unreadable_job"
    assert "RecursionError" in (poison.last_error_summary or "")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT jsonb_typeof(payload -> 'deep') FROM jobs WHERE id = %s", [poison.pk]
        )
        assert cursor.fetchone()[0] == "array"  # kept for an operator
    assert_innocents_completed_once(innocents)

    # Four threads still: four slow jobs all start before any of them ends.
    slow = enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 1.0}}] * 4)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in slow), timeout=15)
    starts = SideEffect.objects.filter(job_id__in=[j.pk for j in slow], event="start")
    first_end = SideEffect.objects.filter(job_id__in=[j.pk for j in slow], event="end").earliest(
        "id"
    )
    assert starts.filter(id__lt=first_end.id).count() == 4
    assert nothing_leased()
    assert worker.process.poll() is None


@pytest.fixture
def runner() -> Iterator[QueueRunner]:
    """A queue's coordinator run in this process (four threads, 1 s leases), for the paths
    that no handler can reach: its thread runs ``run()`` until the test ends."""
    conf = get_settings()
    settings = dataclasses.replace(
        conf.queues["default"], lease_seconds=1.0, poll_interval=0.2, connections=1
    )
    runner = QueueRunner(
        settings, worker_id="w-poison", using="default", policy=conf.retry, concurrency=4
    )
    yield runner
    runner.stop()
    runner.finished.wait(10)
    for thread in threading.enumerate():
        if thread.name.startswith(f"pgoutbox-{runner.queue}"):
            thread.join(10)


def run_in_thread(runner: QueueRunner) -> threading.Thread:
    thread = threading.Thread(target=runner.run, name="test-dispatcher", daemon=True)
    thread.start()
    return thread


def handler_threads(runner: QueueRunner) -> int:
    return sum(
        1
        for t in threading.enumerate()
        if t.name.startswith(f"pgoutbox-{runner.queue}") and t.is_alive()
    )


def test_an_attempt_left_without_an_outcome_is_no_longer_renewed(
    runner: QueueRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """The last resort: were a path of the handler thread to return with no outcome, the
    dispatcher stops renewing that attempt (logged at ERROR), frees its slot, and its lease
    expires into recovery. No handler reaches it; the test makes the thread's path do so."""
    innocents, poison = innocents_and({"job_type": "tests.behave", "payload": {}})
    run_attempt = runner._handlers.run

    def lose_the_poison(entry: Attempt) -> Outcome | None:
        if entry.id != poison.pk:
            return run_attempt(entry)
        return None

    runner._handlers.run = lose_the_poison
    caplog.set_level(logging.ERROR, logger="django_pgoutbox.worker")
    thread = run_in_thread(runner)
    wait_for(lambda: "returned without an outcome" in caplog.text, timeout=10)
    wait_for(lambda: Job.objects.filter(pk=poison.pk, last_error_code="lease_expired").exists())
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=10)
    assert_innocents_completed_once(innocents)
    assert thread.is_alive()


class _Dying(BaseException):
    """Raised where nothing in the worker expects an exception: its thread dies."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_handler_thread_that_dies_is_replaced_and_its_attempt_expires(
    runner: QueueRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler thread killed mid-attempt (here: an exception raised out of the log call
    that reports its failure) is replaced, so the queue keeps its four threads; its attempt
    is no longer renewed and recovery takes it."""
    innocents, poison = innocents_and({"job_type": "tests.behave", "payload": {}})
    run_attempt = runner._handlers.run

    def fail_on_the_poison(entry: Attempt) -> Outcome | None:
        if entry.id == poison.pk and entry.attempt == 1:
            raise RuntimeError("the worker's own path failed")
        return run_attempt(entry)

    def die(record: logging.LogRecord) -> bool:
        if record.getMessage().endswith("running a job failed in the worker"):
            raise _Dying
        return True

    worker_logger = logging.getLogger("django_pgoutbox.worker")
    worker_logger.addFilter(die)
    runner._handlers.run = fail_on_the_poison
    caplog.set_level(logging.ERROR, logger="django_pgoutbox.worker")
    try:
        run_in_thread(runner)
        wait_for(lambda: "a handler thread died; starting another" in caplog.text, timeout=10)
        # Recovered from its expired lease, its second attempt runs as any other.
        wait_for(lambda: ended(poison, JobStatus.COMPLETED), timeout=10)
        wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=10)
    finally:
        worker_logger.removeFilter(die)
    assert (poison.attempts, poison.last_error_code) == (2, "lease_expired")
    assert "its handler thread died without an outcome" in caplog.text
    assert handler_threads(runner) == 4
    assert_innocents_completed_once(innocents)


# -- 5: an outcome PostgreSQL refuses is that job's dead letter, not its batch's -----------------


@pytest.mark.parametrize("prepared", [False, True], ids=["first-run", "prepared"])
def test_an_outcome_jsonb_refuses_is_dead_and_the_rest_of_its_batch_is_written(
    prepared: bool,
) -> None:
    """One statement carries four outcomes and a claim; one result overflows jsonb's numeric
    (22003). The outcomes go again one by one: the three innocents' are written, the poison's
    becomes ``unwritable_outcome`` (result dropped), and the claim runs once. ``prepared``: the
    lane's outcome statements have run often enough to be prepared (a lane's connection
    prepares them), so that the poison fails a prepared statement, and the one by one runs
    prepared statements on the connection that just failed."""
    from django_pgoutbox.worker import outcomes

    batch = enqueue_many([{"job_type": "tests.behave", "payload": {"record": False}}] * 4)
    waiting = enqueue_many([{"job_type": "tests.behave", "payload": {"record": False}}] * 2)
    settings = get_settings().queues["default"]
    connection = DispatcherConnection("default")
    nothing = {"queue": "default", "limit": 0, "worker_id": "w-poison", "lease": 60.0}
    try:
        with connection.get().cursor() as cursor:
            for _ in range(3 if prepared else 0):
                queries.send(cursor, "RECORD_AND_CLAIM", outcomes.params([], "w") | nothing)
                queries.send(cursor, "RECORD_OUTCOMES", outcomes.params([], "w"))
            queries.send(
                cursor,
                "CLAIM_JOBS",
                {"queue": "default", "limit": 4, "worker_id": "w-poison", "lease": 60.0},
            )
            claimed = [Attempt(queries.ClaimRow._make(row)) for row in cursor.fetchall()]
        assert {entry.id for entry in claimed} == {job.pk for job in batch}
        poison = claimed[-1]
        sent = []
        for entry in claimed:
            result = '{"n": 1' + "0" * 140_000 + "}" if entry is poison else '{"ok": true}'
            sent.append(Outcome.completed(entry.job(), result))
        request = RecordAndClaim(settings, "w-poison", sent, 6).run(connection.get())
        with connection.get().cursor() as cursor:
            cursor.execute(  # the statement the poison failed: outcomes and a claim
                "SELECT count(*) FROM pg_prepared_statements"
                " WHERE statement LIKE '%%recorded AS%%' AND statement LIKE '%%candidates AS%%'"
            )
            (failed_prepared,) = cursor.fetchone() or (0,)
    finally:
        connection.close()
    assert failed_prepared == (1 if prepared else 0)
    requested, started = request.limit, request.rows
    assert requested > 0
    assert {entry.id for entry in started} == {job.pk for job in waiting}  # claimed once
    for job in Job.objects.filter(pk__in=[j.pk for j in waiting]):
        assert job.attempts == 1
    for job in Job.objects.filter(pk__in=[e.id for e in claimed if e is not poison]):
        assert (job.status, job.result) == (JobStatus.COMPLETED, {"ok": True})
    dead = Job.objects.get(pk=poison.id)
    assert (dead.status, dead.last_error_code, dead.result) == (
        JobStatus.DEAD,
        "unwritable_outcome",
        None,
    )
    assert "could not be stored" in (dead.last_error_summary or "")
    assert "numeric" in (dead.last_error_summary or "")


def test_a_result_too_deep_for_the_server_is_dead_and_the_queue_goes_on(start_worker: Any) -> None:
    """A result of 900 nested lists on a server with a small stack: 54001, stack depth limit
    exceeded, a psycopg ``OperationalError`` that the worker took for a lost connection, sending
    the same batch for ever while every job in it stayed leased. Now: ``unwritable_outcome``."""
    innocents, poison = innocents_and({"job_type": "tests.poison_deep_result", "payload": {}})
    worker = start_worker(*FOUR, env={"PGOPTIONS": "-c max_stack_depth=100kB"}, **QUICK)
    wait_for(lambda: ended(poison, JobStatus.DEAD), timeout=15)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=15)
    assert (poison.last_error_code, poison.result, poison.attempts) == (
        "unwritable_outcome",
        None,
        1,
    )
    assert "stack depth" in (poison.last_error_summary or "")
    assert_innocents_completed_once(innocents)
    assert nothing_leased()
    assert worker.process.poll() is None


def test_a_handler_that_loses_its_connection_is_retried_past_the_unknown_budget(
    start_worker: Any,
) -> None:
    """A handler whose own database session is terminated five times (more than the three
    retries an unknown exception gets) is retried as transient and completes at its sixth
    attempt; one that catches the error and returns completes, and the broken connection it
    leaves on its thread is not handed to the innocents that run there next."""
    jobs = enqueue_many(
        [INNOCENT] * 3
        + [
            {"job_type": "tests.lose_connection", "payload": {"times": 5}},
            {"job_type": "tests.lose_connection", "payload": {"times": 1, "swallow": True}},
        ]
        + [INNOCENT] * 8
    )
    innocents = [*jobs[:3], *jobs[5:]]
    lost, swallowed = jobs[3], jobs[4]
    worker = start_worker(
        "--queues", "default", "--concurrency", "1", RETRY={"BASE_DELAY": 0.01}, **QUICK
    )
    wait_for(lambda: ended(lost, JobStatus.COMPLETED), timeout=30)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=15)
    assert (lost.attempts, lost.result) == (6, {"attempt": 6})
    assert lost.last_error_code == "OperationalError", lost.last_error_summary
    assert ended(swallowed, JobStatus.COMPLETED)
    assert (swallowed.attempts, swallowed.result) == (1, {"swallowed": 1})
    assert_innocents_completed_once(innocents)
    assert nothing_leased()
    assert worker.process.poll() is None


def test_a_result_jsonb_cannot_hold_is_dead_and_the_process_lives(start_worker: Any) -> None:
    """An integer of 140,001 digits (22003, numeric overflow) used to stop the process."""
    innocents, poison = innocents_and({"job_type": "tests.poison_big_number", "payload": {}})
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: ended(poison, JobStatus.DEAD), timeout=15)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=15)
    assert (poison.last_error_code, poison.result, poison.attempts) == (
        "unwritable_outcome",
        None,
        1,
    )
    assert_innocents_completed_once(innocents)
    assert nothing_leased()
    assert worker.process.poll() is None


# -- health: a queue whose every thread is held by a hung attempt is reported -------------------


def test_health_reports_a_queue_whose_threads_all_hang_past_their_timeout(
    start_worker: Any, admin_client: Any
) -> None:
    """Four attempts hang past their 1 s timeout on the queue's four threads: each is failed
    and replaced, the innocents run on the replacements, and ``/pgoutbox/health`` says 503,
    naming the queue, until the hung handlers return (read by staff: the view's default rule)."""
    hung = enqueue_many([{"job_type": "tests.poison_hang", "payload": {"seconds": 6}}] * 4)
    innocents = enqueue_many([INNOCENT] * 3)
    worker = start_worker(*FOUR, **QUICK)
    report = wait_for(
        lambda: (
            (r := admin_client.get("/pgoutbox/health?require=jobs")).status_code == 503
            and r.json()["stuck_queues"]
            and r.json()
        ),
        timeout=10,
    )
    assert report["stuck_queues"] == ["default"]
    assert report["roles"] == {"jobs": True}  # the process is alive: it is the queue that is not
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=10)
    assert_innocents_completed_once(innocents)
    for job in hung:
        job.refresh_from_db()
        assert (job.status, job.last_error_code) == (JobStatus.DEAD, "timeout")
    # The hung handlers return: the queue has its own threads again.
    wait_for(
        lambda: admin_client.get("/pgoutbox/health?require=jobs").status_code == 200, timeout=15
    )
    assert nothing_leased()
    assert worker.process.poll() is None


# -- 7: a job that kills its process spends its own attempts, not its neighbours' -------------


def expire(job: Job, **columns: Any) -> None:
    """Make ``job`` a lease held by a dead worker, expired a second ago."""
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.LEASED,
        locked_by="dead-worker",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        **columns,
    )


def test_recovery_counts_only_an_attempt_lost_while_it_ran_alone() -> None:
    beside, alone_last, alone_early, marked_before = enqueue_many(
        [{"job_type": "tests.behave", "payload": {}}] * 4
    )
    Job.objects.filter(pk__in=[beside.pk, alone_last.pk, alone_early.pk]).update(max_attempts=3)
    Job.objects.filter(pk=marked_before.pk).update(max_attempts=2)
    expire(beside, attempts=3)  # its last attempt, lost beside others (or never started)
    expire(alone_last, attempts=3, alone_attempt=3)  # its last attempt, lost alone
    expire(alone_early, attempts=1, alone_attempt=1)
    expire(marked_before, attempts=2, alone_attempt=1)  # ran alone once; this attempt did not
    recovered = {lease.job_id: lease.status for lease in recover_expired_leases()}
    assert recovered == {
        beside.pk: "retrying",
        alone_last.pk: "dead",
        alone_early.pk: "retrying",
        marked_before.pk: "retrying",
    }
    expected = {beside.pk: 2, alone_last.pk: 3, alone_early.pk: 1, marked_before.pk: 1}
    for job in Job.objects.filter(pk__in=expected):
        assert job.attempts == expected[job.pk]
        assert (job.last_error_code, job.lost_attempts) == ("lease_expired", 1)
    assert "given back" in str(Job.objects.get(pk=beside.pk).last_error_summary)
    assert "counts" in str(Job.objects.get(pk=alone_last.pk).last_error_summary)
    # A second loss in a row: given back again, and now a suspect (lost_attempts 2).
    expire(Job.objects.get(pk=beside.pk), attempts=3)
    recover_expired_leases()
    again = Job.objects.get(pk=beside.pk)
    assert (again.status, again.attempts, again.lost_attempts) == (JobStatus.RETRYING, 2, 2)


def exited_or_dead(process: subprocess.Popen[bytes], job: Job) -> bool:
    return process.poll() is not None or ended(job, JobStatus.DEAD)


def test_a_job_that_kills_its_process_dies_alone(start_worker: Any) -> None:
    """``os._exit(9)`` beside three 1 s jobs that have two attempts each, in one claim, the
    worker started again after each crash. The first two crashes take every job the worker
    held, and give every attempt back; lost twice in a row, each job is a suspect and runs
    alone: the poison dies alone three times (its budget), each counted, and the innocents
    complete at their first counted attempt."""
    jobs = enqueue_many(
        [{"job_type": "tests.poison_exit", "payload": {"after": 0.2}}]
        + [{"job_type": "tests.poison_neighbour", "payload": {"sleep": 1.0}}] * 3
    )
    poison, innocents = jobs[0], jobs[1:]
    crashes = 0
    # An innocent running alone must keep its lease: under a loaded machine's stalls, a lease
    # of 1 s was once lost (and that attempt, alone, counted). Scaled with the suite's deadlines.
    settings = {**QUICK, "LEASE_SECONDS": scaled(1.0)}
    while True:
        worker = start_worker(*FOUR, **settings)
        wait_for(partial(exited_or_dead, worker.process, poison), timeout=30)
        if worker.process.poll() is None:
            break
        assert worker.process.returncode == 9
        crashes += 1
        assert crashes <= 5, "the poison killed its worker more often than its budget allows"
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=30)
    assert (poison.status, poison.attempts, poison.last_error_code) == (
        JobStatus.DEAD,
        3,
        "lease_expired",
    )
    assert crashes == 5  # two beside the innocents, given back; then three alone
    for job in innocents:
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1), job.last_error_summary
        assert SideEffect.objects.filter(job_id=job.pk, event="end").count() == 1
    assert nothing_leased()
    assert worker.process.poll() is None


def suspect_beside(neighbour_sleep: float) -> tuple[Job, Job]:
    """A neighbour (claimed first: a higher priority) and a suspect, due together."""
    neighbour, suspect = enqueue_many(
        [
            {"job_type": "tests.behave", "payload": {"sleep": neighbour_sleep}, "priority": 5},
            {"job_type": "tests.behave", "payload": {}},
        ]
    )
    make_suspect(suspect)
    return neighbour, suspect


def make_suspect(job: Job) -> None:
    """Make ``job`` a suspect: lost with its worker twice in a row, its attempts given back."""
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.RETRYING, last_error_code="lease_expired", attempts=1, lost_attempts=2
    )


def event_at(job: Job, event: str) -> Any:
    return SideEffect.objects.get(job_id=job.pk, event=event).at


def test_a_suspect_starts_once_the_attempts_beside_it_have_ended(start_worker: Any) -> None:
    neighbour, suspect = suspect_beside(0.5)
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: ended(suspect, JobStatus.COMPLETED) and ended(neighbour, JobStatus.COMPLETED))
    assert event_at(suspect, "start") >= event_at(neighbour, "end")
    assert Job.objects.get(pk=suspect.pk).alone_attempt == 2
    assert "runs alone" in worker.output()


def test_a_suspect_waits_at_most_a_lease_then_is_given_back(start_worker: Any) -> None:
    """A neighbour that outlives the lease period: the suspect is given back unstarted (its
    attempt with it) and claims resume, again and again, until it can run alone."""
    neighbour, suspect = suspect_beside(4.0)
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: "given back unstarted" in worker.output())
    quick = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 2)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in quick))
    assert not SideEffect.objects.filter(job_id=neighbour.pk, event="end").exists()
    wait_for(lambda: ended(suspect, JobStatus.COMPLETED))
    assert event_at(suspect, "start") >= event_at(neighbour, "end")
    assert (suspect.attempts, Job.objects.get(pk=suspect.pk).alone_attempt) == (2, 2)
    wait_for(lambda: ended(neighbour, JobStatus.COMPLETED))


def test_a_suspect_held_at_shutdown_gets_its_attempt_back(start_worker: Any) -> None:
    neighbour, suspect = suspect_beside(2.0)
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=neighbour.pk, event="start").exists())
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    held = Job.objects.get(pk=suspect.pk)
    assert (held.status, held.attempts) == (JobStatus.PENDING, 1)
    assert not SideEffect.objects.filter(job_id=suspect.pk).exists()


def crash_loop(
    start_worker: Any,
    args: Sequence[str],
    poison: Job,
    rounds: int,
    before: Callable[[], object] | None = None,
) -> int:
    """Start a worker again after each crash, at most ``rounds`` times; return the crashes."""
    crashes = 0
    while crashes < rounds:
        if before is not None:
            before()
        worker = start_worker(*args, **QUICK)
        wait_for(partial(exited_or_dead, worker.process, poison), timeout=30)
        if worker.process.poll() is None:
            return crashes
        crashes += 1
    return crashes


def test_a_poison_in_another_queue_of_the_process_spends_no_innocents_attempts(
    start_worker: Any,
) -> None:
    """One process, two queues: the poison in one, an innocent 1 s job with two attempts in
    the other. Once both are suspects, the process's gate lets one of them run alone at a
    time, so the poison's crashes never count against the innocent."""
    poison, innocent = enqueue_many(
        [
            {"job_type": "tests.poison_exit", "payload": {"after": 0.3}, "queue": "notifications"},
            {"job_type": "tests.poison_neighbour", "payload": {"sleep": 1.0}},
        ]
    )
    args = ("--queues", "default,notifications", "--concurrency", "4")
    assert crash_loop(start_worker, args, poison, 6) <= 5
    wait_for(lambda: ended(innocent, JobStatus.COMPLETED) or ended(innocent, JobStatus.DEAD))
    assert (innocent.status, innocent.attempts) == (JobStatus.COMPLETED, 1)
    assert ended(poison, JobStatus.DEAD)


def test_a_poison_beside_a_neighbour_longer_than_a_lease_still_reaches_dead(
    start_worker: Any,
) -> None:
    """Each round, a job that runs longer than a lease is claimed before the poison: the
    suspect poison waits a lease for it, then starts beside it, marked, so its crashes count;
    the long jobs it takes down are given their attempts back."""

    def enqueue_long() -> None:
        enqueue_many(
            [{"job_type": "tests.poison_neighbour", "payload": {"sleep": 4.0}, "priority": 5}]
        )

    (poison,) = enqueue_many([{"job_type": "tests.poison_exit", "payload": {"after": 0.2}}])
    crashes = crash_loop(start_worker, FOUR, poison, 7, before=enqueue_long)
    assert ended(poison, JobStatus.DEAD), (crashes, poison.attempts, poison.last_error_summary)
    assert crashes <= 5
    assert not Job.objects.filter(job_type="tests.poison_neighbour", status="dead").exists()


def test_a_claim_clears_the_mark_of_an_earlier_attempt(start_worker: Any) -> None:
    """A suspect starts alone (marked), then snoozes: its attempt goes back down, so its next
    attempt has the same number. That claim clears the mark: a neighbour's crash during the
    next attempt gives the attempt back instead of counting it."""
    (snoozer,) = enqueue_many([{"job_type": "tests.snooze_then_sleep", "payload": {"sleep": 3.0}}])
    make_suspect(snoozer)
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=snoozer.pk, event="start").count() == 2)
    assert Job.objects.get(pk=snoozer.pk).alone_attempt is None
    enqueue_many([{"job_type": "tests.poison_exit", "payload": {"after": 0.3}}])
    worker.wait(timeout=20)  # the poison kills it
    wait_for(lambda: recover_expired_leases(), timeout=10)
    snoozer.refresh_from_db()
    assert (snoozer.status, snoozer.attempts) == (JobStatus.RETRYING, 1), snoozer.last_error_summary


def test_a_long_suspect_holds_its_queue_for_a_lease_period_only(start_worker: Any) -> None:
    (suspect,) = enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 8.0}}])
    make_suspect(suspect)
    start_worker(*FOUR, **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=suspect.pk, event="start").exists())
    quick = enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 3)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in quick), timeout=5)
    assert not SideEffect.objects.filter(job_id=suspect.pk, event="end").exists()


def test_a_lone_suspect_starts_as_soon_as_it_is_claimed(start_worker: Any) -> None:
    (suspect,) = enqueue_many([{"job_type": "tests.behave", "payload": {}}])
    make_suspect(suspect)
    start_worker(*FOUR, LEASE_SECONDS=30, POLL_INTERVAL=4)
    wait_for(lambda: ended(suspect, JobStatus.COMPLETED), timeout=30)
    locked_at = Job.objects.get(pk=suspect.pk).locked_at
    assert locked_at is not None
    started = SideEffect.objects.get(job_id=suspect.pk, event="start").at
    assert (started - locked_at).total_seconds() < scaled(1.0)


def test_suspects_claimed_together_are_handed_back_but_one(start_worker: Any) -> None:
    """Two workers, four suspects: each worker holds one at a time and gives the others back
    at once, so both run suspects alone at the same time, and every suspect runs once."""
    suspects = enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 1.0}}] * 4)
    for job in suspects:
        make_suspect(job)
    first = start_worker(*FOUR, **QUICK)
    second = start_worker(*FOUR, **QUICK)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in suspects), timeout=30)
    pids = {effect.pid for effect in SideEffect.objects.filter(event="start")}
    assert pids == {first.pid, second.pid}
    for job in suspects:
        assert SideEffect.objects.filter(job_id=job.pk, event="start").count() == 1


def test_a_held_suspect_cancelled_ends_at_once(start_worker: Any) -> None:
    """Held back behind a neighbour, a suspect whose cancellation is requested ends cancelled
    without waiting for its turn, and its handler never runs."""
    neighbour, suspect = suspect_beside(3.0)
    start_worker(*FOUR, **QUICK)
    wait_for(lambda: SideEffect.objects.filter(job_id=neighbour.pk, event="start").exists())
    assert cancel(suspect.pk) == "cancelling"
    wait_for(lambda: ended(suspect, JobStatus.CANCELLED))
    assert not SideEffect.objects.filter(job_id=neighbour.pk, event="end").exists()
    assert not SideEffect.objects.filter(job_id=suspect.pk).exists()


# -- the standby claim: an idle queue's first lane claims and starts the jobs of a wake-up -------


def test_poison_woken_into_an_idle_queue_spends_no_innocents_attempts(start_worker: Any) -> None:
    """An idle worker (its first lane holds the next claim) is woken by one ``enqueue_many`` of
    innocents beside a result jsonb refuses, a hang past its timeout and an unprintable
    exception: the lane's claim takes them all and starts them; the innocents complete once,
    each poison ends in its named state, the queue is idle again and a second wake-up is
    served the same way, and SIGTERM ends the worker at once."""
    worker = start_worker(*FOUR, **QUICK)
    wait_for(lambda: SideEffect.objects.count() == 0 and worker.backends() >= 2)
    time.sleep(scaled(0.5))  # its first claim came back empty: the queue is idle
    jobs = enqueue_many(
        [INNOCENT] * 2
        + [
            {"job_type": "tests.poison_big_number", "payload": {}},
            {"job_type": "tests.poison_hang", "payload": {"seconds": scaled(3)}},
            {"job_type": "tests.poison_raise", "payload": {"kind": "unprintable_permanent"}},
        ]
        + [INNOCENT] * 2
    )
    innocents = [*jobs[:2], *jobs[5:]]
    big, hang, unprintable = jobs[2:5]
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in innocents), timeout=15)
    wait_for(lambda: ended(big, JobStatus.DEAD), timeout=15)
    wait_for(lambda: ended(hang, JobStatus.DEAD), timeout=15)
    wait_for(lambda: ended(unprintable, JobStatus.DEAD), timeout=15)
    assert (big.last_error_code, hang.last_error_code) == ("unwritable_outcome", "timeout")
    assert_innocents_completed_once(innocents)
    time.sleep(scaled(0.5))
    again = enqueue_many([INNOCENT] * 3)
    wait_for(lambda: all(ended(job, JobStatus.COMPLETED) for job in again), timeout=15)
    assert_innocents_completed_once(again)
    assert nothing_leased()
    assert worker.process.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=scaled(10)) == 0, worker.output()[-3000:]
