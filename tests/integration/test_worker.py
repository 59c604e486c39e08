"""The worker engine driven in-process: outcomes, retries, leases, fencing, order.

Every test here is transaction=True: the worker's threads use their own connections and must see
the jobs the test committed.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import enqueue, enqueue_many, metrics, queries
from django_pgoutbox.errors import LeaseLost
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.retry import MAX_SUMMARY_LENGTH
from django_pgoutbox.worker import Worker
from django_pgoutbox.worker.runner import QueueRunner
from testproject.testjobs.models import SideEffect
from tests.conftest import drain
from tests.processes import holds_for, scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.2, "RETRY": {"BASE_DELAY": 30, "MAX_DELAY": 600, "JITTER": 0}}


@pytest.fixture
def fast(settings: Any) -> Any:
    settings.PGOUTBOX = {**settings.PGOUTBOX, **FAST}
    return settings


def drain_until(job: Job, status: str) -> None:
    """Burst after burst (each runs what is due) until ``job`` reaches ``status``."""

    def reached() -> bool:
        drain()
        job.refresh_from_db()
        return bool(job.status == status)

    wait_for(reached, timeout=30)


def behave(**payload: Any) -> Job:
    return enqueue("tests.behave", payload)


class TestOutcomes:
    def test_success_completes_with_the_result(self, fast: Any) -> None:
        job = behave(result={"sent": 3})
        drain()
        job.refresh_from_db()
        assert (job.status, job.attempts, job.result) == (JobStatus.COMPLETED, 1, {"sent": 3})
        assert job.completed_at is not None
        assert job.finished_at == job.completed_at
        assert job.lease_expires_at is None
        assert job.locked_by is not None

    @pytest.mark.parametrize(
        ("fail", "status", "code", "delay"),
        [
            ("transient", JobStatus.RETRYING, "TransientError", 60),  # 30 * 2**1
            ("rate_limited", JobStatus.RETRYING, "RateLimited", 45),  # the hint
            ("permanent", JobStatus.DEAD, "PermanentError", None),
            ("revoked", JobStatus.CANCELLED, "Revoked", None),
            ("unknown", JobStatus.RETRYING, "KeyError", 60),
        ],
    )
    def test_each_failure_class(
        self, fast: Any, fail: str, status: str, code: str, delay: int | None
    ) -> None:
        job = behave(fail=fail, retry_after=45)
        before = timezone.now()
        drain()
        job.refresh_from_db()
        assert (job.status, job.last_error_code, job.attempts) == (status, code, 1)
        if delay is None:
            assert job.finished_at is not None
        else:
            assert job.finished_at is None
            expected = before + timedelta(seconds=delay)
            assert abs((job.run_at - expected).total_seconds()) < 5

    def test_unknown_errors_are_dead_after_their_retries(self, fast: Any, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "RETRY": {"BASE_DELAY": 0.01, "MAX_DELAY": 0.01, "JITTER": 0},
        }
        job = behave(fail="unknown")
        drain_until(job, JobStatus.DEAD)  # each burst runs the attempts whose delay is over
        assert (job.status, job.attempts, job.last_error_code) == (JobStatus.DEAD, 4, "KeyError")

    def test_exhausted_budget_is_dead(self, fast: Any, settings: Any, registry: None) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "RETRY": {"BASE_DELAY": 0.01, "MAX_DELAY": 0.01, "JITTER": 0},
        }
        from django_pgoutbox import job as declare
        from testproject.testjobs.jobs import behave as handler

        declare("tests.limited", max_attempts=2)(handler.func)
        job = enqueue("tests.limited", {"fail": "transient"})
        assert job.max_attempts == 2
        drain_until(job, JobStatus.DEAD)
        assert (job.status, job.attempts) == (JobStatus.DEAD, 2)
        assert (job.last_error_summary or "").startswith("attempts exhausted (2/2)")

    def test_error_summary_is_bounded(self, fast: Any) -> None:
        job = behave(fail="huge")
        drain()
        job.refresh_from_db()
        assert job.last_error_code == "ValueError"
        assert len(job.last_error_summary or "") <= MAX_SUMMARY_LENGTH

    def test_unknown_job_type_is_dead_with_payload_intact_and_retryable(
        self, fast: Any, registry: None
    ) -> None:
        job = enqueue("later.deployed", {"keep": ["me", 1]})
        drain()
        job.refresh_from_db()
        assert (job.status, job.last_error_code) == (JobStatus.DEAD, "unknown_job_type")
        assert job.payload == {"keep": ["me", 1]}

        from django_pgoutbox import job as declare

        @declare("later.deployed")
        def deployed(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
            return payload

        # An operator retries the dead letter once the handler is deployed.
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.PENDING, run_at=timezone.now(), finished_at=None
        )
        drain()
        job.refresh_from_db()
        assert (job.status, job.result) == (JobStatus.COMPLETED, {"keep": ["me", 1]})

    def test_non_json_result_is_dead(self, fast: Any) -> None:
        job = enqueue("tests.bad_result", {})
        drain()
        job.refresh_from_db()
        assert (job.status, job.last_error_code) == (JobStatus.DEAD, "invalid_result")


class TestClaiming:
    def test_priority_then_run_at_order(self, fast: Any) -> None:
        low = behave(n="low")
        high = behave(n="high")
        Job.objects.filter(pk=high.pk).update(priority=5)
        older = behave(n="older")
        Job.objects.filter(pk=older.pk).update(run_at=timezone.now() - timedelta(hours=1))
        drain(concurrency=1)
        order = list(
            SideEffect.objects.filter(event="start").order_by("id").values_list("job_id", flat=True)
        )
        assert order == [high.pk, older.pk, low.pk]

    def test_a_burst_runs_a_job_enqueued_behind_its_mark_before_it_ends(self, fast: Any) -> None:
        """A job enqueues one of a higher priority: the seek claim that follows looks past the
        mark of the first claim and finds nothing, but the burst ends only once a full claim
        finds nothing, so the new job runs within the same burst."""
        enqueue("tests.spawn", {"priority": 5})
        drain(concurrency=1)
        child = Job.objects.get(job_type="tests.behave")
        assert (child.priority, child.status) == (5, JobStatus.COMPLETED)

    def test_a_burst_runs_a_job_snoozed_for_no_time_before_it_ends(self, fast: Any) -> None:
        """``Snooze(0)``: the job is due again as soon as its outcome is written, but the claim
        written with that outcome cannot see it (its snapshot predates the outcome). The burst
        ends only on a claim that could (the claim with the outcome a seek, then a full one)."""
        for sleep in (0, 0.3):
            job = enqueue("tests.snooze", {"times": 2, "seconds": 0, "sleep": sleep})
            drain(concurrency=1)
            job.refresh_from_db()
            assert (job.status, job.result) == (JobStatus.COMPLETED, {"attempt": 1, "starts": 2})

    def test_outcomes_and_renewals_probe_the_primary_key_for_a_new_worker_id(self) -> None:
        """Statistics know no row with a new worker's ``locked_by``: the outcome write and the
        renewal of a few hundred jobs still probe the primary key (the planner chose a scan of
        the whole table, in heap order, which also deadlocked against the other's id order)."""
        enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 5_000)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE jobs")
            cursor.execute(
                "UPDATE jobs SET status = 'leased', locked_by = 'new', attempts = 1 "
                "WHERE id IN (SELECT id FROM jobs LIMIT 300) RETURNING id"
            )
            ids = [row[0] for row in cursor.fetchall()]
            n = len(ids)
            record: dict[str, Any] = {
                "ids": ids,
                "attempts": [1] * n,
                "statuses": ["completed"] * n,
                "gives_back_attempt": [False] * n,
                "delays": [0.0] * n,
                "codes": [None] * n,
                "summaries": [None] * n,
                "results": [None] * n,
                "progress": [None] * n,
                "meta": [None] * n,
                "traces": [],
                "worker_id": "new",
                "notify": True,
            }
            cursor.execute("EXPLAIN " + queries.RECORD_OUTCOMES, record)
            plans = ["\n".join(row[0] for row in cursor.fetchall())]
            cursor.execute("EXPLAIN " + queries.RENEW_LEASES, [60.0, ids, [1] * n, "new"])
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
        for plan in plans:
            assert "Seq Scan on jobs" not in plan, plan
            assert "jobs_pkey" in plan, plan

    def test_a_batch_is_claimed_in_claim_order_not_id_order(self) -> None:
        """The claim finds its rows by primary key (id order) and sorts them back: priority,
        then run_at, created_at and id, in CLAIM_JOBS and in RECORD_AND_CLAIM alike."""
        now = timezone.now()
        jobs = enqueue_many([{"job_type": "tests.noop", "payload": {"n": n}} for n in range(6)])
        # Later ids get higher priorities or earlier run_ats: id order is not claim order.
        shape = {0: (0, 0), 1: (0, 30), 2: (3, 0), 3: (3, 60), 4: (7, 0), 5: (0, 0)}
        for job, (priority, earlier) in zip(jobs, shape.values(), strict=True):
            Job.objects.filter(pk=job.pk).update(
                priority=priority, run_at=now - timedelta(seconds=earlier)
            )
        Job.objects.filter(pk=jobs[5].pk).update(created_at=jobs[0].created_at)
        expected = [jobs[n].pk for n in (4, 3, 2, 1, 0, 5)]
        if jobs[5].pk < jobs[0].pk:  # same priority, run_at and created_at: id decides
            expected[-2:] = [jobs[5].pk, jobs[0].pk]
        with connection.cursor() as cursor:
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 3, "worker_id": "w", "lease": 60.0},
            )
            first = [row[0] for row in cursor.fetchall()]
            nones = [None] * 3
            outcomes: dict[str, Any] = {
                "ids": first,
                "attempts": [1, 1, 1],
                "statuses": ["completed"] * 3,
                "gives_back_attempt": [False] * 3,
                "delays": [0.0] * 3,
                "codes": nones,
                "summaries": nones,
                "results": nones,
                "progress": nones,
                "meta": nones,
                "traces": [],
                "worker_id": "w",
                "notify": True,
            }
            claim = {"queue": "default", "limit": 3, "lease": 60.0}
            cursor.execute(queries.RECORD_AND_CLAIM, outcomes | claim)
            rows = cursor.fetchall()
        assert first == expected[:3]
        assert [row[0] for row in rows] == [False] * 3 + [True] * 3
        assert sorted(row[1] for row in rows[:3]) == sorted(first)
        assert [row[1] for row in rows[3:]] == expected[3:]

    def test_the_seek_claim_starts_past_its_mark_and_the_full_claim_finds_what_is_behind(
        self,
    ) -> None:
        """SEEK_CLAIM_JOBS takes what sorts after the mark (the rest of its priority, then the
        lower ones), in claim order; what sorts before it (a higher priority, an older run_at)
        is left to CLAIM_JOBS."""
        now = timezone.now()
        jobs = enqueue_many([{"job_type": "tests.noop", "payload": {"n": n}} for n in range(4)])
        for n, job in enumerate(jobs):
            Job.objects.filter(pk=job.pk).update(run_at=now - timedelta(seconds=60 - n))
        low = enqueue("tests.noop", {"n": "low"}, priority=-1)
        params: dict[str, Any] = {"queue": "default", "worker_id": "w", "lease": 60.0}

        def claim(sql: str, limit: int, **mark: Any) -> list[Any]:
            with connection.cursor() as cursor:
                cursor.execute(sql, params | {"limit": limit} | mark)
                return [queries.ClaimRow._make(row) for row in cursor.fetchall()]

        first = claim(queries.CLAIM_JOBS, 2)
        assert [row.id for row in first] == [jobs[0].pk, jobs[1].pk]
        last = first[-1]
        mark = {
            "mark_priority": last.priority,
            "mark_run_at": last.run_at,
            "mark_created_at": last.created_at,
            "mark_id": last.id,
        }
        higher = enqueue("tests.noop", {"n": "higher"}, priority=5)
        older = enqueue("tests.noop", {"n": "older"}, run_at=now - timedelta(hours=1))
        assert [row.id for row in claim(queries.SEEK_CLAIM_JOBS, 2, **mark)] == [
            jobs[2].pk,
            jobs[3].pk,
        ]
        assert [row.id for row in claim(queries.SEEK_CLAIM_JOBS, 5, **mark)] == [low.pk]
        assert [row.id for row in claim(queries.CLAIM_JOBS, 5)] == [higher.pk, older.pk]

    def test_a_claim_skips_the_rows_another_claim_holds(
        self, raw_connection_params: dict[str, Any]
    ) -> None:
        """Two claims at once, the first not yet committed: the second takes the next jobs in
        claim order, none of the first's, and waits for nothing."""
        import psycopg

        jobs = enqueue_many([{"job_type": "tests.noop", "payload": {"n": n}} for n in range(6)])
        with (
            psycopg.connect(**raw_connection_params) as first,
            psycopg.connect(**raw_connection_params, autocommit=True) as second,
        ):
            held = [
                r[0]
                for r in first.execute(
                    queries.CLAIM_JOBS,
                    {"queue": "default", "limit": 3, "worker_id": "a", "lease": 60.0},
                )
            ]
            second.execute("SET lock_timeout = '2s'")
            taken = [
                r[0]
                for r in second.execute(
                    queries.CLAIM_JOBS,
                    {"queue": "default", "limit": 3, "worker_id": "b", "lease": 60.0},
                )
            ]
            first.commit()
        assert held == [job.pk for job in jobs[:3]]
        assert taken == [job.pk for job in jobs[3:]]
        assert Job.objects.filter(locked_by="a").count() == 3
        assert Job.objects.filter(locked_by="b").count() == 3

    def test_future_jobs_wait(self, fast: Any) -> None:
        later = enqueue("tests.behave", {}, run_at=timedelta(hours=1))
        drain()
        later.refresh_from_db()
        assert later.status == JobStatus.PENDING

    def test_only_the_chosen_queues(self, fast: Any) -> None:
        mine = enqueue("tests.behave", {}, queue="webhooks")
        other = enqueue("tests.behave", {}, queue="reports")
        drain(queues=["webhooks"])
        mine.refresh_from_db()
        other.refresh_from_db()
        assert (mine.status, other.status) == (JobStatus.COMPLETED, JobStatus.PENDING)

    def test_outcomes_are_written_in_batches(
        self, fast: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 400)
        from django_pgoutbox.worker import outcomes

        batches: list[int] = []
        original = outcomes.count_written

        def counting(queue: str, batch: list[Any], applied: list[Any]) -> None:
            # Each written batch is counted once, on whichever lane wrote it.
            if batch:
                batches.append(len(batch))
            original(queue, batch, applied)

        monkeypatch.setattr(outcomes, "count_written", counting)
        drain(concurrency=8)
        assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 400
        assert sum(batches) == 400
        assert len(batches) < 200, batches

    def test_claims_are_counted(self, fast: Any) -> None:
        before = metrics.JOBS_CLAIMED.value(queue="default")
        enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 7)
        drain()
        assert metrics.JOBS_CLAIMED.value(queue="default") - before == 7

    def test_unknown_queue_is_refused(self) -> None:
        with pytest.raises(ValueError, match="unknown queue"):
            Worker(queues=["nope"])
        with pytest.raises(ValueError, match="no queue left"):
            Worker(queues=["default"], exclude_queues=["default"])


