"""A queue's claimed attempts, and the counts its claims are sized by.

One ``QueueState`` per queue, owned by the queue's coordinator thread: that thread alone writes
and reads every field (the handler threads and lanes only post messages, which the coordinator
applies here). Each attempt moves QUEUED (or HELD) -> FINISHED -> WRITING -> forgotten once its
outcome is written; or QUEUED -> TIMED_OUT (its timeout's outcome written in its place, its
handler's outcome stale if it ever comes); or -> LOST (left to its lease's expiry). An attempt
has one outcome at most, because only a QUEUED one can take one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker import outcomes as outcome_writes
from django_pgoutbox.worker.attempt import (
    FINISHED,
    HELD,
    LOST,
    QUEUED,
    TIMED_OUT,
    WRITING,
    Attempt,
    Key,
    slot,
)
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.leases import Renew

logger = logging.getLogger("django_pgoutbox.worker")


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
    #: Outcomes written since the queue started.
    written: int
    suspect_held: bool
    suspect_alone: bool
    #: Statements sent on each lane, and whether its connection is open.
    lane_turns: tuple[int, ...]
    lanes_open: tuple[bool, ...]
    #: The loop has ended (stopped, or a burst found nothing more).
    ended: bool


class QueueState:
    """The attempts a queue's coordinator holds, and what it has asked of its lanes."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        #: Attempts claimed and not yet written (nor forgotten), by ``Attempt.slot``.
        self.attempts: dict[tuple[int, int], Attempt] = {}
        #: Attempts QUEUED or HELD: holding a thread, or waiting for one.
        self.queued = 0
        #: Outcomes waiting to be written, in order (a timeout's goes first), and the attempt
        #: of each.
        self.outcomes: list[Outcome] = []
        self.ended: list[Attempt] = []
        #: Outcomes of attempts being written by a statement in flight, and their slots.
        self.writing = 0
        self.in_write: set[tuple[int, int]] = set()
        #: The slots of the renewal in flight (one at a time), and the outcomes of those
        #: attempts held back until it is answered. A renewal and an outcome write never touch
        #: one row at once: two statements that lock the same rows in orders of their own
        #: (their plans decide it) deadlock, and both wait a second for PostgreSQL to say so.
        self.renewing: set[tuple[int, int]] = set()
        self.held_back: list[tuple[Outcome, Attempt]] = []
        #: Jobs asked for by claims in flight, and how many claims are in flight.
        self.reserved = 0
        self.claims_in_flight = 0
        #: QUEUED attempts whose handler started with a timeout (thread isolation).
        self.timed: dict[tuple[int, int], Attempt] = {}
        #: Attempts failed for their timeout whose handler has not returned yet.
        self.abandoned: dict[tuple[int, int], Attempt] = {}
        #: Attempts to give back unstarted (UNCLAIM_JOBS) as soon as a lane is free.
        self.to_unclaim: list[Attempt] = []
        #: Outcomes written since the queue started (``runworkers --max-jobs``).
        self.written_total = 0

    # -- what the handler threads post -----------------------------------------------------------

    def finished(self, attempt: Attempt, outcome: Outcome) -> bool:
        """Take the outcome of a QUEUED attempt; False when it is not one (its timeout came
        first, or it was given back): that outcome is not written."""
        if attempt.state != QUEUED:
            return False
        attempt.state = FINISHED
        self.queued -= 1
        if attempt.slot in self.renewing:
            self.held_back.append((outcome, attempt))
        else:
            self.outcomes.append(outcome)
            self.ended.append(attempt)
        return True

    def late(self, attempt: Attempt, outcome: Outcome) -> bool:
        """The handler of an attempt this queue no longer runs returned: after its timeout, or
        after the grace period gave it back. Its outcome is not written. Returns whether the
        thread started in place of its own can go (after a timeout)."""
        if attempt.state != TIMED_OUT:
            return False
        del self.abandoned[attempt.slot]
        outcome_writes.stale(self.queue, outcome, "it came after the attempt's timeout")
        return True

    def lost(self, attempt: Attempt | None, thread_died: bool) -> bool | None:
        """The last resort, for an attempt its handler thread left without an outcome (None:
        the thread died between two): it is no longer renewed, so that its lease expires into
        recovery. Returns True to start a thread in place of a dead one, False to let one go
        (an abandoned attempt's replacement), None for neither."""
        abandoned = attempt is not None and attempt.state == TIMED_OUT
        if attempt is not None and attempt.state in (FINISHED, WRITING):
            attempt = None  # its thread died after it posted the outcome: that one stands
        if attempt is not None:
            if abandoned:
                del self.abandoned[attempt.slot]
            else:
                self.forget(attempt)
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
            return True
        if abandoned and not thread_died:
            return False
        return None

    def started(self, attempt: Attempt, deadline: float) -> None:
        if attempt.state == QUEUED:
            attempt.deadline = deadline
            self.timed[attempt.slot] = attempt

    def give_back(self, attempts: list[Attempt]) -> None:
        """``attempts``, claimed and not started, are no longer this queue's: they go back to
        their queue unstarted (UNCLAIM_JOBS), at the stop or a pause."""
        for attempt in attempts:
            self.forget(attempt)
        self.to_unclaim += attempts

    def forget(self, attempt: Attempt) -> None:
        """``attempt`` is no longer this queue's to run or renew."""
        key = attempt.slot
        if self.attempts.get(key) is attempt:
            del self.attempts[key]
            if attempt.state in (QUEUED, HELD):
                self.queued -= 1
        self.timed.pop(key, None)
        attempt.state = LOST

    def expired(self, now: float) -> list[Attempt]:
        """The QUEUED attempts past their deadline, now TIMED_OUT (their outcomes are the
        caller's to make); attempts that have an outcome already are dropped from ``timed``."""
        ended: list[Attempt] = []
        for key, attempt in list(self.timed.items()):
            if attempt.state != QUEUED:
                del self.timed[key]
                continue
            if attempt.deadline is None or now < attempt.deadline:
                continue
            del self.timed[key]
            del self.attempts[key]
            self.queued -= 1
            attempt.state = TIMED_OUT
            self.abandoned[key] = attempt
            ended.append(attempt)
        return ended

    def timed_out(self, attempt: Attempt, outcome: Outcome) -> None:
        """The outcome of an attempt failed for its timeout: written first."""
        if attempt.slot in self.renewing:
            self.held_back.insert(0, (outcome, attempt))
        else:
            self.outcomes.insert(0, outcome)
            self.ended.insert(0, attempt)

    # -- claims and outcome writes ---------------------------------------------------------------

    def admit(
        self,
        rows: list[ClaimRow],
        own: tuple[str, tuple[str, ...]],
        low_water: int,
        made: list[Attempt] | None = None,
    ) -> tuple[list[Attempt], list[Attempt]]:
        """Take the claimed ``rows``: the new attempts (QUEUED, or HELD for a suspect, which
        the caller may hold) and the suspects among them; ``made``: their attempts, made on
        the lane (``standby``). A row of an attempt still running here (its lease expired
        under it and this worker claimed it back) goes on as it is."""
        new: list[Attempt] = []
        suspects: list[Attempt] = []
        own_text, own_ids = own
        attempts = self.attempts
        for index, row in enumerate(rows):
            # A first attempt's worker_ids are this worker's id alone: no JSON to parse.
            attempt = (
                made[index]
                if made is not None
                else Attempt(row, own_ids if row.worker_ids == own_text else None, low_water)
            )
            running = attempts.get(attempt.slot)
            if running is not None:
                running.lease_lost = False
                logger.warning(
                    "job %s attempt %d: claimed again while its attempt still runs here; it "
                    "goes on under the new lease",
                    attempt.id,
                    attempt.attempt,
                    extra={"job_id": str(attempt.id), "queue": self.queue},
                )
                continue
            (suspects if row.suspect else new).append(attempt)
        return new, suspects

    def hold(self, attempt: Attempt, state: int) -> None:
        """Count ``attempt`` as this queue's, QUEUED or HELD."""
        attempt.state = state
        self.attempts[attempt.slot] = attempt
        self.queued += 1

    def take_batch(self, limit: int) -> tuple[list[Outcome], list[Attempt]]:
        """The outcomes waiting, now being written with a claim of ``limit`` jobs, and their
        attempts. Each attempt's state guards its batch: a handler's outcome goes only while
        its attempt is FINISHED (then WRITING), a timeout's once; a second outcome for one
        attempt, which the states make impossible, would be left out here and logged."""
        outcomes, ended = self.outcomes, self.ended
        self.outcomes, self.ended = [], []
        batch: list[Outcome] = []
        attempts: list[Attempt] = []
        for outcome, attempt in zip(outcomes, ended, strict=True):
            state = attempt.state
            if state == FINISHED and not outcome.timed_out:
                attempt.state = WRITING
            elif state != TIMED_OUT or not outcome.timed_out or attempt.deadline is None:
                outcome_writes.second_outcome(outcome, self.queue)
                continue
            else:
                attempt.deadline = None  # its timeout's outcome is on its way
            batch.append(outcome)
            attempts.append(attempt)
        self.in_write.update(attempt.slot for attempt in attempts)
        self.writing += sum(1 for outcome in batch if not outcome.timed_out)
        self.reserved += limit
        if limit:
            self.claims_in_flight += 1
        return batch, attempts

    def written(self, request: RecordAndClaim) -> None:
        """The statement of ``request`` went through: forget the attempts it wrote."""
        attempts, in_write = self.attempts, self.in_write
        for attempt in request.attempts:
            in_write.discard(attempt.slot)
            if attempt.state == WRITING:
                attempts.pop(attempt.slot, None)
        self.writing -= sum(1 for outcome in request.batch if not outcome.timed_out)
        self.written_total += len(request.written)
        outcome_writes.count_written(self.queue, request.written, request.applied)
        self.reserved -= request.limit
        if request.limit:
            self.claims_in_flight -= 1

    def not_written(self, request: RecordAndClaim) -> None:
        """The statement of ``request`` failed: its outcomes wait again (their leases still
        renewed), first; its claim took nothing."""
        for outcome, attempt in zip(request.batch, request.attempts, strict=True):
            self.in_write.discard(attempt.slot)
            if attempt.state == WRITING:
                attempt.state = FINISHED
            elif outcome.timed_out:
                attempt.deadline = 0.0  # its timeout's outcome is to be sent again
        self.writing -= sum(1 for outcome in request.batch if not outcome.timed_out)
        self.outcomes[:0] = request.batch
        self.ended[:0] = request.attempts
        self.reserved -= request.limit
        if request.limit:
            self.claims_in_flight -= 1

    # -- leases ------------------------------------------------------------------------------------

    @property
    def unsettled(self) -> bool:
        """Whether attempts are held or outcomes wait to be written (held back ones too)."""
        return bool(self.attempts or self.outcomes or self.held_back)

    def renewable(self) -> list[Key]:
        """The keys of a renewal sent now: every attempt held, but those whose outcome a
        statement in flight writes (it ends their leases); their outcomes, if they come before
        the renewal is answered, are held back till then (``finished``)."""
        in_write = self.in_write
        attempts = [
            attempt
            for attempt in self.attempts.values()
            if not attempt.lease_lost and attempt.slot not in in_write
        ]
        self.renewing = renewing = {attempt.slot for attempt in attempts}
        if self.outcomes:  # those waiting for a lane wait for the renewal too
            waiting = list(zip(self.outcomes, self.ended, strict=True))
            self.held_back += [(o, a) for o, a in waiting if a.slot in renewing]
            self.outcomes = [o for o, a in waiting if a.slot not in renewing]
            self.ended = [a for _, a in waiting if a.slot not in renewing]
        return [attempt.key for attempt in attempts]

    def renewal_answered(self) -> None:
        """The renewal in flight came back (or failed): the outcomes held back go first."""
        self.renewing = set()
        if self.held_back:
            self.outcomes[:0] = [outcome for outcome, _ in self.held_back]
            self.ended[:0] = [attempt for _, attempt in self.held_back]
            self.held_back = []

    def renewed(self, request: Renew, held: dict[Any, bool]) -> None:
        """Apply a renewal's result: the leases lost, the cancellations requested; answer the
        handlers that asked for it."""
        for key in request.keys:
            attempt = self.attempts.get(slot(key))
            if attempt is None:
                continue  # written meanwhile
            fields = {"job_id": str(attempt.id), "queue": self.queue}
            if attempt.id not in held:
                if attempt.state in (FINISHED, WRITING) or attempt.lease_lost:
                    continue  # if the lease was really lost, the outcome's write says so
                attempt.lease_lost = True
                logger.warning(
                    "job %s attempt %d: lease lost; its outcome will be discarded",
                    attempt.id,
                    attempt.attempt,
                    extra=fields,
                )
            elif held[attempt.id] and not attempt.cancel.is_set():
                attempt.cancel.set()
                logger.info(
                    "job %s attempt %d: cancellation requested; told the handler",
                    attempt.id,
                    attempt.attempt,
                    extra=fields,
                )
        for asked in request.asked:
            attempt = self.attempts.get(slot(asked.key))
            asked.held = attempt is not None and not attempt.lease_lost and asked.key[0] in held
            asked.done.set()

    def busy_beside(self, attempt: Attempt) -> int:
        """How many attempts run, wait or are being claimed here besides ``attempt``."""
        return self.queued - 1 + self.reserved + len(self.abandoned)

    def snapshot(
        self,
        held: Attempt | None,
        alone: Attempt | None,
        turns: list[int],
        lanes_open: list[bool],
        ended: bool,
    ) -> RunnerSnapshot:
        return RunnerSnapshot(
            running=len(self.attempts),
            outcomes_waiting=len(self.outcomes) + len(self.held_back),
            writing=self.writing,
            reserved=self.reserved,
            abandoned=len(self.abandoned),
            written=self.written_total,
            suspect_held=held is not None,
            suspect_alone=alone is not None,
            lane_turns=tuple(turns),
            lanes_open=tuple(lanes_open),
            ended=ended,
        )
