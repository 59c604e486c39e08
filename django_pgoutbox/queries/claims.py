"""The claim and the outcomes: the columns a claim returns, CLAIM_JOBS, RECORD_OUTCOMES and
RECORD_AND_CLAIM."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NamedTuple

from django_pgoutbox.queries.attempts import append_attempt

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
    # the claim index's key is (priority, run_at, created_at, id): the seek claim's mark. An
    # infinite run_at (written by hand) has no Python value: such a row reads as 1970, a mark
    # lower than its place, which only makes the next seek start earlier than it could.
    ("run_at", "greatest(j.run_at, '1970-01-01 00:00:00+00'::timestamptz)", "timestamptz"),
    # jobs wait for it (workflows): its completion may hand them over (RECORD_HANDOFF_AND_CLAIM)
    ("dependants", "j.has_dependants IS TRUE", "boolean"),
    # the W3C context of the span that enqueued it (``tracing``): NULL, the common case, costs a
    # row a bit of its null bitmap (docs/benchmarks.md, "What profiling found", item 34)
    ("trace_context", "j.trace_context::text", "text"),
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
    #: The seek claim's mark is the last row's key. None for a job that its parents' outcomes
    #: handed over (RECORD_HANDOFF_AND_CLAIM): it was not read from the claim index.
    run_at: datetime | None = None
    dependants: bool = False  # jobs wait for it
    trace_context: str | None = None  # JSON text: see ``tracing``


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
def _claim_jobs(candidates: str) -> str:
    """A claim of the rows ``candidates`` selects (from the head of the index, or the mark)."""
    return f"""
