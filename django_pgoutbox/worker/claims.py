"""Claims: how many jobs to ask for (the queue's pace), and the statements that claim them.

Each request here runs on a lane's thread and returns what the coordinator needs; the
coordinator alone decides what to send and reads the results.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from django_pgoutbox import metrics, queries
from django_pgoutbox.conf import QueueSettings
from django_pgoutbox.models import JobStatus
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker import outcomes
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.seek import SeekPolicy

if TYPE_CHECKING:
    from django_pgoutbox.worker.attempt import Attempt
    from django_pgoutbox.worker.state import QueueState

#: The prefetch aims at this many seconds of work, at the queue's recent pace.
PREFETCH_SECONDS = 0.1
#: The pace is measured over windows of this many seconds (the first one a quarter as long).
PACE_WINDOW = 0.2
#: The longest wait (seconds) before a rate-limited queue looks for new tokens.
RATE_LIMIT_RETRY_CAP = 1.0
#: A full claim still in flight after this many seconds is overtaken: the claims sent meanwhile
#: seek past the mark on another lane, as if it had claimed nothing (the threads' prefetch is
#: spent long before; a held horizon can make a full claim take seconds: docs/operations.md).
OVERTAKE_AFTER = 3 * PREFETCH_SECONDS


class Pace:
    """The queue's recent pace (completions per second, smoothed), and the prefetch it calls
    for: about ``PREFETCH_SECONDS`` of work beyond the busy threads. The coordinator's own."""

    def __init__(self, prefetch_max: int, now: float) -> None:
        #: Prefetch only where claims are not shaped by fairness or limits: jobs held by one
        #: worker would count against a cap, or skip the organizations' turns.
        self.prefetch_max = prefetch_max
        self.pace = 0.0
        self._count = 0
        self._since = now

    def count(self, finished: int) -> None:
        """Count ``finished`` completions (their outcomes are being written)."""
        self._count += finished

    def prefetch(self, now: float) -> int:
        """How many jobs to prefetch now."""
        if not self.prefetch_max:
            return 0
        elapsed = now - self._since
        # The first measure comes soon, so that a drain starts at its pace within a few turns;
        # later ones over longer windows, for a steadier figure.
        if elapsed >= (PACE_WINDOW if self.pace else PACE_WINDOW / 4):
            recent = self._count / elapsed
            self.pace = recent if not self.pace else (self.pace + recent) / 2
            self._count, self._since = 0, now
        return min(self.prefetch_max, int(self.pace * PREFETCH_SECONDS))


