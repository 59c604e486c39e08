"""The handoff (``queries.RECORD_HANDOFF_AND_CLAIM``): the steps that a worker's completions
release in its own queue go to it in the statement that writes them, leased from 'waiting' in one
write; every other step is released by the statement trigger, as before.

Each test runs the statement as a lane sends it, on a psycopg connection of its own (the
statement trigger that settles the rest runs at its end), and checks what it returned and what
the rows say afterwards: handed (leased to the worker, returned without a mark), released
('pending', for a claim), or still waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.utils import timezone

from django_pgoutbox import enqueue, queries, workflow
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.outcomes import params
from django_pgoutbox.workflows import EnqueuedWorkflow
from tests.conftest import claimed_job
from tests.integration.test_workflows_hostile import WORKER, Background, blocked, lease, state

pytestmark = pytest.mark.django_db(transaction=True)

Params = dict[str, Any]


def outcomes(*jobs: Job, status: str = "completed") -> Params:
    """RECORD_OUTCOMES's parameters for ``jobs``, each leased to WORKER first."""
    written = []
    for job in jobs:
        claimed = lease(job)
        written.append(
            Outcome.completed(claimed)
            if status == "completed"
            else Outcome(claimed, JobStatus(status), code="boom", summary="it broke")
        )
    return params(written, WORKER)


def hand_off(
    lane_conn: psycopg.Connection[Any],
    values: Params,
    *,
    limit: int = 10,
    queue: str = "default",
    mark: Params | None = None,
) -> tuple[list[uuid.UUID], list[ClaimRow]]:
    """Run the handoff statement (the seek one with ``mark``): the ids it wrote, and the rows it
    returned to run."""
    claim = {"worker_id": WORKER, "queue": queue, "limit": limit, "lease": 60.0}
    name = "RECORD_HANDOFF_AND_SEEK_CLAIM" if mark else "RECORD_HANDOFF_AND_CLAIM"
    rows = lane_conn.execute(getattr(queries, name), values | claim | (mark or {})).fetchall()
    written = [row[1] for row in rows if not row[0]]
    return written, [ClaimRow._make(row[1:]) for row in rows if row[0]]


def handed(rows: Sequence[ClaimRow]) -> set[uuid.UUID]:
    return {row.id for row in rows if row.run_at is None}


def from_the_index(rows: Sequence[ClaimRow]) -> set[uuid.UUID]:
    return {row.id for row in rows if row.run_at is not None}


def leased_to_the_worker(job: Job) -> bool:
    row = Job.objects.get(pk=job.pk)
    return (
        row.status == JobStatus.LEASED
        and row.locked_by == WORKER
        and row.attempts == 1
        and row.waiting_for == 0
        and row.lease_expires_at is not None
    )


def parent_and_child(**child: Any) -> EnqueuedWorkflow:
    flow = workflow("handoff")
    flow.add("tests.step", {}, name="parent")
    flow.add("tests.step", {}, name="child", after=["parent"], **child)
    return flow.enqueue()


def fan_in(parents_queue: str | None = None) -> EnqueuedWorkflow:
    """``left`` and ``right``, then ``merge`` after both."""
    flow = workflow("fan-in")
    flow.add("tests.step", {}, name="left", queue=parents_queue)
    flow.add("tests.step", {}, name="right", queue=parents_queue)
    flow.add("tests.step", {}, name="merge", after=["left", "right"])
    return flow.enqueue()


