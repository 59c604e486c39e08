"""Unique jobs: ``unique=``, ``on_conflict=``, ``debounce=`` and ``throttle=`` of ``@job`` and
``enqueue()`` (docs/uniqueness.md).

A unique job carries a key (``jobs.unique_key``, a 128-bit hash of its job type and of the fields
its ``Unique`` names, and of the window of its ``run_at`` when it has a period) and the set of
states in which the key is held (``jobs.unique_states``, a bit per state). ``jobs_unique_uq`` is
a unique index on the key over the rows whose state is in their own set (migration 0017), so
PostgreSQL refuses the second job, whatever the number of enqueuers, and a job that leaves its
states frees its key.

The states must be such that no worker ever moves a job *into* them from outside: a worker's
update could then meet the key of a newer job and fail. Hence the two shapes allowed: pending
alone (``debounce``, or ``states=("pending",)``), or pending, leased and retrying, with any of
completed, dead and cancelled (cancelled only with dead: an operator cancels dead letters). Two
statements may still put a job back to ``pending`` from outside: a shutdown's release of a job
whose set lacks ``leased`` (it then drops its key) and an operator's retry of a dead letter
(skipped while another job holds its key).
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from django_pgoutbox.conf import MAX_DELAY_CEILING
from django_pgoutbox.validation import MAX_IDEMPOTENCY_KEY_BYTES, short_repr

#: Each state's bit in ``jobs.unique_states``; migration 0017's ``pgoutbox_unique_state`` has
#: the same table.
STATE_BITS: Mapping[str, int] = {
    "waiting": 1,
    "pending": 2,
    "leased": 4,
    "retrying": 8,
    "completed": 16,
    "dead": 32,
    "cancelled": 64,
}
ALL_STATES = 127
#: What a job holds until it finishes, and the states a worker moves it between.
UNFINISHED = ("pending", "leased", "retrying")
#: The states of a unique job without a period, unless ``states=`` says otherwise.
DEFAULT_STATES: tuple[str, ...] = UNFINISHED
#: With a period, the key is also held once completed: "at most one per hour" counts the job that
#: ran this hour.
DEFAULT_PERIOD_STATES: tuple[str, ...] = (*UNFINISHED, "completed")
#: The fields a key can be made of (besides the job type, always in it).
FIELDS = ("organization", "queue", "payload", "key")

OnConflict = Literal["keep", "replace"]
ON_CONFLICT_CHOICES = ("keep", "replace")


@dataclass(frozen=True)
class Unique:
    """Which jobs count as the same, in which states, for how long (docs/uniqueness.md).

    ``by``: the fields compared besides the job type, among ``"organization"``, ``"queue"``,
    ``"payload"`` and ``"key"``. Default: organization, queue and payload; with ``key``,
    organization, queue and key. ``keys``: compare only these top-level keys of the payload.
    ``key``: a string of yours (``f"account:{account.pk}"``). ``states``: the states in which a
    job holds its key (default pending, leased, retrying; with a period, completed too).
    ``period``: the key is held within an aligned window of this length (whole seconds) of the
    job's ``run_at``; None: as long as the job is in those states.
    """

    by: Sequence[str] | None = None
    keys: Sequence[str] | None = None
    key: str | None = None
    states: Sequence[str] | None = None
    period: timedelta | None = None


@dataclass(frozen=True, slots=True)
class UniquePolicy:
    """``Unique``, ``on_conflict``, ``debounce`` and ``throttle`` checked and resolved."""

    by: tuple[str, ...]
    keys: tuple[str, ...] | None
    key: str | None
    states: int  # bits of STATE_BITS
    period: int | None  # seconds
    on_conflict: OnConflict
    debounce: float | None  # seconds
    throttle: bool  # the period is a throttle: a conflict moves the job to the next window

    def row_key(
        self, job_type: str, organization_id: Any, queue: str, payload: Mapping[str, Any]
    ) -> uuid.UUID:
        """The job's key, without its window: a hash of what the policy compares."""
        # What is compared is in the key too: Unique(keys=["a"]) of {"a": 1, "b": 2} and Unique()
        # of {"a": 1} compare different things, and do not meet.
        parts: list[Any] = [job_type, self.by, self.keys]
        for name in self.by:
            if name == "organization":
                parts.append(None if organization_id is None else str(organization_id))
            elif name == "queue":
                parts.append(queue)
            elif name == "key":
                parts.append(self.key)
            elif self.keys is None:
                parts.append(payload)
            else:
                parts.append({k: payload.get(k, _MISSING) for k in self.keys})
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
        return uuid.UUID(bytes=hashlib.blake2b(text.encode(), digest_size=16).digest())


