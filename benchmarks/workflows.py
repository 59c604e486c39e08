"""Issue 24's scale requirements: a big workflow's enqueue, a release's cost, a drain of workflows.

    python benchmarks/workflows.py [--part enqueue release drain ceiling] [--steps 10000] [--runs 5]
        [--sizes 1000 100000] [--children 10] [--samples 30] [--workflows 1000]
        [--drain-runs 3] [--database NAME]

Runs on a fresh database of its own (``--database``, dropped and created again). Prints each
run and the medians.

- enqueue: ``workflow(...).enqueue()`` of ``--steps`` steps, three shapes: a chain, a fan-out
  (one root, every other step its child) and a random layered DAG (layers of 100 steps, each
  step after 1 to 5 steps of the layer before; seeded). Each run times the ``add()`` calls, then
  ``enqueue()`` and the commit; the database's part is the time spent inside the cursors'
  ``execute`` (an execute wrapper: round trip and server) plus the commit, the rest is Python.
- release: workflows of N steps (``--sizes``) made of parents with ``--children`` children each;
  ``--samples`` parents, chosen across the workflow, are leased and completed one at a time with
  the statement a worker sends (``RECORD_OUTCOMES``), timed on a connection of its own, beside a
  plain job's. ``EXPLAIN (ANALYZE)`` of the same statement for more parents gives the time of the
  statement trigger (the release) alone. Pending no-op jobs fill the table up to the largest N,
  so that only the workflow's size differs. The cost should not grow with N.
- drain: ``--workflows`` workflows of 10 steps (extract -> 3 transforms -> a load after each
  transform -> merge after the 3 loads -> report -> notify: 11 edges, 6 levels) against the plain
  drain of as many no-op jobs, alternated, each by one ``runworkers --burst`` process with default
  settings after a ``VACUUM ANALYZE``; the rate is the jobs over the time from the first claim to
  the last outcome (``min(locked_at)`` to ``max(finished_at)``), as in ``benchmarks/worker.py``.
- ceiling (not run by default): the same workflows and plain jobs completed by the statement a
  worker sends, ``RECORD_AND_CLAIM`` in batches of 100, in a loop on one connection with no
  worker (as ``benchmarks/ceiling.py``): PostgreSQL's part alone.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (
    completed_outcomes,
    drain_seconds,
    pending_noops,
    percentile,
    runworkers,
    setup_django,
    truncate,
)

if TYPE_CHECKING:
    from django_pgoutbox.workflows import Step, WorkflowBuilder

TABLES = ("jobs", "job_dependencies", "workflows")
JOB_TYPE = "tests.noop"
DAG_LAYER = 100
DAG_FAN_IN = 5
MEASURES = ("add", "enqueue")


# -- shapes -----------------------------------------------------------------------------------


def chain_shape(flow: WorkflowBuilder, steps: int) -> None:
    previous: Step | None = None
    for index in range(steps):
        previous = flow.add(
            JOB_TYPE, {}, name=f"s{index}", after=[] if previous is None else [previous]
        )


def fan_out_shape(flow: WorkflowBuilder, steps: int) -> None:
    root = flow.add(JOB_TYPE, {}, name="root")
    for index in range(1, steps):
        flow.add(JOB_TYPE, {}, name=f"s{index}", after=[root])


def dag_shape(flow: WorkflowBuilder, steps: int) -> None:
    """Layers of DAG_LAYER steps; each step after 1 to DAG_FAN_IN steps of the layer before."""
    pick = random.Random(24)
    layer: list[Step] = []
    for start in range(0, steps, DAG_LAYER):
        above = layer
        layer = []
        for index in range(start, min(steps, start + DAG_LAYER)):
            after = pick.sample(above, pick.randint(1, DAG_FAN_IN)) if above else []
            layer.append(flow.add(JOB_TYPE, {}, name=f"s{index}", after=after))


SHAPES: dict[str, Callable[[WorkflowBuilder, int], None]] = {
    "chain": chain_shape,
    "fan-out": fan_out_shape,
    "layered DAG": dag_shape,
}


def etl_shape(flow: WorkflowBuilder) -> None:
    """The drain's workflow: 10 steps, 11 edges, 6 levels."""
    extract = flow.add(JOB_TYPE, {}, name="extract")
    loads: list[Step] = []
    for part in range(3):
        transform = flow.add(JOB_TYPE, {"part": part}, name=f"transform-{part}", after=[extract])
        loads.append(flow.add(JOB_TYPE, {"part": part}, name=f"load-{part}", after=[transform]))
    merge = flow.add(JOB_TYPE, {}, name="merge", after=loads)
    report = flow.add(JOB_TYPE, {}, name="report", after=[merge])
    flow.add(JOB_TYPE, {}, name="notify", after=[report])


# -- enqueue ----------------------------------------------------------------------------------


@contextmanager
def statement_clock(spent: list[float]) -> Iterator[None]:
    """Add to ``spent[0]`` the seconds spent inside the default connection's ``execute``."""
    from django.db import connection

    def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent[0] += time.perf_counter() - started

    with connection.execute_wrapper(timed):
        yield


