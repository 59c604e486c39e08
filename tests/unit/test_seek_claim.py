"""The seek claim in the coordinator (``worker.claims.SeekPolicy`` as ``Claims`` uses it): jobs
that become claimable behind the mark are claimed by a full claim soon after, in burst mode too.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from django_pgoutbox.models import JobStatus
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker.claims import OVERTAKE_AFTER, RecordAndClaim
from django_pgoutbox.worker.seek import FULL_CLAIM_INTERVAL, FULL_CLAIM_SPACING
from tests.unit.fakes import Harness, claim_row

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(n: int = 0, *, priority: int = 0) -> ClaimRow:
    return claim_row()._replace(
        priority=priority, run_at=T0 + timedelta(seconds=n), id=uuid.uuid4()
    )


def burst() -> Harness:
    """A coordinator of ``runworkers --burst``."""
    h = Harness()
    h.runner.burst = True
    return h


def claims(h: Harness) -> list[RecordAndClaim]:
    return claims_on(h, 0)


def claims_on(h: Harness, lane: int) -> list[RecordAndClaim]:
    return [r for r in h.sent(RecordAndClaim, lane) if r.limit]


def test_a_burst_does_not_end_on_a_seek_that_came_back_empty() -> None:
    """A seek finds nothing past the mark: jobs may still be due behind it (a higher priority
    enqueued since, a job given back or skipped as locked). Only a full claim that finds
    nothing ends a burst."""
    h = burst()
    h.start_up()
    [first] = claims(h)
    assert first.mark is None  # the first claim is full
    [attempt] = h.claim([row()])
    h.threads.finish(attempt)
    h.step()
    [seek] = claims(h)
    assert seek.mark is not None
    h.answer(RecordAndClaim, rows=[])
    h.step()
    assert not h.runner._done
    h.step(FULL_CLAIM_SPACING * seek.seconds)
    [full] = claims(h)
    assert full.mark is None
    h.answer(RecordAndClaim, rows=[])
    h.step()
    assert h.runner._done  # a full claim found nothing: the burst ends


def test_after_a_short_seek_the_full_claim_comes_once_the_spacing_allows() -> None:
    """A wake-up (a job of a higher priority, behind the mark) while full claims are slow (a
    held horizon): the seek it brings finds nothing; the full claim follows as soon as the
    spacing allows, not at the next poll (100 s here)."""
    h = Harness()
    h.start_up()
    h.answer(RecordAndClaim, rows=[row(), row(1)], seconds=0.05)  # a slow full claim
    h.step()
    h.runner.wake()
    h.step(0.01)
    [seek] = claims(h)
    assert seek.mark is not None
    h.answer(RecordAndClaim, rows=[])
    h.step()
    assert not claims(h)
    h.step(0.05 * FULL_CLAIM_SPACING)
    [full] = claims(h)
    assert full.mark is None


def test_a_burst_does_not_end_on_the_claim_written_with_a_retry() -> None:
    """A retry with no delay (``Snooze(0)``) is due as soon as it is written, but the claim
    that goes with it in one statement cannot see it (its snapshot predates the outcome): that
    claim, full or not, coming back empty says nothing. The burst claims once more."""
    h = burst()
    h.start_up()
    [attempt] = h.claim([row()])
    h.step(FULL_CLAIM_INTERVAL * 2)  # the next claim is a full one
    h.threads.finish(attempt, JobStatus.RETRYING)
    h.step()
    [written] = claims(h)
    assert (written.mark, len(written.batch)) == (None, 1)
    h.answer(RecordAndClaim, rows=[])
    h.step()
    assert not h.runner._done
    [seek] = claims(h)  # at once: a seek (the last full claim was just now) ...
    assert seek.batch == []
    assert seek.mark is not None
    h.answer(RecordAndClaim, rows=[])
    h.step(FULL_CLAIM_INTERVAL)
    assert not h.runner._done
    [full] = claims(h)  # ... then the full claim, which ends it
    assert (full.batch, full.mark) == ([], None)
    h.answer(RecordAndClaim, rows=[])
    h.step()
    assert h.runner._done


def test_a_queue_limited_as_a_whole_claims_past_its_mark() -> None:
    """``MAX_RUNNING`` or ``RATE_LIMIT`` on the queue cut how many jobs a claim asks for, not
    where it starts: its claims seek past the mark as any queue's do."""
    h = Harness(max_running=5)
    h.start_up()
    [first] = claims(h)
    assert first.mark is None
    [attempt] = h.claim([row()])
    h.threads.finish(attempt)
    h.step()
    [seek] = claims(h)
    assert seek.mark is not None


