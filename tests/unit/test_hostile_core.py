"""The coordinator driven through the interleavings a hostile job, a lost connection or a stop
can bring: each test pins one behaviour (no database, no threads, no sleeps)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.controls import ReadControl
from django_pgoutbox.worker.leases import GiveBack, Recover, Renew, RenewalRequest
from django_pgoutbox.worker.mailbox import RENEW
from tests.unit.fakes import Harness, claim_row


def lost() -> psycopg.OperationalError:
    return psycopg.OperationalError("the connection was lost")


def sleeps(harness: Harness) -> float:
    """How long the coordinator would wait for a message now (0: it would spin)."""
    return harness.runner._next_deadline() - harness.clock.now


class TestNoSpin:
    """A deadline in the past that no turn clears makes the coordinator's loop spin, one turn
    after another without waiting, for as long as it stays."""

    def test_a_stop_with_a_long_handler_sleeps_between_turns(self) -> None:
        """Stopping, the coordinator neither polls nor recovers: their deadlines pass and
        stay in the past while a handler runs on through the grace period."""
        harness = Harness(poll_interval=1.0)
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.begin(attempt)
        harness.runner.stop()
        harness.step()
        harness.step(2.0)  # past the poll and the recovery's deadlines
        assert not harness.lanes[0].sent
        assert sleeps(harness) > 0.5

    def test_a_statement_in_flight_at_the_end_of_the_grace_period_is_waited_for(self) -> None:
        """The grace period ends while a statement is in flight: nothing can be released until
        its lane is free, and its reply wakes the coordinator."""
        harness = Harness()
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.begin(attempt)
        harness.runner.stop()
        harness.step()
        harness.step(harness.runner.grace_period)  # a renewal goes, then the deadline passes
        assert harness.sent(Renew)
        assert sleeps(harness) > 0.5
        harness.answer(Renew, {attempt.id: False})
        harness.step()
        (release,) = harness.sent(GiveBack)
        assert release.keys == [attempt.key]

    def test_a_slow_recovery_beside_a_free_lane_sleeps_between_turns(self) -> None:
        harness = Harness(poll_interval=1.0, connections=2, concurrency=2)
        harness.start_up()
        harness.claim([claim_row(), claim_row()])  # full: a backlog, lane 1 may send
        harness.step(1.0)
        assert harness.sent(Recover)  # and it takes its time
        harness.step(1.5)  # past the next recovery's deadline
        assert sleeps(harness) > 0.1


class TestLaneErrors:
    """One lane (``CONNECTIONS: 1``): the work waits out the lane's back-off."""

    def test_a_renewal_that_failed_is_sent_again_once_its_lane_is_ready(self) -> None:
        """A renewal lost with its connection is tried again after the lane's back-off, as the
        old dispatcher did, not a third of a lease later: two such in a row would let the
        lease expire, and the queue's own recovery take a job still running here."""
        harness = Harness(connections=1)
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.begin(attempt)
        harness.step(10.0)
        harness.lanes[0].reply(error=lost())
        harness.step()
        harness.step(0.25)  # the lane's back-off is over
        (again,) = harness.sent(Renew)
        assert again.keys == [attempt.key]

    def test_a_cancellation_whose_renewal_failed_is_delivered_after_the_back_off(self) -> None:
        harness = Harness(connections=1)
        harness.start_up()
        (attempt,) = harness.claim([claim_row()])
        harness.threads.begin(attempt)
        harness.runner.check_cancellations()
        harness.step()
        harness.lanes[0].reply(error=lost())
        harness.step()
        harness.step(0.25)
        harness.answer(Renew, {attempt.id: True})
        harness.step()
        assert attempt.cancel.is_set()

    def test_a_claim_that_failed_is_sent_again_once_its_lane_is_ready(self) -> None:
        """A claim lost with its connection (woken by a notification, say) is tried again
        after the back-off: the notification that asked for it will not come again, and the
        jobs would otherwise wait for the poll interval."""
        harness = Harness(connections=1)
        harness.start_up()
        (claim,) = harness.sent(RecordAndClaim)
        assert claim.limit > 0
        harness.lanes[0].reply(error=lost())
        harness.step()
        harness.step(0.25)
        harness.answer(ReadControl, Control())  # first: a pause may have been notified meanwhile
        harness.step()
        (again,) = harness.sent(RecordAndClaim)
        assert again.limit == claim.limit


