"""One queue's coordinator: the one thread that owns the queue's state.

Each queue of a worker process has its own ``QueueRunner``. Its coordinator thread alone reads
and writes the queue's state: the attempts claimed, their deadlines, the claims in flight, the
pace, the outcomes waiting to be written, the suspects. It waits on one mailbox
(``mailbox.Mailbox``), and every other thread only posts there:

- the handler threads (``handlers``) post what started and what finished;
- the lanes (``lanes``), each a thread with a connection of its own, run the statements the
  coordinator hands them and post the results back;
- the listener, the supervisor and a handler's ``ctx.renew_lease()`` post wake-ups, the stop,
  cancellation checks and renewal requests.

Each turn, the coordinator takes every message, then does what they and the clock call for:
starts or ends a suspect's run alone, fails the attempts past their timeout, renews leases (a
third of the way through them) and delivers cancellations, recovers expired leases once per
poll interval, and writes the outcomes with the next claim in one statement (RECORD_AND_CLAIM),
for as many jobs as there are free threads plus a prefetch that follows the queue's pace. While
the threads have plenty of work, outcomes gather for a few milliseconds to go in one statement.

No transaction is open while a handler runs: the claim commits before the handler starts, and
the outcome is written in a later, separate statement. docs/internals.md draws the threads and
messages, and the life of one job.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_pgoutbox import metrics
from django_pgoutbox.conf import QueueSettings, RetrySettings
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.errors import LeaseLost
from django_pgoutbox.retry import summarize
from django_pgoutbox.worker import outcomes as outcome_writes
from django_pgoutbox.worker.attempt import (
    HELD,
    LOST,
    QUEUED,
    TIMED_OUT,
    Attempt,
    Key,
)
from django_pgoutbox.worker.claims import Pace, RecordAndClaim
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.handlers import (
    FINISHED as FINISHED_MESSAGE,
)
from django_pgoutbox.worker.handlers import (
    LOST as LOST_MESSAGE,
)
from django_pgoutbox.worker.handlers import (
    STARTED,
    AttemptRunner,
    Handlers,
    HandlerThreads,
)
from django_pgoutbox.worker.lanes import REPLY, Lane, Request
from django_pgoutbox.worker.leases import (
    RENEW_FRACTION,
    GiveBack,
    MarkAlone,
    PublishHealth,
    Recover,
    Renew,
    RenewalRequest,
)
from django_pgoutbox.worker.mailbox import Mailbox, Message
from django_pgoutbox.worker.state import QueueState
from django_pgoutbox.worker.suspects import GIVE_BACK, SUBMIT, AloneGate, Suspects
from django_pgoutbox.worker.timeouts import timed_out

__all__ = ["AloneGate", "QueueRunner", "RunnerSnapshot"]

logger = logging.getLogger("django_pgoutbox.worker")

# The messages that other threads post to a coordinator (besides the handlers' and lanes').
WAKE = "wake"
STOP = "stop"
CANCELS = "cancels"
RENEW = "renew"
SNAPSHOT = "snapshot"

#: Back-off bounds (seconds) of a lane after a database error.
ERROR_BACKOFF = (0.2, 10.0)
#: Outcomes wait at most this long (seconds) to be written with others in one statement.
FLUSH_DELAY = 0.005
#: ... or until this many have gathered.
FLUSH_SIZE = 500


@dataclass(frozen=True)
class RunnerSnapshot:
    """What a queue's coordinator holds at one moment (``QueueRunner.snapshot()``)."""

    #: Attempts claimed and not yet written: waiting for a thread, running, or their outcome
    #: waiting to be written or being written.
    running: int
    outcomes_waiting: int
    writing: int
    #: Jobs asked for by claims in flight.
    reserved: int
    #: Attempts failed for their timeout whose handler has not returned.
    abandoned: int
    suspect_held: bool
    suspect_alone: bool
    #: Statements sent on each lane, and whether its connection is open.
    lane_turns: tuple[int, ...]
    lanes_open: tuple[bool, ...]
    #: The loop has ended (stopped, or a burst found nothing more).
    ended: bool