class TestLeases:
    def test_long_job_keeps_its_lease_by_renewal(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "LEASE_SECONDS": 0.6,
            "POLL_INTERVAL": 0.1,
            "QUEUES": {"default": {}},
        }
        job = behave(sleep=2.0)
        before = metrics.LEASE_EXPIRATIONS.value(queue="default")
        drain()
        job.refresh_from_db()
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1)
        assert SideEffect.objects.filter(job_id=job.pk, event="start").count() == 1
        assert metrics.LEASE_EXPIRATIONS.value(queue="default") == before

    def test_ctx_renew_lease(self, fast: Any) -> None:
        job = behave(renew=True)
        drain()
        job.refresh_from_db()
        assert job.status == JobStatus.COMPLETED

    def test_expired_lease_is_recovered_and_counted(self, fast: Any) -> None:
        job = behave()
        with connection.cursor() as cursor:
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "crashed-worker", "lease": 0.0},
            )
        before = metrics.LEASE_EXPIRATIONS.value(queue="default")
        drain()
        job.refresh_from_db()
        # The lost attempt did not run alone: given back. Two claims, one attempt counted.
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1)
        assert job.worker_ids == ["crashed-worker", job.worker_ids[1]]
        assert job.lost_attempts == 1  # one loss: not a suspect; it ran as any job
        assert job.alone_attempt is None
        assert job.last_error_code == "lease_expired"
        assert metrics.LEASE_EXPIRATIONS.value(queue="default") == before + 1

    def test_expired_last_attempt_is_dead_if_it_ran_alone(self, fast: Any) -> None:
        job = behave()
        Job.objects.filter(pk=job.pk).update(max_attempts=1)
        with connection.cursor() as cursor:
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "crashed-worker", "lease": 0.0},
            )
            cursor.execute(queries.MARK_ALONE, [job.pk, 1, "crashed-worker"])
            assert cursor.fetchall() == [(job.pk,)]
        drain()
        job.refresh_from_db()
        assert (job.status, job.attempts, job.last_error_code) == (
            JobStatus.DEAD,
            1,
            "lease_expired",
        )

    def test_expired_last_attempt_beside_others_is_given_back(self, fast: Any) -> None:
        job = behave()
        Job.objects.filter(pk=job.pk).update(max_attempts=1)
        with connection.cursor() as cursor:
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "crashed-worker", "lease": 0.0},
            )
        drain()
        job.refresh_from_db()
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1)

    def test_stale_outcome_is_fenced(self, fast: Any) -> None:
        job = behave()
        with connection.cursor() as cursor:
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "worker-a", "lease": 0.0},
            )
            cursor.execute(queries.RECOVER_EXPIRED_LEASES, {"queue": None, "notify": True})
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "worker-b", "lease": 60.0},
            )

            def write(worker: str, attempt: int, status: str) -> Any:
                cursor.execute(
                    queries.RECORD_OUTCOMES,
                    {
                        "ids": [job.pk],
                        "attempts": [attempt],
                        "statuses": [status],
                        "gives_back_attempt": [False],
                        "delays": [0.0],
                        "codes": [None],
                        "summaries": [None],
                        "results": [None],
                        "progress": [None],
                        "meta": [None],
                        "traces": [],
                        "worker_id": worker,
                        "notify": True,
                    },
                )
                return cursor.fetchall()

            # The lost attempt was given back: worker-b's claim is attempt 1 again, and
            # locked_by tells the two holders apart.
            assert write("worker-a", 1, "completed") == []  # the stale holder: rejected
            assert write("worker-b", 2, "completed") == []  # right worker, wrong attempt
            assert write("worker-b", 1, "dead") == [(job.pk,)]
            assert write("worker-b", 1, "completed") == []  # no longer leased
        job.refresh_from_db()
        assert (job.status, job.locked_by) == (JobStatus.DEAD, "worker-b")

    def test_renew_lease_raises_once_lost(self, fast: Any, caplog: Any) -> None:
        job = behave(sleep=0.6, renew=True)
        worker = Worker(roles=["jobs"], queues=["default"], burst=True)
        thread = threading.Thread(target=worker.run)
        thread.start()
        wait_for(lambda: SideEffect.objects.filter(job_id=job.pk).exists())
        # Someone else takes the job over while the handler sleeps.
        Job.objects.filter(pk=job.pk).update(attempts=5, locked_by="thief")
        # DEBUG: the traceback of an attempt that is retried is a record of its own there
        with caplog.at_level("DEBUG", logger="django_pgoutbox.worker"):
            thread.join(timeout=30)
        job.refresh_from_db()
        assert (job.attempts, job.locked_by, job.status) == (5, "thief", JobStatus.LEASED)
        assert not SideEffect.objects.filter(job_id=job.pk, event="end").exists()
        raised = [r.exc_info[0] for r in caplog.records if r.exc_info]
        assert raised == [LeaseLost]
        assert any(
            "outcome" in r.getMessage() and "discarded" in r.getMessage() for r in caplog.records
        )


