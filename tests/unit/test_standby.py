"""An idle queue's claim held ready on its first lane (``worker.standby``): a coordinator driven
with a fake lane that holds a standing claim as the real one does, and fake handler threads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.attempt import HELD, QUEUED
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.controls import ReadControl
from django_pgoutbox.worker.lanes import DISARM, FIRE, STOPPING
from django_pgoutbox.worker.leases import GiveBack, Recover
from django_pgoutbox.worker.mailbox import REPLY, STOP, Mailbox
from django_pgoutbox.worker.standby import Standby
from tests.unit.fakes import FakeLane, Harness, claim_row


class StandingLane(FakeLane):
    """A fake lane that holds a standing request until fired or disarmed, as ``Lane`` does;
    ``work()`` plays its thread."""

    def __init__(self, index: int, mailbox: Mailbox) -> None:
        super().__init__(index, mailbox)
        self.held: Standby | None = None
        self.inbox: list[tuple[Any, ...]] = []
        self.stopped = False  # a STOPPING came

    def send(self, request: Any) -> None:
        if getattr(request, "standing", False):
            self.held = request
        else:
            super().send(request)

    def fire(self, wake: float, *, unless_crowded: bool = False) -> None:
        self.inbox.append((FIRE, wake))

    def disarm(self) -> None:
        self.inbox.append((DISARM,))

    def stopping(self) -> None:
        self.inbox.append((STOPPING,))

    def fail(self, error: BaseException) -> Standby:
        """The lane's thread, fired: its claim fails with ``error`` (its connection lost)."""
        ((kind, wake),) = self.inbox
        assert kind == FIRE
        assert self.held is not None
        request, self.held, self.inbox = self.held, None, []
        request.fire(wake)
        self.mailbox.post((REPLY, self.index, request, None, error, False))
        return request

    def work(self, rows: Sequence[Any] = ()) -> Standby | None:
        """What the lane's thread does with its inbox: a fired claim takes ``rows``."""
        answered = None
        for position, item in enumerate(self.inbox):
            self.stopped = self.stopped or item[0] == STOPPING
            if self.held is None:
                continue
            request, self.held = self.held, None
            if item[0] != FIRE:
                self.mailbox.post((REPLY, self.index, request, None, None, True))
                continue
            request.fire(item[1])
            request.claim.rows = list(rows)
            request.make_attempts()
            if self.stopped or (STOPPING,) in self.inbox[position + 1 :]:  # ``Lane._stopped``
                request.starts = False
            self.mailbox.post((REPLY, self.index, request, request, None, True))
            request.after_reply()
            answered = request
        self.inbox = []
        return answered


def idle_harness(**overrides: Any) -> tuple[Harness, StandingLane]:
    """A coordinator whose queue went idle: its first claim came back empty."""
    harness = Harness(lane_class=StandingLane, **overrides)
    harness.start_up()
    harness.claim([])
    lane = harness.lanes[0]
    assert isinstance(lane, StandingLane)
    return harness, lane


