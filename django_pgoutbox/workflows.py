"""Workflows: jobs that wait for others, enqueued in the caller's transaction.

``workflow(name)`` builds a graph of steps (``add()``, each naming the steps it runs after) and
``enqueue()`` writes it whole: the workflow's row, every step and every edge, in three
statements. ``chain(...)`` and ``group([...]).then(...)`` are builders made for you;
``enqueue(..., after=[...])`` makes one job wait for jobs already enqueued.

A step with parents is ``waiting``. The end of its last parent makes it ``pending`` in the
transaction that writes that end (the triggers of migration 0016), and wakes its queue. A parent
that ends ``dead`` or ``cancelled`` cancels its waiting dependants (``upstream_failed``), and
theirs, except steps declared ``on_upstream_failure="run"``, which count it as finished. Retrying
the dead parent puts the steps it cancelled back to waiting.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import transaction

from django_pgoutbox import queries
from django_pgoutbox.conf import PgOutboxSettings, get_settings
from django_pgoutbox.db import server_side_cursor, tables_required
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.ids import uuid7
from django_pgoutbox.job_rows import JobRow, job_database, validate_job
from django_pgoutbox.models import Job, Workflow
from django_pgoutbox.registry import Payload
from django_pgoutbox.tracing import current_context
from django_pgoutbox.validation import check_text, optional_uuid, short_repr
from django_pgoutbox.workflow_rows import PlacedStep, check_parents, write_steps

#: What a step does when a job it waits for ends dead or cancelled.
UpstreamFailure = Literal["cancel", "run"]
UPSTREAM_FAILURE_CHOICES: tuple[str, ...] = ("cancel", "run")

#: The longest step name, in bytes (UTF-8).
MAX_STEP_NAME_BYTES = 200


@dataclass(frozen=True)
class StepSpec:
    """A job to run as a step, not yet placed in a workflow: ``step()`` makes one, for
    ``chain()`` and ``group()``."""

    job_type: str
    payload: Payload
    name: str | None = None
    on_upstream_failure: UpstreamFailure = "cancel"
    options: Mapping[str, Any] = field(default_factory=dict)


def step(
    job_type: str,
    payload: Payload,
    *,
    name: str | None = None,
    on_upstream_failure: UpstreamFailure = "cancel",
    priority: int | None = None,
    run_at: datetime | timedelta | None = None,
    queue: str | None = None,
) -> StepSpec:
    """A step for ``chain()`` or ``group()``: a job type, its payload and ``enqueue()``'s
    options. ``name`` is the step's name in its workflow (default: its job type, numbered if it
    repeats)."""
    return StepSpec(
        job_type,
        payload,
        name,
        on_upstream_failure,
        {"priority": priority, "run_at": run_at, "queue": queue},
    )


@dataclass(eq=False)
class Step:
    """A step added to a workflow: pass it in a later step's ``after``. After ``enqueue()``,
    ``job`` is its job."""

    workflow: WorkflowBuilder = field(repr=False)
    name: str
    spec: StepSpec
    after: tuple[Step | str | uuid.UUID | Job, ...]
    job: Job | None = None


#: A step's parent as ``add()`` takes it: a step of the same workflow (or its name), or a job
#: enqueued before (a ``Job`` or its id).
Parent = Step | str | uuid.UUID | Job


class WorkflowBuilder:
    """The steps of a workflow and what each runs after; ``enqueue()`` writes them."""

    def __init__(self, name: str, *, organization_id: uuid.UUID | str | None = None) -> None:
        self.name = check_text(_non_empty(name, "name"), "name", EnqueueError, MAX_STEP_NAME_BYTES)
        self.organization_id = optional_uuid(organization_id, "organization_id", EnqueueError)
        self.steps: list[Step] = []
        self._names: dict[str, Step] = {}
        self._numbers: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<WorkflowBuilder {self.name!r}: {len(self.steps)} steps>"

    def add(
        self,
        job_type: str,
        payload: Payload,
        *,
        name: str | None = None,
        after: Iterable[Parent] = (),
        on_upstream_failure: UpstreamFailure = "cancel",
        priority: int | None = None,
        run_at: datetime | timedelta | None = None,
        queue: str | None = None,
    ) -> Step:
        """Add a step that runs once every step (or job) of ``after`` completed; return it.

        ``after`` holds steps of this workflow (or their names) and jobs enqueued before (a
        ``Job`` or its id). ``on_upstream_failure="run"``: the step also runs when one of them
        ends dead or cancelled (a clean-up step); by default it is then cancelled.
        """
        spec = StepSpec(
            job_type,
            payload,
            name,
            on_upstream_failure,
            {"priority": priority, "run_at": run_at, "queue": queue},
        )
        return self._add(spec, after)

    def add_step(self, spec: StepSpec, *, after: Iterable[Parent] = ()) -> Step:
        """Add a ``step()`` made beforehand."""
        if not isinstance(spec, StepSpec):
            raise EnqueueError(
                "steps", f"must be made by step(job_type, payload, ...), not {short_repr(spec)}"
            )
        return self._add(spec, after)

    def _add(self, spec: StepSpec, after: Iterable[Parent]) -> Step:
        where = f"steps[{len(self.steps)}]"
        if spec.on_upstream_failure not in UPSTREAM_FAILURE_CHOICES:
            raise EnqueueError(
                f"{where}.on_upstream_failure",
                f"must be 'cancel' or 'run', not {short_repr(spec.on_upstream_failure)}",
            )
        name = spec.name
        if name is None:
            base = name = spec.job_type if isinstance(spec.job_type, str) else "step"
            # numbered from the last number given to this base: not a search from 1 each time
            number = self._numbers.get(base, 1)
            while name in self._names:
                number += 1
                name = f"{base}-{number}"
            self._numbers[base] = number
        name = check_text(
            _non_empty(name, f"{where}.name"), f"{where}.name", EnqueueError, MAX_STEP_NAME_BYTES
        )
        if name in self._names:
            raise EnqueueError(f"{where}.name", f"{name!r} names another step of this workflow")
        if isinstance(after, (str, bytes, Step, Job, uuid.UUID)) or not isinstance(after, Iterable):
            raise EnqueueError(f"{where}.after", f"must be a list, not {short_repr(after)}")
        added = Step(self, name, spec, tuple(after))
        self.steps.append(added)
        self._names[name] = added
        return added

    def enqueue(self, *, using: str | None = None) -> EnqueuedWorkflow:
        """Write the workflow, its steps and their edges in the caller's transaction.

        Every step is checked first, as ``enqueue()`` checks a job; a step naming an unknown
        step or job, or a cycle, refuses the whole workflow (``EnqueueError``) and nothing is
        written.
        """
        if not self.steps:
            raise EnqueueError("steps", "a workflow needs at least one step")
        alias = job_database(using)
        organization_id = self.organization_id
        conf = get_settings()
        undeclared: set[str] = set()  # one warning per undeclared job type, not per step
        rows = [
            _step_row(s.spec, f"steps[{index}]", organization_id, conf, undeclared)
            for index, s in enumerate(self.steps)
        ]
        trace_context = current_context()
        if trace_context is not None:
            for row in rows:
                row.trace_context = trace_context
        ids = {s.name: row.id for s, row in zip(self.steps, rows, strict=True)}
        edges: list[tuple[uuid.UUID, uuid.UUID, bool]] = []
        for index, (s, row) in enumerate(zip(self.steps, rows, strict=True)):
            for parent in _unique(_parent_ids(self, s, ids, f"steps[{index}].after")):
                parent_id, external = parent
                edges.append((parent_id, row.id, external))
        _refuse_cycles(self.steps, ids, edges)
        workflow_id = uuid7()
        steps = [
            PlacedStep(row, s.name, s.spec.on_upstream_failure == "run")
            for s, row in zip(self.steps, rows, strict=True)
        ]
        with tables_required(alias, EnqueueError):
            # Before the transaction block: a refusal leaves the caller's transaction usable.
            check_parents(alias, {p for p, _, external in edges if external}, "after")
        with tables_required(alias, EnqueueError), transaction.atomic(using=alias, savepoint=False):
            with server_side_cursor(alias) as cursor:
                step_ids = [s.row.id for s in steps]
                cursor.execute(
                    queries.INSERT_WORKFLOW,
                    [
                        workflow_id,
                        self.name,
                        organization_id,
                        len(steps),
                        min(step_ids),
                        max(step_ids),
                    ],
                )
                created_row = cursor.fetchone()
                assert created_row is not None
            jobs = write_steps(alias, steps, edges, workflow_id)
        for s, job in zip(self.steps, jobs, strict=True):
            s.job = job
        written = Workflow(
            id=workflow_id,
            name=self.name,
            organization_id=organization_id,
            steps=len(steps),
            first_step=min(step_ids),
            last_step=max(step_ids),
            created_at=created_row[0],
        )
        written._state.adding = False
        written._state.db = alias
        return EnqueuedWorkflow(
            written, {s.name: job for s, job in zip(self.steps, jobs, strict=True)}
        )


class Group(WorkflowBuilder):
    """``group([...])``: steps that run side by side; ``then()`` adds the step that runs once
    when all are finished, whatever their outcome."""

    def __init__(
        self,
        steps: Iterable[StepSpec],
        *,
        name: str = "group",
        organization_id: uuid.UUID | str | None = None,
    ) -> None:
        super().__init__(name, organization_id=organization_id)
        if isinstance(steps, (str, bytes, StepSpec)) or not isinstance(steps, Iterable):
            raise EnqueueError("steps", f"must be a list of step(...), not {short_repr(steps)}")
        self.members = [self.add_step(spec) for spec in steps]
        if not self.members:
            raise EnqueueError("steps", "a group needs at least one step")

    def then(self, callback: StepSpec) -> Group:
        """Run ``callback`` once every member finished (completed, dead or cancelled). Its
        handler reads the members' outcomes from ``ctx.parents`` (and ``ctx.parent_counts``,
        the number of each outcome); those that completed also in ``ctx.parent_results``."""
        if not isinstance(callback, StepSpec):
            raise EnqueueError(
                "callback", f"must be made by step(job_type, payload), not {short_repr(callback)}"
            )
        if any(s.after for s in self.steps):
            raise EnqueueError("callback", "this group already has a callback")
        runs = StepSpec(callback.job_type, callback.payload, callback.name, "run", callback.options)
        self._add(runs, list(self.members))
        return self


def workflow(name: str, *, organization_id: uuid.UUID | str | None = None) -> WorkflowBuilder:
    """A new workflow named ``name`` (the admin shows it): ``add()`` its steps, then
    ``enqueue()`` it. ``organization_id`` is every step's."""
    return WorkflowBuilder(name, organization_id=organization_id)


