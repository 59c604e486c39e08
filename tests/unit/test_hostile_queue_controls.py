"""A queue's run-time controls as its coordinator knows them (``worker.controls``), attacked:
reads that fail, notifications that race a read."""

from __future__ import annotations

from django_pgoutbox.conf import QueueSettings
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.controls import Controls, ReadControl

SETTINGS = QueueSettings(name="default", concurrency=2, lease_seconds=30, poll_interval=1)
PASSING = Control(problems=("queue_controls could not be read (LockNotAvailable)",), unread=False)
LASTING = Control(problems=("queue_controls could not be read (UndefinedTable)",), unread=True)


def _answer(controls: Controls, control: Control) -> None:
    controls.answered(control, SETTINGS, 2, controls.read().covers)


def test_a_read_that_may_pass_neither_resumes_nor_starts_a_queue() -> None:
    controls = Controls(SETTINGS, 2)
    _answer(controls, PASSING)
    assert not controls.claimable  # at start: nothing claimed until the row is read
    _answer(controls, Control(paused=True))
    _answer(controls, PASSING)
    assert controls.control.paused
    assert not controls.claimable
    _answer(controls, Control())
    assert controls.may_claim(0.0)


def test_a_read_that_fails_for_good_runs_the_queue_as_its_settings_say() -> None:
    controls = Controls(SETTINGS, 2)
    _answer(controls, LASTING)
    assert controls.may_claim(0.0)


def test_no_claim_while_a_notified_change_waits_for_its_read() -> None:
    controls = Controls(SETTINGS, 2)
    _answer(controls, Control())
    assert controls.may_claim(0.0)
    stale = controls.read()  # a periodic read, sent before the notification
    assert stale is not None
    controls.notified(0.0)
    assert not controls.may_claim(0.0)
    controls.answered(Control(), SETTINGS, 2, stale.covers)  # its answer may predate the change
    assert not controls.may_claim(0.1)
    assert controls.due()
    _answer(controls, Control(paused=True))
    assert not controls.may_claim(0.2)
    controls.notified(0.2)
    _answer(controls, Control())
    assert controls.may_claim(0.3)


def test_notifications_that_never_stop_hold_the_claims_back_no_longer_than_a_moment() -> None:
    from django_pgoutbox.worker.controls import NOTICE_HOLD

    controls = Controls(SETTINGS, 2)
    _answer(controls, Control())
    now = 0.0
    controls.notified(now)
    while now < 3 * NOTICE_HOLD:  # each read answered after the next notification came
        sent = controls.read()
        now += 0.01
        controls.notified(now)
        controls.answered(Control(), SETTINGS, 2, sent.covers)
        if now >= NOTICE_HOLD:
            assert controls.may_claim(now)
    sent = controls.read()
    controls.notified(now)
    controls.answered(Control(paused=True), SETTINGS, 2, sent.covers)
    assert not controls.may_claim(now)  # a pause read meanwhile applies at once


def test_a_pause_gives_back_the_suspect_that_waits_to_run_alone() -> None:
    """A suspect claimed before the pause waits for the attempt beside it to end: it has not
    started, so the pause gives it back rather than start it alone once that attempt ends."""
    from django_pgoutbox.worker.claims import RecordAndClaim
    from django_pgoutbox.worker.leases import GiveBack, MarkAlone
    from tests.unit.fakes import Harness, claim_row

    harness = Harness()
    harness.start_up()
    harness.answer(RecordAndClaim, rows=[claim_row(), claim_row(suspect=True)])
    harness.step()
    (running,) = harness.threads.submitted
    harness.threads.begin(running)
    suspect = harness.runner._suspects.held
    assert suspect is not None
    harness.runner.controls_changed()
    harness.step()
    harness.answer(ReadControl, Control(paused=True))
    harness.step()
    harness.threads.finish(running)
    for _ in range(5):
        harness.step(1.0)
        for request in list(harness.lanes[0].sent):
            if isinstance(request, MarkAlone):
                harness.answer(MarkAlone, True)
            elif isinstance(request, GiveBack):
                harness.answer(GiveBack, len(request.keys))
            elif isinstance(request, RecordAndClaim):
                harness.answer(RecordAndClaim, rows=[])
            else:
                break
    assert suspect not in harness.threads.submitted, "a paused queue started a suspect"


def test_a_read_of_the_row_waiting_on_a_lock_does_not_hold_the_claims() -> None:
    """A migration holds ``queue_controls``: a read of the queue's row (a notification's, the
    listener's connect) waits on the first lane. Once it is slow and the notification's hold
    is over, the jobs enqueued meanwhile are claimed on another lane, not after the lock."""
    from django_pgoutbox.worker.claims import RecordAndClaim
    from django_pgoutbox.worker.controls import NOTICE_HOLD
    from django_pgoutbox.worker.lanes import SLOW_FIRST
    from tests.unit.fakes import Harness

    harness = Harness()
    harness.start_up()
    harness.answer(RecordAndClaim, rows=[])  # the queue is idle
    harness.step()
    harness.runner.controls_changed()
    harness.step()
    assert isinstance(harness.lanes[0].sent[-1], ReadControl)  # it waits: never answered
    harness.runner.wake()  # jobs enqueued
    harness.step()
    assert harness.runner._next_deadline() <= harness.clock.now + max(SLOW_FIRST, NOTICE_HOLD)
    harness.step(max(SLOW_FIRST, NOTICE_HOLD))
    claims = [r for r in harness.lanes[1].sent if isinstance(r, RecordAndClaim) and r.limit]
    assert claims, "the claims waited for the read of the queue's row"
