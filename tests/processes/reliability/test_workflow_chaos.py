"""Workflows drained under SIGKILL: each step starts after its parents completed, each completes
once, none stays waiting, and the dependants of a dead step are cancelled (issue 24).

Two worker processes drain random DAGs of ``tests.step`` jobs (3 to 15 steps in up to 6 layers,
each step after 1 to 5 steps of earlier layers; a step of about one DAG in twenty is told to fail
for good, a few steps run on an upstream failure; each sleeps up to 50 ms so that kills land
mid-step). Half the workflows are enqueued before the workers start, the rest while they run.
Every 1 to 2 s the test SIGKILLs one worker and starts another, until every step is settled; it
watches meanwhile that no step waits for nothing (``waiting_for`` 0 or less, or NULL). Then it
reads every step's row and its handler's starts (``testjobs_sideeffect``, by the database's
clock) and checks the rules of ``workflow_checker``. And no deadlock may have been detected in
the database (``pg_stat_database``) nor logged by a worker: with fan-in, two workers completing
parents of one child at once both settle it, and the triggers lock children in id order, as
every writer of jobs does; the steps are added in a random order, so that a child's id is as
often below its parents' as above.

``PGOUTBOX_LONG_TESTS=1`` adds a longer variant: more DAGs, more kills. transaction=True: the
workers are other processes.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection

from django_pgoutbox import workflow
from django_pgoutbox.models import Job, JobDependency
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, seed_or, wait_for
from tests.processes.reliability.workflow_checker import (
    UNSETTLED,
    StepRecord,
    check_workflow,
    lost_to_kills,
)

pytestmark = pytest.mark.django_db(transaction=True)

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
WORKERS = 2
CONCURRENCY = 4
SETTINGS = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.3}
#: Enqueued while the workers run, this many workflows at a time.
BATCH = 10
#: A line of a worker's log that speaks of a deadlock (SQLSTATE 40P01).
DEADLOCK = re.compile(r"deadlock|40P01", re.IGNORECASE)


@dataclass(frozen=True)
class Variant:
    dags: int
    #: seconds between two SIGKILLs (drawn at random in this range)
    kill_every: tuple[float, float]
    #: seconds (scaled) for every step to settle
    deadline: float


FAST = Variant(dags=200, kill_every=(1.0, 2.0), deadline=120)
#: A kill every 0.7 to 1.5 s: more often, and a replacement spends a good part of it starting.
LONG_RUN = Variant(dags=1000, kill_every=(0.7, 1.5), deadline=600)


@dataclass(frozen=True)
class PlannedStep:
    name: str
    parents: tuple[str, ...]
    policy: str
    fail: bool
    sleep: float


def random_dag(rng: random.Random) -> list[PlannedStep]:
    """3 to 15 steps in 2 to 6 layers, in the order they are added; each step of a later layer
    runs after one of the layer before and up to 4 more of any earlier one. About one DAG in
    twenty has a step told to fail (one with dependants, when it can); about one step in twelve
    runs on an upstream failure."""
    size = rng.randint(3, 15)
    depth = rng.randint(2, min(6, size))
    layer_sizes = [1] * depth
    for _ in range(size - depth):
        layer_sizes[rng.randrange(depth)] += 1
    layers: list[list[str]] = []
    parents_of: dict[str, tuple[str, ...]] = {}
    for index, count in enumerate(layer_sizes):
        layer = [f"L{index}s{n}" for n in range(count)]
        for name in layer:
            if not layers:
                parents_of[name] = ()
                continue
            earlier = [p for previous in layers for p in previous if p not in layers[-1]]
            first = rng.choice(layers[-1])
            others = [p for p in layers[-1] if p != first] + earlier
            parents_of[name] = (first, *rng.sample(others, rng.randint(0, min(4, len(others)))))
        layers.append(layer)
    names = [name for layer in layers for name in layer]
    failing: str | None = None
    if rng.random() < 0.05:
        with_dependants = sorted({p for parents in parents_of.values() for p in parents})
        failing = rng.choice(with_dependants or names)
    # In a random order, a step naming parents added after it too: its id is then as often below
    # its parents' as above, and the triggers' order of locks is tried both ways.
    return [
        PlannedStep(
            name,
            parents_of[name],
            "run" if parents_of[name] and rng.random() < 0.08 else "cancel",
            name == failing,
            round(rng.uniform(0, 0.05), 3),
        )
        for name in rng.sample(names, len(names))
    ]


def enqueue_dag(index: int, plan: list[PlannedStep]) -> uuid.UUID:
    flow = workflow(f"chaos-{index}")
    for s in plan:
        flow.add(
            "tests.step",
            {"name": s.name, "sleep": s.sleep, "fail": s.fail},
            name=s.name,
            after=list(s.parents),
            on_upstream_failure="run" if s.policy == "run" else "cancel",
        )
    return flow.enqueue().id


def test_random_workflows_under_sigkill(start_worker: Any) -> None:
    run_chaos(start_worker, FAST, seed_or(20261224))


@pytest.mark.skipif(not LONG, reason="the long variant: PGOUTBOX_LONG_TESTS=1")
def test_random_workflows_under_sigkill_long(start_worker: Any) -> None:
    run_chaos(start_worker, LONG_RUN, seed_or(20261225))


def run_chaos(start_worker: Any, variant: Variant, seed: int) -> None:
    rng = random.Random(seed)
    deadlocks_before = _deadlocks_detected()
    plans = [random_dag(rng) for _ in range(variant.dags)]
    flows: dict[uuid.UUID, list[PlannedStep]] = {}
    began = time.monotonic()
    half = variant.dags // 2
    for index in range(half):
        flows[enqueue_dag(index, plans[index])] = plans[index]
    later = list(range(half, variant.dags))

    spawned = 0

    def spawn() -> Any:
        nonlocal spawned
        spawned += 1
        return start_worker(
            "--queues",
            "default",
            "--concurrency",
            str(CONCURRENCY),
            "--worker-id",
            f"workflow-chaos-{spawned}",
            **SETTINGS,
        )

    workers = [spawn() for _ in range(WORKERS)]
    every_worker = list(workers)
    kills = 0
    stuck: list[str] = []
    deadline = time.monotonic() + scaled(variant.deadline)
    next_kill = time.monotonic() + rng.uniform(*variant.kill_every)
    while True:
        if later:
            for index in later[:BATCH]:
                flows[enqueue_dag(index, plans[index])] = plans[index]
            del later[:BATCH]
        stuck.extend(_waiting_for_nothing())
        if not later and not _unsettled():
            break
        assert time.monotonic() < deadline, (
            f"after {scaled(variant.deadline):g} s and {kills} kills, still unsettled:"
            f" {_unsettled_counts()}"
        )
        if time.monotonic() >= next_kill:
            victim = rng.randrange(WORKERS)
            workers[victim].kill()
            workers[victim] = spawn()
            every_worker.append(workers[victim])
            kills += 1
            next_kill = time.monotonic() + rng.uniform(*variant.kill_every)
        time.sleep(0.1)
    drained = time.monotonic() - began

    def workers_up() -> bool:
        """every worker is past its start (SIGTERM before its handler is set would kill it)"""
        return all(w.listening() for w in workers)

    wait_for(workers_up, timeout=30)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0

    records = _read_steps(flows)
    breaches = [
        f"workflow {flow_id}: {breach}"
        for flow_id, steps in records.items()
        for breach in check_workflow(steps)
    ]
    _check_edges(flows)
    logged = [
        line for w in every_worker for line in w.output().splitlines() if DEADLOCK.search(line)
    ]
    deadlocks = _deadlocks_detected() - deadlocks_before
    steps = [s for flow in records.values() for s in flow.values()]
    statuses = Counter(s.status for s in steps)
    extra_starts = sum(max(len(s.starts) - 1, 0) for s in steps)
    print(
        f"\nseed {seed}: {len(records)} workflows, {len(steps)} steps, drained in {drained:.1f} s"
        f" under {kills} SIGKILLs; {dict(statuses)};"
        f" {sum(1 for s in steps if s.policy == 'run')} declared to run on an upstream failure,"
        f" {sum(1 for s in steps if s.told_to_fail)} told to fail,"
        f" {sum(1 for s in steps if lost_to_kills(s))} lost to kills;"
        f" {extra_starts} starts repeated; {deadlocks} deadlocks detected"
        f" ({len(logged)} lines of the logs say so)"
    )
    assert stuck == []
    assert breaches == [], "\n".join(breaches[:50])
    assert (deadlocks, logged) == (0, []), "\n".join(logged[:20])
    # A repeated start is an attempt in flight when its worker died: at most its threads' worth,
    # and as many more for leases lost to a stall of the loaded machine.
    assert extra_starts <= (kills + 1) * CONCURRENCY


def _deadlocks_detected() -> int:
    """The server's count of deadlocks detected in this database (the ended backends' included:
    a backend's statistics are sent before it exits)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _unsettled() -> bool:
    return Job.objects.filter(status__in=UNSETTLED).exists()