def chain(
    *steps: StepSpec, name: str = "chain", organization_id: uuid.UUID | str | None = None
) -> WorkflowBuilder:
    """Steps that run one after the other, each once the one before completed; ``enqueue()``
    it. A step that ends dead or cancelled cancels the rest."""
    builder = WorkflowBuilder(name, organization_id=organization_id)
    previous: Step | None = None
    for spec in steps:
        previous = builder.add_step(spec, after=[] if previous is None else [previous])
    if previous is None:
        raise EnqueueError("steps", "a chain needs at least one step")
    return builder


def group(
    steps: Iterable[StepSpec],
    *,
    name: str = "group",
    organization_id: uuid.UUID | str | None = None,
) -> Group:
    """Steps that run side by side; ``.then(step(...))`` adds a callback that runs once all are
    finished; ``enqueue()`` it."""
    return Group(steps, name=name, organization_id=organization_id)


@dataclass(frozen=True)
class EnqueuedWorkflow:
    """A workflow written by ``enqueue()``: its row and its steps' jobs, by step name."""

    workflow: Workflow
    jobs: dict[str, Job]

    @property
    def id(self) -> uuid.UUID:
        return self.workflow.id

    def __getitem__(self, step_name: str) -> Job:
        return self.jobs[step_name]


def enqueue_after(
    row: JobRow,
    after: Iterable[Any],
    on_upstream_failure: Any,
    using: str | None,
) -> Job:
    """``enqueue(..., after=...)``: one job that waits for jobs enqueued before it."""
    if on_upstream_failure not in UPSTREAM_FAILURE_CHOICES:
        raise EnqueueError(
            "on_upstream_failure",
            f"must be 'cancel' or 'run', not {short_repr(on_upstream_failure)}",
        )
    if isinstance(after, (str, bytes, Job, uuid.UUID)) or not isinstance(after, Iterable):
        raise EnqueueError("after", f"must be a list of jobs or job ids, not {short_repr(after)}")
    parents = sorted({_job_id(parent, "after") for parent in after})
    alias = job_database(using)
    with tables_required(alias, EnqueueError):
        # Before the transaction block: a refusal leaves the caller's transaction usable.
        check_parents(alias, set(parents), "after")
    with tables_required(alias, EnqueueError), transaction.atomic(using=alias, savepoint=False):
        placed = PlacedStep(row, None, on_upstream_failure == "run")
        return write_steps(alias, [placed], [(parent, row.id, True) for parent in parents], None)[0]


