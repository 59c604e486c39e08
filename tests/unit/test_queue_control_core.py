"""A queue's coordinator, paused, resumed and resized (``worker.controls``), driven with fakes:
nothing is claimed before its row is read, nor while paused; what no thread started goes back;
threads are added and retired; a limit set at run time makes claims one at a time."""

from __future__ import annotations

from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.controls import ReadControl
from django_pgoutbox.worker.leases import GiveBack, Recover
from tests.unit.fakes import Harness, claim_row

PAUSED = Control(paused=True)


def claims(harness: Harness, lane: int = 0) -> list[RecordAndClaim]:
    return [request for request in harness.sent(RecordAndClaim, lane) if request.limit]


def read(harness: Harness, control: Control) -> None:
    """A notification, then the read it calls for answered with ``control``: what is in flight
    before it is answered as if nothing were due."""
    harness.runner.controls_changed()
    for _ in range(10):
        harness.step()
        for index, lane in enumerate(harness.lanes):
            if lane.sent and isinstance(lane.sent[0], ReadControl):
                harness.answer(ReadControl, control, lane=index)
                harness.step()
                return
        for index, lane in enumerate(harness.lanes):
            if lane.sent and isinstance(lane.sent[0], RecordAndClaim):
                harness.answer(RecordAndClaim, lane=index, rows=[])
            elif lane.sent:
                lane.reply()
    raise AssertionError("the read was never sent")


def test_nothing_is_claimed_before_the_queues_row_is_read() -> None:
    harness = Harness(control=None)
    harness.step()
    (sent,) = harness.sent(ReadControl)
    assert sent.queue == "default"
    assert not claims(harness)
    harness.answer(ReadControl, PAUSED)
    harness.step()
    assert not claims(harness)  # paused at start: stays so
    harness.answer(Recover, read=PAUSED)  # the poll's read, with the recovery
    harness.step(1.0)
    assert not claims(harness)
    read(harness, Control())
    assert len(claims(harness)) == 1


def test_a_pause_gives_back_what_no_thread_started_and_claims_nothing_more() -> None:
    harness = Harness()
    harness.start_up()
    first, second, third = harness.claim([claim_row(), claim_row(), claim_row()])
    harness.threads.begin(first)  # running: it finishes
    read(harness, PAUSED)
    (give_back,) = harness.sent(GiveBack)
    assert give_back.reason == "paused"
    assert set(give_back.keys) == {second.key, third.key}
    harness.answer(GiveBack, 2)
    harness.threads.finish(first)
    harness.step()
    written = harness.sent(RecordAndClaim)
    assert [request.limit for request in written] == [0]  # the outcome, and no claim with it
    assert [outcome.job.id for outcome in written[0].batch] == [first.id]


def test_a_claim_that_lands_after_the_pause_starts_none_of_its_jobs() -> None:
    harness = Harness()
    harness.start_up()  # its claim in flight
    sent = harness.runner._controls.read()  # as if read on another lane
    harness.runner._read_control(PAUSED, harness.clock.now, sent.covers)
    row = claim_row()
    assert harness.claim([row]) == []
    (give_back,) = harness.sent(GiveBack)
    assert give_back.keys == [(row.id, row.attempt)]


def test_a_resize_adds_and_retires_threads_and_claims_for_them() -> None:
    harness = Harness(concurrency=2)
    harness.start_up()
    harness.claim([])
    read(harness, Control(overrides={"CONCURRENCY": 5}))
    assert (harness.threads.added, harness.runner.concurrency) == (3, 5)
    assert claims(harness)[-1].limit == 5
    read(harness, Control(overrides={"CONCURRENCY": 1}))
    assert (harness.threads.retired, harness.runner.concurrency) == (4, 1)


def test_a_limit_set_at_run_time_claims_one_at_a_time_on_a_second_lane() -> None:
    harness = Harness(connections=1)
    harness.start_up()
    harness.claim([])
    assert len(harness.lanes) == 1
    read(harness, Control(overrides={"MAX_RUNNING": 3}))
    assert len(harness.lanes) == 2  # renewals go there while a claim waits on the lock
    assert harness.runner.settings.max_running == 3
    (claim,) = claims(harness)
    assert claim.settings.limited
    read(harness, Control(overrides={"MAX_RUNNING": None}))
    assert not harness.runner.settings.limited


def test_a_row_that_cannot_be_read_is_not_the_coordinators_end() -> None:
    harness = Harness(control=None)
    harness.step()
    harness.answer(ReadControl, Control(problems=("queue_controls could not be read (x)",)))
    harness.step()
    harness.answer(Recover)
    harness.step()
    assert len(claims(harness)) == 1  # the settings apply


