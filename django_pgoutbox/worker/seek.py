"""Where a claim starts: past its mark (the seek claim), or from the head of the claim index
(the full claim). The policy that decides, ``SeekPolicy``, is a queue coordinator's own
(``claims.Claims``), or the relay's (``relay.EventSeekPolicy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The seek claim's full claim (CLAIM_JOBS) runs at least this often (seconds), to take the jobs
#: that became claimable behind the mark ...
FULL_CLAIM_INTERVAL = 0.1
#: ... and no sooner than this many times its own last duration after it: however many dead
#: entries a held horizon leaves ahead of the mark, full claims take at most about a tenth of a
#: lane's time.
FULL_CLAIM_SPACING = 10.0
#: A full claim faster than this (seconds) is cheap: no held horizon makes it step over much.
CHEAP_FULL_CLAIM = 0.005


def claim_order(mark: tuple[Any, ...]) -> tuple[Any, ...]:
    """A job mark's place in claim order (the claim index's): the highest priority first."""
    priority, *rest = mark
    return (-priority, *rest)


class SeekPolicy:
    """When a claim starts at its mark (SEEK_CLAIM_JOBS, SEEK_CLAIM_EVENTS) and when from the
    start of the claim index (CLAIM_JOBS, CLAIM_EVENTS: the *full* claim); the coordinator's own,
    or the relay's.

    The mark is a key of the claim index (``mark_of``): for jobs, (priority, run_at, created_at,
    id) of the last job claimed. A full claim runs when there is no mark, every
    ``FULL_CLAIM_INTERVAL``, and as soon as ``FULL_CLAIM_SPACING`` allows after a seek came back
    short (nothing due past the mark: the queue may still hold jobs behind it) or a wake-up
    (``behind``).
    """

    #: The seek statement's parameters, one per field of the mark.
    MARK_NAMES: tuple[str, ...] = ("mark_priority", "mark_run_at", "mark_created_at", "mark_id")

    def __init__(self) -> None:
        self.mark: tuple[Any, ...] | None = None
        self.next_full = 0.0  # when the next full claim is due
        self.earliest_full = 0.0  # no full claim before this (the spacing)
        self.full_seconds = 0.0  # how long the last full claim took

    def seek(self, now: float, *, standby: bool = False) -> bool:
        """Whether the next claim seeks (else it is a full claim). The claim an idle queue holds
        for its next wake-up (``standby``) is a full claim while full claims are cheap: the job
        that wakes it may sort before the mark (a higher priority), and it should not wait."""
        if standby and self.full_seconds < CHEAP_FULL_CLAIM:
            return False
        return self.mark is not None and now < self.next_full

    def params(self) -> dict[str, Any]:
        assert self.mark is not None
        return dict(zip(self.MARK_NAMES, self.mark, strict=True))

    def mark_of(self, rows: Sequence[Any]) -> tuple[Any, ...]:
        """The mark after a claim that took ``rows`` (at least one): the last in claim order."""
        last = max(rows, key=lambda r: claim_order((r.priority, r.run_at, r.created_at, r.id)))
        return (last.priority, last.run_at, last.created_at, last.id)

    def behind(self) -> None:
        """Rows may have become claimable behind the mark: a full claim as soon as allowed."""
        self.next_full = min(self.next_full, self.earliest_full)

    def claimed(
        self,
        rows: Sequence[Any],
        limit: int,
        *,
        full: bool,
        seconds: float,
        now: float,
        overtaken: bool = False,
    ) -> None:
        """After a claim of ``limit`` that returned ``rows`` in ``seconds``. A full claim that
        seeks overtook (``overtaken``) and that came back short leaves nothing claimable behind
        the mark the seeks reached: the mark stays there, rather than go back over the rows
        they claimed (dead index entries, while the horizon is held)."""
        if rows:
            mark, current = self.mark_of(rows), self.mark
            keep = (
                overtaken
                and len(rows) < limit
                and current is not None
                and claim_order(mark) <= claim_order(current)
            )
            if not keep:
                self.mark = mark
        if full:
            self.full_seconds = seconds
            self.earliest_full = now + FULL_CLAIM_SPACING * seconds
            self.next_full = max(now + FULL_CLAIM_INTERVAL, self.earliest_full)
        elif len(rows) < limit:
            self.behind()