class TestTimeoutRace:
    def test_an_attempt_that_returns_at_its_deadline_has_one_outcome(self, fast: Any) -> None:
        """A handler that returns a moment before its timeout, while its outcome waits to be
        written, once got a second, synthetic timeout outcome in the same batch: PostgreSQL
        applied either, and both were counted. Each attempt now has one outcome, whichever
        came first; the other, if any, is counted stale."""
        from django_pgoutbox.models import Job

        jobs = enqueue_many(
            [
                {"job_type": "tests.just_in_time", "payload": {"margin": 0.0002 * (i % 10)}}
                for i in range(40)
            ]
        )
        counted = partial(metrics.JOB_OUTCOMES.value)
        before = counted()
        drain(concurrency=40)
        rows = list(Job.objects.filter(pk__in=[job.pk for job in jobs]))
        assert all(row.attempts == 1 for row in rows)
        assert {row.status for row in rows} <= {JobStatus.COMPLETED, JobStatus.DEAD}
        # One outcome counted per attempt: never both the handler's and the timeout's.
        assert counted() - before == len(rows)


class TestMisbehavingHandlers:
    @pytest.mark.parametrize(
        ("how", "status", "code"),
        [
            ("system_exit", JobStatus.RETRYING, "SystemExit"),
            ("keyboard_interrupt", JobStatus.RETRYING, "KeyboardInterrupt"),
            ("memory_error", JobStatus.RETRYING, "MemoryError"),
            ("surrogate_result", JobStatus.DEAD, "invalid_result"),
            ("nul_result", JobStatus.DEAD, "invalid_result"),
            ("surrogate_error", JobStatus.RETRYING, "ValueError"),
            ("print_megabyte", JobStatus.RETRYING, "ValueError"),
        ],
    )
    def test_each_gets_an_outcome_and_the_worker_goes_on(
        self, fast: Any, how: str, status: str, code: str
    ) -> None:
        bad = enqueue("tests.misbehave", {"how": how})
        good = enqueue("tests.behave", {})
        drain(concurrency=1)
        bad.refresh_from_db()
        good.refresh_from_db()
        assert (bad.status, bad.last_error_code) == (status, code)
        assert len(bad.last_error_summary or "") <= MAX_SUMMARY_LENGTH
        assert good.status == JobStatus.COMPLETED  # the worker survived and went on