def test_a_notification_holds_the_claims_no_longer_than_the_hold() -> None:
    """A notification holds the claims until its read is answered, at most ``NOTICE_HOLD``:
    the coordinator wakes for the hold's end itself (it slept until the poll, 100 s here), and
    a wake-up that came meanwhile is claimed for once a lane is free."""
    from django_pgoutbox.worker.controls import NOTICE_HOLD
    from django_pgoutbox.worker.lanes import SLOW_FIRST

    harness = Harness()
    harness.start_up()
    harness.claim([])  # idle
    harness.runner.controls_changed()
    harness.step()
    assert harness.sent(ReadControl)  # in flight, and slow: not answered
    harness.runner.wake()  # a job's notification: held back
    harness.step()
    assert not claims(harness)
    # (first, when the read becomes slow: SLOW_FIRST, shorter than the hold)
    assert harness.runner._next_deadline() == harness.clock.now + min(SLOW_FIRST, NOTICE_HOLD)
    harness.step(SLOW_FIRST)
    assert harness.runner._next_deadline() == harness.clock.now + NOTICE_HOLD - SLOW_FIRST
    harness.step(NOTICE_HOLD - SLOW_FIRST)
    # the hold is over, the read slow: the claim goes on the other lane, without waiting for it
    assert len(claims(harness, lane=1)) == 1
    harness.answer(ReadControl, Control())
    harness.step()
    assert not claims(harness)


def test_a_lost_connection_reads_the_row_again_before_the_next_claim() -> None:
    """A lane's connection is lost (the listener's, and a pause notified meanwhile, may be
    too): the row is read again before anything is claimed, however long the read takes."""
    import psycopg

    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    for then, expected in ((PAUSED, 0), (Control(), 1)):
        harness = Harness()
        harness.start_up()
        harness.claim([])  # idle
        harness.runner.wake()
        harness.step()
        assert len(claims(harness)) == 1
        harness.lanes[0].reply(error=lost)
        harness.step()
        harness.step(10.0)  # past the lane's back-off, and past any notification's hold
        assert not claims(harness)
        assert not claims(harness, lane=1)
        (lane,) = [lane for lane in (0, 1) if harness.sent(ReadControl, lane)]
        harness.answer(ReadControl, then, lane=lane)
        harness.step()
        assert len(claims(harness)) + len(claims(harness, lane=1)) == expected


def test_a_lost_connection_beside_a_slow_recovery_reads_the_row_without_waiting_for_it() -> None:
    """The poll's read goes with a recovery, which may take long (it waits for a row lock, or a
    held horizon slows it) while claims go on another lane. That lane's connection is lost: the
    read in flight with the recovery was sent before, and does not count; another goes at once
    on the lane that reconnects, rather than after the recovery's answer (until then, nothing
    would be claimed). The recovery's read, answered last, changes nothing: it is older."""
    import psycopg

    from django_pgoutbox.worker.lanes import SLOW_FIRST

    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    harness = Harness()
    harness.step()
    (recover,) = harness.sent(Recover)
    assert recover.control is not None  # the poll's read, with the recovery
    harness.step(SLOW_FIRST)
    assert len(claims(harness, lane=1)) == 1  # beside the slow recovery
    harness.lanes[1].reply(error=lost)
    harness.step()
    harness.step(1.0)  # past the lane's back-off
    assert len(harness.sent(ReadControl, lane=1)) == 1
    harness.answer(ReadControl, PAUSED, lane=1)
    harness.step()
    assert not claims(harness, lane=1)
    harness.answer(Recover, read=Control())  # read before the pause: not applied
    harness.step()
    assert harness.runner._controls.control.paused
    assert not claims(harness)
    assert not claims(harness, lane=1)
    read(harness, Control())
    assert len(claims(harness)) + len(claims(harness, lane=1)) == 1


def test_a_read_that_failed_for_a_while_does_not_count_after_a_lost_connection() -> None:
    """A read that fails for a reason that may pass (a lock timeout: the table locked by a
    migration) keeps what was read last; after a lost connection, that is not the row as it is
    now (a pause notified meanwhile was lost), so nothing is claimed until a read succeeds."""
    import psycopg

    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    harness = Harness()
    harness.start_up()
    harness.claim([])  # idle
    harness.runner.wake()
    harness.step()
    harness.lanes[0].reply(error=lost)
    harness.step()
    harness.step(10.0)
    (lane,) = [lane for lane in (0, 1) if harness.sent(ReadControl, lane)]
    harness.answer(ReadControl, Control(problems=("lock timeout",), unread=False), lane=lane)
    harness.step()
    harness.step(10.0)
    assert not claims(harness)
    assert not claims(harness, lane=1)
    harness.step(100.0)  # the poll's read, with the recovery
    harness.answer(Recover, read=PAUSED)
    harness.step()
    assert not claims(harness)
    assert not claims(harness, lane=1)
    assert harness.runner._controls.control.paused
