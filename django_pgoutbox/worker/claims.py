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
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker import outcomes
from django_pgoutbox.worker.execute import Outcome

if TYPE_CHECKING:
    from django_pgoutbox.worker.attempt import Attempt
    from django_pgoutbox.worker.state import QueueState

#: The prefetch aims at this many seconds of work, at the queue's recent pace.
PREFETCH_SECONDS = 0.1
#: The pace is measured over windows of this many seconds (the first one a quarter as long).
PACE_WINDOW = 0.2
#: The longest wait (seconds) before a rate-limited queue looks for new tokens.
RATE_LIMIT_RETRY_CAP = 1.0


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
    #: How soon (seconds) a claim that a limit cut short should be tried again (inf: none did).
    retry_in: float = math.inf

    def run(self, connection: psycopg.Connection[Any]) -> RecordAndClaim:
        conf, batch, limit = self.settings, self.batch, self.limit
        special = conf.fair or conf.limited
        claim_params = claim(conf, limit, self.worker_id)
        started = time.perf_counter()
        rows: list[tuple[Any, ...]] = []
        with connection.cursor() as cursor:
            if batch and limit > 0 and not special:
                try:
                    queries.send(
                        cursor,
                        "RECORD_AND_CLAIM",
                        outcomes.params(batch, self.worker_id) | claim_params,
                    )
                except outcomes.STATEMENT_ERRORS as error:
                    # Nothing of it was written, the claim neither: the outcomes one by one,
                    # then the claim, once.
                    self.written, self.applied = outcomes.record_one_by_one(
                        cursor, batch, error, self.worker_id, conf.name
                    )
                    queries.send(cursor, "CLAIM_JOBS", claim_params)
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
                    rows, self.retry_in = claim_limited(connection, conf, limit, self.worker_id)
                elif limit > 0:
                    queries.send(cursor, "CLAIM_JOBS", claim_params)
                    rows = cursor.fetchall()
        self.rows = [ClaimRow._make(row) for row in rows]
        elapsed = time.perf_counter() - started
        metrics.BATCH_DB_DURATION.observe(elapsed, role="jobs")
        if limit > 0:
            metrics.CLAIM_DURATION.observe(elapsed, queue=conf.name)
        return self


def claim(conf: QueueSettings, limit: int, worker_id: str) -> dict[str, Any]:
    """CLAIM_JOBS's parameters."""
    return {"queue": conf.name, "limit": limit, "worker_id": worker_id, "lease": conf.lease_seconds}


def claim_limited(
    connection: psycopg.Connection[Any], conf: QueueSettings, limit: int, worker_id: str
) -> tuple[list[tuple[Any, ...]], float]:
    """The claim of a queue with FAIR, MAX_RUNNING or RATE_LIMIT; see ``queries``.

    Returns the claimed rows and, when a limit cut the claim short, how soon to try again.
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
                return [], min(retry_in, conf.poll_interval)
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
    return rows, retry_in


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
        #: Wake the coordinator to claim more once fewer jobs than this wait for a thread.
        self.low_water = concurrency
        self.wanted = True  # woken, or the poll interval passed, since the last claim
        self.backlog = False  # the last claim came back full: the queue may hold more
        self.next_poll = now
        self._flush_at: float | None = None
        #: While outcomes gather for one statement: until when (the coordinator's deadline).
        self.gathering_until: float | None = None

    def poll(self, now: float) -> None:
        """At each turn: once the poll interval has passed, claim even with nothing written."""
        self.gathering_until = None
        if now >= self.next_poll:
            self.wanted = True
            self.next_poll = now + self.settings.poll_interval

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
            limit = max(0, self.concurrency + prefetch - state.queued - state.reserved)
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
        return self.take(state, self.concurrency + prefetch)

    def take(self, state: QueueState, limit: int) -> RecordAndClaim:
        """The request that writes the outcomes waiting and claims ``limit`` jobs."""
        batch, attempts = state.take_batch(limit)
        self._flush_at = None
        self.pace.count(len(batch))
        if limit:
            self.wanted = False
        return RecordAndClaim(self.settings, self.worker_id, batch, limit, attempts)

    def recorded(self, request: RecordAndClaim, now: float) -> None:
        if request.limit:
            self.backlog = len(request.rows) == request.limit
            self.next_poll = now + min(self.settings.poll_interval, request.retry_in)
