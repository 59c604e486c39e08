"""A queue's coordinator driven through chosen interleavings, with fake lanes, handler threads
and clock: no database, no threads, no sleeps."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

from django_pgoutbox import metrics
from django_pgoutbox.models import JobStatus
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.attempt import QUEUED, Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.controls import ReadControl
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.leases import GiveBack, Renew
from django_pgoutbox.worker.mailbox import Mailbox
from django_pgoutbox.worker.state import QueueState
from tests.unit.fakes import Harness, claim_row


def batches(harness: Harness, lane: int = 0) -> list[list[Outcome]]:
    return [request.batch for request in harness.sent(RecordAndClaim, lane) if request.batch]


class TestOutcomeAndTimeout:
    def test_an_outcome_that_comes_before_the_deadline_is_the_only_one(self) -> None:
        """The handler returns just before its deadline; the coordinator first looks after it:
        the handler's outcome is written, and no timeout is made up beside it."""
        harness = Harness()
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.begin(attempt, deadline=harness.clock.now + 1.0)
        harness.step()
        harness.clock.now += 0.999
        harness.threads.finish(attempt)
        harness.step(0.01)  # the outcome and the deadline, in one turn
        (batch,) = batches(harness)
        assert [o.status for o in batch] == [JobStatus.COMPLETED]
        assert harness.threads.added == 0
        assert harness.runner.snapshot().abandoned == 0

    def test_an_outcome_that_comes_after_the_timeout_is_stale(self) -> None:
        harness = Harness()
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.begin(attempt, deadline=harness.clock.now + 1.0)
        harness.step()
        stale = metrics.STALE_OUTCOMES.value(queue="default")
        harness.step(1.001)
        (batch,) = batches(harness)
        assert [(o.status, o.timed_out) for o in batch] == [(JobStatus.RETRYING, True)]
        assert harness.threads.added == 1  # a thread in place of the one still held
        harness.answer(RecordAndClaim)
        harness.threads.finish(attempt)
        harness.step()
        # Not written, nor counted as an outcome: the timeout's was the attempt's one.
        assert len(batches(harness)) == 0
        assert metrics.STALE_OUTCOMES.value(queue="default") == stale + 1
        assert harness.threads.retired == 1
        snapshot = harness.runner.snapshot()
        assert (snapshot.running, snapshot.abandoned, snapshot.outcomes_waiting) == (0, 0, 0)

    @pytest.mark.parametrize("first_timed_out", [True, False])
    def test_a_batch_never_holds_two_outcomes_for_one_attempt(
        self, first_timed_out: bool, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The states make a second outcome for one attempt impossible; were a bug to bring
        one (the timeout's and the handler's, or the handler's twice), the batch keeps the
        first and says so."""
        state = QueueState("default")
        attempt, other = Attempt(claim_row()), Attempt(claim_row())
        state.hold(attempt, QUEUED)
        state.hold(other, QUEUED)
        if first_timed_out:
            attempt.deadline = 0.0
            state.timed[attempt.slot] = attempt
            assert state.expired(1.0) == [attempt]
            state.timed_out(
                attempt, Outcome(attempt.bare_job(), JobStatus.RETRYING, timed_out=True)
            )
        else:
            assert state.finished(attempt, Outcome(attempt.bare_job(), JobStatus.COMPLETED))
        assert state.finished(other, Outcome(other.bare_job(), JobStatus.COMPLETED))
        second = Outcome(attempt.bare_job(), JobStatus.COMPLETED)  # a bug's
        state.outcomes.append(second)
        state.ended.append(attempt)
        batch, attempts = state.take_batch(0)
        assert [o.job.id for o in batch] == [attempt.id, other.id]
        assert attempts == [attempt, other]
        assert "a second outcome (completed) left out of its batch" in caplog.text


class TestRenewals:
    def test_an_outcome_waits_for_the_renewal_of_its_lease(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Lane 0 renews two attempts' leases and one of them finishes meanwhile. Its outcome
        is not written on lane 1 beside the renewal: the two statements would lock the same
        rows, each in an order its plan chose, and deadlock (a second's wait for PostgreSQL to
        say so, with every lane of the queue held: leases of a second were lost that way). It
        goes as soon as the renewal is answered, and no lease is lost."""
        harness = Harness(connections=2, concurrency=2)
        harness.start_up()
        first, second = harness.claim([claim_row(), claim_row()])  # full: a backlog
        harness.step(10.0)  # a third of the lease: the renewal goes on lane 0
        (renewal,) = harness.sent(Renew)
        assert set(renewal.keys) == {first.key, second.key}
        harness.threads.finish(first)
        harness.step()
        writes = harness.sent(RecordAndClaim, lane=0) + harness.sent(RecordAndClaim, lane=1)
        assert not [write for write in writes if write.batch]
        assert harness.runner.snapshot().outcomes_waiting == 1
        harness.answer(Renew, {first.id: False, second.id: False})
        harness.step()
        writes = harness.sent(RecordAndClaim, lane=0) + harness.sent(RecordAndClaim, lane=1)
        (write,) = [write for write in writes if write.batch]
        assert [o.job.id for o in write.batch] == [first.id]
        harness.answer(RecordAndClaim, lane=1 if write in harness.lanes[1].sent else 0)
        harness.step()
        assert "lease lost" not in caplog.text
        assert not second.lease_lost
        snapshot = harness.runner.snapshot()
        assert (snapshot.running, snapshot.outcomes_waiting) == (1, 0)

    def test_a_renewal_leaves_out_the_attempts_being_written(self) -> None:
        """An outcome write in flight ends its attempt's lease: a renewal sent meanwhile does
        not touch that row (the same deadlock, the other way round)."""
        harness = Harness(connections=2, concurrency=2)
        harness.start_up()
        first, second = harness.claim([claim_row(), claim_row()])
        harness.threads.finish(first)
        harness.step(0.1)  # past the flush: the outcome goes, with a claim, on lane 0
        (write,) = [w for w in harness.sent(RecordAndClaim) if w.batch]
        assert [o.job.id for o in write.batch] == [first.id]
        harness.step(10.0)  # the renewal is due while the write is in flight
        (renewal,) = harness.sent(Renew, lane=1)
        assert renewal.keys == [second.key]
        harness.answer(Renew, {second.id: False}, lane=1)
        harness.answer(RecordAndClaim)
        harness.step()
        assert harness.runner.snapshot().running == 1

    @pytest.mark.parametrize("connections", [1, 2])
    def test_a_renewal_that_keeps_failing_does_not_hold_an_outcome_back_forever(
        self, connections: int
    ) -> None:
        """A renewal fails (a statement_timeout on a row another session keeps locked, say)
        and goes again as soon as its lane is ready, first in its turn. The outcome it held
        back must be written before the next renewal holds it back again: else, while the
        renewals fail, the finished job is never recorded, and its lease expires into a
        second run."""
        harness = Harness(connections=connections, concurrency=2)
        harness.start_up()
        first, second = harness.claim([claim_row(), claim_row()])
        harness.threads.begin(second)
        harness.step(10.0)
        assert harness.sent(Renew)
        harness.threads.finish(first)
        harness.step()
        timeout = psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
        written = []
        for _ in range(20):
            for lane in harness.lanes:
                for request in list(lane.sent):
                    if isinstance(request, Renew):
                        lane.reply(error=timeout)
                    elif isinstance(request, RecordAndClaim):
                        written += [o.job.id for o in request.batch]
                        lane.reply()
            harness.step(0.5)
            if written:
                break
        assert written == [first.id], "the outcome waited behind every renewal that failed"

    def test_a_lost_lease_is_said_once(self, caplog: pytest.LogCaptureFixture) -> None:
        harness = Harness()
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.step(10.0)
        harness.answer(Renew, {})
        harness.step()
        assert attempt.lease_lost
        assert caplog.text.count("lease lost") == 1

    def test_a_cancellation_during_a_claim_reaches_the_job_it_claims(self) -> None:
        harness = Harness()
        harness.start_up()
        harness.runner.check_cancellations()  # while the claim is in flight
        harness.step()
        assert not harness.sent(Renew)
        (attempt,) = harness.claim([claim_row()])
        (renewal,) = harness.sent(Renew)
        assert renewal.keys == [attempt.key]
        harness.answer(Renew, {attempt.id: True})
        harness.step()
        assert attempt.cancel.is_set()

    def test_a_renewal_never_waits_behind_a_limited_queues_claim(self) -> None:
        harness = Harness(max_running=5)
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.runner.wake()  # another claim, which may wait for the queue's lock
        harness.step()
        assert harness.sent(RecordAndClaim)
        harness.step(10.0)
        (renewal,) = harness.sent(Renew, lane=1)
        assert renewal.keys == [attempt.key]

    def test_a_handlers_renewal_is_answered(self) -> None:
        harness = Harness()
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        answers: list[BaseException | None] = []

        def renew() -> None:
            try:
                harness.runner.renew(attempt.key)
                answers.append(None)
            except BaseException as error:
                answers.append(error)

        thread = threading.Thread(target=renew)
        thread.start()
        deadline = time.monotonic() + 5
        while not harness.sent(Renew) and time.monotonic() < deadline:
            harness.step()
        harness.answer(Renew, {attempt.id: False})
        harness.step()
        thread.join(5)
        assert answers == [None]


class TestStopping:
    def test_a_stop_during_a_claim_gives_back_what_it_claims(self) -> None:
        harness = Harness()
        harness.start_up()
        harness.runner.stop()
        harness.step()
        assert not harness.sent(GiveBack)  # the claim in flight lands first
        first, second = claim_row(), claim_row()
        assert harness.claim([first, second]) == []  # no thread sees them
        (give_back,) = harness.sent(GiveBack)
        assert (give_back.statement, set(give_back.keys)) == (
            "UNCLAIM_JOBS",
            {(first.id, first.attempt), (second.id, second.attempt)},
        )
        harness.answer(GiveBack, 2)
        harness.step()
        assert harness.runner.snapshot().ended

    def test_a_stop_waits_for_running_attempts_then_releases_them(self) -> None:
        harness = Harness()
        harness.start_up()
        first, second = harness.claim([claim_row(), claim_row()])
        harness.threads.begin(first)
        harness.threads.begin(second)
        harness.runner.stop()
        harness.step()
        harness.threads.finish(first)
        harness.step()
        (write,) = harness.sent(RecordAndClaim, lane=0)
        assert (write.limit, [o.job.id for o in write.batch]) == (0, [first.id])
        harness.answer(RecordAndClaim)
        harness.step()
        assert not harness.runner.snapshot().ended
        harness.step(harness.runner.grace_period)
        harness.answer(Renew, {second.id: False})  # leases are renewed until the end
        harness.step()
        (release,) = harness.sent(GiveBack)
        assert (release.statement, release.keys) == ("RELEASE_JOBS", [second.key])
        harness.answer(GiveBack, 1)
        harness.step()
        assert harness.runner.snapshot().ended


class TestLanes:
    def test_a_lane_that_loses_its_connection_keeps_its_work_for_later(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        harness = Harness(connections=1)
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.finish(attempt)
        harness.step()
        (write,) = harness.sent(RecordAndClaim)
        assert [o.job.id for o in write.batch] == [attempt.id]
        harness.lanes[0].reply(error=psycopg.OperationalError("the connection was lost"))
        harness.step()
        assert "database unavailable on connection 1" in caplog.text
        assert not harness.sent(RecordAndClaim)  # backing off
        snapshot = harness.runner.snapshot()
        assert (snapshot.outcomes_waiting, snapshot.writing, snapshot.reserved) == (1, 0, 0)
        harness.step(0.25)  # the queue's row first: a pause may have been notified meanwhile
        harness.answer(ReadControl, Control())
        harness.step()
        (again,) = harness.sent(RecordAndClaim)
        assert [o.job.id for o in again.batch] == [attempt.id]
        assert harness.runner.snapshot().reserved == again.limit

    def test_an_error_that_is_not_the_connections_stops_the_loop(self) -> None:
        harness = Harness()
        harness.step()
        harness.lanes[0].reply(error=RuntimeError("a bug"))
        with pytest.raises(RuntimeError, match="a bug"):
            harness.step()

    def test_an_idle_queue_sends_nothing_on_its_second_lane(self) -> None:
        harness = Harness(connections=2)
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])  # fewer than asked: no backlog
        harness.threads.finish(attempt)
        harness.step()
        harness.step(5.0)
        assert not harness.lanes[1].sent
        assert harness.runner.snapshot().lane_turns[1] == 0


class TestLostAttempts:
    def test_an_attempt_left_without_an_outcome_is_no_longer_renewed(self) -> None:
        harness = Harness()
        harness.start_up()
        first, second = harness.claim([claim_row(), claim_row()])
        harness.threads.begin(first)
        harness.threads.lose(first, thread_died=True)
        harness.step()
        assert harness.threads.added == 1
        harness.step(10.0)
        (renewal,) = harness.sent(Renew)
        assert renewal.keys == [second.key]


class TestMailbox:
    def test_a_quiet_message_wakes_only_a_coordinator_that_waits_for_any(self) -> None:
        mailbox = Mailbox()
        threading.Timer(0.01, mailbox.post, args=(("quiet",),), kwargs={"urgent": False}).start()
        started = time.monotonic()
        assert mailbox.wait(0.2, quiet=False) == [("quiet",)]
        assert time.monotonic() - started >= 0.15  # slept through it
        threading.Timer(0.01, mailbox.post, args=(("quiet",),), kwargs={"urgent": False}).start()
        assert mailbox.wait(5.0, quiet=True) == [("quiet",)]
        threading.Timer(0.01, mailbox.post, args=(("urgent",),)).start()
        assert mailbox.wait(5.0, quiet=False) == [("urgent",)]


def test_the_unit_layer_uses_no_database() -> None:
    """The tests of this folder run without the ``db`` mark: pytest-django refuses a query."""
    logging.getLogger(__name__).debug("no database here")