def test_a_handlers_hooks_run_around_the_attempt_and_cannot_fail_it(
    registry: None, caplog: Any
) -> None:
    from django_pgoutbox import job
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.worker.execute import execute
    from tests.conftest import claimed_job

    @job("hooks.noop")
    def noop(payload: dict[str, Any], ctx: Any) -> int:
        return 7

    calls: list[tuple[str, Any]] = []

    def started(**arguments: Any) -> None:
        calls.append(("started", arguments["job"].id))
        raise RuntimeError("a broken hook")

    def finished(**arguments: Any) -> None:
        calls.append(("finished", (arguments["outcome"], arguments["detail"].result_json)))

    noop.on_started = started
    noop.on_finished = finished
    claimed = claimed_job("hooks.noop")
    outcome = execute(claimed, policy=get_settings().retry, renew=lambda: None)
    assert outcome.status == JobStatus.COMPLETED
    assert outcome.result_json == "7"
    assert calls == [("started", claimed.id), ("finished", ("completed", "7"))]
    assert "hook raised; ignored" in caplog.text


def test_the_handler_sees_every_attempts_worker(fast: Any, registry: None) -> None:
    """worker_ids as the claim returned them: the first attempt's without parsing, a later
    attempt's (an earlier worker, then this one) parsed from the row."""
    from django_pgoutbox import job

    @job("fast.whoami")
    def whoami(payload: dict[str, Any], ctx: Any) -> list[str]:
        return list(ctx.worker_ids)

    fresh = enqueue("fast.whoami", {})
    again = enqueue("fast.whoami", {})
    Job.objects.filter(pk=again.pk).update(worker_ids=["earlier-worker"])
    worker = drain()
    fresh.refresh_from_db()
    again.refresh_from_db()
    assert fresh.result == [worker.worker_id]
    assert again.result == ["earlier-worker", worker.worker_id]
    assert again.worker_ids == ["earlier-worker", worker.worker_id]


