"""Suspects: jobs lost with their worker twice in a row, each run alone in its process.

A suspect may have killed its process, or a neighbour may have. It is held back when claimed,
starts once nothing else of its queue runs here and the process's ``AloneGate`` is its queue's,
and for a lease period nothing else starts beside it: a crash then is its own (MARK_ALONE wrote
that this attempt counts) and costs the others nothing. Should the attempts beside it not end
within a lease period, it is given back unstarted, its attempt with it. Suspects claimed while
one is held are given back at once, for another worker to run alone meanwhile.
"""

from __future__ import annotations

import logging
import queue as queue_module
from collections.abc import Callable

from django_pgoutbox.worker.attempt import QUEUED, Attempt, Key
from django_pgoutbox.worker.state import QueueState

logger = logging.getLogger("django_pgoutbox.worker")

# What ``Suspects.next_step`` says to do with the suspect held.
SUBMIT = "submit"
GIVE_BACK = "give back"
MARK = "mark"


class AloneGate:
    """The one token of a worker process that lets a suspect run alone, passed from queue to
    queue: at most one queue holds it, and the holder alone owns it until it gives it back.

    The queues of one process share one gate, so that two suspects never run marked at once
    there (a crash would then count against both). The wake-ups are registered when the
    queues are made, before any thread runs, and only read afterwards.
    """

    def __init__(self) -> None:
        self._token: queue_module.SimpleQueue[bool] = queue_module.SimpleQueue()
        self._token.put(True)
        self._wakes: list[Callable[[], None]] = []

    def register(self, wake: Callable[[], None]) -> None:
        self._wakes.append(wake)

    def take(self) -> bool:
        """Take the token if it is free; False when another queue holds it."""
        try:
            return self._token.get_nowait()
        except queue_module.Empty:
            return False

    def give_back(self) -> None:
        self._token.put(True)
        for wake in self._wakes:  # a queue may have a suspect waiting for it
            wake()


class Suspects:
    """A queue's suspects, as its coordinator sees them (the coordinator's own state)."""

    def __init__(self, gate: AloneGate) -> None:
        self.gate = gate
        #: The suspect claimed and held back (one at most), and since when it waits.
        self.held: Attempt | None = None
        self.held_since = 0.0
        #: MARK_ALONE of the held suspect is in flight.
        self.marking = False
        #: The suspect started alone, until it ends or ``alone_until`` (monotonic) passes.
        self.alone: Attempt | None = None
        self.alone_until = 0.0
        #: This queue holds the gate's token.
        self.has_token = False

    @property
    def holding(self) -> bool:
        """A suspect waits to run alone, or runs alone: the queue claims nothing meanwhile."""
        return self.held is not None or self.alone is not None

    def take_token(self) -> bool:
        if not self.has_token:
            self.has_token = self.gate.take()
        return self.has_token

    def give_token_back(self) -> None:
        if self.has_token:
            self.has_token = False
            self.gate.give_back()

    # -- the held suspect's turn -----------------------------------------------------------------

    def next_step(
        self, state: QueueState, now: float, lease_seconds: float, can_send: bool
    ) -> str | None:
        """What to do now with the suspect held (the caller does it): ``SUBMIT`` it (it was
        cancelled: it ends at once, without its handler), ``GIVE_BACK`` (the attempts beside
        it did not end within a lease period), ``MARK`` (nothing else runs and the gate is
        this queue's: send MARK_ALONE on the free lane, ``can_send``, then start it), or None
        (wait)."""
        attempt = self.held
        if attempt is None or self.marking:
            return None
        if attempt.cancel.is_set():
            self.held = None
            return SUBMIT
        busy = state.busy_beside(attempt)
        if busy and now < self.held_since + lease_seconds:
            return None  # the coordinator looks again when an attempt ends, or at that deadline
        if busy:
            self.held = None
            logger.warning(
                "job %s attempt %d: a suspect, given back unstarted: %d other attempt(s) did "
                "not end within %gs for it to run alone",
                attempt.id,
                attempt.attempt,
                busy,
                lease_seconds,
                extra={"job_id": str(attempt.id), "queue": state.queue},
            )
            return GIVE_BACK
        if not can_send:
            return None  # no lane free for MARK_ALONE: the token is not taken until one is
        if not self.take_token():
            return None  # another queue's suspect runs alone; its queue wakes this one after
        return MARK

    def turn(
        self,
        state: QueueState,
        now: float,
        lease_seconds: float,
        *,
        can_send: bool,
        submit: Callable[[Attempt], None],
        mark: Callable[[Key], bool],
    ) -> None:
        """The held suspect's turn: do what ``next_step`` says. ``submit`` hands an attempt to
        the handler threads; ``mark`` sends MARK_ALONE of a key (False: no lane was free)."""
        attempt = self.held
        step = self.next_step(state, now, lease_seconds, can_send)
        if attempt is None or step is None:
            return
        if step == SUBMIT:
            attempt.state = QUEUED
            submit(attempt)
        elif step == GIVE_BACK:
            state.forget(attempt)
            state.to_unclaim.append(attempt)
        elif mark(attempt.key):
            self.marking = True

    def answered(
        self,
        key: Key,
        held: bool,
        now: float,
        lease_seconds: float,
        *,
        stopping: bool,
        state: QueueState,
        submit: Callable[[Attempt], None],
    ) -> None:
        """MARK_ALONE of ``key`` came back (``held``: the lease was still this worker's): the
        suspect it marked starts, or is forgotten."""
        attempt = self.held
        if attempt is None or attempt.key != key or stopping:
            self.not_marked()  # stopping: the suspect held is given back unstarted
        elif self.marked(attempt, held, now, lease_seconds):
            attempt.state = QUEUED
            submit(attempt)
        else:
            state.forget(attempt)

    def marked(self, attempt: Attempt, held: bool, now: float, lease_seconds: float) -> bool:
        """MARK_ALONE of the suspect held came back: whether it starts (its lease was still
        this worker's), alone until it ends or a lease period passes."""
        self.marking = False
        self.held = None
        fields = {"job_id": str(attempt.id), "queue": attempt.row.queue}
        if not held:
            self.give_token_back()
            logger.warning(
                "job %s attempt %d: lease lost before it started; not run",
                attempt.id,
                attempt.attempt,
                extra=fields,
            )
            return False
        self.alone, self.alone_until = attempt, now + lease_seconds
        logger.warning(
            "job %s attempt %d: lost with its worker twice in a row; it runs alone",
            attempt.id,
            attempt.attempt,
            extra=fields,
        )
        return True

    def not_marked(self) -> None:
        """MARK_ALONE failed, or came back once the queue stops: the suspect held does not
        start now, and the process's token goes back (taken again at the next MARK_ALONE), for
        another queue's suspect rather than kept until this queue's loop ends."""
        self.marking = False
        if self.alone is None:
            self.give_token_back()

    def end_alone(self, now: float) -> None:
        """The suspect running alone ended, or its lease period is over: claims resume, and
        the process's gate goes to the next queue with a suspect."""
        alone = self.alone
        if alone is None or (alone.state == QUEUED and now < self.alone_until):
            return
        self.alone = None
        self.give_token_back()