# -- checking --------------------------------------------------------------------------------


def _step_row(
    spec: StepSpec,
    where: str,
    organization_id: Any,
    conf: PgOutboxSettings,
    undeclared: set[str],
) -> JobRow:
    options = dict(spec.options)
    row = validate_job(
        spec.job_type,
        spec.payload,
        idempotency_key=None,
        organization_id=organization_id,
        priority=options.get("priority"),
        run_at=options.get("run_at"),
        queue=options.get("queue"),
        prefix=f"{where}.",
        conf=conf,
        undeclared_seen=undeclared,
    )
    if row.unique is not None:
        raise EnqueueError(
            f"{where}.job_type",
            f"{row.job_type!r} is unique (its @job): a workflow step cannot be "
            "(docs/uniqueness.md)",
        )
    return row


def _parent_ids(
    builder: WorkflowBuilder, child: Step, ids: Mapping[str, uuid.UUID], where: str
) -> Iterator[tuple[uuid.UUID, bool]]:
    """Each parent of ``child`` as (job id, whether it was enqueued before the workflow)."""
    for index, parent in enumerate(child.after):
        if isinstance(parent, Step):
            if parent.workflow is not builder or parent.name not in ids:
                raise EnqueueError(
                    f"{where}[{index}]", f"step {parent.name!r} is not a step of this workflow"
                )
            yield ids[parent.name], False
        elif isinstance(parent, str) and parent in ids:
            yield ids[parent], False
        elif isinstance(parent, str) and not _is_uuid(parent):
            raise EnqueueError(
                f"{where}[{index}]",
                f"{parent!r} names no step of this workflow (steps: "
                f"{', '.join(repr(name) for name in list(ids)[:10])})",
            )
        else:
            yield _job_id(parent, f"{where}[{index}]"), True


