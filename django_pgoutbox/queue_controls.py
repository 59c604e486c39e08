"""Queues paused, resumed and resized at run time, cluster-wide and across restarts.

An operator pauses a queue (``pause_queue()``, ``pgoutbox queues pause``, the admin's overview)
or gives it values in place of its settings (``resize_queue()``): ``CONCURRENCY`` (handler
threads per process), ``MAX_RUNNING`` and ``RATE_LIMIT`` (across every worker). The change is
a row of ``queue_controls``, written with a notification on ``CONTROL_CHANNEL``; each worker
reads its queues' rows when it starts (before its first claim), when notified, and once per poll
interval, so a change reaches every worker of every host within a second (within a poll
interval if the notification is lost). The settings stay the defaults: a value reset goes back
to them.

A paused queue's workers claim none of its jobs; the jobs already running finish, and those
claimed but not started yet are given back. Enqueue still works.

A row that a worker cannot read (a value written by hand that no setting would accept) is not
its end: the values it cannot use are left out and logged, and the rest apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from django.db import connections

from django_pgoutbox import queries
from django_pgoutbox.conf import CONTROL_CHANNEL, MAX_CONCURRENCY, QueueSettings, get_settings
from django_pgoutbox.db import tables_required, write_database
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.models import Job

#: The values a queue may be given at run time, in place of its settings of the same names.
KEYS: Final = ("CONCURRENCY", "MAX_RUNNING", "RATE_LIMIT")


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: ``resize_queue(name, max_running=DEFAULT)``: back to the setting.
DEFAULT: Final = _Marker("DEFAULT")
#: ``resize_queue``'s default for a value not given: left as it is.
KEEP: Final = _Marker("KEEP")


class QueueControlError(InvalidInput):
    """A pause, resume or resize was refused; ``field`` names the argument. Nothing was
    written."""


def _shown(value: Any, most: int = 80) -> str:
    """``repr(value)``, cut short: a value written by hand may be megabytes long."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"a whole number of {len(str(value))} digits"  # str() of one too long raises
    shown = repr(value)
    return shown if len(shown) <= most else shown[: most - 3] + "..."


def check_value(key: str, value: Any) -> int | float | None:
    """``value`` if ``key`` may take it at run time; else ``ValueError`` saying why.

    ``CONCURRENCY``: a whole number from 1 to ``MAX_CONCURRENCY``. ``MAX_RUNNING``: a whole
    number >= 1, or None for no cap. ``RATE_LIMIT``: a number of jobs per second > 0, or None for
    no limit.
    """
    if key == "CONCURRENCY":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= MAX_CONCURRENCY
        ):
            raise ValueError(
                f"must be a whole number from 1 to {MAX_CONCURRENCY}, not {_shown(value)}"
            )
        return value
    if key == "MAX_RUNNING":
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
            raise ValueError(
                f"must be a whole number >= 1, or None for no cap, not {_shown(value)}"
            )
        return value
    if key == "RATE_LIMIT":
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            # Compared as they are: an int too large for a float (a row written by hand) makes
            # math.isfinite raise, and a NaN fails both comparisons.
            or not 0 < value <= 1e9
        ):
            raise ValueError(
                "must be a number of jobs per second > 0, or None for no limit, "
                f"not {_shown(value)}"
            )
        return float(value)
    raise ValueError(f"is not a value a queue may be given at run time ({', '.join(KEYS)})")