def enqueue_once(shape: Callable[[WorkflowBuilder, int], None], steps: int) -> dict[str, float]:
    from django.db import connection, transaction

    from django_pgoutbox import workflow

    truncate(*TABLES)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs, job_dependencies, workflows")
    started = time.perf_counter()
    flow = workflow("bench")
    shape(flow, steps)
    built = time.perf_counter()
    spent = [0.0]
    with statement_clock(spent):
        with transaction.atomic():
            flow.enqueue()
            written = time.perf_counter()
        committed = time.perf_counter()
    return {
        "add": built - started,
        "enqueue": committed - built,
        "database": spent[0] + committed - written,
        "python": (committed - built) - (spent[0] + committed - written),
        "edges": float(sum(len(s.after) for s in flow.steps)),
    }


def enqueue_part(steps: int, runs: int) -> None:
    print(f"enqueue of a workflow of {steps:,} steps (ms; median of {runs} runs)")
    for label, shape in SHAPES.items():
        rows = [enqueue_once(shape, steps) for _ in range(runs)]
        medians = {key: statistics.median(r[key] for r in rows) * 1000 for key in MEASURES}
        database = statistics.median(r["database"] for r in rows) * 1000
        python = statistics.median(r["python"] for r in rows) * 1000
        print(
            f"  {label:<12} {int(rows[0]['edges']):>6,} edges: enqueue() + commit "
            f"{medians['enqueue']:7.1f} (Python {python:6.1f}, database {database:6.1f}); "
            f"add() calls {medians['add']:6.1f}; enqueue() runs: "
            + ", ".join(f"{r['enqueue'] * 1000:.1f}" for r in rows)
        )


# -- release ----------------------------------------------------------------------------------