def test_a_claim_that_the_limit_cut_short_is_not_a_short_seek() -> None:
    """A limited claim that got all the limit let it ask for is not a sign of jobs behind the
    mark: no full claim follows before the limit's own retry."""
    h = Harness(max_running=5)
    h.start_up()
    [attempt] = h.claim([row()])
    h.threads.finish(attempt)
    h.step()
    [seek] = claims(h)
    assert seek.mark is not None
    assert seek.limit > 1
    h.answer(RecordAndClaim, rows=[row(1)], asked=1, retry_in=50.0)
    h.step()
    h.step(FULL_CLAIM_INTERVAL * 2)
    assert not claims(h)


def test_fair_and_per_organization_queues_keep_their_own_claim() -> None:
    for overrides in ({"fair": True}, {"max_running": 2, "limit_by": "organization"}):
        h = Harness(**overrides)
        h.start_up()
        [attempt] = h.claim([row()])
        h.threads.finish(attempt)
        h.step()
        [second] = claims(h)
        assert second.mark is None, overrides


def slow_full_claim(h: Harness) -> RecordAndClaim:
    """A full claim in flight on the first lane, a mark from the claim before it, and every
    thread free: as under a held horizon, where a full claim can take seconds."""
    h.start_up()
    [attempt] = h.claim([row(0)])  # the first claim, full: the mark
    h.threads.finish(attempt)
    h.step(FULL_CLAIM_INTERVAL * 2)
    [full] = claims(h)
    assert full.mark is None
    return full


def test_a_slow_full_claim_is_overtaken_by_a_seek_on_another_lane() -> None:
    """While the full claim steps over dead entries, the threads would run dry: past
    ``OVERTAKE_AFTER`` a seek goes on the second lane, for every free thread, past the mark
    (SKIP LOCKED keeps the two claims' rows apart)."""
    h = Harness()
    slow_full_claim(h)
    # No message will come (the threads are idle): the coordinator wakes for it, though no
    # lane is free until then.
    assert h.runner._next_deadline() == pytest.approx(h.clock.now + OVERTAKE_AFTER)
    h.step(OVERTAKE_AFTER / 2)
    assert not claims_on(h, 1)
    h.step(OVERTAKE_AFTER / 2)
    [seek] = claims_on(h, 1)
    assert seek.mark is not None
    assert seek.mark["mark_run_at"] == T0
    assert seek.limit == h.runner.concurrency
    attempts = h.claim([row(1), row(2)], lane=1)
    assert len(attempts) == 2  # the threads run them while the full claim goes on


def test_an_overtaking_seek_that_comes_back_short_does_not_spin() -> None:
    """Nothing past the mark: the next seek waits for a wake-up or the poll, not the next
    turn (the full claim in flight looks behind the mark)."""
    h = Harness()
    slow_full_claim(h)
    h.step(OVERTAKE_AFTER)
    assert claims_on(h, 1)
    h.answer(RecordAndClaim, lane=1, rows=[])
    for _ in range(5):
        h.step(0.01)
    assert not claims_on(h, 1)
    h.runner.wake()
    h.step()
    [again] = claims_on(h, 1)
    assert again.mark is not None


