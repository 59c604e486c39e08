"""Checks of user input shared by enqueue and publish; each raises the caller's error class.

The limits below come from what PostgreSQL and Python can store and read back; docs/reference/
input-limits.md lists them with the settings that add to them.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django_pgoutbox.errors import InvalidInput

#: Payloads nested deeper than this are refused (json and PostgreSQL's parser both recurse).
MAX_DEPTH = 500

#: The largest entry of a B-tree index on PostgreSQL's 8 kB pages (btree version 4): an insert
#: whose index entry is larger fails with "index row size ... exceeds btree version 4 maximum
#: 2704". An entry holds the indexed columns of its row, compressed only when they compress.
BTREE_MAX_ENTRY_BYTES = 2704

#: The largest bigint (a ``bigserial`` id: a delivery's).
BIGINT_MAX = 2**63 - 1

#: Job types, event types and aggregate types, in bytes of UTF-8. ``jobs_idempotency_uq`` holds
#: the job type, ``outbox_aggregate_pending_idx`` the aggregate type; a name is a name, not data.
MAX_NAME_BYTES = 255

#: Idempotency keys, in bytes of UTF-8. An entry of ``jobs_idempotency_uq`` (organization_id,
#: job_type, idempotency_key) is then at most 24 bytes (the entry's header and null bitmap, or
#: its header and the organization's uuid), 4 + 255 bytes of job type and 3 of alignment, and
#: 4 + 2,048 bytes of key: 2,338, rounded up to 2,344, under ``BTREE_MAX_ENTRY_BYTES`` even when
#: nothing compresses.
MAX_IDEMPOTENCY_KEY_BYTES = 2048

_LARGEST_KEY_ENTRY = 24 + 4 + MAX_NAME_BYTES + 3 + 4 + MAX_IDEMPOTENCY_KEY_BYTES
assert _LARGEST_KEY_ENTRY + 7 <= BTREE_MAX_ENTRY_BYTES

#: Message ids of ``accept_message()``, in bytes of UTF-8: the idempotency keys' limit. An entry
#: of ``inbox_messages_uq`` (source, message_id) is at most 8 bytes of header, 4 + 255 bytes of
#: source and 1 of alignment, and 4 + 2,048 bytes of id: 2,320, under ``BTREE_MAX_ENTRY_BYTES``.
MAX_MESSAGE_ID_BYTES = MAX_IDEMPOTENCY_KEY_BYTES

#: The most digits of an integer in a payload: Python's default limit for turning an int into
#: text and back (``sys.get_int_max_str_digits()``), which every process that reads the row
#: applies when it parses the JSON. A longer one would be written and then fail every read.
MAX_INT_DIGITS = 4300

#: The earliest and latest moments a row's ``run_at`` (or an event's ``available_at``) may hold:
#: the years Python's ``datetime`` has (1 to 9999), a day inside them so that the value reads
#: back in any time zone. PostgreSQL's timestamptz would store 4713 BC to 294276 AD, rows that
#: no Python process could then load (nor the admin list).
FIRST_MOMENT = datetime(1, 1, 2, tzinfo=UTC)
LAST_MOMENT = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)


def check_text(text: str, where: str, error: type[InvalidInput], max_bytes: int) -> str:
    """``text`` as a plain ``str``, unless PostgreSQL cannot store it (a NUL, a lone surrogate)
    or it is longer than ``max_bytes`` bytes of UTF-8.

    A subclass of ``str`` is checked, and returned, as the plain text that psycopg would send:
    its own methods (``isascii``, ``__len__``, ``__contains__``) could say anything.
    """
    if type(text) is not str:
        text = str.__str__(text)
    if "\x00" in text:
        reject_nul(text, where, error)
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            reject_nul(text, where, error)  # names the lone surrogate
            raise
    if size > max_bytes:
        raise error(where, f"is {size:,} bytes in UTF-8, over the limit of {max_bytes:,} bytes")
    return text


def utc_offset(value: datetime, where: str, error: type[InvalidInput]) -> timedelta | None:
    """``value.utcoffset()``, or ``error`` if its time zone fails to give one."""
    try:
        return value.utcoffset()
    except Exception as problem:  # a tzinfo whose offset is 24 hours or more, or raises
        raise error(where, f"its time zone gives no valid offset: {problem}") from None


def checked_moment(value: datetime, where: str, error: type[InvalidInput]) -> datetime:
    """An aware datetime within ``FIRST_MOMENT`` and ``LAST_MOMENT``, or ``error``."""
    if not FIRST_MOMENT <= value <= LAST_MOMENT:
        raise error(where, f"{value.isoformat()} is {_outside_moments()}")
    return value


def checked_delay_moment(delay: timedelta, where: str, error: type[InvalidInput]) -> float:
    """``delay`` in seconds, if now + ``delay`` is within ``FIRST_MOMENT`` and ``LAST_MOMENT``."""
    if _SURE_DELAYS[0] < delay < _SURE_DELAYS[1]:
        return delay.total_seconds()  # the usual delay: no need to read the clock
    try:
        moment: datetime | None = datetime.now(UTC) + delay
    except OverflowError:
        moment = None
    if moment is None or not FIRST_MOMENT <= moment <= LAST_MOMENT:
        raise error(where, f"now + {delay!r} is {_outside_moments()}")
    return delay.total_seconds()


#: Delays that keep any moment of the years 1001 to 8999 within the moments a row can hold.
_SURE_DELAYS = (timedelta(days=-365 * 1000), timedelta(days=365 * 1000))


def _outside_moments() -> str:
    return (
        f"outside the dates a row can hold, {FIRST_MOMENT.date().isoformat()} to "
        f"{LAST_MOMENT.date().isoformat()} (UTC), the years Python's datetime reads back"
    )


def reject_nul(text: str, where: str, error: type[InvalidInput]) -> None:
    """Refuse text PostgreSQL cannot store: a NUL character, or a lone surrogate (not UTF-8)."""
    if "\x00" in text:
        raise error(where, "contains a NUL character (\\x00), which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as problem:
        raise error(
            where,
            f"contains an unpaired surrogate {text[problem.start]!r} at position "
            f"{problem.start}, which is not valid UTF-8",
        ) from None


def non_empty_text(
    value: Any, where: str, error: type[InvalidInput], max_bytes: int = MAX_NAME_BYTES
) -> str:
    """A name: a string that is not blank, storable, at most ``max_bytes`` bytes of UTF-8."""
    if not isinstance(value, str) or not str.strip(value):
        raise error(where, f"must be a non-empty string, not {short_repr(value)}")
    return check_text(value, where, error, max_bytes)


def short_repr(value: Any, limit: int = 100) -> str:
    """``repr(value)``, cut: an error about a value of a megabyte need not quote all of it."""
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def optional_uuid(value: Any, where: str, error: type[InvalidInput]) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:
        text = ""
    if len(text) <= _UUID_TEXT_MAX:
        try:
            return uuid.UUID(text)
        except ValueError:
            pass
    raise error(where, f"must be a UUID or None, not {short_repr(value)}")


#: Longer than any text ``uuid.UUID()`` takes (``urn:uuid:{...}`` is 47 characters).
_UUID_TEXT_MAX = 64


def json_object(value: Any, where: str, error: type[InvalidInput], max_bytes: int | None) -> str:
    """``value`` as JSON text, if it is a dict that jsonb stores exactly as given, and that text
    is at most ``max_bytes`` bytes of UTF-8 (``PGOUTBOX['MAX_PAYLOAD_BYTES']``; None: no cap)."""
    if not isinstance(value, dict):
        raise error(where, f"must be a dict (a JSON object), not {type(value).__name__}")
    if not value and type(value) is dict:
        return "{}"  # the most common payload of all
    check_json(value, where, error)
    try:
        text = _encode(value)
    except ValueError as problem:  # an int too long for str(), the only thing left to refuse
        _check_int_digits(value, where, error)
        raise error(where, f"cannot be written as JSON: {problem}") from None
    size = len(text)
    if size > MAX_INT_DIGITS and not 0 < sys.get_int_max_str_digits() <= MAX_INT_DIGITS:
        # This process lifted Python's limit on int digits: the readers of the row have it.
        _check_int_digits(value, where, error)
    if max_bytes is not None and size > max_bytes >> 2:
        # Past a quarter of the limit in characters, count the bytes (at most 4 a character).
        if not text.isascii():
            size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise error(
                where,
                f"is {size:,} bytes of JSON, over the limit of {max_bytes:,} bytes "
                "(PGOUTBOX['MAX_PAYLOAD_BYTES'])",
            )
    return text


def _check_int_digits(value: Any, where: str, error: type[InvalidInput]) -> None:
    """Raise naming the first int under ``where`` of more digits than JSON's readers take: the
    smaller of ``MAX_INT_DIGITS`` and this process's ``sys.get_int_max_str_digits()``."""
    current = sys.get_int_max_str_digits()
    digits = MAX_INT_DIGITS if current == 0 else min(current, MAX_INT_DIGITS)
    bound = 10**digits
    stack: list[tuple[Any, _Where]] = [(value, None)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, (at, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend((item[i], (at, i)) for i in range(len(item) - 1, -1, -1))
        elif isinstance(item, int) and not -bound < item < bound:
            raise error(
                _spell(where, at),
                f"is an integer of more than {digits:,} digits, the most Python turns into "
                "text and back (sys.get_int_max_str_digits()); send it as a string",
            )


# json.dumps() with options makes a new encoder at each call, and even a kept JSONEncoder builds
# its C encoder again at each encode(); payloads are encoded by the hundred thousand
# (enqueue_many), so the C encoder is made once. It is made without the circular-reference check
# (markers=None): check_json() has walked the value already, and a cycle fails its depth limit.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
if _c_make_encoder is not None:
    _chunks = _c_make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )

    def _encode(value: Any) -> str:
        return "".join(_chunks(value, 0))

else:  # pragma: no cover - CPython always has the C encoder

    def _encode(value: Any) -> str:
        return _ENCODER.encode(value)


_CONTAINERS = frozenset({str, float, dict, list, tuple})

#: Where a value sits in a payload: ``None`` for the payload itself, else (parent, key or index).
#: Paths are spelled out only for an error: building each value's path as a string was a large
#: part of a small payload's check (docs/benchmarks.md, "What profiling found", item 9).
_Where = tuple[Any, str | int] | None


def _spell(where: str, at: _Where) -> str:
    steps: list[str] = []
    while at is not None:
        at, step = at
        steps.append(f"[{step!r}]")
    return where + "".join(reversed(steps))


def storable(text: str) -> bool:
    """Whether PostgreSQL can store ``text``: no NUL, valid UTF-8 (fast for ASCII, the usual
    case)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json(value: Any, where: str, error: type[InvalidInput]) -> None:
    """Raise naming the first value under ``where`` that jsonb cannot store as given.

    Iterative, so that a deeply nested payload gets this error rather than a RecursionError.
    """
    if not value and type(value) is dict:
        return  # the most common payload of all
    stack: list[tuple[Any, _Where, int]] = [(value, None, 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise error(_spell(where, at), f"is nested more than {MAX_DEPTH} levels deep")
        kind = type(item)
        if (
            item is None
            or kind is int
            or kind is bool
            or (kind not in _CONTAINERS and isinstance(item, (bool, int)))
        ):
            continue
        if kind is str or isinstance(item, str):
            if kind is not str:  # checked as the encoder writes it, whatever its methods say
                item = str.__str__(item)
            if not storable(item):
                reject_nul(item, _spell(where, at), error)
        elif kind is float or isinstance(item, float):
            if not math.isfinite(item):
                raise error(_spell(where, at), f"{item!r} is not a JSON number")
        elif kind is dict or isinstance(item, dict):
            for key, child in reversed(item.items()):
                if type(key) is not str:
                    if not isinstance(key, str):
                        raise error(
                            f"{_spell(where, at)}[{key!r}]",
                            f"JSON object keys must be strings, not {type(key).__name__}",
                        )
                    key = str.__str__(key)
                if not storable(key):
                    reject_nul(key, f"{_spell(where, at)} key {key!r}", error)
                stack.append((child, (at, key), depth + 1))
        elif isinstance(item, list | tuple):
            for index in range(len(item) - 1, -1, -1):
                stack.append((item[index], (at, index), depth + 1))
        else:
            raise error(
                _spell(where, at),
                f"{type(item).__name__} is not JSON-serialisable; convert it first "
                "(str() for a UUID or Decimal, .isoformat() for a datetime)",
            )
