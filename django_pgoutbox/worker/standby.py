"""An idle queue's claim, held ready on its first lane, so that a wake-up sends it at once.

On an idle queue a wake-up would cross four threads before a handler starts: the listener posts
it to the coordinator, the coordinator hands a claim to a lane, the lane posts the rows back,
the coordinator hands them to the handler threads. Each crossing costs a thread's wake-up
(about 80 µs here), and the two in the middle are the price of one owner per queue. So while
its queue is idle, the coordinator leaves a claim on its first lane (it *arms* it). A wake-up
(``QueueRunner.wake``) still posts to the coordinator, and it also *fires* the lane: the lane
sends the claim at once, posts the reply, then hands the attempts it claimed to the handler
threads itself. Two crossings, as when a dispatcher thread claimed for itself.

The coordinator still owns every attempt. The reply reaches its mailbox before any message of
the handlers that run them (the lane posts it first), and it holds them as it holds any claim's;
a suspect among them is not started by the lane but held back by the coordinator, as ever. It
fires the lane itself when its poll interval passes, and to use the lane for anything else
(recovery, a health report, the stop) it *disarms* it first: the lane answers, unfired.

Wake-ups are numbered. The lane says which wake-up fired it; a wake-up posted before that one
was answered by the claim (the job it announced had committed before the claim began), so the
coordinator does not claim again for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.claims import Claims, RecordAndClaim
from django_pgoutbox.worker.lanes import Lanes, hand_off
from django_pgoutbox.worker.state import QueueState


@dataclass(eq=False)
class Standby:
    """A claim left on a lane until a wake-up fires it (``standing``: the lane holds it)."""

    claim: RecordAndClaim
    #: The claim's worker_ids text when this worker ran every attempt, and its value.
    own: tuple[str, tuple[str, ...]]
    low_water: int
    #: The handler threads' ``submit``.
    submit: Callable[[Attempt], None]
    standing: bool = True
    #: The lane starts the attempts it claimed; not if the worker stopped before the claim
    #: came back (``Lane._stopped``): the coordinator then gives them back.
    starts: bool = True
    # -- filled in on the lane, read by the coordinator once it has the reply ------------------
    fired: bool = False
    #: The number of the wake-up that fired it: every wake-up up to it is answered.
    covers: float = 0.0
    #: An attempt for each row claimed, in order (the suspects too, which the lane does not
    #: start).
    attempts: list[Attempt] = field(default_factory=list)

    def fire(self, wake: float) -> None:
        self.fired, self.covers = True, wake

    def run(self, connection: psycopg.Connection[Any]) -> Standby:
        self.claim.run(connection)
        self.make_attempts()
        return self

    def make_attempts(self) -> None:
        """An attempt for each row the claim took (on the lane, as the coordinator would)."""
        own_text, own_ids = self.own
        low_water = self.low_water
        self.attempts = [
            Attempt(row, own_ids if row.worker_ids == own_text else None, low_water)
            for row in self.claim.rows
        ]

    def after_reply(self) -> None:
        """On the lane, once its reply is posted: start the attempts but the suspects."""
        if not self.starts:
            return
        started = False
        for attempt in self.attempts:
            if not attempt.row.suspect:
                self.submit(attempt)
                started = True
        hand_off(started)


class StandbyLane:
    """The claim the coordinator left on its first lane, as the coordinator sees it (its own)."""

    def __init__(
        self,
        lanes: Lanes,
        claims: Claims,
        state: QueueState,
        own: tuple[str, tuple[str, ...]],
        submit: Callable[[Attempt], None],
    ) -> None:
        self._lanes, self._claims, self._state, self._own, self._submit = (
            lanes,
            claims,
            state,
            own,
            submit,
        )
        self._lane = lanes.lanes[0]
        #: The lane's ``fire`` (posting to it is safe from any thread), or None for a lane that
        #: cannot hold a claim (the tests' fakes) and for a queue that claims one claim at a
        #: time (``FAIR`` or limited), which never leaves one on its lane.
        self.fire_lane: Callable[..., None] | None = (
            None if claims.one_at_a_time else getattr(self._lane, "fire", None)
        )
        #: The lane's ``stopping``, which ``QueueRunner.stop`` posts from its own thread so
        #: that no claim fired then or later (one in flight, or one the coordinator leaves on
        #: the lane before it takes the stop) starts its jobs.
        self.stop_lane: Callable[[], None] | None = getattr(self._lane, "stopping", None)
        #: The lane's ``disarm``, which ``QueueRunner.controls_changed`` posts from the
        #: listener's thread (a pause must reach the lane before the next wake-up's fire).
        self.disarm_lane: Callable[[], None] | None = (
            None if self.fire_lane is None else getattr(self._lane, "disarm", None)
        )
        self.armed: Standby | None = None
        self._asked = False  # the lane was asked to fire or to disarm since it was armed
        #: The last wake-up posted (by number), as the coordinator took it.
        self.woken = 0.0

    @property
    def waiting(self) -> bool:
        """The lane holds a claim not yet asked for: it can be fired, or disarmed to free the
        lane (a claim fired and not yet answered holds the lane like any statement in flight)."""
        return self.armed is not None and not self._asked

    def woke(self, message: tuple[Any, ...]) -> None:
        self.woken = max(self.woken, message[1] if len(message) > 1 else math.inf)

    def arm_if_idle(self, now: float, *, holding: bool) -> None:
        """Leave the next claim on the first lane if the queue is idle (``idle``)."""
        claims, state = self._claims, self._state
        ready = self.armed is None and self.fire_lane is not None
        if ready and idle(state, claims, self._lanes, holding=holding, now=now):
            claim = claims.standby(now, state)
            self.armed = Standby(claim, self._own, claims.low_water, self._submit)
            self._asked = False
            self._lanes.send(0, self.armed, now)

    def fire(self) -> None:
        """The coordinator wants a claim (its poll interval passed): send the one held."""
        if self.armed is not None and not self._asked and self.fire_lane is not None:
            self._asked = True
            self.fire_lane(self.woken)

    def disarm(self) -> None:
        """The coordinator needs the lane for something else: have it give the claim back."""
        if self.armed is not None and not self._asked:
            self._asked = True
            self._lane.disarm()

    def answered(self, standby: Standby) -> bool:
        """Whether the claim of ``standby``, fired, answered every wake-up taken so far."""
        return self.woken <= standby.covers


def idle(state: QueueState, claims: Claims, lanes: Lanes, *, holding: bool, now: float) -> bool:
    """Whether a queue waits for work with nothing else to do (``holding``: a suspect of its
    own waits or runs alone): its first lane may then hold the next claim."""
    return not (
        state.unsettled
        or state.to_unclaim
        or state.reserved
        or claims.wanted
        or claims.backlog
        or claims.one_at_a_time
        or holding
        or lanes.busy()
        or now < lanes.ready_at[0]
    )