def test_the_overtaken_full_claim_keeps_the_mark_the_seeks_reached() -> None:
    """It came back short: nothing is claimable behind the seeks' mark, and the next seek
    starts there, not back over the rows they claimed."""
    h = Harness()
    full = slow_full_claim(h)
    h.step(OVERTAKE_AFTER)
    h.claim([row(5), row(6)], lane=1)
    h.claim([row(3)], lane=0)  # short: the full claim found one job, behind the seeks' mark
    assert full.limit > 1
    seeker = h.runner._claims.seek
    assert seeker is not None
    assert seeker.mark is not None
    assert seeker.mark[1] == T0 + timedelta(seconds=6)


def test_the_overtaken_full_claim_that_came_back_full_moves_the_mark_back() -> None:
    """It came back full: jobs may wait just past its last row, behind the seeks' mark."""
    h = Harness()
    full = slow_full_claim(h)
    h.step(OVERTAKE_AFTER)
    h.claim([row(5), row(6)], lane=1)
    h.claim([row(1 + n) for n in range(full.limit)], lane=0)
    seeker = h.runner._claims.seek
    assert seeker is not None
    assert seeker.mark is not None
    assert seeker.mark[1] == T0 + timedelta(seconds=full.limit)


def test_a_queue_that_claims_one_at_a_time_is_never_overtaken() -> None:
    """A queue with a limit claims under its lock: a second claim would only wait for it."""
    h = Harness(max_running=50)
    slow_full_claim(h)
    h.step(OVERTAKE_AFTER * 10)
    assert not claims_on(h, 1)


def test_while_a_full_claim_is_in_flight_the_next_claim_seeks() -> None:
    """A backlog sends a claim on the second lane while the full claim is in flight: it seeks
    (a second full claim would step over the same dead entries, to find the same jobs)."""
    h = Harness()
    h.start_up()
    [first] = claims(h)
    attempts = h.claim([row(n) for n in range(first.limit)])  # it came back full: a backlog
    h.threads.finish(attempts[0])
    h.step(FULL_CLAIM_INTERVAL * 2)
    [full] = claims(h)
    assert full.mark is None
    h.threads.finish(attempts[1])
    h.step()
    [second] = claims_on(h, 1)
    assert second.mark is not None


def handed() -> ClaimRow:
    """A row its parents' outcomes handed over (RECORD_HANDOFF_AND_CLAIM): no mark."""
    return claim_row()._replace(id=uuid.uuid4(), run_at=None)


def test_a_handed_row_never_becomes_the_mark() -> None:
    """The steps a completion hands over were not read from the claim index: the mark stays
    the last row the claim read there, and a claim that got only handed rows keeps it."""
    h = Harness()
    h.start_up()
    first, _ = h.claim([row(0), row(1)])
    policy = h.runner._claims.seek
    assert policy is not None
    assert policy.mark is not None
    assert policy.mark[1] == T0 + timedelta(seconds=1)
    h.threads.finish(first)
    h.step()
    [seek] = claims(h)
    assert seek.mark is not None
    # every row of the limit handed over: the claim asked the index for none
    h.answer(RecordAndClaim, rows=[handed() for _ in range(seek.limit)], asked=0)
    h.step()
    assert policy.mark[1] == T0 + timedelta(seconds=1)


def test_a_seek_that_the_handoff_filled_is_not_short() -> None:
    """A seek asked the index for what the handoff left of its limit: it is short only if the
    index gave fewer than that. One that got all of it brings no full claim forward."""
    h = Harness()
    h.start_up()
    first, _ = h.claim([row(0), row(1)])
    h.threads.finish(first)
    h.step()
    [seek] = claims(h)
    assert seek.mark is not None
    rows = [handed()] + [row(2 + n) for n in range(seek.limit - 1)]
    h.answer(RecordAndClaim, rows=rows, asked=seek.limit - 1)
    h.step()
    policy = h.runner._claims.seek
    assert policy is not None
    assert policy.mark is not None
    assert policy.mark[1] == T0 + timedelta(seconds=seek.limit)
    assert h.runner._claims.next_poll > h.clock.now + FULL_CLAIM_INTERVAL / 2
