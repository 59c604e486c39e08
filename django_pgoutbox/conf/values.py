"""The settings' names, defaults, limits and typed values (``PgOutboxSettings`` and its parts)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

SETTING_NAME = "PGOUTBOX"

#: The notification channel that wakes job workers; the payload is the queue name.
JOBS_CHANNEL = "pgoutbox_jobs"
#: The notification channel that tells workers a running job of a queue was asked to stop.
CANCEL_CHANNEL = "pgoutbox_cancel"
#: The notification channel that wakes the outbox relay; the payload is the event type.
OUTBOX_CHANNEL = "outbox_ready"
#: The notification channel that tells workers a queue was paused, resumed or resized at run time
#: (``queue_controls``); the payload is the queue name.
CONTROL_CHANNEL = "pgoutbox_queues"
#: The notification channel that wakes ``Job.wait()``: jobs finished (completed, dead, cancelled);
#: the payload is the last 8 hex digits of each one's id, space-separated (queries.results).
RESULTS_CHANNEL = "pgoutbox_results"

#: Queue names travel in NOTIFY payloads, metric labels and command-line flags: keep them plain.
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$")

#: The longest duration any setting, retry or snooze may ask for (365 days), in seconds. Every
#: delay is refused when it is not a finite number >= 0 and cut to this ceiling where it is made,
#: so that ``now() + delay`` (PostgreSQL) and ``Event.wait(delay)`` (Python) always accept it.
MAX_DELAY_CEILING = 365 * 24 * 3600.0

#: The longest retention a setting may keep finished rows for (100 years), in seconds.
MAX_RETENTION = 100 * 365 * 24 * 3600.0

#: The shortest ``LEASE_SECONDS``: a lease shorter than a renewal's round trip (1e-9 s is
#: "now" to PostgreSQL's microseconds) expires while its job runs, which then runs twice.
MIN_LEASE_SECONDS = 0.5

#: The most handler threads one queue of one process may run (``CONCURRENCY``,
#: ``runworkers --concurrency``): each is an operating system thread with its own stack.
MAX_CONCURRENCY = 1000

#: The most coroutines of ``async def`` handlers one queue of one process may run at once
#: (``ASYNC_CONCURRENCY``): they share one event loop thread, so this bounds memory, not threads.
MAX_ASYNC_CONCURRENCY = 10_000

#: ``attempts`` and ``max_attempts`` are 32-bit integer columns.
MAX_INT32 = 2**31 - 1

#: The largest value a jsonb column stores (PostgreSQL's ``JENTRY_OFFLENMASK``, 256 MiB - 1): the
#: ceiling of ``MAX_PAYLOAD_BYTES`` and ``MAX_RESULT_BYTES``.
MAX_JSONB_BYTES = 2**28 - 1

#: The default of ``MAX_PAYLOAD_BYTES`` and ``MAX_RESULT_BYTES``: 1 MiB (docs/settings.md says why).
DEFAULT_MAX_JSON_BYTES = 2**20

#: Keys a queue may override; each defaults to the top-level key of the same name.
QUEUE_KEYS = ("CONCURRENCY", "ASYNC_CONCURRENCY", "LEASE_SECONDS", "POLL_INTERVAL")

DEFAULTS: dict[str, Any] = {
    # Queue name -> overrides of CONCURRENCY, ASYNC_CONCURRENCY, LEASE_SECONDS and POLL_INTERVAL
    # for that queue.
    "QUEUES": {"default": {}},
    # Handler threads per queue in one ``runworkers`` process.
    "CONCURRENCY": 4,
    # Coroutines of ``async def`` handlers in flight per queue in one process, on the queue's one
    # event loop thread (started when the queue first runs one).
    "ASYNC_CONCURRENCY": 100,
    # How long a claim lasts before another worker may take the job over; renewed while it runs.
    "LEASE_SECONDS": 60,
    # Seconds between reconciliation polls; NOTIFY only shortens the wait.
    "POLL_INTERVAL": 5.0,
    # Attempts a job gets unless its @job(max_attempts=...) says otherwise.
    "MAX_ATTEMPTS": 10,
    # The largest payload of a job or an event, in bytes of its JSON text; None: no cap.
    "MAX_PAYLOAD_BYTES": DEFAULT_MAX_JSON_BYTES,
    # The largest result a handler may return, in bytes of its JSON text; None: no cap. A larger
    # one ends its job dead (code result_too_large).
    "MAX_RESULT_BYTES": DEFAULT_MAX_JSON_BYTES,
    "RETRY": {
        # Exponential backoff: BASE_DELAY * 2**min(attempt, 10), capped at MAX_DELAY (seconds).
        "BASE_DELAY": 1.0,
        "MAX_DELAY": 3600.0,
        # Fraction of the delay added or removed at random, so that retries do not stampede.
        "JITTER": 0.1,
        # Retries granted to an exception the policy does not know, before it is dead-lettered.
        "UNKNOWN_ERROR_RETRIES": 3,
    },
    "RETENTION": {
        # How long finished rows are kept before pruning; None keeps them forever.
        "COMPLETED_JOBS": timedelta(days=7),
        "CANCELLED_JOBS": timedelta(days=7),
        "PROCESSED_EVENTS": timedelta(days=7),
        # Messages accept_message() recorded; a redelivery after this is accepted again.
        "INBOX_MESSAGES": timedelta(days=7),
    },
    "OUTBOX": {
        # Events the relay claims (and projects in one transaction) at a time.
        "BATCH_SIZE": 500,
        # The relay's claim lasts this long; then another relay may take the event over.
        "CLAIM_SECONDS": 60,
        # Projection attempts before a failing event is dead (its aggregate's later events wait).
        "MAX_ATTEMPTS": 10,
        # Seconds between the relay's polls; None uses the top-level POLL_INTERVAL.
        "POLL_INTERVAL": None,
        # Outbox reconciliation warns about events still unprocessed this long after they occurred.
        "OVERDUE_SECONDS": 300,
    },
    # The queue of the built-in maintenance schedules (lease recovery, pruning, reconciliation).
    "MAINTENANCE_QUEUE": "default",
    # Send pg_notify wake-ups on enqueue and publish; workers poll either way.
    "NOTIFY": True,
    # Recurring schedules: name -> definition (see docs/scheduling.md).
    "SCHEDULES": {},
    # The time zone of every CRON schedule that names none (its TZ): an IANA name.
    "SCHEDULE_TZ": "UTC",
    # Database alias -> alias of a direct connection to LISTEN on, for a database reached
    # through a transaction-pooling proxy (see docs/databases.md).
    "LISTEN_DATABASES": {},
    # pgoutbox stats, health and the admin's overview warn when a transaction, a prepared
    # transaction or a replication slot has held the xmin horizon this many seconds (vacuum
    # cannot clean the queue's tables meanwhile); None: no warning.
    "HORIZON_WARNING_SECONDS": 300,
    # enqueue() of a job type that no @job of this process declares: False warns
    # (UnknownJobTypeWarning) and writes the job, True refuses it (EnqueueError).
    "STRICT_JOB_TYPES": False,
    # Job types that workers of other services run: enqueued by name, neither warned about nor
    # refused.
    "REMOTE_JOB_TYPES": [],
    # Who may read the views /pgoutbox/metrics and /pgoutbox/health: a request that any rule
    # admits (see docs/observability.md). By default, active staff users only.
    "VIEWS_AUTH": {
        # Active staff users (superusers among them).
        "STAFF": True,
        # Active users holding this permission, as "app_label.codename" ("pgoutbox.view_job").
        "PERMISSION": None,
        # A callable request -> bool, or its dotted path: the request is admitted if it
        # returns True.
        "CALLABLE": None,
        # The name of an environment variable holding a token (at least MIN_TOKEN_LENGTH
        # characters): a request with "Authorization: Bearer <token>" is admitted.
        "BEARER_TOKEN_ENV": None,
    },
}

#: The shortest bearer token the views accept: a shorter one (or none) admits no request.
MIN_TOKEN_LENGTH = 16

#: Per-queue keys that have no top-level counterpart, with their defaults (docs/limits.md).
QUEUE_ONLY_DEFAULTS: dict[str, Any] = {
    "PREFETCH": 2000,
    "CONNECTIONS": 2,
    "FAIR": False,
    "MAX_RUNNING": None,
    "RATE_LIMIT": None,
    "LIMIT_BY": None,
    "PRIORITY_AGING": None,
}

#: The keys of a queue's ``PRIORITY_AGING``; both are required.
PRIORITY_AGING_KEYS = ("EVERY", "UP_TO")
#: The shortest ``PRIORITY_AGING["EVERY"]`` (seconds): a pass of aging runs at most a few times
#: a step, and each reads the queue's waiting jobs below the cap.
MIN_AGING_STEP = 1.0

#: Values of a queue's LIMIT_BY.
LIMIT_BY_CHOICES = ("organization",)


@dataclass(frozen=True)
class PriorityAging:
    """A queue's ``PRIORITY_AGING``: a job due and waiting gains one priority per ``every``
    seconds of its wait, up to ``up_to`` (docs/workers.md, "Priority aging")."""

    every: float
    up_to: int


@dataclass(frozen=True)
class QueueSettings:
    name: str
    concurrency: int
    lease_seconds: float
    poll_interval: float
    #: The most jobs a worker may hold claimed beyond its busy threads, so that fast jobs are
    #: claimed in batches; how many it holds follows the queue's pace (see docs/workers.md).
    prefetch: int = 2000
    #: The dispatcher connections of this queue in each worker: with two, a claim can go out
    #: while the previous one is still in flight (see docs/workers.md). A fair or limited queue
    #: claims under its lock, one connection.
    connections: int = 2
    #: Interleave organizations in each claim (see docs/limits.md).
    fair: bool = False
    #: Most jobs of this queue running at once across every worker; None: no cap.
    max_running: int | None = None
    #: Most jobs of this queue started per second across every worker; None: no limit.
    rate_limit: float | None = None
    #: "organization": MAX_RUNNING and RATE_LIMIT apply to each organization apart.
    limit_by: str | None = None
    #: Raise the priority of the jobs that wait (see ``PriorityAging``); None: off.
    priority_aging: PriorityAging | None = None
    #: Coroutines of ``async def`` handlers in flight at once on the queue's event loop.
    async_concurrency: int = 100

    @property
    def limited(self) -> bool:
        """Whether claims of this queue must be serialized across workers to honour a limit."""
        return self.max_running is not None or self.rate_limit is not None


@dataclass(frozen=True)
class RetrySettings:
    base_delay: float
    max_delay: float
    jitter: float
    unknown_error_retries: int


@dataclass(frozen=True)
class RetentionSettings:
    completed_jobs: timedelta | None
    cancelled_jobs: timedelta | None
    processed_events: timedelta | None
    inbox_messages: timedelta | None


@dataclass(frozen=True)
class OutboxSettings:
    batch_size: int
    claim_seconds: float
    max_attempts: int
    poll_interval: float
    overdue_seconds: float


@dataclass(frozen=True)
class ViewsAuthSettings:
    """Who may read the monitoring views: a request that any of these rules admits."""

    #: Active staff users.
    staff: bool = True
    #: Active users holding this permission ("app_label.codename").
    permission: str | None = None
    #: ``request -> bool``, or its dotted path (imported when first used).
    check: Callable[[Any], Any] | str | None = None
    #: The environment variable whose value is the bearer token.
    bearer_token_env: str | None = None


@dataclass(frozen=True)
class PgOutboxSettings:
    queues: Mapping[str, QueueSettings]
    concurrency: int
    lease_seconds: float
    poll_interval: float
    max_attempts: int
    retry: RetrySettings
    retention: RetentionSettings
    outbox: OutboxSettings
    maintenance_queue: str
    notify: bool
    schedules: Mapping[str, Any] = field(default_factory=dict)
    #: The IANA zone of the CRON schedules that give no ``TZ`` of their own.
    schedule_tz: str = "UTC"
    #: Database alias -> the alias whose connection LISTENs for it (a direct connection when
    #: the main one goes through a transaction-pooling proxy).
    listen_databases: Mapping[str, str] = field(default_factory=dict)
    #: Who may read the views (``PGOUTBOX["VIEWS_AUTH"]``).
    views_auth: ViewsAuthSettings = field(default_factory=ViewsAuthSettings)
    #: The largest payload (of a job or an event) and handler result, in bytes of JSON text;
    #: None: no cap but PostgreSQL's.
    max_payload_bytes: int | None = DEFAULT_MAX_JSON_BYTES
    max_result_bytes: int | None = DEFAULT_MAX_JSON_BYTES
    #: Seconds a holder of the xmin horizon may hold it before the reports warn; None: never.
    horizon_warning_seconds: float | None = 300.0
    #: Whether enqueue() refuses a job type no ``@job`` declares (else it warns).
    strict_job_types: bool = False
    #: Job types run by workers of other services (``REMOTE_JOB_TYPES``).
    remote_job_types: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SettingsProblem:
    """One thing wrong with ``PGOUTBOX``; ``check_id`` is the system check that reports it."""

    key: str
    message: str
    hint: str | None = None
    check_id: str = "pgoutbox.E004"

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"