def test_the_fast_constructors_make_the_same_frozen_objects() -> None:
    import dataclasses
    import uuid

    from django_pgoutbox.worker.execute import ClaimedJob, Outcome

    fields: dict[str, Any] = {
        "id": uuid.uuid4(),
        "job_type": "tests.noop",
        "payload": {"n": 1},
        "attempt": 2,
        "max_attempts": 5,
        "organization_id": None,
        "queue": "default",
        "priority": 3,
        "created_at": timezone.now(),
        "waited": 0.25,
        "worker_ids": ("w-1",),
    }
    made = ClaimedJob.from_claim(**fields)
    assert made == ClaimedJob(**fields)
    assert repr(made) == repr(ClaimedJob(**fields))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.attempt = 3  # type: ignore[misc]
    completed = Outcome.completed(made, '{"ok":true}')
    assert completed == Outcome(made, JobStatus.COMPLETED, result_json='{"ok":true}')
    with pytest.raises(dataclasses.FrozenInstanceError):
        completed.status = JobStatus.DEAD  # type: ignore[misc]


def test_statements_joining_arrays_to_leased_rows_are_planned_each_time(fast: Any) -> None:
    """A generic plan of these read the whole array again for each leased row (quadratic). The
    outcomes' statements are prepared (parsed once) on a lane's connection, which plans every
    run of a prepared statement anew; the others are never prepared; the settle functions keep
    the server's own choice for their statements."""
    from django.conf import settings as django_settings

    from django_pgoutbox import queries
    from django_pgoutbox.db import DispatcherConnection
    from django_pgoutbox.worker import outcomes

    connection = DispatcherConnection("default")
    try:
        with connection.get().cursor() as cursor:
            for _ in range(6):
                queries.send(
                    cursor,
                    "CLAIM_JOBS",
                    {"queue": "default", "limit": 0, "worker_id": "w", "lease": 60.0},
                )
                queries.send(cursor, "RENEW_LEASES", [60.0, [], [], "w"])
                queries.send(cursor, "RECORD_OUTCOMES", outcomes.params([], "w"))
            cursor.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            prepared = {row[0]: row[1:] for row in cursor.fetchall()}
            cursor.execute("SHOW plan_cache_mode")
            (mode,) = cursor.fetchone() or ("",)
            cursor.execute(
                "SELECT proname, proconfig FROM pg_proc WHERE proname IN ('pgoutbox_settle',"
                " 'pgoutbox_rearm', 'pgoutbox_outcomes_written', 'pgoutbox_settle_noted')"
            )
            configs = dict(cursor.fetchall())
    finally:
        connection.close()
    assert len(configs) == 4
    assert all("plan_cache_mode=auto" in config for config in configs.values()), configs
    never_prepared = {
        name for name, statement in queries.DISPATCHED.items() if statement.prepare is False
    }
    assert never_prepared == {"RENEW_LEASES", "UNCLAIM_JOBS", "RELEASE_JOBS", "WRITE_PROGRESS"}
    if "prepare_threshold" in django_settings.DATABASES["default"].get("OPTIONS", {}):
        pytest.skip("the test database's OPTIONS decide on prepared statements")
    assert mode == "force_custom_plan"
    texts = {name: statement.sql.split("%")[0] for name, statement in queries.DISPATCHED.items()}

    def plans(name: str) -> list[tuple[int, int]]:
        return [plans for text, plans in prepared.items() if texts[name].strip() in text]

    assert plans("CLAIM_JOBS")
    assert not plans("RENEW_LEASES")
    ((generic, custom),) = plans("RECORD_OUTCOMES")
    assert (generic, custom) == (0, 4)  # prepared at its third run, then planned at each
    # A connection that prepares but was not told to plan each run (behind a pooling proxy,
    # OPTIONS asking for prepared statements) sends the outcomes unprepared, as before.
    import psycopg

    from django_pgoutbox.db import dispatcher_connection_params

    params = {**dispatcher_connection_params("default"), "prepare_threshold": 2}
    with psycopg.connect(**params, autocommit=True) as pooled, pooled.cursor() as cursor:
        for _ in range(6):
            queries.send(cursor, "RECORD_OUTCOMES", outcomes.params([], "w"))
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        assert not any(texts["RECORD_OUTCOMES"].strip() in row[0] for row in cursor.fetchall())


