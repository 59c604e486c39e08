"""The one way into a queue's coordinator thread: messages, each with whether it must wake it.

Every other thread of a queue (its handler threads, its lanes, the listener, the supervisor)
talks to the coordinator by posting here; the coordinator alone reads. Nothing else of the
queue's state is shared between threads.

A message is *urgent* (wake the coordinator now) or *quiet*. A quiet one, such as an outcome
while the handler threads still have plenty of work, wakes the coordinator only when it waits
for any message at all; while it lets outcomes gather for one statement it sleeps through them
(docs/internals.md, "One owner per queue"), so that a drain wakes it once a batch rather than
once a job.

Posting takes no lock (a handler thread posts once a job, and a lock there made the threads
queue on it): a ``deque`` appends atomically, and the bell is an ``Event``. The owner says
whether quiet messages may wake it *before* it looks for messages one last time and sleeps,
and a poster looks at that *after* it appended; so either the owner finds the message, or the
poster rings.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

#: A message: a tuple whose first item says what it is, one of the kinds below.
Message = tuple[Any, ...]

# Posted by a handler thread: ``(STARTED, attempt, deadline)`` when an attempt's timeout starts
# to run, ``(FINISHED, attempt, outcome)``, ``(LOST, attempt or None, thread_died)``, and
# ``(PROGRESS, ProgressNote)`` at an attempt's first ``ctx.set_progress()`` or
# ``ctx.set_meta()``.
STARTED = "started"
FINISHED = "finished"
LOST = "lost"
PROGRESS = "progress"
# Posted by a queue's event loop (``coroutines``): ``(ENDED, loop, attempt, outcome or None)``,
# ``(RETURNED, loop, attempts)`` (given back unstarted), ``(BEAT, loop)``.
ENDED = "ended"
RETURNED = "returned"
BEAT = "beat"
#: Posted by a lane: ``(REPLY, lane index, request, result, error, connection open)``.
REPLY = "reply"
# Posted by the listener, the supervisor, a handler's ``ctx.renew_lease()``, a test: ``(WAKE,)``,
# ``(STOP,)``, ``(CANCELS,)``, ``(CONTROL,)`` (the queue was paused, resumed or resized),
# ``(RENEW, RenewalRequest)``, ``(SNAPSHOT, reply)``.
WAKE = "wake"
CONTROL = "control"
STOP = "stop"
CANCELS = "cancels"
RENEW = "renew"
SNAPSHOT = "snapshot"


class Mailbox:
    """Messages posted by any thread, taken all at once by the one that owns the mailbox."""

    __slots__ = ("_bell", "_items", "_quiet_wakes", "_urgent")

    def __init__(self) -> None:
        self._bell = threading.Event()
        self._items: deque[Message] = deque()
        self._urgent = False  # an urgent message was posted since the owner last took
        self._quiet_wakes = True  # whether the owner, waiting, wants quiet messages too

    def post(self, message: Message, *, urgent: bool = True) -> None:
        self._items.append(message)
        if urgent:
            self._urgent = True
        elif not self._quiet_wakes:
            return
        if not self._bell.is_set():
            self._bell.set()

    def wait(self, timeout: float, *, quiet: bool = True) -> list[Message]:
        """Wait up to ``timeout`` seconds for an urgent message (or, with ``quiet``, any
        message), then take every message posted so far, in order."""
        self._quiet_wakes = quiet
        self._bell.clear()
        if not (self._urgent or (quiet and self._items)) and timeout > 0:
            self._bell.wait(timeout)
        return self.take()

    def take(self) -> list[Message]:
        """Every message posted so far, without waiting."""
        self._urgent = False
        self._quiet_wakes = True
        items, take = [], self._items.popleft
        try:
            while True:
                items.append(take())
        except IndexError:
            return items
