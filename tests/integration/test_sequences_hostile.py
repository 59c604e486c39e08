"""Sequences against the statements that race them: lock orders at the enqueue's commit, the
retention of cancelled jobs while a chain waits, and the operators' statements.

transaction=True where connections of their own must see each other's commits; each blocking
step is observed in ``pg_stat_activity`` before the next one is taken, so the interleaving is
the one named, not a likely one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_pgoutbox import cancel, enqueue, enqueue_many
from django_pgoutbox.control import cancel_jobs, retry_dead_jobs, skip_dead_jobs
from django_pgoutbox.enqueueing import prepare_job
from django_pgoutbox.maintenance import prune
from django_pgoutbox.models import Job
from django_pgoutbox.sequences import enqueue_in_sequence
from tests.integration.test_sequences import chain_of, states
from tests.integration.test_workflows import finish, lease
from tests.processes import wait_for


def _waiting_on_a_lock(pid: int) -> bool:
    with psycopg.connect(**_params(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
    return row is not None and row[0] == "Lock"


def _params() -> dict[str, Any]:
    from django_pgoutbox import db

    return db.raw_connection_params("default")


class _Thread(threading.Thread):
    """Runs ``work`` on a Django connection of its own; keeps its error and its backend pid."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.error: BaseException | None = None
        self.pid: int | None = None

    def run(self) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.work()
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()


@pytest.mark.django_db(transaction=True)
class TestLockOrderAtCommit:
    def test_a_batch_naming_keys_against_the_id_order_of_their_tails_does_not_deadlock(
        self,
    ) -> None:
        """The heads of keys a and b run (a's has the lower id). A batch names b, then a: at its
        commit, the trigger of each edge locks the edge's parent. An operator cancels both heads
        in one statement, which locks them in id order, while a third writer holds a's head a
        moment (a worker's outcome, say). In item order the batch held b's head while waiting
        for a's, and the cancel a's while waiting for b's: a deadlock, which failed the one or
        the other. In parent order, as a workflow's edges are inserted, neither fails."""
        head_a = enqueue("tests.step", {}, sequence="a")
        head_b = enqueue("tests.step", {}, sequence="b")
        assert head_a.pk < head_b.pk
        with psycopg.connect(**_params()) as holder:
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", [head_a.pk])

            def operator() -> None:
                cancel_jobs([head_a.pk, head_b.pk])

            def batch() -> None:
                with transaction.atomic():
                    enqueue_many(
                        [
                            {"job_type": "tests.step", "payload": {}, "sequence": "b"},
                            {"job_type": "tests.step", "payload": {}, "sequence": "a"},
                        ]
                    )

            cancelling = _Thread(operator)
            cancelling.start()
            wait_for(lambda: cancelling.pid is not None and _waiting_on_a_lock(cancelling.pid))
            enqueuing = _Thread(batch)
            enqueuing.start()
            wait_for(lambda: enqueuing.pid is not None and _waiting_on_a_lock(enqueuing.pid))
            holder.rollback()
        for thread in (cancelling, enqueuing):
            thread.join(timeout=30)
            assert not thread.is_alive()
        assert (cancelling.error, enqueuing.error) == (None, None)
        followers = Job.objects.filter(sequence_key__in=["a", "b"]).exclude(
            pk__in=[head_a.pk, head_b.pk]
        )
        assert sorted(followers.values_list("status", flat=True)) == ["pending", "pending"]


