"""Workflows attacked: races between connections on the edges, the settle triggers and the
outcome statements, the relay's deferred enqueues, and what a step reads of its parents.

Every test here is ``transaction=True``: each needs two or more connections that see each
other's commits (psycopg connections of their own beside Django's), or the relay's own commits.
The order of the connections' steps is forced with row locks, and a connection's wait for a
lock is observed in ``pg_stat_activity``, never guessed with a sleep.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from django_pgoutbox import (
    cancel_workflow,
    chain,
    enqueue,
    publish,
    queries,
    step,
    subscriber,
    workflow,
)
from django_pgoutbox.conf import get_settings
from django_pgoutbox.models import Job, JobDependency, JobStatus
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.outcomes import params
from django_pgoutbox.worker.relay import Relay
from django_pgoutbox.workflows import EnqueuedWorkflow
from tests.conftest import claimed_job
from tests.integration.test_workflows import context

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "hostile-worker"

Params = dict[str, Any]


def state(job: Job | uuid.UUID) -> tuple[str, int | None]:
    pk = job.pk if isinstance(job, Job) else job
    row = Job.objects.values_list("status", "waiting_for").get(pk=pk)
    return row[0], row[1]


def lease(job: Job) -> Any:
    """Lease ``job`` to WORKER (committed) and return the claimed job an outcome is made of."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET status = 'leased', locked_by = %s, locked_at = now(),"
            " lease_expires_at = now() + interval '10 minutes', attempts = attempts + 1"
            " WHERE id = %s AND status IN ('pending', 'retrying')"
            " RETURNING attempts, max_attempts",
            [WORKER, job.pk],
        )
        ((attempt, budget),) = cursor.fetchall()
    return claimed_job(job.job_type, id=job.pk, attempt=attempt, max_attempts=budget)


def outcome_params(job: Job, outcome: str = "completed", result: str | None = None) -> Params:
    """RECORD_OUTCOMES's parameters for ``job``'s outcome, ``job`` leased first."""
    claimed = lease(job)
    if outcome == "completed":
        written = Outcome.completed(claimed, result)
    else:
        written = Outcome(claimed, JobStatus(outcome), code="boom", summary="it broke")
    return params([written], WORKER)


@contextmanager
def raw(conn_params: Params, **options: Any) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(**conn_params, **options) as conn:
        yield conn


