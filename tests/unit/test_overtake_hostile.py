"""A hostile pass over the overtaken full claim and the slow lease recovery (worker.claims,
worker.leases, worker.runner): each case pinned alone, through the fake coordinator."""

from __future__ import annotations

import psycopg

from django_pgoutbox.worker.claims import OVERTAKE_AFTER, RecordAndClaim
from django_pgoutbox.worker.leases import Recover
from django_pgoutbox.worker.seek import FULL_CLAIM_SPACING
from tests.unit.fakes import Harness
from tests.unit.test_seek_claim import claims_on, row, slow_full_claim


def lost() -> psycopg.OperationalError:
    return psycopg.OperationalError("the connection was lost")


def claims(h: Harness) -> list[RecordAndClaim]:
    return claims_on(h, 0) + claims_on(h, 1)


def test_a_limited_queue_at_its_cap_waits_for_its_retry_after_a_slow_claim() -> None:
    """A queue with MAX_RUNNING claims one claim at a time, under its lock: it is never
    overtaken. A claim that waited on the lock past OVERTAKE_AFTER and found the cap reached
    must not be followed at once by another: the next waits for the limit's retry (or a
    wake-up), as it did before."""
    h = Harness(max_running=50)
    slow_full_claim(h)
    h.step(OVERTAKE_AFTER)  # a turn while the claim waits on the queue's lock
    h.answer(RecordAndClaim, rows=[], asked=0, retry_in=50.0)  # the cap is reached
    h.step()
    assert not claims(h), "claimed again at once, ahead of the limit's retry"


def test_a_fair_queue_does_not_claim_again_at_once_after_a_slow_claim() -> None:
    h = Harness(fair=True)
    slow_full_claim(h)
    h.step(OVERTAKE_AFTER)
    h.answer(RecordAndClaim, rows=[])
    h.step()
    assert not claims(h), "an idle fair queue claimed again at once"


def test_a_short_seek_beside_the_full_claim_brings_the_next_full_claim() -> None:
    """A seek past the mark comes back short while the overtaken full claim is in flight: jobs
    may have become due behind the mark after the full claim's snapshot. Once the full claim is
    back, the next one comes as soon as the spacing allows (docs/workers.md), not at the next
    poll (100 s here)."""
    h = Harness()
    slow_full_claim(h)
    h.step(OVERTAKE_AFTER)
    assert claims_on(h, 1)
    h.answer(RecordAndClaim, lane=1, rows=[])  # nothing past the mark
    h.step()
    h.answer(RecordAndClaim, rows=[], seconds=0.5)  # the full claim, back: nothing either
    h.step()
    assert not claims(h)
    h.step(0.5 * FULL_CLAIM_SPACING)
    sent = claims(h)
    assert sent, "no full claim until the next poll"
    assert [claim.mark for claim in sent] == [None]


def test_a_recovery_due_does_not_take_the_lane_an_overtaken_claim_frees() -> None:
    """A recovery falls due while the full claim is in flight (the coordinator waits for no
    recovery while no lane is free). At the moment the full claim is overtaken, the second lane
    is for the seek that keeps the threads busy: a recovery there (slow, under the same held
    horizon) would leave them dry until one of the two comes back."""
    h = Harness(poll_interval=1.0)
    h.start_up()  # recovery at t0; the next at t0 + 1
    [attempt] = h.claim([row(0)])
    h.threads.finish(attempt)
    h.step(0.9)  # t0 + 0.9: the full claim
    [full] = claims_on(h, 0)
    assert full.mark is None
    h.step(OVERTAKE_AFTER)  # t0 + 1.2: overtaken, and the recovery is due
    assert claims_on(h, 1), f"lane 1 took {h.lanes[1].sent} instead of a seek"


def test_a_failed_recovery_is_not_spaced_by_the_time_it_took_to_fail() -> None:
    """A recovery that failed (its connection lost after a long wait) says nothing of how long
    its scan takes: the next one comes after the poll interval and the lane's back-off, not ten
    times that wait later."""
    h = Harness(poll_interval=1.0)
    h.step()
    [recover] = h.sent(Recover)
    recover.seconds = 30.0
    h.lanes[0].reply(error=lost())
    h.step()
    for _ in range(20):
        h.step(1.0)
        for lane in (0, 1):
            while h.sent(RecordAndClaim, lane):
                h.answer(RecordAndClaim, lane=lane, rows=[])
        if h.sent(Recover, 0) + h.sent(Recover, 1):
            break
    else:
        raise AssertionError("no recovery within 20 s of a failed one")
