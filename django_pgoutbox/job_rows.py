"""Jobs to enqueue, checked: a ``JobRow`` from ``enqueue()``'s arguments or each of
``enqueue_many()``'s items; and the saved ``Job`` instances built from rows once written.

Every argument is checked before anything is written, and a bad one raises
:class:`~django_pgoutbox.errors.EnqueueError` naming the argument.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django_pgoutbox.conf import PgOutboxSettings, get_settings
from django_pgoutbox.db import write_database
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.ids import uuid7, uuid7_many
from django_pgoutbox.models import Job, JobStatus, empty_row, instance_from_row
from django_pgoutbox.registry import Payload, check_undeclared_job_type, get_job
from django_pgoutbox.uniqueness import Unique, UniquePolicy, resolve
from django_pgoutbox.validation import (
    MAX_IDEMPOTENCY_KEY_BYTES,
    check_text,
    checked_delay_moment,
    checked_moment,
    json_object,
    non_empty_text,
    optional_uuid,
    short_repr,
    utc_offset,
)

#: The range of a PostgreSQL ``integer`` column (priority, max_attempts).
INT32_RANGE = (-(2**31), 2**31 - 1)


@dataclass(slots=True)
class JobRow:
    """One validated job, ready for ``ENQUEUE_JOBS``."""

    id: uuid.UUID
    organization_id: uuid.UUID | None
    queue: str
    job_type: str
    payload: Payload
    payload_json: str
    idempotency_key: str | None
    priority: int
    run_at: datetime | None
    delay: float  # seconds after run_at (or now)
    max_attempts: int
    #: The outbox event whose subscriber enqueues the job (``enqueueing.for_event``).
    event_id: uuid.UUID | None = None
    #: A unique job's policy and key (without its window): ``uniqueness``.
    unique: UniquePolicy | None = None
    unique_key: uuid.UUID | None = None
    #: The sequence the job runs in (``sequences``), if any.
    sequence_key: str | None = None
    #: The W3C trace context of the span that enqueued it, JSON text (``tracing``), if one was
    #: recording.
    trace_context: str | None = None


#: The longest sequence key, in bytes (UTF-8).
MAX_SEQUENCE_KEY_BYTES = 200


def checked_sequence_key(value: Any, where: str) -> str:
    """A sequence key as given to ``enqueue(sequence=...)``: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise EnqueueError(where, f"must be a non-empty string, not {short_repr(value)}")
    return check_text(value, where, EnqueueError, MAX_SEQUENCE_KEY_BYTES)


def sequence_from_payload(payload: Mapping[str, Any], field: str, where: str) -> str:
    """The key that ``@job(sequence_by=field)`` gives a job: the payload's value at ``field``,
    a string or an integer (as text)."""
    if field not in payload:
        raise EnqueueError(
            f"{where}.{field}", "is required: the job type's sequence_by names this key"
        )
    value = payload[field]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return checked_sequence_key(value, f"{where}.{field}")


def job_database(using: str | None) -> str:
    """The database alias to write jobs to: ``using``, checked, or the routers' choice."""
    return write_database(using, Job, EnqueueError)


