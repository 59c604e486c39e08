"""Every SQL statement of the package, named and commented, in one package, by area.

- ``enqueue``: writing jobs (one row, many rows, binary COPY) and waking their queues;
- ``unique``: unique jobs: the insert that yields to the job holding the key, its update, its read;
- ``aging``: priority aging, which raises the priority of the jobs that wait;
- ``claims``: the claim's columns (``ClaimRow``), the claim and the outcomes of attempts;
- ``attempts``: the entry the end of an attempt appends to its job's ``attempt_log``, which the
  statements of ``claims`` and ``leases`` share;
- ``limits``: the fair and limited claims (the queue's lock, its allowance, its tokens);
- ``leases``: renewal, recovery of expired leases, suspects, giving jobs back;
- ``outbox``: publishing a fact, and the relay's claim, fence and outcomes;
- ``deliveries``: one subscriber's delivery of an event, when it could not run with the others;
- ``inbox``: recording a received message once;
- ``controls``: queues paused, resumed and resized at run time; their minutes, for the charts;
- ``publish``: an ordered publisher's job, waiting for the earlier ones of its aggregate;
- ``progress``: what running handlers say of their progress and metadata;
- ``operations``: pruning, dead letters (and their causes), cancellation;
- ``monitoring``: heartbeats, gauges, the scheduler's cursors, the system checks;
- ``workflows``: writing a graph of jobs, reading a step's parents;
- ``workflow_pages``: the admin's reads of workflows, their steps and edges, a job's parents and
  children, each bounded.

Every name is importable from here (``queries.CLAIM_JOBS``), and the rest of the code calls the
statements by these names; this module also says how a queue's lanes send theirs (``DISPATCHED``).
Each statement's comment gives its parameters: positional ``%s`` placeholders in the order given
where a statement takes at most four, each once; else, where it says "Named parameters",
``%(name)s`` placeholders passed as a dict. Arrays are passed as Python lists. A statement sent
with binary parameters has ``%b`` (``%(name)b``) instead.

SQL that stays elsewhere, and why:

- ``admin.common.EstimatedCountPaginator.count`` runs ``EXPLAIN (FORMAT JSON)`` on the SQL that
  Django builds for the admin page's queryset at run time: only that prefix is fixed. The gauges'
  ``ESTIMATE_*`` statements get the same prefix in ``metrics``.
- ``worker.listener`` composes ``LISTEN`` with ``psycopg.sql.Identifier``: a channel is an
  identifier, which no parameter can carry.
- ``migrations/`` hold the schema's ``RunSQL``: a migration is history, and must not change when
  this module does.
- The ORM's queries (the admin's pages, a heartbeat row deleted at stop, ``scheduler.cursors()``,
  the models' managers) are Django's to write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from django_pgoutbox.queries.aging import AGE_PRIORITIES, START_AGING_PASS
from django_pgoutbox.queries.claims import (
    CLAIM_COLUMNS,
    CLAIM_JOBS,
    CLAIM_RETURNING,
    RECORD_AND_CLAIM,
    RECORD_AND_SEEK_CLAIM,
    RECORD_HANDOFF_AND_CLAIM,
    RECORD_HANDOFF_AND_SEEK_CLAIM,
    RECORD_OUTCOMES,
    SEEK_CLAIM_JOBS,
    ClaimRow,
)
from django_pgoutbox.queries.controls import (
    ADD_QUEUE_OUTCOMES,
    PAUSE_QUEUE,
    PRUNE_QUEUE_MINUTES,
    QUEUE_CONTROLS,
    QUEUE_MINUTES,
    READ_QUEUE_CONTROL,
    RESIZE_QUEUE,
    RESUME_QUEUE,
    SAMPLE_QUEUE_BACKLOGS,
)
from django_pgoutbox.queries.deliveries import (
    CLAIM_DELIVERIES,
    DELIVERY_SUBSCRIBERS,
    DISCARD_DEAD_DELIVERIES,
    LOCK_CLAIMED_DELIVERIES,
    MARK_DELIVERED,
    RECORD_DELIVERY_FAILURES,
    REDRIVE_DEAD_DELIVERIES,
    REPLAY_EVENTS,
    WRITE_DELIVERIES,
)
from django_pgoutbox.queries.enqueue import (
    COPY_JOBS,
    COPY_JOBS_NOW,
    ENQUEUE_JOB,
    ENQUEUE_JOB_UNKEYED,
    ENQUEUE_JOBS,
    ENQUEUE_JOBS_FROM_EVENT,
    ENQUEUE_JOBS_UNKEYED,
    ENQUEUE_JOBS_UNKEYED_FROM_EVENT,
    WAKE_QUEUES,
)
from django_pgoutbox.queries.inbox import ACCEPT_MESSAGE, INBOX_SOURCES
from django_pgoutbox.queries.leases import (
    MARK_ALONE,
    RECOVER_EXPIRED_LEASES,
    RELEASE_JOBS,
    RENEW_LEASES,
    UNCLAIM_JOBS,
)
from django_pgoutbox.queries.limits import (
    CLAIM_LOCK,
    FAIR_CLAIM,
    FAIR_CLAIM_TEMPLATE,
    FAIR_PLAN,
    ORGANIZATION_LIMITED_CLAIM,
    QUEUE_ALLOWANCE,
    TAKE_TOKENS,
    fair_claim,
)
from django_pgoutbox.queries.monitoring import (
    ABANDONED_EVENTS,
    ADVANCE_SCHEDULE_CURSOR,
    AUTOVACUUM_ON,
    DATABASE_NOW,
    DELIVERY_GAUGES,
    ESTIMATE_OUTBOX_PENDING,
    ESTIMATE_QUEUE_JOBS,
    ESTIMATE_UNREGISTERED_JOBS,
    GAUGES_PLAN,
    HEARTBEAT,
    HORIZON_HOLDER,
    JOB_GAUGES,
    LOCK_WORKER_ID,
    OUTBOX_AND_SERVER_GAUGES,
    SCHEDULE_CURSOR,
    SCHEDULE_LOCK,
    SET_STUCK_QUEUE,
    START_SCHEDULE_CURSOR,
    TAKE_WORKER_ID,
    WORKER_HEARTBEATS,
)
from django_pgoutbox.queries.operations import (
    CANCEL_DEAD_JOBS,
    CANCEL_JOBS,
    COUNT_DEAD_CAUSE,
    DEAD_CAUSE_IDS,
    DEAD_CAUSE_NEWEST,
    DEAD_CAUSE_PLAN,
    DEAD_CAUSES,
    DISCARD_DEAD_EVENTS,
    FILL_DEAD_CAUSES,
    OVERDUE_EVENTS,
    PRUNE_EVENTS,
    PRUNE_HEARTBEATS,
    PRUNE_INBOX_MESSAGES,
    PRUNE_JOBS,
    PRUNE_WORKFLOWS,
    REDRIVE_DEAD_EVENTS,
    RELEASE_EXPIRED_EVENT_CLAIMS,
    RETRY_DEAD_JOBS,
)
from django_pgoutbox.queries.outbox import (
    CLAIM_EVENTS,
    CLAIM_EVENTS_PLAN,
    LOCK_CLAIMED_EVENTS,
    MARK_EVENTS_PROCESSED,
    PUBLISH_EVENT,
    SEEK_CLAIM_EVENTS,
)
from django_pgoutbox.queries.params import binary
from django_pgoutbox.queries.progress import WRITE_PROGRESS
from django_pgoutbox.queries.publish import PUBLISH_AHEAD
from django_pgoutbox.queries.results import PRUNE_WAITERS, REGISTER_WAITERS, UNREGISTER_WAITER
from django_pgoutbox.queries.sequences import ENQUEUE_IN_SEQUENCE, LOCK_SEQUENCES, SKIP_DEAD_JOBS
from django_pgoutbox.queries.unique import (
    ENQUEUE_UNIQUE_JOB,
    ENQUEUE_UNIQUE_PERIOD_JOB,
    FIND_UNIQUE_JOB,
    FIND_UNIQUE_PERIOD_JOB,
    UPDATE_WAITING_UNIQUE_JOB,
    UPDATE_WAITING_UNIQUE_PERIOD_JOB,
)
from django_pgoutbox.queries.workflow_pages import (
    JOB_CHILDREN,
    JOB_PARENTS,
    WORKFLOW_EDGES,
    WORKFLOW_STATES,
    WORKFLOW_STEPS,
)
from django_pgoutbox.queries.workflows import (
    EXISTING_JOBS,
    INSERT_EDGES,
    INSERT_STEPS,
    INSERT_WORKFLOW,
    PARENTS,
    UNFINISHED_STEPS,
)

__all__ = [
    "ABANDONED_EVENTS",
    "ACCEPT_MESSAGE",
    "ADD_QUEUE_OUTCOMES",
    "ADVANCE_SCHEDULE_CURSOR",
    "AGE_PRIORITIES",
    "AUTOVACUUM_ON",
    "CANCEL_DEAD_JOBS",
    "CANCEL_JOBS",
    "CLAIM_COLUMNS",
    "CLAIM_DELIVERIES",
    "CLAIM_EVENTS",
    "CLAIM_EVENTS_PLAN",
    "CLAIM_JOBS",
    "CLAIM_LOCK",
    "CLAIM_RETURNING",
    "COPY_JOBS",
    "COPY_JOBS_NOW",
    "COUNT_DEAD_CAUSE",
    "DATABASE_NOW",
    "DEAD_CAUSES",
    "DEAD_CAUSE_IDS",
    "DEAD_CAUSE_NEWEST",
    "DEAD_CAUSE_PLAN",
    "DELIVERY_GAUGES",
    "DELIVERY_SUBSCRIBERS",
    "DISCARD_DEAD_DELIVERIES",
    "DISCARD_DEAD_EVENTS",
    "DISPATCHED",
    "ENQUEUE_IN_SEQUENCE",
    "ENQUEUE_JOB",
    "ENQUEUE_JOBS",
    "ENQUEUE_JOBS_FROM_EVENT",
    "ENQUEUE_JOBS_UNKEYED",
    "ENQUEUE_JOBS_UNKEYED_FROM_EVENT",
    "ENQUEUE_JOB_UNKEYED",
    "ENQUEUE_UNIQUE_JOB",
    "ENQUEUE_UNIQUE_PERIOD_JOB",
    "ESTIMATE_OUTBOX_PENDING",
    "ESTIMATE_QUEUE_JOBS",
    "ESTIMATE_UNREGISTERED_JOBS",
    "EXISTING_JOBS",
    "FAIR_CLAIM",
    "FAIR_CLAIM_TEMPLATE",
    "FAIR_PLAN",
    "FILL_DEAD_CAUSES",
    "FIND_UNIQUE_JOB",
    "FIND_UNIQUE_PERIOD_JOB",
    "GAUGES_PLAN",
    "HEARTBEAT",
    "HORIZON_HOLDER",
    "INBOX_SOURCES",
    "INSERT_EDGES",
    "INSERT_STEPS",
    "INSERT_WORKFLOW",
    "JOB_CHILDREN",
    "JOB_GAUGES",
    "JOB_PARENTS",
    "LOCK_CLAIMED_DELIVERIES",
    "LOCK_CLAIMED_EVENTS",
    "LOCK_SEQUENCES",
    "LOCK_WORKER_ID",
    "MARK_ALONE",
    "MARK_DELIVERED",
    "MARK_EVENTS_PROCESSED",
    "ORGANIZATION_LIMITED_CLAIM",
    "OUTBOX_AND_SERVER_GAUGES",
    "OVERDUE_EVENTS",
    "PARENTS",
    "PAUSE_QUEUE",
    "PRUNE_EVENTS",
    "PRUNE_HEARTBEATS",
    "PRUNE_INBOX_MESSAGES",
    "PRUNE_JOBS",
    "PRUNE_QUEUE_MINUTES",
    "PRUNE_WAITERS",
    "PRUNE_WORKFLOWS",
    "PUBLISH_AHEAD",
    "PUBLISH_EVENT",
    "QUEUE_ALLOWANCE",
    "QUEUE_CONTROLS",
    "QUEUE_MINUTES",
    "READ_QUEUE_CONTROL",
    "RECORD_AND_CLAIM",
    "RECORD_AND_SEEK_CLAIM",
    "RECORD_DELIVERY_FAILURES",
    "RECORD_HANDOFF_AND_CLAIM",
    "RECORD_HANDOFF_AND_SEEK_CLAIM",
    "RECORD_OUTCOMES",
    "RECOVER_EXPIRED_LEASES",
    "REDRIVE_DEAD_DELIVERIES",
    "REDRIVE_DEAD_EVENTS",
    "REGISTER_WAITERS",
    "RELEASE_EXPIRED_EVENT_CLAIMS",
    "RELEASE_JOBS",
    "RENEW_LEASES",
    "REPLAY_EVENTS",
    "RESIZE_QUEUE",
    "RESUME_QUEUE",
    "RETRY_DEAD_JOBS",
    "SAMPLE_QUEUE_BACKLOGS",
    "SCHEDULE_CURSOR",
    "SCHEDULE_LOCK",
    "SEEK_CLAIM_EVENTS",
    "SEEK_CLAIM_JOBS",
    "SET_STUCK_QUEUE",
    "SKIP_DEAD_JOBS",
    "START_AGING_PASS",
    "START_SCHEDULE_CURSOR",
    "TAKE_TOKENS",
    "TAKE_WORKER_ID",
    "UNCLAIM_JOBS",
    "UNFINISHED_STEPS",
    "UNREGISTER_WAITER",
    "UPDATE_WAITING_UNIQUE_JOB",
    "UPDATE_WAITING_UNIQUE_PERIOD_JOB",
    "WAKE_QUEUES",
    "WORKER_HEARTBEATS",
    "WORKFLOW_EDGES",
    "WORKFLOW_STATES",
    "WORKFLOW_STEPS",
    "WRITE_DELIVERIES",
    "WRITE_PROGRESS",
    "ClaimRow",
    "Dispatched",
    "binary",
    "fair_claim",
    "send",
]

# -- how the dispatcher sends its statements -----------------------------------------------------


class Dispatched(NamedTuple):
    """A statement as a queue's lanes send it on their own connection (``send``)."""

    #: The SQL with binary parameters (``%b``): psycopg then sends arrays without quoting each
    #: element in Python. Django's cursors, which the tests use with the same statements, take
    #: the ``%s`` form of the constant of the same name.
    sql: str
    #: psycopg's ``prepare``: None (prepared after a few runs, as the connection says) or False.
    #: Those that join an array of (id, attempt) pairs to this worker's leased rows must be
    #: planned each time knowing how many pairs they carry: a generic plan took the leased rows
    #: (estimated at one) as the outer side of a nested loop and read the whole array again for
    #: each row (docs/benchmarks.md, "What profiling found", item 17). A lane's connection that
    #: prepares statements plans each run of them anew (``plan_cache_mode``:
    #: ``db.LaneConnection``), so those that carry outcomes are prepared there too, which spares
    #: them their parsing at each run (item 30: ``custom_plans_only``); the others are False,
    #: sent once in a while.
    prepare: bool | None
    #: Prepared only on a connection that plans every run anew (``LaneConnection.plans_each_run``):
    #: elsewhere (behind a pooling proxy, whose sessions a setting cannot be trusted to stay
    #: on) sent unprepared, as if ``prepare`` were False.
    custom_plans_only: bool = False


