"""Asserting what a test enqueued: ``assert_enqueued``, ``refute_enqueued``, ``enqueued_jobs``.

They read the ``jobs`` table through the test's connection, so they see the jobs enqueued in
the test's transaction (``TestCase``, pytest-django's ``db``) as committed ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.testing.running import JobType, database, job_type_name
from django_pgoutbox.validation import check_json, short_repr

#: The statuses of a job that is *enqueued*: waiting to run (a workflow's step whose parents
#: have not finished, a job due or scheduled, a job to be retried). ``status=`` overrides them.
ENQUEUED_STATUSES = ("waiting", "pending", "retrying")

#: How many jobs a failed assertion lists.
LISTED = 10


class _Anything:
    """The default of ``payload=`` and ``payload_contains=``: no condition on the payload."""

    def __repr__(self) -> str:
        return "any"


_ANY: Any = _Anything()


def enqueued_jobs(
    job_type: JobType | None = None,
    *,
    payload: dict[str, Any] = _ANY,
    payload_contains: dict[str, Any] = _ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = ENQUEUED_STATUSES,
    using: str | None = None,
    **fields: Any,
) -> list[Job]:
    """The jobs enqueued (by default: waiting, pending or retrying) that match, oldest first.

    ``job_type``: a name, the ``@job`` handler, or a ``django.tasks`` task (None: any).
    ``payload``: the payload is this dict exactly. ``payload_contains``: the payload holds these
    keys with these values, nested dicts and lists compared the same way (PostgreSQL's ``@>`` on
    jsonb). ``status``: a status, several, or None for any. Any other keyword is a filter on
    ``Job``, as the ORM takes it (``priority=5``, ``organization_id=...``,
    ``idempotency_key=...``, ``run_at__gt=...``, ``max_attempts=3``).
    """
    jobs = _matching(job_type, payload, payload_contains, queue, _statuses(status), using, fields)
    with transaction.atomic(using=jobs.db):
        return list(jobs)


def assert_enqueued(
    job_type: JobType | None = None,
    *,
    payload: dict[str, Any] = _ANY,
    payload_contains: dict[str, Any] = _ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = ENQUEUED_STATUSES,
    count: int | None = None,
    using: str | None = None,
    **fields: Any,
) -> Job:
    """Assert that a job matching these is enqueued (``count``: exactly that many); return the
    first one. The arguments are ``enqueued_jobs()``'s. On failure, the ``AssertionError`` says
    what was asked and lists the enqueued jobs nearest to it."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(
            f"count must be a positive number of jobs, not {count!r}: refute_enqueued() "
            "asserts that none is enqueued (len(enqueued_jobs(...)) counts any number)"
        )
    status = _statuses(status)
    jobs, found = _first(
        _matching(job_type, payload, payload_contains, queue, status, using, fields)
    )
    asked = _asked(job_type, payload, payload_contains, queue, status, fields)
    if count is not None and found != count:
        raise AssertionError(
            f"expected {count} job(s) enqueued matching {asked}, found {found}"
            + _listing(jobs, ":", total=found)
            + (_nearest(job_type, payload, payload_contains, queue, using) if not jobs else "")
        )
    if not jobs:
        raise AssertionError(
            f"expected a job enqueued matching {asked}, found none"
            + _nearest(job_type, payload, payload_contains, queue, using)
        )
    return jobs[0]


def refute_enqueued(
    job_type: JobType | None = None,
    *,
    payload: dict[str, Any] = _ANY,
    payload_contains: dict[str, Any] = _ANY,
    queue: str | None = None,
    status: str | Iterable[str] | None = ENQUEUED_STATUSES,
    using: str | None = None,
    **fields: Any,
) -> None:
    """Assert that no job matching these is enqueued (the arguments of ``enqueued_jobs()``;
    with none, that no job at all is)."""
    status = _statuses(status)
    jobs, found = _first(
        _matching(job_type, payload, payload_contains, queue, status, using, fields)
    )
    if jobs:
        asked = _asked(job_type, payload, payload_contains, queue, status, fields)
        raise AssertionError(
            f"expected no job enqueued matching {asked}, found {found}"
            + _listing(jobs, ":", total=found)
        )


def _first(jobs: QuerySet[Job]) -> tuple[list[Job], int]:
    """The first ``LISTED`` of ``jobs``, and how many there are: a table of thousands of
    jobs is counted, not read. In a savepoint: a filter PostgreSQL refuses (``**fields``) leaves
    the test's transaction usable."""
    with transaction.atomic(using=jobs.db):
        first = list(jobs[: LISTED + 1])
        if len(first) <= LISTED:
            return first, len(first)
        return first[:LISTED], jobs.count()