@pytest.mark.django_db
class TestRetention:
    def test_pruning_a_job_cancelled_before_its_turn_does_not_strand_the_sequence(
        self, settings: Any
    ) -> None:
        """a dies and holds its key for longer than cancelled jobs are kept; b, cancelled while
        it waited behind a, is pruned with the edge a -> b. Skipping a must still let c run:
        else c waits for ever for a job that is gone, and every later job of the key behind
        it."""
        a, b, c = chain_of("held", 3)
        finish(a, "dead")
        assert cancel(b.pk) == "cancelled"
        assert states([a, b, c]) == ["dead", "cancelled", "waiting"]
        Job.objects.filter(pk=b.pk).update(finished_at=b.created_at - timedelta(days=30))
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"CANCELLED_JOBS": 86400}}
        prune()
        assert skip_dead_jobs([a.pk], reason="posted by hand") == 1
        assert Job.objects.get(pk=c.pk).status == "pending"

    def test_pruning_it_while_the_job_before_it_runs_does_not_strand_the_sequence(
        self, settings: Any
    ) -> None:
        a, b, c = chain_of("long", 3)
        lease(a)
        assert cancel(b.pk) == "cancelled"
        Job.objects.filter(pk=b.pk).update(finished_at=b.created_at - timedelta(days=30))
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"CANCELLED_JOBS": 86400}}
        prune()
        with connection.cursor() as cursor:  # a's attempt ends
            cursor.execute(
                "UPDATE jobs SET status = 'completed', finished_at = now() WHERE id = %s", [a.pk]
            )
        assert Job.objects.get(pk=c.pk).status == "pending"

    def test_a_retried_dead_job_still_reaches_past_a_pruned_successor(self, settings: Any) -> None:
        a, b, c = chain_of("retried", 3)
        finish(a, "dead")
        cancel(b.pk)
        Job.objects.filter(pk=b.pk).update(finished_at=b.created_at - timedelta(days=30))
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"CANCELLED_JOBS": 86400}}
        prune()
        assert retry_dead_jobs([a.pk]) == 1
        finish(a)
        assert Job.objects.get(pk=c.pk).status == "pending"


@pytest.mark.django_db(transaction=True)
class TestLockOrderOfTheRelease:
    def test_a_completion_passing_a_cancelled_job_on_does_not_deadlock_with_a_cancel(
        self,
    ) -> None:
        """An enqueue draws its job's id before it waits for the key's lock: of two enqueuers
        of one key, the later in the chain may have the lower id. Here a runs, b (cancelled
        before its turn) is next and c after it, c's id below b's. a's end passes b's turn on
        to c, a level further, locking b and then c; an operator cancels c and b in one
        statement, locking c and then b. Every writer of jobs locks in id order: the release
        too, when its cascade goes past a job cancelled before its turn."""
        prepared_c = prepare_job("tests.step", {"n": "c"}, sequence="ids")
        prepared_b = prepare_job("tests.step", {"n": "b"}, sequence="ids")
        assert prepared_c.id < prepared_b.id
        a = enqueue("tests.step", {"n": "a"}, sequence="ids")
        (b,) = enqueue_in_sequence("default", [prepared_b._row])
        (c,) = enqueue_in_sequence("default", [prepared_c._row])
        lease(a)
        assert cancel(b.pk) == "cancelled"
        assert states([a, b, c]) == ["leased", "cancelled", "waiting"]
        with psycopg.connect(**_params()) as holder:
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", [b.pk])

            def end_of_a() -> None:  # any writer of a's end: the triggers release what follows
                with connection.cursor() as cursor:
                    cursor.execute(
                        "UPDATE jobs SET status = 'completed', finished_at = now() WHERE id = %s",
                        [a.pk],
                    )

            def operator() -> None:
                cancel_jobs([c.pk, b.pk])

            ending = _Thread(end_of_a)
            ending.start()
            wait_for(lambda: ending.pid is not None and _waiting_on_a_lock(ending.pid))
            cancelling = _Thread(operator)
            cancelling.start()
            wait_for(lambda: cancelling.pid is not None and _waiting_on_a_lock(cancelling.pid))
            holder.rollback()
        for thread in (ending, cancelling):
            thread.join(timeout=30)
            assert not thread.is_alive()
        assert (ending.error, cancelling.error) == (None, None)
        assert states([a, b, c]) == ["completed", "cancelled", "cancelled"]