@dataclass(eq=False)
class RecordAndClaim:
    """Write ``batch`` and claim up to ``limit`` jobs: one statement (RECORD_AND_CLAIM) when
    there is both to do, or, for a queue with limits or fairness, the outcomes then a claim
    under the queue's lock (``claim_limited``)."""

    settings: QueueSettings
    worker_id: str
    batch: list[Outcome]
    limit: int
    #: The attempt of each outcome of ``batch`` (the coordinator's, not read here).
    attempts: list[Attempt] = field(default_factory=list)
    # -- the result, filled in on the lane ------------------------------------------------------
    written: list[Outcome] = field(default_factory=list)
    applied: list[uuid.UUID] = field(default_factory=list)
    rows: list[ClaimRow] = field(default_factory=list)
    #: The seek claim's parameters (``SeekPolicy.params``), or None: the full claim.
    mark: dict[str, Any] | None = None
    #: How soon (seconds) a claim that a limit cut short should be tried again (inf: none did).
    retry_in: float = math.inf
    #: How many jobs the claim asked the database for: ``limit``, or fewer where a queue's limit
    #: cut it (None: as many as ``limit``).
    asked: int | None = None
    #: How long the statements took (seconds).
    seconds: float = 0.0

    def run(self, connection: psycopg.Connection[Any]) -> RecordAndClaim:
        conf, batch, limit = self.settings, self.batch, self.limit
        special = conf.fair or conf.limited
        claim_params = claim(conf, limit, self.worker_id)
        seek = self.mark is not None
        if self.mark is not None:
            claim_params |= self.mark
        claim_name = "SEEK_CLAIM_JOBS" if seek else "CLAIM_JOBS"
        started = time.perf_counter()
        rows: list[tuple[Any, ...]] = []
        with connection.cursor() as cursor:
            if batch and limit > 0 and not special:
                # The steps that completions release may be handed over with the claim
                # (queries.RECORD_HANDOFF_AND_CLAIM): only a batch that completes a job with
                # dependants sends that statement.
                handoff = "HANDOFF_AND_" if self.hands_off() else "AND_"
                try:
                    queries.send(
                        cursor,
                        f"RECORD_{handoff}SEEK_CLAIM" if seek else f"RECORD_{handoff}CLAIM",
                        outcomes.params(batch, self.worker_id) | claim_params,
                    )
                except outcomes.STATEMENT_ERRORS as error:
                    # Nothing of it was written, the claim neither: the outcomes one by one,
                    # then the claim, once.
                    self.written, self.applied = outcomes.record_one_by_one(
                        cursor, batch, error, self.worker_id, conf.name
                    )
                    queries.send(cursor, claim_name, claim_params)
                    rows = cursor.fetchall()
                else:
                    self.written = batch
                    for is_claim, *row in cursor.fetchall():
                        if is_claim:
                            rows.append(row)
                        else:
                            self.applied.append(row[0])
            else:
                if batch:
                    self.written, self.applied = outcomes.record(
                        cursor, batch, self.worker_id, conf.name
                    )
                if limit > 0 and special:
                    rows, self.retry_in, self.asked = claim_limited(
                        connection, conf, limit, self.worker_id, self.mark
                    )
                elif limit > 0:
                    queries.send(cursor, claim_name, claim_params)
                    rows = cursor.fetchall()
        self.rows = [ClaimRow._make(row) for row in rows]
        handed = self.handed()
        if handed:  # the claim asked the index for what the handoff left of the limit
            self.asked = limit - handed
        elapsed = self.seconds = time.perf_counter() - started
        metrics.BATCH_DB_DURATION.observe(elapsed, role="jobs")
        if limit > 0:
            metrics.CLAIM_DURATION.observe(elapsed, queue=conf.name)
        return self

    def hands_off(self) -> bool:
        """Whether the batch completes a job that others wait for (a workflow's step): the
        statement that writes it may then hand them over (RECORD_HANDOFF_AND_CLAIM)."""
        return any(
            outcome.status == JobStatus.COMPLETED and attempt.row.dependants
            for outcome, attempt in zip(self.batch, self.attempts, strict=False)
        )

    def handed(self) -> int:
        """How many of the rows were handed over by the outcomes rather than claimed from the
        index (``ClaimRow.run_at`` None)."""
        return sum(1 for row in self.rows if row.run_at is None)

    def indexed(self) -> list[ClaimRow]:
        """The rows claimed from the index: the seek's mark is the last of them."""
        return [row for row in self.rows if row.run_at is not None]


def claim(conf: QueueSettings, limit: int, worker_id: str) -> dict[str, Any]:
    """CLAIM_JOBS's parameters."""
    return {"queue": conf.name, "limit": limit, "worker_id": worker_id, "lease": conf.lease_seconds}