_MISSING = "\x00missing"


@dataclass(frozen=True, slots=True)
class Declared:
    """What ``@job`` declared, unchecked against ``enqueue()``'s own arguments yet."""

    unique: Unique | bool | None
    on_conflict: str | None
    debounce: timedelta | float | None
    throttle: timedelta | float | None


def resolve(
    declared: Declared | None,
    unique: Unique | bool | None,
    on_conflict: str | None,
    debounce: timedelta | float | None,
    throttle: timedelta | float | None,
    fail: Callable[[str, str], Exception],
) -> UniquePolicy | None:
    """The policy of one enqueue: its own arguments, else those of the job type's ``@job``.

    ``unique=False`` turns a declared uniqueness off for this enqueue. ``fail(field, message)``
    makes the exception to raise.
    """
    if declared is not None:
        if unique is None:
            unique = declared.unique
        if on_conflict is None:
            on_conflict = declared.on_conflict
        if debounce is None:
            debounce = declared.debounce
        if throttle is None:
            throttle = declared.throttle
    try:  # the same arguments make the same policy: an enqueue checks them once per process
        return _checked(unique, on_conflict, debounce, throttle)
    except TypeError:  # unhashable (a Unique with lists)
        return policy(unique, on_conflict, debounce, throttle, fail)
    except _Refused as refused:
        raise fail(refused.field, refused.message) from None


class _Refused(Exception):
    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message


def _refused(field: str, message: str) -> Exception:
    return _Refused(field, message)


@functools.lru_cache(maxsize=256, typed=True)  # typed: 1 is not True
def _checked(
    unique: Unique | bool | None,
    on_conflict: str | None,
    debounce: timedelta | float | None,
    throttle: timedelta | float | None,
) -> UniquePolicy | None:
    return policy(unique, on_conflict, debounce, throttle, _refused)


def policy(
    unique: Unique | bool | None,
    on_conflict: str | None,
    debounce: timedelta | float | None,
    throttle: timedelta | float | None,
    fail: Callable[[str, str], Exception],
) -> UniquePolicy | None:
    """Check the four arguments together; None for a job that is not unique."""
    if unique is False:
        return None
    if on_conflict is not None and on_conflict not in ON_CONFLICT_CHOICES:
        raise fail("on_conflict", f"must be 'keep' or 'replace', not {short_repr(on_conflict)}")
    debounce_seconds = _seconds(debounce, "debounce", fail, whole=False)
    throttle_seconds = _seconds(throttle, "throttle", fail, whole=True)
    if unique is None or unique is True:
        if unique is None and debounce is None and throttle is None:
            if on_conflict == "replace":
                raise fail("on_conflict", "'replace' needs unique=, debounce= or throttle=")
            return None
        spec = Unique()
    elif isinstance(unique, Unique):
        spec = unique
    else:
        raise fail("unique", f"must be True, False, None or a Unique, not {short_repr(unique)}")
    if debounce_seconds is not None and throttle_seconds is not None:
        raise fail("debounce", "cannot go with throttle=: choose one")
    by = _by(spec, fail)
    keys = _keys(spec.keys, by, fail)
    key = _key(spec.key, by, fail)
    period = _seconds(spec.period, "unique.period", fail, whole=True)
    if debounce_seconds is not None or throttle_seconds is not None:
        name = "debounce" if debounce_seconds is not None else "throttle"
        if spec.states is not None:
            raise fail("unique.states", f"cannot go with {name}=, which sets them")
        if period is not None:
            raise fail("unique.period", f"cannot go with {name}=, which sets it")
    if debounce_seconds is not None:
        states = STATE_BITS["pending"]
    elif throttle_seconds is not None:
        states, period = ALL_STATES, throttle_seconds
    else:
        states = _states(spec.states, period, fail)
    return UniquePolicy(
        by=by,
        keys=keys,
        key=key,
        states=states,
        period=period,
        on_conflict="replace" if on_conflict == "replace" else "keep",
        debounce=debounce_seconds,
        throttle=throttle_seconds is not None,
    )


