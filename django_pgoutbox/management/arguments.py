"""The ``pgoutbox`` command's argument types: each refuses what it cannot take with a usage
error that names the value, before any query runs."""

from __future__ import annotations

import argparse
import math
import uuid
from datetime import UTC, datetime, timedelta

from django.core.management.base import CommandError
from django.utils import timezone

from django_pgoutbox.control import MAX_CAUSES, checked_fingerprint
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.validation import BIGINT_MAX, FIRST_MOMENT, LAST_MOMENT


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


def row_number(value: str, what: str) -> int:
    """A bigint id (a delivery's): a positive integer, written in decimal digits."""
    digits = value.strip()
    if not digits.isascii() or not digits.isdigit() or len(digits) > 19:
        shown = value if len(value) < 30 else value[:27] + "..."
        raise CommandError(f"{shown!r} is not {what} (a positive integer)")
    number = int(digits)
    if not 1 <= number <= BIGINT_MAX:
        raise CommandError(f"{value!r} is not {what} (a positive integer)")
    return number


def fingerprint(value: str) -> str:
    """A cause's fingerprint: 16 hex digits, as ``deadletters causes`` prints them."""
    try:
        return checked_fingerprint(value.strip().lower())
    except InvalidInput:
        shown = value if len(value) < 30 else value[:27] + "..."
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not a cause's fingerprint (16 hex digits)"
        ) from None


def cause_limit(value: str) -> int:
    """``deadletters causes --limit``: how many causes to read, one index descent each."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:30]!r} is not an integer") from None
    if not 1 <= number <= MAX_CAUSES:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_CAUSES:,}")
    return number


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


def moment(value: str) -> datetime:
    """A moment: an ISO 8601 date or time (``2026-12-01``, ``2026-12-01T08:30:00+01:00``), in UTC
    unless it gives its offset, as the columns headed "(UTC)" show times; or an age with its
    unit (``90m``, ``12h``, ``7d``: that long ago). A bare number is neither: refused."""
    shown = value if len(value) < 40 else value[:37] + "..."
    cleaned = value.strip()
    if cleaned[-1:].lower() in _UNITS and cleaned[:-1].strip():
        seconds_ago = age(cleaned)  # the usage error of an age: "-1d", "nand"
        return datetime.now(UTC) - timedelta(seconds=seconds_ago)
    try:
        parsed = datetime.fromisoformat(cleaned)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not a time: an ISO 8601 date or time (2026-12-01, "
            "2026-12-01T08:30:00Z; UTC unless it gives its offset), or an age with its unit "
            "(90m, 12h, 7d)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if not FIRST_MOMENT <= parsed <= LAST_MOMENT:
        raise argparse.ArgumentTypeError(
            f"{shown!r} is outside {FIRST_MOMENT.date()} to {LAST_MOMENT.date()} (UTC)"
        )
    return parsed


def utc(value: datetime) -> str:
    """A time as the columns headed "(UTC)" show it: with ``USE_TZ = False``, Django reads
    times in ``TIME_ZONE``."""
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return f"{value.astimezone(UTC):%Y-%m-%d %H:%M:%S}"