def claim_limited(
    connection: psycopg.Connection[Any],
    conf: QueueSettings,
    limit: int,
    worker_id: str,
    mark: dict[str, Any] | None = None,
) -> tuple[list[tuple[Any, ...]], float, int]:
    """The claim of a queue with FAIR, MAX_RUNNING or RATE_LIMIT; see ``queries``. A queue
    limited as a whole claims past ``mark`` when given (SEEK_CLAIM_JOBS, see ``SeekPolicy``);
    fair and per-organization claims take their own order and never seek.

    Returns the claimed rows, how soon to try again when a limit cut the claim short, and how
    many jobs it asked for.
    """
    per_org = conf.limit_by == "organization"
    rate = conf.rate_limit
    burst = max(1.0, rate or 0.0)
    retry_in = math.inf
    with connection.transaction(), connection.cursor() as cursor:
        if conf.limited:
            cursor.execute(queries.CLAIM_LOCK, [conf.name])
        wanted = limit
        if conf.limited and not per_org:
            cursor.execute(
                queries.QUEUE_ALLOWANCE, {"queue": conf.name, "rate": rate, "burst": burst}
            )
            running, tokens = cursor.fetchone() or (0, None)
            if conf.max_running is not None:
                limit = min(limit, conf.max_running - running)
            if rate is not None:
                available = burst if tokens is None else float(tokens)
                limit = min(limit, math.floor(available))
                if limit < wanted:
                    retry_in = min(RATE_LIMIT_RETRY_CAP, (1 - available % 1) / rate)
            if limit <= 0:
                return [], min(retry_in, conf.poll_interval), 0
        if conf.fair or per_org:
            cursor.execute(queries.FAIR_PLAN)
            cursor.execute(
                queries.FAIR_CLAIM if conf.fair else queries.ORGANIZATION_LIMITED_CLAIM,
                {
                    "queue": conf.name,
                    "limit": limit,
                    "worker_id": worker_id,
                    "lease": conf.lease_seconds,
                    "max_running": conf.max_running if per_org else None,
                    "rate": rate if per_org else None,
                    "burst": burst if per_org else None,
                },
            )
        elif mark is not None:
            queries.send(cursor, "SEEK_CLAIM_JOBS", claim(conf, limit, worker_id) | mark)
        else:
            queries.send(cursor, "CLAIM_JOBS", claim(conf, limit, worker_id))
        rows = cursor.fetchall()
        if rate is not None and rows:
            counts: dict[str, int] = {}
            for row in rows:
                key = conf.name
                if per_org:
                    key = f"{conf.name}/{ClaimRow._make(row).organization_id or 'none'}"
                counts[key] = counts.get(key, 0) + 1
            cursor.execute(
                queries.TAKE_TOKENS,
                {
                    "keys": list(counts),
                    "counts": list(counts.values()),
                    "rate": rate,
                    "burst": burst,
                },
            )
        if per_org and rate is not None and len(rows) < wanted:
            # Some organization may be out of tokens: look again when one may have refilled.
            retry_in = min(RATE_LIMIT_RETRY_CAP, 1 / rate)
    return rows, retry_in, limit


#: Outcomes wait at most this long (seconds) to be written with others in one statement.
FLUSH_DELAY = 0.005
#: ... or until this many have gathered.
FLUSH_SIZE = 500


