"""A workflow's page, read and laid out: its steps and edges (bounded), their timings, the
graph's boxes; a summary of states; and the Workflow section of a job's page. The admin's views
(``admin.workflows``) show them."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db import connections, router
from django.http import (
    HttpRequest,
)
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from django_pgoutbox import queries
from django_pgoutbox.admin.graph import Box, first_by_layer, layers, ordered_columns, svg
from django_pgoutbox.models import FINISHED_STATUSES, Job, JobStatus, Workflow

#: The most steps and edges that a workflow's page reads, in the order they were enqueued.
READ_STEPS = 10_000
READ_EDGES = 50_000
#: The most steps of a workflow bigger than that which its page counts by status.
COUNTED_STEPS = 100_000
#: The most steps that the graph draws and the table lists: the first by layer.
DRAWN_STEPS = 500
#: The most edges that the graph draws (a dense graph of 500 steps can have 100,000).
DRAWN_EDGES = 3_000
#: The most dead steps listed apart, beyond the table.
OTHER_DEAD = 100
#: Statuses in the order a summary gives them.
STATUS_ORDER = ("dead", "leased", "retrying", "pending", "waiting", "completed", "cancelled")


def summary(counts: dict[str, int]) -> str:
    return ", ".join(
        f"{counts[status]} {'running' if status == 'leased' else status}"
        for status in (*STATUS_ORDER, *sorted(set(counts) - set(STATUS_ORDER)))
        if counts.get(status)
    )


@dataclass
class StepRow:
    id: uuid.UUID
    name: str
    job_type: str
    queue: str
    status: str
    attempts: int
    max_attempts: int
    waiting_for: int | None
    run_at: datetime | None
    locked_at: datetime | None
    finished_at: datetime | None
    error_code: str | None
    url: str | None = None
    retry_url: str | None = None

    @property
    def started(self) -> str:
        """When its last attempt started."""
        return _utc(self.locked_at)

    @property
    def finished(self) -> str:
        return _utc(self.finished_at)


@dataclass
class WorkflowPage:
    steps_read: int
    more_steps: bool  # the workflow has more steps than were read
    edges_read: int
    more_edges: bool
    drawn: list[StepRow]
    graph: str
    edges_drawn: int
    edges_left_out: int
    counts: str
    counts_partial: bool
    unfinished: int
    circular: int
    gone: int  # steps that edges name and that are no longer kept (retention)
    external: list[tuple[uuid.UUID, str | None]]  # jobs outside the workflow that steps wait for
    other_dead: list[StepRow] = field(default_factory=list)


def read_page(workflow: Workflow, site: admin.AdminSite, request: HttpRequest) -> WorkflowPage:
    alias = router.db_for_read(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(queries.WORKFLOW_STEPS, [workflow.pk, READ_STEPS + 1])
        fetched = cursor.fetchall()
        cursor.execute(queries.WORKFLOW_EDGES, [workflow.pk, READ_EDGES + 1])
        edge_rows = cursor.fetchall()
    more_steps = len(fetched) > READ_STEPS
    more_edges = len(edge_rows) > READ_EDGES
    steps = [StepRow(*row) for row in fetched[:READ_STEPS]]
    for row in steps:
        row.name = row.name if row.name is not None else str(row.id)
    # Laid out by index: a UUID's hash is computed in Python, and the layout hashes each
    # step and edge many times (most of the page's time at 10,000 steps, when keyed by id).
    index = {row.id: number for number, row in enumerate(steps)}
    edges: list[tuple[int, int]] = []
    external_ids: set[uuid.UUID] = set()
    gone: set[uuid.UUID] = set()
    for parent, child, external in edge_rows[:READ_EDGES]:
        if child not in index:  # a step past the first READ_STEPS
            continue
        if parent in index:
            edges.append((index[parent], index[child]))
        elif external:
            external_ids.add(parent)
        else:
            gone.add(parent)
    numbers = list(range(len(steps)))
    found = layers(numbers, edges)
    drawn_numbers = first_by_layer(numbers, found, DRAWN_STEPS)
    drawn_set = set(drawn_numbers)
    drawn_edges = [(p, c) for p, c in edges if p in drawn_set and c in drawn_set]
    columns = ordered_columns(drawn_numbers, found, drawn_edges)

    job_url, retry_url = _url_makers(site, request, workflow)
    now = timezone.now()
    other_dead = [
        row
        for number, row in enumerate(steps)
        if row.status == JobStatus.DEAD and number not in drawn_set
    ][:OTHER_DEAD]
    for row in [*(steps[number] for number in drawn_numbers), *other_dead]:
        row.url = job_url(row.id)
        if row.status == JobStatus.DEAD:
            row.retry_url = retry_url(row.id)
    boxes = {
        number: Box(
            name=steps[number].name,
            job_type=steps[number].job_type,
            status=steps[number].status,
            attempts=steps[number].attempts,
            max_attempts=steps[number].max_attempts,
            timing=_timing(steps[number], now),
            url=steps[number].url,
        )
        for number in drawn_numbers
    }
    graph = svg(columns, boxes, drawn_edges[:DRAWN_EDGES])
    drawn = [steps[number] for column in columns for number in column]
    status_counts = Counter(row.status for row in steps)
    counts_partial = False
    if more_steps:
        with connections[alias].cursor() as cursor:
            cursor.execute(queries.WORKFLOW_STATES, [[workflow.pk], COUNTED_STEPS])
            status_counts = Counter({status: count for _, status, count in cursor.fetchall()})
        counts_partial = sum(status_counts.values()) >= COUNTED_STEPS
    external = _external(alias, sorted(external_ids)[:20])
    return WorkflowPage(
        steps_read=len(steps),
        more_steps=more_steps,
        edges_read=len(edges),
        more_edges=more_edges,
        drawn=drawn,
        graph=graph,
        edges_drawn=min(len(drawn_edges), DRAWN_EDGES),
        edges_left_out=max(0, len(drawn_edges) - DRAWN_EDGES),
        counts=summary(dict(status_counts)) or "no step kept",
        counts_partial=counts_partial,
        unfinished=sum(n for s, n in status_counts.items() if s not in FINISHED_STATUSES),
        circular=len(found.circular),
        gone=len(gone),
        external=external,
        other_dead=other_dead,
    )


def _external(alias: str, ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, str | None]]:
    """The jobs outside the workflow that its steps wait for, with their statuses (None: no
    longer kept)."""
    if not ids:
        return []
    statuses = dict(Job._base_manager.using(alias).filter(pk__in=ids).values_list("pk", "status"))
    return [(job_id, statuses.get(job_id)) for job_id in ids]


def _url_makers(
    site: admin.AdminSite, request: HttpRequest, workflow: Workflow
) -> tuple[Callable[[uuid.UUID], str | None], Callable[[uuid.UUID], str]]:
    """Each URL made once and completed per step: a reverse() per step was most of the
    page's time at a few hundred steps."""
    job_admin = site._registry.get(Job)
    job = reverse("admin:pgoutbox_job_change", args=["ID"]).split("ID")
    retry = reverse("admin:pgoutbox_workflow_retry", args=[quote(workflow.pk), "ID"]).split("ID")
    linked = job_admin is not None and job_admin.has_view_permission(request)

    def job_url(step_id: uuid.UUID) -> str | None:
        return f"{job[0]}{step_id}{job[1]}" if linked else None

    def retry_url(step_id: uuid.UUID) -> str:
        return f"{retry[0]}{step_id}{retry[1]}"

    return job_url, retry_url


