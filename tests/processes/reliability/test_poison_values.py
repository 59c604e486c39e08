"""Poison values: what a handler, a task or a schedule raises or returns ends
as that job's (or schedule's) own outcome, in a real ``runworkers`` process that keeps running.

Each poison job is enqueued with innocent ones in one ``enqueue_many``, so that one claim takes
them all and their outcomes are written together. Every test asserts: the process is still
running, every innocent job completed at its first attempt, the poison job ended in its named
state, and nothing stays leased. transaction=True: the workers are other processes.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus
from tests.processes import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Short leases and polls, so that a few lease periods are a few seconds.
QUICK = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.2}
INNOCENTS = 8
TASK = {"task": {"backend": "default"}, "args": [], "kwargs": {}}
DAY = 86400.0


def run_beside_innocents(
    start_worker: Callable[..., WorkerProcess], poison: dict[str, Any]
) -> tuple[WorkerProcess, Job, list[Job]]:
    """Enqueue ``poison`` with fast innocents in one batch, then start a worker of 4 threads."""
    jobs = enqueue_many([poison, *[{"job_type": "tests.behave", "payload": {}}] * INNOCENTS])
    worker = start_worker("--queues", "default", "--concurrency", "4", **QUICK)
    return worker, jobs[0], list(jobs[1:])


def settle(
    worker: WorkerProcess,
    poison: Job,
    innocents: Sequence[Job],
    status: str,
    code: str | None,
    timeout: float = 20.0,
) -> Job:
    """Wait until the innocents completed and the poison is ``status`` with ``code``; check
    the process still runs and nothing is leased. Returns the poison job as it ended."""

    def done() -> bool:
        """innocents completed and the poison in its named state"""
        poisoned = Job.objects.get(pk=poison.pk)
        completed = Job.objects.filter(
            pk__in=[j.pk for j in innocents], status=JobStatus.COMPLETED
        ).count()
        return (
            completed == len(innocents)
            and poisoned.status == status
            and poisoned.last_error_code == code
        )

    try:
        wait_for(done, timeout=timeout)
    except AssertionError:
        ended = Job.objects.get(pk=poison.pk)
        raise AssertionError(
            f"poison is {ended.status} {ended.last_error_code!r} ({ended.last_error_summary!r}), "
            f"process exit code {worker.process.poll()}\n{worker.output()[-3000:]}"
        ) from None
    assert worker.process.poll() is None, worker.output()[-3000:]
    assert all(j.attempts == 1 for j in Job.objects.filter(pk__in=[j.pk for j in innocents]))
    assert not Job.objects.filter(status=JobStatus.LEASED).exists()
    return Job.objects.get(pk=poison.pk)


def seconds_until(job: Job) -> float:
    return (job.run_at - timezone.now()).total_seconds()


# -- case 1: delays -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rate_limited_inf", "rate_limited_nan"])
def test_a_non_finite_rate_limit_hint_is_that_jobs_error(start_worker: Any, kind: str) -> None:
    """``RateLimited(inf)`` refuses its hint with TypeError: an unknown error of that job,
    retried by the policy until its 3 attempts are spent."""
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_raise", "payload": {"kind": kind}}
    )
    ended = settle(worker, poison, innocents, JobStatus.DEAD, "TypeError")
    assert ended.attempts == 3
    assert "must be a finite number of seconds" in (ended.last_error_summary or "")


def test_a_huge_rate_limit_hint_is_cut_to_max_delay(start_worker: Any) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_raise", "payload": {"kind": "rate_limited_huge"}}
    )
    ended = settle(worker, poison, innocents, JobStatus.RETRYING, "RateLimited")
    assert 3500 < seconds_until(ended) <= 3600  # RETRY['MAX_DELAY'], 3600 s by default


@pytest.mark.parametrize("kind", ["snooze_huge", "snooze_tampered"])
def test_a_huge_snooze_is_cut_to_365_days(start_worker: Any, kind: str) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_raise", "payload": {"kind": kind}}
    )
    ended = settle(worker, poison, innocents, JobStatus.RETRYING, "snoozed")
    assert 364 * DAY < seconds_until(ended) <= 365 * DAY


# -- case 2: a task's error message that PostgreSQL cannot store -----------------------------------


@pytest.mark.parametrize(
    ("task", "code", "shown"),
    [
        ("poison_task_nul", "builtins.ValueError", "a NUL \\x00 in the message"),
        ("poison_task_surrogate", "builtins.ValueError", "a lone surrogate \\udc80"),
        (
            "poison_task_unprintable",
            "testproject.testjobs.jobs._UnprintableError",
            "_UnprintableError",
        ),
    ],
)
def test_a_task_error_is_bounded_and_stored(
    start_worker: Any, task: str, code: str, shown: str
) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": f"testproject.testjobs.tasks.{task}", "payload": TASK}
    )
    ended = settle(worker, poison, innocents, JobStatus.RETRYING, code)
    assert shown in (ended.last_error_summary or "")
    assert ended.attempts == 1


# -- case 3a: an exception that cannot be printed, a failure with a bad code ----------------------


@pytest.mark.parametrize(
    ("kind", "status", "code", "attempts"),
    [
        ("unprintable", JobStatus.DEAD, "_UnprintableError", 3),
        ("unprintable_permanent", JobStatus.DEAD, "_UnprintablePermanentError", 1),
        ("bad_code", JobStatus.DEAD, "_BadCodeError", 3),
    ],
)
def test_an_error_that_cannot_be_described_still_gets_an_outcome(
    start_worker: Any, kind: str, status: str, code: str, attempts: int
) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_raise", "payload": {"kind": kind}}
    )
    ended = settle(worker, poison, innocents, status, code)
    assert ended.attempts == attempts
    if kind.startswith("unprintable"):
        assert "its message could not be read: RuntimeError" in (ended.last_error_summary or "")


# -- case 3b: a job stored as a task that names something else -----------------------------------


@pytest.mark.parametrize(
    ("job_type", "said"),
    [
        ("os.getcwd", "is a builtin_function_or_method, not a django.tasks Task"),
        ("testproject.testjobs.poison_import.task", "importing"),
        # Outside every installed app and never imported: refused without importing it (its
        # import would raise SystemExit in the handler thread).
        ("tests.processes.reliability.exit_on_import.task", "is not in an installed app"),
    ],
)
def test_a_job_type_that_is_not_a_task_is_dead(start_worker: Any, job_type: str, said: str) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": job_type, "payload": TASK}
    )
    ended = settle(worker, poison, innocents, JobStatus.DEAD, "invalid_task")
    assert said in (ended.last_error_summary or "")
    assert ended.payload == TASK  # intact, for a retry once fixed


# -- case 8: the literal text \u0000 in a result ------------------------------------------------


def test_the_text_backslash_u0000_in_a_result_is_stored(start_worker: Any) -> None:
    result = {"regex": "^[\\u0000-\\u001f]+$"}
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_return", "payload": {"result": result}}
    )
    settle(worker, poison, innocents, JobStatus.COMPLETED, None)
    assert Job.objects.get(pk=poison.pk).result == result


def test_a_real_nul_in_a_result_is_invalid(start_worker: Any) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_return", "payload": {"nul": True}}
    )
    ended = settle(worker, poison, innocents, JobStatus.DEAD, "invalid_result")
    assert "NUL" in (ended.last_error_summary or "")


# -- a result over PGOUTBOX['MAX_RESULT_BYTES'] ---------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "size"),
    [
        # {"text":"..."} of 1 MiB of "x": 11 bytes over the default cap of 1 MiB.
        ({"characters": 2**20}, "1,048,587 bytes"),
        # Fewer characters than the cap, more bytes: the cap counts bytes.
        ({"characters": 2**20 // 3, "char": "€"}, "1,048,586 bytes"),
    ],
)
def test_a_result_over_the_cap_is_dead_and_its_batch_completes(
    start_worker: Any, payload: dict[str, Any], size: str
) -> None:
    worker, poison, innocents = run_beside_innocents(
        start_worker, {"job_type": "tests.poison_big_result", "payload": payload}
    )
    ended = settle(worker, poison, innocents, JobStatus.DEAD, "result_too_large")
    assert (ended.attempts, ended.result) == (1, None)
    summary = ended.last_error_summary or ""
    assert f"{size} of JSON, over the limit of 1,048,576 bytes" in summary, summary
    assert "PGOUTBOX['MAX_RESULT_BYTES']" in summary


# -- case 6: a schedule that fails at run time ----------------------------------------------------

#: A trigger that makes the database refuse the jobs of one job type: a schedule whose enqueue
#: fails at run time although ``manage.py check`` accepts it.
REFUSE_POISON_SCHEDULE = """
CREATE FUNCTION pgoutbox_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.job_type = 'tests.poison_schedule' THEN
        RAISE EXCEPTION 'this schedule''s job is refused' USING ERRCODE = 'P0001';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER pgoutbox_test_refuse BEFORE INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION pgoutbox_test_refuse();
