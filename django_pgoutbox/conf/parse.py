"""Parsing ``PGOUTBOX``: every problem collected, each naming its key, with defaults where a
value is broken."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.conf import settings

from django_pgoutbox.conf.values import (
    DEFAULTS,
    LIMIT_BY_CHOICES,
    MAX_ASYNC_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_DELAY_CEILING,
    MAX_INT32,
    MAX_JSONB_BYTES,
    MAX_RETENTION,
    MIN_AGING_STEP,
    MIN_LEASE_SECONDS,
    PRIORITY_AGING_KEYS,
    QUEUE_NAME_RE,
    QUEUE_ONLY_DEFAULTS,
    SETTING_NAME,
    OutboxSettings,
    PgOutboxSettings,
    PriorityAging,
    QueueSettings,
    RetentionSettings,
    RetrySettings,
    SettingsProblem,
    ViewsAuthSettings,
)
from django_pgoutbox.cron import CronError, parse_zone


class Parser:
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

    def byte_cap(self, value: Any, key: str) -> int | None:
        """A size in bytes of JSON, from 2 (``{}``) to what a jsonb column holds; or None."""
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 2 <= value <= MAX_JSONB_BYTES
        ):
            self.problem(
                key,
                f"must be a number of bytes from 2 to {MAX_JSONB_BYTES:,} (the most a jsonb "
                f"value holds), or None for no cap, not {value!r}.",
            )
            return None
        return value

    def threshold(self, value: Any, key: str) -> float | None:
        """A number of seconds >= 0 (a ``timedelta`` too), or None for no threshold."""
        if value is None:
            return None
        return self.seconds(value, key, allow_zero=True)

    def age(self, value: Any, key: str) -> timedelta | None:
        if value is None:
            return None
        return timedelta(seconds=self.seconds(value, key, maximum=MAX_RETENTION))


def parse_settings(raw: Any) -> tuple[PgOutboxSettings, list[SettingsProblem]]:
    """Parse a ``PGOUTBOX`` value; return usable settings (defaults where broken) and problems."""
    parser = Parser()
    top = parser.section(raw, DEFAULTS, SETTING_NAME)

    concurrency = parser.positive_int(
        top["CONCURRENCY"], f"{SETTING_NAME}['CONCURRENCY']", maximum=MAX_CONCURRENCY
    )
    lease = parser.seconds(
        top["LEASE_SECONDS"], f"{SETTING_NAME}['LEASE_SECONDS']", minimum=MIN_LEASE_SECONDS
    )
    poll = parser.seconds(top["POLL_INTERVAL"], f"{SETTING_NAME}['POLL_INTERVAL']")
    async_concurrency = parser.positive_int(
        top["ASYNC_CONCURRENCY"],
        f"{SETTING_NAME}['ASYNC_CONCURRENCY']",
        maximum=MAX_ASYNC_CONCURRENCY,
    )
    queues = _parse_queues(parser, top["QUEUES"], concurrency, async_concurrency, lease, poll)

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
        inbox_messages=parser.age(
            retention_raw["INBOX_MESSAGES"], f"{retention_key}['INBOX_MESSAGES']"
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

    schedule_tz = top["SCHEDULE_TZ"]
    try:
        schedule_tz = parse_zone(schedule_tz).key  # a ZoneInfo given is kept by its name
    except CronError as error:
        parser.problem(f"{SETTING_NAME}['SCHEDULE_TZ']", f"{error}.")
        schedule_tz = "UTC"

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

    strict_job_types = top["STRICT_JOB_TYPES"]
    if not isinstance(strict_job_types, bool):
        parser.problem(
            f"{SETTING_NAME}['STRICT_JOB_TYPES']",
            f"must be True or False, not {strict_job_types!r}.",
        )
        strict_job_types = False
    remote_job_types = top["REMOTE_JOB_TYPES"]
    if isinstance(remote_job_types, str) or not (
        isinstance(remote_job_types, list | tuple | set | frozenset)
        and all(isinstance(name, str) and name.strip() for name in remote_job_types)
    ):
        parser.problem(
            f"{SETTING_NAME}['REMOTE_JOB_TYPES']",
            f"must be a list of job type names, not {remote_job_types!r}.",
            "List the job types that workers of other services run, such as ['billing.invoice'].",
        )
        remote_job_types = []

    views_key = f"{SETTING_NAME}['VIEWS_AUTH']"
    views_auth = _parse_views_auth(
        parser, parser.section(top["VIEWS_AUTH"], DEFAULTS["VIEWS_AUTH"], views_key), views_key
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
        schedule_tz=str(schedule_tz),
        listen_databases=dict(listen_databases),
        views_auth=views_auth,
        max_payload_bytes=parser.byte_cap(
            top["MAX_PAYLOAD_BYTES"], f"{SETTING_NAME}['MAX_PAYLOAD_BYTES']"
        ),
        max_result_bytes=parser.byte_cap(
            top["MAX_RESULT_BYTES"], f"{SETTING_NAME}['MAX_RESULT_BYTES']"
        ),
        horizon_warning_seconds=parser.threshold(
            top["HORIZON_WARNING_SECONDS"], f"{SETTING_NAME}['HORIZON_WARNING_SECONDS']"
        ),
        strict_job_types=strict_job_types,
        remote_job_types=frozenset(remote_job_types),
    )
    return parsed, parser.problems


_PERMISSION_RE = re.compile(r"^[A-Za-z_][\w]*\.[\w.-]+$")
_DOTTED_PATH_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _is_dotted_path(value: Any) -> bool:
    return isinstance(value, str) and _DOTTED_PATH_RE.match(value) is not None


def _parse_views_auth(parser: Parser, raw: dict[str, Any], key: str) -> ViewsAuthSettings:
    """The rules of ``VIEWS_AUTH``; none that admits anyone is a problem too (the views would
    refuse every request, which is what leaving them out of the URLconf does more plainly)."""
    staff = raw["STAFF"]
    if not isinstance(staff, bool):
        parser.problem(f"{key}['STAFF']", f"must be True or False, not {staff!r}.")
        staff = True
    permission = raw["PERMISSION"]
    if permission is not None and (
        not isinstance(permission, str) or not _PERMISSION_RE.match(permission)
    ):
        parser.problem(
            f"{key}['PERMISSION']",
            f"must be a permission as 'app_label.codename' (such as 'pgoutbox.view_job'), or "
            f"None, not {permission!r}.",
        )
        permission = None
    check = raw["CALLABLE"]
    if not (check is None or callable(check) or _is_dotted_path(check)):
        parser.problem(
            f"{key}['CALLABLE']",
            f"must be a callable request -> bool, its dotted path, or None, not {check!r}.",
        )
        check = None
    token_env = raw["BEARER_TOKEN_ENV"]
    if token_env is not None and (
        not isinstance(token_env, str) or not _ENV_NAME_RE.match(token_env)
    ):
        parser.problem(
            f"{key}['BEARER_TOKEN_ENV']",
            f"must be the name of an environment variable, or None, not {token_env!r}.",
        )
        token_env = None
    rules = ViewsAuthSettings(
        staff=staff, permission=permission, check=check, bearer_token_env=token_env
    )
    if not (staff or permission or check is not None or token_env):
        parser.problem(
            key,
            "admits no request: the views would refuse everyone.",
            "Leave STAFF True, or set PERMISSION, CALLABLE or BEARER_TOKEN_ENV.",
        )
    return rules


def _parse_queues(
    parser: Parser, raw: Any, concurrency: int, async_concurrency: int, lease: float, poll: float
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
            "ASYNC_CONCURRENCY": async_concurrency,
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
            concurrency=parser.positive_int(
                merged["CONCURRENCY"], f"{queue_key}['CONCURRENCY']", maximum=MAX_CONCURRENCY
            ),
            async_concurrency=parser.positive_int(
                merged["ASYNC_CONCURRENCY"],
                f"{queue_key}['ASYNC_CONCURRENCY']",
                maximum=MAX_ASYNC_CONCURRENCY,
            ),
            lease_seconds=parser.seconds(
                merged["LEASE_SECONDS"], f"{queue_key}['LEASE_SECONDS']", minimum=MIN_LEASE_SECONDS
            ),
            poll_interval=parser.seconds(merged["POLL_INTERVAL"], f"{queue_key}['POLL_INTERVAL']"),
            fair=fair,
            max_running=max_running,
            rate_limit=rate_limit,
            limit_by=limit_by,
            priority_aging=_parse_aging(
                parser, merged["PRIORITY_AGING"], f"{queue_key}['PRIORITY_AGING']"
            ),
        )
    return queues


def _parse_aging(parser: Parser, raw: Any, key: str) -> PriorityAging | None:
    """A queue's ``PRIORITY_AGING``: None (off), or ``{"EVERY": seconds, "UP_TO": priority}``,
    both keys required (no default would suit every queue's priorities)."""
    if raw is None:
        return None
    options = parser.section(raw, dict.fromkeys(PRIORITY_AGING_KEYS), key)
    if not isinstance(raw, Mapping):
        return None
    missing = [name for name in PRIORITY_AGING_KEYS if raw.get(name) is None]
    for name in missing:
        parser.problem(
            f"{key}[{name!r}]",
            "is required.",
            "Give EVERY (the wait, in seconds or a timedelta, that raises a job's priority by "
            "one) and UP_TO (the highest priority aging gives), or set PRIORITY_AGING to None.",
        )
    if missing:
        return None
    up_to = options["UP_TO"]
    if (
        isinstance(up_to, bool)
        or not isinstance(up_to, int)
        or not -MAX_INT32 - 1 <= up_to <= MAX_INT32
    ):
        parser.problem(
            f"{key}['UP_TO']",
            f"must be a priority: an integer from {-MAX_INT32 - 1} to {MAX_INT32}, not {up_to!r}.",
        )
        return None
    every = parser.seconds(options["EVERY"], f"{key}['EVERY']", minimum=MIN_AGING_STEP)
    return PriorityAging(every=every, up_to=up_to)