def test_work_lost_with_the_first_lanes_connection_goes_at_once_on_the_second() -> None:
    """The first lane's backend was ended (``pg_terminate_backend``, a proxy's restart): its
    work does not wait out the first lane's back-off while the second is free (once the
    queue's row is read again there: a pause notified meanwhile may have been lost)."""
    harness = Harness(connections=2)
    harness.start_up()
    (claim,) = harness.sent(RecordAndClaim)
    harness.lanes[0].reply(error=lost())
    harness.step()
    harness.answer(ReadControl, Control(), lane=1)
    harness.step()
    (again,) = harness.sent(RecordAndClaim, lane=1)
    assert again.limit == claim.limit


@pytest.mark.parametrize("rows", [1, 2])
def test_a_claim_landing_during_a_stop_starts_nothing(rows: int) -> None:
    """Jobs claimed by a claim in flight at the stop are given back without a thread ever
    seeing them: handler threads that are idle would start them at once."""
    harness = Harness()
    harness.start_up()
    harness.runner.stop()
    harness.step()
    before = len(harness.threads.submitted)
    harness.answer(RecordAndClaim, rows=[claim_row() for _ in range(rows)])
    harness.step()
    assert len(harness.threads.submitted) == before
    (give_back,) = harness.sent(GiveBack)
    assert len(give_back.keys) == rows
    harness.answer(GiveBack, rows)
    harness.step()
    assert harness.runner.snapshot().ended


def test_a_renewal_storm_does_not_starve_the_queues_writes_and_claims() -> None:
    """Two handlers call ``ctx.renew_lease()`` in a loop, each again as soon as it is
    answered: a request is always waiting when a renewal's reply lands. An innocent's outcome
    must still be written (and the queue claim) on the one lane, not wait behind them forever."""
    harness = Harness(concurrency=3)
    harness.start_up()
    first, second, innocent = harness.claim([claim_row(), claim_row(), claim_row()])
    for attempt in (first, second, innocent):
        harness.threads.begin(attempt)

    def ask(attempt: Attempt) -> RenewalRequest:
        request = RenewalRequest(attempt.key, threading.Event())
        harness.runner._mailbox.post((RENEW, request))
        return request

    ask(first)
    harness.step()
    ask(second)  # while the first one's renewal is in flight
    harness.threads.finish(innocent)
    for _ in range(20):
        request = harness.lanes[0].sent[0]
        if isinstance(request, RecordAndClaim):
            break
        asked = {a.key for a in request.asked}
        harness.answer(Renew, {first.id: False, second.id: False, innocent.id: False})
        for attempt in (first, second):
            if attempt.key in asked:
                ask(attempt)  # answered: it asks again at once
        harness.step()
    else:
        pytest.fail("20 renewals in a row; the innocent's outcome was never sent")
    assert [o.job.id for o in request.batch] == [innocent.id]


def test_a_thread_that_dies_after_posting_its_outcome_keeps_that_outcome() -> None:
    """A handler thread posts its attempt's outcome, then dies before it forgets the attempt
    (an exception raised asynchronously into it): its death is no lost attempt. The outcome is
    written, and a thread is started in its place."""
    harness = Harness()
    harness.start_up()
    (attempt,) = harness.claim([claim_row()])
    harness.threads.finish(attempt)
    harness.runner._mailbox.post(("lost", attempt, True))
    harness.step()
    (write,) = harness.sent(RecordAndClaim)
    assert [o.job.id for o in write.batch] == [attempt.id]
    assert harness.threads.added == 1
    harness.answer(RecordAndClaim)
    harness.step()
    snapshot = harness.runner.snapshot()
    assert (snapshot.running, snapshot.writing) == (0, 0)
