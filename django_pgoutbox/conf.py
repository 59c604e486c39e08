"""The ``PGOUTBOX`` settings dict, merged over documented defaults, typed and validated.

Every value is read through :func:`get_settings`, which parses ``settings.PGOUTBOX`` once and
caches the result until Django's ``setting_changed`` signal says it changed (as
``override_settings`` does). Parsing collects every problem instead of stopping at the first, so
that one ``manage.py check`` run names them all. :mod:`django_pgoutbox.checks` turns them into
system check errors, and :func:`get_settings` raises ``ImproperlyConfigured`` if code runs with a
broken configuration anyway.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

SETTING_NAME = "PGOUTBOX"

#: The notification channel that wakes job workers; the payload is the queue name.
JOBS_CHANNEL = "pgoutbox_jobs"
#: The notification channel that tells workers a running job of a queue was asked to stop.
CANCEL_CHANNEL = "pgoutbox_cancel"
#: The notification channel that wakes the outbox relay; the payload is the event type.
OUTBOX_CHANNEL = "outbox_ready"

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

#: ``attempts`` and ``max_attempts`` are 32-bit integer columns.
MAX_INT32 = 2**31 - 1

#: Keys a queue may override; each defaults to the top-level key of the same name.
QUEUE_KEYS = ("CONCURRENCY", "LEASE_SECONDS", "POLL_INTERVAL")

DEFAULTS: dict[str, Any] = {
    # Queue name -> overrides of CONCURRENCY, LEASE_SECONDS and POLL_INTERVAL for that queue.
    "QUEUES": {"default": {}},
    # Handler threads per queue in one ``runworkers`` process.
    "CONCURRENCY": 4,
    # How long a claim lasts before another worker may take the job over; renewed while it runs.
    "LEASE_SECONDS": 60,
    # Seconds between reconciliation polls; NOTIFY only shortens the wait.
    "POLL_INTERVAL": 5.0,
    # Attempts a job gets unless its @job(max_attempts=...) says otherwise.
    "MAX_ATTEMPTS": 10,
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
    # Database alias -> alias of a direct connection to LISTEN on, for a database reached
    # through a transaction-pooling proxy (see docs/databases.md).
    "LISTEN_DATABASES": {},
}

#: Per-queue keys that have no top-level counterpart, with their defaults (docs/limits.md).
QUEUE_ONLY_DEFAULTS: dict[str, Any] = {
    "PREFETCH": 2000,
    "CONNECTIONS": 2,
    "FAIR": False,
    "MAX_RUNNING": None,
    "RATE_LIMIT": None,
    "LIMIT_BY": None,
}

#: Values of a queue's LIMIT_BY.
LIMIT_BY_CHOICES = ("organization",)


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


@dataclass(frozen=True)
class OutboxSettings:
    batch_size: int
    claim_seconds: float
    max_attempts: int
    poll_interval: float
    overdue_seconds: float


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
    #: Database alias -> the alias whose connection LISTENs for it (a direct connection when
    #: the main one goes through a transaction-pooling proxy).
    listen_databases: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SettingsProblem:
    """One thing wrong with ``PGOUTBOX``; ``check_id`` is the system check that reports it."""

    key: str
    message: str
    hint: str | None = None
    check_id: str = "pgoutbox.E004"

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class _Parser:
    def __init__(self) -> None:
        self.problems: list[SettingsProblem] = []

    def problem(self, key: str, message: str, hint: str | None = None, check_id: str = "") -> None:
        self.problems.append(SettingsProblem(key, message, hint, check_id or "pgoutbox.E004"))

    def section(self, raw: Any, defaults: Mapping[str, Any], key: str) -> dict[str, Any]:
        """Merge ``raw`` over ``defaults``, reporting a non-dict or unknown keys."""
        if raw is None:
            return dict(defaults)
        if not isinstance(raw, Mapping):
            self.problem(
                key, f"must be a dict, not {type(raw).__name__}.", check_id="pgoutbox.E003"
            )
            return dict(defaults)
        for name in raw:
            if name not in defaults:
                self.unknown_key(f"{key}[{name!r}]", name, defaults)
        return {**defaults, **{k: v for k, v in raw.items() if k in defaults}}

    def unknown_key(self, key: str, name: object, known: Mapping[str, Any]) -> None:
        close = difflib.get_close_matches(str(name), list(known), n=1)
        hint = f"Did you mean {close[0]!r}?" if close else f"Known keys: {', '.join(known)}."
        self.problem(key, "is not a setting of django-pgoutbox.", hint, "pgoutbox.E003")

    def positive_int(
        self, value: Any, key: str, *, minimum: int = 1, maximum: int = MAX_INT32
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.problem(key, f"must be an integer >= {minimum}, not {value!r}.")
            return minimum
        if value > maximum:
            self.problem(key, f"must be an integer <= {maximum}, not {value!r}.")
            return maximum
        return value

    def seconds(
        self,
        value: Any,
        key: str,
        *,
        allow_zero: bool = False,
        minimum: float = 0.0,
        maximum: float = MAX_DELAY_CEILING,
    ) -> float:
        """A duration as a number of seconds or a ``timedelta``, from ``minimum`` to
        ``maximum``."""
        if isinstance(value, timedelta):
            number = value.total_seconds()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        else:
            self.problem(key, f"must be a number of seconds or a timedelta, not {value!r}.")
            return 1.0
        if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            self.problem(key, f"must be {bound} seconds, not {value!r}.")
            return 1.0
        if number < minimum:
            self.problem(key, f"must be at least {minimum:g} seconds, not {value!r}.")
            return minimum
        if number > maximum:
            self.problem(
                key,
                f"must be at most {maximum:.0f} seconds ({maximum / 86400:.0f} days), "
                f"not {value!r}.",
            )
            return maximum
        return number

    def fraction(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            self.problem(key, f"must be a number between 0 and 1, not {value!r}.")
            return 0.0
        return float(value)

    def age(self, value: Any, key: str) -> timedelta | None:
        if value is None:
            return None
        return timedelta(seconds=self.seconds(value, key, maximum=MAX_RETENTION))


def parse_settings(raw: Any) -> tuple[PgOutboxSettings, list[SettingsProblem]]:
    """Parse a ``PGOUTBOX`` value; return usable settings (defaults where broken) and problems."""
    parser = _Parser()
    top = parser.section(raw, DEFAULTS, SETTING_NAME)

    concurrency = parser.positive_int(top["CONCURRENCY"], f"{SETTING_NAME}['CONCURRENCY']")
    lease = parser.seconds(
        top["LEASE_SECONDS"], f"{SETTING_NAME}['LEASE_SECONDS']", minimum=MIN_LEASE_SECONDS
    )
    poll = parser.seconds(top["POLL_INTERVAL"], f"{SETTING_NAME}['POLL_INTERVAL']")
    queues = _parse_queues(parser, top["QUEUES"], concurrency, lease, poll)

    retry_key = f"{SETTING_NAME}['RETRY']"
    retry_raw = parser.section(top["RETRY"], DEFAULTS["RETRY"], retry_key)
    retry = RetrySettings(
        base_delay=parser.seconds(retry_raw["BASE_DELAY"], f"{retry_key}['BASE_DELAY']"),
        max_delay=parser.seconds(retry_raw["MAX_DELAY"], f"{retry_key}['MAX_DELAY']"),
        jitter=parser.fraction(retry_raw["JITTER"], f"{retry_key}['JITTER']"),
        unknown_error_retries=parser.positive_int(
            retry_raw["UNKNOWN_ERROR_RETRIES"], f"{retry_key}['UNKNOWN_ERROR_RETRIES']", minimum=0
        ),
    )
    if retry.max_delay < retry.base_delay:
        parser.problem(
            f"{retry_key}['MAX_DELAY']",
            f"({retry.max_delay:g}s) is smaller than BASE_DELAY ({retry.base_delay:g}s).",
        )

    retention_key = f"{SETTING_NAME}['RETENTION']"
    retention_raw = parser.section(top["RETENTION"], DEFAULTS["RETENTION"], retention_key)
    retention = RetentionSettings(
        completed_jobs=parser.age(
            retention_raw["COMPLETED_JOBS"], f"{retention_key}['COMPLETED_JOBS']"
        ),
        cancelled_jobs=parser.age(
            retention_raw["CANCELLED_JOBS"], f"{retention_key}['CANCELLED_JOBS']"
        ),
        processed_events=parser.age(
            retention_raw["PROCESSED_EVENTS"], f"{retention_key}['PROCESSED_EVENTS']"
        ),
    )

    outbox_key = f"{SETTING_NAME}['OUTBOX']"
    outbox_raw = parser.section(top["OUTBOX"], DEFAULTS["OUTBOX"], outbox_key)
    outbox_poll = outbox_raw["POLL_INTERVAL"]
    outbox = OutboxSettings(
        batch_size=parser.positive_int(outbox_raw["BATCH_SIZE"], f"{outbox_key}['BATCH_SIZE']"),
        claim_seconds=parser.seconds(outbox_raw["CLAIM_SECONDS"], f"{outbox_key}['CLAIM_SECONDS']"),
        max_attempts=parser.positive_int(
            outbox_raw["MAX_ATTEMPTS"], f"{outbox_key}['MAX_ATTEMPTS']"
        ),
        poll_interval=poll
        if outbox_poll is None
        else parser.seconds(outbox_poll, f"{outbox_key}['POLL_INTERVAL']"),
        overdue_seconds=parser.seconds(
            outbox_raw["OVERDUE_SECONDS"], f"{outbox_key}['OVERDUE_SECONDS']"
        ),
    )
    maintenance_queue = top["MAINTENANCE_QUEUE"]
    if not isinstance(maintenance_queue, str) or maintenance_queue not in queues:
        parser.problem(
            f"{SETTING_NAME}['MAINTENANCE_QUEUE']",
            f"{maintenance_queue!r} is not one of the configured queues.",
            "Name a queue of PGOUTBOX['QUEUES'], or add a 'default' queue.",
        )

    notify = top["NOTIFY"]
    if not isinstance(notify, bool):
        parser.problem(f"{SETTING_NAME}['NOTIFY']", f"must be True or False, not {notify!r}.")
        notify = True

    schedules = top["SCHEDULES"]
    if not isinstance(schedules, Mapping):
        parser.problem(
            f"{SETTING_NAME}['SCHEDULES']", f"must be a dict, not {type(schedules).__name__}."
        )
        schedules = {}

    listen_databases = top["LISTEN_DATABASES"]
    listen_key = f"{SETTING_NAME}['LISTEN_DATABASES']"
    if not isinstance(listen_databases, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in listen_databases.items()
    ):
        parser.problem(
            listen_key,
            f"must be a dict of database alias -> alias to LISTEN on, not {listen_databases!r}.",
        )
        listen_databases = {}
    else:
        for alias, target in listen_databases.items():
            for name in (alias, target):
                if name not in settings.DATABASES:
                    parser.problem(
                        f"{listen_key}[{alias!r}]",
                        f"names {name!r}, which is not in DATABASES.",
                        check_id="pgoutbox.E003",
                    )

    parsed = PgOutboxSettings(
        queues=queues,
        concurrency=concurrency,
        lease_seconds=lease,
        poll_interval=poll,
        max_attempts=parser.positive_int(top["MAX_ATTEMPTS"], f"{SETTING_NAME}['MAX_ATTEMPTS']"),
        retry=retry,
        retention=retention,
        outbox=outbox,
        maintenance_queue=str(maintenance_queue),
        notify=notify,
        schedules=dict(schedules),
        listen_databases=dict(listen_databases),
    )
    return parsed, parser.problems


def _parse_queues(
    parser: _Parser, raw: Any, concurrency: int, lease: float, poll: float
) -> dict[str, QueueSettings]:
    key = f"{SETTING_NAME}['QUEUES']"
    if not isinstance(raw, Mapping):
        parser.problem(key, f"must be a dict of queue name -> options, not {type(raw).__name__}.")
        return {}
    if not raw:
        parser.problem(key, "names no queue; workers would have nothing to run.")
    queues: dict[str, QueueSettings] = {}
    for name, options in raw.items():
        queue_key = f"{key}[{name!r}]"
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            parser.problem(
                queue_key,
                "is not a valid queue name.",
                "Use 1-63 letters, digits, '_', '.', ':' or '-', starting with a letter or digit.",
            )
            continue
        inherited = {
            "CONCURRENCY": concurrency,
            "LEASE_SECONDS": lease,
            "POLL_INTERVAL": poll,
            **QUEUE_ONLY_DEFAULTS,
        }
        merged = parser.section(options, inherited, queue_key)
        fair = merged["FAIR"]
        if not isinstance(fair, bool):
            parser.problem(f"{queue_key}['FAIR']", f"must be True or False, not {fair!r}.")
            fair = False
        max_running = merged["MAX_RUNNING"]
        if max_running is not None:
            max_running = parser.positive_int(max_running, f"{queue_key}['MAX_RUNNING']")
        rate_limit = merged["RATE_LIMIT"]
        if rate_limit is not None:
            if (
                isinstance(rate_limit, bool)
                or not isinstance(rate_limit, int | float)
                or not math.isfinite(rate_limit)
                or rate_limit <= 0
            ):
                parser.problem(
                    f"{queue_key}['RATE_LIMIT']",
                    f"must be a number of jobs per second > 0, or None, not {rate_limit!r}.",
                )
                rate_limit = None
            else:
                rate_limit = float(rate_limit)
        limit_by = merged["LIMIT_BY"]
        if limit_by is not None and limit_by not in LIMIT_BY_CHOICES:
            parser.problem(
                f"{queue_key}['LIMIT_BY']",
                f"must be None or 'organization', not {limit_by!r}.",
            )
            limit_by = None
        if limit_by is not None and max_running is None and rate_limit is None:
            parser.problem(
                f"{queue_key}['LIMIT_BY']",
                "has nothing to apply to.",
                "Set MAX_RUNNING or RATE_LIMIT on this queue too, or remove LIMIT_BY.",
            )
        prefetch = parser.positive_int(merged["PREFETCH"], f"{queue_key}['PREFETCH']", minimum=0)
        queues[name] = QueueSettings(
            name=name,
            prefetch=prefetch,
            connections=parser.positive_int(
                merged["CONNECTIONS"], f"{queue_key}['CONNECTIONS']", minimum=1
            ),
            concurrency=parser.positive_int(merged["CONCURRENCY"], f"{queue_key}['CONCURRENCY']"),
            lease_seconds=parser.seconds(
                merged["LEASE_SECONDS"], f"{queue_key}['LEASE_SECONDS']", minimum=MIN_LEASE_SECONDS
            ),
            poll_interval=parser.seconds(merged["POLL_INTERVAL"], f"{queue_key}['POLL_INTERVAL']"),
            fair=fair,
            max_running=max_running,
            rate_limit=rate_limit,
            limit_by=limit_by,
        )
    return queues


@functools.cache
def _cached() -> tuple[PgOutboxSettings, tuple[SettingsProblem, ...]]:
    parsed, problems = parse_settings(getattr(settings, SETTING_NAME, None))
    return parsed, tuple(problems)


def settings_problems() -> tuple[SettingsProblem, ...]:
    """What is wrong with the current ``PGOUTBOX`` (empty when it is valid)."""
    return _cached()[1]


def get_settings() -> PgOutboxSettings:
    """The parsed ``PGOUTBOX``; raises ``ImproperlyConfigured`` naming every bad key."""
    parsed, problems = _cached()
    if problems:
        raise ImproperlyConfigured(
            "Invalid PGOUTBOX setting:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return parsed


@receiver(setting_changed)
def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _cached.cache_clear()
