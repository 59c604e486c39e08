"""The three tables: ``outbox_events`` (facts), ``jobs`` (executable work), ``schedule_cursors``.

Columns, types, defaults and indexes follow the source text exactly, with the seed's names. Columns
this app adds are marked "added". Every time column that has a default takes it from the database
clock (``now()``), never from a worker's clock, so that hosts with skewed clocks agree.
Storage parameters (fillfactor, autovacuum) are set in the initial migration; see docs/tables.md.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

from django.contrib.postgres.functions import RandomUUID
from django.db import models
from django.db.models import F
from django.db.models.base import ModelState
from django.db.models.fields.json import KeyTextTransform

from django_pgoutbox.attempts import AttemptRecord, attempt_history
from django_pgoutbox.ids import uuid7


def rfc3339(moment: datetime) -> str:
    """``moment`` as RFC 3339 text in UTC, ``Z`` for its offset (CloudEvents' ``time``)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class TransactionNow(models.Func):
    """``now()``: the database clock at the start of the transaction, as the seed's defaults use.

    Django's ``Now()`` renders ``STATEMENT_TIMESTAMP()`` on PostgreSQL; the seed's tables say
    ``DEFAULT now()``, and so do this app's statements, so every default agrees with them.
    """

    template = "now()"
    output_field = models.DateTimeField()


class ErrorFingerprint(models.Func):
    """A dead letter's cause: ``pgoutbox_error_fingerprint(job_type, last_error_code,
    last_error_summary)``, 16 hex digits (migration 0012 creates the function; docs/admin.md,
    "Dead letters by cause", has its rules). What migration 0012's index led with; since 0014
    the column ``dead_cause`` holds it."""

    function = "pgoutbox_error_fingerprint"
    output_field = models.TextField()

    def __init__(self) -> None:
        super().__init__(F("job_type"), F("last_error_code"), F("last_error_summary"))

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        return ("django_pgoutbox.models.ErrorFingerprint", (), {})


class JobStatus(models.TextChoices):
    """The seven states of a job (docs/tables.md has the diagram)."""

    #: A step of a workflow whose parents have not all finished (``enqueue(after=...)``): in no
    #: claim's index until the end of its last parent makes it ``pending``.
    WAITING = "waiting", "waiting"
    PENDING = "pending", "pending"
    LEASED = "leased", "leased"
    RETRYING = "retrying", "retrying"
    COMPLETED = "completed", "completed"
    DEAD = "dead", "dead"
    CANCELLED = "cancelled", "cancelled"


#: States a worker may claim from; the claim index covers exactly these.
CLAIMABLE_STATUSES = (JobStatus.PENDING, JobStatus.RETRYING)
#: States that never change again (until an operator re-drives a dead letter).
FINISHED_STATUSES = (JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED)


class OutboxEvent(models.Model):
    """A fact that has already happened, committed in the same transaction as the change."""

    id = models.UUIDField(primary_key=True, default=uuid7, db_default=RandomUUID(), editable=False)
    organization_id = models.UUIDField(null=True, blank=True)
    aggregate_type = models.TextField()
    aggregate_id = models.UUIDField()
    event_type = models.TextField()
    schema_version = models.IntegerField()
    payload = models.JSONField()
    occurred_at = models.DateTimeField(db_default=TransactionNow())
    available_at = models.DateTimeField(db_default=TransactionNow())
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.TextField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    attempts = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(null=True, blank=True)
    # Added: the class of the last failure (or why the event is dead), as jobs have it.
    last_error_code = models.TextField(null=True, blank=True)
    # Added: set when projection gave up (poison event, unsupported schema version). A dead
    # event is never claimed, and holds back the later events of its aggregate until an
    # operator re-drives or discards it.
    dead_at = models.DateTimeField(null=True, blank=True)
    # Added (migration 0020): the W3C trace context (``traceparent``, ``tracestate``) of the
    # span that published the event, when one was recording (docs/observability.md, "Traces");
    # NULL otherwise, the common case.
    trace_context = models.JSONField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "outbox_events"
        verbose_name = "outbox event"
        ordering: ClassVar[list[str]] = ["occurred_at", "id"]
        indexes: ClassVar[list[models.Index]] = [
            models.Index(
                fields=["available_at", "occurred_at"],
                name="outbox_pending_idx",
                condition=models.Q(processed_at__isnull=True),
            ),
            # The relay's claim walks unprocessed events in (occurred_at, id) order and stops at
            # its LIMIT, instead of sorting the whole backlog.
            models.Index(
                fields=["occurred_at", "id"],
                name="outbox_claim_idx",
                condition=models.Q(processed_at__isnull=True),
            ),
            # Retention deletes the oldest processed events first.
            models.Index(
                fields=["processed_at"],
                name="outbox_processed_idx",
                condition=models.Q(processed_at__isnull=False),
            ),
            # The relay's order check: which unprocessed event of this aggregate comes first?
            models.Index(
                fields=["aggregate_type", "aggregate_id", "occurred_at", "id"],
                name="outbox_aggregate_pending_idx",
                condition=models.Q(processed_at__isnull=True),
            ),
            # The dead-event gauge counts them apart from the waiting ones, up to its limit.
            models.Index(
                fields=["occurred_at"],
                name="outbox_dead_idx",
                condition=models.Q(processed_at__isnull=True, dead_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.aggregate_type}:{self.aggregate_id} ({self.id})"

    def as_cloudevent(
        self, *, source: str | None = None, dataschema: str | None = None
    ) -> dict[str, Any]:
        """The event as a CloudEvents 1.0 event in its JSON format (a dict, ready for
        ``json.dumps``), for publishers to other systems (docs/outbox.md, "As a CloudEvent").

        ``id`` is the event's id, so that a consumer that dedupes on it sees each fact once
        however often it is delivered; ``type`` its ``event_type``; ``subject`` its
        ``aggregate_id``; ``time`` when it occurred; ``data`` its payload. ``source`` (a URI
        reference: ``"https://shop.example.com/orders"``) defaults to ``"/" + aggregate_type``.
        ``dataschema``, a URI, is added when given. The extension attributes ``aggregatetype``,
        ``schemaversion`` and, when set, ``organizationid`` carry the rest; ``traceparent`` and
        ``tracestate`` (CloudEvents' distributed tracing extension) the trace context of the span
        that published it, if one was recording (docs/observability.md, "Traces").
        """
        if source is None:
            source = f"/{self.aggregate_type}"
        if not isinstance(source, str) or not source.strip():
            raise ValueError(
                f"as_cloudevent(): source must be a non-empty URI reference, not {source!r}"
            )
        if dataschema is not None and (not isinstance(dataschema, str) or not dataschema.strip()):
            raise ValueError(
                f"as_cloudevent(): dataschema must be a non-empty URI, not {dataschema!r}"
            )
        if not isinstance(self.occurred_at, datetime):
            raise ValueError(
                f"as_cloudevent(): event {self.id} has no occurred_at: use an event that "
                "publish() returned or that was read from the database"
            )
        event: dict[str, Any] = {
            "specversion": "1.0",
            "id": str(self.id),
            "source": source,
            "type": self.event_type,
            "subject": str(self.aggregate_id),
            "time": rfc3339(self.occurred_at),
            "datacontenttype": "application/json",
        }
        if dataschema is not None:
            event["dataschema"] = dataschema
        event["aggregatetype"] = self.aggregate_type
        event["schemaversion"] = self.schema_version
        if self.organization_id is not None:
            event["organizationid"] = str(self.organization_id)
        from django_pgoutbox.tracing import w3c_fields

        # only a valid W3C context: a row written by hand adds nothing a reader would refuse
        event.update(w3c_fields(self.trace_context) or {})
        event["data"] = self.payload
        return event


class Job(models.Model):
    """Executable work with a lease, a retry budget and a dead-letter state."""

    id = models.UUIDField(primary_key=True, default=uuid7, db_default=RandomUUID(), editable=False)
    organization_id = models.UUIDField(null=True, blank=True)
    queue = models.TextField()
    job_type = models.TextField()
    payload = models.JSONField()
    idempotency_key = models.TextField(null=True, blank=True)
    status = models.TextField(
        choices=JobStatus.choices, default=JobStatus.PENDING, db_default=JobStatus.PENDING
    )
    priority = models.IntegerField(default=0, db_default=0)
    run_at = models.DateTimeField(db_default=TransactionNow())
    attempts = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(default=10, db_default=10)
    locked_at = models.DateTimeField(null=True, blank=True)
    locked_by = models.TextField(null=True, blank=True)
    last_error_code = models.TextField(null=True, blank=True)
    last_error_summary = models.TextField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=TransactionNow())
    # Added: when the current lease ends. A lease is renewed by moving this forward, and this
    # column is in no index, so a renewal can be a HOT update.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Added: when the job reached completed, dead or cancelled (completed_at is only for completed).
    finished_at = models.DateTimeField(null=True, blank=True)
    # Added: the handler's JSON return value, for callers that read results (django.tasks).
    result = models.JSONField(null=True, blank=True)
    # Added: the worker id of each attempt, appended by every claim (django.tasks' worker_ids).
    worker_ids = models.JSONField(default=list, db_default=models.Value([], models.JSONField()))
    # Added: when someone asked a running attempt to stop (cancel()); the handler sees it at
    # its next lease renewal, and the attempt ends 'cancelled' instead of being retried.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Added: how many attempts in a row were lost with their worker (its lease expired); each is
    # given back, and from two on the job is a suspect whose next attempt runs alone.
    lost_attempts = models.IntegerField(default=0, db_default=0)
    # Added: the attempt of a suspect that started alone in its worker's process: only such an
    # attempt, if lost too, counts (see the lease recovery). Every claim clears it.
    alone_attempt = models.IntegerField(null=True, blank=True)
    # Added: the attempts that did not complete the job, oldest first, the newest 20 of them
    # (queries.attempts); NULL while there is none. Read it through ``attempt_history``.
    attempt_log = models.JSONField(null=True, blank=True)
    # Added: the cause of the job's death, 16 hex digits (docs/admin.md, "Dead letters by
    # cause"): written by each statement that kills a job (and for a row inserted dead, by the
    # trigger of migration 0014; for one an UPDATE of yours kills, by
    # maintenance.fill_dead_causes), cleared when the job is retried or cancelled. Only dead
    # jobs are in its index.
    dead_cause = models.TextField(null=True, blank=True, editable=False)
    # Added: the outbox event whose subscriber enqueued this job, by the relay or a delivery
    # (migration 0015); NULL for a job enqueued anywhere else. Not a foreign key: retention
    # deletes events and jobs apart.
    event_id = models.UUIDField(null=True, blank=True, editable=False)
    # Added (migration 0016), for workflows (docs/workflows.md): the workflow the job is a step
    # of, and its step's name there; how many of its parents have not finished yet (while it is
    # ``waiting``); whether some job waits for it (the triggers of 0016 then settle its
    # dependants when it ends); and what a dead or cancelled parent makes of it (NULL: cancel).
    workflow_id = models.UUIDField(null=True, blank=True, editable=False)
    step = models.TextField(null=True, blank=True, editable=False)
    waiting_for = models.IntegerField(null=True, blank=True, editable=False)
    has_dependants = models.BooleanField(null=True, blank=True, editable=False)
    on_upstream_failure = models.TextField(null=True, blank=True, editable=False)
    # Added (migration 0016): what the running handler said of its progress
    # (``ctx.set_progress``) and its metadata (``ctx.set_meta``), written at most once a second.
    progress = models.JSONField(null=True, blank=True, editable=False)
    meta = models.JSONField(null=True, blank=True, editable=False)
    # Added (migration 0017), for unique jobs (docs/uniqueness.md): the job's key, a 128-bit hash
    # of what its ``Unique`` compares (with the window of its run_at if it has a period; a uuid,
    # compared byte for byte, not text by collation), and the states
    # in which it holds it, a bit per state (``uniqueness.STATE_BITS``). ``jobs_unique_uq``
    # refuses a second row with the key among the rows in their states.
    unique_key = models.UUIDField(null=True, blank=True, editable=False)
    unique_states = models.IntegerField(null=True, blank=True, editable=False)
    # Added (migration 0018), for sequences (docs/uniqueness.md, "Sequences"): the key of the
    # sequence the job runs in, one at a time and in enqueue order, and its place there (from
    # the database sequence pgoutbox_sequence_positions, drawn under the key's advisory lock,
    # so increasing in the order the enqueues committed). NULL for every other job.
    sequence_key = models.TextField(null=True, blank=True, editable=False)
    sequence_position = models.BigIntegerField(null=True, blank=True, editable=False)
    # Added (migration 0019): the priority the job had before priority aging first raised it
    # (``QUEUES[...]["PRIORITY_AGING"]``, docs/workers.md); NULL while aging never did. Aging
    # works its raises out from it and the wait, so that a pass repeated changes nothing.
    base_priority = models.IntegerField(null=True, blank=True, editable=False)
    # Added (migration 0020): the W3C trace context (``traceparent``, ``tracestate``) of the
    # span that enqueued the job, when one was recording (docs/observability.md, "Traces");
    # NULL otherwise, the common case. A retried dead letter keeps it.
    trace_context = models.JSONField(null=True, blank=True, editable=False)

    #: Not a column: whether the call that returned this job wrote it (True), or found it
    #: already there (False: a repeated idempotency key, or a unique job's key held, see
    #: docs/uniqueness.md); None for a job read from the database.
    created: bool | None = None

    class Meta:
        db_table = "jobs"
        ordering: ClassVar[list[str]] = ["-created_at", "id"]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # NULLS NOT DISTINCT (PostgreSQL 15+): without it two jobs with the same key and no
            # organization would both be accepted, because NULL never equals NULL.
            models.UniqueConstraint(
                fields=["organization_id", "job_type", "idempotency_key"],
                name="jobs_idempotency_uq",
                condition=models.Q(idempotency_key__isnull=False),
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=JobStatus.values), name="jobs_status_valid"
            ),
        ]
        indexes: ClassVar[list[models.Index]] = [
            # The claim: WHERE queue = %s AND status IN ('pending', 'retrying') AND run_at <= now()
            # ORDER BY priority DESC, run_at, created_at, id. Equality on queue, then the order.
            models.Index(
                fields=["queue", "-priority", "run_at", "created_at", "id"],
                name="jobs_claim_idx",
                condition=models.Q(status__in=CLAIMABLE_STATUSES),
            ),
            # Lease recovery and shutdown release scan only the few leased rows.
            models.Index(
                fields=["locked_by"],
                name="jobs_leased_idx",
                condition=models.Q(status=JobStatus.LEASED),
            ),
            # Dead letters by queue, newest first: the admin, stats and the dead-letter gauge.
            models.Index(
                fields=["queue", "-finished_at"],
                name="jobs_dead_idx",
                condition=models.Q(status=JobStatus.DEAD),
            ),
            # The dead letters' pages: newest death first across queues, and so by job type or by
            # error code (an entry each only when a job dies). Without them, each of these pages
            # read every dead letter's row (docs/admin.md, "Ten million jobs").
            models.Index(
                fields=["-finished_at", "-id"],
                name="jobs_dead_finished_idx",
                condition=models.Q(status=JobStatus.DEAD),
            ),
            models.Index(
                fields=["job_type", "-finished_at", "-id"],
                name="jobs_dead_type_idx",
                condition=models.Q(status=JobStatus.DEAD),
            ),
            models.Index(
                fields=["last_error_code", "-finished_at", "-id"],
                name="jobs_dead_code_idx",
                condition=models.Q(status=JobStatus.DEAD),
            ),
            # The fair claim (QUEUES[...]['FAIR'], per-organization limits): a loose index scan
            # finds each organization with claimable jobs, then reads each one's first jobs in
            # claim order.
            models.Index(
                fields=["queue", "organization_id", "-priority", "run_at", "created_at", "id"],
                name="jobs_fair_claim_idx",
                condition=models.Q(status__in=CLAIMABLE_STATUSES),
            ),
            # Retention deletes the oldest completed and cancelled jobs first.
            models.Index(
                fields=["finished_at"],
                name="jobs_finished_idx",
                condition=models.Q(status__in=(JobStatus.COMPLETED, JobStatus.CANCELLED)),
            ),
            # The gauges count retrying jobs apart from pending ones (both in the claim index),
            # due and not yet due, each count stopping at its limit (gauges.database_gauges).
            models.Index(
                fields=["queue", "run_at"],
                name="jobs_retrying_idx",
                condition=models.Q(status=JobStatus.RETRYING),
            ),
            # An ordered publisher's job asks whether an earlier job of its publisher and
            # aggregate is not done (queries.PUBLISH_AHEAD); only such jobs have entries.
            models.Index(
                KeyTextTransform("publisher", "payload"),
                KeyTextTransform("aggregate", "payload"),
                F("created_at"),
                F("id"),
                name="jobs_publish_order_idx",
                condition=models.Q(
                    job_type="pgoutbox.publish",
                    status__in=[
                        JobStatus.PENDING,
                        JobStatus.RETRYING,
                        JobStatus.LEASED,
                        JobStatus.DEAD,
                    ],
                ),
            ),
            # Dead letters by cause (the admin's "Dead letters by cause", ``pgoutbox deadletters
            # causes``): one descent finds each cause, and its newest and oldest dead letters;
            # a cause's dead letters are read in (finished_at, id) order, a keyset at a time,
            # and counted from the index alone. Only dead jobs have entries.
            models.Index(
                fields=["dead_cause", "finished_at", "id"],
                name="jobs_dead_cause_idx",
                condition=models.Q(status=JobStatus.DEAD),
            ),
            # Dead jobs without a cause (maintenance.fill_dead_causes): none but those an UPDATE
            # outside the app's statements made dead, so this index is empty nearly always. Its
            # predicate is the fill's: with the conditions apart, the planner, which takes them
            # for independent (every job not dead has no cause), read every dead letter to find
            # none, or the whole table.
            models.Index(
                fields=["id"],
                name="jobs_dead_uncaused_idx",
                condition=models.Q(status=JobStatus.DEAD, dead_cause__isnull=True),
            ),
            # The jobs an event's subscribers enqueued (the admin's event page). Only those jobs
            # have entries.
            models.Index(
                fields=["event_id"],
                name="jobs_event_idx",
                condition=models.Q(event_id__isnull=False),
            ),
            # The waiting steps, by queue (the Jobs page's filters): no claim index holds them.
            models.Index(
                fields=["queue", "created_at"],
                name="jobs_waiting_idx",
                condition=models.Q(status=JobStatus.WAITING),
            ),
            # The jobs of a sequence not finished yet (dead ones hold it): an enqueue reads the
            # newest, its tail, in one descent; the dead letters' filter by sequence reads here
            # too. Only sequence jobs have entries, and only until they complete or are
            # cancelled, so plain jobs pay nothing and a long sequence's history no probe.
            models.Index(
                fields=["sequence_key", "sequence_position"],
                name="jobs_sequence_tail_idx",
                condition=models.Q(sequence_key__isnull=False)
                & ~models.Q(status__in=[JobStatus.COMPLETED, JobStatus.CANCELLED]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_type} [{self.queue}] {self.status} ({self.id})"

    @property
    def attempt_history(self) -> list[AttemptRecord]:
        """Every attempt of this job as far as it is kept, oldest first: those logged in
        ``attempt_log``, then the row's own attempt while it runs or once it completed it."""
        return attempt_history(self)

    def wait(self, timeout: float | timedelta | None = None) -> Any:
        """Block until this job finishes, then return its result (``result``, the handler's
        return value) with the instance's fields read again from its row.

        Raises ``JobFailed`` if it ends (or is) ``dead``, at once, though an operator may
        retry it later; ``JobCancelled`` if ``cancelled``; ``WaitTimeout`` (a ``TimeoutError``)
        once ``timeout`` seconds (or a ``timedelta``; None: no limit) have passed;
        ``WaitInTransaction`` inside ``transaction.atomic()`` for a job not finished yet;
        ``Job.DoesNotExist`` if its row is not there. Woken by a notification when the job
        finishes, with polls as the fallback (docs/results.md).
        """
        from django_pgoutbox.results import wait

        return wait(self, timeout)

    async def await_result(self, timeout: float | timedelta | None = None) -> Any:
        """``wait()`` for asyncio: the same outcomes and errors, without blocking the loop."""
        from django_pgoutbox.results import await_result

        return await await_result(self, timeout)


class Workflow(models.Model):
    """A graph of jobs enqueued together by ``workflow(name).enqueue()`` (``chain``, ``group``):
    its steps are the jobs whose ``workflow_id`` is its id."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.TextField()
    organization_id = models.UUIDField(null=True, blank=True)
    #: How many steps it was enqueued with.
    steps = models.IntegerField()
    #: Its first and last steps' ids. They are UUIDv7s made in order by one ``enqueue()``, so its
    #: steps are the jobs of that range of the primary key that name it: read so, a workflow's
    #: steps need no index of their own, whose entries every write of a step would add to.
    first_step = models.UUIDField()
    last_step = models.UUIDField()
    created_at = models.DateTimeField(db_default=TransactionNow())

    class Meta:
        db_table = "workflows"
        ordering: ClassVar[list[str]] = ["-created_at", "id"]
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["-created_at", "id"], name="workflows_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class JobDependency(models.Model):
    """An edge of a workflow: the job ``child_id`` waits for the job ``parent_id`` to finish.

    Not foreign keys: retention deletes finished jobs one by one, and a check of this table
    for each would slow it. ``external``: the parent was not enqueued with the child, so the
    trigger of migration 0016 settles the edge at commit (the parent may have ended meanwhile).
    """

    pk = models.CompositePrimaryKey("parent_id", "child_id")
    parent_id = models.UUIDField()
    child_id = models.UUIDField()
    external = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "job_dependencies"
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["child_id"], name="job_dependencies_child_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.child_id} after {self.parent_id}"


class DeadLetterManager(models.Manager["DeadLetter"]):
    def get_queryset(self) -> models.QuerySet[DeadLetter]:
        return super().get_queryset().filter(status=JobStatus.DEAD)


class DeadLetter(Job):
    """Jobs in the ``dead`` state: the dead-letter view of the ``jobs`` table."""

    objects: ClassVar[DeadLetterManager] = DeadLetterManager()

    class Meta:
        proxy = True
        verbose_name = "dead letter"


class ScheduleCursor(models.Model):
    """The last slot a recurring schedule enqueued, so duplicate scheduler runs stay harmless."""

    name = models.TextField(primary_key=True)
    last_slot_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=TransactionNow())

    class Meta:
        db_table = "schedule_cursors"
        verbose_name = "schedule cursor"

    def __str__(self) -> str:
        return self.name


M = TypeVar("M", bound=models.Model)


class RateLimitBucket(models.Model):
    """A token bucket of a queue's RATE_LIMIT (one per organization with LIMIT_BY).

    ``key`` is the queue name, or ``queue/organization``. Claims of a rate-limited queue take
    tokens here, under the queue's advisory lock; tokens refill at the rate by the database clock.
    """

    key = models.TextField(primary_key=True)
    tokens = models.FloatField()
    updated_at = models.DateTimeField(db_default=TransactionNow())

    class Meta:
        db_table = "rate_limit_buckets"
        verbose_name = "rate limit bucket"

    def __str__(self) -> str:
        return self.key


class WorkerHeartbeat(models.Model):
    """One row per running ``runworkers`` process, refreshed while it runs (health checks)."""

    worker_id = models.TextField(primary_key=True)
    hostname = models.TextField()
    pid = models.IntegerField()
    roles = models.JSONField(default=list)
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField(db_default=TransactionNow())
    last_seen_at = models.DateTimeField(db_default=TransactionNow())
    # Added: the queues whose dispatcher says they are stuck (health.publish_stuck).
    stuck_queues = models.JSONField(default=list, db_default=models.Value([], models.JSONField()))

    class Meta:
        db_table = "worker_heartbeats"
        verbose_name = "worker heartbeat"

    def __str__(self) -> str:
        return self.worker_id


class OutboxDelivery(models.Model):
    """One subscriber's delivery of one event, for the subscribers that could not run with the
    others when the relay projected it: one failed (it is retried on its own, with back-off, and
    dead after ``OUTBOX["MAX_ATTEMPTS"]``), did not accept the event's schema version (dead at
    once), or had an earlier delivery of the same aggregate still waiting (it waits behind it:
    each subscriber sees an aggregate's events in order). An event whose subscribers all ran at
    once has no row here. Written by the relay, in the transaction that marks the event
    processed; deleted with the event (its foreign key cascades)."""

    id = models.BigAutoField(primary_key=True)
    event = models.ForeignKey(
        OutboxEvent,
        on_delete=models.DO_NOTHING,  # the database cascades (migration 0007)
        db_constraint=False,
        db_index=False,  # outbox_deliveries_uq leads with it
        related_name="deliveries",
    )
    subscriber = models.TextField()
    # The event's, copied: a subscriber's deliveries of one aggregate go in the event's order.
    aggregate_type = models.TextField()
    aggregate_id = models.UUIDField()
    occurred_at = models.DateTimeField()
    created_at = models.DateTimeField(db_default=TransactionNow())
    available_at = models.DateTimeField(db_default=TransactionNow())
    attempts = models.IntegerField(default=0, db_default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.TextField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    dead_at = models.DateTimeField(null=True, blank=True)
    last_error_code = models.TextField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "outbox_deliveries"
        verbose_name = "outbox delivery"
        verbose_name_plural = "outbox deliveries"
        ordering: ClassVar[list[str]] = ["occurred_at", "event_id", "subscriber"]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(fields=["event", "subscriber"], name="outbox_deliveries_uq"),
        ]
        indexes: ClassVar[list[models.Index]] = [
            # The delivery claim walks the due ones in the order they became due.
            models.Index(
                fields=["available_at", "id"],
                name="outbox_deliveries_due_idx",
                condition=models.Q(delivered_at__isnull=True, dead_at__isnull=True),
            ),
            # Order per aggregate and subscriber: which undelivered delivery comes first; and
            # the relay's question at each claim, which subscribers wait on this aggregate.
            models.Index(
                fields=["aggregate_type", "aggregate_id", "subscriber", "occurred_at", "event"],
                name="outbox_deliveries_order_idx",
                condition=models.Q(delivered_at__isnull=True),
            ),
            # Per-subscriber gauges and the admin's lists.
            models.Index(
                fields=["subscriber", "created_at"],
                name="outbox_deliveries_sub_idx",
                condition=models.Q(delivered_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subscriber} <- {self.event_id}"

    @property
    def state(self) -> str:
        if self.delivered_at is not None:
            return "delivered"
        if self.dead_at is not None:
            return "dead"
        if self.last_error is not None:
            return "failing"
        return "waiting"


class QueueControl(models.Model):
    """What an operator changed of a queue at run time (``pause_queue()``, ``resize_queue()``,
    ``pgoutbox queues``, the admin's overview): whether it is paused, and the values that stand
    in for its settings until reset. A queue with no row runs as its settings say. Every
    worker reads its queues' rows at start, when notified of a change, and once per poll
    interval."""

    queue = models.TextField(primary_key=True)
    # Set while the queue is paused: workers claim none of its jobs; enqueue still works.
    paused_at = models.DateTimeField(null=True, blank=True)
    # Who paused it ("admin user alice", "pgoutbox queues pause", "pause_queue()").
    paused_by = models.TextField(null=True, blank=True)
    # Values in place of the queue's settings: "CONCURRENCY" (a number), "MAX_RUNNING" and
    # "RATE_LIMIT" (a number, or null for no limit). A key that is absent follows the setting.
    overrides = models.JSONField(default=dict, db_default=models.Value({}, models.JSONField()))
    updated_at = models.DateTimeField(db_default=TransactionNow())
    updated_by = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "queue_controls"
        verbose_name = "queue control"

    def __str__(self) -> str:
        return self.queue


class QueueAging(models.Model):
    """When a pass of priority aging last started on a queue (``aging``): each worker of an
    aging queue starts one only when the last is a quarter of a step old, so that a queue's
    passes do not grow with its workers. A queue with no row has not aged yet."""

    queue = models.TextField(primary_key=True)
    aged_at = models.DateTimeField(db_default=TransactionNow())

    class Meta:
        db_table = "queue_aging"
        verbose_name = "queue aging"

    def __str__(self) -> str:
        return self.queue


class QueueMinute(models.Model):
    """One queue's activity in one minute, for the admin's charts: the outcomes that workers
    wrote (each process adds its counts with its heartbeat), and the backlog that maintenance
    samples (the largest seen in the minute). Kept for ``QUEUE_STATS_HOURS``; pruned by
    maintenance."""

    id = models.BigAutoField(primary_key=True)
    queue = models.TextField()
    # The minute (the database clock, truncated), UTC.
    minute = models.DateTimeField()
    completed = models.IntegerField(default=0, db_default=0)
    # Attempts that failed: retried, or dead.
    failed = models.IntegerField(default=0, db_default=0)
    dead = models.IntegerField(default=0, db_default=0)
    # Jobs waiting to be claimed (due now, and retrying), and the oldest one's wait (seconds):
    # the largest sample of the minute; null when maintenance took none.
    backlog = models.IntegerField(null=True, blank=True)
    oldest_pending_age = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "queue_minutes"
        verbose_name = "queue minute"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # What each write's ON CONFLICT names; the charts read a queue's last hours by it.
            models.UniqueConstraint(fields=["queue", "minute"], name="queue_minutes_uq"),
        ]
        indexes: ClassVar[list[models.Index]] = [
            # Maintenance deletes the oldest minutes first.
            models.Index(fields=["minute"], name="queue_minutes_minute_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.minute:%Y-%m-%d %H:%M}"


class InboxMessage(models.Model):
    """A message received from another system (a webhook's delivery), recorded by
    ``accept_message()`` in the transaction that handles it, so that a redelivery is known as
    one. Kept for ``PGOUTBOX["RETENTION"]["INBOX_MESSAGES"]``."""

    id = models.BigAutoField(primary_key=True)
    source = models.TextField()
    message_id = models.TextField()
    received_at = models.DateTimeField(db_default=TransactionNow())

    class Meta:
        db_table = "inbox_messages"
        verbose_name = "inbox message"
        constraints: ClassVar[list[models.BaseConstraint]] = [
            # What makes a message a duplicate; ACCEPT_MESSAGE's ON CONFLICT names these columns.
            models.UniqueConstraint(fields=["source", "message_id"], name="inbox_messages_uq"),
        ]
        indexes: ClassVar[list[models.Index]] = [
            # Retention deletes the oldest messages first.
            models.Index(fields=["received_at"], name="inbox_received_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.source}: {self.message_id}"


def saved_instance(model: type[M], using: str, values: dict[str, Any]) -> M:
    """A saved instance of ``model`` from column values already converted to Python.

    For rows that a statement of ``queries`` returned (or that ``enqueue_many`` just wrote): no
    second query to read them back. ``values`` holds column attnames only; columns missing from
    it are None.

    Built as ``Model.from_db`` would build it, minus ``Model.__init__``: its per-field loop and the
    ``pre_init``/``post_init`` signals were the largest part of each row's cost, on a path that
    makes many of these at a time (docs/benchmarks.md, "What profiling found", item 5). These are
    this app's own models, with no field that needs ``__init__`` (no file or image field, no
    descriptor with init-time state).
    """
    row = empty_row(model).copy()
    row.update(values)
    return instance_from_row(model, using, row)


def empty_row(model: type[models.Model]) -> dict[str, None]:
    """Every column attname of ``model``, each None (copy it before filling it in)."""
    empty = _empty_rows.get(model)
    if empty is None:
        empty = _empty_rows[model] = dict.fromkeys(f.attname for f in model._meta.concrete_fields)
    return empty


def instance_from_row(model: type[M], using: str, row: dict[str, Any]) -> M:
    """``saved_instance`` from a fresh dict that holds every column attname (``empty_row``).

    The dict becomes the instance's ``__dict__``: pass one that nothing else holds.
    """
    instance = model.__new__(model)
    state = row["_state"] = ModelState()
    state.adding = False
    state.db = using
    instance.__dict__ = row
    return instance


_empty_rows: dict[type[models.Model], dict[str, None]] = {}