def release_part(sizes: list[int], children: int, samples: int) -> None:
    import psycopg
    from django.db import connection, transaction

    from django_pgoutbox import enqueue, enqueue_many, queries, workflow
    from django_pgoutbox.db import dispatcher_connection_params
    from django_pgoutbox.models import Job

    record = queries.binary(queries.RECORD_OUTCOMES)
    lease = (
        "UPDATE jobs SET status = 'leased', locked_by = 'w', locked_at = now(),"
        " lease_expires_at = now() + interval '1 minute', attempts = attempts + 1"
        " WHERE id = ANY(%s) AND status IN ('pending', 'retrying') RETURNING id, attempts"
    )
    print(f"release: complete one parent of {children} children, by workflow size (ms)")
    for size in sizes:
        truncate(*TABLES)
        flow = workflow("release")
        parents = []
        for unit in range(size // (children + 1)):
            parent = flow.add(JOB_TYPE, {}, name=f"p{unit}")
            parents.append(parent)
            for child in range(children):
                flow.add(JOB_TYPE, {}, name=f"p{unit}c{child}", after=[parent])
        with transaction.atomic():
            written = flow.enqueue()
        plain = [enqueue(JOB_TYPE, {}).pk for _ in range(2 * samples)]
        # the same table for every size: other jobs make up the difference
        for start in range(len(flow.steps), max(sizes), 100_000):
            padding = min(100_000, max(sizes) - start)
            enqueue_many([{"job_type": JOB_TYPE, "payload": {}}] * padding)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE jobs, job_dependencies, workflows")
        stride = max(1, len(parents) // (2 * samples))
        chosen = [written[p.name].pk for p in parents[::stride]][: 2 * samples]
        timed_parents, explained_parents = chosen[:samples], chosen[samples:]
        params = dispatcher_connection_params("default")
        with psycopg.connect(**params, autocommit=True) as db:

            def complete(job_id: Any, explain: bool) -> float:
                (row,) = db.execute(lease, [[job_id]]).fetchall()
                values = {**completed_outcomes([row[0]], [row[1]]), "worker_id": "w"}
                if explain:
                    plan = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + record, values)
                    (document,) = plan.fetchone()  # type: ignore[misc]
                    triggers = document[0].get("Triggers", [])
                    return float(
                        sum(t["Time"] for t in triggers if t["Trigger Name"] == "jobs_settle_noted")
                    )
                started = time.perf_counter()
                db.execute(record, values, prepare=True).fetchall()
                return (time.perf_counter() - started) * 1000

            # alternated: a plain job, then a parent, so that both meet the same load
            parent_ms, plain_ms = [], []
            for parent_id, plain_id in zip(timed_parents, plain, strict=False):
                plain_ms.append(complete(plain_id, explain=False))
                parent_ms.append(complete(parent_id, explain=False))
            trigger_ms = [complete(job_id, explain=True) for job_id in explained_parents]
        released = Job.objects.filter(
            workflow_id=written.id, status="pending", step__contains="c"
        ).count()
        assert released == len(chosen) * children, (released, len(chosen) * children)
        print(
            f"  {size:>7,} steps: RECORD_OUTCOMES of a parent median "
            f"{statistics.median(parent_ms):.3f} (p90 {percentile(parent_ms, 0.9):.3f}), "
            f"of a plain job "
            f"{statistics.median(plain_ms):.3f}; the release trigger alone (EXPLAIN ANALYZE) "
            f"median {statistics.median(trigger_ms):.3f} over {len(trigger_ms)} parents"
        )


# -- drain ------------------------------------------------------------------------------------


def workflow_steps(count: int) -> int:
    from django.db import connection, transaction

    from django_pgoutbox import workflow

    truncate(*TABLES)
    started = time.perf_counter()
    for start in range(0, count, 100):
        with transaction.atomic():
            for _ in range(start, min(count, start + 100)):
                flow = workflow("etl")
                etl_shape(flow)
                flow.enqueue()
    enqueued = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs, job_dependencies, workflows")
        cursor.execute("SELECT count(*) FROM jobs")
        (jobs,) = cursor.fetchone()
    print(f"    ({count:,} workflows enqueued in {enqueued:.2f} s)", flush=True)
    return int(jobs)


def drain_once(jobs: int) -> float:
    worker = runworkers("--roles", "jobs", "--burst", "--queues", "default")
    worker.wait()
    return jobs / drain_seconds(jobs)


def drain_part(count: int, runs: int) -> None:
    jobs = count * 10
    print(f"drain: {count:,} workflows of 10 steps against {jobs:,} plain no-op jobs (jobs/s)")
    plain, flows = [], []
    for run in range(1, runs + 1):
        truncate(*TABLES)
        pending_noops(jobs)
        plain.append(drain_once(jobs))
        flows.append(drain_once(workflow_steps(count)))
        print(f"  pair {run}: plain {plain[-1]:,.0f}, workflows {flows[-1]:,.0f}", flush=True)
    ratio = statistics.median(flows) / statistics.median(plain)
    print(
        f"  medians: plain {statistics.median(plain):,.0f}, workflows "
        f"{statistics.median(flows):,.0f} ({ratio:.0%} of plain); paired ratios "
        + ", ".join(f"{f / p:.0%}" for p, f in zip(plain, flows, strict=True))
    )


# -- ceiling ----------------------------------------------------------------------------------


UNFINISHED = "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('waiting', 'pending'))"


def statement_loop(batch: int = 100) -> float:
    """Seconds to complete every job of the table with the statement a worker's dispatcher sends
    (``RECORD_AND_CLAIM``: the last batch's outcomes, the next batch claimed), in a loop on one
    connection, no worker."""
    import psycopg

    from django_pgoutbox import queries
    from django_pgoutbox.db import dispatcher_connection_params

    claimed: list[Any] = []
    with psycopg.connect(**dispatcher_connection_params("default"), autocommit=True) as conn:
        started = time.perf_counter()
        while True:
            params = completed_outcomes([row[1] for row in claimed], [row[4] for row in claimed])
            params |= {"worker_id": "ceiling", "queue": "default", "limit": batch, "lease": 60.0}
            rows = conn.execute(queries.RECORD_AND_CLAIM, params).fetchall()
            claimed = [row for row in rows if row[0]]
            # the children that a statement's outcomes release are claimed by the next one
            if not claimed and conn.execute(UNFINISHED).fetchone() == (False,):
                return time.perf_counter() - started


def ceiling_part(count: int, runs: int) -> None:
    from django.db import connection

    jobs = count * 10
    print(
        f"ceiling: {count:,} workflows of 10 steps against {jobs:,} plain no-op jobs, "
        "RECORD_AND_CLAIM in batches of 100 on one connection (jobs/s)"
    )
    plain, flows = [], []
    for run in range(1, runs + 1):
        truncate(*TABLES)
        pending_noops(jobs)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE jobs")
        plain.append(jobs / statement_loop())
        flows.append(workflow_steps(count) / statement_loop())
        print(f"  pair {run}: plain {plain[-1]:,.0f}, workflows {flows[-1]:,.0f}", flush=True)
    ratio = statistics.median(flows) / statistics.median(plain)
    print(
        f"  medians: plain {statistics.median(plain):,.0f}, workflows "
        f"{statistics.median(flows):,.0f} ({ratio:.0%} of plain)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--part",
        nargs="+",
        choices=["enqueue", "release", "drain", "ceiling"],
        default=["enqueue", "release", "drain"],
    )
    parser.add_argument("--steps", type=int, default=10_000, help="steps of the enqueued workflow")
    parser.add_argument("--runs", type=int, default=5, help="enqueue runs per shape")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000])
    parser.add_argument("--children", type=int, default=10, help="children of each parent")
    parser.add_argument("--samples", type=int, default=30, help="parents completed per size")
    parser.add_argument("--workflows", type=int, default=1_000)
    parser.add_argument("--drain-runs", type=int, default=3, help="pairs of drains")
    parser.add_argument("--database", default="pgoutbox_bench_workflows")
    args = parser.parse_args()
    setup_django(args.database)
    if "enqueue" in args.part:
        enqueue_part(args.steps, args.runs)
    if "release" in args.part:
        release_part(args.sizes, args.children, args.samples)
    if "drain" in args.part:
        drain_part(args.workflows, args.drain_runs)
    if "ceiling" in args.part:
        ceiling_part(args.workflows, args.drain_runs)


if __name__ == "__main__":
    main()