class QueueRunner:
    """Claims, runs and records the jobs of one queue."""

    def __init__(
        self,
        settings: QueueSettings,
        *,
        worker_id: str,
        using: str,
        policy: RetrySettings,
        concurrency: int | None = None,
        burst: bool = False,
        grace_period: float = 30.0,
        gate: AloneGate | None = None,
        clock: Callable[[], float] = time.monotonic,
        lane: Callable[[int, Mailbox], Any] | None = None,
        handlers: Callable[[int, Mailbox, Callable[[Attempt], Outcome | None]], Handlers]
        | None = None,
    ) -> None:
        """``clock``, ``lane`` and ``handlers`` are for tests that drive the coordinator with
        fakes (``step()``): what makes a lane from its index, and the handler threads."""
        self.queue = settings.name
        self.settings = settings
        self.worker_id = worker_id
        self.using = using
        self.policy = policy
        self.concurrency = concurrency or settings.concurrency
        self.burst = burst
        self.grace_period = grace_period
        self.lease_seconds = settings.lease_seconds
        self._clock = clock
        self._mailbox = Mailbox()
        self._started = threading.Event()
        self.finished = threading.Event()
        # -- the coordinator's own state (its thread alone touches it) ----------------------------
        now = clock()
        self._state = QueueState(self.queue)
        #: A queue with FAIR or a limit claims under the queue's lock, one claim at a time.
        self._special = settings.fair or settings.limited
        self._pace = Pace(0 if self._special else settings.prefetch, now)
        #: Wake the coordinator to claim more once fewer jobs than this wait for a thread.
        self._low_water = self.concurrency
        self._suspects = Suspects(gate or AloneGate())
        self._suspects.gate.register(self.wake)
        self._renew_asked: list[RenewalRequest] = []
        self._renewing = self._recovering = self._publishing = False
        self._check_cancel = False
        #: Whether the queue is stuck, as the coordinator last told the heartbeat row (None:
        #: to be told again).
        self._published_stuck: bool | None = False
        self._want_claim = True  # woken, or the poll interval passed, since the last claim
        self._backlog = False  # the last claim came back full: the queue may hold more
        self._next_renewal = now + self.lease_seconds * RENEW_FRACTION
        self._next_recovery = self._next_poll = now
        self._flush_at: float | None = None
        self._gathering_until: float | None = None
        self._stopping = False
        self._stop_deadline: float | None = None
        self._gave_back_waiting = self._released = False
        self._exiting = False  # burst mode found nothing more: end once the lanes are idle
        self._done = False
        #: A claim's worker_ids text when this worker ran every attempt (the first, usually),
        #: and the value it stands for.
        self._own_worker_ids = (json.dumps([worker_id]), (worker_id,))
        # -- the lanes and the handler threads -----------------------------------------------------
        count = 2 if self._special else settings.connections
        make_lane = lane or self._make_lane
        self._lanes = [make_lane(index, self._mailbox) for index in range(count)]
        self._in_flight: list[Request | None] = [None] * count
        self._turns = [0] * count
        self._lanes_open = [False] * count
        self._ready_at = [now] * count
        self._pause = [ERROR_BACKOFF[0]] * count
        run = AttemptRunner(
            queue=self.queue,
            policy=policy,
            using=using,
            mailbox=self._mailbox,
            renew=lambda attempt: self.renew(attempt.key),
        )
        if handlers is None:
            self._handlers: Handlers = HandlerThreads(
                self.concurrency, f"pgoutbox-{self.queue}", run, self._mailbox
            )
        else:
            self._handlers = handlers(self.concurrency, self._mailbox, run)

    def _make_lane(self, index: int, mailbox: Mailbox) -> Lane:
        return Lane(index, self.using, mailbox, f"pgoutbox-dispatch-{self.queue}-{index}")

    # -- called from other threads: each posts a message ---------------------------------------

    def wake(self) -> None:
        """New work may exist (a notification, a reconnect): claim now instead of at the poll."""
        self._mailbox.post((WAKE,))

    def stop(self) -> None:
        """Stop claiming; let running attempts finish within the grace period."""
        self._mailbox.post((STOP,))

    def check_cancellations(self) -> None:
        """A running job of this queue was asked to stop: look at the running jobs now."""
        self._mailbox.post((CANCELS,))

    def renew(self, key: Key) -> None:
        """Renew one attempt's lease now (``ctx.renew_lease()``); raise ``LeaseLost`` if gone."""
        request = RenewalRequest(key, threading.Event())
        self._mailbox.post((RENEW, request))
        if not request.done.wait(timeout=self.lease_seconds):
            raise TimeoutError(f"the lease of job {key[0]} could not be renewed in time")
        if not request.held:
            raise LeaseLost(f"the lease of job {key[0]} was lost; its outcome will be discarded")

    def snapshot(self) -> RunnerSnapshot:
        """The coordinator's state now: asked of its thread while it runs, read directly before
        it starts and after it ended."""
        while self._started.is_set() and not self.finished.is_set():
            reply: dict[str, Any] = {"done": threading.Event()}
            self._mailbox.post((SNAPSHOT, reply))
            if reply["done"].wait(1.0):
                snapshot: RunnerSnapshot = reply["snapshot"]
                return snapshot
        return self._snapshot()

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """The coordinator's loop; returns when stopped (or, in burst mode, when nothing is due)."""
        self._started.set()
        try:
            for lane in self._lanes:
                lane.start()
            self._handlers.start()
            while not self._done:
                timeout = max(0.0, self._next_deadline() - self._clock())
                quiet = not self._state.outcomes  # while outcomes wait, sleep through more
                self._handle(self._mailbox.wait(timeout, quiet=quiet), self._clock())
        finally:
            self._suspects.give_token_back()
            for lane in self._lanes:
                lane.stop()
            self._lanes_open = [False] * len(self._lanes)
            self._handlers.shutdown()
            connections[self.using].close()
            self.finished.set()

    def step(self) -> None:
        """One turn without waiting: the messages posted so far, then what they call for. Tests
        drive a coordinator made with fake lanes and handler threads through this."""
        self._handle(self._mailbox.take(), self._clock())

    def _handle(self, messages: list[Message], now: float) -> None:
        state = self._state
        for message in messages:
            kind = message[0]
            if kind is FINISHED_MESSAGE:
                if not state.finished(message[1], message[2]):
                    self._late(message[1], message[2])
            elif kind is REPLY:
                self._on_reply(message[1], message[2], message[3], message[4], message[5], now)
            elif kind is STARTED:
                state.started(message[1], message[2])
            elif kind is WAKE:
                self._want_claim = True
            elif kind is RENEW:
                self._renew_asked.append(message[1])
            elif kind is CANCELS:
                self._check_cancel = True
            elif kind is LOST_MESSAGE:
                self._on_lost(message[1], message[2])
            elif kind is STOP:
                self._stopping = True
            elif kind is SNAPSHOT:
                message[1]["snapshot"] = self._snapshot()
                message[1]["done"].set()
        self._turn(now)

    def _turn(self, now: float) -> None:
        state, suspects = self._state, self._suspects
        if suspects.alone is not None:
            suspects.end_alone(now)
        if suspects.held is not None and not self._stopping:
            self._start_alone(now)
        if state.timed:
            for attempt in state.expired(now):
                self._handlers.add_thread()  # in place of the one its handler still holds
                state.outcomes.insert(0, timed_out(attempt, self.policy, self.queue))
        stuck = len(state.abandoned) >= self.concurrency
        if stuck != self._published_stuck and not self._publishing:
            self._publish_health(now, stuck)
        if state.to_unclaim:
            self._unclaim(now)
        if not self._renewing and (
            self._renew_asked
            or (state.attempts and (self._check_cancel or now >= self._next_renewal))
        ):
            self._renew(now)
        if self._stopping:
            self._stop_turn(now)
        elif not self._exiting:
            if now >= self._next_recovery and not self._recovering:
                self._send_maintenance(now, Recover(self.queue))
            self._record_and_claim(now)
        if self._exiting and not any(self._in_flight):
            self._done = True

    def _next_deadline(self) -> float:
        """When the coordinator must look again if no message comes first. A deadline whose
        work needs a lane counts only while one is free: else a lane's reply wakes it."""
        now, state, suspects = self._clock(), self._state, self._suspects
        deadlines = [now + self.settings.poll_interval]
        if self._free_lane(now) is not None:
            deadlines += [self._next_poll, self._next_recovery]
            if state.attempts and not self._renewing:
                deadlines.append(self._next_renewal)
            if self._gathering_until is not None:
                deadlines.append(self._gathering_until)
        deadlines += [at for at in self._ready_at if at > now]
        deadlines += [a.deadline for a in state.timed.values() if a.deadline is not None]
        if suspects.held is not None and now < suspects.held_since + self.lease_seconds:
            deadlines.append(suspects.held_since + self.lease_seconds)
        if suspects.alone is not None:
            deadlines.append(suspects.alone_until)
        if self._stop_deadline is not None and not self._released:
            deadlines.append(self._stop_deadline)
        return min(deadlines)

    # -- lanes ---------------------------------------------------------------------------------

    def _free_lane(self, now: float) -> int | None:
        """The lane to send on now, if any: the first, else (for a backlog, or beside a fair or
        limited queue's claim waiting on its lock) another."""
        in_flight, ready_at = self._in_flight, self._ready_at
        if in_flight[0] is None and now >= ready_at[0]:
            return 0
        if not (self._backlog or (self._special and isinstance(in_flight[0], RecordAndClaim))):
            return None
        for index in range(1, len(in_flight)):
            if in_flight[index] is None and now >= ready_at[index]:
                return index
        return None

    def _send(self, index: int, request: Request) -> None:
        self._in_flight[index] = request
        self._turns[index] += 1
        self._lanes[index].send(request)

    def _send_maintenance(self, now: float, request: Request) -> bool:
        index = self._free_lane(now)
        if index is None:
            return False
        if isinstance(request, Recover):
            self._recovering = True
            self._next_recovery = now + self.settings.poll_interval
        elif isinstance(request, PublishHealth):
            self._publishing = True
        self._send(index, request)
        return True

    def _on_reply(
        self,
        index: int,
        request: Request,
        result: Any,
        error: BaseException | None,
        opened: bool,
        now: float,
    ) -> None:
        self._in_flight[index] = None
        self._lanes_open[index] = opened
        if error is not None:
            self._on_error(index, request, error, now)
        elif isinstance(request, RecordAndClaim):
            self._pause[index] = ERROR_BACKOFF[0]
            self._on_recorded(request, now)
        else:
            self._pause[index] = ERROR_BACKOFF[0]
            self._on_done(request, result, now)

    def _on_done(self, request: Request, result: Any, now: float) -> None:
        if isinstance(request, Renew):
            self._renewing = False
            self._state.renewed(request, result)
        elif isinstance(request, Recover):
            self._recovering = False
        elif isinstance(request, MarkAlone):
            attempt = self._suspects.held
            if attempt is not None and attempt.key == request.key:
                if self._suspects.marked(attempt, result, now, self.lease_seconds):
                    attempt.state = QUEUED
                    self._handlers.submit(attempt)
                else:
                    self._state.forget(attempt)
        elif isinstance(request, PublishHealth):
            self._publishing = False
        elif isinstance(request, GiveBack) and request.reason == "grace":
            logger.warning(
                "queue %s: grace period over; released %d unfinished job(s) for another worker",
                self.queue,
                result,
                extra={"queue": self.queue},
            )

    def _on_error(self, index: int, request: Request, error: BaseException, now: float) -> None:
        """A lane's statement failed. A lost connection or a conflict is waited out on that
        lane, its work kept for later; anything else is a bug or a schema the worker does not
        expect: the loop stops, and the worker with it, rather than send it forever. (A DATA
        error in an outcome write never gets here: ``outcomes`` writes those one by one.)"""
        kind = classify_error(error)
        if kind not in (ErrorKind.CONNECTION, ErrorKind.CONFLICT):
            raise error
        pause = self._pause[index]
        logger.warning(
            "queue %s: %s on connection %d (%s); retrying in %.1fs",
            self.queue,
            "database unavailable" if kind is ErrorKind.CONNECTION else "conflict",
            index + 1,
            summarize(error),
            pause,
            extra={"queue": self.queue},
        )
        self._ready_at[index] = now + pause
        self._pause[index] = min(pause * 2, ERROR_BACKOFF[1])
        if self._stopping and self._stop_deadline is not None and now >= self._stop_deadline:
            self._done = True  # the grace period is over: what is left, the leases recover
        if isinstance(request, RecordAndClaim):
            self._state.not_written(request)
        elif isinstance(request, Renew):
            self._renewing = False
            self._renew_asked[:0] = request.asked
        elif isinstance(request, Recover):
            self._recovering = False
        elif isinstance(request, MarkAlone):
            self._suspects.marking = False
        elif isinstance(request, PublishHealth):
            self._publishing, self._published_stuck = False, None
        elif isinstance(request, GiveBack):
            logger.warning(
                "queue %s: %d job(s) could not be given back (%s); their leases will expire",
                self.queue,
                len(request.keys),
                summarize(error),
                extra={"queue": self.queue},
            )

    # -- outcomes and claims -------------------------------------------------------------------

    def _record_and_claim(self, now: float) -> None:
        """Write the outcomes waiting and, with them or alone, claim for the free threads."""
        state = self._state
        self._gathering_until = None
        if now >= self._next_poll:
            self._want_claim = True
            self._next_poll = now + self.settings.poll_interval
        while True:
            limit = 0
            claimable = not self._suspects.holding and not (
                self._special and state.claims_in_flight
            )
            if claimable and (self._want_claim or state.outcomes or self._backlog):
                prefetch = self._pace.prefetch(now)
                self._low_water = max(self.concurrency, prefetch // 2)
                limit = max(0, self.concurrency + prefetch - state.queued - state.reserved)
            if not state.outcomes and not limit:
                return
            if state.outcomes and self._gathering(now):
                self._gathering_until = self._flush_at
                return
            index = self._free_lane(now)
            if index is None or (index and not limit and len(state.outcomes) < FLUSH_SIZE):
                return  # a second lane only to claim: these outcomes go with the first's turn
            self._send_outcomes(index, limit)

    def _gathering(self, now: float) -> bool:
        """Whether the outcomes waiting now should wait for more, to go in one statement: for
        at most ``FLUSH_DELAY`` and ``FLUSH_SIZE``, while the threads have enough work."""
        state = self._state
        if self._flush_at is None:
            self._flush_at = now + FLUSH_DELAY
        return (
            now < self._flush_at
            and len(state.outcomes) < FLUSH_SIZE
            and state.queued - self.concurrency >= self._low_water
            and not self._renew_asked
        )

    def _send_outcomes(self, index: int, limit: int) -> None:
        batch = self._state.take_batch(limit)
        self._flush_at = None
        self._pace.count(len(batch))
        if limit:
            self._want_claim = False
        self._send(index, RecordAndClaim(self.settings, self.worker_id, batch, limit))

    def _on_recorded(self, request: RecordAndClaim, now: float) -> None:
        state = self._state
        state.written(request)
        if request.limit:
            self._backlog = len(request.rows) == request.limit
            self._next_poll = now + min(self.settings.poll_interval, request.retry_in)
            if (
                self.burst
                and not request.rows
                and not state.attempts
                and not state.reserved
                and not state.outcomes
                and request.retry_in == math.inf
            ):
                self._exiting = True
        if not request.rows:
            return
        metrics.JOBS_CLAIMED.inc(len(request.rows), queue=self.queue)
        new, suspects = state.admit(request.rows, self._own_worker_ids, self._low_water)
        submit = self._handlers.submit
        for attempt in new:
            state.hold(attempt, QUEUED)
            submit(attempt)
        for attempt in suspects:  # each waits to run alone, one at a time
            if self._suspects.holding:
                attempt.state = LOST  # never this queue's to run: given back at once
                state.to_unclaim.append(attempt)
            else:
                state.hold(attempt, HELD)
                self._suspects.held, self._suspects.held_since = attempt, now

    def _late(self, attempt: Attempt, outcome: Outcome) -> None:
        """The handler of an attempt the coordinator no longer runs returned: after its
        timeout (its thread is free again, and the replacement started meanwhile can go), or
        after the grace period gave it back. Its outcome is not written."""
        if attempt.state == TIMED_OUT:
            del self._state.abandoned[attempt.key]
            self._handlers.retire_thread()
            outcome_writes.stale(self.queue, outcome, "it came after the attempt's timeout")

    # -- leases, lost attempts, health ---------------------------------------------------------

    def _renew(self, now: float) -> None:
        index = self._free_lane(now)
        if index is None:
            return
        asked, self._renew_asked = self._renew_asked, []
        self._check_cancel = False
        self._renewing = True
        self._next_renewal = now + self.lease_seconds * RENEW_FRACTION
        keys = self._state.renewable()
        self._send(index, Renew(keys, self.lease_seconds, self.worker_id, asked))

    def _on_lost(self, attempt: Attempt | None, thread_died: bool) -> None:
        """The last resort, for an attempt left without an outcome: stop renewing its lease,
        so that it expires and recovery takes it; free its slot; replace a dead thread."""
        abandoned = False
        if attempt is not None:
            abandoned = attempt.state == TIMED_OUT
            if abandoned:
                del self._state.abandoned[attempt.key]
            else:
                self._state.forget(attempt)
            logger.error(
                "job %s attempt %d: its handler thread %s without an outcome; its lease is "
                "no longer renewed and will expire",
                attempt.id,
                attempt.attempt,
                "died" if thread_died else "returned",
                extra={"job_id": str(attempt.id), "queue": self.queue, "outcome": "lost"},
            )
        if thread_died and not abandoned:
            logger.error("queue %s: a handler thread died; starting another", self.queue)
            self._handlers.add_thread()
        elif abandoned and not thread_died:
            self._handlers.retire_thread()  # its replacement can go, as in ``_late``

    def _unclaim(self, now: float) -> None:
        index = self._free_lane(now)
        if index is None:
            return
        given, self._state.to_unclaim = self._state.to_unclaim, []
        reason = "shutdown" if self._stopping else "suspects"
        keys = [attempt.key for attempt in given]
        self._send(index, GiveBack("UNCLAIM_JOBS", keys, self.worker_id, reason))

    def _publish_health(self, now: float, stuck: bool) -> None:
        """Tell this worker's heartbeat row whether the queue is stuck: every handler thread
        held by an attempt that outlived its timeout."""
        if not self._send_maintenance(now, PublishHealth(self.worker_id, self.queue, stuck)):
            return
        self._published_stuck = stuck
        if stuck:
            logger.error(
                "queue %s: all %d handler threads are held by attempts that outlived their "
                "timeout; reported unhealthy until they return",
                self.queue,
                self.concurrency,
                extra={"queue": self.queue},
            )

    def _start_alone(self, now: float) -> None:
        """The suspect held: see ``suspects``."""
        suspects, state = self._suspects, self._state
        attempt = suspects.held
        step = suspects.next_step(state, now, self.lease_seconds)
        if attempt is None or step is None:
            return
        if step == SUBMIT:
            attempt.state = QUEUED
            self._handlers.submit(attempt)
        elif step == GIVE_BACK:
            state.forget(attempt)
            state.to_unclaim.append(attempt)
        elif (index := self._free_lane(now)) is not None:
            suspects.marking = True
            self._send(index, MarkAlone(attempt.key, self.worker_id))

    # -- stopping ------------------------------------------------------------------------------

    def _stop_turn(self, now: float) -> None:
        """Give back the jobs no thread started, write the outcomes, and end once the running
        attempts have finished, or release them when the grace period is over."""
        state = self._state
        if self._stop_deadline is None:
            self._stop_deadline = now + self.grace_period
        if state.claims_in_flight or self._suspects.marking:
            return  # a claim in flight lands before the waiting jobs are given back
        if not self._gave_back_waiting:
            self._gave_back_waiting = True
            waiting = self._handlers.take_waiting()
            if self._suspects.held is not None:
                waiting.append(self._suspects.held)
                self._suspects.held = None
            for attempt in waiting:
                state.forget(attempt)
            state.to_unclaim += waiting
            if state.to_unclaim:
                self._unclaim(now)
        if state.outcomes and (index := self._free_lane(now)) is not None:
            self._send_outcomes(index, 0)
        if now >= self._stop_deadline and not self._released:
            unfinished = [a for a in state.attempts.values() if a.state == QUEUED]
            index = self._free_lane(now) if unfinished else None
            if not unfinished or index is not None:
                self._released = True
            if unfinished and index is not None:
                for attempt in unfinished:
                    state.forget(attempt)
                keys = [attempt.key for attempt in unfinished]
                self._send(index, GiveBack("RELEASE_JOBS", keys, self.worker_id, "grace"))
        if not (state.attempts or state.outcomes or state.to_unclaim or any(self._in_flight)):
            self._done = True

    def _snapshot(self) -> RunnerSnapshot:
        state = self._state
        return RunnerSnapshot(
            running=len(state.attempts),
            outcomes_waiting=len(state.outcomes),
            writing=state.writing,
            reserved=state.reserved,
            abandoned=len(state.abandoned),
            suspect_held=self._suspects.held is not None,
            suspect_alone=self._suspects.alone is not None,
            lane_turns=tuple(self._turns),
            lanes_open=tuple(self._lanes_open),
            ended=self._done,
        )
