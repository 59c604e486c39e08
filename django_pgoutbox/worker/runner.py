"""One queue's coordinator: the one thread that owns the queue's state.

Its coordinator thread alone reads and writes the queue's state (the attempts claimed, their
deadlines, the claims in flight, the pace, the outcomes waiting, the suspects) and waits on one
mailbox (``mailbox``); every other thread only posts there. Handler threads (``handlers``) post
what started and finished; lanes (``lanes``), each a thread with its own connection, run the
statements it hands them and post the results; the listener, the supervisor and
``ctx.renew_lease()`` post wake-ups, the stop, cancellation checks and renewal requests.

Each turn it takes every message, then does what they and the clock call for: a suspect's run
alone, timeouts, renewals and cancellations, recovery once per poll interval, and the outcomes
written with the next claim in one statement (RECORD_AND_CLAIM), for the free threads plus a
prefetch that follows the queue's pace. While the queue is idle its first lane holds the next
claim, which a wake-up sends at once (``standby``). docs/internals.md draws the threads and
messages, and the life of one job.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_pgoutbox import metrics
from django_pgoutbox.conf import QueueSettings, RetrySettings
from django_pgoutbox.db import ErrorKind
from django_pgoutbox.errors import LeaseLost
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.registry import get_job
from django_pgoutbox.worker import deadlines, mailbox
from django_pgoutbox.worker.attempt import HELD, LOST, QUEUED, TIMED_OUT, Attempt, Key
from django_pgoutbox.worker.claims import FLUSH_SIZE, Claims, RecordAndClaim
from django_pgoutbox.worker.controls import Controls, ReadControl
from django_pgoutbox.worker.coroutines import Coroutines, runs_on_loop
from django_pgoutbox.worker.deadlines import STUCK_AFTER
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.handlers import AttemptRunner, Handlers, HandlerThreads
from django_pgoutbox.worker.lanes import Lane, Lanes, Request, hand_off, waited_out
from django_pgoutbox.worker.leases import (
    GiveBack,
    MarkAlone,
    PublishHealth,
    Recover,
    Renew,
    RenewalRequest,
    Upkeep,
)
from django_pgoutbox.worker.mailbox import Mailbox, Message
from django_pgoutbox.worker.progress import Reporting, WriteProgress
from django_pgoutbox.worker.standby import Standby, StandbyLane
from django_pgoutbox.worker.state import QueueState, RunnerSnapshot
from django_pgoutbox.worker.suspects import AloneGate, Suspects
from django_pgoutbox.worker.timeouts import timed_out

__all__ = ["AloneGate", "QueueRunner", "RunnerSnapshot"]
logger = logging.getLogger("django_pgoutbox.worker")


def _on_event_loop() -> bool:
    """Whether this thread runs an event loop (``ctx.renew_lease()`` called in a coroutine)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
        control: Control | None = None,
    ) -> None:
        """``clock``, ``lane`` and ``handlers`` are for tests that drive the coordinator with
        fakes (``step()``): what makes a lane from its index, and the handler threads.
        ``control``: the queue's row of ``queue_controls`` if already read (else the first turn
        reads it, and nothing is claimed before)."""
        self.queue = settings.name
        self.worker_id = worker_id
        self.using = using
        self.policy = policy
        self.concurrency = concurrency or settings.concurrency
        self._controls = Controls(settings, self.concurrency)
        if control is not None:
            settings, self.concurrency = self._controls.preset(control)
        self.settings = settings
        self.burst = burst
        self.grace_period = grace_period
        self.lease_seconds = settings.lease_seconds
        self._clock = clock
        self._mailbox = Mailbox()
        self._started = threading.Event()
        self.finished = threading.Event()
        # -- the coordinator's own (its thread alone touches these) -------------------------------
        now = clock()
        self._state = QueueState(self.queue)
        #: The coroutine slots the claims count beside the threads: the queue's
        #: ASYNC_CONCURRENCY from its first attempt of an ``async def`` handler on.
        self._async_slots = 0
        #: Job type -> whether its attempts run on the event loop (``_on_loop``).
        self._loop_types: dict[str, bool] = {}
        self._claims = Claims(settings, self.concurrency, worker_id, now)
        self._upkeep = Upkeep(settings, worker_id, now)
        self._reporting = Reporting(worker_id)
        self._suspects = Suspects(gate or AloneGate())
        self._suspects.gate.register(self.wake)
        self._stopping = self._gave_back_waiting = self._released = self._done = False
        self._stop_deadline: float | None = None
        #: A burst found nothing more; a statement failed past the grace period (both: end once
        #: the lanes are idle); the statements in flight past it were cancelled.
        self._exiting = self._giving_up = self._cancelled = False
        #: A claim's worker_ids text when this worker ran every attempt (the first, usually),
        #: and the value it stands for.
        self._own_worker_ids = (json.dumps([worker_id]), (worker_id,))
        # -- the lanes and the handler threads ---------------------------------------------------
        count = 2 if self._claims.one_at_a_time else settings.connections
        make_lane = self._new_lane = lane or self._make_lane
        self._lanes = Lanes([make_lane(index, self._mailbox) for index in range(count)], now)
        run = AttemptRunner(
            queue=self.queue, policy=policy, using=using, mailbox=self._mailbox, renew=self.renew
        )
        if handlers is None:
            self._handlers: Handlers = HandlerThreads(
                self.concurrency, f"pgoutbox-{self.queue}", run, self._mailbox
            )
        else:
            self._handlers = handlers(self.concurrency, self._mailbox, run)
        #: The queue's event loop, for the attempts of ``async def`` handlers (``coroutines``).
        self._coroutines = Coroutines(
            self.queue, settings.async_concurrency, run.run_async, self._mailbox, self.lease_seconds
        )
        #: The claim left on the first lane while the queue is idle (``standby``).
        self._standby = StandbyLane(
            self._lanes, self._claims, self._state, self._own_worker_ids, self._lane_submit
        )
        self._wakes = itertools.count(1)  # numbers the wake-ups, from any thread

    def _make_lane(self, index: int, mailbox: Mailbox) -> Lane:
        return Lane(index, self.using, mailbox, f"pgoutbox-dispatch-{self.queue}-{index}")

    # -- called from other threads: each posts a message ---------------------------------------

    def wake(self) -> None:
        """New work may exist (a notification, a reconnect): claim now instead of at the poll;
        on an idle queue, the claim its first lane holds goes at once (``standby``)."""
        wake, fire = next(self._wakes), self._standby.fire_lane
        if fire is not None:  # first: the lane's claim is the wake-up's latency
            fire(wake, unless_crowded=True)  # left out while the lane is busy: this WAKE fires it
        self._mailbox.post((mailbox.WAKE, wake))

    def stop(self) -> None:
        """Stop claiming; let running attempts finish within the grace period. A claim fired
        from the first lane and in flight is told first: its jobs are given back, not started."""
        if (stop_lane := self._standby.stop_lane) is not None:
            stop_lane()
        self._mailbox.post((mailbox.STOP,))

    def controls_changed(self) -> None:
        """The queue was paused, resumed or resized (a notification): read its row now. The
        claim the first lane holds is disarmed first, from this thread: a job's notification
        that follows (the listener's next) would else fire it before the coordinator knows."""
        if (disarm_lane := self._standby.disarm_lane) is not None:
            disarm_lane()
        self._mailbox.post((mailbox.CONTROL,))

    def check_cancellations(self) -> None:
        """A running job of this queue was asked to stop: look at the running jobs now."""
        self._mailbox.post((mailbox.CANCELS,))

    def renew(self, key: Key) -> None:
        """Renew one attempt's lease now (``ctx.renew_lease()``); raise ``LeaseLost`` if gone."""
        request = RenewalRequest(key, threading.Event())
        self._mailbox.post((mailbox.RENEW, request))
        wait = self.lease_seconds
        if _on_event_loop():  # a coroutine's: its loop must not go unheard while it waits
            wait = min(wait, self._coroutines.stall_after / 2)
        if not request.done.wait(timeout=wait):
            raise TimeoutError(f"the lease of job {key[0]} could not be renewed in time")
        if not request.held:
            raise LeaseLost(f"the lease of job {key[0]} was lost; its outcome will be discarded")

    def snapshot(self) -> RunnerSnapshot:
        """The coordinator's state now: asked of its thread while it runs, read directly before
        it starts and after it ended."""
        while self._started.is_set() and not self.finished.is_set():
            reply: dict[str, Any] = {"done": threading.Event()}
            self._mailbox.post((mailbox.SNAPSHOT, reply))
            if reply["done"].wait(1.0):
                snapshot: RunnerSnapshot = reply["snapshot"]
                return snapshot
        return self._snapshot()

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """The coordinator's loop; returns when stopped (or, in burst mode, when nothing is due)."""
        self._started.set()
        try:
            self._lanes.start()
            self._handlers.start()
            while not self._done:
                timeout = max(0.0, self._next_deadline() - self._clock())
                quiet = not self._state.outcomes  # while outcomes wait, sleep through more
                self._handle(self._mailbox.wait(timeout, quiet=quiet), self._clock())
        finally:
            self._suspects.give_token_back()
            self._lanes.stop(timeout=1.0)
            self._handlers.shutdown()
            self._coroutines.shutdown()
            connections[self.using].close()
            self.finished.set()

    def step(self) -> None:
        """One turn without waiting: the messages posted so far, then what they call for. Tests
        drive a coordinator made with fake lanes and handler threads through this."""
        self._handle(self._mailbox.take(), self._clock())

    def _handle(self, messages: list[Message], now: float) -> None:
        state, finished = self._state, mailbox.FINISHED
        for message in messages:
            kind = message[0]
            if kind is finished:
                if not state.finished(message[1], message[2]) and state.late(*message[1:]):
                    self._handlers.retire_thread()  # its timeout's replacement can go
            elif kind is mailbox.REPLY:
                self._on_reply(message, now)
            elif kind is mailbox.STARTED:
                state.started(message[1], message[2])
            elif kind is mailbox.WAKE:
                self._claims.woken()
                self._standby.woke(message)
            elif kind is mailbox.RENEW:
                self._upkeep.asked.append(message[1])
            elif kind is mailbox.CANCELS:
                self._upkeep.check_cancel = True
            elif kind is mailbox.CONTROL:
                self._controls.notified(now)
            elif kind is mailbox.LOST:
                replace = state.lost(message[1], message[2])
                if replace is not None:
                    (self._handlers.add_thread if replace else self._handlers.retire_thread)()
            elif kind is mailbox.PROGRESS:
                self._reporting.noted(message[1], state)
            elif kind is mailbox.STOP:
                self._stopping = True
            elif kind is mailbox.SNAPSHOT:
                message[1]["snapshot"] = self._snapshot()
                message[1]["done"].set()
            elif kind is mailbox.ENDED:
                self._coroutine_ended(message[1], message[2], message[3], now)
            elif kind is mailbox.BEAT:
                self._coroutines.heard_from(message[1], now)
            elif kind is mailbox.RETURNED:
                state.give_back(self._coroutines.returned(message[1], message[2]))
        self._turn(now)

    def _turn(self, now: float) -> None:
        state, suspects, upkeep = self._state, self._suspects, self._upkeep
        if suspects.alone is not None:
            suspects.end_alone(now)
        if suspects.held is not None and not self._stopping and not self._controls.claimable:
            if not suspects.marking:  # paused: it has not started, it goes back as the rest
                held, suspects.held = suspects.held, None
                state.give_back([held])
        elif suspects.held is not None and not self._stopping:
            suspects.turn(
                state,
                now,
                self.lease_seconds,
                can_send=self._free_lane(now) is not None,
                submit=self._submit,
                mark=lambda key: self._send_if_free(now, lambda: MarkAlone(key, self.worker_id)),
            )
        if state.timed:
            for attempt in state.expired(now):
                if self._coroutines.on_loop.get(attempt.slot) is attempt:
                    self._coroutines.cancel(attempt)  # its slot is free from now
                else:
                    self._handlers.add_thread()  # in place of the one its handler still holds
                outcome = self._reporting.last_values(attempt, timed_out(attempt, self.policy))
                state.timed_out(attempt, outcome)
        stuck = len(state.abandoned) >= self.concurrency
        if upkeep.health_due(stuck):
            self._send_if_free(now, lambda: upkeep.report(stuck))
        if state.to_unclaim:
            reason = "shutdown" if self._stopping else "suspects"
            self._give_back(now, "UNCLAIM_JOBS", reason if self._controls.claimable else "paused")
        # Renewals first, but not twice in a row ahead of the outcomes and claims: handlers
        # that call ``ctx.renew_lease()`` again as soon as answered would else hold the lane.
        # (``renewed_last`` holds until the next renewal is sent: a turn with no lane free, a
        # lane backing off, does not use the outcomes' turn up.)
        renew_first = not upkeep.renewed_last
        if renew_first:
            self._renew_if_due(now)
        if self._stopping:
            self._stop_turn(now)
        elif not self._exiting:
            # Not on the lane an overtaken full claim frees: that one is the seeks'.
            if self._controls.due():  # first: nothing is claimed before it is answered
                self._send_if_free(now, self._controls.read)
            if upkeep.recovery_due(now) and not self._claims.overtaking(now):
                self._send_if_free(now, lambda: upkeep.recover(now, self._controls.periodic()))
            self._record_and_claim(now)
        if not renew_first:
            self._renew_if_due(now)
        if self._reporting.due(now):
            self._write_progress(now)
        if self._coroutines.on_loop:
            self._leave_stalled_loop(now)
        self._coroutines.flush()
        if self._exiting and (state.outcomes or state.attempts):
            self._exiting = False  # a write failed meanwhile: its outcomes go first
        if self._exiting and not self._lanes.busy():
            self._done = True
        elif self.burst and self._controls.known and self._controls.control.paused:
            self._exiting = True  # a burst runs what is due: nothing is, in a paused queue
        elif not (self._stopping or self._exiting or self.burst):
            holding = self._suspects.holding or not self._controls.may_claim(now)
            self._standby.arm_if_idle(now, holding=holding)

    # -- coroutines ----------------------------------------------------------------------------

    def _submit(self, attempt: Attempt) -> None:
        """Start ``attempt``: on the event loop for an ``async def`` handler, else a thread."""
        if self._on_loop(attempt.row.job_type):
            self._submit_to_loop(attempt)
        else:
            self._handlers.submit(attempt)

    def _on_loop(self, job_type: str) -> bool:
        """``runs_on_loop``, remembered for the job types ``@job`` declares (a task's answer
        changes once its module is imported: asked each time)."""
        known = self._loop_types.get(job_type)
        if known is not None:
            return known
        on_loop = runs_on_loop(job_type)
        if get_job(job_type) is not None:
            self._loop_types[job_type] = on_loop
        return on_loop

    def _submit_to_loop(self, attempt: Attempt) -> None:
        if not self._async_slots:
            self._count_async_slots()
        self._coroutines.submit(attempt, self._clock())

    def _lane_submit(self, attempt: Attempt) -> None:
        """``_submit`` on the lane that fired the idle queue's claim (``standby``): the handler
        threads' queue takes an attempt from any thread; the event loop's attempts are the
        coordinator's to send (``_on_recorded``)."""
        if not runs_on_loop(attempt.row.job_type):
            self._handlers.submit(attempt)

    def _count_async_slots(self) -> None:
        """From now on the claims fill the coroutine slots too (docs/workers.md, "Capacity")."""
        self._async_slots = self._coroutines.capacity
        self._claims.concurrency = self.concurrency + self._async_slots
        self._claims.wanted = True

    def _coroutine_ended(
        self, loop: Any, attempt: Attempt, outcome: Outcome | None, now: float
    ) -> None:
        """A coroutine ended (``coroutines``): its outcome is written as a thread's is."""
        self._coroutines.ended(loop, attempt, now)
        if outcome is None:
            self._state.lost(attempt, False)
        elif not self._state.finished(attempt, outcome):
            self._state.late(attempt, outcome)

    def _leave_stalled_loop(self, now: float) -> None:
        """The event loop stopped answering: its attempts are no longer this queue's (their
        leases expire into recovery; one lost twice in a row runs alone, as a suspect)."""
        state = self._state
        for attempt in self._coroutines.stalled(now):
            if attempt.state == TIMED_OUT:
                state.abandoned.pop(attempt.slot, None)
            elif attempt.state in (QUEUED, HELD):
                state.forget(attempt)
                logger.error(
                    "job %s attempt %d: its coroutine was on an event loop that stopped "
                    "answering; its lease is no longer renewed and will expire",
                    attempt.id,
                    attempt.attempt,
                    extra={"job_id": str(attempt.id), "queue": self.queue, "outcome": "lost"},
                )

    def _renew_if_due(self, now: float) -> None:
        state, upkeep = self._state, self._upkeep
        if upkeep.renewal_due(now, bool(state.attempts)):
            self._send_if_free(now, lambda: upkeep.renew(now, state.renewable()))

    def _write_progress(self, now: float) -> None:
        """Write the progress and metadata set since the last write (``worker.progress``),
        after the outcomes and claims of this turn: the lane they left free, if any."""
        index = self._free_lane(now)
        if index is None:
            self._standby.disarm()
        elif (request := self._reporting.take(now)) is not None:
            self._lanes.send(index, request, now)

    def _next_deadline(self) -> float:
        """When to look again if no message comes first (``deadlines``)."""
        now = self._clock()
        return deadlines.next_deadline(
            now,
            self.settings.poll_interval,
            lane_free=self._free_lane(now) is not None or self._standby.waiting,
            ending=self._stopping or self._exiting,
            claims=self._claims,
            controls=self._controls,
            upkeep=self._upkeep,
            progress=self._reporting.deadline(),
            lanes=self._lanes,
            state=self._state,
            suspects=self._suspects,
            lease_seconds=self.lease_seconds,
            stop_deadline=self._stop_deadline,
            loop_deadline=self._coroutines.deadline(),
        )

    # -- lanes ---------------------------------------------------------------------------------

    def _free_lane(self, now: float) -> int | None:
        """The lane to send on now, if any: the first, else (for a backlog, beside a fair or
        limited queue's claim waiting on its lock, beside a full claim overtaken, while the
        first recovers leases, which a held horizon makes slow, or reads the queue's row, which
        a lock on ``queue_controls`` makes slow) another."""
        first, claims = self._lanes.in_flight[0], self._claims
        beyond = (
            claims.backlog
            or (claims.one_at_a_time and isinstance(first, RecordAndClaim))
            or claims.overtaking(now)
            or self._lanes.first_held_up(now)
        )
        return self._lanes.free(now, beyond_first=beyond)

    def _send_if_free(self, now: float, make: Callable[[], Request]) -> bool:
        """Send the request ``make`` makes, if a lane is free now (else a later turn will)."""
        index = self._free_lane(now)
        if index is None:
            self._standby.disarm()
            return False
        self._lanes.send(index, make(), now)
        return True

    def _on_reply(self, message: Message, now: float) -> None:
        """A lane's ``(REPLY, index, request, result, error, connection open)``."""
        _, index, request, result, error, opened = message
        unsent = isinstance(request, Standby) and not request.fired
        pause = self._lanes.replied(
            index, opened, failed=error is not None, now=now, sent=not unsent
        )
        made, overtaken = None, False
        if isinstance(request, Standby):
            made, request, self._standby.armed = request, request.claim, None
            if not made.fired:  # disarmed: the claim was never sent
                self._state.not_written(request)
                return
        if isinstance(request, RecordAndClaim):
            overtaken = self._claims.answered(request)
        if isinstance(request, Renew | Recover | PublishHealth):
            self._upkeep.replied(request, failed=error is not None, now=now)
            if isinstance(request, Renew):
                self._state.renewal_answered()
                # The outcomes it held back go before the next renewal, even after a failure
                # (which sends the renewal again first): else a renewal that keeps failing
                # holds them back again every time, and their jobs never get written.
                if self._state.outcomes:
                    self._upkeep.renewed_last = True
        elif isinstance(request, GiveBack):
            request.answered(self.queue, result, error)
        elif isinstance(request, WriteProgress):
            self._reporting.answered(request, failed=error is not None)
        if isinstance(request, ReadControl):
            self._read_control(result if error is None else None, now, request.covers)
        elif isinstance(request, Recover) and request.control is not None:
            read = request.read if error is None else None
            self._read_control(read, now, request.control.covers)
        if error is not None:
            self._on_error(index, request, error, pause, now)
        elif isinstance(request, RecordAndClaim):
            self._on_recorded(request, now, made, overtaken=overtaken)
        elif isinstance(request, Renew):
            self._state.renewed(request, result)
        elif isinstance(request, MarkAlone):
            self._suspects.answered(
                request.key,
                result,
                now,
                self.lease_seconds,
                stopping=self._stopping or not self._controls.claimable,
                state=self._state,
                submit=self._submit,
            )

    def _on_error(
        self, index: int, request: Request, error: BaseException, pause: float, now: float
    ) -> None:
        """A lane's statement failed (``lanes.waited_out``): its work is kept for later. A lost
        connection may have lost the listener's too, and with it a pause notified meanwhile:
        the queue's row is read again before its next claim."""
        if waited_out(self.queue, index, error, pause) is ErrorKind.CONNECTION:
            self._controls.doubted(now)
        if self._stopping and self._stop_deadline is not None and now >= self._stop_deadline:
            self._giving_up = True  # the grace period is over: what is left, leases recover
        if isinstance(request, RecordAndClaim):
            self._state.not_written(request)
            # What asked for the claim (a notification, a backlog) will not ask again.
            self._claims.wanted = self._claims.wanted or bool(request.limit)
        elif isinstance(request, MarkAlone):
            self._suspects.not_marked()

    # -- outcomes and claims -------------------------------------------------------------------

    def _record_and_claim(self, now: float) -> None:
        """Write the outcomes waiting and, with them or alone, claim for the free threads."""
        state, claims = self._state, self._claims
        claims.poll(now)
        may_claim = self._controls.may_claim(now)
        if self._standby.armed is not None:  # the first lane holds the claim: fired if wanted
            if claims.wanted and may_claim:
                self._standby.fire()
            return
        claimable = not self._suspects.holding and may_claim
        hurry = bool(self._upkeep.asked)  # a handler waits on a renewal: no gathering
        while sending := claims.next(now, state, claimable=claimable, hurry=hurry):
            outcomes, limit = sending
            index = self._free_lane(now)
            if index is None or (index and not limit and len(outcomes) < FLUSH_SIZE):
                return  # a second lane only to claim: these outcomes go with the first's turn
            idle = not state.attempts
            self._lanes.send(index, claims.take(state, limit, now), now)
            hand_off(idle)

    def _on_recorded(
        self, request: RecordAndClaim, now: float, made: Standby | None, *, overtaken: bool
    ) -> None:
        state = self._state
        state.written(request)
        self._claims.recorded(request, now, overtaken=overtaken)
        if made is not None and self._standby.answered(made):
            self._claims.wanted = False  # every wake-up so far was answered by this claim
        if self.burst and self._claims.nothing_due(request):
            self._exiting = not (state.unsettled or state.reserved)
        if not request.rows:
            return
        metrics.JOBS_CLAIMED.inc(len(request.rows), queue=self.queue)
        low_water = self._claims.low_water
        new, suspects = state.admit(
            request.rows, self._own_worker_ids, low_water, made.attempts if made else None
        )
        if made is not None and made.starts:  # its lane starts them: held as any claim's
            left = []  # those of async def handlers: the lane left them to this thread
            for attempt in new:
                state.hold(attempt, QUEUED)
                if runs_on_loop(attempt.row.job_type):
                    left.append(attempt)
            if not self._stopping:
                for attempt in left:
                    self._submit(attempt)
            new = self._handlers.take_waiting() + left if self._stopping else []
            for attempt in new:  # stopping: those no thread started yet go back
                state.forget(attempt)
        if self._stopping or not self._controls.claimable:
            # A claim in flight at the stop or the pause: given back, never started.
            for attempt in new + suspects:
                attempt.state = LOST
            state.to_unclaim += new + suspects
            return
        submit, idle = self._handlers.submit, not state.attempts
        loop_types, on_loop = self._loop_types, self._on_loop
        for attempt in new:
            state.hold(attempt, QUEUED)
            # The job type's answer inline (a dictionary's): this runs once a job claimed.
            job_type = attempt.row.job_type
            if loop_types.get(job_type, None) is False or not on_loop(job_type):
                submit(attempt)
            else:
                self._submit_to_loop(attempt)
        hand_off(idle and bool(new))
        for attempt in suspects:  # each waits to run alone, one at a time
            if self._suspects.holding:
                attempt.state = LOST  # never this queue's to run: given back at once
                state.to_unclaim.append(attempt)
            else:
                state.hold(attempt, HELD)
                self._suspects.held, self._suspects.held_since = attempt, now

    def _read_control(self, control: Control | None, now: float, covers: int) -> None:
        """The queue's row was read (``controls``; None: the read failed) by the read sent when
        ``covers`` notifications were taken: pause, resume, resize."""
        if control is None:
            self._controls.failed(covers)
            return
        change = self._controls.answered(control, self.settings, self.concurrency, covers)
        if change.settings is not None:
            self.settings = change.settings
            self._claims.configure(change.settings)
            self._standby.disarm()  # its claim was made with the settings before
            if self._claims.one_at_a_time and len(self._lanes.lanes) < 2:
                self._lanes.add(self._new_lane(len(self._lanes.lanes), self._mailbox), now)
        for _ in range(abs(change.threads)):
            (self._handlers.add_thread if change.threads > 0 else self._handlers.retire_thread)()
        if change.threads:
            self.concurrency += change.threads
            self._claims.concurrency = self.concurrency + self._async_slots
            self._claims.wanted = True  # work for the threads added now, not at the poll
        if change.paused:  # what no thread started yet goes back (the held suspect: ``_turn``)
            self._standby.disarm()
            self._state.give_back(self._handlers.take_waiting() + self._coroutines.take_waiting())
        elif change.paused is False:
            self._claims.wanted = True

    # -- giving back, health, suspects ---------------------------------------------------------

    def _give_back(self, now: float, statement: str, reason: str) -> None:
        """UNCLAIM_JOBS of the attempts to give back unstarted, or RELEASE_JOBS of unfinished
        ones (those given: ``reason`` "grace")."""
        state = self._state
        if reason == "grace":
            given = [attempt for attempt in state.attempts.values() if attempt.state == QUEUED]
        else:
            given = state.to_unclaim
        # Not beside a renewal of the same rows (see ``QueueState.renewing``): after it.
        renewing = state.renewing
        held = bool(renewing) and any(attempt.slot in renewing for attempt in given)
        index = self._free_lane(now) if given and not held else None
        if index is None:
            if given:
                self._standby.disarm()
            return
        for attempt in given:
            state.forget(attempt)
        if reason != "grace":
            state.to_unclaim = []
        keys = [attempt.key for attempt in given]
        self._lanes.send(index, GiveBack(statement, keys, self.worker_id, reason), now)

    # -- stopping ------------------------------------------------------------------------------

    def _stop_turn(self, now: float) -> None:
        """Give back the jobs no thread started, write the outcomes, and end once the running
        attempts have finished, or release them when the grace period is over."""
        state = self._state
        self._standby.disarm()
        if self._stop_deadline is None:
            self._stop_deadline = now + self.grace_period
        # A claim in flight (a fair one may wait long on the queue's lock) gives back what it
        # lands with; the held suspect goes once its MARK_ALONE, if in flight, came back.
        waiting = []
        if not self._gave_back_waiting:  # the event loop's come back later (RETURNED)
            waiting = self._handlers.take_waiting() + self._coroutines.take_waiting()
        self._gave_back_waiting = True
        if self._suspects.held is not None and not self._suspects.marking:
            waiting.append(self._suspects.held)
            self._suspects.held = None
        state.give_back(waiting)
        if state.to_unclaim:
            self._give_back(now, "UNCLAIM_JOBS", "shutdown")
        if state.outcomes and (index := self._free_lane(now)) is not None:
            self._lanes.send(index, self._claims.take(state, 0, now), now)
        if now >= self._stop_deadline and not self._released:
            before = len(state.attempts)
            self._give_back(now, "RELEASE_JOBS", "grace")
            unfinished = any(attempt.state == QUEUED for attempt in state.attempts.values())
            self._released = len(state.attempts) < before or not unfinished
        left = state.unsettled or state.to_unclaim
        if not self._lanes.busy() and (self._giving_up or not left):
            self._done = True
        elif now >= self._stop_deadline + STUCK_AFTER[0] and self._lanes.busy():
            # Past the grace period, a statement that does not return (a claim waiting on the
            # queue's lock, a server gone silent) is cancelled; still unanswered a while after,
            # it is left: the leases recover what it held.
            self._cancelled = self._cancelled or self._lanes.cancel(keep=GiveBack)
            self._done = now >= self._stop_deadline + STUCK_AFTER[1]

    def _snapshot(self) -> RunnerSnapshot:
        held, alone, lanes = self._suspects.held, self._suspects.alone, self._lanes
        snapshot = self._state.snapshot(held, alone, lanes.turns, lanes.open, self._done)
        if left := self._coroutines.left_behind():  # a blocked loop's thread, abandoned
            return dataclasses.replace(snapshot, abandoned=snapshot.abandoned + left)
        return snapshot
