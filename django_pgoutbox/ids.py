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


def uuid7() -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix milliseconds, a 12-bit counter, 62 random bits.

    The counter (seeded at random each millisecond, incremented within one) keeps ids that one
    process makes within the same millisecond in creation order.
    """
    global _last_ms, _counter
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms = now_ms
            _counter = int.from_bytes(os.urandom(2)) & 0x7FF
        else:
            _counter += 1
            if _counter > 0xFFF:
                # Counter exhausted within one millisecond: borrow the next millisecond.
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= int.from_bytes(os.urandom(8)) & 0x3FFF_FFFF_FFFF_FFFF
    return uuid.UUID(int=value)
