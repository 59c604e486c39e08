"""Workflows against PostgreSQL: the graph written by ``enqueue()``, what is refused, and what
the end of a parent does to its waiting children, written by the statements a worker, the lease
recovery and the operators send (the triggers of migration 0016 do the rest).

One connection is enough: these run in the test's transaction. An edge to a job enqueued before
is settled at commit (a deferred trigger); ``settle_now()`` fires it as the commit would.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from django_pgoutbox import (
    EnqueueError,
    JobContext,
    cancel,
    cancel_workflow,
    chain,
    enqueue,
    group,
    queries,
    step,
    workflow,
)
from django_pgoutbox.control import retry_dead_jobs
from django_pgoutbox.models import Job, JobDependency, JobStatus, Workflow
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.outcomes import params
from tests.conftest import claimed_job
from tests.processes import wait_for

pytestmark = pytest.mark.django_db

WORKER = "workflow-worker"


def settle_now() -> None:
    """Fire the deferred trigger of the edges to jobs enqueued before, as a commit would."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def status(job: Job) -> tuple[str, int | None]:
    row = Job.objects.values_list("status", "waiting_for").get(pk=job.pk)
    return row[0], row[1]


def lease(job: Job) -> tuple[int, int]:
    """Lease ``job`` to WORKER as a claim does (the claim takes a queue's first jobs, not one
    chosen): its attempt and budget."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs SET status = 'leased', locked_by = %s, locked_at = now(),"
            " lease_expires_at = now() + interval '1 minute', attempts = attempts + 1"
            " WHERE id = %s AND status IN ('pending', 'retrying')"
            " RETURNING attempts, max_attempts",
            [WORKER, job.pk],
        )
        (row,) = cursor.fetchall()
    return row[0], row[1]


def finish(job: Job, outcome: str = "completed", result: Any = None) -> None:
    """Lease ``job`` and write its outcome with the statement a worker sends."""
    attempt, budget = lease(job)
    claimed = claimed_job(job.job_type, id=job.pk, attempt=attempt, max_attempts=budget)
    if outcome == "completed":
        written = Outcome.completed(claimed, None if result is None else f'"{result}"')
    else:
        written = Outcome(claimed, JobStatus(outcome), code="boom", summary="it broke")
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, params([written], WORKER))
        assert [r[0] for r in cursor.fetchall()] == [job.pk]


def queued(name: str) -> str:
    """The queue of a step (any configured one: finish() leases the very job it is given)."""
    return "reports" if name < "m" else "exports"


def order(**options: Any) -> dict[str, Job]:
    """reserve -> charge -> ship, with notify after ship whatever happens; each its own queue."""
    flow = workflow("order", **options)
    reserve = flow.add("tests.step", {"name": "reserve"}, name="reserve", queue=queued("r"))
    charge = flow.add(
        "tests.step", {"name": "charge"}, name="charge", after=[reserve], queue=queued("c")
    )
    ship = flow.add(
        "tests.step", {"name": "ship"}, name="ship", after=[charge, "reserve"], queue=queued("s")
    )
    flow.add(
        "tests.step",
        {"name": "notify"},
        name="notify",
        after=[ship],
        on_upstream_failure="run",
        queue=queued("n"),
    )
    return flow.enqueue().jobs


class TestTheGraph:
    def test_a_workflow_is_its_row_its_steps_and_its_edges(self) -> None:
        flow = workflow("order")
        reserve = flow.add("tests.step", {"name": "reserve"}, name="reserve")
        flow.add("tests.step", {"name": "charge"}, name="charge", after=[reserve])
        flow.add("tests.step", {}, after=["charge", reserve, "reserve"])
        written = flow.enqueue()

        assert Workflow.objects.get(pk=written.id).steps == 3
        rows = {
            job.step: (job.status, job.waiting_for, job.has_dependants, job.workflow_id)
            for job in Job.objects.filter(workflow_id=written.id)
        }
        assert rows == {
            "reserve": ("pending", None, True, written.id),
            "charge": ("waiting", 1, True, written.id),
            "tests.step": ("waiting", 2, None, written.id),  # a parent named twice counts once
        }
        assert {(row.parent_id, row.child_id) for row in JobDependency.objects.all()} == {
            (written["reserve"].pk, written["charge"].pk),
            (written["reserve"].pk, written["tests.step"].pk),
            (written["charge"].pk, written["tests.step"].pk),
        }
        # The returned jobs say what the rows say.
        assert written["charge"].status == JobStatus.WAITING
        assert written["charge"].waiting_for == 1
        assert reserve.job is written["reserve"]

    def test_the_graph_costs_three_statements_whatever_its_size(
        self, django_assert_max_num_queries: Any
    ) -> None:
        flow = workflow("wide")
        root = flow.add("tests.step", {})
        for index in range(300):
            flow.add("tests.step", {"i": index}, after=[root])
        # the savepoint's, then the workflow's row, the steps, the edges
        with django_assert_max_num_queries(5):
            flow.enqueue()
        assert Job.objects.filter(status="waiting").count() == 300

    def test_steps_are_named_after_their_job_type_numbered_when_it_repeats(self) -> None:
        flow = workflow("names")
        names = [flow.add("tests.step", {}).name for _ in range(3)]
        assert names == ["tests.step", "tests.step-2", "tests.step-3"]

    def test_chain_runs_each_step_after_the_one_before(self) -> None:
        written = chain(
            step("tests.step", {"n": 1}, name="a"),
            step("tests.step", {"n": 2}, name="b"),
            step("tests.step", {"n": 3}, name="c"),
        ).enqueue()
        assert [status(written[name]) for name in "abc"] == [
            ("pending", None),
            ("waiting", 1),
            ("waiting", 1),
        ]
        edges = set(JobDependency.objects.values_list("parent_id", "child_id"))
        assert edges == {
            (written["a"].pk, written["b"].pk),
            (written["b"].pk, written["c"].pk),
        }

    def test_a_groups_callback_waits_for_every_member_and_runs_whatever_they_became(self) -> None:
        written = (
            group([step("tests.step", {"i": i}) for i in range(4)])
            .then(step("tests.group_done", {}, name="done"))
            .enqueue()
        )
        done = Job.objects.get(pk=written["done"].pk)
        assert (done.status, done.waiting_for, done.on_upstream_failure) == ("waiting", 4, "run")


class TestRefused:
    @pytest.mark.parametrize(
        ("build", "field", "message"),
        [
            (
                lambda f: (
                    f.add("tests.step", {}, name="a", after=["c"]),
                    f.add("tests.step", {}, name="b", after=["a"]),
                    f.add("tests.step", {}, name="c", after=["b"]),
                ),
                "steps",
                "in a circle: ",
            ),
            (lambda f: f.add("tests.step", {}, name="a", after=["a"]), "steps", "'a' after 'a'"),
            (
                lambda f: f.add("tests.step", {}, after=["nope"]),
                "steps[0].after[0]",
                "'nope' names no step of this workflow",
            ),
            (
                lambda f: f.add("tests.step", {}, after=[uuid.UUID(int=7)]),
                "after",
                "names job 00000000-0000-0000-0000-000000000007, which does not exist",
            ),
            (
                lambda f: f.add("tests.step", {}, after=[workflow("other").add("tests.step", {})]),
                "steps[0].after[0]",
                "is not a step of this workflow",
            ),
            (lambda f: f.add("tests.step", {}, after=[3.5]), "steps[0].after[0]", "must be a job"),
            (lambda f: f.add("tests.step", [], name="x"), "steps[0].payload", ""),
        ],
    )
    def test_a_bad_graph_writes_nothing_and_names_what_is_wrong(
        self, build: Any, field: str, message: str
    ) -> None:
        flow = workflow("bad")
        flow.add("tests.step", {}, name="fine")
        build(flow)
        with pytest.raises(EnqueueError) as caught:
            flow.enqueue()
        assert caught.value.field.replace("steps[1]", "steps[0]") == field
        assert message in str(caught.value)
        assert not Job.objects.exists()
        assert not Workflow.objects.exists()

    def test_the_cycle_is_named(self) -> None:
        flow = workflow("circle")
        flow.add("tests.step", {}, name="a", after=["b"])
        flow.add("tests.step", {}, name="b", after=["a"])
        with pytest.raises(EnqueueError, match=r"'a' after 'b' after 'a'|'b' after 'a' after 'b'"):
            flow.enqueue()

    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"after": "not-a-list"}, "after"),
            ({"after": [object()]}, "after"),
            ({"after": [uuid.UUID(int=9)]}, "after"),
            ({"after": [uuid.UUID(int=9)], "on_upstream_failure": "skip"}, "on_upstream_failure"),
        ],
    )
    def test_enqueue_after_refuses_what_is_no_job(self, kwargs: dict[str, Any], field: str) -> None:
        with pytest.raises(EnqueueError) as caught:
            enqueue("tests.step", {}, **kwargs)
        assert caught.value.field == field
        assert not Job.objects.exists()

    def test_a_duplicate_name_an_empty_workflow_and_a_bad_policy_are_refused(self) -> None:
        flow = workflow("dup")
        flow.add("tests.step", {}, name="a")
        with pytest.raises(EnqueueError, match="'a' names another step"):
            flow.add("tests.step", {}, name="a")
        with pytest.raises(EnqueueError, match="'cancel' or 'run'"):
            flow.add("tests.step", {}, on_upstream_failure="later")  # type: ignore[arg-type]
        with pytest.raises(EnqueueError, match="at least one step"):
            workflow("empty").enqueue()
        with pytest.raises(EnqueueError, match="at least one step"):
            chain()
        with pytest.raises(EnqueueError, match="name"):
            workflow("")


class TestRelease:
    def test_the_last_parents_completion_releases_the_child_in_its_own_statement(self) -> None:
        jobs = order()
        finish(jobs["reserve"])
        assert status(jobs["charge"]) == ("pending", 0)
        assert status(jobs["ship"]) == ("waiting", 1)  # reserve done, charge not yet
        finish(jobs["charge"])
        assert status(jobs["ship"]) == ("pending", 0)
        before = Job.objects.get(pk=jobs["ship"].pk).run_at
        assert before <= timezone.now() + timedelta(seconds=1)
        finish(jobs["ship"])
        assert status(jobs["notify"]) == ("pending", 0)

    def test_a_released_step_keeps_a_run_at_in_the_future(self) -> None:
        flow = workflow("later")
        first = flow.add("tests.step", {}, queue=queued("l"))
        flow.add("tests.step", {}, after=[first], run_at=timedelta(hours=1))
        written = flow.enqueue()
        finish(written["tests.step"])
        later = Job.objects.get(pk=written["tests.step-2"].pk)
        assert later.status == "pending"
        assert later.run_at > timezone.now() + timedelta(minutes=59)

    def test_a_dead_parent_cancels_its_dependants_and_theirs_but_runs_the_clean_up(self) -> None:
        jobs = order()
        finish(jobs["reserve"], "dead")
        rows = {
            job.step: (job.status, job.last_error_code)
            for job in Job.objects.filter(workflow_id=jobs["reserve"].workflow_id)
        }
        assert rows == {
            "reserve": ("dead", "boom"),
            "charge": ("cancelled", "upstream_failed"),
            "ship": ("cancelled", "upstream_failed"),
            "notify": ("pending", None),  # on_upstream_failure="run"
        }

    def test_retrying_the_dead_parent_puts_its_dependants_back_and_they_run(self) -> None:
        jobs = order()
        finish(jobs["reserve"], "dead")
        finish(jobs["notify"])  # the clean-up ran
        assert retry_dead_jobs([jobs["reserve"].pk]) == 1
        assert status(jobs["charge"]) == ("waiting", 1)
        assert status(jobs["ship"]) == ("waiting", 2)
        assert status(jobs["notify"]) == ("completed", 0)  # what ran stays run
        finish(jobs["reserve"])
        finish(jobs["charge"])
        assert status(jobs["ship"]) == ("pending", 0)

    def test_retrying_one_of_two_dead_parents_leaves_the_child_cancelled(self) -> None:
        flow = workflow("two")
        left = flow.add("tests.step", {}, name="left", queue=queued("a"))
        right = flow.add("tests.step", {}, name="right", queue=queued("b"))
        flow.add("tests.step", {}, name="child", after=[left, right])
        written = flow.enqueue()
        finish(written["left"], "dead")
        finish(written["right"], "dead")
        retry_dead_jobs([written["left"].pk])
        assert status(written["child"])[0] == "cancelled"
        retry_dead_jobs([written["right"].pk])
        assert status(written["child"]) == ("waiting", 2)

    def test_a_clean_up_step_waiting_for_more_counts_the_retried_parent_again(self) -> None:
        flow = workflow("cleanup")
        failing = flow.add("tests.step", {}, name="failing", queue=queued("f"))
        slow = flow.add("tests.step", {}, name="slow", queue=queued("s"))
        flow.add("tests.step", {}, name="cleanup", after=[failing, slow], on_upstream_failure="run")
        written = flow.enqueue()
        finish(written["failing"], "dead")
        assert status(written["cleanup"]) == ("waiting", 1)
        retry_dead_jobs([written["failing"].pk])
        assert status(written["cleanup"]) == ("waiting", 2)
        finish(written["slow"])
        assert status(written["cleanup"]) == ("waiting", 1)
        finish(written["failing"])
        assert status(written["cleanup"]) == ("pending", 0)

    def test_a_lost_last_attempt_cancels_the_dependants_too(self) -> None:
        jobs = order()
        Job.objects.filter(pk=jobs["reserve"].pk).update(max_attempts=1)
        lease(jobs["reserve"])
        # its last attempt, run alone (a suspect's): the one lost attempt that counts
        Job.objects.filter(pk=jobs["reserve"].pk).update(
            lease_expires_at=timezone.now() - timedelta(hours=1), alone_attempt=1
        )
        with connection.cursor() as cursor:
            cursor.execute(
                queries.RECOVER_EXPIRED_LEASES, {"queue": jobs["reserve"].queue, "notify": True}
            )
        assert status(jobs["reserve"])[0] == "dead"
        assert status(jobs["charge"])[0] == "cancelled"
        assert status(jobs["notify"])[0] == "pending"

    def test_a_long_chain_is_cancelled_whole_without_recursion(self) -> None:
        steps = [step("tests.step", {"i": i}) for i in range(2000)]
        written = chain(*steps).enqueue()
        first = next(iter(written.jobs.values()))
        finish(first, "dead")
        assert Job.objects.filter(
            status="cancelled", last_error_code="upstream_failed"
        ).count() == (1999)

    def test_cancel_of_a_waiting_step_cancels_its_dependants(self) -> None:
        jobs = order()
        assert cancel(jobs["charge"].pk) == "cancelled"
        assert status(jobs["ship"])[0] == "cancelled"
        assert status(jobs["notify"]) == ("pending", 0)
        assert status(jobs["reserve"]) == ("pending", None)

    def test_cancel_workflow_cancels_every_step_not_finished(self) -> None:
        jobs = order()
        finish(jobs["reserve"])
        lease(jobs["charge"])  # charge is running
        workflow_id = jobs["reserve"].workflow_id
        assert workflow_id is not None
        counts = cancel_workflow(workflow_id)
        assert counts == {"cancelled": 2, "cancelling": 1}
        assert status(jobs["reserve"])[0] == "completed"
        assert status(jobs["ship"])[0] == "cancelled"
        assert status(jobs["notify"])[0] == "cancelled"
        # again: only the running step is left unfinished, asked to stop already
        assert cancel_workflow(workflow_id) == {"cancelled": 0, "cancelling": 1}
        Job.objects.filter(pk=jobs["charge"].pk).update(status="cancelled")  # its attempt ended
        assert cancel_workflow(workflow_id) == {"cancelled": 0, "cancelling": 0}  # none left
        with pytest.raises(Workflow.DoesNotExist):
            cancel_workflow(uuid.uuid4())


def _blocked(pid: int) -> bool:
    """whether backend ``pid`` waits for a lock"""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [pid],
        )
        return bool(cursor.fetchone()[0])


# transaction=True: the settlements under test run on connections of their own, which must see
# the workflow committed.
@pytest.mark.django_db(transaction=True)
class TestConcurrentSettlement:
    def test_a_cascade_and_a_release_crossing_it_lock_in_one_order(
        self, raw_connection_params: dict[str, Any]
    ) -> None:
        """P's death cancels c1 and c2, then c1's child g; r's completion settles g and c2.
        Locked level by level, the cascade held c2 (above g) while it waited for g, which the
        release held while it waited for c2: a deadlock (40P01). The cascade now locks every row
        it may change, in id order, before its first change."""
        flow = workflow("crossing")
        # added in this order, so ids rise in it: c1 < g < c2
        for name, after in [
            ("p", []),
            ("r", []),
            ("c1", ["p"]),
            ("g", ["c1", "r"]),
            ("c2", ["p", "r"]),
        ]:
            flow.add("tests.step", {}, name=name, after=after)
        jobs = flow.enqueue().jobs
        assert jobs["c1"].pk < jobs["g"].pk < jobs["c2"].pk

        errors: list[Exception] = []

        def end(conn: psycopg.Connection[Any], job: Job, outcome: str) -> None:
            try:
                with conn.transaction():
                    conn.execute(
                        "UPDATE jobs SET status = %s, finished_at = now(),"
                        " completed_at = CASE WHEN %s = 'completed' THEN now() END WHERE id = %s",
                        [outcome, outcome, job.pk],
                    )
            except Exception as error:  # a deadlock: the test's thread reports it
                errors.append(error)

        with (
            psycopg.connect(**raw_connection_params) as holder,
            psycopg.connect(**raw_connection_params) as cascade,
            psycopg.connect(**raw_connection_params) as release,
        ):
            holder.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", [jobs["c2"].pk])
            threads = []
            for conn, job, outcome in [
                (cascade, jobs["p"], "dead"),
                (release, jobs["r"], "completed"),
            ]:
                thread = threading.Thread(target=end, args=(conn, job, outcome))
                thread.start()
                threads.append(thread)
                wait_for(functools.partial(_blocked, conn.info.backend_pid), timeout=10)
            holder.commit()
            for thread in threads:
                thread.join(timeout=30)
        assert errors == []
        assert {
            job.step: (job.status, job.last_error_code)
            for job in Job.objects.filter(workflow_id=jobs["p"].workflow_id)
        } == {
            "p": ("dead", None),
            "r": ("completed", None),
            "c1": ("cancelled", "upstream_failed"),
            "g": ("cancelled", "upstream_failed"),
            "c2": ("cancelled", "upstream_failed"),
        }


class TestAfterJobsEnqueuedBefore:
    def test_a_job_waits_for_a_pending_one_and_is_released_by_it(self) -> None:
        parent = enqueue("tests.step", {}, queue=queued("p"))
        child = enqueue("tests.step", {}, after=[parent])
        settle_now()
        assert status(child) == ("waiting", 1)
        assert Job.objects.get(pk=parent.pk).has_dependants is True
        finish(parent)
        assert status(child) == ("pending", 0)

    @pytest.mark.parametrize(
        ("outcome", "policy", "expected"),
        [
            ("completed", "cancel", "pending"),
            ("dead", "cancel", "cancelled"),
            ("dead", "run", "pending"),
        ],
    )
    def test_a_parent_finished_before_the_commit_is_settled_at_the_commit(
        self, outcome: str, policy: str, expected: str
    ) -> None:
        parent = enqueue("tests.step", {}, queue=queued("p"))
        finish(parent, outcome)
        child = enqueue(
            "tests.step",
            {},
            after=[str(parent.pk)],
            on_upstream_failure=policy,  # type: ignore[arg-type]
        )
        assert status(child) == ("waiting", 1)  # until the commit
        settle_now()
        assert status(child)[0] == expected

    def test_a_parent_gone_before_the_commit_fails_the_commit_with_its_name(self) -> None:
        parent = enqueue("tests.step", {})
        enqueue("tests.step", {}, after=[parent])
        Job.objects.filter(pk=parent.pk).delete()
        with pytest.raises(Exception, match=f"waits for job {parent.pk}, which no longer exists"):
            settle_now()

    def test_a_repeated_idempotency_key_returns_the_job_and_adds_no_edge(self) -> None:
        parent = enqueue("tests.step", {})
        first = enqueue("tests.step", {}, after=[parent], idempotency_key="once")
        again = enqueue("tests.step", {}, after=[parent], idempotency_key="once")
        assert again.pk == first.pk
        assert JobDependency.objects.count() == 1

    def test_an_empty_after_is_a_plain_job(self) -> None:
        assert enqueue("tests.step", {}, after=[]).status == "pending"


class TestWhatAStepReads:
    def test_ctx_reads_its_parents_results_by_step_name(self) -> None:
        jobs = order()
        finish(jobs["reserve"], result="reserved")
        finish(jobs["charge"], "dead")
        ctx = context(jobs["ship"])
        assert ctx.parent_results == {"reserve": "reserved"}
        assert ctx.parent_counts == {"completed": 1, "dead": 1, "cancelled": 0}
        assert [(p.key, p.status, p.error_code) for p in ctx.parents] == [
            ("charge", "dead", "boom"),
            ("reserve", "completed", None),
        ]

    def test_a_job_that_waited_for_none_has_no_parents(self) -> None:
        assert context(enqueue("tests.step", {})).parents == ()

    def test_a_parent_outside_any_workflow_is_keyed_by_its_id(self) -> None:
        parent = enqueue("tests.step", {}, queue=queued("p"))
        finish(parent, result="r")
        child = enqueue("tests.step", {}, after=[parent])
        assert context(child).parent_results == {str(parent.pk): "r"}


def context(job: Job) -> JobContext:
    logger = logging.LoggerAdapter(logging.getLogger("tests.workflows"))
    return JobContext(job.pk, job.job_type, 1, None, job.queue, logger)