class TestConnections:
    """A queue's second connection (``CONNECTIONS``): a lane that sends the next statement
    while the first waits on its own."""

    @staticmethod
    def runner(queue: str = "default", **overrides: Any) -> QueueRunner:
        import dataclasses

        from django_pgoutbox.conf import get_settings

        conf = get_settings()
        return QueueRunner(
            dataclasses.replace(conf.queues[queue], **overrides),
            worker_id="w-connections",
            using="default",
            policy=conf.retry,
            burst=True,
        )

    def test_a_backlog_is_claimed_on_both_connections_and_each_job_runs_once(
        self, fast: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 20_000)
        # A short lease: the main dispatcher renews while the helper writes outcomes.
        runner = self.runner(connections=2, concurrency=2, lease_seconds=scaled(0.6))
        assert len(runner.snapshot().lane_turns) == 2
        thread = threading.Thread(target=runner.run)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the burst did not finish"
        # The second lane sent statements of its own while the first waited on its.
        snapshot = runner.snapshot()
        assert snapshot.lane_turns[1] > 0
        assert snapshot.lanes_open == (False, False)  # closed at the end
        # Every job completed, in one attempt: none was claimed twice.
        assert Job.objects.count() == 20_000
        assert Job.objects.filter(status=JobStatus.COMPLETED, attempts=1).count() == 20_000
        assert (snapshot.reserved, snapshot.writing, snapshot.running) == (0, 0, 0)
        # A renewal that raced an outcome written on the other connection is no lost lease.
        assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]

    def test_an_idle_queue_never_opens_its_second_connection(self, fast: Any) -> None:
        runner = self.runner(connections=2)
        runner.burst = False
        thread = threading.Thread(target=runner.run)
        thread.start()
        try:
            job = enqueue("tests.noop", {})
            wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED, timeout=10)
            holds_for(  # polls
                lambda: (
                    (snapshot := runner.snapshot()).lane_turns[1] == 0
                    and not snapshot.lanes_open[1]
                ),
                0.5,
            )
        finally:
            runner.stop()
            thread.join(timeout=10)
        assert not thread.is_alive()

    @pytest.mark.parametrize(
        ("overrides", "lanes"),
        [
            ({"connections": 1}, 1),
            ({"connections": 3}, 3),
            # one claim at a time under the queue's lock, and a lane for the rest beside it
            ({"connections": 3, "fair": True}, 2),
            ({"connections": 1, "max_running": 5}, 2),
            ({"connections": 2, "rate_limit": 10.0}, 2),
        ],
    )
    def test_the_lanes_of_each_kind_of_queue(self, overrides: dict[str, Any], lanes: int) -> None:
        assert len(self.runner(**overrides).snapshot().lane_turns) == lanes


