"""An idle queue's claim held ready on its first lane (``worker.standby``): a coordinator driven
with a fake lane that holds a standing claim as the real one does, and fake handler threads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_pgoutbox.worker.attempt import HELD, QUEUED
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.lanes import DISARM, FIRE
from django_pgoutbox.worker.leases import GiveBack, Recover
from django_pgoutbox.worker.mailbox import REPLY, Mailbox
from django_pgoutbox.worker.standby import Standby
from tests.unit.fakes import FakeLane, Harness, claim_row


class StandingLane(FakeLane):
    """A fake lane that holds a standing request until fired or disarmed, as ``Lane`` does;
    ``work()`` plays its thread."""

    def __init__(self, index: int, mailbox: Mailbox) -> None:
        super().__init__(index, mailbox)
        self.held: Standby | None = None
        self.inbox: list[tuple[Any, ...]] = []

    def send(self, request: Any) -> None:
        if getattr(request, "standing", False):
            self.held = request
        else:
            super().send(request)

    def fire(self, wake: float) -> None:
        self.inbox.append((FIRE, wake))

    def disarm(self) -> None:
        self.inbox.append((DISARM,))

    def work(self, rows: Sequence[Any] = ()) -> Standby | None:
        """What the lane's thread does with its inbox: a fired claim takes ``rows``."""
        answered = None
        for item in self.inbox:
            if self.held is None:
                continue
            request, self.held = self.held, None
            if item[0] == DISARM:
                self.mailbox.post((REPLY, self.index, request, None, None, True))
                continue
            request.fire(item[1])
            request.claim.rows = list(rows)
            request.make_attempts()
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
        assert lane.inbox == [(DISARM,)]
        lane.work()
        harness.step()
        assert harness.runner.snapshot().ended

    def test_a_stop_racing_a_fired_claim_gives_back_what_no_thread_started(self) -> None:
        harness, lane = idle_harness()
        harness.runner.wake()
        harness.runner.stop()
        rows = [claim_row(), claim_row()]
        lane.work(rows)  # the FIRE came before the coordinator's DISARM
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