@dataclass(frozen=True)
class Control:
    """A queue's row as its workers use it: whether it is paused, the values in place of its
    settings, and what of the row could not be used (each said once in the log)."""

    paused: bool = False
    overrides: Mapping[str, int | float | None] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    #: None: the row was read. Else it could not be (``problems`` says why), and whether that
    #: lasts (no table, no privilege: the settings apply) or may pass (a lock timeout: a worker
    #: keeps what it last read).
    unread: bool | None = None

    @classmethod
    def from_row(cls, queue: str, paused: Any, overrides: Any) -> Control:
        """The row's values that can be used; a value that cannot is left out, with why."""
        problems: list[str] = []
        usable: dict[str, int | float | None] = {}
        if isinstance(overrides, str):  # jsonb read as text (Django's cursors, the workers)
            try:
                overrides = json.loads(overrides)
            except (ValueError, RecursionError) as error:
                # A row written by hand: too deep for json.loads, or a number past the digits
                # int() takes. Not an exception that leaves a worker's loop or the admin's page.
                problems.append(
                    f"queue_controls row of queue {queue!r}: overrides could not be decoded "
                    f"({type(error).__name__}); the settings apply"
                )
                overrides = {}
        if not isinstance(overrides, dict):
            problems.append(
                f"queue_controls row of queue {queue!r}: overrides must be a JSON object, not "
                f"{type(overrides).__name__}; the settings apply"
            )
            overrides = {}
        for key, value in overrides.items():
            try:
                usable[key] = check_value(key, value)
            except ValueError as error:
                problems.append(
                    f"queue_controls row of queue {queue!r}: {_shown(key)} {error}; "
                    "the setting applies"
                )
        return cls(paused=bool(paused), overrides=usable, problems=tuple(problems))

    def settings(self, settings: QueueSettings) -> QueueSettings:
        """``settings`` with this row's cluster-wide values in place of theirs."""
        changes: dict[str, Any] = {}
        if "MAX_RUNNING" in self.overrides:
            changes["max_running"] = self.overrides["MAX_RUNNING"]
        if "RATE_LIMIT" in self.overrides:
            changes["rate_limit"] = self.overrides["RATE_LIMIT"]
        if changes and settings.limit_by is not None:
            after = replace(settings, **changes)
            if not after.limited:  # LIMIT_BY with nothing left to apply to
                changes["limit_by"] = None
        return replace(settings, **changes) if changes else settings

    def concurrency(self, started_with: int) -> int:
        """Handler threads per process: this row's, else what the process started with."""
        value = self.overrides.get("CONCURRENCY")
        return value if isinstance(value, int) else started_with


# -- reading and writing rows (the admin, the command, the API) ---------------------------------


@dataclass(frozen=True)
class QueueStatus:
    """One configured queue as operators see it: paused or not, and each value in effect with
    where it comes from (``overridden``: set at run time, else the setting)."""

    queue: str
    paused: bool
    paused_at: datetime | None
    paused_by: str | None
    concurrency: int
    max_running: int | None
    rate_limit: float | None
    overridden: frozenset[str]
    settings: QueueSettings
    updated_at: datetime | None = None
    updated_by: str | None = None
    problems: tuple[str, ...] = ()


def _alias(using: str | None) -> str:
    """The jobs' database, or ``using`` if it is a PostgreSQL alias of ``DATABASES``."""
    return write_database(using, Job, QueueControlError)


def _queue(name: Any) -> QueueSettings:
    queues = get_settings().queues
    if not isinstance(name, str) or name not in queues:
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        raise QueueControlError(
            "name", f"no queue {shown} in PGOUTBOX['QUEUES'] ({', '.join(queues)})"
        )
    return queues[name]


def _by(by: Any, default: str) -> str:
    if by is None:
        return default
    if not isinstance(by, str) or not by.strip() or len(by) > 200 or not by.isprintable():
        raise QueueControlError("by", "must be printable text of 1 to 200 characters")
    return by


def _status(settings: QueueSettings, row: tuple[Any, ...] | None) -> QueueStatus:
    if row is None:
        row = (settings.name, None, None, {}, None, None)
    _, paused_at, paused_by, overrides, updated_at, updated_by = row[:6]
    control = Control.from_row(settings.name, paused_at is not None, overrides)
    effective = control.settings(settings)
    return QueueStatus(
        queue=settings.name,
        paused=control.paused,
        paused_at=paused_at,
        paused_by=paused_by,
        concurrency=control.concurrency(settings.concurrency),
        max_running=effective.max_running,
        rate_limit=effective.rate_limit,
        overridden=frozenset(control.overrides),
        settings=settings,
        updated_at=updated_at,
        updated_by=updated_by,
        problems=control.problems,
    )


