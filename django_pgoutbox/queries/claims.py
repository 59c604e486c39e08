"""The claim and the outcomes: the columns a claim returns, CLAIM_JOBS, RECORD_OUTCOMES and
RECORD_AND_CLAIM."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NamedTuple

#: What a claim returns of each job, in order: (name, SQL expression, type). CLAIM_JOBS's and
#: RECORD_AND_CLAIM's RETURNING, RECORD_AND_CLAIM's typed NULLs, their ORDER BY and ``ClaimRow``
#: are all made from it, so that they cannot disagree.
CLAIM_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("id", "j.id", "uuid"),
    ("job_type", "j.job_type", "text"),
    ("payload", "j.payload::text", "text"),
    ("attempt", "j.attempts", "integer"),
    ("max_attempts", "j.max_attempts", "integer"),
    ("organization_id", "j.organization_id", "uuid"),
    ("queue", "j.queue", "text"),
    ("priority", "j.priority", "integer"),
    ("created_at", "j.created_at", "timestamptz"),
    # run_at '-infinity' (a row written by hand) is due now: no infinite subtraction
    (
        "waited",
        "CASE WHEN isfinite(j.run_at) THEN extract(epoch FROM now() - j.run_at)::float8 ELSE 0 END",
        "float8",
    ),
    ("worker_ids", "j.worker_ids::text", "text"),
    # a suspect: lost with its worker twice in a row (see RECOVER_EXPIRED_LEASES)
    (
        "suspect",
        "coalesce(j.last_error_code = 'lease_expired' AND j.lost_attempts >= 2, false)",
        "boolean",
    ),
)


class ClaimRow(NamedTuple):
    """One row of a claim (CLAIM_JOBS, the claimed rows of RECORD_AND_CLAIM, the fair and
    limited claims), by the names of ``CLAIM_COLUMNS``."""

    id: uuid.UUID
    job_type: str
    payload: str  # JSON text
    attempt: int
    max_attempts: int
    organization_id: uuid.UUID | None
    queue: str
    priority: int
    created_at: datetime
    waited: float  # seconds from run_at to the claim, by the database clock
    worker_ids: str  # JSON text: the worker of each attempt, this one last
    suspect: bool


def _claim_position(name: str, offset: int = 0) -> int:
    """The 1-based position of a claim column, for ORDER BY (``offset``: columns before it)."""
    return [column[0] for column in CLAIM_COLUMNS].index(name) + 1 + offset


CLAIM_RETURNING = ",\n          ".join(expression for _, expression, _ in CLAIM_COLUMNS)
#: A claim's order, the order the worker starts the jobs in: priority, then the wait since
#: ``run_at`` (the longest wait is the earliest ``run_at``), ``created_at``, id.
_CLAIM_ORDER = "{} DESC, {} DESC, {}, {}"


def _claim_order(offset: int = 0) -> str:
    return _CLAIM_ORDER.format(
        *(_claim_position(name, offset) for name in ("priority", "waited", "created_at", "id"))
    )


# The claim's two halves, shared by CLAIM_JOBS and RECORD_AND_CLAIM. Named parameters: queue
# text, limit int (candidates); worker_id text, lease seconds float (the update).
_CLAIM_CANDIDATES = """
    SELECT id
    FROM jobs
    WHERE queue = %(queue)s
      AND status IN ('pending', 'retrying')
      AND run_at <= now()
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
"""
_CLAIM_UPDATE = f"""
UPDATE jobs AS j
SET status = 'leased',
    locked_at = now(),
    locked_by = w.id,
    lease_expires_at = now() + make_interval(secs => w.lease),
    attempts = least(j.attempts, 2147483646) + 1,  -- a row at the int4 limit fails no claim
    worker_ids = j.worker_ids || jsonb_build_array(w.id),
    alone_attempt = NULL  -- only MARK_ALONE of this attempt says it counts