def _unsettled_counts() -> dict[str, int]:
    rows = Job.objects.filter(status__in=UNSETTLED).values_list("status", flat=True)
    return dict(Counter(rows))


def _waiting_for_nothing() -> list[str]:
    """Steps that wait for nothing or for fewer than none: stuck, or settled once too often."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, status, waiting_for FROM jobs"
            " WHERE waiting_for < 0 OR ((status = 'waiting') IS TRUE"
            "                           AND (waiting_for IS NULL OR waiting_for <= 0))"
        )
        return [f"{row[0]} {row[1]} waiting_for {row[2]}" for row in cursor.fetchall()]


def _read_steps(
    flows: dict[uuid.UUID, list[PlannedStep]],
) -> dict[uuid.UUID, dict[str, StepRecord]]:
    rows = Job.objects.filter(workflow_id__in=list(flows)).values(
        "id",
        "workflow_id",
        "step",
        "status",
        "attempts",
        "max_attempts",
        "waiting_for",
        "last_error_code",
        "completed_at",
        "finished_at",
        "result",
    )
    by_key = {(row["workflow_id"], row["step"]): row for row in rows}
    starts: dict[uuid.UUID, list[tuple[int, Any]]] = defaultdict(list)
    for job_id, attempt, at in SideEffect.objects.filter(event="start").values_list(
        "job_id", "attempt", "at"
    ):
        starts[job_id].append((attempt, at))
    records: dict[uuid.UUID, dict[str, StepRecord]] = {}
    for flow_id, plan in flows.items():
        records[flow_id] = {}
        for s in plan:
            row = by_key[(flow_id, s.name)]
            records[flow_id][s.name] = StepRecord(
                parents=s.parents,
                policy=s.policy,
                told_to_fail=s.fail,
                status=row["status"],
                attempts=row["attempts"],
                max_attempts=row["max_attempts"],
                waiting_for=row["waiting_for"],
                last_error_code=row["last_error_code"],
                completed_at=row["completed_at"],
                finished_at=row["finished_at"],
                result=row["result"],
                starts=tuple(starts[row["id"]]),
            )
    return records


def _check_edges(flows: dict[uuid.UUID, list[PlannedStep]]) -> None:
    """The edges written are the plan's: the checker's parents are the ones the triggers used."""
    step_of = {
        job_id: (flow_id, name)
        for job_id, flow_id, name in Job.objects.filter(workflow_id__in=list(flows)).values_list(
            "id", "workflow_id", "step"
        )
    }
    written = {
        (*step_of[child], step_of[parent][1])
        for parent, child in JobDependency.objects.filter(child_id__in=list(step_of)).values_list(
            "parent_id", "child_id"
        )
    }
    planned = {
        (flow_id, s.name, p) for flow_id, plan in flows.items() for s in plan for p in s.parents
    }
    assert written == planned