def _by(spec: Unique, fail: Callable[[str, str], Exception]) -> tuple[str, ...]:
    if spec.by is None:
        return ("organization", "queue", "key" if spec.key is not None else "payload")
    if isinstance(spec.by, str) or not isinstance(spec.by, Sequence):
        raise fail("unique.by", f"must be a list of field names, not {short_repr(spec.by)}")
    by = tuple(spec.by)
    for name in by:
        if name not in FIELDS:
            raise fail(
                "unique.by", f"unknown field {short_repr(name)}; allowed: {', '.join(FIELDS)}"
            )
    if len(set(by)) != len(by):
        raise fail("unique.by", f"names a field twice: {short_repr(list(by))}")
    return tuple(name for name in FIELDS if name in by)  # one order: the key does not vary


def _keys(
    keys: Sequence[str] | None, by: tuple[str, ...], fail: Callable[[str, str], Exception]
) -> tuple[str, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, str) or not isinstance(keys, Sequence) or not keys:
        raise fail(
            "unique.keys", f"must be a non-empty list of payload keys, not {short_repr(keys)}"
        )
    if not all(isinstance(k, str) and k for k in keys):
        raise fail("unique.keys", f"must hold non-empty strings, not {short_repr(list(keys))}")
    if "payload" not in by:
        raise fail("unique.keys", "compares parts of the payload: add 'payload' to unique.by")
    return tuple(sorted(set(keys)))


def _key(key: str | None, by: tuple[str, ...], fail: Callable[[str, str], Exception]) -> str | None:
    if key is None:
        if "key" in by:
            raise fail("unique.key", "is required when unique.by has 'key'")
        return None
    if not isinstance(key, str) or not key:
        raise fail("unique.key", f"must be a non-empty string, not {short_repr(key)}")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_IDEMPOTENCY_KEY_BYTES:
        raise fail("unique.key", f"is longer than {MAX_IDEMPOTENCY_KEY_BYTES} bytes of UTF-8")
    if "key" not in by:
        raise fail("unique.key", "is given but unique.by has no 'key'")
    return key


def _states(
    states: Sequence[str] | None, period: int | None, fail: Callable[[str, str], Exception]
) -> int:
    if states is None:
        states = DEFAULT_STATES if period is None else DEFAULT_PERIOD_STATES
    if isinstance(states, str) or not isinstance(states, Sequence) or not states:
        raise fail("unique.states", f"must be a non-empty list of states, not {short_repr(states)}")
    bits = 0
    for name in states:
        if not isinstance(name, str) or name not in STATE_BITS or name == "waiting":
            allowed = ", ".join(s for s in STATE_BITS if s != "waiting")
            raise fail("unique.states", f"unknown state {short_repr(name)}; allowed: {allowed}")
        bits |= STATE_BITS[name]
    held = set(states)
    if "pending" not in held:
        raise fail("unique.states", "must hold 'pending': a new job is pending")
    if held != {"pending"} and not held.issuperset(UNFINISHED):
        missing = [s for s in UNFINISHED if s not in held]
        raise fail(
            "unique.states",
            f"{short_repr(list(states))} lacks {', '.join(map(repr, missing))}: a worker moves "
            "a job between pending, leased and retrying, and would move it back into the set "
            "while another job holds its key. Use ('pending',) alone, or all three with any of "
            "completed, dead, cancelled (docs/uniqueness.md, the traps)",
        )
    if "cancelled" in held and "dead" not in held:
        raise fail(
            "unique.states",
            f"{short_repr(list(states))} has 'cancelled' but not 'dead': an operator cancels a "
            "dead letter, which would move it back into the set while another job holds its key "
            "(docs/uniqueness.md, the traps)",
        )
    return bits


def _seconds(
    value: timedelta | float | None,
    field: str,
    fail: Callable[[str, str], Exception],
    *,
    whole: bool,
) -> Any:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise fail(field, f"must be a timedelta or a number of seconds, not {short_repr(value)}")
    if whole:
        if not (seconds >= 1 and float(seconds).is_integer() and seconds <= MAX_DELAY_CEILING):
            raise fail(
                field,
                f"must be a whole number of seconds from 1 to {MAX_DELAY_CEILING:.0f}, "
                f"not {short_repr(value)}",
            )
        return int(seconds)
    if not 0 <= seconds <= MAX_DELAY_CEILING:
        raise fail(
            field, f"must be from 0 to {MAX_DELAY_CEILING:.0f} seconds, not {short_repr(value)}"
        )
    return float(seconds)


def states_named(bits: int | None) -> list[str]:
    """The states of ``jobs.unique_states``, by name (the admin shows them)."""
    if bits is None:
        return []
    return [name for name, bit in STATE_BITS.items() if bits & bit]
