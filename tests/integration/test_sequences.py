"""Sequences against PostgreSQL: each job of a key waits for the one enqueued before it, and the
end of the head, written by the statements a worker and the operators send, releases the next
(the triggers of migrations 0016 and 0018); a dead head holds its sequence until it is retried
or skipped.

The chain is written in the test's transaction; an edge to a job enqueued in an earlier
statement is settled at commit (a deferred trigger): ``settle_now()`` fires it as a commit would.
"""

from __future__ import annotations

import io
import random
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from django_pgoutbox import EnqueueError, cancel, enqueue, enqueue_many, job
from django_pgoutbox.control import cancel_dead_jobs, retry_dead_jobs, skip_dead_jobs
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import Job, JobDependency
from django_pgoutbox.registry import registered_jobs, restore_registry
from tests.integration.test_workflows import finish, lease, settle_now, status

pytestmark = pytest.mark.django_db


def chain_of(key: str, n: int, queue: str = "default") -> list[Job]:
    jobs = [enqueue("tests.step", {"n": i}, sequence=key, queue=queue) for i in range(n)]
    settle_now()
    return jobs


def states(jobs: list[Job]) -> list[str]:
    return [status(j)[0] for j in jobs]


class TestTheChain:
    def test_each_job_waits_for_the_one_before_it(self) -> None:
        a, b, c = chain_of("account:1", 3)
        assert (a.status, b.status, c.status) == ("pending", "waiting", "waiting")
        assert a.sequence_key == "account:1"
        assert a.on_upstream_failure == "hold"
        assert a.sequence_position is not None
        assert b.sequence_position is not None
        assert c.sequence_position is not None
        assert a.sequence_position < b.sequence_position < c.sequence_position
        edges = set(JobDependency.objects.values_list("parent_id", "child_id"))
        assert edges == {(a.pk, b.pk), (b.pk, c.pk)}
        other = enqueue("tests.step", {}, sequence="account:2")
        assert other.status == "pending"  # another key: its own head

    def test_completion_releases_the_next_one_only(self) -> None:
        a, b, c = chain_of("k", 3)
        finish(a)
        assert states([a, b, c]) == ["completed", "pending", "waiting"]
        finish(b)
        assert states([a, b, c]) == ["completed", "completed", "pending"]
        finish(c)
        d = enqueue("tests.step", {}, sequence="k")
        assert d.status == "pending"  # every job of the key finished: a new head

    def test_a_dead_job_holds_its_sequence_until_it_is_retried(self) -> None:
        a, b, c = chain_of("k", 3)
        finish(a, "dead")
        assert states([a, b, c]) == ["dead", "waiting", "waiting"]
        d = enqueue("tests.step", {}, sequence="k")
        settle_now()
        assert status(d)[0] == "waiting"
        assert retry_dead_jobs([a.pk]) == 1
        assert states([a, b, c]) == ["pending", "waiting", "waiting"]
        finish(a)
        assert states([a, b, c, d]) == ["completed", "pending", "waiting", "waiting"]

    def test_skipping_a_dead_job_releases_the_next_one(self) -> None:
        a, b, c = chain_of("k", 3)
        finish(a, "dead")
        assert skip_dead_jobs([a.pk], reason="bad invoice, refunded by hand") == 1
        row = Job.objects.get(pk=a.pk)
        assert (row.status, row.last_error_code) == ("cancelled", "skipped")
        assert "bad invoice" in (row.last_error_summary or "")
        assert states([b, c]) == ["pending", "waiting"]
        assert skip_dead_jobs([a.pk], reason="again") == 0  # no longer dead

    def test_giving_up_on_a_dead_job_releases_the_next_one_too(self) -> None:
        a, b = chain_of("k", 2)
        finish(a, "dead")
        assert cancel_dead_jobs([a.pk]) == 1
        assert states([a, b]) == ["cancelled", "pending"]

    def test_a_job_that_ends_cancelled_releases_the_next_one(self) -> None:
        a, b = chain_of("k", 2)
        finish(a, "cancelled")
        assert states([a, b]) == ["cancelled", "pending"]

    def test_cancelling_the_pending_head_lets_the_sequence_go_on(self) -> None:
        a, b, c = chain_of("k", 3)
        assert cancel(a.pk) == "cancelled"
        assert states([a, b, c]) == ["cancelled", "pending", "waiting"]

    def test_a_job_cancelled_before_its_turn_passes_it_on_when_it_comes(self) -> None:
        """Cancelling b while a runs must not release c beside a: c waits for a's end."""
        a, b, c, d = chain_of("k", 4)
        lease(a)
        assert cancel(b.pk) == "cancelled"
        assert states([a, b, c, d]) == ["leased", "cancelled", "waiting", "waiting"]
        assert cancel(c.pk) == "cancelled"  # two in a row
        assert states([c, d]) == ["cancelled", "waiting"]
        e = enqueue("tests.step", {}, sequence="k")
        settle_now()
        assert status(e)[0] == "waiting"
        with connection.cursor() as cursor:  # a's attempt ends (an outcome of any writer)
            cursor.execute(
                "UPDATE jobs SET status = 'completed', finished_at = now() WHERE id = %s", [a.pk]
            )
        assert states([a, b, c, d, e]) == [
            "completed",
            "cancelled",
            "cancelled",
            "pending",
            "waiting",
        ]

    def test_a_dead_head_holds_a_job_cancelled_behind_it(self) -> None:
        """Re-driving a dead job whose successor was cancelled: the one after runs only once
        the dead one completed."""
        a, b, c = chain_of("k", 3)
        finish(a, "dead")
        cancel(b.pk)
        assert states([a, b, c]) == ["dead", "cancelled", "waiting"]
        retry_dead_jobs([a.pk])
        assert states([a, b, c]) == ["pending", "cancelled", "waiting"]
        finish(a)
        assert states([a, b, c]) == ["completed", "cancelled", "pending"]

    def test_one_key_across_queues_is_one_sequence(self) -> None:
        a = enqueue("tests.step", {}, sequence="k", queue="reports")
        b = enqueue("tests.step", {}, sequence="k", queue="exports")
        settle_now()
        assert status(b)[0] == "waiting"
        finish(a)
        assert states([a, b]) == ["completed", "pending"]

    def test_a_repeated_idempotency_key_returns_the_job_and_adds_no_link(self) -> None:
        a = enqueue("tests.step", {}, sequence="k", idempotency_key="once")
        again = enqueue("tests.step", {}, sequence="k", idempotency_key="once")
        assert again.pk == a.pk
        assert JobDependency.objects.count() == 0

    def test_a_plain_workflow_child_still_counts_a_death_once(self) -> None:
        """A skip (dead -> cancelled) settles the hold steps only: a step that runs on an
        upstream failure counted the death already, and must not count it twice."""
        p1 = enqueue("tests.step", {})
        p2 = enqueue("tests.step", {})
        child = enqueue("tests.step", {}, after=[p1, p2], on_upstream_failure="run")
        settle_now()
        finish(p1, "dead")
        assert status(child) == ("waiting", 1)
        cancel_dead_jobs([p1.pk])
        assert status(child) == ("waiting", 1)
        finish(p2)
        assert status(child)[0] == "pending"


