"""The one way into a queue's coordinator thread: messages, each with whether it must wake it.

Every other thread of a queue (its handler threads, its lanes, the listener, the supervisor)
talks to the coordinator by posting here; the coordinator alone reads. Nothing else of the
queue's state is shared between threads.

A message is *urgent* (wake the coordinator now) or *quiet*. A quiet one, such as an outcome
while the handler threads still have plenty of work, wakes the coordinator only when it waits
for any message at all; while it lets outcomes gather for one statement it sleeps through them
(docs/internals.md, "The mailbox"), so that a drain wakes it once a batch rather than once a job.
"""

from __future__ import annotations

import threading
from typing import Any

#: A message: a tuple whose first item says what it is, one of the kinds below.
Message = tuple[Any, ...]

# Posted by a handler thread: ``(STARTED, attempt, deadline)`` when an attempt's timeout starts
# to run, ``(FINISHED, attempt, outcome)``, ``(LOST, attempt or None, thread_died)``.
STARTED = "started"
FINISHED = "finished"
LOST = "lost"
#: Posted by a lane: ``(REPLY, lane index, request, result, error, connection open)``.
REPLY = "reply"
# Posted by the listener, the supervisor, a handler's ``ctx.renew_lease()``, a test: ``(WAKE,)``,
# ``(STOP,)``, ``(CANCELS,)``, ``(RENEW, RenewalRequest)``, ``(SNAPSHOT, reply)``.
WAKE = "wake"
STOP = "stop"
CANCELS = "cancels"
RENEW = "renew"
SNAPSHOT = "snapshot"


class Mailbox:
    """Messages posted by any thread, taken all at once by the one that owns the mailbox."""

    __slots__ = ("_bell", "_items", "_lock", "_quiet_wakes", "_rung", "_urgent")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bell = threading.Event()
        self._items: list[Message] = []
        self._urgent = False  # an urgent message waits
        self._rung = False  # the bell was rung since the owner last took
        self._quiet_wakes = True  # whether the owner, waiting, wants quiet messages too

    def post(self, message: Message, *, urgent: bool = True) -> None:
        with self._lock:
            self._items.append(message)
            if urgent:
                self._urgent = True
            elif not self._quiet_wakes:
                return
            if self._rung:
                return
            self._rung = True
        self._bell.set()

    def wait(self, timeout: float, *, quiet: bool = True) -> list[Message]:
        """Wait up to ``timeout`` seconds for an urgent message (or, with ``quiet``, any
        message), then take every message posted so far, in order."""
        with self._lock:
            ready = bool(self._items) and (self._urgent or quiet)
            if not ready:
                self._quiet_wakes = quiet
                self._rung = False
                self._bell.clear()
        if not ready and timeout > 0:
            self._bell.wait(timeout)
        return self.take()

    def take(self) -> list[Message]:
        """Every message posted so far, without waiting."""
        with self._lock:
            items, self._items = self._items, []
            self._urgent = False
            self._rung = False
            self._quiet_wakes = True
        return items
