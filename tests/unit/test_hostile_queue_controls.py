"""A queue's run-time controls as its coordinator knows them (``worker.controls``), attacked:
reads that fail, notifications that race a read."""

from __future__ import annotations

from django_pgoutbox.conf import QueueSettings
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.controls import Controls

SETTINGS = QueueSettings(name="default", concurrency=2, lease_seconds=30, poll_interval=1)
PASSING = Control(problems=("queue_controls could not be read (LockNotAvailable)",), unread=False)
LASTING = Control(problems=("queue_controls could not be read (UndefinedTable)",), unread=True)


def _answer(controls: Controls, control: Control) -> None:
    controls.read()
    controls.answered(control, SETTINGS, 2)


def test_a_read_that_may_pass_neither_resumes_nor_starts_a_queue() -> None:
    controls = Controls(SETTINGS, 2)
    _answer(controls, PASSING)
    assert not controls.claimable  # at start: nothing claimed until the row is read
    _answer(controls, Control(paused=True))
    _answer(controls, PASSING)
    assert controls.control.paused
    assert not controls.claimable
    _answer(controls, Control())
    assert controls.may_claim


def test_a_read_that_fails_for_good_runs_the_queue_as_its_settings_say() -> None:
    controls = Controls(SETTINGS, 2)
    _answer(controls, LASTING)
    assert controls.may_claim


def test_no_claim_while_a_notified_change_waits_for_its_read() -> None:
    controls = Controls(SETTINGS, 2)
    _answer(controls, Control())
    assert controls.may_claim
    stale = controls.read()  # a periodic read, sent before the notification
    assert stale is not None
    controls.notified()
    assert not controls.may_claim
    controls.answered(Control(), SETTINGS, 2)  # its answer may predate the change
    assert not controls.may_claim
    assert controls.due()
    _answer(controls, Control(paused=True))
    assert not controls.may_claim
    controls.notified()
    _answer(controls, Control())
    assert controls.may_claim