def blocked(pid: int, timeout: float = 10.0) -> None:
    """Return once the server process ``pid`` waits for a lock."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
            row = cursor.fetchone()
            if row is not None and row[0] == "Lock":
                return
            time.sleep(0.01)
    raise AssertionError(f"server process {pid} never waited for a lock")


class Background:
    """Run ``work`` in a thread; ``join()`` returns what it raised (None: nothing)."""

    def __init__(self, work: Callable[[], object]) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                work()
            except BaseException as error:  # reported by join()
                self.error = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30.0) -> BaseException | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the background statement never returned"
        return self.error


def record(conn: psycopg.Connection[Any], values: Params) -> None:
    with conn.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, values)


def record_and_commit(conn: psycopg.Connection[Any], values: Params) -> None:
    record(conn, values)
    conn.commit()


def in_thread(write: Callable[[], Job], then: Callable[[], None]) -> Job:
    """Run ``write`` in a transaction of another Django connection (a thread's) whose commit
    waits for a lock; once it waits, run ``then`` (which releases it); return what it wrote."""
    written: list[Job] = []
    pids: list[int] = []

    def work() -> None:
        try:
            with transaction.atomic():
                written.append(write())
                pids.append(connection.connection.info.backend_pid)
        finally:
            connection.close()

    background = Background(work)
    deadline = time.monotonic() + 10
    while not pids and time.monotonic() < deadline:
        time.sleep(0.01)
    blocked(pids[0])
    then()
    assert background.join() is None
    return written[0]


class TestEdgeToAParentThatEndsMeanwhile:
    def test_a_parent_completed_and_committed_between_the_childs_insert_and_commit(
        self, raw_connection_params: Params
    ) -> None:
        parent = enqueue("tests.step", {})
        values = outcome_params(parent)
        with transaction.atomic():
            child = enqueue("tests.step", {}, after=[parent])
            with raw(raw_connection_params) as worker:
                record(worker, values)  # commits at the block's end: it never saw the edge
        assert state(child) == ("pending", 0)

    def test_a_parent_completed_while_the_childs_commit_waits_for_its_row(
        self, raw_connection_params: Params
    ) -> None:
        parent = enqueue("tests.step", {})
        values = outcome_params(parent)
        with raw(raw_connection_params) as worker:
            record(worker, values)  # written, not committed: the child's commit waits for it
            child = in_thread(lambda: enqueue("tests.step", {}, after=[parent]), worker.commit)
        assert state(child) == ("pending", 0)

    def test_two_parents_completed_by_two_connections_count_down_twice(
        self, raw_connection_params: Params
    ) -> None:
        flow = workflow("fan-in")
        left = flow.add("tests.step", {}, name="left")
        right = flow.add("tests.step", {}, name="right")
        flow.add("tests.step", {}, name="child", after=[left, right])
        written = flow.enqueue()
        first, second = outcome_params(written["left"]), outcome_params(written["right"])
        with raw(raw_connection_params) as one, raw(raw_connection_params) as two:
            record(one, first)  # holds the child's row, counted down to 1
            late = Background(lambda: record_and_commit(two, second))
            blocked(two.info.backend_pid)
            one.commit()
            assert late.join() is None
        assert state(written["child"]) == ("pending", 0)

    def test_a_dead_and_a_completed_parent_by_two_connections_cancel_the_child(
        self, raw_connection_params: Params
    ) -> None:
        flow = workflow("fan-in")
        left = flow.add("tests.step", {}, name="left")
        right = flow.add("tests.step", {}, name="right")
        flow.add("tests.step", {}, name="child", after=[left, right])
        written = flow.enqueue()
        completes, dies = outcome_params(written["left"]), outcome_params(written["right"], "dead")
        with raw(raw_connection_params) as one, raw(raw_connection_params) as two:
            record(one, completes)
            late = Background(lambda: record_and_commit(two, dies))
            blocked(two.info.backend_pid)
            one.commit()
            assert late.join() is None
        child = Job.objects.get(pk=written["child"].pk)
        assert (child.status, child.last_error_code) == ("cancelled", "upstream_failed")


class TestLockOrder:
    def test_two_deaths_cascading_through_crossed_levels_do_not_deadlock(
        self, raw_connection_params: Params
    ) -> None:
        # p1 -> c1 -> d1 and p2 -> {d1, e}, e -> c1: p1's death cancels c1 then d1 (a level
        # each); p2's cancels d1 and e, then c1. Locked level by level, the two take c1 and d1
        # in opposite orders.
        flow = workflow("crossed")
        flow.add("tests.step", {}, name="p1")
        flow.add("tests.step", {}, name="p2")
        flow.add("tests.step", {}, name="c1", after=["p1", "e"])
        flow.add("tests.step", {}, name="d1", after=["c1", "p2"])
        flow.add("tests.step", {}, name="e", after=["p2"])
        written = flow.enqueue()
        ids = {name: job.pk for name, job in written.jobs.items()}
        assert ids["c1"] < ids["d1"] < ids["e"]
        first, second = outcome_params(written["p1"], "dead"), outcome_params(written["p2"], "dead")
        with (
            raw(raw_connection_params) as holder,
            raw(raw_connection_params) as one,
            raw(raw_connection_params) as two,
        ):
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", [ids["e"]])
            p2_dies = Background(lambda: record_and_commit(two, second))
            blocked(two.info.backend_pid)  # holds d1, waits for e
            p1_dies = Background(lambda: record_and_commit(one, first))
            time.sleep(0.3)  # p1's death takes c1, then waits for d1 (or takes both first)
            holder.rollback()
            errors = [p1_dies.join(), p2_dies.join()]
        assert errors == [None, None]
        rows = dict(Job.objects.filter(workflow_id=written.id).values_list("step", "status"))
        assert rows == {
            "p1": "dead",
            "p2": "dead",
            "c1": "cancelled",
            "d1": "cancelled",
            "e": "cancelled",
        }


class TestRepeatableRead:
    def test_a_parent_completed_in_repeatable_read_after_an_edge_committed_releases_it(
        self, raw_connection_params: Params
    ) -> None:
        # DATABASES' isolation_level may be REPEATABLE READ: then the worker's outcome
        # statements run in it too. Its snapshot is taken before the edge commits.
        flow = workflow("already a parent")
        parent_step = flow.add("tests.step", {}, name="parent")
        flow.add("tests.step", {}, name="sibling", after=[parent_step])
        parent = flow.enqueue()["parent"]  # has_dependants already: the edge only locks it
        values = outcome_params(parent)
        with raw(raw_connection_params) as worker:
            worker.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            worker.execute("SELECT 1")  # the snapshot
            child = enqueue("tests.step", {}, after=[parent])  # committed: parent still leased
            for _ in range(2):  # a worker writes a batch again after a serialization failure
                try:
                    record(worker, values)
                    worker.commit()
                    break
                except psycopg.errors.SerializationFailure:
                    worker.rollback()
        assert state(parent)[0] == "completed"
        assert state(child) == ("pending", 0)


class TestInsideASubscriber:
    def test_a_job_after_one_enqueued_by_the_same_subscriber(self, registry: None) -> None:
        seen: list[tuple[uuid.UUID, uuid.UUID]] = []

        @subscriber("tests.hostile_after")
        def two_jobs(event: Any) -> None:
            first = enqueue("tests.step", {"n": 1})  # deferred to the relay's batch
            second = enqueue("tests.step", {"n": 2}, after=[first])
            seen.append((first.pk, second.pk))

        publish("tests.hostile_after", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
        conf = get_settings()
        relay = Relay(conf.outbox, relay_id="r", using="default", policy=conf.retry, burst=True)
        assert relay.run_once() == 1
        ((first, second),) = seen
        assert state(first) == ("pending", None)
        assert state(second) == ("waiting", 1)
        assert list(JobDependency.objects.values_list("parent_id", "child_id")) == [(first, second)]


class TestWhatAStepReads:
    def test_two_parents_of_other_workflows_with_one_step_name_both_keep_their_result(
        self,
    ) -> None:
        parents = []
        for n in (1, 2):
            flow = workflow(f"order {n}")
            flow.add("tests.step", {}, name="charge")
            parents.append(flow.enqueue()["charge"])
        for n, parent in enumerate(parents):
            with connection.cursor() as cursor:
                cursor.execute(queries.RECORD_OUTCOMES, outcome_params(parent, result=f'"{n}"'))
        child = enqueue("tests.step", {}, after=parents)
        # keyed by id, as a parent that is no step: neither result is lost
        assert context(child).parent_results == {str(parents[0].pk): "0", str(parents[1].pk): "1"}


class TestCost:
    def test_cancel_workflow_costs_in_proportion_to_the_steps(self) -> None:
        def cancelled_in(n: int) -> float:
            written = chain(*[step("tests.step", {}) for _ in range(n)]).enqueue()
            started = time.monotonic()
            assert cancel_workflow(written.id)["cancelled"] == n
            return time.monotonic() - started

        small, large = cancelled_in(2000), cancelled_in(12000)
        assert large < 6 * 2 * small + 0.5  # in proportion: 6 times, with room for noise


class TestWhichStatementsCallTheSettleFunctions:
    """The statement trigger and the outcomes' function are called only by a statement that
    ended a job with dependants (or one someone waits for): the claims and the outcomes of
    plain jobs pay no call. Counted by ``pg_stat_xact_user_functions``, in one transaction that
    also checks that the settings those statements set do not leak into the next."""

    CALLED = (
        "SELECT funcname, calls FROM pg_stat_xact_user_functions"
        " WHERE funcname IN ('pgoutbox_settle_noted', 'pgoutbox_outcomes_written',"
        " 'pgoutbox_note_settled')"
    )

    def test_calls_by_statement(self, raw_connection_params: Params) -> None:
        plain = enqueue("tests.step", {})
        flow = workflow("one edge")
        flow.add("tests.step", {}, name="parent")
        flow.add("tests.step", {}, name="child", after=["parent"])
        steps = flow.enqueue()
        other = workflow("another edge")
        other.add("tests.step", {}, name="parent")
        other.add("tests.step", {}, name="child", after=["parent"])
        others = other.enqueue()
        lease(others["parent"])
        plain_values, step_values = outcome_params(plain), outcome_params(steps["parent"])
        with connection.cursor() as cursor:  # no one waits (a waiter left by another test)
            cursor.execute("DELETE FROM job_waiters")
        with raw(raw_connection_params) as conn:
            (superuser,) = conn.execute(
                "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchall()
            if not superuser[0]:
                pytest.skip("track_functions is a superuser's setting")
            conn.execute("SET track_functions = 'pl'")

            def calls() -> dict[str, int]:
                return dict(conn.execute(self.CALLED).fetchall())

            record(conn, plain_values)
            assert calls() == {}, "the outcome of a plain job called a function"
            record(conn, step_values)
            assert calls() == {"pgoutbox_settle_noted": 1, "pgoutbox_outcomes_written": 1}
            # then an UPDATE of yours, in the same transaction: the worker's setting is gone,
            # the row trigger notes the parent it cancels
            conn.execute(
                "UPDATE jobs SET status = 'cancelled' WHERE id = %s", [others["parent"].pk]
            )
            assert calls() == {
                "pgoutbox_settle_noted": 2,
                "pgoutbox_outcomes_written": 1,
                "pgoutbox_note_settled": 1,
            }
            conn.execute("UPDATE jobs SET priority = 1 WHERE id = %s", [plain.pk])
            conn.execute("UPDATE jobs SET status = 'pending' WHERE id = %s", [plain.pk])
            assert calls()["pgoutbox_settle_noted"] == 2, "a later statement called it again"
            conn.commit()
        assert state(steps["child"]) == ("pending", 0)
        assert state(others["child"])[0] == "cancelled"
        assert Job.objects.get(pk=others["child"].pk).last_error_code == "upstream_failed"


class TestStatementsThatUpdateJobsTwice:
    """A statement whose end is not the last UPDATE of jobs in it: PostgreSQL fires a table's
    statement triggers once per statement, those of the last UPDATE of the table to end (the
    ones queued before are cancelled), and runs a function's statements, with their own
    triggers, in the middle of the statement that calls it."""

    def edge(self) -> EnqueuedWorkflow:
        flow = workflow("one edge")
        flow.add("tests.step", {}, name="parent")
        flow.add("tests.step", {}, name="child", after=["parent"])
        return flow.enqueue()

    def test_a_parent_completed_in_a_cte_read_by_an_update_of_other_columns(self) -> None:
        steps, plain = self.edge(), enqueue("tests.step", {})
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH done AS (UPDATE jobs SET status = 'completed', finished_at = now()"
                " WHERE id = %s RETURNING id)"
                " UPDATE jobs SET priority = 1 WHERE id = %s AND (SELECT count(*) FROM done) = 1",
                [steps["parent"].pk, plain.pk],
            )
        assert state(steps["child"]) == ("pending", 0)

    def test_a_parent_completed_beside_a_cte_that_updates_other_columns(self) -> None:
        steps, plain = self.edge(), enqueue("tests.step", {})
        with connection.cursor() as cursor:
            cursor.execute(
                "WITH touched AS (UPDATE jobs SET priority = 1 WHERE id = %s RETURNING id)"
                " UPDATE jobs SET status = 'completed', finished_at = now() WHERE id = %s",
                [plain.pk, steps["parent"].pk],
            )
        assert state(steps["child"]) == ("pending", 0)

    def test_a_parent_completed_by_a_statement_that_calls_a_function_updating_jobs(
        self,
    ) -> None:
        steps, plain, other = self.edge(), enqueue("tests.step", {}), enqueue("tests.step", {})
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE FUNCTION pg_temp.touch(job uuid) RETURNS integer LANGUAGE plpgsql AS $$"
                " BEGIN UPDATE jobs SET status = 'retrying' WHERE id = job; RETURN 0; END $$"
            )
            # the parent's row first, then the plain job's, whose new priority updates another
            cursor.execute(
                "UPDATE jobs AS j SET status = 'completed', finished_at = now(),"
                " priority = CASE WHEN j.id = %s THEN 0 ELSE pg_temp.touch(%s) END"
                " FROM unnest(%s::uuid[]) WITH ORDINALITY AS o(id, n)"
                " WHERE j.id = o.id",
                [steps["parent"].pk, other.pk, [steps["parent"].pk, plain.pk]],
            )
        assert Job.objects.get(pk=other.pk).status == "retrying"
        assert state(steps["child"]) == ("pending", 0)

    def test_a_parent_completed_by_a_statement_whose_function_kills_another(self) -> None:
        first, second, plain = self.edge(), self.edge(), enqueue("tests.step", {})
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE FUNCTION pg_temp.kill(job uuid) RETURNS integer LANGUAGE plpgsql AS $$"
                " BEGIN UPDATE jobs SET status = 'dead', finished_at = now() WHERE id = job;"
                " RETURN 0; END $$"
            )
            cursor.execute(
                "UPDATE jobs AS j SET status = 'completed', finished_at = now(),"
                " priority = CASE WHEN j.id = %s THEN 0 ELSE pg_temp.kill(%s) END"
                " FROM unnest(%s::uuid[]) WITH ORDINALITY AS o(id, n)"
                " WHERE j.id = o.id",
                [first["parent"].pk, second["parent"].pk, [first["parent"].pk, plain.pk]],
            )
        assert Job.objects.get(pk=second["child"].pk).last_error_code == "upstream_failed"
        assert state(first["child"]) == ("pending", 0)