"""


@pytest.fixture
def refused_schedule_job() -> Any:
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_POISON_SCHEDULE)
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER pgoutbox_test_refuse ON jobs")
        cursor.execute("DROP FUNCTION pgoutbox_test_refuse()")


def test_a_schedule_that_fails_is_skipped_and_the_others_run(
    start_worker: Any, refused_schedule_job: Any
) -> None:
    schedules = {
        "tests.bad": {"JOB": "tests.poison_schedule", "EVERY": 1},
        "tests.good": {"JOB": "tests.noop", "EVERY": 1},
        # The maintenance schedules would add jobs of their own: not counted here.
        "pgoutbox.recover_leases": None,
        "pgoutbox.reconcile_outbox": None,
        "pgoutbox.prune": None,
    }
    worker = start_worker("--roles", "scheduler", SCHEDULES=schedules, **QUICK)
    # The first turn only places the cursors; each later second is a slot of both schedules.
    try:
        wait_for(lambda: Job.objects.filter(job_type="tests.noop").count() >= 3, timeout=20)
    except AssertionError:
        raise AssertionError(
            f"exit code {worker.process.poll()}\n{worker.output()[-3000:]}"
        ) from None
    assert worker.process.poll() is None, worker.output()[-3000:]
    assert not Job.objects.filter(job_type="tests.poison_schedule").exists()
    output = worker.output()
    assert output.count("schedule tests.bad: enqueuing its due slot failed") >= 2, output[-3000:]
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=10)
