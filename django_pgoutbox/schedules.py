"""What the schedules are: the built-in maintenance ones, ``PGOUTBOX["SCHEDULES"]`` and
``@schedule``, each checked into a :class:`Schedule` that knows its slots (``scheduler`` runs
them)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from django_pgoutbox.conf import MAX_DELAY_CEILING, get_settings
from django_pgoutbox.cron import Cron, CronError, parse_zone
from django_pgoutbox.enqueueing import prepare_job
from django_pgoutbox.errors import EnqueueError
from django_pgoutbox.registry import JobDefinition, get_job
from django_pgoutbox.retry import summarize
from django_pgoutbox.validation import MAX_NAME_BYTES, check_text

CATCH_UP_POLICIES = ("latest", "all", "none")
SCHEDULE_KEYS = (
    "JOB",
    "CRON",
    "TZ",
    "EVERY",
    "QUEUE",
    "PAYLOAD",
    "PRIORITY",
    "CATCH_UP",
    "MAX_CATCH_UP",
    "GRACE",
)

#: The maintenance schedules every project gets, unless ``SCHEDULES`` overrides or removes them
#: (``"pgoutbox.prune": None``). Their queue is ``PGOUTBOX['MAINTENANCE_QUEUE']``.
BUILTIN_SCHEDULES: dict[str, dict[str, Any]] = {
    "pgoutbox.recover_leases": {"JOB": "pgoutbox.recover_leases", "EVERY": 30},
    "pgoutbox.reconcile_outbox": {"JOB": "pgoutbox.reconcile_outbox", "EVERY": 300},
    "pgoutbox.prune": {"JOB": "pgoutbox.prune", "EVERY": 3600},
    "pgoutbox.sample_queues": {"JOB": "pgoutbox.sample_queues", "EVERY": 60},
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: The argument of ``enqueue()`` that each schedule key becomes, for errors that name the key.
_ENQUEUE_KEYS = {
    "job_type": "JOB",
    "payload": "PAYLOAD",
    "priority": "PRIORITY",
    "queue": "QUEUE",
    "idempotency_key": "the name",
}


@dataclass(frozen=True)
class Schedule:
    """A recurring job: a cron expression or a fixed interval, and what to enqueue."""

    name: str
    job_type: str
    cron: Cron | None = None
    every: timedelta | None = None
    queue: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    catch_up: str = "latest"
    max_catch_up: int = 100
    grace: timedelta = timedelta(seconds=60)

    @property
    def spec(self) -> str:
        if self.cron is not None:
            return f"{self.cron.expression} ({self.cron.zone.key})"
        assert self.every is not None
        return f"every {self.every.total_seconds():g}s"

    @property
    def lock_key(self) -> int:
        """A stable, namespaced 64-bit advisory lock key for this schedule's name."""
        digest = hashlib.blake2b(f"pgoutbox.schedule:{self.name}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "big", signed=True)

    def latest_due(self, now: datetime) -> datetime:
        """The last slot at or before ``now``."""
        if self.cron is not None:
            return self.cron.latest_at_or_before(now)
        assert self.every is not None
        elapsed = (now - _EPOCH) // self.every
        return _EPOCH + elapsed * self.every

    def next_after(self, moment: datetime) -> datetime:
        if self.cron is not None:
            return self.cron.next_after(moment)
        return self.latest_due(moment) + self.every  # type: ignore[operator]

    def idempotency_key(self, slot: datetime) -> str:
        return f"schedule:{self.name}:{slot.astimezone(UTC).isoformat()}"

    def manual_key(self, moment: datetime) -> str:
        """The idempotency key of a run outside the slots (``run_now``), at ``moment``."""
        return f"schedule:{self.name}:manual:{moment.astimezone(UTC).isoformat()}"

    def slots_to_enqueue(self, last: datetime, now: datetime) -> list[datetime]:
        """The slots after ``last`` (the cursor) and up to ``now`` that the policy runs."""
        latest = self.latest_due(now)
        if latest <= last:
            return []
        if self.catch_up == "none":
            return [latest] if now - latest <= self.grace else []
        if self.catch_up == "latest":
            return [latest]
        slots = [latest]
        while len(slots) < self.max_catch_up:
            previous = self._previous(slots[-1])
            if previous is None or previous <= last:
                break
            slots.append(previous)
        return slots[::-1]

    def _previous(self, slot: datetime) -> datetime | None:
        if self.every is not None:
            return slot - self.every
        assert self.cron is not None
        try:
            return self.cron.latest_at_or_before(slot - timedelta(minutes=1))
        except CronError:
            return None


# -- declaring schedules -------------------------------------------------------------------------

_decorated: dict[str, dict[str, Any]] = {}


def schedule(
    cron: str | None = None,
    *,
    every: float | timedelta | None = None,
    tz: str | tzinfo | None = None,
    name: str | None = None,
    queue: str | None = None,
    payload: Mapping[str, Any] | None = None,
    priority: int | None = None,
    catch_up: str = "latest",
    max_catch_up: int = 100,
    grace: float | timedelta | None = None,
) -> Callable[[JobDefinition], JobDefinition]:
    """Run a ``@job`` on a schedule: ``@schedule("0 3 * * *")`` above ``@job(...)``.

    The same options as a ``PGOUTBOX['SCHEDULES']`` entry; the name defaults to the job's.
    Problems are reported by ``manage.py check`` (``pgoutbox.E007``), as for the setting.
    """

    def decorator(definition: JobDefinition) -> JobDefinition:
        if not isinstance(definition, JobDefinition):
            raise TypeError("@schedule goes above @job: it schedules a registered job")
        options: dict[str, Any] = {
            "JOB": definition.name,
            "CATCH_UP": catch_up,
            "MAX_CATCH_UP": max_catch_up,
        }
        for key, value in (
            ("CRON", cron),
            ("EVERY", every),
            ("TZ", tz),
            ("QUEUE", queue),
            ("PAYLOAD", payload),
            ("PRIORITY", priority),
            ("GRACE", grace),
        ):
            if value is not None:
                options[key] = value
        _decorated[name or definition.name] = options
        return definition

    return decorator


@dataclass(frozen=True)
class ScheduleProblem:
    name: str
    message: str

    def __str__(self) -> str:
        name = self.name if len(self.name) <= 100 else f"{self.name[:100]}..."
        return f"schedule {name!r}: {self.message}"


def load_schedules() -> tuple[dict[str, Schedule], list[ScheduleProblem]]:
    """Built-in, ``@schedule`` and ``PGOUTBOX['SCHEDULES']`` schedules, the setting winning."""
    conf = get_settings()
    raw: dict[str, Any] = {
        name: {**options, "QUEUE": conf.maintenance_queue}
        for name, options in BUILTIN_SCHEDULES.items()
    }
    raw.update(_decorated)
    raw.update(conf.schedules)
    schedules: dict[str, Schedule] = {}
    problems: list[ScheduleProblem] = []
    for name, options in raw.items():
        if options is None:
            continue  # removed by the project
        try:
            schedules[name] = _parse(name, options, conf.queues, conf.schedule_tz)
        except (TypeError, ValueError) as error:
            problems.append(ScheduleProblem(str(name), str(error)))
        except Exception as error:  # a value no check foresaw must not crash manage.py check
            problems.append(ScheduleProblem(str(name), summarize(error)))
    return schedules, problems


def _seconds(value: Any, key: str, *, allow_zero: bool) -> timedelta:
    """A schedule's duration: a number of seconds or a timedelta, finite, at most 365 days."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not (seconds >= 0 if allow_zero else seconds > 0)
        or not seconds <= MAX_DELAY_CEILING
    ):
        what = "a number of seconds >= 0" if allow_zero else "a positive number of seconds"
        raise ValueError(
            f"{key} must be {what} or a timedelta, at most {MAX_DELAY_CEILING / 86400:g} days, "
            f"not {value!r}"
        )
    interval = timedelta(seconds=seconds)
    if not allow_zero and interval <= timedelta(0):  # under a microsecond
        raise ValueError(f"{key} must be at least a microsecond, not {value!r}")
    return interval


def _check_enqueue(schedule: Schedule) -> None:
    """Refuse a schedule whose job ``enqueue()`` would refuse, with its own validators."""
    try:
        prepare_job(
            schedule.job_type,
            dict(schedule.payload),
            # The longest key the schedule's jobs get: a manual run's, at a moment with
            # microseconds.
            idempotency_key=schedule.manual_key(_EPOCH + timedelta(microseconds=1)),
            queue=schedule.queue,
            priority=schedule.priority,
        )
    except EnqueueError as error:
        key = _ENQUEUE_KEYS.get(error.field.partition("[")[0], error.field)
        where = error.field.replace("payload", "PAYLOAD", 1) if key == "PAYLOAD" else key
        raise ValueError(f"{where}: {error.message} (enqueue() would refuse it)") from None


def _parse(name: Any, options: Any, queues: Mapping[str, Any], default_tz: str) -> Schedule:
    if not isinstance(name, str) or not name:
        raise ValueError("the name must be a non-empty string")
    try:
        # A name as job types are: it is in the idempotency key of each of its jobs.
        check_text(name, "the name", EnqueueError, MAX_NAME_BYTES)
    except EnqueueError as error:
        raise ValueError(str(error)) from None
    if not isinstance(options, Mapping):
        raise TypeError(f"must be a dict of options (or None to remove it), not {options!r}")
    unknown = sorted(set(options) - set(SCHEDULE_KEYS))
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; keys are {', '.join(SCHEDULE_KEYS)}")
    job_type = options.get("JOB")
    if not isinstance(job_type, str) or not job_type:
        raise ValueError("JOB must name a job type")
    definition = get_job(job_type)
    if definition is None:
        raise ValueError(f"JOB {job_type!r} is not a registered @job")
    cron_text, every = options.get("CRON"), options.get("EVERY")
    if (cron_text is None) == (every is None):
        raise ValueError("give exactly one of CRON (an expression) and EVERY (seconds)")
    if "TZ" in options and cron_text is None:
        raise ValueError(
            "TZ applies to CRON only: the slots of EVERY are counted from the Unix epoch, the "
            "same in every zone"
        )
    try:
        zone = parse_zone(options.get("TZ", default_tz))
    except CronError as error:  # PGOUTBOX['SCHEDULE_TZ'] was checked with the settings
        raise ValueError(f"TZ {error}") from None
    cron = Cron.parse(cron_text, zone) if cron_text is not None else None
    interval = None if every is None else _seconds(every, "EVERY", allow_zero=False)
    queue = options.get("QUEUE") or (definition.queue if definition else None)
    if queue not in queues:
        raise ValueError(f"queue {queue!r} is not in PGOUTBOX['QUEUES']")
    payload = options.get("PAYLOAD", {})
    if not isinstance(payload, Mapping):
        raise ValueError(f"PAYLOAD must be a dict, not {type(payload).__name__}")
    catch_up = options.get("CATCH_UP", "latest")
    if catch_up not in CATCH_UP_POLICIES:
        raise ValueError(
            f"CATCH_UP must be one of {', '.join(CATCH_UP_POLICIES)}, not {catch_up!r}"
        )
    max_catch_up = options.get("MAX_CATCH_UP", 100)
    if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or max_catch_up < 1:
        raise ValueError(f"MAX_CATCH_UP must be an integer >= 1, not {max_catch_up!r}")
    grace = _seconds(options.get("GRACE", 60), "GRACE", allow_zero=True)
    priority = options.get("PRIORITY")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError(f"PRIORITY must be an int, not {priority!r}")
    parsed = Schedule(
        name=name,
        job_type=job_type,
        cron=cron,
        every=interval,
        queue=queue,
        payload=dict(payload),
        priority=priority,
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        grace=grace,
    )
    _check_enqueue(parsed)
    return parsed
