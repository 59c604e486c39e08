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
    check_json(value, where, error)
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def check_json(value: Any, where: str, error: type[InvalidInput]) -> None:
    """Raise naming the first value under ``where`` that jsonb cannot store as given.

    Iterative, so that a deeply nested payload gets this error rather than a RecursionError.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise error(path, f"is nested more than {MAX_DEPTH} levels deep")
        if item is None or isinstance(item, bool | int):
            continue
        if isinstance(item, str):
            reject_nul(item, path, error)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise error(path, f"{item!r} is not a JSON number")
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if not isinstance(key, str):
                    raise error(
                        f"{path}[{key!r}]",
                        f"JSON object keys must be strings, not {type(key).__name__}",
                    )
                reject_nul(key, f"{path} key {key!r}", error)
                stack.append((child, f"{path}[{key!r}]", depth + 1))
        elif isinstance(item, list | tuple):
            for index in range(len(item) - 1, -1, -1):
                stack.append((item[index], f"{path}[{index}]", depth + 1))
        else:
            raise error(
                path,
                f"{type(item).__name__} is not JSON-serialisable; convert it first "
                "(str() for a UUID or Decimal, .isoformat() for a datetime)",
            )