def validate_job(
    job_type: Any,
    payload: Any,
    *,
    idempotency_key: Any,
    organization_id: Any,
    priority: Any,
    run_at: Any,
    queue: Any,
    prefix: str,
    conf: PgOutboxSettings | None = None,
    job_id: uuid.UUID | None = None,
    declared: bool = False,
    undeclared_seen: set[str] | None = None,
    unique: Unique | bool | None = None,
    on_conflict: str | None = None,
    debounce: timedelta | float | None = None,
    throttle: timedelta | float | None = None,
    sequence: Any = None,
) -> JobRow:
    """One job's arguments checked and resolved against its ``@job`` declaration and settings.

    ``enqueue_many`` passes the settings and an id made in bulk for each of its items, and the
    undeclared job types it has already said so of (one warning per type and call).
    ``declared``: the caller vouches for a job type that no ``@job`` declares (a django.tasks
    task): no warning.
    """
    if conf is None:
        conf = get_settings()
    # A registered job type's name was checked when it was registered.
    definition = get_job(job_type) if isinstance(job_type, str) else None
    if definition is not None:
        job_type = definition.name
    else:
        job_type = non_empty_text(job_type, f"{prefix}job_type", EnqueueError)
        if not declared and (undeclared_seen is None or job_type not in undeclared_seen):
            check_undeclared_job_type(job_type, f"{prefix}job_type", conf)
            if undeclared_seen is not None:
                undeclared_seen.add(job_type)
    payload_json = json_object(payload, f"{prefix}payload", EnqueueError, conf.max_payload_bytes)

    if idempotency_key is not None:
        if not isinstance(idempotency_key, str) or not idempotency_key:
            raise EnqueueError(
                f"{prefix}idempotency_key",
                f"must be a non-empty string or None, not {short_repr(idempotency_key)}",
            )
        idempotency_key = check_text(
            idempotency_key, f"{prefix}idempotency_key", EnqueueError, MAX_IDEMPOTENCY_KEY_BYTES
        )
    organization_id = optional_uuid(organization_id, f"{prefix}organization_id", EnqueueError)

    if priority is None:
        priority = definition.priority if definition else 0
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise EnqueueError(f"{prefix}priority", f"must be an int, not {short_repr(priority)}")
    elif not INT32_RANGE[0] <= priority <= INT32_RANGE[1]:
        raise EnqueueError(
            f"{prefix}priority",
            f"{priority} is outside the 32-bit integer range of its column, "
            f"{INT32_RANGE[0]} to {INT32_RANGE[1]}",
        )

    absolute: datetime | None = None
    delay = 0.0
    if isinstance(run_at, datetime):
        if utc_offset(run_at, f"{prefix}run_at", EnqueueError) is None:
            raise EnqueueError(
                f"{prefix}run_at",
                f"{run_at!r} is naive; pass an aware datetime "
                "(django.utils.timezone.now() + timedelta(...)) or a timedelta",
            )
        absolute = checked_moment(run_at, f"{prefix}run_at", EnqueueError)
    elif isinstance(run_at, timedelta):
        delay = checked_delay_moment(run_at, f"{prefix}run_at", EnqueueError)
    elif run_at is not None:
        raise EnqueueError(
            f"{prefix}run_at",
            f"must be an aware datetime, a timedelta or None, not {type(run_at).__name__}",
        )

    if queue is None:
        queue = definition.queue if definition else "default"
    elif not isinstance(queue, str):
        raise EnqueueError(f"{prefix}queue", f"must be a string, not {short_repr(queue)}")
    elif type(queue) is not str:
        queue = str.__str__(queue)  # the text psycopg sends, not what its __eq__ says
    if queue not in conf.queues:
        raise EnqueueError(
            f"{prefix}queue",
            f"unknown queue {short_repr(queue)}; PGOUTBOX['QUEUES'] has "
            f"{', '.join(conf.queues) or 'none'}",
        )

    if sequence is not None:
        sequence = checked_sequence_key(sequence, f"{prefix}sequence")
    elif definition is not None and definition.sequence_by is not None:
        sequence = sequence_from_payload(payload, definition.sequence_by, f"{prefix}payload")

    max_attempts = definition.max_attempts if definition else None
    row = JobRow(
        id=job_id or uuid7(),
        organization_id=organization_id,
        queue=queue,
        job_type=job_type,
        payload=payload,
        payload_json=payload_json,
        idempotency_key=idempotency_key,
        priority=priority,
        run_at=absolute,
        delay=delay,
        max_attempts=max_attempts or conf.max_attempts,
        sequence_key=sequence,
    )
    declared_unique = definition.unique if definition else None
    if (
        declared_unique is not None
        or unique is not None
        or on_conflict is not None
        or debounce is not None
        or throttle is not None
    ):
        policy = resolve(
            declared_unique,
            unique,
            on_conflict,
            debounce,
            throttle,
            lambda field, message: EnqueueError(f"{prefix}{field}", message),
        )
        if policy is not None:
            if sequence is not None:
                raise EnqueueError(
                    f"{prefix}sequence",
                    "cannot be combined with unique, debounce or throttle (docs/uniqueness.md)",
                )
            row.unique = policy
            row.unique_key = policy.row_key(job_type, organization_id, queue, payload)
    return row


#: Keys an ``enqueue_many`` item may have.
_ITEM_KEYS = frozenset(
    {
        "job_type",
        "payload",
        "idempotency_key",
        "organization_id",
        "priority",
        "run_at",
        "queue",
        "unique",
        "on_conflict",
        "debounce",
        "throttle",
        "sequence",
    }
)


