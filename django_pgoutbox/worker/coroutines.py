"""A queue's event loop: the attempts of ``async def`` handlers, run as coroutines on one thread.

The loop thread (``EventLoop``) owns its own state: the attempts waiting for a coroutine slot and
the tasks in flight, at most ``ASYNC_CONCURRENCY`` of them counted (a task cancelled at its
timeout no longer is, as a timed-out thread is replaced). The coordinator reaches it only through
``loop.call_soon_threadsafe`` (the attempts to run, a cancellation, the stop); the loop posts to the
coordinator's mailbox ``(STARTED, attempt, deadline)`` when a timeout starts to run, ``(ENDED,
loop, attempt, outcome or None)`` when a coroutine ends, ``(RETURNED, loop, attempts)`` with the
attempts it gave back unstarted, and ``(BEAT, loop)`` every ``BEAT_INTERVAL`` while it has work.

``Coroutines`` is the coordinator's side (its own state): the loop in use, the attempts it handed
that loop, and when it last heard from it. A loop that stops answering for ``stall_after``
seconds (a coroutine that blocks it: ``time.sleep()``, a loop that never awaits) is left behind:
the attempts on it are no longer the queue's (their leases expire into recovery, and a job lost
twice in a row runs alone as a suspect), and the next async attempt starts a fresh loop.
docs/workers.md, "Async handlers", says it for users.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

from django_pgoutbox.registry import get_job
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.execute_async import TIMEOUT_CANCEL
from django_pgoutbox.worker.handlers import cancelled_unstarted
from django_pgoutbox.worker.mailbox import BEAT, ENDED, RETURNED, Mailbox

logger = logging.getLogger("django_pgoutbox.worker")

_task_runs_on_loop: Callable[[str], bool] | None
try:
    from django_pgoutbox.backend import task_runs_on_loop as _task_runs_on_loop
except ImportError:  # neither django.tasks nor the django-tasks backport is installed
    _task_runs_on_loop = None

#: Seconds between two beats of a loop that has work (and between two looks at the
#: cancellations requested of its coroutines).
BEAT_INTERVAL = 0.25
#: The longest a loop may go unheard before its coordinator leaves it behind, in seconds; less
#: on a queue whose lease is short (a third of it), never under ``MIN_STALL_AFTER``.
STALL_AFTER = 10.0
MIN_STALL_AFTER = 1.0

#: The longest a retired loop waits for the async ORM's connections to close, in seconds.
CLOSE_TIMEOUT = 1.0

AttemptCoroutine = Callable[[Attempt], Coroutine[Any, Any, Outcome]]


def runs_on_loop(job_type: str) -> bool:
    """Whether the attempts of ``job_type`` run on the queue's event loop: an ``async def``
    handler of ``@job``, or an ``async def`` django.tasks task (``backend.task_runs_on_loop``)."""
    definition = get_job(job_type)
    if definition is not None:
        return definition.on_loop
    return _task_runs_on_loop is not None and _task_runs_on_loop(job_type)


def stall_after(lease_seconds: float) -> float:
    """How long a loop with work may go unheard before it is left behind."""
    return max(MIN_STALL_AFTER, min(STALL_AFTER, lease_seconds / 3))


async def _refuse_executor_shutdown(timeout: float | None = None) -> None:
    raise RuntimeError(
        "the queue's event loop keeps its default executor: the other coroutines use it too"
    )


class EventLoop:
    """One event loop thread and the coroutines on it (its own state, touched by it alone)."""

    def __init__(self, name: str, capacity: int, run: AttemptCoroutine, mailbox: Mailbox) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        # Its default executor serves every coroutine of the queue (asyncio.to_thread): one that
        # shut it down failed each later attempt's asyncio.to_thread for the loop's life.
        self.loop.shutdown_default_executor = _refuse_executor_shutdown  # type: ignore[method-assign]
        self._capacity = capacity
        self._run = run
        self._post = mailbox.post
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        # -- the loop thread's own -------------------------------------------------------------
        self._waiting: deque[Attempt] = deque()
        #: Every task in flight, with its attempt; ``_counted``: those that hold a slot.
        self._tasks: dict[asyncio.Task[Outcome], Attempt] = {}
        self._counted = 0
        #: Tasks cancelled at their timeout (no longer counted) or for a cancellation request.
        self._timed_out: set[asyncio.Task[Outcome]] = set()
        self._cancelled: set[asyncio.Task[Outcome]] = set()
        self._retired = False
        self._ended_since_close = False
        self._closing: asyncio.Task[None] | None = None

    # -- the coordinator's calls: each a callback the loop runs --------------------------------

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        """Whether its thread still runs (a loop left behind: whether a coroutine still
        blocks it)."""
        return self._thread.is_alive()

    def submit(self, attempts: list[Attempt]) -> None:
        self.loop.call_soon_threadsafe(self._admit, attempts)

    def cancel(self, attempt: Attempt) -> None:
        """Its timeout passed: cancel its coroutine, whose slot is free from now."""
        self.loop.call_soon_threadsafe(self._cancel_timed_out, attempt)

    def give_back(self) -> None:
        """Post back (RETURNED) the attempts no coroutine started (at the stop, at a pause)."""
        self.loop.call_soon_threadsafe(self._give_back)

    def retire(self) -> None:
        """Cancel every coroutine and stop; the thread then ends."""
        self.loop.call_soon_threadsafe(self._retire)

    # -- the loop thread -----------------------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._beat)
        while not self._retired:
            try:
                self.loop.run_forever()  # returns at ``_retire``, or when a coroutine stops it
            except BaseException:  # a callback of a handler's raised SystemExit or the like
                logger.exception("%s: the event loop raised; it goes on", self.name)
        try:
            self.loop.run_until_complete(
                asyncio.Task(asyncio.sleep(0), loop=self.loop)
            )  # cancelled
            self.loop.close()
        except BaseException:
            logger.exception("%s: closing the event loop failed", self.name)

    def _admit(self, attempts: list[Attempt]) -> None:
        if self._retired:
            return
        self._waiting.extend(attempts)
        self._fill()

    def _fill(self) -> None:
        waiting, tasks = self._waiting, self._tasks
        while waiting and self._counted < self._capacity:
            attempt = waiting.popleft()
            # A Task of its own, not ``loop.create_task``: a task factory a handler set on the
            # loop (one that raises, an eager one) never decides how the next attempts start.
            task = asyncio.Task(self._run(attempt), loop=self.loop)
            tasks[task] = attempt
            self._counted += 1
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Outcome]) -> None:
        attempt = self._tasks.pop(task)
        if task in self._timed_out:
            self._timed_out.discard(task)
        else:
            self._counted -= 1
        self._cancelled.discard(task)
        outcome: Outcome | None = None
        if task.cancelled():  # cancelled before its first step: its handler never started
            if attempt.cancel.is_set():
                outcome = cancelled_unstarted(attempt.bare_job())
        else:
            outcome = task.result()  # ``run`` never raises
        self._ended_since_close = True
        self._post((ENDED, self, attempt, outcome), urgent=len(self._waiting) < attempt.low_water)
        self._fill()

    def _cancel_timed_out(self, attempt: Attempt) -> None:
        for task, running in self._tasks.items():
            if running is attempt:
                if task not in self._timed_out:
                    self._timed_out.add(task)
                    self._counted -= 1
                    task.cancel(TIMEOUT_CANCEL)
                break
        self._fill()

    def _give_back(self) -> None:
        if self._waiting:
            given, self._waiting = list(self._waiting), deque()
            self._post((RETURNED, self, given))

    def _retire(self) -> None:
        self._retired = True
        self._waiting.clear()
        for task in self._tasks:
            task.cancel()
        asyncio.Task(self._close_and_stop(), loop=self.loop)

    async def _close_and_stop(self) -> None:
        """Close the connections the async ORM opened in asgiref's thread (a second at most:
        that thread may be held), then stop."""
        try:
            await asyncio.wait_for(sync_to_async(connections.close_all)(), CLOSE_TIMEOUT)
        except BaseException:
            logger.warning("%s: the connections of the async ORM were left open", self.name)
        finally:
            self.loop.stop()

    def _beat(self) -> None:
        """Every ``BEAT_INTERVAL``: tell the coordinator the loop answers, cancel the coroutines
        whose job's cancellation was requested, and have Django's connections looked at."""
        if self._retired:
            return
        self.loop.call_later(BEAT_INTERVAL, self._beat)
        if self._ended_since_close and self._closing is None:
            # The async ORM runs in asgiref's one thread-sensitive thread, not this one: its
            # connection is looked at there, once a beat rather than after each attempt.
            self._ended_since_close = False
            self._closing = asyncio.Task(self._close_old_connections(), loop=self.loop)
        if not (self._tasks or self._waiting):
            return
        self._post((BEAT, self), urgent=False)
        for task, attempt in self._tasks.items():
            if attempt.cancel.is_set() and task not in self._cancelled:
                self._cancelled.add(task)
                task.cancel()

    async def _close_old_connections(self) -> None:
        try:
            await sync_to_async(close_old_connections)()
        except Exception:
            logger.exception("%s: closing old connections failed", self.name)
        finally:
            self._closing = None


class Coroutines:
    """The coordinator's side of its queue's event loop (the coordinator's own state)."""

    def __init__(
        self,
        queue: str,
        capacity: int,
        run: AttemptCoroutine,
        mailbox: Mailbox,
        lease_seconds: float,
    ) -> None:
        self.queue = queue
        self.capacity = capacity
        self._run = run
        self._mailbox = mailbox
        self.stall_after = stall_after(lease_seconds)
        self.loop: EventLoop | None = None
        #: The attempts handed to ``loop`` and not ended or given back (by slot), and when the
        #: loop was last heard from (or first given work).
        self.on_loop: dict[tuple[int, int], Attempt] = {}
        self.heard = 0.0
        #: The loops left behind whose thread was still running when last looked at.
        self._left: list[EventLoop] = []
        self._pending: list[Attempt] = []
        self._numbers = itertools.count(1)

    def submit(self, attempt: Attempt, now: float) -> None:
        """Run ``attempt`` on the loop (sent at ``flush``, once a turn)."""
        if not self.on_loop and not self._pending:
            self.heard = now
        self._pending.append(attempt)

    def flush(self) -> None:
        if not self._pending:
            return
        if self.loop is None:
            self.loop = EventLoop(
                f"pgoutbox-{self.queue}-loop-{next(self._numbers)}",
                self.capacity,
                self._run,
                self._mailbox,
            )
            self.loop.start()
        pending, self._pending = self._pending, []
        for attempt in pending:
            self.on_loop[attempt.slot] = attempt
        try:
            self.loop.submit(pending)
        except RuntimeError:  # its event loop was closed: the beat's absence leaves it behind
            logger.exception("queue %s: the event loop refused its attempts", self.queue)

    def cancel(self, attempt: Attempt) -> None:
        if self.loop is not None and self.on_loop.get(attempt.slot) is attempt:
            try:
                self.loop.cancel(attempt)
            except RuntimeError:
                logger.exception("queue %s: the event loop refused a cancellation", self.queue)

    def take_waiting(self) -> list[Attempt]:
        """The attempts not yet sent; those the loop has not started come back (RETURNED)."""
        taken, self._pending = self._pending, []
        if self.loop is not None and self.on_loop:
            with contextlib.suppress(RuntimeError):
                self.loop.give_back()
        return taken

    def heard_from(self, loop: Any, now: float) -> bool:
        """A message of ``loop``: True if it is the loop in use."""
        if loop is self.loop:
            self.heard = now
            return True
        return False

    def ended(self, loop: Any, attempt: Attempt, now: float) -> None:
        if self.heard_from(loop, now) and self.on_loop.get(attempt.slot) is attempt:
            del self.on_loop[attempt.slot]

    def returned(self, loop: Any, attempts: list[Attempt]) -> list[Attempt]:
        """The attempts ``loop`` gave back unstarted that are still this queue's."""
        if loop is not self.loop:
            return []
        for attempt in attempts:
            self.on_loop.pop(attempt.slot, None)
        return attempts

    def deadline(self) -> float | None:
        """When the loop in use, if it has work, is due to be left behind unheard."""
        return self.heard + self.stall_after if self.on_loop else None

    def stalled(self, now: float) -> list[Attempt]:
        """If the loop has gone unheard too long, leave it behind: the attempts it held."""
        if not self.on_loop or now < self.heard + self.stall_after or self.loop is None:
            return []
        left = list(self.on_loop.values())
        logger.error(
            "queue %s: its event loop %s has not answered for %.1fs (a coroutine blocks it); "
            "it is left behind with its %d attempts, and a new loop runs the next ones",
            self.queue,
            self.loop.name,
            now - self.heard,
            len(left),
            extra={"queue": self.queue},
        )
        with contextlib.suppress(RuntimeError):
            self.loop.retire()  # should it ever answer again
        self._left = [loop for loop in self._left if loop.alive()]
        self._left.append(self.loop)
        self.loop, self.on_loop = None, {}
        return left

    def left_behind(self) -> int:
        """The loops left behind whose thread a coroutine still blocks: abandoned threads, as
        a handler thread past its timeout is (``runworkers --max-abandoned-threads``)."""
        return sum(loop.alive() for loop in self._left)

    def shutdown(self) -> None:
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.retire()
            self.loop = None