class Claims:
    """When a queue claims and how much, and the outcomes that go with each claim: the
    coordinator's own (``next`` is called at each turn, ``recorded`` with each result)."""

    def __init__(self, settings: QueueSettings, concurrency: int, worker_id: str, now: float):
        self.settings = settings
        self.concurrency = concurrency
        self.worker_id = worker_id
        #: A queue with FAIR or a limit claims under the queue's lock, one claim at a time.
        self.one_at_a_time = settings.fair or settings.limited
        self.pace = Pace(0 if self.one_at_a_time else settings.prefetch, now)
        #: Where the next claim starts: past the mark, or the full claim (a queue with FAIR or
        #: limits per organization always runs its own claim, in its own order).
        own_order = settings.fair or settings.limit_by == "organization"
        self.seek: SeekPolicy | None = None if own_order else SeekPolicy()
        #: Wake the coordinator to claim more once fewer jobs than this wait for a thread.
        self.low_water = concurrency
        self.wanted = True  # woken, or the poll interval passed, since the last claim
        self.backlog = False  # the last claim came back full: the queue may hold more
        self.next_poll = now
        self._flush_at: float | None = None
        #: While outcomes gather for one statement: until when (the coordinator's deadline).
        self.gathering_until: float | None = None
        #: The full claim in flight, if any, when it was sent, and whether a seek overtook it.
        self._full: RecordAndClaim | None = None
        self._full_sent = 0.0
        self._overtaken = False
        #: When the full claim in flight may be overtaken, until that turn has come.
        self._overtake_at: float | None = None
        #: A seek came back short while it was in flight (jobs may be due behind the mark that
        #: its snapshot predates): the next full claim as soon as the spacing allows.
        self._short_beside = False

    def configure(self, settings: QueueSettings) -> None:
        """Claim with ``settings`` from now on (the queue was resized at run time: a limit set or
        lifted); the claim in flight, if any, goes on with the settings it was made with."""
        self.settings = settings
        self.one_at_a_time = settings.fair or settings.limited
        self.pace.prefetch_max = 0 if self.one_at_a_time else settings.prefetch
        own_order = settings.fair or settings.limit_by == "organization"
        self.seek = None if own_order else (self.seek or SeekPolicy())
        self.wanted = True

    def poll(self, now: float) -> None:
        """At each turn: once the poll interval has passed, claim even with nothing written."""
        self.gathering_until = None
        if now >= self.next_poll:
            self.wanted = True
            self.next_poll = now + self.settings.poll_interval
        if self._overtake_at is not None and now >= self._overtake_at:
            self._overtake_at = None
            self.wanted = True  # the threads may have run dry waiting for it

    def next(
        self, now: float, state: QueueState, *, claimable: bool, hurry: bool
    ) -> tuple[list[Outcome], int] | None:
        """The outcomes to write now and how many jobs to claim with them, or None (nothing
        to send, or the outcomes gather for more: ``hurry``, a renewal asked by a handler
        waits). The caller sends them (``take``) on a free lane."""
        limit = 0
        claimable = claimable and not (self.one_at_a_time and state.claims_in_flight)
        if claimable and (self.wanted or state.outcomes or self.backlog):
            prefetch = self.pace.prefetch(now)
            # Claim again while half the prefetch is still waiting, so that the threads never
            # run dry during the round trip.
            self.low_water = max(self.concurrency, prefetch // 2)
            reserved = state.reserved
            if self._full is not None and self.overtaking(now):
                reserved -= self._full.limit  # claimed beside it, past the mark
            limit = max(0, self.concurrency + prefetch - state.queued - reserved)
        if not state.outcomes and not limit:
            return None
        if state.outcomes and not hurry:
            if self._flush_at is None:
                self._flush_at = now + FLUSH_DELAY
            # While the threads have enough work, let more outcomes gather for one statement.
            if (
                now < self._flush_at
                and len(state.outcomes) < FLUSH_SIZE
                and state.queued - self.concurrency >= self.low_water
            ):
                self.gathering_until = self._flush_at
                return None
        return state.outcomes, limit

    def standby(self, now: float, state: QueueState) -> RecordAndClaim:
        """The claim to leave on a lane while the queue is idle (``standby``): for every
        thread, and the prefetch."""
        prefetch = self.pace.prefetch(now)
        self.low_water = max(self.concurrency, prefetch // 2)
        return self.take(state, self.concurrency + prefetch, now, standby=True)

    def take(
        self, state: QueueState, limit: int, now: float, *, standby: bool = False
    ) -> RecordAndClaim:
        """The request that writes the outcomes waiting and claims ``limit`` jobs (``standby``:
        the claim an idle queue's first lane holds for the next wake-up, see ``SeekPolicy``)."""
        batch, attempts = state.take_batch(limit)
        self._flush_at = None
        self.pace.count(len(batch))
        mark = None
        if limit:
            self.wanted = False
            # A full claim in flight already looks behind the mark: a second adds nothing.
            if (
                self.seek is not None
                and self.seek.mark is not None
                and (self.seek.seek(now, standby=standby) or self._full is not None)
            ):
                mark = self.seek.params()
        request = RecordAndClaim(self.settings, self.worker_id, batch, limit, attempts, mark=mark)
        if self._full is not None and mark is not None:
            self._overtaken = True
        elif limit and mark is None and not standby and self._may_overtake():
            self._full, self._full_sent, self._overtaken = request, now, False
            self._overtake_at, self._short_beside = now + OVERTAKE_AFTER, False
        return request

    def _may_overtake(self) -> bool:
        """Whether a full claim sent now may be overtaken (``overtaking``): not on a queue that
        claims one at a time, nor before there is a mark (its wake-up would only claim again)."""
        return not self.one_at_a_time and self.seek is not None and self.seek.mark is not None

    def overtaking(self, now: float) -> bool:
        """Whether the full claim in flight is overtaken now (``OVERTAKE_AFTER``): a claim may
        go beside it, past the mark. Never on a queue that claims one at a time (its claims
        wait for each other on the queue's lock), nor before there is a mark."""
        return (
            self._full is not None
            and now >= self._full_sent + OVERTAKE_AFTER
            and self.seek is not None
            and self.seek.mark is not None
            and not self.one_at_a_time
        )

    def answered(self, request: RecordAndClaim) -> bool:
        """``request`` came back (written, failed, or given back unsent): whether a seek
        overtook it (``recorded`` needs to know)."""
        if request is not self._full:
            return False
        self._full = self._overtake_at = None
        return self._overtaken

    def woken(self) -> None:
        """A wake-up: claim now, and look behind the mark too (the new jobs may sort before it:
        a higher priority, an older ``run_at``)."""
        self.wanted = True
        if self.seek is not None:
            self.seek.behind()

    def deadlines(self) -> list[float]:
        """When to claim if nothing comes first: the poll, the end of gathering outcomes."""
        until = self.gathering_until
        return [self.next_poll] if until is None else [self.next_poll, until]

    def overtake_deadline(self, now: float) -> float | None:
        """When the full claim in flight will be overtaken, if that is still to come. (It
        frees a lane of its own: the coordinator must wake for it though no lane is free.)"""
        at = self._overtake_at
        return at if at is not None and now < at and not self.one_at_a_time else None

    def nothing_due(self, request: RecordAndClaim) -> bool:
        """Whether ``request``'s claim says that nothing is due (a burst may end). Only a full
        claim can tell: a seek sees nothing behind its mark (``recorded`` has the full claim
        follow a short one). Nor can a claim that wrote outcomes putting a job back to wait:
        its snapshot predates them (``Snooze(0)`` is due at once), so it asks for one more."""
        if not request.limit or request.mark is not None or request.rows:
            return False
        if request.retry_in != math.inf:
            return False
        if any(outcome.status == JobStatus.RETRYING for outcome in request.written):
            self.wanted = True
            return False
        return True

    def recorded(self, request: RecordAndClaim, now: float, *, overtaken: bool = False) -> None:
        """``request`` went through (``overtaken``: seeks went beside it, see ``answered``)."""
        asked = request.limit if request.asked is None else request.asked
        indexed = request.indexed()
        if asked and self.seek is not None:  # (a limit that let nothing be claimed ran no claim)
            self.seek.claimed(
                indexed,
                asked,
                full=request.mark is None,
                seconds=request.seconds,
                now=now,
                overtaken=overtaken,
            )
        if request.limit:
            self.backlog = len(request.rows) == request.limit
            self.next_poll = now + min(self.settings.poll_interval, request.retry_in)
            short_seek = request.mark is not None and len(indexed) < asked
            if short_seek and self._full is not None:
                self._short_beside, short_seek = True, False  # (taken up once it is back)
            elif overtaken and self._short_beside:
                short_seek = True
            if self.seek is not None and short_seek:
                # A short seek: jobs may be due behind the mark, which no wake-up will announce
                # again. The full claim as soon as the spacing allows, not at the next poll
                # (once the full claim it overtook, if any, is back: its snapshot predates it).
                self.next_poll = min(self.next_poll, self.seek.next_full)
