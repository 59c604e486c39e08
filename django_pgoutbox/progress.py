"""What a running handler says of itself (``ctx.set_progress()``, ``ctx.set_meta()``): the checks
of what it passes, made at the call, and the JSON written to ``jobs.progress`` and ``jobs.meta``.

Pure functions, no database: the worker writes the values (``worker.progress``), at most once a
second per job, and the last ones with the job's outcome. docs/progress.md describes them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django_pgoutbox.errors import InvalidProgress
from django_pgoutbox.validation import BIGINT_MAX, check_json, reject_nul, short_repr, storable

#: The longest ``message`` of ``ctx.set_progress()``, in characters: a line for a list page.
MAX_PROGRESS_MESSAGE = 1000

#: The largest metadata of a job (``ctx.set_meta()``, every key together), in bytes of JSON. The
#: worker writes it again with each change, up to once a second: a small document, not a result.
MAX_META_BYTES = 64 * 1024

#: What ``ctx.set_progress()`` keeps: (done, total or None, message or None), checked.
Progress = tuple[int | float, int | float | None, str | None]

#: What a running attempt has set, as the worker writes it: its progress (or None: never set)
#: and its metadata's JSON text (or None: never set). Replaced whole at each call, never changed.
Report = tuple[Progress | None, str | None]


def _count(value: Any, name: str) -> int | float:
    """``value`` as a plain non-negative int or finite float, or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"set_progress(): {name} must be an int or a float, not {type(value).__name__}"
        )
    if isinstance(value, int):
        number = int(value)  # a subclass (an IntEnum) is written as the number it is
        if not 0 <= number <= BIGINT_MAX:
            shown = f"{number:,}" if number.bit_length() < 128 else "a larger one"
            raise InvalidProgress(name, f"must be from 0 to {BIGINT_MAX:,}, not {shown}")
        return number
    real = float(value)
    if not math.isfinite(real) or real < 0:
        raise InvalidProgress(name, f"must be a finite number of at least 0, not {real!r}")
    return real


def check_progress(done: Any, total: Any, message: Any) -> Progress:
    """The arguments of ``ctx.set_progress()``, checked; raises ``TypeError`` for a value of the
    wrong type and ``InvalidProgress`` (a ``ValueError``) for one out of range."""
    checked_done = _count(done, "done")
    checked_total = None if total is None else _count(total, "total")
    if checked_total is not None and checked_total < checked_done:
        raise InvalidProgress("total", f"must be at least done ({done!r}), not {total!r}")
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(
                f"set_progress(): message must be a str or None, not {type(message).__name__}"
            )
        message = str.__str__(message)
        if len(message) > MAX_PROGRESS_MESSAGE:
            raise InvalidProgress(
                "message",
                f"is {len(message):,} characters, over the limit of {MAX_PROGRESS_MESSAGE:,}",
            )
        if not storable(message):
            reject_nul(message, "message", InvalidProgress)
    return (checked_done, checked_total, message)


def progress_json(progress: Progress) -> str:
    """The JSON text of ``jobs.progress``: ``{"done": ..., "total": ..., "message": ...}``."""
    done, total, message = progress
    return json.dumps(
        {"done": done, "total": total, "message": message},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def merge_meta(meta: dict[str, Any], values: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``meta`` with ``values`` set over it, and its JSON text; raises ``InvalidProgress``
    naming the key whose value jsonb cannot store, or when the whole is over
    ``MAX_META_BYTES``. ``meta`` itself is left as it was."""
    for key, value in values.items():
        if not storable(key):
            reject_nul(key, f"set_meta() key {short_repr(key)}", InvalidProgress)
        check_json(value, key, InvalidProgress)
    merged = {**meta, **values}
    try:
        text = json.dumps(merged, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as problem:  # an int past Python's digits
        raise InvalidProgress("set_meta()", f"cannot be written as JSON: {problem}") from None
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > MAX_META_BYTES:
        raise InvalidProgress(
            f"set_meta({', '.join(values)})",
            f"the metadata would be {size:,} bytes of JSON, over the limit of "
            f"{MAX_META_BYTES:,} bytes; nothing of this call was kept",
        )
    return merged, text