class TestWhatIsHandedOver:
    def test_a_completed_parent_hands_its_child_over_and_the_claim_takes_the_rest(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child()
        plain = [enqueue("tests.step", {}) for _ in range(12)]
        values = outcomes(steps["parent"])
        written, rows = hand_off(lane_conn, values, limit=5)
        assert written == [steps["parent"].pk]
        assert handed(rows) == {steps["child"].pk}
        child = next(row for row in rows if row.id == steps["child"].pk)
        assert (child.attempt, child.queue, child.waited, child.dependants) == (
            1, "default", 0.0, False
        )  # fmt: skip
        # the claim took what the handoff left of the limit, the oldest first
        assert from_the_index(rows) == {job.pk for job in plain[:4]}
        assert leased_to_the_worker(steps["child"])
        assert Job.objects.filter(status=JobStatus.PENDING).count() == 8

    def test_a_step_with_dependants_of_its_own_says_so(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        flow = workflow("three")
        flow.add("tests.step", {}, name="a")
        flow.add("tests.step", {}, name="b", after=["a"])
        flow.add("tests.step", {}, name="c", after=["b"])
        steps = flow.enqueue()
        _, rows = hand_off(lane_conn, outcomes(steps["a"]))
        assert [(row.id, row.dependants) for row in rows] == [(steps["b"].pk, True)]

    def test_a_child_still_waiting_for_another_parent_is_counted_down_not_handed(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = fan_in(parents_queue="reports")  # the parents are not this claim's
        _, rows = hand_off(lane_conn, outcomes(steps["left"]))
        assert rows == []
        assert state(steps["merge"]) == ("waiting", 1)
        _, rows = hand_off(lane_conn, outcomes(steps["right"]))
        assert handed(rows) == {steps["merge"].pk}
        assert leased_to_the_worker(steps["merge"])

    def test_two_parents_completed_by_one_statement_hand_their_child_over(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = fan_in()
        _, rows = hand_off(lane_conn, outcomes(steps["left"], steps["right"]))
        assert handed(rows) == {steps["merge"].pk}
        assert leased_to_the_worker(steps["merge"])

    def test_the_limit_bounds_the_handoff_and_the_trigger_releases_the_rest(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        flow = workflow("fan-out")
        flow.add("tests.step", {}, name="root")
        for index in range(5):
            flow.add("tests.step", {}, name=f"leaf-{index}", after=["root"])
        steps = flow.enqueue()
        leaves = sorted(steps[f"leaf-{index}"].pk for index in range(5))
        plain = enqueue("tests.step", {})
        _, rows = hand_off(lane_conn, outcomes(steps["root"]), limit=3)
        assert handed(rows) == set(leaves[:3])  # the first by id, the order they are locked in
        assert from_the_index(rows) == set()
        for pk in leaves[3:]:
            assert state(pk) == ("pending", 0)
        assert state(plain.pk)[0] == "pending"


class TestWhatIsNotHandedOver:
    """Each step the claim itself could not take now goes the usual way."""

    def test_a_child_of_another_queue_is_released_for_its_own_workers(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child(queue="reports")
        _, rows = hand_off(lane_conn, outcomes(steps["parent"]))
        assert rows == []
        assert state(steps["child"]) == ("pending", 0)

    def test_a_child_scheduled_later_is_released_to_wait_for_its_time(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child(run_at=timedelta(hours=1))
        _, rows = hand_off(lane_conn, outcomes(steps["parent"]))
        assert rows == []
        child = Job.objects.get(pk=steps["child"].pk)
        assert child.status == JobStatus.PENDING
        assert child.run_at > timezone.now()

    def test_a_child_whose_cancellation_was_requested_is_not_run(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child()
        Job.objects.filter(pk=steps["child"].pk).update(cancel_requested_at=timezone.now())
        _, rows = hand_off(lane_conn, outcomes(steps["parent"]))
        assert rows == []
        assert Job.objects.get(pk=steps["child"].pk).status != JobStatus.LEASED

    def test_a_child_below_the_priority_of_a_due_job_waits_its_turn(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child(priority=0)
        urgent = enqueue("tests.step", {}, priority=5)
        _, rows = hand_off(lane_conn, outcomes(steps["parent"]), limit=1)
        assert handed(rows) == set()
        assert from_the_index(rows) == {urgent.pk}
        assert state(steps["child"]) == ("pending", 0)

    def test_a_child_of_the_highest_due_priority_goes_first(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child(priority=5)
        older = enqueue("tests.step", {}, priority=5)
        _, rows = hand_off(lane_conn, outcomes(steps["parent"]), limit=1)
        assert handed(rows) == {steps["child"].pk}
        assert from_the_index(rows) == set()
        assert state(older.pk)[0] == "pending"

    @pytest.mark.parametrize("status", ["dead", "retrying"])
    def test_a_parent_that_did_not_complete_hands_nothing_over(
        self, lane_conn: psycopg.Connection[Any], status: str
    ) -> None:
        steps = parent_and_child()
        _, rows = hand_off(lane_conn, outcomes(steps["parent"], status=status))
        assert rows == []
        assert state(steps["child"])[0] == ("cancelled" if status == "dead" else "waiting")

    def test_a_parent_cancelled_while_it_ran_hands_nothing_over(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child()
        values = outcomes(steps["parent"])
        Job.objects.filter(pk=steps["parent"].pk).update(cancel_requested_at=timezone.now())
        _, rows = hand_off(lane_conn, values)
        assert rows == []
        assert state(steps["child"])[0] == "cancelled"

    def test_the_seek_claim_hands_over_below_nothing_due_past_its_mark(
        self, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = parent_and_child(priority=0)
        behind = enqueue("tests.step", {}, priority=0)
        row = Job.objects.get(pk=behind.pk)
        mark = {
            "mark_priority": row.priority,
            "mark_run_at": row.run_at,
            "mark_created_at": row.created_at,
            "mark_id": row.pk,
        }
        _, rows = hand_off(lane_conn, outcomes(steps["parent"]), limit=5, mark=mark)
        # past the mark nothing is due: the child goes; the job at the mark is the full claim's
        assert handed(rows) == {steps["child"].pk}
        assert from_the_index(rows) == set()


class TestTwoWorkers:
    """The two parents of one step completed by two workers' handoff statements at once: the
    step is handed to one of them, never both, never left waiting."""

    def test_the_second_to_commit_waits_and_hands_the_step_over(
        self, raw_connection_params: Params, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = fan_in()
        left, right = outcomes(steps["left"]), outcomes(steps["right"])
        with psycopg.connect(**raw_connection_params) as first:
            hand_off(first, left)  # not committed: it holds the step's row
            pid = lane_conn.info.backend_pid
            second: list[list[ClaimRow]] = []
            background = Background(lambda: second.append(hand_off(lane_conn, right)[1]))
            blocked(pid)
            first.commit()
            assert background.join() is None
        # it waited for the step's row, then read it as the first left it: waiting for one
        assert [handed(rows) for rows in second] == [{steps["merge"].pk}]
        assert leased_to_the_worker(steps["merge"])

    def test_after_the_first_commits_the_second_hands_the_step_over(
        self, raw_connection_params: Params, lane_conn: psycopg.Connection[Any]
    ) -> None:
        steps = fan_in()
        left, right = outcomes(steps["left"]), outcomes(steps["right"])
        with psycopg.connect(**raw_connection_params, autocommit=True) as first:
            assert hand_off(first, left)[1] == []
        _, rows = hand_off(lane_conn, right)
        assert handed(rows) == {steps["merge"].pk}
        assert leased_to_the_worker(steps["merge"])


def test_a_plain_batch_sends_the_plain_statement() -> None:
    """``RecordAndClaim.hands_off``: only a completion of a job with dependants."""
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.worker.attempt import Attempt
    from django_pgoutbox.worker.claims import RecordAndClaim

    def request(status: JobStatus, dependants: bool) -> RecordAndClaim:
        job = claimed_job("tests.step")
        row = ClaimRow(
            job.id, "tests.step", "{}", 1, 3, None, "default", 0, job.created_at, 0.0, "[]",
            False, timezone.now(), dependants,
        )  # fmt: skip
        outcome = Outcome.completed(job) if status == JobStatus.COMPLETED else Outcome(job, status)
        settings = get_settings().queues["default"]
        return RecordAndClaim(settings, WORKER, [outcome], 10, [Attempt(row)])

    assert request(JobStatus.COMPLETED, True).hands_off()
    assert not request(JobStatus.COMPLETED, False).hands_off()
    assert not request(JobStatus.DEAD, True).hands_off()
    assert not request(JobStatus.RETRYING, True).hands_off()


def test_a_lane_sends_the_handoff_for_a_completion_with_dependants(
    raw_connection_params: Params,
) -> None:
    """``RecordAndClaim.run`` on a lane's connection: the parent's completion goes with the
    handoff; the claim counts the step handed over against its limit and asked the index for
    the rest (the seek's mark and shortness are the index's rows alone)."""
    from django_pgoutbox.conf import get_settings
    from django_pgoutbox.worker.attempt import Attempt
    from django_pgoutbox.worker.claims import RecordAndClaim

    steps = parent_and_child()
    plain = [enqueue("tests.step", {}) for _ in range(3)]
    claimed = lease(steps["parent"])
    row = ClaimRow(
        claimed.id, "tests.step", "{}", claimed.attempt, 3, None, "default", 0,
        claimed.created_at, 0.0, "[]", False, timezone.now(), True,
    )  # fmt: skip
    settings = get_settings().queues["default"]
    request = RecordAndClaim(settings, WORKER, [Outcome.completed(claimed)], 4, [Attempt(row)])
    with psycopg.connect(**raw_connection_params, autocommit=True) as lane_conn:
        request.run(lane_conn)
    assert request.applied == [steps["parent"].pk]
    assert request.handed() == 1
    assert request.asked == 3
    assert {r.id for r in request.indexed()} == {job.pk for job in plain}
    assert leased_to_the_worker(steps["child"])