WITH candidates AS MATERIALIZED ({candidates}),
claimed AS ({_CLAIM_UPDATE})
SELECT * FROM claimed
ORDER BY {_claim_order()}
"""


CLAIM_JOBS = _claim_jobs(_CLAIM_CANDIDATES)

# What RECORD_OUTCOMES makes of an outcome ``u`` of the attempt row ``j`` holds: the job's status,
# and the code and summary of an attempt that did not complete it (a cancellation requested while
# the attempt ran wins over its outcome). Each is written to the row and to the attempt's entry.
_STATUS = "CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE u.status END"
_ERROR_CODE = "CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE u.code END"
_ERROR_SUMMARY = """CASE WHEN j.cancel_requested_at IS NOT NULL
        THEN left('cancelled on request while attempt ' || j.attempts || ' ran; it ended: '
                  || u.status || coalesce(' (' || u.summary || ')', ''), 1000)
        ELSE u.summary END"""
# The cause of a job that dies here (the fingerprint of what the row is given), else none: the
# causes page groups dead letters by it (jobs_dead_cause_idx). Worked out for dead rows only.
_DEAD_CAUSE = """CASE WHEN u.status = 'dead' AND j.cancel_requested_at IS NULL
        THEN pgoutbox_error_fingerprint(j.job_type, u.code, u.summary) END"""
# The span of a traced attempt that did not complete its job, for the next attempt's link
# (``tracing``): kept under ``attempt`` beside the enqueuing context; NULL (untraced), nothing.
_ATTEMPT_TRACE = """CASE WHEN u.trace IS NULL THEN j.trace_context
        ELSE coalesce(CASE WHEN jsonb_typeof(j.trace_context) = 'object' THEN j.trace_context END,
                      '{}'::jsonb) || jsonb_build_object('attempt', u.trace::jsonb) END"""
_LOGGED = append_attempt(
    row="j.",
    # a snooze gives its attempt back: said apart from a failure that spends one
    outcome=f"CASE WHEN u.gives_back_attempt AND j.cancel_requested_at IS NULL THEN 'snoozed'"
    f" ELSE {_STATUS} END",
    code=_ERROR_CODE,
    summary=_ERROR_SUMMARY,
)

#: Record the outcomes of many attempts in one statement; returns the ids it applied.
#:
#: Named parameters: ids uuid[], attempts int[], statuses text[] ('completed', 'retrying', 'dead' or
#: 'cancelled'), gives_back_attempt boolean[], delays float8[] (seconds, for 'retrying'),
#: codes text[], summaries text[], results text[] (JSON), progress text[] and meta text[] (JSON,
#: or NULL: the column is left as it is), traces text[] (JSON: a traced attempt's span, for the
#: next attempt's link; or NULL), worker_id text, notify boolean. ``progress``, ``meta`` and
#: ``traces`` may be empty arrays, which ``unnest`` pads with NULLs: the common case.
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
#:
#: Each row is found by its primary key. ``(status = 'leased') IS TRUE`` means ``status =
#: 'leased'`` but does not match ``jobs_leased_idx``'s predicate: with the plain test, the
#: planner, sure from statistics that few rows are leased, read that index in a merge join; while
#: a transaction holds the xmin horizon every job a worker claimed leaves a dead entry there, and
#: each batch of outcomes then cost more than the last (issue 31). Without that index, and sure
#: from statistics that no row has this worker's ``locked_by`` (a new worker id), the planner
#: chose a sequential scan of the whole table for a batch of a few hundred; so the rows are
#: probed by ``id = ANY(ARRAY(...))``, as the claim's update does. The probes lock the rows in id
#: order, as RENEW_LEASES does: a renewal and an outcome write of the same jobs on two lanes that
#: locked them in different orders deadlocked.
#:
#: Every end of an attempt but a completion appends its entry to ``attempt_log``
#: (``queries.attempts``), built from the row being updated: no other row or index is read, and
#: the column is in no index, so the plan above holds. A completion leaves the column as it is.
#: A death writes its cause to ``dead_cause`` (an entry of ``jobs_dead_cause_idx``, which a
#: death writes anyway: the index is of dead jobs).
#:
#: ``progress`` and ``meta`` take the last values the attempt set (``ctx.set_progress()``,
#: ``ctx.set_meta()``) in the statement that ends it: a WRITE_PROGRESS of older values in flight
#: on another lane either comes first, or finds the row no longer leased and writes nothing.
#:
#: With ``notify``, the jobs it finished (completed, dead, cancelled) that someone waits for
#: (``Job.wait()``: ``job_waiters``) are told by one notification per 800 of them
#: (``queries.results``), sent at commit; a batch no one waits on sends none.
_RECORD_OUTCOMES_CTES = f"""
u AS MATERIALIZED (
    -- one outcome per attempt, the first sent, whatever the batch holds (a batch with two
    -- would have PostgreSQL apply either to the one row)
    SELECT DISTINCT ON (id, attempt)
        id, attempt, status, gives_back_attempt, delay, code, summary, result, progress, meta,
        trace
    FROM unnest(
        %(ids)s::uuid[], %(attempts)s::integer[], %(statuses)s::text[],
        %(gives_back_attempt)s::boolean[], %(delays)s::float8[], %(codes)s::text[],
        %(summaries)s::text[], %(results)s::text[], %(progress)s::text[], %(meta)s::text[],
        %(traces)s::text[]
    ) WITH ORDINALITY AS u(
        id, attempt, status, gives_back_attempt, delay, code, summary, result, progress, meta,
        trace, sent
    )
    ORDER BY id, attempt, sent
),
recorded AS (
    UPDATE jobs AS j
    SET status = {_STATUS},
        attempts = CASE WHEN u.gives_back_attempt THEN j.attempts - 1 ELSE j.attempts END,
        run_at = CASE WHEN u.status = 'retrying'
                      THEN now() + make_interval(secs => u.delay) ELSE j.run_at END,
        completed_at = CASE WHEN u.status = 'completed' AND j.cancel_requested_at IS NULL
                            THEN now() END,
        finished_at = CASE WHEN u.status = 'retrying'
                                AND j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
        last_error_code = CASE WHEN u.status = 'completed' AND j.cancel_requested_at IS NULL
                               THEN j.last_error_code ELSE {_ERROR_CODE} END,
        last_error_summary = CASE WHEN u.status = 'completed' AND j.cancel_requested_at IS NULL
                                  THEN j.last_error_summary ELSE {_ERROR_SUMMARY} END,
        attempt_log = CASE WHEN u.status = 'completed' AND j.cancel_requested_at IS NULL
                           THEN j.attempt_log ELSE {_LOGGED} END,
        dead_cause = {_DEAD_CAUSE},
        result = u.result::jsonb,
        progress = coalesce(u.progress::jsonb, j.progress),
        meta = coalesce(u.meta::jsonb, j.meta),
        trace_context = {_ATTEMPT_TRACE},
        lease_expires_at = NULL,
        -- Unchanged. A job with dependants turns the row trigger jobs_note_settled off
        -- (``pgoutbox.noting``) as it is written, before the trigger's WHEN is tested: this
        -- statement notes it (``written``), set-based. A batch of plain jobs sets nothing, and
        -- the statement trigger jobs_settle_noted is then not called either.
        has_dependants = CASE WHEN j.has_dependants
                              THEN set_config('pgoutbox.noting', 'on', true) = 'on'
                              ELSE j.has_dependants END
    FROM u
    WHERE j.id = ANY(ARRAY(SELECT id FROM u))  -- by primary key, in id order: see above
      AND j.id = u.id
      AND j.attempts = u.attempt
      AND j.locked_by = %(worker_id)s
      AND (j.status = 'leased') IS TRUE  -- not jobs_leased_idx: see above
    RETURNING j.id, j.status, j.has_dependants, j.priority, j.run_at
),
-- What follows the outcomes (migration 0016's pgoutbox_outcomes_written): the notifications of
-- the finished jobs someone waits for, and the note of those with dependants. One function
-- call, whose own statements are planned once a session: in this statement, planned at every
-- run, they cost a twentieth of a drain (docs/benchmarks.md, "What profiling found", 29). No
-- call at all for a batch of plain jobs that no one waits for, the common case.
written AS (
    SELECT CASE
        WHEN bool_or(has_dependants) OR (%(notify)s AND EXISTS (SELECT 1 FROM job_waiters))
        THEN pgoutbox_outcomes_written(
            array_agg(id), array_agg(status), array_agg(coalesce(has_dependants, false)),
            %(notify)s
        )
        ELSE 0
    END AS n
    FROM recorded
)
"""
RECORD_OUTCOMES = f"""
WITH {_RECORD_OUTCOMES_CTES}
SELECT id FROM recorded
WHERE (SELECT n FROM written) >= 0  -- read, so that it runs
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
def _record_and_claim(candidates: str, *, handoff: bool = False) -> str:
    handed = handed_rows = ""
    if handoff:  # (see "the handoff" below)
        # both made from the candidates' text: a change there that these no longer match
        # fails here, at import, not as a claim that locks or takes too many
        assert "FOR UPDATE SKIP LOCKED" in candidates, candidates
        assert "LIMIT %(limit)s" in candidates, candidates
        # the first job due in claim order, unlocked: its priority is the highest due
        first_due = candidates.replace("FOR UPDATE SKIP LOCKED", "").replace(
            "LIMIT %(limit)s", "LIMIT 1"
        )
        # the claim from the index: what the handoff left of the limit
        candidates = candidates.replace(
            "LIMIT %(limit)s", "LIMIT greatest(%(limit)s - (SELECT count(*) FROM handed), 0)"
        )
        handed = _HANDED.format(first_due=first_due) + ",\n"
        handed_rows = "SELECT true, * FROM handed\nUNION ALL\n"
    return f"""
WITH {_RECORD_OUTCOMES_CTES},
{handed}candidates AS MATERIALIZED ({candidates}),
claimed AS ({_CLAIM_UPDATE})
SELECT false, id, {_CLAIM_NULLS}
FROM recorded
WHERE (SELECT n FROM written) >= 0
UNION ALL
{handed_rows}SELECT true, * FROM claimed
ORDER BY 1, {_claim_order(offset=1)}  -- the outcomes' ids, then the claimed jobs as CLAIM_JOBS
"""


RECORD_AND_CLAIM = _record_and_claim(_CLAIM_CANDIDATES)

# -- the seek claim (issue 31) ---------------------------------------------------------------------
#
# With a transaction holding the xmin horizon, every claimed row leaves a dead entry at the head
# of ``jobs_claim_idx`` that neither vacuum nor the index's own hints can remove: CLAIM_JOBS then
# steps over all of them, one heap visit each, at every claim. The seek claim starts past a
# *mark*, the index key (priority, run_at, created_at, id) of the last job this coordinator
# claimed, so the scan only crosses the entries claimed since (by its own and other workers).
# Rows that become claimable *behind* the mark (an older run_at, a higher priority, a job given
# back or recovered, one skipped as locked) are the full claim's (CLAIM_JOBS): the worker runs it
# at least every few seconds and whenever the seek comes back short, within a time budget.

# The candidates past the mark: the rest of the mark's priority after the mark, then the lower
# priorities, each in claim order. Named parameters: those of _CLAIM_CANDIDATES and
# mark_priority int, mark_run_at timestamptz, mark_created_at timestamptz, mark_id uuid.
#
# Two branches because the index is (queue, priority DESC, run_at, created_at, id): a row
# comparison over all four would mix directions, which a btree cannot take as a scan bound.
# With ``priority`` fixed, ``(run_at, created_at, id) > (...)`` is one bound of the index scan;
# the outer ``LIMIT`` stops the append before the second branch runs once the first has enough.
_SEEK_CANDIDATES = """
    SELECT id FROM (
        SELECT id
        FROM jobs
        WHERE queue = %(queue)s
          AND status IN ('pending', 'retrying')
          AND run_at <= now()
          AND priority = %(mark_priority)s
          AND (run_at, created_at, id) > (%(mark_run_at)s, %(mark_created_at)s, %(mark_id)s)
        ORDER BY priority DESC, run_at, created_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS past_the_mark
    UNION ALL
    SELECT id FROM (
        SELECT id
        FROM jobs
        WHERE queue = %(queue)s
          AND status IN ('pending', 'retrying')
          AND run_at <= now()
          AND priority < %(mark_priority)s
        ORDER BY priority DESC, run_at, created_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS lower_priorities
    LIMIT %(limit)s
"""

#: CLAIM_JOBS from the mark on (see above). Named parameters: CLAIM_JOBS's and the mark's.
SEEK_CLAIM_JOBS = _claim_jobs(_SEEK_CANDIDATES)

#: RECORD_AND_CLAIM with the seek claim. Named parameters: RECORD_AND_CLAIM's and the mark's.
RECORD_AND_SEEK_CLAIM = _record_and_claim(_SEEK_CANDIDATES)

# -- the handoff (issue 24) --------------------------------------------------------------------
#
# A workflow's step becomes claimable when its last parent completes (migration 0016's statement
# trigger, ``pgoutbox_settle``): one more write of its row, and of its entries in the claim
# indexes, before a claim writes it again. When the worker that completes the parents claims in
# the same statement, the steps they release in its own queue go to it at once: ``handed``
# leases them from 'waiting', as the claim would, in one write. Only what the claim could take
# then:
#
# - a step of this queue, due, not being cancelled, every parent it waits for completed by this
#   statement;
# - of a priority no lower than the highest of the jobs due in the queue (past the mark, for the
#   seek claim, which has the same window for a job of a higher priority due behind it) and of
#   those this statement retries at once: jobs of a higher priority come first, as in the
#   claim. Among equals, a workflow's next steps go before jobs not yet started;
# - at most ``limit`` of them, the first in claim order (priority, then age); the claim takes
#   from the index what the handoff left of the limit, and locks no more.
#
# First, every child of the parents completed here is locked, in id order (``waiting``), whatever
# its status in this statement's snapshot: the trigger that then settles those not handed over,
# in a later snapshot, finds them locked already, and this statement takes its locks in id order
# as every other writer of jobs does (migration 0016). (A child that an edge committed since
# the snapshot adds is a job enqueued since: a later UUIDv7, a higher id than the others.)
# Handing over before locking the others held a step while waiting for one of a lower id, which
# ``cancel_workflow()`` locking both in id order could hold: a deadlock. No handoff in a
# statement that also ends a job with dependants dead or cancelled: the trigger's cascade locks
# level by level. The trigger settles the rest as before (a step handed over no longer waits: it
# passes it by). Sent only for a batch that completes a job with dependants
# (``ClaimRow.dependants``): a batch of plain jobs keeps the plain statement and its plan.

# The handed rows' columns: the claim's, with no mark (run_at NULL: not read from the index).
_HANDED_RETURNING = ",\n          ".join(
    "NULL::timestamptz" if name == "run_at" else expression for name, expression, _ in CLAIM_COLUMNS
)
_HANDED = f"""
edges AS MATERIALIZED (
    -- the children of the jobs this statement completed, with how many of their parents it
    -- completed
    SELECT d.child_id AS id, count(*)::integer AS n
    FROM job_dependencies AS d
    WHERE d.parent_id = ANY(ARRAY(
        SELECT id FROM recorded WHERE status = 'completed' AND has_dependants))
      AND NOT EXISTS (
          SELECT 1 FROM recorded WHERE has_dependants AND status IN ('dead', 'cancelled'))
    GROUP BY d.child_id
),
waiting AS MATERIALIZED (
    -- every child, whatever its status: one this snapshot sees cancelled may be waiting again
    -- once locked (a dead parent of it retried meanwhile), and the trigger settles it then
    SELECT j.id, j.priority, j.created_at,
           j.status = 'waiting' AND j.waiting_for <= e.n AND j.queue = %(queue)s
               AND j.run_at <= now() AND j.cancel_requested_at IS NULL AS due
    FROM jobs AS j JOIN edges AS e ON e.id = j.id
    WHERE j.id = ANY(ARRAY(SELECT id FROM edges))  -- by primary key
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
),
handed AS (
    UPDATE jobs AS j
    SET status = 'leased',
        waiting_for = 0,
        run_at = greatest(j.run_at, now()),
        locked_at = now(),
        locked_by = w.id,
        lease_expires_at = now() + make_interval(secs => w.lease),
        attempts = least(j.attempts, 2147483646) + 1,
        worker_ids = j.worker_ids || jsonb_build_array(w.id),
        alone_attempt = NULL
    FROM (SELECT %(worker_id)s::text AS id, %(lease)s::float8 AS lease) AS w
    WHERE j.id = ANY(ARRAY(
        SELECT c.id FROM waiting AS c
        WHERE c.due
          AND c.priority >= coalesce(greatest(
              (SELECT f.priority FROM jobs AS f WHERE f.id = ({{first_due}})),
              (SELECT max(r.priority) FROM recorded AS r
               WHERE r.status = 'retrying' AND r.run_at <= now())
          ), -2147483648)
        ORDER BY c.priority DESC, c.created_at, c.id
        LIMIT %(limit)s))
    RETURNING {_HANDED_RETURNING}
)"""


#: RECORD_AND_CLAIM, and the steps its completions release in this queue handed over (see
#: above). Named parameters: RECORD_AND_CLAIM's.
RECORD_HANDOFF_AND_CLAIM = _record_and_claim(_CLAIM_CANDIDATES, handoff=True)

#: RECORD_AND_SEEK_CLAIM with the handoff. Named parameters: RECORD_AND_SEEK_CLAIM's.
RECORD_HANDOFF_AND_SEEK_CLAIM = _record_and_claim(_SEEK_CANDIDATES, handoff=True)