def _duration(delta: timedelta) -> str:
    seconds = max(0.0, delta.total_seconds())
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, second = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {second} s"
    hours, minute = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minute} min"
    return f"{hours // 24} d {hours % 24} h"


def _clock(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%m-%d %H:%M:%S")


def _timing(row: StepRow, now: datetime) -> str:
    """A box's last line: how long it ran, runs or waits."""
    if row.status in FINISHED_STATUSES:
        if row.finished_at is None:
            return "finished"
        if row.locked_at is not None and row.locked_at <= row.finished_at:
            return f"ran {_duration(row.finished_at - row.locked_at)}, {_clock(row.finished_at)}"
        return f"ended {_clock(row.finished_at)} UTC"
    if row.status == JobStatus.LEASED and row.locked_at is not None:
        return f"running for {_duration(now - row.locked_at)}"
    if row.status == JobStatus.WAITING:
        return f"waits for {row.waiting_for or 0} more"
    if row.run_at is not None:
        if row.run_at > now:
            return f"due in {_duration(row.run_at - now)}"
        return f"due for {_duration(now - row.run_at)}"
    return ""


def _utc(moment: datetime | None) -> str:
    return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


#: The most parents and children that a job's page lists.
SHOWN_RELATIVES = 20


def is_step(job: Job) -> bool:
    """Whether ``job`` has a workflow, parents or children: ``waiting_for`` is set on a job
    enqueued with parents (and stays, 0 once they finished), ``has_dependants`` on a parent."""
    return job.workflow_id is not None or bool(job.has_dependants) or job.waiting_for is not None


def workflow_link(site: admin.AdminSite, job: Job) -> str:
    """The job's workflow (a link, with its name) and its step's name."""
    if job.workflow_id is None:
        return "-"
    alias = job._state.db or router.db_for_read(Workflow)
    name = (
        Workflow._base_manager.using(alias)
        .filter(pk=job.workflow_id)
        .values_list("name", flat=True)
        .first()
    )
    if name is None:
        return format_html("{} (no longer kept), step {}", job.workflow_id, job.step or "-")
    url = reverse(f"{site.name}:pgoutbox_workflow_change", args=[quote(job.workflow_id)])
    return format_html('<a href="{}">{}</a>, step <strong>{}</strong>', url, name, job.step or "-")


def relatives(site: admin.AdminSite, job: Job, sql: str) -> str:
    """The job's parents or children (``sql``): the first ``SHOWN_RELATIVES``, each a link
    with its step (or job type) and status."""
    alias = job._state.db or router.db_for_read(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [job.pk, SHOWN_RELATIVES + 1])
        found = cursor.fetchall()
    if not found:
        return "-"
    url = reverse(f"{site.name}:pgoutbox_job_change", args=["ID"]).split("ID")
    lines = []
    for other, step, job_type, status, other_workflow in found[:SHOWN_RELATIVES]:
        if status is None:  # deleted by retention (no foreign key holds it)
            lines.append(format_html("<li>{} (no longer kept)</li>", other))
            continue
        outside = job.workflow_id is not None and other_workflow != job.workflow_id
        lines.append(
            format_html(
                '<li><a href="{}">{}</a> ({}{})</li>',
                f"{url[0]}{other}{url[1]}",
                step or job_type,
                status,
                ", outside the workflow" if outside else "",
            )
        )
    more: str = ""
    if len(found) > SHOWN_RELATIVES:
        more = format_html(
            "<li>and more{}</li>",
            ": the workflow's page shows them all" if job.workflow_id is not None else "",
        )
    return format_html(
        '<ul style="margin: 0; padding: 0">{}{}</ul>',
        format_html_join("", "{}", ((line,) for line in lines)),
        more,
    )