class SlowClaim:
    """A claim that waits for ``go`` on the lane's real connection, then takes ``rows``."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows, self.go, self.sent = rows, threading.Event(), threading.Event()

    def run(self, connection: Any) -> SlowClaim:
        connection.execute("SELECT 1")
        self.sent.set()
        assert self.go.wait(10)
        return self


class TestStandbyLane:
    """A real lane (its thread and connection) holding an idle queue's claim (``standby``)."""

    def lane(self) -> tuple[Any, Any, list[Any]]:
        from django_pgoutbox.worker.lanes import Lane
        from django_pgoutbox.worker.mailbox import Mailbox

        mailbox, started = Mailbox(), list[Any]()
        lane = Lane(0, "default", mailbox, "test-lane")
        lane.start()
        return lane, mailbox, started

    def standby(self, started: list[Any]) -> Any:
        from django_pgoutbox.worker.standby import Standby
        from tests.unit.fakes import claim_row

        claim = SlowClaim([claim_row(), claim_row()])
        return Standby(claim, ("[]", ()), 0, started.append)  # type: ignore[arg-type]

    def test_a_stop_while_its_fired_claim_is_in_flight_starts_none_of_the_jobs(self) -> None:
        lane, mailbox, started = self.lane()
        try:
            standby = self.standby(started)
            lane.send(standby)
            lane.fire(1)
            assert standby.claim.sent.wait(10)
            lane.stopping()  # QueueRunner.stop's, while the claim is in flight
            lane.fire(2)  # a later wake-up: kept for the loop, ignored (nothing held)
            standby.claim.go.set()
            (reply,) = mailbox.wait(10)
            assert reply[2] is standby
            assert reply[4] is None
            assert standby.fired
            assert not standby.starts
            assert len(standby.attempts) == 2  # the coordinator gives them back
        finally:
            lane.stop(10)
        assert started == []

    def test_a_fired_claim_with_no_stop_starts_its_jobs(self) -> None:
        lane, mailbox, started = self.lane()
        try:
            standby = self.standby(started)
            lane.send(standby)
            lane.fire(1)
            standby.claim.go.set()
            (reply,) = mailbox.wait(10)
            assert reply[2] is standby
            assert standby.starts
        finally:
            lane.stop(10)
        assert started == standby.attempts

    def test_a_claim_fired_after_the_stop_reached_the_lane_starts_none_of_the_jobs(
        self,
    ) -> None:
        lane, mailbox, started = self.lane()
        try:
            given_back = self.standby(started)
            lane.send(given_back)
            lane.stopping()  # QueueRunner.stop's: the lane gives its claim back...
            (reply,) = mailbox.wait(10)
            assert (reply[2], given_back.fired) == (given_back, False)
            standby = self.standby(started)  # ... and the coordinator, not stopping yet, arms it
            lane.send(standby)
            lane.fire(1)
            standby.claim.go.set()
            (reply,) = mailbox.wait(10)
            assert reply[2] is standby
            assert standby.fired
            assert not standby.starts
        finally:
            lane.stop(10)
        assert started == []

    def test_the_coordinators_disarm_after_a_wake_up_fired_it_leaves_the_jobs_to_the_lane(
        self,
    ) -> None:
        lane, mailbox, started = self.lane()
        try:
            standby = self.standby(started)
            lane.send(standby)
            lane.fire(1)
            assert standby.claim.sent.wait(10)
            lane.disarm()  # the coordinator wanted the lane, not knowing the wake-up fired it
            standby.claim.go.set()
            (reply,) = mailbox.wait(10)
            assert reply[2] is standby
            assert standby.starts
        finally:
            lane.stop(10)
        assert started == standby.attempts

    def test_a_wake_up_storm_while_the_lane_is_busy_does_not_pile_up_in_its_inbox(
        self,
    ) -> None:
        from django_pgoutbox.worker.lanes import CROWDED

        lane, mailbox, started = self.lane()
        try:
            busy = SlowClaim([])  # a statement of the coordinator's, slow to come back
            lane.send(busy)
            assert busy.sent.wait(10)
            for wake in range(1, 100_001):  # one per notification, as QueueRunner.wake
                lane.fire(wake, unless_crowded=True)
            assert lane._inbox.qsize() <= CROWDED
            busy.go.set()
            (reply,) = mailbox.wait(10)
            assert reply[2] is busy
            standby = self.standby(started)  # the queue went idle: the lane holds its claim
            lane.send(standby)
            lane.fire(100_001, unless_crowded=True)  # the next wake-up fires it
            standby.claim.go.set()
            (reply,) = mailbox.wait(10)
            assert (reply[2], standby.covers) == (standby, 100_001)
        finally:
            lane.stop(10)
        assert started == standby.attempts