def _write(sql: str, params: dict[str, Any], using: str | None) -> QueueStatus:
    settings = _queue(params["queue"])
    alias = _alias(using)
    with (
        tables_required(alias, QueueControlError, added_later=True),
        connections[alias].cursor() as cursor,
    ):
        cursor.execute(sql, {**params, "channel": CONTROL_CHANNEL})
        row = cursor.fetchone()
        if row is None:  # resume of a queue not paused: nothing written
            cursor.execute(queries.QUEUE_CONTROLS)
            row = next((r for r in cursor.fetchall() if r[0] == settings.name), None)
    return _status(settings, row)


def pause_queue(name: str, *, using: str | None = None, by: str | None = None) -> QueueStatus:
    """Pause queue ``name`` on every worker: none claims its jobs until ``resume_queue()``, across
    restarts; the running ones finish. Enqueue still works. ``by`` says who (shown in the admin
    and ``pgoutbox queues``). Joins the caller's transaction: the workers hear of it at commit.
    Pausing a paused queue keeps when and by whom it was paused."""
    return _write(queries.PAUSE_QUEUE, {"queue": name, "by": _by(by, "pause_queue()")}, using)


def resume_queue(name: str, *, using: str | None = None, by: str | None = None) -> QueueStatus:
    """Let every worker claim queue ``name``'s jobs again."""
    return _write(queries.RESUME_QUEUE, {"queue": name, "by": _by(by, "resume_queue()")}, using)


def resize_queue(
    name: str,
    *,
    concurrency: int | _Marker = KEEP,
    max_running: int | _Marker | None = KEEP,
    rate_limit: float | _Marker | None = KEEP,
    using: str | None = None,
    by: str | None = None,
) -> QueueStatus:
    """Give queue ``name`` values in place of its settings, on every worker within seconds and
    without a restart: ``concurrency`` (handler threads per process), ``max_running`` (jobs
    running at once across every worker; None: no cap) and ``rate_limit`` (jobs started per
    second across every worker; None: no limit). ``DEFAULT`` puts one back to its setting; one
    not given is left as it is. Refused with ``QueueControlError`` naming the argument."""
    given = {"CONCURRENCY": concurrency, "MAX_RUNNING": max_running, "RATE_LIMIT": rate_limit}
    values: dict[str, Any] = {}
    reset: list[str] = []
    for key, value in given.items():
        if value is KEEP:
            continue
        if value is DEFAULT:
            reset.append(key)
            continue
        try:
            values[key] = check_value(key, value)
        except ValueError as error:
            raise QueueControlError(key.lower(), str(error)) from None
    if not values and not reset:
        raise QueueControlError(
            "resize_queue", "give at least one of concurrency, max_running, rate_limit"
        )
    from psycopg.types.json import Jsonb

    params = {
        "queue": name,
        "set": Jsonb(values),
        "reset": reset,
        "by": _by(by, "resize_queue()"),
    }
    return _write(queries.RESIZE_QUEUE, params, using)


def queue_statuses(using: str | None = None) -> dict[str, QueueStatus]:
    """Every configured queue, by name, with what is in effect (``QueueStatus``)."""
    alias = _alias(using)
    with (
        tables_required(alias, QueueControlError, added_later=True),
        connections[alias].cursor() as cursor,
    ):
        cursor.execute(queries.QUEUE_CONTROLS)
        rows = {row[0]: row for row in cursor.fetchall()}
    return {name: _status(queue, rows.get(name)) for name, queue in get_settings().queues.items()}


def statuses_for_monitoring(using: str | None = None) -> tuple[dict[str, QueueStatus], str | None]:
    """``queue_statuses()`` for health, metrics and the overview, which answer without them: no
    statuses and why, if ``queue_controls`` cannot be read (migration 0009 not applied yet, a
    privilege taken away). In a savepoint, so that the caller's transaction goes on."""
    from django.db import DatabaseError, transaction

    alias = _alias(using)
    try:
        with transaction.atomic(using=alias):
            return queue_statuses(alias), None
    except (QueueControlError, DatabaseError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return {}, f"queue_controls could not be read, paused queues are unknown: {reason}"


def paused_queues(using: str | None = None) -> list[str]:
    """The configured queues that are paused now."""
    return [name for name, status in queue_statuses(using).items() if status.paused]
