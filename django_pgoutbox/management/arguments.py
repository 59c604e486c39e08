"""The ``pgoutbox`` command's argument types: each refuses what it cannot take with a usage
error that names the value, before any query runs."""

from __future__ import annotations

import argparse
import math
import uuid
from datetime import UTC, datetime

from django.core.management.base import CommandError
from django.utils import timezone


def seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(number) or not 0.1 <= number <= 86400:
        raise argparse.ArgumentTypeError(f"must be from 0.1 to 86400 seconds, not {value!r}")
    return number


#: ``deadletters list --limit``'s ceiling: one page of a terminal or a script's batch.
MAX_LIST_LIMIT = 10_000


def limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if not 1 <= number <= MAX_LIST_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {MAX_LIST_LIMIT:,}, not {value if len(value) < 30 else '…'}"
        )
    return number


def identifier(value: str, what: str = "a job id") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise CommandError(f"{value!r} is not {what} (a UUID)") from None


def text(value: str) -> str:
    """A filter's text: PostgreSQL's text holds no NUL (the query would fail, a traceback)."""
    if "\x00" in value:
        raise argparse.ArgumentTypeError("a NUL byte matches nothing a database holds")
    return value


#: ``events redrive --dead-for``: a number of seconds, or one with a unit.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def age(value: str) -> float:
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    try:
        number = float(text[:-1] if unit else text) * (unit or 1)
    except ValueError:
        shown = value if len(value) < 30 else "…"
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not an age: seconds, or a number with s, m, h or d (90m, 7d)"
        ) from None
    if not math.isfinite(number) or not 0 <= number <= 100 * 365 * 86400:
        raise argparse.ArgumentTypeError(f"must be from 0 seconds to 100 years, not {value!r}")
    return number


def utc(value: datetime) -> str:
    """A time as the columns headed "(UTC)" show it: with ``USE_TZ = False``, Django reads
    times in ``TIME_ZONE``."""
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
