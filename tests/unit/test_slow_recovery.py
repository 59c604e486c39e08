"""Lease recovery made slow by a held xmin horizon (its scan of ``jobs_leased_idx`` steps over
an entry for every job claimed since the horizon was held): it neither holds the claims back nor
takes more than a tenth of a lane's time."""

from __future__ import annotations

import pytest

from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.lanes import SLOW_FIRST
from django_pgoutbox.worker.leases import RECOVERY_SPACING, Recover
from tests.unit.fakes import Harness


def claims_on(h: Harness, lane: int) -> list[RecordAndClaim]:
    return [r for r in h.sent(RecordAndClaim, lane) if r.limit]


def recoveries(h: Harness) -> list[Recover]:
    return h.sent(Recover, 0) + h.sent(Recover, 1)


def answer_claims(h: Harness) -> None:
    """Answer every claim in flight: nothing due (the coordinator reads it at its next turn)."""
    for lane in (0, 1):
        while h.sent(RecordAndClaim, lane):
            h.answer(RecordAndClaim, lane=lane, rows=[])


def test_claims_go_beside_a_slow_recovery() -> None:
    h = Harness()
    h.step()
    [_] = h.sent(Recover, 0)
    assert not claims_on(h, 1)  # a recovery is quick, normally: the claim waits for its lane
    # No message will come: the coordinator wakes for the moment the recovery becomes slow.
    assert h.runner._next_deadline() == pytest.approx(h.clock.now + SLOW_FIRST)
    h.step(SLOW_FIRST)
    [claim] = claims_on(h, 1)
    assert claim.limit == h.runner.concurrency


def test_the_next_recovery_waits_ten_times_the_last_ones_duration() -> None:
    h = Harness(poll_interval=1.0)
    h.step()
    h.answer(Recover, seconds=2.0)
    h.step()  # the reply is taken: the next recovery 20 s from now
    for _ in range(int(RECOVERY_SPACING * 2.0) - 1):
        h.step(1.0)
        answer_claims(h)
        assert not recoveries(h)
    h.step(1.0)
    assert len(recoveries(h)) == 1


def test_a_quick_recovery_runs_every_poll_interval() -> None:
    h = Harness(poll_interval=1.0)
    h.step()
    h.answer(Recover, seconds=0.01)
    h.step(0.5)
    answer_claims(h)
    h.step(0.6)
    assert len(recoveries(h)) == 1
