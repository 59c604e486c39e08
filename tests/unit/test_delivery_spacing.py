"""When the relay's delivery runner claims: at once after a claim that took deliveries, after
the poll interval after one that took none, and never sooner than ten times the last claim's
duration after it, even when the relay writes deliveries that are due at once."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from django_pgoutbox.conf import get_settings
from django_pgoutbox.worker import deliveries, subscribers
from django_pgoutbox.worker.deliveries import DeliveryRunner


def runner(monkeypatch: pytest.MonkeyPatch, *, claim_seconds: float) -> DeliveryRunner:
    conf = get_settings()
    made = DeliveryRunner(conf.outbox, relay_id="r", using="default", policy=conf.retry)

    def claim() -> list[Any]:
        time.sleep(claim_seconds)
        return []

    monkeypatch.setattr(made, "_claim", claim)
    return made


def waiting(delay: float = 0.0) -> subscribers.Delivery:
    return subscribers.Delivery(uuid.uuid4(), "s", 1, False, delay, "ValueError", "boom")


def test_the_first_claim_is_due_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner(monkeypatch, claim_seconds=0).due(time.monotonic())


def test_an_empty_claim_waits_for_the_poll_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    made = runner(monkeypatch, claim_seconds=0)
    assert made.run_once() == 0
    wait = made.wait(time.monotonic())
    assert 0.5 * made.settings.poll_interval < wait <= made.settings.poll_interval


def test_deliveries_written_bring_the_claim_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    made = runner(monkeypatch, claim_seconds=0)
    made.run_once()
    made.expect([waiting(0.0)])
    assert made.wait(time.monotonic()) < 0.05
    made.run_once()
    made.expect([subscribers.Delivery(uuid.uuid4(), "s", 1, True, 0.0, "x", "dead")])
    assert made.wait(time.monotonic()) > 0.5 * made.settings.poll_interval  # dead: not due


def test_a_slow_claim_spaces_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that took 0.1 s: the next one not before 1 s after it, however due."""
    made = runner(monkeypatch, claim_seconds=0.1)
    made.settings = replace(made.settings, poll_interval=0.01)
    before = time.monotonic()
    made.run_once()
    made.expect([waiting(0.0)])
    # The claim ended 0.1 s after ``before`` or later, and took 0.1 s or more: the next one is
    # 1.1 s after ``before`` at the soonest, however long this machine took to get here.
    now = time.monotonic()
    assert made.wait(now) >= before + 1.1 - now - 0.001
    assert not made.due(now) or now - before >= 1.1


def test_a_claim_error_leaves_the_batch_to_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose delivery failed to run (its connection lost) is due again at once."""
    made = runner(monkeypatch, claim_seconds=0)
    made._batch = ["pending"]  # type: ignore[list-item]
    assert made.due(time.monotonic() - 1000)
    assert deliveries.DeliveryRunner.SPACING == 10.0


def test_a_retry_due_before_the_poll_interval_is_not_forgotten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delivery that failed here (or that the relay wrote) with a 0.3 s back-off, then a claim
    that took others (due again at once) and one that found nothing: the next claim is due when
    the retry is, not a poll interval later."""
    made = runner(monkeypatch, claim_seconds=0)
    made.settings = replace(made.settings, poll_interval=30.0)
    expected = time.monotonic()
    made.expect([waiting(0.3)])
    taken = SimpleNamespace(reclaimed=False)
    monkeypatch.setattr(made, "_claim", lambda: [taken])  # a claim that took one
    monkeypatch.setattr(made, "_deliver", lambda items: None)
    made.run_once()
    assert made.wait(time.monotonic()) < 0.01
    monkeypatch.setattr(made, "_claim", list)  # nothing due yet
    made.run_once()
    # Due when the retry is (0.3 s after it was expected), however long this machine took to
    # get here: not a poll interval later.
    now = time.monotonic()
    assert made.wait(now) <= max(0.0, expected + 0.3 - now) + 0.01
    time.sleep(made.wait(time.monotonic()))
    made.run_once()  # it saw the retry: the poll interval again
    assert made.wait(time.monotonic()) > 20
