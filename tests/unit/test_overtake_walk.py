"""The random walk of test_hostile_core2 with slow statements: full claims that take longer
than OVERTAKE_AFTER (so that seeks overtake them), slow and failing lease recoveries, and a
coordinator that sleeps until its own deadline as its loop does. Besides the books, each turn
checks what the overtaking must keep: one full claim in flight at most, none tracked on a queue
that claims one at a time, what is held within twice a full claim's share, and after a seek
that came back short, a full claim still to come by the spacing."""

from __future__ import annotations

import itertools
import math
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from django_pgoutbox.worker.claims import OVERTAKE_AFTER, RecordAndClaim
from django_pgoutbox.worker.lanes import SLOW_FIRST
from django_pgoutbox.worker.leases import Recover
from tests.unit.fakes import claim_row
from tests.unit.test_hostile_core2 import SETTINGS, Walk, lost

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def claims_one_at_a_time(h: Any) -> bool:
    return bool(h.runner._claims.one_at_a_time)


class SlowWalk(Walk):
    def __init__(self, seed: int, **settings: Any) -> None:
        super().__init__(seed, **settings)
        self.settings = settings
        self.keys = itertools.count()
        #: A seek came back short, sent at this time, and no full claim sent since came back.
        self.short_sent: float | None = None
        self.recovery_failed = False  # the last recovery answered failed
        self.capped = False

    def answer_lane(self, index: int) -> None:
        h, rng = self.harness, self.rng
        lane = h.lanes[index]
        request = lane.sent[0]
        sent = getattr(request, "walk_sent", h.clock.now)  # when first seen in flight
        if isinstance(request, Recover):
            request.seconds = rng.choice([0.001, 0.05, SLOW_FIRST * 2, 3.0])
            self.recovery_failed = rng.random() < 0.2
            if self.recovery_failed:
                lane.reply(error=lost())
            else:
                lane.reply(None)
            return
        if not isinstance(request, RecordAndClaim):
            super().answer_lane(index)
            return
        if rng.random() < 0.15:
            lane.reply(error=lost())
            return
        request.seconds = rng.choice([0.002, 0.05, OVERTAKE_AFTER + 0.1])
        n = rng.randint(0, request.limit) if request.limit else 0
        if request.limit and claims_one_at_a_time(h) and rng.random() < 0.3:
            n, request.asked, request.retry_in = 0, 0, rng.choice([0.5, 50.0])  # the cap
        request.rows = [
            claim_row(suspect=rng.random() < 0.1)._replace(
                run_at=T0 + timedelta(seconds=next(self.keys)), id=uuid.uuid4()
            )
            for _ in range(n)
        ]
        for outcome in request.batch:
            key = (outcome.job.id, outcome.job.attempt)
            self.written[key] = self.written.get(key, 0) + 1
        asked = request.limit if request.asked is None else request.asked
        if request.limit:
            self.capped = not asked  # the queue's limit let no claim run: its retry decides
        if asked and request.mark is not None and n < asked:  # a short seek (not the cap)
            self.short_sent = sent if self.short_sent is None else self.short_sent
        elif asked and request.mark is None and sent >= (self.short_sent or math.inf):
            self.short_sent = None  # a full claim sent since the short seek looked behind
        lane.reply()

    def act(self) -> None:
        h, rng = self.harness, self.rng
        choice = rng.random()
        if choice < 0.15:
            # The coordinator's loop sleeps until its own deadline when no message comes.
            h.clock.now = max(h.clock.now, h.runner._next_deadline())
        elif choice < 0.2:
            h.clock.now += rng.choice([OVERTAKE_AFTER / 2, OVERTAKE_AFTER, SLOW_FIRST * 1.5])
        else:
            super().act()

    def check(self) -> None:
        super().check()
        h = self.harness
        runner, now = h.runner, h.clock.now
        claims_, state = runner._claims, runner._state
        for lane in h.lanes:
            for request in lane.sent:
                if not hasattr(request, "walk_sent"):
                    request.walk_sent = now
                    if isinstance(request, Recover):
                        # Not on the lane an overtaken full claim freed for the seeks.
                        assert not claims_.overtaking(now), "a recovery beside an overtaken claim"
        upkeep = runner._upkeep
        if self.recovery_failed and not upkeep.recovering:
            # A failure says nothing of the scan: the next recovery after the poll interval.
            after = upkeep.recovery_sent + runner.settings.poll_interval
            assert upkeep.next_recovery <= after + 1e-9, "a failed recovery spaced the next"
            self.recovery_failed = False
        elif upkeep.recovering:
            self.recovery_failed = False
        in_flight = [r for lane in h.lanes for r in lane.sent if isinstance(r, RecordAndClaim)]
        fulls = [r for r in in_flight if r.limit and r.mark is None]
        if not claims_.one_at_a_time:
            assert len(fulls) <= 1, "two full claims in flight"
        else:
            assert claims_._full is None, "a queue that claims one at a time tracks a full claim"
            assert claims_._overtake_at is None
            assert state.claims_in_flight <= 1
        if claims_._full is not None:
            assert claims_._full in in_flight, "the full claim is gone, but still tracked"
        else:
            assert claims_._overtake_at is None
        share = runner.concurrency + claims_.pace.prefetch_max
        assert state.queued + state.reserved <= 2 * share, "claimed beyond reason"
        seeker = claims_.seek
        idle = not (
            in_flight
            or state.attempts
            or state.outcomes
            or claims_.wanted
            or claims_.backlog
            or runner._stopping
            or runner._exiting
            or runner._done
        )
        if seeker is not None and self.short_sent is not None and idle and not self.capped:
            # Nothing else will claim (no job to finish, no backlog): the full claim comes by
            # the spacing, and the coordinator's poll is no later.
            assert claims_.next_poll <= max(seeker.next_full, now) + 1e-9, (
                "a short seek's full claim waits for the poll"
            )


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
@pytest.mark.parametrize("seed", range(int(os.environ.get("PGOUTBOX_WALKS", "40"))))
def test_slow_walks_keep_the_books(settings: dict[str, object], seed: int) -> None:
    SlowWalk(seed, poll_interval=5.0, **settings).run(400)