class TestEnqueueMany:
    def test_items_of_several_keys_chain_in_item_order(self) -> None:
        head = enqueue("tests.step", {}, sequence="b")
        jobs = enqueue_many(
            [
                {"job_type": "tests.step", "payload": {"i": 0}, "sequence": "b"},
                {"job_type": "tests.step", "payload": {"i": 1}},
                {"job_type": "tests.step", "payload": {"i": 2}, "sequence": "a"},
                {"job_type": "tests.step", "payload": {"i": 3}, "sequence": "b"},
            ]
        )
        settle_now()
        assert [j.payload["i"] for j in jobs] == [0, 1, 2, 3]
        assert [status(j)[0] for j in jobs] == ["waiting", "pending", "pending", "waiting"]
        edges = set(JobDependency.objects.values_list("parent_id", "child_id"))
        assert edges == {(head.pk, jobs[0].pk), (jobs[0].pk, jobs[3].pk)}

    def test_many_items_with_a_sequence_are_not_copied_past_it(self) -> None:
        items = [
            {"job_type": "tests.step", "payload": {"i": i}, "sequence": "k"} for i in range(70)
        ]
        jobs = enqueue_many(items)
        settle_now()
        assert [status(j)[0] for j in jobs[:2]] == ["pending", "waiting"]
        assert JobDependency.objects.count() == 69

    def test_a_bad_item_names_its_index(self) -> None:
        with pytest.raises(EnqueueError, match=r"items\[1\]\.sequence"):
            enqueue_many(
                [
                    {"job_type": "tests.step", "payload": {}, "sequence": "k"},
                    {"job_type": "tests.step", "payload": {}, "sequence": ""},
                ]
            )
        assert Job.objects.count() == 0


