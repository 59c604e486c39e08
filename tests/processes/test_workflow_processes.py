"""Workflows drained by a real ``runworkers`` process: an innocent workflow beside one whose
step returns a poison result, in the same batches; a group's callback; and releases that do not
wait for a poll (the workers' poll interval is longer than the whole test's deadline).

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_pgoutbox import group, step, workflow
from django_pgoutbox.models import Job
from testproject.testjobs.models import SideEffect
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Longer than every wait below: a step released by a poll would fail the test.
SLOW_POLL = {"POLL_INTERVAL": 60, "LEASE_SECONDS": 5}


def steps_of(workflow_id: Any) -> dict[str, Job]:
    return {str(job.step): job for job in Job.objects.filter(workflow_id=workflow_id)}


def order(name: str, poisoned: bool) -> Any:
    flow = workflow(name)
    reserve = flow.add("tests.step", {"name": "reserve"}, name="reserve")
    if poisoned:  # returns what cannot be stored as JSON: its attempt's outcome is a failure
        charge = flow.add("tests.bad_result", {}, name="charge", after=[reserve])
    else:
        charge = flow.add("tests.step", {"name": "charge"}, name="charge", after=[reserve])
    pack = flow.add("tests.step", {"name": "pack"}, name="pack", after=[charge])
    label = flow.add("tests.step", {"name": "label"}, name="label", after=[charge])
    ship = flow.add("tests.step", {"name": "ship"}, name="ship", after=[pack, label, reserve])
    flow.add(
        "tests.step", {"name": "wrap_up"}, name="wrap_up", after=[ship], on_upstream_failure="run"
    )
    return flow.enqueue()


def test_a_poisoned_workflow_beside_an_innocent_one(start_worker: Any) -> None:
    innocent = order("innocent", poisoned=False)
    poisoned = order("poisoned", poisoned=True)
    start_worker("--queues", "default", "--concurrency", "4", **SLOW_POLL)

    def settled() -> bool:
        """both workflows ran to their end"""
        return not Job.objects.filter(status__in=["waiting", "pending", "leased", "retrying"])

    wait_for(settled, timeout=30)

    done = steps_of(innocent.id)
    assert {name: job.status for name, job in done.items()} == dict.fromkeys(done, "completed")
    assert done["ship"].result == {"name": "ship", "saw": ["label", "pack", "reserve"]}
    # each step started after every one of its parents completed (the database's clocks)
    starts = {
        row.job_id: row.at for row in SideEffect.objects.filter(event="start", attempt__gte=1)
    }
    for child, parents in {"charge": ["reserve"], "ship": ["pack", "label", "reserve"]}.items():
        for parent in parents:
            completed_at = done[parent].completed_at
            assert completed_at is not None
            assert starts[done[child].pk] > completed_at

    bad = steps_of(poisoned.id)
    assert bad["reserve"].status == "completed"
    assert bad["charge"].status == "dead"
    for name in ("pack", "label", "ship"):
        assert (bad[name].status, bad[name].last_error_code) == ("cancelled", "upstream_failed")
        assert bad[name].pk not in starts  # never ran
    assert bad["wrap_up"].status == "completed"
    assert bad["wrap_up"].result == {"name": "wrap_up", "saw": []}


def test_a_groups_callback_runs_once_with_its_members_outcomes(start_worker: Any) -> None:
    written = (
        group(
            [step("tests.step", {"name": f"m{i}", "fail": i == 2}) for i in range(5)],
            name="members",
        )
        .then(step("tests.group_done", {}, name="done"))
        .enqueue()
    )
    start_worker("--queues", "default", "--concurrency", "4", **SLOW_POLL)
    wait_for(lambda: Job.objects.filter(pk=written["done"].pk, status="completed").exists(), 30)
    done = Job.objects.get(pk=written["done"].pk)
    members = [job for name, job in written.jobs.items() if name != "done"]
    assert done.result == {
        "counts": {"completed": 4, "dead": 1, "cancelled": 0},
        "members": sorted(str(job.pk) for job in members),
    }
    assert SideEffect.objects.filter(job_id=done.pk).count() == 0  # group_done records nothing


def test_steps_handed_over_together_poison_and_innocent(start_worker: Any) -> None:
    """A root whose completion hands its children to the worker in the statement that writes it
    (RECORD_HANDOFF_AND_CLAIM): poison steps (an unprintable exception, a value JSON cannot
    hold, a hang past the timeout) and innocent ones, handed over together, each ending on its
    own: the innocent complete, each poison step with its named outcome, the process keeps on.
    Handed over, not released for a claim: a step's lease is taken in the statement that
    completed its parent (``locked_at``, its ``run_at`` too, is that statement's time)."""
    flow = workflow("handed")
    root = flow.add("tests.step", {"name": "root"}, name="root")
    innocent = [
        flow.add("tests.step", {"name": f"ok-{i}"}, name=f"ok-{i}", after=[root]) for i in range(4)
    ]
    flow.add("tests.poison_raise", {"kind": "unprintable"}, name="unprintable", after=[root])
    flow.add("tests.bad_result", {}, name="bad-result", after=[root])
    flow.add("tests.poison_hang", {"seconds": 3}, name="hang", after=[root])
    after = flow.add("tests.step", {"name": "after"}, name="after", after=innocent)
    written = flow.enqueue()
    start_worker("--queues", "default", "--concurrency", "8", **SLOW_POLL)

    def settled() -> bool:
        """every step ran (a retry waits for its time: the poll is a minute away)"""
        return not Job.objects.filter(
            workflow_id=written.id, status__in=["waiting", "pending", "leased"]
        ).exists()

    wait_for(settled, timeout=45)
    steps = steps_of(written.id)
    for name in [s.name for s in innocent] + [after.name]:
        job = steps[name]
        assert (job.status, job.attempts) == ("completed", 1), name
        assert job.locked_at == job.run_at, f"{name} was released, not handed over"
    assert steps["unprintable"].status == "retrying"
    assert steps["unprintable"].last_error_code == "_UnprintableError"
    assert steps["bad-result"].status == "dead"
    assert steps["hang"].status == "dead"
    assert steps["hang"].last_error_code == "timeout"
    assert steps["root"].locked_at != steps["ok-0"].locked_at
