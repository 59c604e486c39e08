"""Checks of user input shared by enqueue and publish; each raises the caller's error class."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from django_pgoutbox.errors import InvalidInput


def reject_nul(text: str, where: str, error: type[InvalidInput]) -> None:
    if "\x00" in text:
        raise error(where, "contains a NUL character (\\x00), which PostgreSQL cannot store")


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
    """Raise naming the first value under ``where`` that jsonb cannot store as given."""
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, str):
        reject_nul(value, where, error)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise error(where, f"{value!r} is not a JSON number")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise error(
                    f"{where}[{key!r}]",
                    f"JSON object keys must be strings, not {type(key).__name__}",
                )
            reject_nul(key, f"{where} key {key!r}", error)
            check_json(item, f"{where}[{key!r}]", error)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_json(item, f"{where}[{index}]", error)
    else:
        raise error(
            where,
            f"{type(value).__name__} is not JSON-serialisable; convert it first "
            "(str() for a UUID or Decimal, .isoformat() for a datetime)",
        )
