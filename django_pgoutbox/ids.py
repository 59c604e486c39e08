"""Time-ordered UUIDs (version 7, RFC 9562) for primary keys.

Random (version 4) keys land anywhere in the primary-key B-tree, so a busy queue table dirties a
different index page for almost every insert. Version 7 keys start with the millisecond clock, so
new rows append to the right edge of the index and ``ORDER BY id`` follows creation order.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0
# Random bytes are read from the OS a few kilobytes at a time: one call per id was the costliest
# part of uuid7(), and bulk enqueues make many ids at once (docs/benchmarks.md, "What profiling
# found", item 9).
_RANDOM_CHUNK = 8192
_random = b""
_offset = 0


def _forget_random() -> None:
    # A forked child must not hand out the ids its parent's buffer still holds.
    global _random, _offset, _lock
    _random, _offset, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_random)


def uuid7() -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix milliseconds, a 12-bit counter, 62 random bits.

    The counter (seeded at random each millisecond, incremented within one) keeps ids that one
    process makes within the same millisecond in creation order.
    """
    global _last_ms, _counter, _random, _offset
    with _lock:
        if _offset + 10 > len(_random):
            _random, _offset = os.urandom(_RANDOM_CHUNK), 0
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            _counter = int.from_bytes(_random[_offset : _offset + 2]) & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:
                # Counter exhausted within one millisecond: borrow the next millisecond.
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
        random_bits = int.from_bytes(_random[_offset + 2 : _offset + 10])
        _offset += 10
    value = (
        (ms & 0xFFFF_FFFF_FFFF) << 80
        | 0x7 << 76
        | counter << 64
        | 0b10 << 62
        | random_bits & 0x3FFF_FFFF_FFFF_FFFF
    )
    return _uuid_of(value)


def _uuid_of(value: int) -> uuid.UUID:
    # uuid.UUID(int=...) re-checks a value built right here; set its two slots directly.
    made = object.__new__(uuid.UUID)
    object.__setattr__(made, "int", value)
    object.__setattr__(made, "is_safe", uuid.SafeUUID.unknown)
    return made


def uuid7_many(count: int) -> list[uuid.UUID]:
    """``count`` ids, the same as ``count`` calls of :func:`uuid7` would make, at a third the cost.

    For bulk enqueues: one lock, one read of the clock and of the OS's random bytes for them all.
    The millisecond and the counter are read as one 60-bit number, so that counting past the
    counter's 4,095 carries into the next millisecond, as ``uuid7()`` does.
    """
    global _last_ms, _counter
    if count <= 0:
        return []
    randoms = memoryview(os.urandom(8 * count)).cast("Q")
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            first = now_ms << 12 | randoms[0] & 0x7FF
        else:
            first = (_last_ms << 12 | _counter) + 1
        last = first + count - 1
        _last_ms, _counter = last >> 12, last & 0xFFF
    made: list[uuid.UUID] = []
    append, new, set_slot, unknown = made.append, object.__new__, object.__setattr__, _UNKNOWN
    for clock, random_bits in zip(range(first, last + 1), randoms, strict=True):
        # _uuid_of(), inlined: a call per id was a large part of this loop (docs/benchmarks.md,
        # "What profiling found", item 11).
        one = new(uuid.UUID)
        set_slot(
            one,
            "int",
            ((clock >> 12 << 16 | 0x7000 | clock & 0xFFF) << 64)
            | 0x8000_0000_0000_0000
            | random_bits & 0x3FFF_FFFF_FFFF_FFFF,
        )
        set_slot(one, "is_safe", unknown)
        append(one)
    return made


_UNKNOWN = uuid.SafeUUID.unknown
