"""When the seek claim runs, and when the full claim (``worker.claims.SeekPolicy``; the relay's
``worker.relay.EventSeekPolicy``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker.relay import EventSeekPolicy
from django_pgoutbox.worker.seek import (
    CHEAP_FULL_CLAIM,
    FULL_CLAIM_INTERVAL,
    FULL_CLAIM_SPACING,
    SeekPolicy,
)
from tests.unit.fakes import claim_row

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(count: int, *, priority: int = 0) -> list[ClaimRow]:
    return [
        claim_row()._replace(priority=priority, run_at=T0 + timedelta(seconds=n), id=uuid.uuid4())
        for n in range(count)
    ]


def test_the_first_claim_is_full_and_a_full_batch_sets_the_mark() -> None:
    policy = SeekPolicy()
    assert not policy.seek(0.0)
    claimed = rows(3)
    policy.claimed(claimed, 3, full=True, seconds=0.001, now=0.0)
    assert policy.seek(0.01)
    assert policy.params()["mark_run_at"] == claimed[-1].run_at
    assert policy.params()["mark_id"] == claimed[-1].id


def test_the_mark_is_the_last_row_in_claim_order() -> None:
    policy = SeekPolicy()
    high, low = rows(1, priority=5)[0], rows(1, priority=0)[0]
    policy.claimed([low, high], 2, full=True, seconds=0.001, now=0.0)
    assert policy.params()["mark_priority"] == 0


def test_a_full_claim_comes_back_every_interval() -> None:
    policy = SeekPolicy()
    policy.claimed(rows(3), 3, full=True, seconds=0.001, now=0.0)
    assert policy.seek(FULL_CLAIM_INTERVAL / 2)
    assert not policy.seek(FULL_CLAIM_INTERVAL)


def test_a_short_seek_or_a_wake_up_brings_the_full_claim_as_soon_as_spacing_allows() -> None:
    policy = SeekPolicy()
    policy.claimed(rows(3), 3, full=True, seconds=0.001, now=0.0)
    policy.claimed(rows(1), 3, full=False, seconds=0.001, now=0.002)
    assert policy.seek(0.001 * FULL_CLAIM_SPACING / 2)
    assert not policy.seek(0.001 * FULL_CLAIM_SPACING)
    policy.claimed(rows(3), 3, full=True, seconds=0.001, now=1.0)
    policy.behind()
    assert not policy.seek(1.0 + 0.001 * FULL_CLAIM_SPACING)


def test_a_slow_full_claim_spaces_the_next_one() -> None:
    """However slow a held horizon makes the full claim, it takes about a tenth of the time."""
    policy = SeekPolicy()
    policy.claimed(rows(3), 3, full=True, seconds=2.0, now=0.0)
    policy.behind()
    assert policy.seek(2.0 * FULL_CLAIM_SPACING - 0.1)
    assert not policy.seek(2.0 * FULL_CLAIM_SPACING)


def test_the_standby_claim_is_full_while_full_claims_are_cheap() -> None:
    policy = SeekPolicy()
    policy.claimed(rows(3), 3, full=True, seconds=CHEAP_FULL_CLAIM / 2, now=0.0)
    assert policy.seek(0.001)
    assert not policy.seek(0.001, standby=True)
    policy.claimed(rows(3), 3, full=True, seconds=CHEAP_FULL_CLAIM * 2, now=1.0)
    assert policy.seek(1.001, standby=True)


def events(count: int, *, start: int = 0) -> list[SimpleNamespace]:
    """Claimed outbox events: only their claim index key (occurred_at, id) counts."""
    return [
        SimpleNamespace(occurred_at=T0 + timedelta(seconds=start + n), id=uuid.uuid4())
        for n in range(count)
    ]


def test_the_relays_mark_is_the_first_event_of_its_last_claim() -> None:
    """The events that claim skipped (the next of an aggregate it took) sort after the first:
    the next seek takes them."""
    policy = EventSeekPolicy()
    claimed = events(3)
    policy.claimed(claimed[::-1], 3, full=True, seconds=0.001, now=0.0)
    assert policy.params() == {"mark_occurred_at": T0, "mark_id": claimed[0].id}
    later = events(3, start=10)
    policy.claimed(later, 3, full=False, seconds=0.001, now=0.01)
    assert policy.params()["mark_occurred_at"] == later[0].occurred_at


def test_the_relays_mark_never_moves_back() -> None:
    """A full claim that took an event behind the mark (a retry, a late commit) leaves the mark
    where it was: the next seeks do not cross again what was projected since."""
    policy = EventSeekPolicy()
    policy.claimed(events(2, start=10), 2, full=True, seconds=0.001, now=0.0)
    mark = policy.mark
    policy.claimed(events(1) + events(1, start=20), 2, full=True, seconds=0.001, now=1.0)
    assert policy.mark == mark


def test_the_relay_follows_the_same_rules_for_the_full_claim() -> None:
    policy = EventSeekPolicy()
    assert not policy.seek(0.0)
    policy.claimed(events(3), 3, full=True, seconds=0.001, now=0.0)
    assert policy.seek(FULL_CLAIM_INTERVAL / 2)
    policy.claimed([], 3, full=False, seconds=0.001, now=0.002)  # empty: look behind the mark
    assert not policy.seek(0.001 * FULL_CLAIM_SPACING)