class TestStandby:
    def test_an_idle_queue_leaves_a_claim_on_its_first_lane(self) -> None:
        harness, lane = idle_harness()
        assert isinstance(lane.held, Standby)
        assert lane.held.claim.limit == harness.runner.concurrency
        assert lane.sent == []  # nothing else in flight

    def test_a_wake_up_fires_it_and_the_lane_starts_the_jobs(self) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()
        assert lane.inbox == [(FIRE, 1)]  # straight to the lane, not through the coordinator
        rows = [claim_row(), claim_row()]
        lane.work(rows)
        # Started by the lane before the coordinator took its reply...
        assert [a.id for a in harness.threads.submitted] == [r.id for r in rows]
        harness.step()
        # ... and held by the coordinator as any claim's; the wake-up was answered: no claim.
        snapshot = harness.runner.snapshot()
        assert (snapshot.running, snapshot.reserved) == (2, 0)
        assert lane.sent == []
        assert lane.held is None
        first, second = harness.threads.submitted
        assert first.state == QUEUED
        harness.threads.finish(first)
        harness.threads.finish(second)
        harness.step()
        (write,) = harness.sent(RecordAndClaim)
        assert [o.job.id for o in write.batch] == [first.id, second.id]

    def test_a_wake_up_after_the_claim_began_is_claimed_for_again(self) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()
        harness.runner.wake()  # its job may have committed after the first claim began
        lane.work([claim_row()])
        harness.step()
        assert len(harness.sent(RecordAndClaim)) == 1

    def test_a_suspect_is_not_started_by_the_lane(self) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()
        innocent, suspect = claim_row(), claim_row(suspect=True, attempt=2)
        standby = lane.work([innocent, suspect])
        assert standby is not None
        assert [a.id for a in harness.threads.submitted] == [innocent.id]
        harness.step()
        held = standby.attempts[1]
        assert held.state == HELD  # the coordinator holds it back until it can run alone

    def test_the_poll_interval_fires_it_from_the_coordinator(self) -> None:
        harness, lane = idle_harness()
        harness.runner._upkeep.next_recovery = float("inf")  # this poll finds no recovery due
        harness.step(harness.runner.settings.poll_interval)
        assert lane.inbox == [(FIRE, 0)]
        lane.work([])
        harness.step()
        assert lane.sent == []
        assert lane.held is not None

    def test_recovery_disarms_it_then_takes_the_lane_then_the_claim(self) -> None:
        harness, lane = idle_harness()
        harness.step(harness.runner.settings.poll_interval)  # recovery and the poll are due
        assert lane.inbox == [(DISARM,)]
        lane.work()
        harness.step()
        harness.answer(Recover)
        harness.step()
        harness.answer(RecordAndClaim, rows=[])  # the poll's claim, sent as usual
        harness.step()
        assert lane.sent == []
        assert lane.held is not None

    def test_a_stop_disarms_it_and_the_coordinator_ends(self) -> None:
        harness, lane = idle_harness()
        harness.runner.stop()
        harness.step()
        assert lane.inbox == [(STOPPING,), (DISARM,)]  # from the stop itself, then the coordinator
        lane.work()
        harness.step()
        assert harness.runner.snapshot().ended

    def test_a_stop_while_a_fired_claim_is_in_flight_starts_none_of_its_jobs(self) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()
        harness.runner.stop()  # tells the lane itself, not only the coordinator
        assert lane.inbox == [(FIRE, 1), (STOPPING,)]
        rows = [claim_row(), claim_row(suspect=True, attempt=2)]
        standby = lane.work(rows)
        assert standby is not None
        assert not standby.starts
        assert harness.threads.submitted == []
        harness.step()
        (give_back,) = harness.sent(GiveBack)
        assert give_back.statement == "UNCLAIM_JOBS"
        assert sorted(give_back.keys) == sorted(attempt.key for attempt in standby.attempts)
        assert harness.threads.submitted == []
        harness.answer(GiveBack, 2)
        harness.step()
        assert harness.runner.snapshot().ended

    def test_a_stop_just_after_the_lane_started_its_jobs_gives_back_what_no_thread_took(
        self,
    ) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()
        rows = [claim_row(), claim_row()]
        lane.work(rows)  # the stop came after the lane posted its reply
        harness.runner.stop()
        first, second = harness.threads.submitted
        harness.threads.begin(first)  # one thread started before the stop was taken
        harness.step()
        (give_back,) = harness.sent(GiveBack)
        assert (give_back.statement, give_back.keys) == ("UNCLAIM_JOBS", [second.key])
        harness.answer(GiveBack, 1)
        harness.threads.finish(first)
        harness.step()
        (write,) = harness.sent(RecordAndClaim)
        assert (write.limit, [o.job.id for o in write.batch]) == (0, [first.id])
        harness.answer(RecordAndClaim)
        harness.step()
        assert harness.runner.snapshot().ended

    def test_a_slow_fired_claim_does_not_spin_the_coordinator_when_recovery_is_due(
        self,
    ) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()  # fired, and the claim is slow: the lane is busy
        harness.step()
        harness.clock.now += harness.runner.settings.poll_interval * 3  # recovery long due
        harness.step()
        assert harness.runner._next_deadline() > harness.clock.now  # nothing it can do now
        lane.work([])
        harness.step()
        assert harness.sent(Recover)  # the lane is free again: recovery goes

    def test_a_fair_queue_never_fires_its_lane(self) -> None:
        harness = Harness(lane_class=StandingLane, fair=True)
        harness.start_up()
        harness.runner.wake()
        lane = harness.lanes[0]
        assert isinstance(lane, StandingLane)
        assert (lane.inbox, lane.held) == ([], None)  # wake-ups go to the coordinator alone

    def test_a_claim_given_back_unsent_keeps_the_lanes_back_off(self) -> None:
        harness, lane = idle_harness()
        lanes = harness.runner._lanes
        lanes._pause[0] = 8.0  # as after failures: the next one waits 8 s
        harness.step(harness.runner.settings.poll_interval)  # recovery disarms the lane
        lane.work()
        harness.step()
        assert lanes._pause[0] == 8.0

    def test_a_claim_armed_again_after_the_stops_disarm_starts_none_of_its_jobs(self) -> None:
        harness, lane = idle_harness()
        runner = harness.runner
        # QueueRunner.stop, first half: the lane gives the claim it holds back...
        assert runner._standby.stop_lane is not None
        runner._standby.stop_lane()
        lane.work()
        harness.step()  # ... and the coordinator, not stopping yet, leaves it on the lane again
        assert lane.held is not None
        runner._mailbox.post((STOP,))  # the stop's second half
        runner.wake()  # fires the claim armed again, before the coordinator takes the STOP
        standby = lane.work([claim_row(), claim_row()])
        assert standby is not None
        assert harness.threads.submitted == []  # the lane knows the worker stops
        harness.step()
        (give_back,) = harness.sent(GiveBack)
        assert sorted(give_back.keys) == sorted(attempt.key for attempt in standby.attempts)
        harness.answer(GiveBack, 2)
        harness.step()
        assert harness.threads.submitted == []
        assert harness.runner.snapshot().ended

    def test_a_fired_claim_whose_connection_is_lost_is_claimed_again_after_the_back_off(
        self,
    ) -> None:
        harness, lane = idle_harness(connections=1)
        harness.runner.wake()
        lane.fail(psycopg.OperationalError("server closed the connection unexpectedly"))
        harness.step()
        assert harness.sent(RecordAndClaim) == []  # the lane backs off...
        assert lane.held is None  # ... holding nothing meanwhile
        assert harness.runner._next_deadline() == harness.clock.now + 0.2
        harness.step(0.2)
        harness.answer(ReadControl, Control())  # first: a pause may have been notified meanwhile
        harness.step()
        (claim,) = harness.sent(RecordAndClaim)  # the wake-up is claimed for again
        assert claim.limit == harness.runner.concurrency
        harness.claim([claim_row()])
        assert len(harness.threads.submitted) == 1

    def test_a_fired_claim_whose_connection_is_lost_is_claimed_again_on_the_second_lane(
        self,
    ) -> None:
        harness, lane = idle_harness(connections=2)
        harness.runner.wake()
        lane.fail(psycopg.OperationalError("server closed the connection unexpectedly"))
        harness.step()
        harness.answer(ReadControl, Control(), lane=1)
        harness.step()
        (claim,) = harness.sent(RecordAndClaim, lane=1)
        assert claim.limit == harness.runner.concurrency
        harness.claim([claim_row()], lane=1)
        assert len(harness.threads.submitted) == 1

    def test_a_wake_up_left_out_of_a_crowded_lane_is_fired_by_the_coordinator(self) -> None:
        class CrowdedLane(StandingLane):
            def fire(self, wake: float, *, unless_crowded: bool = False) -> None:
                if not unless_crowded:  # as ``Lane.fire`` while its inbox is CROWDED
                    super().fire(wake)

        harness = Harness(lane_class=CrowdedLane)
        harness.start_up()
        harness.claim([])
        lane = harness.lanes[0]
        assert isinstance(lane, StandingLane)
        assert lane.held is not None
        harness.runner.wake()
        assert lane.inbox == []  # left out...
        harness.step()
        assert lane.inbox == [(FIRE, 1)]  # ... the coordinator's WAKE fires the claim itself
        lane.work([claim_row()])
        harness.step()
        assert len(harness.threads.submitted) == 1
        assert harness.sent(RecordAndClaim) == []  # the wake-up was answered