FROM (SELECT %(worker_id)s::text AS id, %(lease)s::float8 AS lease) AS w
WHERE j.id = ANY(ARRAY(SELECT id FROM candidates))
RETURNING {CLAIM_RETURNING}
"""

#: Lease up to ``limit`` due jobs of one queue, in priority order, and count the attempt.
#:
#: Named parameters: queue text, limit int, worker_id text, lease seconds float.
#:
#: The CTE is MATERIALIZED on purpose: it is the fence that makes ``LIMIT`` apply once. Were
#: the planner to fold it into the UPDATE as a join, the row locks could be taken on more rows
#: than the limit, or the subquery re-run. ``SKIP LOCKED`` lets concurrent workers claim disjoint
#: rows without waiting on each other. ``WHERE`` and ``ORDER BY`` match ``jobs_claim_idx``
#: exactly, so the claim reads the first due rows of the queue in order with no sort. The
#: statement commits on its own (autocommit): the lease is visible before any handler runs.
#:
#: The UPDATE finds the candidates by ``id = ANY(ARRAY(...))``, a probe of the primary key for each,
#: rather than by joining ``candidates``: for that join the planner hashed the whole table (every
#: completed job too), a sequential scan at every claim that grew with the table
#: (docs/benchmarks.md, "What profiling found", item 16). The probe returns the rows in id order, so
#: they are sorted back into claim order (``_CLAIM_ORDER``).
CLAIM_JOBS = f"""
WITH candidates AS MATERIALIZED ({_CLAIM_CANDIDATES}),
claimed AS ({_CLAIM_UPDATE})
SELECT * FROM claimed
ORDER BY {_claim_order()}
"""

#: Record the outcomes of many attempts in one statement; returns the ids it applied.
#:
#: Named parameters: ids uuid[], attempts int[], statuses text[] ('completed', 'retrying', 'dead' or
#: 'cancelled'), gives_back_attempt boolean[], delays float8[] (seconds, for 'retrying'),
#: codes text[], summaries text[], results text[] (JSON), worker_id text.
#:
#: Fenced: a row is written only while it is still leased by this worker *for this attempt*.
#: ``attempts`` is the fencing token: every claim increments it, so once a lease expired and
#: another worker claimed the job, the stale worker's (id, attempt) matches nothing and its
#: outcome is dropped. A job whose expired lease was only recovered (status no longer 'leased')
#: is protected by the status test. The caller compares the returned ids with what it sent.
#:
#: Two rules of ``retry.py``'s table are enforced here. An outcome whose ``gives_back_attempt``
#: is true (the handler raised ``Snooze``) does not count: ``attempts`` goes down by one, so the
#: next claim counts the same attempt number again. A job whose cancellation was requested while
#: the attempt ran ends 'cancelled', whatever the outcome (a result it returned is kept).
RECORD_OUTCOMES = """
UPDATE jobs AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE u.status END,
    attempts = CASE WHEN u.gives_back_attempt THEN j.attempts - 1 ELSE j.attempts END,
    run_at = CASE WHEN u.status = 'retrying'
                  THEN now() + make_interval(secs => u.delay) ELSE j.run_at END,
    completed_at = CASE WHEN u.status = 'completed' AND j.cancel_requested_at IS NULL
                        THEN now() END,
    finished_at = CASE WHEN u.status = 'retrying'
                            AND j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
    last_error_code = CASE
        WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
        WHEN u.status = 'completed' THEN j.last_error_code
        ELSE u.code END,
    last_error_summary = CASE
        WHEN j.cancel_requested_at IS NOT NULL
            THEN left('cancelled on request while attempt ' || j.attempts || ' ran; it ended: '
                      || u.status || coalesce(' (' || u.summary || ')', ''), 1000)
        WHEN u.status = 'completed' THEN j.last_error_summary
        ELSE u.summary END,
    result = u.result::jsonb,
    lease_expires_at = NULL
FROM (
    -- one outcome per attempt, the first sent, whatever the batch holds (a batch with two
    -- would have PostgreSQL apply either to the one row)
    SELECT DISTINCT ON (id, attempt)
        id, attempt, status, gives_back_attempt, delay, code, summary, result
    FROM unnest(
        %(ids)s::uuid[], %(attempts)s::integer[], %(statuses)s::text[],
        %(gives_back_attempt)s::boolean[], %(delays)s::float8[], %(codes)s::text[],
        %(summaries)s::text[], %(results)s::text[]
    ) WITH ORDINALITY AS u(
        id, attempt, status, gives_back_attempt, delay, code, summary, result, sent
    )
    ORDER BY id, attempt, sent
) AS u
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %(worker_id)s
  AND j.status = 'leased'
RETURNING j.id
"""

# The typed NULLs that pad RECORD_AND_CLAIM's outcome rows to the claim's columns.
_CLAIM_NULLS = ", ".join(f"NULL::{kind}" for _, _, kind in CLAIM_COLUMNS[1:])

#: RECORD_OUTCOMES and CLAIM_JOBS in one statement: one round trip per dispatcher turn.
#:
#: Named parameters: those of RECORD_OUTCOMES and those of CLAIM_JOBS (``worker_id`` is both's).
#:
#: Rows whose first column is false are the ids RECORD_OUTCOMES applied; rows whose first
#: column is true are the claimed jobs, with CLAIM_JOBS's columns. The two updates touch
#: disjoint rows (outcomes go to 'leased' rows, claims take 'pending' and 'retrying' ones), as
#: one statement must; the claim's snapshot predates the outcomes, so a job retried by this
#: very statement waits for the next claim, as its future ``run_at`` demands anyway.
RECORD_AND_CLAIM = f"""
WITH recorded AS ({RECORD_OUTCOMES}),
candidates AS MATERIALIZED ({_CLAIM_CANDIDATES}),
claimed AS ({_CLAIM_UPDATE})
SELECT false, id, {_CLAIM_NULLS}
FROM recorded
UNION ALL
SELECT true, * FROM claimed
ORDER BY 1, {_claim_order(offset=1)}  -- the outcomes' ids, then the claimed jobs as CLAIM_JOBS
"""
