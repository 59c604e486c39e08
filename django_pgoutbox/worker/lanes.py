"""A queue's connection lanes: threads that each send one statement at a time for the queue's
coordinator, on a connection of their own, and post the result back.

The coordinator never waits on the database: it hands a request to a free lane and goes on
with its mailbox. A queue has one lane, plus the ones ``CONNECTIONS`` adds for a backlog (while
one statement is in flight, the next is sent on another lane, so that two backends work at
once), plus, for a queue with FAIR or a limit, one on which renewals and recovery go while a
claim waits for the queue's lock. A lane opens its connection the first time it sends.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
from collections import deque
from typing import Any, Protocol

import psycopg

from django_pgoutbox.db import (
    ERROR_BACKOFF,
    RECONNECT,
    DispatcherConnection,
    ErrorKind,
    classify_error,
)
from django_pgoutbox.retry import summarize
from django_pgoutbox.worker.mailbox import REPLY, Mailbox

#: Besides requests, a lane's inbox holds ``(FIRE, wake-up number)``, which sends the claim the
#: lane holds (``standby``), ``(DISARM,)``, which gives it back unsent, and ``(STOPPING,)``
#: (``QueueRunner.stop``), a DISARM the lane remembers: from then on, a claim of its that is
#: fired, or in flight, starts none of its jobs (the coordinator gives them back). A lane that
#: holds none ignores FIRE and DISARM.
FIRE = "fire"
DISARM = "disarm"
STOPPING = "stopping"
#: A wake-up's FIRE is left out while this many items wait in the lane's inbox (the lane is
#: busy: its statement in flight and those after it): at most one of them could fire a claim,
#: and the coordinator, woken too, fires the lane itself. A storm of notifications while the
#: lane waits on the server would else pile up there.
CROWDED = 64

logger = logging.getLogger("django_pgoutbox.worker")


class Request(Protocol):
    """Work for a lane: one or a few statements, run on the lane's connection."""

    def run(self, connection: psycopg.Connection[Any]) -> Any: ...


class Lane:
    """One connection and the thread that sends on it."""

    def __init__(self, index: int, using: str, mailbox: Mailbox, name: str) -> None:
        self.index = index
        self._mailbox = mailbox
        self._connection = DispatcherConnection(using)
        # Requests, the standby's (FIRE, n) and (DISARM,), and None: the end.
        self._inbox: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, request: Request) -> None:
        self._inbox.put(request)

    def fire(self, wake: float, *, unless_crowded: bool = False) -> None:
        """Send the claim this lane holds, if any (``standby``): from any thread. A wake-up's
        (``unless_crowded``) is left out while the inbox is ``CROWDED``; the coordinator's
        never is."""
        if not unless_crowded or self._inbox.qsize() < CROWDED:
            self._inbox.put((FIRE, wake))

    def disarm(self) -> None:
        """Give back the claim this lane holds, unsent (``standby``)."""
        self._inbox.put((DISARM,))

    def stopping(self) -> None:
        """The worker stops (from any thread): give back the claim held, and start no job of
        a claim fired from now on, nor of the one in flight."""
        self._inbox.put((STOPPING,))

    def _stopped(self, later: deque[Any]) -> bool:
        """Whether a ``STOPPING`` came while a fired claim was in flight: the jobs claimed must
        not start. What the inbox holds is kept, in order, for the loop."""
        while True:
            try:
                later.append(self._inbox.get_nowait())
            except queue_module.Empty:
                return any(type(item) is tuple and item[0] == STOPPING for item in later)

    def cancel(self) -> None:
        """Cancel the statement in flight (it then fails, and the lane posts that)."""
        self._connection.cancel()

    def stop(self, timeout: float | None = None) -> None:
        """Let the lane finish the statement it is sending, close its connection and end."""
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _work(self) -> None:
        connection, post, inbox = self._connection, self._mailbox.post, self._inbox
        held: Any = None  # a standing request (``standby``), until fired or disarmed
        later: deque[Any] = deque()  # taken from the inbox early (``_stopped``), in order
        stopped = False  # a STOPPING came: no fired claim starts its jobs any more
        try:
            while (item := later.popleft() if later else inbox.get()) is not None:
                fired = False
                if type(item) is tuple:  # (FIRE, wake-up number), (DISARM,) or (STOPPING,)
                    stopped = stopped or item[0] == STOPPING
                    if held is None:
                        continue  # fired or disarmed already
                    request, held = held, None
                    if item[0] != FIRE:
                        post((REPLY, self.index, request, None, None, connection.opened))
                        continue
                    request.fire(item[1])
                    fired = True
                elif getattr(item, "standing", False):
                    held = item
                    continue
                else:
                    request = item
                result: Any = None
                error: BaseException | None = None
                try:
                    result = request.run(connection.get())
                except BaseException as failure:
                    error = failure
                    if classify_error(failure) in RECONNECT:
                        connection.close()
                if fired and (stopped or self._stopped(later)):
                    request.starts = False  # the coordinator gives its jobs back
                post((REPLY, self.index, request, result, error, connection.opened))
                if error is None and (after := getattr(request, "after_reply", None)) is not None:
                    try:
                        after()  # a fired standby starts its attempts, once the reply is posted
                    except BaseException:  # the lane lives on: its queue needs it
                        logger.exception("lane %d: starting the jobs it claimed failed", self.index)
        finally:
            connection.close()


