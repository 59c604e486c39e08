"""Checks of user input shared by enqueue and publish; each raises the caller's error class."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from django_pgoutbox.errors import InvalidInput

#: Payloads nested deeper than this are refused (json and PostgreSQL's parser both recurse).
MAX_DEPTH = 500


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


def non_empty_text(value: Any, where: str, error: type[InvalidInput]) -> str:
    if not isinstance(value, str) or not value.strip():
        raise error(where, f"must be a non-empty string, not {value!r}")
    reject_nul(value, where, error)
    return value


def optional_uuid(value: Any, where: str, error: type[InvalidInput]) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise error(where, f"must be a UUID or None, not {value!r}") from None


def json_object(value: Any, where: str, error: type[InvalidInput]) -> str:
    """``value`` as JSON text, if it is a dict that jsonb stores exactly as given."""
    if not isinstance(value, dict):
        raise error(where, f"must be a dict (a JSON object), not {type(value).__name__}")
    if not value and type(value) is dict:
        return "{}"  # the most common payload of all
    check_json(value, where, error)
    return _encode(value)


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


def _text_ok(text: str) -> bool:
    """No NUL and valid UTF-8 (fast for ASCII, the usual case)."""
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
            if not _text_ok(item):
                reject_nul(item, _spell(where, at), error)
        elif kind is float or isinstance(item, float):
            if not math.isfinite(item):
                raise error(_spell(where, at), f"{item!r} is not a JSON number")
        elif kind is dict or isinstance(item, dict):
            for key, child in reversed(item.items()):
                if type(key) is not str and not isinstance(key, str):
                    raise error(
                        f"{_spell(where, at)}[{key!r}]",
                        f"JSON object keys must be strings, not {type(key).__name__}",
                    )
                if not _text_ok(key):
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
