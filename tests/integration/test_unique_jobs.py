"""Unique jobs (docs/uniqueness.md): the key held by PostgreSQL in the job's states, its window,
replace, debounce and throttle, concurrent enqueuers, and the statements of workers and operators
that move a unique job (claims, outcomes, a shutdown's release, a retry of a dead letter)."""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction

from django_pgoutbox import EnqueueError, control, enqueue, enqueue_many, job, queries, workflow
from django_pgoutbox.copy_rows import COPY_MIN_ROWS
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.uniqueness import Unique
from django_pgoutbox.worker.execute import ClaimedJob, Outcome
from django_pgoutbox.worker.outcomes import params
from tests.conftest import claimed_job

pytestmark = pytest.mark.django_db

WORKER = "unique-worker"
TYPE = "tests.behave"


def claim(queue: str = "reports", limit: int = 10) -> list[ClaimedJob]:
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CLAIM_JOBS, {"queue": queue, "limit": limit, "worker_id": WORKER, "lease": 60.0}
        )
        rows = cursor.fetchall()
    return [claimed_job(TYPE, id=r[0], attempt=r[3], max_attempts=r[4]) for r in rows]


def record(*outcomes: Outcome) -> None:
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, params(list(outcomes), WORKER))


def completed(claimed: ClaimedJob) -> Outcome:
    return Outcome.completed(claimed, "null")


def dead(claimed: ClaimedJob) -> Outcome:
    return Outcome(claimed, JobStatus.DEAD, code="PermanentError", summary="PermanentError: no")


def retrying(claimed: ClaimedJob) -> Outcome:
    return Outcome(claimed, JobStatus.RETRYING, delay=0.0, code="TransientError", summary="t")


def unique(payload: dict[str, Any], **options: Any) -> Job:
    return enqueue(TYPE, payload, queue="reports", **options)


def checked_policy(spec: Unique) -> Any:
    from django_pgoutbox.uniqueness import policy

    return policy(spec, None, None, None, EnqueueError)


def status(found: Job) -> str:
    return str(Job.objects.get(pk=found.pk).status)


class TestTheKey:
    def test_a_second_enqueue_returns_the_first_job_and_says_so(self) -> None:
        first = unique({"account": 1}, unique=True)
        second = unique({"account": 1}, unique=True)
        assert (first.created, second.created) == (True, False)
        assert second.pk == first.pk
        assert second.payload == {"account": 1}
        assert Job.objects.count() == 1

    def test_a_plain_job_says_it_was_created_and_a_read_one_says_nothing(self) -> None:
        plain = enqueue(TYPE, {})
        assert plain.created is True
        assert Job.objects.get(pk=plain.pk).created is None
        keyed = enqueue(TYPE, {}, idempotency_key="k")
        again = enqueue(TYPE, {}, idempotency_key="k")
        assert (keyed.created, again.created) == (True, False)

    def test_another_payload_organization_or_queue_is_another_job(self) -> None:
        first = unique({"account": 1}, unique=True)
        assert unique({"account": 2}, unique=True).pk != first.pk
        org = unique({"account": 1}, unique=True, organization_id=uuid.uuid4())
        assert org.pk != first.pk
        other_queue = enqueue(TYPE, {"account": 1}, queue="default", unique=True)
        assert other_queue.pk != first.pk
        assert Job.objects.count() == 4

    def test_by_payload_keys_and_by_a_key_of_yours(self) -> None:
        first = unique({"account": 1, "note": "a"}, unique=Unique(keys=["account"]))
        assert unique({"note": "b", "account": 1}, unique=Unique(keys=["account"])).pk == first.pk
        mine = unique({"x": 1}, unique=Unique(key="sync:7"))
        assert unique({"x": 2}, unique=Unique(key="sync:7")).pk == mine.pk
        assert unique({"x": 1}, unique=Unique(key="sync:8")).pk != mine.pk

    def test_the_key_is_free_once_the_job_leaves_its_states(self) -> None:
        first = unique({"a": 1}, unique=True)
        (claimed,) = claim()
        assert unique({"a": 1}, unique=True).pk == first.pk  # leased: held
        record(completed(claimed))
        again = unique({"a": 1}, unique=True)
        assert again.created
        assert again.pk != first.pk

    def test_a_retrying_job_holds_it(self) -> None:
        first = unique({"a": 1}, unique=True)
        (claimed,) = claim()
        record(retrying(claimed))
        assert status(first) == "retrying"
        assert unique({"a": 1}, unique=True).pk == first.pk

    def test_states_with_completed_hold_it_after_the_run(self) -> None:
        spec = Unique(states=("pending", "leased", "retrying", "completed"))
        first = unique({"a": 1}, unique=spec)
        (claimed,) = claim()
        record(completed(claimed))
        assert unique({"a": 1}, unique=spec).pk == first.pk

    def test_a_job_that_is_not_unique_never_meets_a_key(self) -> None:
        first = unique({"a": 1}, unique=True)
        plain = unique({"a": 1})
        assert plain.pk != first.pk
        assert plain.unique_key is None

    def test_an_idempotency_key_and_a_unique_key_together(self) -> None:
        first = unique({"a": 1}, unique=True, idempotency_key="k1")
        assert unique({"a": 1}, unique=True, idempotency_key="k2").pk == first.pk
        assert unique({"a": 2}, unique=True, idempotency_key="k1").pk == first.pk

    def test_the_claim_and_outcomes_of_many_unique_jobs_in_one_batch(self) -> None:
        jobs = [unique({"n": n}, unique=True) for n in range(20)]
        claimed = claim(limit=20)
        record(*(completed(c) if i % 2 else dead(c) for i, c in enumerate(claimed)))
        statuses = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status"))
        assert statuses == {("completed",), ("dead",)}