_WAITED_OUT = {
    ErrorKind.CONNECTION: "database unavailable",
    ErrorKind.CONFLICT: "conflict",
    ErrorKind.UNSUPPORTED: "a prepared statement no longer fits the schema (a migration?)",
}


def waited_out(queue: str, index: int, error: BaseException, pause: float) -> ErrorKind:
    """Lane ``index``'s statement failed. A lost connection, a conflict or a stale prepared
    statement (``RECONNECT``) is waited out on that lane (``pause`` seconds), its work kept for
    later: logged, and its kind returned. Anything else is a bug or a schema the worker does
    not expect: raised, so that the loop stops, and the worker with it, rather than send it
    forever. (A DATA error in an outcome write never gets here: ``outcomes`` writes those one
    by one.)"""
    kind = classify_error(error)
    if kind not in _WAITED_OUT:
        raise error
    logger.warning(
        "queue %s: %s on connection %d (%s); retrying in %.1fs",
        queue,
        _WAITED_OUT[kind],
        index + 1,
        summarize(error),
        pause,
        extra={"queue": queue},
    )
    return kind


#: A statement that a lock on the server can hold up (``held_by_locks``: a lease recovery behind
#: a held xmin horizon, a read of ``queue_controls`` behind a migration's lock) in flight on the
#: first lane for longer than this (seconds) is slow: the other lanes send without waiting for it.
SLOW_FIRST = 0.3


class Lanes:
    """A queue's lanes as its coordinator sees them (the coordinator's own): the request each
    has in flight, the statements it sent, whether its connection is open, its back-off."""

    def __init__(self, lanes: list[Any], now: float) -> None:
        count = len(lanes)
        self.lanes = lanes
        self.in_flight: list[Request | None] = [None] * count
        self.turns = [0] * count
        self.open = [False] * count
        self.ready_at = [now] * count
        self.sent_at = [now] * count  # when each lane's request in flight was sent
        self._pause = [ERROR_BACKOFF[0]] * count

    def add(self, lane: Any, now: float) -> None:
        """One more lane (a queue limited at run time gets the one its renewals need while a
        claim waits for the queue's lock), started at once."""
        self.lanes.append(lane)
        self.in_flight.append(None)
        self.turns.append(0)
        self.open.append(False)
        self.ready_at.append(now)
        self.sent_at.append(now)
        self._pause.append(ERROR_BACKOFF[0])
        lane.start()

    def free(self, now: float, *, beyond_first: bool) -> int | None:
        """The lane to send on now, if any: the first, else, with ``beyond_first`` or while the
        first backs off after an error, another."""
        in_flight, ready_at = self.in_flight, self.ready_at
        if in_flight[0] is None and now >= ready_at[0]:
            return 0
        if beyond_first or in_flight[0] is None:  # the first backs off: another may send
            for index in range(1, len(in_flight)):
                if in_flight[index] is None and now >= ready_at[index]:
                    return index
        return None

    def send(self, index: int, request: Request, now: float) -> None:
        self.in_flight[index] = request
        self.turns[index] += 1
        self.sent_at[index] = now
        self.lanes[index].send(request)

    def first_held_up(self, now: float) -> bool:
        """Whether the first lane waits on a statement that a lock holds up (``SLOW_FIRST``)."""
        at = self.first_held_up_at()
        return at is not None and now >= at

    def first_held_up_at(self) -> float | None:
        """When the first lane's statement in flight counts as held up, if it is one a lock can
        hold up (the coordinator must wake for it: no reply comes)."""
        first = self.in_flight[0]
        if first is None or not getattr(first, "held_by_locks", False):
            return None
        return self.sent_at[0] + SLOW_FIRST

    def busy(self) -> bool:
        return any(request is not None for request in self.in_flight)

    def replied(
        self, index: int, opened: bool, *, failed: bool, now: float, sent: bool = True
    ) -> float:
        """Lane ``index`` answered; after a failure it backs off: returns for how long. A
        request it never sent (``sent``: a standby claim given back) says nothing of the
        connection: the back-off after earlier failures stays as it was."""
        self.in_flight[index] = None
        self.open[index] = opened
        if not sent:
            return 0.0
        if not failed:
            self._pause[index] = ERROR_BACKOFF[0]
            return 0.0
        pause = self._pause[index]
        self.ready_at[index] = now + pause
        self._pause[index] = min(pause * 2, ERROR_BACKOFF[1])
        return pause

    def backing_off(self, now: float) -> list[float]:
        """When the lanes that back off now may send again."""
        return [at for at in self.ready_at if at > now]

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()

    def cancel(self, keep: type) -> bool:
        """Cancel the statements in flight, but those of ``keep``; whether there was any."""
        busy = [i for i, request in enumerate(self.in_flight) if request is not None]
        for index in busy:
            if not isinstance(self.in_flight[index], keep):
                self.lanes[index].cancel()
        return bool(busy)

    def stop(self, timeout: float) -> None:
        """End the lanes: each finishes its statement, waited for ``timeout`` seconds at most."""
        for lane in self.lanes:
            lane.stop(timeout)
        self.open = [False] * len(self.lanes)


def hand_off(now: bool) -> None:
    """Let the thread just handed work run ``now``, rather than when this one next waits: on an
    idle queue, a claim (to its lane) and its first jobs (to the handler threads) are a wake-up's
    latency, one thread hand-off each (docs/benchmarks.md, "What profiling found", item 22)."""
    if now:
        time.sleep(0)