def _statuses(status: str | Iterable[str] | None) -> str | tuple[str, ...] | None:
    """``status`` checked against the statuses a job has: a misspelt one (``"complete"``,
    ``"running"``: a job being run is ``"leased"``) would match nothing, and make every
    ``refute_enqueued()`` given it pass."""
    if status is None:
        return None
    statuses = (status,) if isinstance(status, str) else tuple(status)
    unknown = [value for value in statuses if value not in JobStatus.values]
    if unknown:
        raise ValueError(
            f"no job has the status {', '.join(map(repr, unknown))}: a job's status is one of "
            f"{', '.join(JobStatus.values)}"
        )
    return status if isinstance(status, str) else statuses


def _matching(
    job_type: JobType | None,
    payload: Any,
    payload_contains: Any,
    queue: str | None,
    status: str | Iterable[str] | None,
    using: str | None,
    fields: dict[str, Any],
) -> QuerySet[Job]:
    jobs = Job.objects.using(database(using)).order_by("created_at", "id")
    if job_type is not None:
        jobs = jobs.filter(job_type=job_type_name(job_type))
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    if isinstance(status, str):
        jobs = jobs.filter(status=status)
    elif status is not None:
        jobs = jobs.filter(status__in=list(status))
    if payload is not _ANY:
        if not isinstance(payload, dict):
            raise TypeError(f"payload must be a dict, not {type(payload).__name__}")
        check_json(payload, "payload", InvalidInput)
        jobs = jobs.filter(payload=payload)
    if payload_contains is not _ANY:
        if not isinstance(payload_contains, dict):
            raise TypeError(
                f"payload_contains must be a dict, not {type(payload_contains).__name__}"
            )
        check_json(payload_contains, "payload_contains", InvalidInput)
        jobs = jobs.filter(payload__contains=payload_contains)
    return jobs.filter(**fields) if fields else jobs


def _asked(
    job_type: JobType | None,
    payload: Any,
    payload_contains: Any,
    queue: str | None,
    status: str | Iterable[str] | None,
    fields: dict[str, Any],
) -> str:
    parts = [] if job_type is None else [f"job_type={job_type_name(job_type)!r}"]
    if payload is not _ANY:
        parts.append(f"payload={short_repr(payload, 300)}")
    if payload_contains is not _ANY:
        parts.append(f"payload_contains={short_repr(payload_contains, 300)}")
    if queue is not None:
        parts.append(f"queue={queue!r}")
    if status is None:
        parts.append("status=any")
    else:
        parts.append(f"status={status!r}" if isinstance(status, str) else f"status in {status}")
    parts += [f"{key}={short_repr(value)}" for key, value in fields.items()]
    return "(" + ", ".join(parts) + ")"


def _nearest(
    job_type: JobType | None,
    payload: Any,
    payload_contains: Any,
    queue: str | None,
    using: str | None,
) -> str:
    """The jobs of the table nearest to what was asked, whatever their status: the same job
    type first, then the same queue, then the most payload keys in common; newest first."""
    name = None if job_type is None else job_type_name(job_type)
    wanted = {
        **(payload_contains if isinstance(payload_contains, dict) else {}),
        **(payload if isinstance(payload, dict) else {}),
    }
    candidates = list(
        Job.objects.using(database(using)).order_by("-created_at", "-id")[: LISTED * 20]
    )
    if not candidates:
        return "; no job at all is in the table"

    def nearness(job: Job) -> tuple[int, int, int]:
        same_keys = 0
        if isinstance(job.payload, dict):
            same_keys = sum(1 for key, value in wanted.items() if job.payload.get(key) == value)
        return (job.job_type == name, job.queue == queue, same_keys)

    nearest = sorted(candidates, key=nearness, reverse=True)  # stable: newest first among equals
    total = Job.objects.using(database(using)).count()
    among = (
        f"the {total:,} job(s) in the table"
        if total <= len(candidates)
        else f"the newest {len(candidates):,} of the {total:,} jobs in the table"
    )
    return _listing(nearest, f"; the nearest to it of {among}, in any status:", total=total)


def _listing(jobs: list[Job], heading: str, total: int | None = None) -> str:
    """The first ``LISTED`` of ``jobs``, and how many more of ``total`` (default: of ``jobs``)
    are not listed."""
    if not jobs:
        return ""
    lines = [heading]
    for job in jobs[:LISTED]:
        lines.append(
            f"  - {job.job_type} [{job.queue}] {job.status}, payload "
            f"{_payload_text(job.payload)}" + (f", priority {job.priority}" if job.priority else "")
        )
    total = len(jobs) if total is None else total
    if total > LISTED:
        lines.append(f"  ... and {total - LISTED:,} more")
    return "\n".join(lines)


def _payload_text(payload: Any) -> str:
    try:
        text = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return short_repr(payload, 200)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text):,} characters)"