class TestPeriod:
    def window_start(self, seconds: int) -> datetime:
        now = datetime.now(UTC).timestamp()
        return datetime.fromtimestamp((now // seconds + 1) * seconds, UTC)

    def test_one_job_per_window_of_its_run_at(self) -> None:
        spec = Unique(period=timedelta(hours=1))
        start = self.window_start(3600) + timedelta(days=1)
        first = unique({"r": 1}, unique=spec, run_at=start)
        assert unique({"r": 1}, unique=spec, run_at=start + timedelta(minutes=59)).pk == first.pk
        nxt = unique({"r": 1}, unique=spec, run_at=start + timedelta(hours=1))
        assert nxt.pk != first.pk
        assert unique({"r": 1}, unique=spec, run_at=start - timedelta(seconds=1)).pk not in {
            first.pk,
            nxt.pk,
        }
        assert first.unique_key is not None
        policy = checked_policy(spec)
        base = policy.row_key(TYPE, None, "reports", {"r": 1})
        window = int(start.timestamp()) // 3600
        assert first.unique_key == uuid.UUID(hashlib.md5(f"{base}@{window}".encode()).hexdigest())

    def test_the_job_of_the_window_holds_it_once_completed(self) -> None:
        spec = Unique(period=timedelta(hours=1))
        first = unique({"r": 1}, unique=spec)
        (claimed,) = claim()
        record(completed(claimed))
        assert unique({"r": 1}, unique=spec).pk == first.pk


class TestReplace:
    def test_it_updates_the_waiting_jobs_payload_and_run_at(self) -> None:
        spec = Unique(keys=["account"])
        first = unique({"account": 1, "v": 1}, unique=spec, run_at=timedelta(hours=1))
        later = datetime.now(UTC) + timedelta(hours=2)
        second = unique({"account": 1, "v": 2}, unique=spec, on_conflict="replace", run_at=later)
        assert (second.pk, second.created) == (first.pk, False)
        stored = Job.objects.get(pk=first.pk)
        assert stored.payload == {"account": 1, "v": 2}
        assert abs((stored.run_at - later).total_seconds()) < 0.001

    def test_a_running_job_is_returned_as_it_is(self) -> None:
        spec = Unique(keys=["account"])
        first = unique({"account": 1, "v": 1}, unique=spec)
        claim()
        second = unique({"account": 1, "v": 2}, unique=spec, on_conflict="replace")
        assert (second.pk, second.created, second.payload) == (first.pk, False, first.payload)

    def test_keep_is_the_default(self) -> None:
        spec = Unique(keys=["account"])
        first = unique({"account": 1, "v": 1}, unique=spec)
        assert unique({"account": 1, "v": 2}, unique=spec).payload == {"account": 1, "v": 1}
        assert Job.objects.get(pk=first.pk).payload == {"account": 1, "v": 1}


@pytest.mark.django_db(transaction=True)
class TestDebounce:
    def test_a_burst_becomes_one_job_run_after_the_last_enqueue(self) -> None:
        jobs = []
        for _ in range(5):
            jobs.append(unique({"doc": 1}, debounce=timedelta(seconds=30)))
            time.sleep(0.01)
        assert len({j.pk for j in jobs}) == 1
        stored = Job.objects.get(pk=jobs[0].pk)
        assert [j.created for j in jobs] == [True, False, False, False, False]
        assert stored.run_at > jobs[0].run_at  # pushed back
        assert stored.run_at >= datetime.now(UTC) + timedelta(seconds=29)

    def test_the_newest_payload_with_replace(self) -> None:
        spec = Unique(keys=["doc"])
        unique({"doc": 1, "text": "a"}, unique=spec, debounce=5)
        last = unique({"doc": 1, "text": "ab"}, unique=spec, debounce=5, on_conflict="replace")
        assert Job.objects.get(pk=last.pk).payload == {"doc": 1, "text": "ab"}

    def test_once_the_job_runs_the_next_enqueue_makes_another(self) -> None:
        first = unique({"doc": 1}, debounce=0)
        (claimed,) = claim()
        second = unique({"doc": 1}, debounce=0)
        assert second.created
        assert second.pk != first.pk
        record(retrying(claimed))  # out of its states into others: no key met
        assert status(first) == "retrying"
        assert unique({"doc": 1}, debounce=0).pk == second.pk

    def test_a_release_at_shutdown_drops_the_key_of_a_job_held_while_pending(self) -> None:
        first = unique({"doc": 1}, debounce=0)
        (claimed,) = claim()
        second = unique({"doc": 1}, debounce=0)
        with connection.cursor() as cursor:  # back to pending, beside the newer one
            cursor.execute(queries.RELEASE_JOBS, [[first.pk], [claimed.attempt], WORKER])
            assert cursor.rowcount == 1
        released = Job.objects.get(pk=first.pk)
        assert (released.status, released.unique_key) == ("pending", None)
        assert Job.objects.get(pk=second.pk).unique_key is not None

    def test_an_unclaim_drops_it_too(self) -> None:
        first = unique({"doc": 1}, debounce=0)
        (claimed,) = claim()
        unique({"doc": 1}, debounce=0)
        with connection.cursor() as cursor:
            cursor.execute(queries.UNCLAIM_JOBS, [[first.pk], [claimed.attempt], WORKER])
            assert cursor.rowcount == 1
        assert Job.objects.get(pk=first.pk).unique_key is None

    def test_a_release_keeps_the_key_of_a_job_held_while_leased(self) -> None:
        first = unique({"doc": 1}, unique=True)
        (claimed,) = claim()
        with connection.cursor() as cursor:
            cursor.execute(queries.RELEASE_JOBS, [[first.pk], [claimed.attempt], WORKER])
        assert Job.objects.get(pk=first.pk).unique_key == first.unique_key
        assert unique({"doc": 1}, unique=True).pk == first.pk


class TestThrottle:
    def test_one_now_one_at_the_next_window_then_the_same(self) -> None:
        first = unique({"t": 1}, throttle=timedelta(hours=1))
        second = unique({"t": 1}, throttle=timedelta(hours=1))
        third = unique({"t": 1}, throttle=timedelta(hours=1))
        assert (first.created, second.created, third.created) == (True, True, False)
        assert third.pk == second.pk != first.pk
        stored = Job.objects.get(pk=second.pk)
        assert stored.run_at.timestamp() % 3600 == 0
        assert stored.run_at > Job.objects.get(pk=first.pk).run_at
        assert stored.run_at - timedelta(hours=1) <= Job.objects.get(pk=first.pk).run_at

    def test_a_completed_job_still_counts_in_its_window(self) -> None:
        first = unique({"t": 1}, throttle=timedelta(hours=1))
        (claimed,) = claim()
        record(completed(claimed))
        second = unique({"t": 1}, throttle=timedelta(hours=1))
        assert second.pk != first.pk
        assert Job.objects.get(pk=second.pk).run_at.timestamp() % 3600 == 0

    def test_replace_changes_the_payload_of_the_next_windows_job_not_its_time(self) -> None:
        spec = Unique(keys=["t"])
        unique({"t": 1, "v": 1}, unique=spec, throttle=3600)
        second = unique({"t": 1, "v": 2}, unique=spec, throttle=3600)
        third = unique({"t": 1, "v": 3}, unique=spec, throttle=3600, on_conflict="replace")
        assert third.pk == second.pk
        stored = Job.objects.get(pk=second.pk)
        assert stored.payload == {"t": 1, "v": 3}
        assert stored.run_at == second.run_at


@pytest.mark.django_db(transaction=True)
class TestConcurrentEnqueuers:
    def race(self, make: Callable[[], Job], workers: int = 8) -> list[Job]:
        barrier = threading.Barrier(workers)
        results: list[Job] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def attempt() -> None:
            try:
                with transaction.atomic():
                    barrier.wait(timeout=10)
                    made = make()
                    time.sleep(0.05)  # the others' inserts queue up behind this transaction
                with lock:
                    results.append(made)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=attempt) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert errors == []
        assert len(results) == workers
        return results

    @pytest.mark.parametrize(
        "options",
        [
            {"unique": True},
            {"unique": Unique(period=timedelta(hours=1))},
            {"unique": Unique(key="k")},
            {"debounce": 1},
            {"unique": True, "on_conflict": "replace"},
        ],
        ids=["unique", "period", "key", "debounce", "replace"],
    )
    def test_eight_enqueuers_make_one_job(self, options: dict[str, Any]) -> None:
        results = self.race(lambda: unique({"a": 1}, **options))
        assert len({r.pk for r in results}) == 1
        assert sorted(bool(r.created) for r in results) == [False] * 7 + [True]
        assert Job.objects.count() == 1

    def test_eight_throttled_enqueuers_make_two(self) -> None:
        results = self.race(lambda: unique({"a": 1}, throttle=3600))
        assert len({r.pk for r in results}) == 2
        assert Job.objects.count() == 2


class TestDeclared:
    def test_job_declares_it_and_enqueue_overrides_it(self, registry: None) -> None:
        @job("tests.unique.sync", queue="reports", unique=Unique(keys=["account"]))
        def sync(payload: dict[str, Any], ctx: Any) -> None:
            pass

        first = sync.enqueue({"account": 1, "n": 1})
        assert sync.enqueue({"account": 1, "n": 2}).pk == first.pk
        assert sync.enqueue({"account": 1}, unique=False).pk != first.pk
        assert sync.enqueue({"account": 1}, unique=Unique(by=("key",), key="x")).pk != first.pk

    def test_a_bad_declaration_fails_at_registration_naming_the_field(self, registry: None) -> None:
        from django_pgoutbox.errors import JobRegistrationError

        with pytest.raises(JobRegistrationError, match=r"unique\.states"):

            @job("tests.unique.bad", unique=Unique(states=("pending", "completed")))
            def bad(payload: dict[str, Any], ctx: Any) -> None:
                pass

    def test_a_unique_job_cannot_wait_for_others(self) -> None:
        parent = enqueue(TYPE, {})
        with pytest.raises(EnqueueError) as caught:
            unique({}, unique=True, after=[parent])
        assert caught.value.field == "after"

    def test_a_workflow_step_cannot_be_a_unique_job_type(self, registry: None) -> None:
        @job("tests.unique.step", unique=True)
        def step(payload: dict[str, Any], ctx: Any) -> None:
            pass

        flow = workflow("w")
        flow.add("tests.unique.step", {})
        with pytest.raises(EnqueueError, match="is unique"):
            flow.enqueue()

    def test_an_enqueue_error_names_the_field(self) -> None:
        with pytest.raises(EnqueueError) as caught:
            unique({}, unique=Unique(states=("pending", "retrying")))
        assert caught.value.field == "unique.states"


class TestEnqueueMany:
    def test_unique_items_meet_each_other_and_existing_jobs(self) -> None:
        existing = unique({"a": 0}, unique=True)
        items = [
            {"job_type": TYPE, "payload": {"a": n % 3}, "queue": "reports", "unique": True}
            for n in range(9)
        ]
        made = enqueue_many(items)
        assert [j.pk for j in made[::3]] == [existing.pk] * 3
        assert len({j.pk for j in made}) == 3
        assert [j.created for j in made[:3]] == [False, True, True]
        assert Job.objects.count() == 3

    def test_a_big_batch_of_a_declared_unique_type_is_not_copied(self, registry: None) -> None:
        @job("tests.unique.bulk", unique=True)
        def bulk(payload: dict[str, Any], ctx: Any) -> None:
            pass

        items = [
            {"job_type": "tests.unique.bulk", "payload": {"n": n % 10}}
            for n in range(COPY_MIN_ROWS * 2)
        ]
        made = enqueue_many(items)
        assert len(made) == COPY_MIN_ROWS * 2
        assert Job.objects.filter(job_type="tests.unique.bulk").count() == 10

    def test_an_item_error_names_the_item(self) -> None:
        with pytest.raises(EnqueueError) as caught:
            enqueue_many(
                [
                    {"job_type": TYPE, "payload": {}},
                    {"job_type": TYPE, "payload": {}, "throttle": 0.5},
                ]
            )
        assert caught.value.field == "items[1].throttle"


class TestRetryOfADeadLetter:
    def test_it_stays_dead_while_another_job_holds_its_key(self) -> None:
        first = unique({"a": 1}, unique=True)
        (claimed,) = claim()
        record(dead(claimed))
        second = unique({"a": 1}, unique=True)
        assert second.pk != first.pk
        assert control.retry_dead_jobs([first.pk]) == 0
        assert status(first) == "dead"
        other = unique({"a": 2}, unique=True)  # another dead letter, whose key is free
        (claimed_other,) = [c for c in claim() if c.id == other.pk]
        record(dead(claimed_other))
        assert control.retry_dead_jobs([first.pk, other.pk]) == 1
        assert status(other) == "pending"

    def test_it_is_retried_once_the_key_is_free(self) -> None:
        first = unique({"a": 1}, unique=True)
        (claimed,) = claim()
        record(dead(claimed))
        assert control.retry_dead_jobs([first.pk]) == 1
        assert status(first) == "pending"
        assert unique({"a": 1}, unique=True).pk == first.pk

    def test_with_dead_in_its_states_it_holds_the_key_and_is_retried(self) -> None:
        spec = Unique(states=("pending", "leased", "retrying", "dead"))
        first = unique({"a": 1}, unique=spec)
        (claimed,) = claim()
        record(dead(claimed))
        assert unique({"a": 1}, unique=spec).pk == first.pk
        assert control.retry_dead_jobs([first.pk]) == 1

    def test_the_index_refuses_a_second_holder_whatever_writes_it(self) -> None:
        first = unique({"a": 1}, unique=True)
        second = unique({"a": 2}, unique=True)
        with pytest.raises(IntegrityError), transaction.atomic():
            Job.objects.filter(pk=second.pk).update(unique_key=first.unique_key)


class TestInASubscriber:
    def test_a_unique_job_is_written_at_once_not_with_the_batch(self) -> None:
        from django_pgoutbox.enqueueing import deferred_enqueues

        with deferred_enqueues("default") as batch:
            plain = unique({"a": 1})
            first = unique({"a": 1}, unique=True)
            second = unique({"a": 1}, unique=True)
            assert Job.objects.filter(pk=first.pk).exists()  # written already
            assert not Job.objects.filter(pk=plain.pk).exists()  # waits for the flush
            batch.flush()
        assert (first.created, second.created, second.pk) == (True, False, first.pk)
        assert Job.objects.count() == 2


class TestLeaseRecovery:
    @pytest.mark.parametrize(
        "options", [{"debounce": 0}, {"unique": True}], ids=["debounce", "unique"]
    )
    def test_an_expired_lease_beside_a_newer_holder_is_recovered(
        self, options: dict[str, Any]
    ) -> None:
        from django.utils import timezone

        first = unique({"doc": 1}, **options)
        claim()
        newer = unique({"doc": 1}, **options)  # debounce: a new job; unique: the held one
        Job.objects.filter(pk=first.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
        with connection.cursor() as cursor:
            cursor.execute(queries.RECOVER_EXPIRED_LEASES, {"queue": "reports", "notify": True})
        assert status(first) == "retrying"
        assert (newer.pk == first.pk) is ("unique" in options)
        assert unique({"doc": 1}, **options).pk == newer.pk