def _dispatched(name: str, *, prepare: bool | None, custom_plans_only: bool = False) -> Dispatched:
    return Dispatched(binary(globals()[name]), prepare, custom_plans_only)


#: The statements of a queue's lanes, by name.
DISPATCHED: dict[str, Dispatched] = {
    "CLAIM_JOBS": _dispatched("CLAIM_JOBS", prepare=None),
    "RECORD_AND_CLAIM": _dispatched("RECORD_AND_CLAIM", prepare=None, custom_plans_only=True),
    "SEEK_CLAIM_JOBS": _dispatched("SEEK_CLAIM_JOBS", prepare=None),
    "RECORD_AND_SEEK_CLAIM": _dispatched(
        "RECORD_AND_SEEK_CLAIM", prepare=None, custom_plans_only=True
    ),
    "RECORD_HANDOFF_AND_CLAIM": _dispatched(
        "RECORD_HANDOFF_AND_CLAIM", prepare=None, custom_plans_only=True
    ),
    "RECORD_HANDOFF_AND_SEEK_CLAIM": _dispatched(
        "RECORD_HANDOFF_AND_SEEK_CLAIM", prepare=None, custom_plans_only=True
    ),
    "RECORD_OUTCOMES": _dispatched("RECORD_OUTCOMES", prepare=None, custom_plans_only=True),
    "RENEW_LEASES": _dispatched("RENEW_LEASES", prepare=False),
    "UNCLAIM_JOBS": _dispatched("UNCLAIM_JOBS", prepare=False),
    "RELEASE_JOBS": _dispatched("RELEASE_JOBS", prepare=False),
    "WRITE_PROGRESS": _dispatched("WRITE_PROGRESS", prepare=False),
}


def send(cursor: Any, name: str, params: Sequence[Any] | Mapping[str, Any]) -> None:
    """Run the dispatched statement ``name`` on a lane's psycopg ``cursor``."""
    statement = DISPATCHED[name]
    prepare = statement.prepare
    if statement.custom_plans_only and not getattr(cursor.connection, "plans_each_run", False):
        prepare = False
    cursor.execute(statement.sql, params, prepare=prepare)
