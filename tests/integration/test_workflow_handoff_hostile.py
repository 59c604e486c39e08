"""The handoff (``queries.RECORD_HANDOFF_AND_CLAIM``) attacked: its locks beside a cancel, the
priorities it must not pass, a statement PostgreSQL refuses, an edge committed under it, an
outcome sent twice. Each test states what the handoff promises (docs/workflows.md, the comments
of ``queries/claims.py`` and migration 0016) and checks it with real PostgreSQL; interleavings
between connections are forced with row locks and observed in ``pg_stat_activity``, as in
``test_workflows_hostile``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import connection

from django_pgoutbox import cancel_workflow, enqueue, queries, workflow
from django_pgoutbox.models import Job, JobStatus
from tests.integration.test_workflow_handoff import (
    from_the_index,
    hand_off,
    handed,
    outcomes,
)
from tests.integration.test_workflows_hostile import WORKER, Background, blocked, state

pytestmark = pytest.mark.django_db(transaction=True)

Params = dict[str, Any]


class TestLockOrder:
    """Migration 0016 and CANCEL_JOBS lock the rows they change in id order, "as every writer
    of jobs locks them", so that writers wait for each other rather than deadlock. The handoff
    locks every waiting child of its parents, in id order, before it hands any over: it never
    holds a step while it waits for one of a lower id."""

    def test_cancel_workflow_beside_a_handoff_does_not_deadlock(
        self, raw_connection_params: Params, lane_conn: psycopg.Connection[Any]
    ) -> None:
        parent = enqueue("tests.step", {})  # enqueued before the workflow: an external parent
        # another job after the parent, of another queue: the lowest child id, held below
        first = enqueue("tests.step", {}, after=[parent], queue="reports")
        flow = workflow("cancel-me")
        flow.add("tests.step", {}, name="other", after=[parent], queue="reports")
        flow.add("tests.step", {}, name="mine", after=[parent])  # would be handed over
        steps = flow.enqueue()
        other, mine = steps["other"], steps["mine"]
        assert first.pk < other.pk < mine.pk
        values = outcomes(parent)

        cancelled: list[dict[str, int]] = []

        def cancel() -> None:
            try:
                cancelled.append(cancel_workflow(steps.id))
            finally:
                connection.close()

        with psycopg.connect(**raw_connection_params) as holder:
            # a row lock on the first child (any transaction touching it: an admin page, a
            # cancel, another worker's trigger) makes the worker wait there
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", [first.pk])
            worker = Background(lambda: hand_off(lane_conn, values))
            blocked(lane_conn.info.backend_pid)
            # the worker holds no step yet: the cancel, which locks 'other' then 'mine', goes
            # through (handed over before the others were locked, 'mine' was held: the cancel
            # waited for it while the worker would wait for 'other', a deadlock)
            assert Background(cancel).join(timeout=10) is None
            holder.rollback()
            assert worker.join() is None
        assert cancelled == [{"cancelled": 2, "cancelling": 0}]
        assert state(mine)[0] == "cancelled"
        assert state(first) == ("pending", 0)

    def test_control_the_plain_statement_in_the_same_interleaving_does_not_deadlock(
        self, raw_connection_params: Params, lane_conn: psycopg.Connection[Any]
    ) -> None:
        """Before the change (RECORD_AND_CLAIM) the trigger locked 'other' and 'mine' in id
        order, as cancel_jobs does: the cancel goes through (this test passes)."""
        parent = enqueue("tests.step", {})
        first = enqueue("tests.step", {}, after=[parent], queue="reports")
        flow = workflow("cancel-me")
        flow.add("tests.step", {}, name="other", after=[parent], queue="reports")
        flow.add("tests.step", {}, name="mine", after=[parent])
        steps = flow.enqueue()
        values = outcomes(parent)
        claim = {"worker_id": WORKER, "queue": "default", "limit": 10, "lease": 60.0}
        with psycopg.connect(**raw_connection_params) as holder:
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", [first.pk])
            worker = Background(lambda: lane_conn.execute(queries.RECORD_AND_CLAIM, values | claim))
            blocked(lane_conn.info.backend_pid)
            assert cancel_workflow(steps.id) == {"cancelled": 2, "cancelling": 0}
            holder.rollback()
            assert worker.join() is None
        assert state(steps["mine"])[0] == "cancelled"


class TestPriority:
    """docs/workflows.md: a step is handed over only if "its priority is no lower than the
    highest of the jobs due in the queue, so jobs of a higher priority still come first"."""

    def test_a_lower_priority_sibling_is_not_handed_over_before_a_higher_one(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        flow = workflow("fan-out")
        flow.add("tests.step", {}, name="root")
        flow.add("tests.step", {}, name="low", after=["root"], priority=0)  # the lower id
        flow.add("tests.step", {}, name="high", after=["root"], priority=10)
        steps = flow.enqueue()
        _, rows = hand_off(lane_conn, outcomes(steps["root"]), limit=1)
        # one slot: the worker starts 'high'; 'low' is released behind it
        assert handed(rows) == {steps["high"].pk}
        assert state(steps["low"]) == ("pending", 0)

    def test_a_job_retried_now_at_a_higher_priority_is_not_overtaken(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        flow = workflow("parent-and-child")
        flow.add("tests.step", {}, name="parent")
        flow.add("tests.step", {}, name="child", after=["parent"], priority=0)
        steps = flow.enqueue()
        urgent = enqueue("tests.step", {}, priority=10)
        values = outcomes(steps["parent"], urgent, status="completed")
        # the urgent job's attempt fails in the same batch and is due again at once
        values["statuses"][1] = "retrying"
        values["delays"][1] = 0.0
        _, rows = hand_off(lane_conn, values, limit=1)
        assert Job.objects.get(pk=urgent.pk).status == JobStatus.RETRYING
        assert not handed(rows), "a priority-0 step was handed over ahead of a due priority-10 job"
        assert from_the_index(rows) == set()


class TestHeld:
    """A statement PostgreSQL refuses, an edge committed under the handoff, an outcome twice."""

    def test_a_data_error_in_the_handoff_falls_back_and_loses_no_step(
        self, raw_connection_params: Params
    ) -> None:
        """A batch whose handoff statement PostgreSQL refuses (a result jsonb cannot hold):
        the outcomes go one by one, the child is released by the trigger and taken by the
        plain claim, leased once; nothing is left waiting."""
        from django.utils import timezone

        from django_pgoutbox.conf import get_settings
        from django_pgoutbox.queries import ClaimRow
        from django_pgoutbox.worker.attempt import Attempt
        from django_pgoutbox.worker.claims import RecordAndClaim
        from django_pgoutbox.worker.execute import Outcome
        from tests.integration.test_workflow_handoff import leased_to_the_worker, parent_and_child
        from tests.integration.test_workflows_hostile import lease

        steps = parent_and_child()
        bad = enqueue("tests.step", {})
        batch, attempts = [], []
        for job, result, dependants in ((steps["parent"], None, True), (bad, '"\\u0000"', False)):
            claimed = lease(job)
            batch.append(Outcome.completed(claimed, result))
            attempts.append(Attempt(ClaimRow(
                claimed.id, "tests.step", "{}", claimed.attempt, 3, None, "default", 0,
                claimed.created_at, 0.0, "[]", False, timezone.now(), dependants,
            )))  # fmt: skip
        settings = get_settings().queues["default"]
        request = RecordAndClaim(settings, WORKER, batch, 4, attempts)
        assert request.hands_off()
        with psycopg.connect(**raw_connection_params, autocommit=True) as raw:
            request.run(raw)
        assert set(request.applied) == {steps["parent"].pk, bad.pk}
        assert [row.id for row in request.rows] == [steps["child"].pk]
        assert request.handed() == 0  # claimed from the index after the fallback
        assert leased_to_the_worker(steps["child"])
        assert Job.objects.get(pk=bad.pk).status == JobStatus.DEAD

    def test_an_edge_committed_while_the_handoff_holds_the_parent_is_settled(
        self, raw_connection_params: Params, lane_conn: psycopg.Connection[Any]
    ) -> None:
        """``enqueue(after=[parent])`` whose commit waits for the parent's row that the
        handoff statement holds: the edge is invisible to its snapshot, and the deferred
        trigger settles it after: the new job is pending, not waiting, not handed."""
        from django.db import transaction

        from tests.integration.test_workflow_handoff import parent_and_child

        steps = parent_and_child()
        values = outcomes(steps["parent"])
        with psycopg.connect(**raw_connection_params) as worker:
            rows = worker.execute(
                queries.RECORD_HANDOFF_AND_CLAIM,
                values | {"worker_id": WORKER, "queue": "default", "limit": 10, "lease": 60.0},
            ).fetchall()
            assert [row[1] for row in rows if row[0]] == [steps["child"].pk]
            late: list[Job] = []

            def write() -> None:
                try:
                    with transaction.atomic():
                        late.append(enqueue("tests.step", {}, after=[steps["parent"]]))
                finally:
                    connection.close()

            background = Background(write)
            while not late:
                pass
            worker.commit()
            assert background.join() is None
        assert state(late[0]) == ("pending", 0)

    def test_a_batch_with_the_parents_outcome_twice_hands_the_child_once_within_the_limit(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        from tests.integration.test_workflow_handoff import leased_to_the_worker

        flow = workflow("fan-out")
        flow.add("tests.step", {}, name="root")
        for index in range(3):
            flow.add("tests.step", {}, name=f"leaf-{index}", after=["root"])
        steps = flow.enqueue()
        plain = [enqueue("tests.step", {}) for _ in range(3)]
        values = outcomes(steps["root"])
        doubled = {
            key: (value * 2 if isinstance(value, list) and value else value)
            for key, value in values.items()
        }
        written, rows = hand_off(lane_conn, doubled, limit=2)
        assert written == [steps["root"].pk]
        assert len(rows) == 2
        assert len(handed(rows)) == 2
        assert all(leased_to_the_worker(Job(pk=pk)) for pk in handed(rows))
        assert [state(job)[0] for job in plain] == ["pending"] * 3
