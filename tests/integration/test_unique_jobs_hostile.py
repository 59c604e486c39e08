"""Unique jobs against hostile callers and operators (docs/uniqueness.md): several dead letters
of one key retried at once, a holder written by a concurrent transaction during a retry, and an
idempotency key repeated after its job freed the unique key."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import OperationalError, connection, connections, transaction
from django.test import Client

from django_pgoutbox import control, enqueue, enqueue_many, job, queries
from django_pgoutbox.copy_rows import COPY_MIN_ROWS
from django_pgoutbox.errors import JobRegistrationError
from django_pgoutbox.models import Job
from django_pgoutbox.uniqueness import Unique
from django_pgoutbox.worker.outcomes import params
from tests.integration.test_unique_jobs import claim, completed, dead, record

pytestmark = pytest.mark.django_db

TYPE = "tests.behave"


def unique(payload: dict[str, Any], **options: Any) -> Job:
    return enqueue(TYPE, payload, queue="reports", **options)


def status(found: Job) -> str:
    return str(Job.objects.get(pk=found.pk).status)


def killed(payload: dict[str, Any], **options: Any) -> Job:
    made = unique(payload, **options)
    (claimed,) = [c for c in claim() if c.id == made.pk]
    record(dead(claimed))
    return made


def holders(job: Job) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM jobs WHERE unique_key = %s"
            " AND pgoutbox_unique_state(unique_states, status)",
            [Job.objects.get(pk=job.pk).unique_key],
        )
        (count,) = cursor.fetchone()
    return int(count)


class TestDeadLettersOfOneKey:
    """A sync of account 42 that died three times: three dead letters of one key, which an
    operator retries together (selected in the admin, by cause, ``--all``)."""

    def test_retried_together_the_newest_is_retried_the_others_stay_dead(self) -> None:
        first = killed({"a": 1}, unique=True)
        second = killed({"a": 1}, unique=True)
        third = killed({"a": 1}, unique=True)
        plain = killed({"a": 2})
        assert control.retry_dead_jobs([first.pk, second.pk, third.pk, plain.pk]) == 2
        assert [status(j) for j in (first, second, third, plain)] == [
            "dead",
            "dead",
            "pending",
            "pending",
        ]
        assert holders(third) == 1

    def test_by_cause(self) -> None:
        jobs = [killed({"a": 1}, unique=True) for _ in range(3)]
        cause = Job.objects.get(pk=jobs[0].pk).dead_cause
        assert cause is not None
        assert control.retry_dead_cause(cause) == (1, 2)
        assert sorted(status(j) for j in jobs) == ["dead", "dead", "pending"]

    def test_by_the_command(self) -> None:
        jobs = [killed({"a": 1}, unique=True) for _ in range(2)]
        out = io.StringIO()
        call_command("pgoutbox", "deadletters", "retry", "--all", stdout=out)
        assert "Retried 1 dead job(s)." in out.getvalue()
        assert sorted(status(j) for j in jobs) == ["dead", "pending"]

    def test_with_dead_in_their_states_one_holds_the_key_and_is_retried(self) -> None:
        spec = Unique(states=("pending", "leased", "retrying", "dead"))
        older = killed({"a": 1}, unique=True)  # dead, not holding
        holder = killed({"a": 1}, unique=spec)  # dead, holding
        assert control.retry_dead_jobs([older.pk, holder.pk]) == 1
        assert (status(older), status(holder)) == ("dead", "pending")


@pytest.mark.django_db(transaction=True)
class TestAHolderWrittenDuringTheRetry:
    def test_the_retry_sees_it_once_it_commits_and_leaves_the_dead_letter_dead(
        self, raw_connection_params: dict[str, Any]
    ) -> None:
        dead_letter = killed({"a": 1}, unique=True)
        stored = Job.objects.get(pk=dead_letter.pk)
        other = psycopg.connect(**raw_connection_params)
        try:
            other.execute("SET lock_timeout = '10s'")
            # another transaction enqueues the key (as enqueue() writes it) and commits later
            other.execute(
                "INSERT INTO jobs (id, queue, job_type, payload, priority, run_at, max_attempts,"
                " unique_key, unique_states) VALUES (gen_random_uuid(), 'reports', %s, '{}', 0,"
                " now(), 3, %s, %s)",
                [TYPE, stored.unique_key, stored.unique_states],
            )
            committer = threading.Timer(0.5, other.commit)
            committer.start()
            started = time.monotonic()
            assert control.retry_dead_jobs([dead_letter.pk]) == 0
            assert time.monotonic() - started >= 0.4  # it waited for the other transaction
            committer.join()
            assert status(dead_letter) == "dead"
        finally:
            other.execute("DELETE FROM jobs WHERE unique_key = %s", [stored.unique_key])
            other.commit()
            other.close()


class TestAnIdempotencyKeyRepeated:
    """The idempotency key says "this very request again": its job is the answer, even once it
    finished and another job holds the unique key."""

    def test_returns_its_own_job_not_the_holder(self) -> None:
        first = unique({"a": 1}, unique=True, idempotency_key="k")
        (claimed,) = claim()
        record(completed(claimed))
        holder = unique({"a": 1}, unique=True, idempotency_key="other")
        again = unique({"a": 1}, unique=True, idempotency_key="k")
        assert holder.pk != first.pk
        assert (again.pk, again.created) == (first.pk, False)

    def test_with_replace_it_leaves_the_holder_as_it_is(self) -> None:
        spec: dict[str, Any] = {"unique": Unique(keys=["a"]), "on_conflict": "replace"}
        first = unique({"a": 1, "v": 1}, idempotency_key="k", **spec)
        (claimed,) = claim()
        record(completed(claimed))
        holder = unique({"a": 1, "v": 2}, idempotency_key="other", **spec)
        again = unique({"a": 1, "v": 3}, idempotency_key="k", **spec)
        assert again.pk == first.pk
        assert Job.objects.get(pk=holder.pk).payload == {"a": 1, "v": 2}


class TestDeclaredWithASequence:
    def test_unique_and_sequence_by_on_one_job_type_are_refused_at_registration(
        self, registry: None
    ) -> None:
        with pytest.raises(JobRegistrationError, match="sequence_by"):

            @job("tests.unique.sequenced", unique=True, sequence_by="account")
            def handler(payload: dict[str, Any], ctx: Any) -> None:
                pass

        with pytest.raises(JobRegistrationError, match="sequence_by"):

            @job("tests.unique.sequenced", debounce=1, sequence_by="account")
            def debounced(payload: dict[str, Any], ctx: Any) -> None:
                pass


class TestTheAdminPage:
    def test_a_unique_job_and_its_dead_letter_show_the_key_and_its_states(
        self, admin_client: Client
    ) -> None:
        made = killed({"a": 1}, debounce=0)
        stored = Job.objects.get(pk=made.pk)
        for path in (f"job/{made.pk}", f"deadletter/{made.pk}"):
            page = admin_client.get(f"/admin/pgoutbox/{path}/change/")
            assert page.status_code == 200
            assert f"{stored.unique_key} (held while pending)" in page.content.decode()
        plain = admin_client.get(f"/admin/pgoutbox/job/{unique({'a': 2}).pk}/change/")
        assert "Uniqueness" not in plain.content.decode()


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``target`` on a connection of its own; its result (or error) lands in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = target()
        except BaseException as error:
            out["error"] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def blocked(thread: threading.Thread, seconds: float = 0.3) -> bool:
    thread.join(seconds)
    return thread.is_alive()


@pytest.mark.django_db(transaction=True)
class TestRaces:
    """An enqueuer meets a key whose holder another transaction is writing or moving."""

    def enqueue_later(self, **options: Any) -> tuple[threading.Thread, dict[str, Any]]:
        return in_thread(lambda: unique({"a": 1}, **options))

    @pytest.mark.parametrize("options", [{"unique": True}, {"debounce": 5}, {"throttle": 60}])
    def test_the_holders_transaction_rolls_back(
        self, options: dict[str, Any], raw_connection_params: dict[str, Any]
    ) -> None:
        opened = threading.Event()
        done = threading.Event()

        def holder() -> Job:
            with transaction.atomic():
                made = unique({"a": 1}, **options)
                opened.set()
                done.wait(10)
                transaction.set_rollback(True)
            return made

        first, held = in_thread(holder)
        assert opened.wait(10)
        second, out = self.enqueue_later(**options)
        assert blocked(second)  # it waits for the holder's transaction
        done.set()
        first.join(10)
        second.join(10)
        assert "error" not in out
        assert "error" not in held
        assert out["result"].created is True
        assert list(Job.objects.values_list("pk", flat=True)) == [out["result"].pk]

    @pytest.mark.parametrize("options", [{"unique": True}, {"debounce": 5}])
    def test_a_worker_completes_the_holder_meanwhile(
        self, options: dict[str, Any], lane_conn: psycopg.Connection[Any]
    ) -> None:
        holder = unique({"a": 1}, **{"debounce": 0} if "debounce" in options else options)
        (claimed,) = claim()
        with lane_conn.transaction():
            lane_conn.execute(
                queries.RECORD_OUTCOMES, params([completed(claimed)], "unique-worker")
            )
            second, out = self.enqueue_later(**options)
            # a leased job holds the key unless its states are pending alone (debounce)
            assert blocked(second) == ("debounce" not in options)
        second.join(10)
        assert "error" not in out
        assert out["result"].created is True
        assert out["result"].pk != holder.pk
        assert status(holder) == "completed"

    def test_a_debounce_while_a_worker_claims_the_job(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        holder = unique({"a": 1}, debounce=0)
        with lane_conn.transaction():
            lane_conn.execute(
                queries.CLAIM_JOBS,
                {"queue": "reports", "limit": 10, "worker_id": "w", "lease": 60.0},
            )
            second, out = self.enqueue_later(debounce=5)
            assert blocked(second)  # it waits for the claim
        second.join(10)
        assert "error" not in out
        assert (out["result"].created, status(holder)) == (True, "leased")

    def test_an_enqueuer_moving_the_waiting_job_never_holds_up_a_claim(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        unique({"a": 1}, debounce=0, unique=Unique(keys=["a"]), on_conflict="replace")
        plain = unique({"a": 2})
        opened = threading.Event()
        done = threading.Event()

        def mover() -> Job:
            with transaction.atomic():
                moved = unique({"a": 1, "v": 2}, debounce=0, unique=Unique(keys=["a"]))
                opened.set()
                done.wait(10)
            return moved

        thread, out = in_thread(mover)
        assert opened.wait(10)
        try:
            lane_conn.execute("SET lock_timeout = '2s'")
            rows = lane_conn.execute(
                queries.CLAIM_JOBS,
                {"queue": "reports", "limit": 10, "worker_id": "w", "lease": 60.0},
            ).fetchall()
        finally:
            done.set()
            thread.join(10)
        assert [row[0] for row in rows] == [plain.pk]  # the locked one skipped, not waited for
        assert out["result"].created is False

    def test_replace_of_a_job_being_leased_returns_it_as_it_is(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        spec: dict[str, Any] = {"unique": Unique(keys=["a"]), "on_conflict": "replace"}
        holder = unique({"a": 1, "v": 1}, **spec)
        with lane_conn.transaction():
            lane_conn.execute(
                queries.CLAIM_JOBS,
                {"queue": "reports", "limit": 10, "worker_id": "w", "lease": 60.0},
            )
            second, out = in_thread(lambda: unique({"a": 1, "v": 2}, **spec))
            assert blocked(second)
        second.join(10)
        assert "error" not in out
        assert (out["result"].pk, out["result"].created) == (holder.pk, False)
        assert Job.objects.get(pk=holder.pk).payload == {"a": 1, "v": 1}


class TestPayloadsCompared:
    def test_as_json_texts_with_sorted_keys(self) -> None:
        first = unique({"a": 1, "b": 2}, unique=True)
        assert unique({"b": 2, "a": 1}, unique=True).pk == first.pk
        assert unique({"a": 1.0, "b": 2}, unique=True).pk != first.pk
        assert unique({"a": True, "b": 2}, unique=True).pk != first.pk


@pytest.mark.django_db(transaction=True)
class TestRepeatableRead:
    @pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
    def test_a_holder_committed_after_the_snapshot_is_a_serialization_failure(
        self, level: str
    ) -> None:
        with pytest.raises(OperationalError, match="could not serialize"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
                cursor.execute("SELECT 1")  # the snapshot
            thread, out = in_thread(lambda: unique({"a": 1}, unique=True))
            thread.join(10)
            assert out["result"].created
            unique({"a": 1}, unique=True)
        assert Job.objects.count() == 1


class TestABigMixedBatch:
    def test_unique_plain_and_keyed_items_with_repeats_keep_their_order(self) -> None:
        items: list[dict[str, Any]] = []
        for n in range(COPY_MIN_ROWS * 2):
            kind = n % 4
            if kind == 0:
                items.append({"job_type": TYPE, "payload": {"u": n % 8}, "unique": True})
            elif kind == 1:
                items.append({"job_type": TYPE, "payload": {"p": n}})
            elif kind == 2:
                items.append(
                    {"job_type": TYPE, "payload": {"k": n}, "idempotency_key": f"k{n % 6}"}
                )
            else:
                items.append(
                    {
                        "job_type": TYPE,
                        "payload": {"d": n},
                        "debounce": 0,
                        "unique": Unique(key="d", by=["key"]),
                    }
                )
        made = list(enqueue_many(items))
        assert len(made) == len(items)
        for item, written in zip(items, made, strict=True):
            if "unique" in item and "debounce" not in item:
                assert written.payload == item["payload"]
            if "p" in item["payload"]:
                assert (written.payload, written.created) == (item["payload"], True)
        assert [j.created for j in made[0:16:4]] == [True, True, False, False]  # u=0, 4, 0, 4
        debounced = {j.pk for j in made[3::4]}
        assert len(debounced) == 1
        assert [j.created for j in made[3::4]][:2] == [True, False]
        assert all(j.unique_key is None for j in Job.objects.filter(payload__has_key="p"))
        assert Job.objects.filter(payload__has_key="u").count() == 2