def job_records(caplog: Any, job: Job) -> list[Any]:
    return [r for r in caplog.records if getattr(r, "job_id", None) == str(job.id)]


class TestLogLines:
    """One line per failed attempt that says what becomes of the job and why; a traceback only
    with an unexpected error that ends the job, else at DEBUG (docs/observability.md#logs)."""

    UNKNOWN = "PGOUTBOX['RETRY']['UNKNOWN_ERROR_RETRIES']"

    def test_a_retry_is_one_line_with_its_reason(self, fast: Any, caplog: Any) -> None:
        job = behave(fail="unknown")
        with caplog.at_level("INFO", logger="django_pgoutbox.worker"):
            drain()
        (record,) = job_records(caplog, job)
        assert (record.levelname, record.outcome, record.exc_info) == ("WARNING", "retrying", None)
        assert record.getMessage() == (
            f"job {job.id} (tests.behave) attempt 1/10: KeyError: 'unexpected' -> retrying in "
            "60.0s: an unexpected error (not a TransientError), retry 1 of the 3 that "
            f"{self.UNKNOWN} allows"
        )

    def test_at_debug_the_traceback_of_a_retry_follows_its_line(
        self, fast: Any, caplog: Any
    ) -> None:
        job = behave(fail="transient")
        with caplog.at_level("DEBUG", logger="django_pgoutbox.worker"):
            drain()
        line, traceback = job_records(caplog, job)
        assert (line.levelname, line.exc_info) == ("WARNING", None)
        assert line.getMessage().endswith("-> retrying in 60.0s: a transient failure: backoff")
        assert traceback.levelname == "DEBUG"
        assert traceback.exc_info[0].__name__ == "TransientError"

    def test_an_unexpected_error_that_ends_the_job_says_why_with_its_traceback(
        self, fast: Any, settings: Any, caplog: Any
    ) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "RETRY": {**FAST["RETRY"], "UNKNOWN_ERROR_RETRIES": 0},  # type: ignore[dict-item]
        }
        job = behave(fail="unknown")
        with caplog.at_level("INFO", logger="django_pgoutbox.worker"):
            drain()
        (record,) = job_records(caplog, job)
        assert (record.levelname, record.outcome) == ("ERROR", "dead")
        assert record.exc_info[0] is KeyError
        assert record.getMessage().endswith(
            "-> dead: an unexpected error (not a TransientError) on attempt 1, and "
            f"{self.UNKNOWN} = 0 allows 0 retries"
        )

    def test_a_permanent_error_is_one_line(self, fast: Any, caplog: Any) -> None:
        job = behave(fail="permanent")
        with caplog.at_level("INFO", logger="django_pgoutbox.worker"):
            drain()
        (record,) = job_records(caplog, job)
        assert (record.levelname, record.outcome, record.exc_info) == ("ERROR", "dead", None)
        assert record.getMessage().endswith(
            "PermanentError: invalid payload -> dead: a permanent failure (PermanentError) is "
            "never retried"
        )