class TestRefusals:
    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("", "non-empty string"),
            (42, "non-empty string"),
            (["k"], "non-empty string"),
            ("x" * 201, "over the limit of 200 bytes"),
            ("a\x00b", "NUL"),
        ],
    )
    def test_a_bad_key_is_refused_naming_the_field(self, value: Any, message: str) -> None:
        with pytest.raises(EnqueueError, match=message) as refused:
            enqueue("tests.step", {}, sequence=value)
        assert refused.value.field == "sequence"

    def test_a_sequence_with_after_is_refused(self) -> None:
        parent = enqueue("tests.step", {})
        with pytest.raises(EnqueueError, match="cannot be combined with sequence") as refused:
            enqueue("tests.step", {}, sequence="k", after=[parent])
        assert refused.value.field == "after"
        assert Job.objects.count() == 1

    def test_repeatable_read_is_refused_and_the_transaction_goes_on(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(EnqueueError, match="READ COMMITTED") as refused:
            enqueue("tests.step", {}, sequence="k")
        assert refused.value.field == "sequence"
        assert Job.objects.count() == 0  # the caller's transaction is usable
        with connection.cursor() as cursor:  # and holds no key's lock: other enqueuers go on
            cursor.execute(
                "SELECT count(*) FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            )
            assert cursor.fetchone()[0] == 0


class TestSequenceBy:
    @pytest.fixture
    def account_job(self) -> Any:
        saved = registered_jobs()

        @job("tests.account_sync", sequence_by="account_id")
        def account_sync(payload: dict[str, Any], ctx: Any) -> None:
            return None

        yield account_sync
        restore_registry(saved)

    def test_the_payload_key_gives_the_sequence(self, account_job: Any) -> None:
        a = account_job.enqueue({"account_id": 42})
        b = enqueue("tests.account_sync", {"account_id": 42})
        c = account_job.enqueue({"account_id": 42}, sequence="other")  # explicit wins
        settle_now()
        assert (a.sequence_key, b.sequence_key, c.sequence_key) == ("42", "42", "other")
        assert states([a, b, c]) == ["pending", "waiting", "pending"]
        many = enqueue_many(
            [{"job_type": "tests.account_sync", "payload": {"account_id": 7}} for _ in range(70)]
        )
        assert {j.sequence_key for j in many} == {"7"}

    def test_a_missing_or_bad_payload_key_is_refused(self, account_job: Any) -> None:
        with pytest.raises(EnqueueError) as refused:
            account_job.enqueue({"other": 1})
        assert refused.value.field == "payload.account_id"
        with pytest.raises(EnqueueError) as refused:
            account_job.enqueue({"account_id": True})
        assert refused.value.field == "payload.account_id"


# transaction=True: each enqueuer commits on a connection of its own, which the others must see.
@pytest.mark.django_db(transaction=True)
class TestConcurrentEnqueuers:
    def test_eight_enqueuers_of_one_key_make_one_chain_in_commit_order(
        self, raw_connection_params: dict[str, Any]
    ) -> None:
        """Each enqueuer counts, under the key's lock, the jobs of the key it sees: those
        committed before it, and its own. One chain, each job after the one committed before."""
        seen: dict[uuid.UUID, int] = {}
        errors: list[BaseException] = []

        def enqueuer(n: int) -> None:
            try:
                for _ in range(5):
                    with transaction.atomic():
                        created = enqueue("tests.step", {"n": n}, sequence="shared")
                        with connection.cursor() as cursor:
                            cursor.execute(
                                "SELECT count(*) FROM jobs WHERE sequence_key = 'shared'"
                            )
                            seen[created.pk] = cursor.fetchone()[0]
                        time.sleep(random.random() / 100)  # hold the lock a little
            except BaseException as error:
                errors.append(error)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=enqueuer, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert len(seen) == 40
        children = dict(JobDependency.objects.values_list("parent_id", "child_id"))
        assert len(children) == 39  # one child each but the tail
        heads = set(seen) - set(children.values())
        assert len(heads) == 1
        walk = [heads.pop()]
        while walk[-1] in children:
            walk.append(children[walk[-1]])
        assert [seen[job_id] for job_id in walk] == list(range(1, 41))
        positions = {pk: p or 0 for pk, p in Job.objects.values_list("pk", "sequence_position")}
        assert [positions[j] for j in walk] == sorted(positions[j] for j in walk)

    def test_two_batches_of_two_keys_in_opposite_orders_do_not_deadlock(self) -> None:
        errors: list[BaseException] = []

        def batch(keys: list[str]) -> None:
            try:
                for _ in range(20):
                    with transaction.atomic():
                        enqueue_many(
                            [{"job_type": "tests.step", "payload": {}, "sequence": k} for k in keys]
                        )
            except BaseException as error:
                errors.append(error)
            finally:
                connections.close_all()

        threads = [
            threading.Thread(target=batch, args=(keys,)) for keys in (["x", "y"], ["y", "x"])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        for key in ("x", "y"):
            assert Job.objects.filter(sequence_key=key).count() == 40
            assert Job.objects.filter(sequence_key=key, status="pending").count() == 1

    def test_a_head_that_ends_while_the_next_is_enqueued_still_releases_it(
        self, raw_connection_params: dict[str, Any]
    ) -> None:
        """The enqueue reads the head running; the head completes and commits before the
        enqueue does: the edge's commit-time trigger settles it."""
        head = enqueue("tests.step", {}, sequence="race")
        with transaction.atomic():
            following = enqueue("tests.step", {}, sequence="race")
            assert following.status == "waiting"
            with psycopg.connect(**raw_connection_params, autocommit=True) as other:
                other.execute(
                    "UPDATE jobs SET status = 'completed', finished_at = now() WHERE id = %s",
                    [head.pk],
                )
        assert status(following)[0] == "pending"


class TestOperators:
    def test_the_cli_skips_a_dead_job_with_a_reason(self) -> None:
        a, b = chain_of("k", 2)
        finish(a, "dead")
        out = io.StringIO()
        call_command(
            "pgoutbox", "deadletters", "skip", str(a.pk), "--reason", "fixed by hand", stdout=out
        )
        assert "Skipped 1 dead job(s)." in out.getvalue()
        assert states([a, b]) == ["cancelled", "pending"]
        assert "fixed by hand" in (Job.objects.get(pk=a.pk).last_error_summary or "")

    def test_a_skip_needs_a_reason(self) -> None:
        with pytest.raises(InvalidInput) as refused:
            skip_dead_jobs([uuid.uuid4()], reason=" ")
        assert refused.value.field == "reason"

    def test_the_admin_skips_dead_letters_and_finds_a_sequence(self, admin_client: Any) -> None:
        a, b = chain_of("account:9", 2)
        finish(a, "dead")
        found = admin_client.get("/admin/pgoutbox/deadletter/", {"q": "sequence:account:9"})
        assert str(a.pk) in found.content.decode()
        page = admin_client.get(f"/admin/pgoutbox/deadletter/{a.pk}/change/")
        assert "account:9" in page.content.decode()
        admin_client.post(
            "/admin/pgoutbox/deadletter/",
            {"action": "skip", "_selected_action": [str(a.pk)], "confirmed": "yes"},
        )
        assert states([a, b]) == ["cancelled", "pending"]