def _job_id(parent: Any, where: str) -> uuid.UUID:
    if isinstance(parent, Job):
        if parent.pk is None:
            raise EnqueueError(where, "is a Job that was never saved")
        return uuid.UUID(str(parent.pk))
    if isinstance(parent, uuid.UUID):
        return parent
    if isinstance(parent, str) and _is_uuid(parent):
        return uuid.UUID(parent)
    raise EnqueueError(where, f"must be a job, a job id or a step, not {short_repr(parent)}")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _unique(
    parents: Iterable[tuple[uuid.UUID, bool]],
) -> Iterator[tuple[uuid.UUID, bool]]:
    seen: set[uuid.UUID] = set()
    for parent_id, external in parents:
        if parent_id not in seen:
            seen.add(parent_id)
            yield parent_id, external


def _refuse_cycles(
    steps: Sequence[Step],
    ids: Mapping[str, uuid.UUID],
    edges: Sequence[tuple[uuid.UUID, uuid.UUID, bool]],
) -> None:
    """Refuse a graph whose steps wait for each other in a circle, naming one such circle."""
    names = {job_id: name for name, job_id in ids.items()}
    children: dict[uuid.UUID, list[uuid.UUID]] = {}
    waiting: dict[uuid.UUID, int] = dict.fromkeys(names, 0)
    for parent, child, external in edges:
        if not external:
            children.setdefault(parent, []).append(child)
            waiting[child] += 1
    ready = [job_id for job_id, count in waiting.items() if count == 0]
    done = 0
    while ready:
        job_id = ready.pop()
        done += 1
        for child in children.get(job_id, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if done == len(steps):
        return
    # A circle: from any step left, follow parents still waiting until one repeats.
    parents: dict[uuid.UUID, uuid.UUID] = {}
    for parent, child, external in edges:
        if not external and waiting[child] > 0 and waiting[parent] > 0:
            parents[child] = parent
    start = next(job_id for job_id, count in waiting.items() if count > 0 and job_id in parents)
    path = [start]
    while (following := parents[path[-1]]) not in path:
        path.append(following)
    circle = [*path[path.index(following) :], following]
    raise EnqueueError(
        "steps",
        "the steps wait for each other in a circle: "
        + " after ".join(repr(names[job_id]) for job_id in circle),
    )


def _non_empty(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise EnqueueError(where, f"must be a non-empty string, not {short_repr(value)}")
    return value