def validate_items(items: Sequence[Mapping[str, Any]], conf: PgOutboxSettings) -> Iterator[JobRow]:
    """Each item of ``enqueue_many`` as a row, or ``EnqueueError`` naming the first bad one."""
    ids = uuid7_many(len(items))
    # An item of only job_type and payload takes its queue, priority and attempt budget from
    # its job type alone: after the first such item of a type, the next ones reuse what it
    # resolved to, and only their payload is checked (a third of the time of a full check).
    plain: dict[str, tuple[str, int, int]] = {}
    undeclared: set[str] = set()
    max_payload_bytes = conf.max_payload_bytes
    for index, item in enumerate(items):
        if type(item) is dict and len(item) == 2:
            job_type = item.get("job_type")
            payload = item.get("payload")
            defaults = plain.get(job_type) if type(job_type) is str else None
            if defaults is not None and type(payload) is dict:
                queue, priority, max_attempts = defaults
                yield JobRow(
                    ids[index],
                    None,
                    queue,
                    job_type,  # type: ignore[arg-type]  # a str: it is a key of plain
                    payload,
                    json_object(
                        payload, f"items[{index}].payload", EnqueueError, max_payload_bytes
                    ),
                    None,
                    priority,
                    None,
                    0.0,
                    max_attempts,
                )
                continue
        if type(item) is not dict and not isinstance(item, Mapping):
            raise EnqueueError(f"items[{index}]", f"must be a dict, not {type(item).__name__}")
        if not _ITEM_KEYS.issuperset(item):
            unknown = sorted(set(item) - _ITEM_KEYS, key=str)
            raise EnqueueError(
                f"items[{index}]",
                f"unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_ITEM_KEYS))}",
            )
        if "job_type" not in item or "payload" not in item:
            missing = "job_type" if "job_type" not in item else "payload"
            raise EnqueueError(f"items[{index}].{missing}", "is required")
        row = validate_job(
            item["job_type"],
            item["payload"],
            idempotency_key=item.get("idempotency_key"),
            organization_id=item.get("organization_id"),
            priority=item.get("priority"),
            run_at=item.get("run_at"),
            queue=item.get("queue"),
            prefix=f"items[{index}].",
            conf=conf,
            job_id=ids[index],
            undeclared_seen=undeclared,
            unique=item.get("unique"),
            on_conflict=item.get("on_conflict"),
            debounce=item.get("debounce"),
            throttle=item.get("throttle"),
            sequence=item.get("sequence"),
        )
        if len(item) == 2 and row.unique is None and row.sequence_key is None:
            plain[row.job_type] = (row.queue, row.priority, row.max_attempts)
        yield row


def scheduled_run_at(row: JobRow, now: datetime) -> datetime:
    """The statement's default: ``coalesce(run_at, now()) + delay``."""
    start = row.run_at or now
    return start + timedelta(seconds=row.delay) if row.delay else start


def job_from_row(
    alias: str, row: JobRow, run_at: datetime | None, created_at: datetime | None
) -> Job:
    return jobs_from_rows(alias, [row], lambda _: run_at, created_at)[0]


def jobs_from_rows(
    alias: str,
    rows: Sequence[JobRow],
    run_at: Callable[[JobRow], datetime | None],
    created_at: datetime | None,
) -> list[Job]:
    """The saved ``Job`` instances of rows just inserted (a fifth of a bulk enqueue's time)."""
    base: dict[str, Any] = {
        **empty_row(Job),
        "status": JobStatus.PENDING,
        "attempts": 0,
        "lost_attempts": 0,
        "created_at": created_at,
        "created": True,  # Job.created: this call wrote it
    }
    jobs: list[Job] = []
    for row in rows:
        values = base.copy()
        values["id"] = row.id
        values["organization_id"] = row.organization_id
        values["queue"] = row.queue
        values["job_type"] = row.job_type
        values["payload"] = row.payload
        values["idempotency_key"] = row.idempotency_key
        values["priority"] = row.priority
        values["run_at"] = run_at(row)
        values["max_attempts"] = row.max_attempts
        values["event_id"] = row.event_id
        values["worker_ids"] = []
        jobs.append(instance_from_row(Job, alias, values))
    return jobs
