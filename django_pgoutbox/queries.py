"""Every SQL statement of the package, named and commented, in one place.

The rest of the code calls these by name. Each statement's comment gives its parameters: positional
``%s`` placeholders in the order given, or, where it says "Named parameters" (long statements, and
those that use a value twice), ``%(name)s`` placeholders passed as a dict. Arrays are passed as
Python lists. A statement sent with binary parameters has ``%b`` (``%(name)b``) instead.

SQL that stays elsewhere, and why:

- ``admin.EstimatedCountPaginator.count`` runs ``EXPLAIN (FORMAT JSON)`` on the SQL that Django
  builds for the admin page's queryset at run time: only that prefix is fixed.
- ``worker.listener`` composes ``LISTEN`` with ``psycopg.sql.Identifier``: a channel is an
  identifier, which no parameter can carry.
- ``migrations/`` hold the schema's ``RunSQL``: a migration is history, and must not change when
  this module does.
- The ORM's queries (the admin's pages, a heartbeat row deleted at stop, ``scheduler.cursors()``,
  the models' managers) are Django's to write.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

# -- enqueue -------------------------------------------------------------------------------------

# The row insert and the wake-up that both enqueue statements share.
_INSERT_JOB_ROWS = """INSERT INTO jobs (
        id, organization_id, queue, job_type, payload, idempotency_key,
        priority, run_at, max_attempts
    )
    SELECT r.id, r.organization_id, r.queue, r.job_type, r.payload::jsonb, r.idempotency_key,
           r.priority, COALESCE(r.run_at, now()) + make_interval(secs => r.delay), r.max_attempts
    FROM unnest(
        %s::uuid[], %s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[],
        %s::integer[], %s::timestamptz[], %s::float8[], %s::integer[]
    ) AS r(id, organization_id, queue, job_type, payload, idempotency_key,
           priority, run_at, delay, max_attempts)"""
# Wake the workers of each queue that got a row, once per queue. Parameters: channel, notify.
_WAKE_QUEUES = """woken AS (
    SELECT pg_notify(%s, queue) FROM (SELECT DISTINCT queue FROM inserted) AS q WHERE %s
)"""

#: Insert many jobs in one statement and wake the workers of each queue that got one.
#:
#: Parameters: ids uuid[], organization_ids uuid[], queues text[], job_types text[],
#: payloads text[] (JSON), idempotency_keys text[], priorities int[], run_ats timestamptz[]
#: (NULL = now), delays float8[] (seconds), max_attempts int[], channel text, notify boolean.
#:
#: Rows are passed as parallel arrays, so 5,000 jobs cost one statement with twelve parameters.
#: ``ON CONFLICT ... DO NOTHING`` on ``jobs_idempotency_uq`` makes a repeated key a no-op, also
#: against a concurrent transaction inserting the same key (the insert waits for it, then skips);
#: the caller then reads the existing row. ``run_at`` is computed from the database clock.
#: ``pg_notify`` runs once per distinct queue among the rows actually inserted, inside the
#: caller's transaction, so listeners hear of it only at commit and never after a rollback;
#: PostgreSQL also folds identical notifications of one transaction into one.
ENQUEUE_JOBS = f"""
WITH inserted AS (
    {_INSERT_JOB_ROWS}
    ON CONFLICT (organization_id, job_type, idempotency_key)
        WHERE idempotency_key IS NOT NULL
        DO NOTHING
    RETURNING id, queue, run_at, created_at
),
{_WAKE_QUEUES}
SELECT id, run_at, created_at, (SELECT count(*) FROM woken) FROM inserted
"""

#: ENQUEUE_JOBS for rows without idempotency keys, which cannot conflict: nothing per row comes
#: back, only the transaction's ``now()``, from which the caller computes each row's ``run_at`` and
#: ``created_at`` as the defaults do. Same parameters as ENQUEUE_JOBS, sent in binary (``%b``):
#: psycopg then writes the arrays without quoting each element (docs/benchmarks.md, "What profiling
#: found", item 5). It needs a cursor with server-side parameters (``db.server_side_cursor``).
ENQUEUE_JOBS_UNKEYED = f"""
WITH inserted AS (
    {_INSERT_JOB_ROWS}
    RETURNING queue
),
{_WAKE_QUEUES}
SELECT now(), (SELECT count(*) FROM woken)
""".replace("%s", "%b")

#: Run before COPY_JOBS in its transaction: the transaction's ``now()``, from which the client
#: computes each row's ``run_at`` as the column's default would.
COPY_JOBS_NOW = "SELECT now()"

#: Run after COPY_JOBS: wake the workers of each queue that got jobs (at commit, as always).
#:
#: Parameters: channel text, queues text[]. Sent in binary.
WAKE_QUEUES = "SELECT count(pg_notify(%b, q)) FROM unnest(%b::text[]) AS q"

#: Many jobs without idempotency keys, in COPY's binary format, a row per job: id,
#: organization_id, queue, job_type, payload (jsonb), priority, run_at, max_attempts.
#:
#: ``enqueue_many`` and the relay's deferred jobs use it for batches of ``COPY_MIN_ROWS`` and more.
#: The client packs each row with ``struct`` (no arrays for psycopg to dump element by element in
#: Python), streams it while it checks the next items, and the server writes the rows in groups
#: without a plan or ``unnest``; binary rather than text spares it parsing each value
#: (docs/benchmarks.md, "What profiling found", item 11). Rows with keys cannot use it: COPY has no
#: ``ON CONFLICT``. ``created_at`` is the column's default.
COPY_JOBS = """COPY jobs (
    id, organization_id, queue, job_type, payload, priority, run_at, max_attempts
) FROM STDIN (FORMAT BINARY)"""

# The one-row insert and its RETURNING, shared by ENQUEUE_JOB and ENQUEUE_JOB_UNKEYED.
_INSERT_JOB_ROW = """INSERT INTO jobs (
    id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at, max_attempts
)
VALUES (%b, %b, %b, %b, %b::jsonb, %b, %b, COALESCE(%b::timestamptz, now())
        + make_interval(secs => %b::float8), %b)"""
_INSERT_JOB_ROW_RETURNING = (
    "RETURNING run_at, created_at, CASE WHEN %b THEN pg_notify(%b, queue)::text END"
)

#: One job: ENQUEUE_JOBS for a single row, the common case of ``enqueue()``.
#:
#: Parameters: id uuid, organization_id uuid, queue text, job_type text, payload text (JSON),
#: idempotency_key text, priority int, run_at timestamptz (NULL = now), delay float8 (seconds),
#: max_attempts int, notify boolean, channel text. Sent in binary, like ENQUEUE_JOBS_UNKEYED.
#:
#: A plain ``VALUES`` row and ``pg_notify`` in ``RETURNING``: no ``unnest``, no CTE, no
#: ``DISTINCT``, which the server spends more time planning and running than inserting one row
#: (docs/benchmarks.md, "What profiling found", item 8). A repeated key returns no row; the caller
#: then reads the job that holds it.
ENQUEUE_JOB = f"""
{_INSERT_JOB_ROW}
ON CONFLICT (organization_id, job_type, idempotency_key)
    WHERE idempotency_key IS NOT NULL
    DO NOTHING
{_INSERT_JOB_ROW_RETURNING}
"""

#: ENQUEUE_JOB for a job without an idempotency key, with the same parameters: it cannot conflict
#: (``jobs_idempotency_uq`` holds only rows with a key), and ``ON CONFLICT`` makes the insert
#: speculative, a check and a confirmation more per row (docs/benchmarks.md, "What profiling found",
#: item 18).
ENQUEUE_JOB_UNKEYED = f"""
{_INSERT_JOB_ROW}
{_INSERT_JOB_ROW_RETURNING}
"""

# -- claim and outcomes --------------------------------------------------------------------------

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


_CLAIM_RETURNING = ",\n          ".join(expression for _, expression, _ in CLAIM_COLUMNS)
#: A claim's order, the order the worker starts the jobs in: priority, then the wait since
#: ``run_at`` (the longest wait is the earliest ``run_at``), ``created_at``, id.
_CLAIM_ORDER = "{} DESC, {} DESC, {}, {}"


def _claim_order(offset: int = 0) -> str:
    return _CLAIM_ORDER.format(
        *(_claim_position(name, offset) for name in ("priority", "waited", "created_at", "id"))
    )


# The claim's two halves, shared by CLAIM_JOBS and RECORD_AND_CLAIM. Parameters: queue text,
# limit int (candidates); worker_id text, lease seconds float (the update).
_CLAIM_CANDIDATES = """
    SELECT id
    FROM jobs
    WHERE queue = %s
      AND status IN ('pending', 'retrying')
      AND run_at <= now()
    ORDER BY priority DESC, run_at, created_at, id
    LIMIT %s
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
FROM (SELECT %s::text AS id, %s::float8 AS lease) AS w
WHERE j.id = ANY(ARRAY(SELECT id FROM candidates))
RETURNING {_CLAIM_RETURNING}
"""

#: Lease up to ``limit`` due jobs of one queue, in priority order, and count the attempt.
#:
#: Parameters: queue text, limit int, worker_id text, lease seconds float.
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
#: Parameters: ids uuid[], attempts int[], statuses text[] ('completed', 'retrying', 'dead' or
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
        %s::uuid[], %s::integer[], %s::text[], %s::boolean[], %s::float8[], %s::text[],
        %s::text[], %s::text[]
    ) WITH ORDINALITY AS u(
        id, attempt, status, gives_back_attempt, delay, code, summary, result, sent
    )
    ORDER BY id, attempt, sent
) AS u
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND j.status = 'leased'
RETURNING j.id
"""

# The typed NULLs that pad RECORD_AND_CLAIM's outcome rows to the claim's columns.
_CLAIM_NULLS = ", ".join(f"NULL::{kind}" for _, _, kind in CLAIM_COLUMNS[1:])

#: RECORD_OUTCOMES and CLAIM_JOBS in one statement: one round trip per dispatcher turn.
#:
#: Parameters: those of RECORD_OUTCOMES, then those of CLAIM_JOBS.
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

# -- fair and limited claims ---------------------------------------------------------------------
#
# A queue with FAIR, MAX_RUNNING or RATE_LIMIT claims through these instead of CLAIM_JOBS. Limits
# are enforced in the database, so they hold across every worker on every host: the claim runs in
# a short transaction that first takes the queue's advisory lock (CLAIM_LOCK), so that claims of
# the queue are serialized, and every later statement of it starts after the previous claimer
# committed and sees its leases and its tokens. ``statement_timestamp()`` rather than ``now()``
# for the same reason: ``now()`` is the start of the transaction, before the lock was granted.

#: Serialize the claims of one queue across every worker, until the transaction ends.
#: Parameters: queue text.
CLAIM_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('pgoutbox.claim:' || %s, 0))"

#: A queue-wide limit's allowance: jobs of the queue running now, and the tokens of its bucket.
#:
#: Parameters: queue text, rate float8 (jobs/s, or NULL), burst float8, queue text (the key).
#: Tokens refill at ``rate`` per second of the database clock up to ``burst``; a bucket that
#: does not exist yet is full.
QUEUE_ALLOWANCE = """
SELECT (SELECT count(*) FROM jobs WHERE queue = %s AND status = 'leased'),
       (SELECT least(%s::float8 * extract(epoch FROM statement_timestamp() - updated_at)
                     + tokens, %s::float8)
        FROM rate_limit_buckets WHERE key = %s)
"""

#: Take the tokens that a claim used from the buckets it used, creating them full first.
#:
#: Parameters: burst float8, keys text[], counts int[], rate float8, burst float8, burst float8.
#: The inserted row's ``tokens`` is ``burst - count`` (a new bucket starts full); on conflict the
#: count is recovered as ``burst - EXCLUDED.tokens`` and taken from the refilled bucket.
TAKE_TOKENS = """
INSERT INTO rate_limit_buckets AS b (key, tokens, updated_at)
SELECT c.key, %s::float8 - c.n, statement_timestamp()
FROM unnest(%s::text[], %s::integer[]) AS c(key, n)
ON CONFLICT (key) DO UPDATE
SET tokens = least(b.tokens + %s::float8 * extract(epoch FROM statement_timestamp() - b.updated_at),
                   %s::float8)
             - (%s::float8 - EXCLUDED.tokens),
    updated_at = statement_timestamp()
"""

# One organization's (or the organization-less jobs') first claimable jobs, in claim order, up
# to its allowance. ``{match}`` is ``= a.org`` or ``IS NULL``: both are index conditions of
# ``jobs_fair_claim_idx``, where a single ``IS NOT DISTINCT FROM`` would not be. A job's turn
# counts the jobs its organization already has running: the first job of an organization with
# three running comes after the first two of an organization with one. The inner ``LIMIT`` is
# the constant claim limit and the allowance is applied outside it: with a constant, the planner
# expects a few rows per organization and joins them back to ``jobs`` by primary key; with the
# allowance as the limit it guessed thousands and chose to hash the whole table.
_FAIR_BRANCH = """
    SELECT c.id, c.priority, c.run_at, c.created_at, a.running + c.place AS turn
    FROM allowed AS a,
    LATERAL (
        SELECT j.id, j.priority, j.run_at, j.created_at,
               row_number() OVER (
                   ORDER BY j.priority DESC, j.run_at, j.created_at, j.id) AS place
        FROM jobs AS j
        WHERE j.queue = %(queue)s
          AND j.organization_id {match}
          AND j.status IN ('pending', 'retrying')
          AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.created_at, j.id
        LIMIT %(limit)s
    ) AS c
    WHERE a.org {where}
      AND c.place <= a.allowance
"""

# Each organization's allowance: the claim's limit, cut by MAX_RUNNING minus its running jobs
# and by the whole tokens of its RATE_LIMIT bucket when the limits apply per organization.
_ORG_ALLOWANCE = """
    least(
        %(limit)s::integer,
        CASE WHEN %(max_running)s::integer IS NULL THEN %(limit)s::integer
             ELSE %(max_running)s::integer - coalesce(r.n, 0)
        END,
        CASE WHEN %(rate)s::float8 IS NULL THEN %(limit)s::integer
             ELSE floor(coalesce(
                 least(b.tokens + %(rate)s::float8
                       * extract(epoch FROM statement_timestamp() - b.updated_at), %(burst)s),
                 %(burst)s))::integer
        END
    )
"""

#: The fair (or per-organization limited) claim. Named parameters: queue, limit, worker_id,
#: lease, max_running (per organization, or NULL), rate and burst (per organization, or NULL).
#:
#: 1. ``orgs``: a loose index scan over ``jobs_fair_claim_idx`` lists the organizations that
#:    have claimable jobs, one index probe each, however many jobs each holds; the jobs without
#:    an organization form one more group. ``running`` counts each group's leased jobs.
#: 2. ``ranked``: each group's first jobs in claim order, up to its allowance, with their turn:
#:    the group's running jobs plus the job's place in the group.
#: 3. ``candidates``: the best ``limit`` of those, ordered by turn first when FAIR, so that a
#:    free slot goes to the organization with the fewest jobs running (the oldest head job
#:    breaks ties). ``FOR UPDATE SKIP LOCKED`` sits under the ``LIMIT``: rows are locked one by
#:    one in that order, and only ``limit`` of them.
#:
#: The per-organization bucket key is ``queue/organization`` (``queue/none`` without one).
FAIR_CLAIM_TEMPLATE = """
WITH RECURSIVE orgs(org) AS (
    (SELECT organization_id FROM jobs
     WHERE queue = %(queue)s AND status IN ('pending', 'retrying')
       AND organization_id IS NOT NULL
     ORDER BY organization_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.organization_id FROM jobs AS j
            WHERE j.queue = %(queue)s AND j.status IN ('pending', 'retrying')
              AND j.organization_id > o.org
            ORDER BY j.organization_id LIMIT 1)
    FROM orgs AS o
    WHERE o.org IS NOT NULL
),
running AS (
    SELECT coalesce(organization_id::text, 'none') AS org_key, count(*)::integer AS n
    FROM jobs
    WHERE queue = %(queue)s AND status = 'leased'
    GROUP BY 1
),
allowed AS (
    SELECT g.org, coalesce(r.n, 0) AS running, {allowance} AS allowance
    FROM (SELECT org FROM orgs WHERE org IS NOT NULL UNION ALL SELECT NULL::uuid) AS g
    LEFT JOIN running AS r ON r.org_key = coalesce(g.org::text, 'none')
    LEFT JOIN rate_limit_buckets AS b
        ON b.key = %(queue)s || '/' || coalesce(g.org::text, 'none')
),
ranked AS (
    {organization_branch}
    UNION ALL
    {null_branch}
),
candidates AS MATERIALIZED (
    SELECT j.id
    FROM ranked AS r
    JOIN jobs AS j ON j.id = r.id
    WHERE j.status IN ('pending', 'retrying') AND j.run_at <= now()
    ORDER BY {order}
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'leased',
    locked_at = now(),
    locked_by = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    attempts = least(j.attempts, 2147483646) + 1,  -- a row at the int4 limit fails no claim
    worker_ids = j.worker_ids || jsonb_build_array(%(worker_id)s::text),
    alone_attempt = NULL
FROM candidates AS c
WHERE j.id = c.id
RETURNING {returning}
"""


#: Run before FAIR_CLAIM in its transaction. However the per-organization lists are written, the
#: planner cannot know they hold a few rows each (it assumes a hundred organizations and many rows
#: each), and on a small table it prefers to join them back to ``jobs`` by hashing the whole table,
#: which grows with the table (docs/benchmarks.md, "What profiling found", item 7). Without hash and
#: merge joins it probes the primary key for each candidate. ``is_local``: the settings end with the
#: transaction. JIT is off for the reason CLAIM_EVENTS_PLAN gives.
FAIR_PLAN = (
    "SELECT set_config('enable_hashjoin', 'off', true),"
    " set_config('enable_mergejoin', 'off', true),"
    " set_config('jit', 'off', true)"
)


def fair_claim(*, fair: bool) -> str:
    """The claim of FAIR_CLAIM_TEMPLATE, ordered by turn first (FAIR) or by priority only."""
    order = "r.priority DESC, r.run_at, r.created_at, r.id"
    return FAIR_CLAIM_TEMPLATE.format(
        allowance=_ORG_ALLOWANCE,
        organization_branch=_FAIR_BRANCH.format(match="= a.org", where="IS NOT NULL"),
        null_branch=_FAIR_BRANCH.format(match="IS NULL", where="IS NULL"),
        order=f"r.turn, {order}" if fair else order,
        returning=_CLAIM_RETURNING,
    )


#: The claim of a FAIR queue: a free slot goes to the organization with the fewest jobs running.
FAIR_CLAIM = fair_claim(fair=True)
#: The claim of a queue limited per organization but not FAIR: in priority order only.
ORGANIZATION_LIMITED_CLAIM = fair_claim(fair=False)

# -- leases --------------------------------------------------------------------------------------

#: Extend the leases of the attempts this worker is running; returns the ids still held, each
#: with whether its cancellation was requested.
#:
#: Parameters: lease seconds float, ids uuid[], attempts int[], worker_id text.
#:
#: Fenced like RECORD_OUTCOMES. Only ``lease_expires_at`` changes, a column in no index, so on
#: a page with free space (fillfactor 80) this is a HOT update that writes no index entry.
RENEW_LEASES = """
UPDATE jobs AS j
SET lease_expires_at = now() + make_interval(secs => %s)
FROM unnest(%s::uuid[], %s::integer[]) AS u(id, attempt)
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND j.status = 'leased'
RETURNING j.id, j.cancel_requested_at IS NOT NULL
"""

#: Make jobs whose lease expired claimable again, or dead when that was their last attempt.
#:
#: Named parameters: queue text or NULL (every queue).
#:
#: A worker that crashed or stalled past its lease never recorded an outcome; its job goes back
#: to 'retrying' due now, or to 'cancelled' if its cancellation was requested. The worker may
#: have died for any job it held, or for nothing they did (a deploy's SIGKILL, a lost host), and
#: held some it never started (prefetched). So the lost attempt is **given back** (``attempts``
#: goes down by one, as for a snooze), and ``lost_attempts`` counts the losses in a row (code
#: ``lease_expired`` since). A job lost twice in a row is a *suspect*: its next attempt starts
#: alone in the process, marked by MARK_ALONE (``alone_attempt = attempts``), and such an
#: attempt, if lost too, counts, and is 'dead' if it was the last. So one crash costs nobody an
#: attempt, and a job that kills its process again and again spends its own attempts only.
#:
#: Concurrent recoverers are safe: under READ COMMITTED the second re-checks ``status =
#: 'leased'`` on the locked row after the first commits and skips it, so each expiry is
#: returned, and counted, exactly once. The scan reads ``jobs_leased_idx``: only the rows that
#: are running.
RECOVER_EXPIRED_LEASES = """
UPDATE jobs
SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN alone_attempt = attempts AND attempts >= max_attempts THEN 'dead'
                  ELSE 'retrying' END,
    attempts = CASE WHEN alone_attempt IS DISTINCT FROM attempts THEN attempts - 1
                    ELSE attempts END,
    lost_attempts = CASE WHEN last_error_code = 'lease_expired' THEN lost_attempts + 1 ELSE 1 END,
    run_at = now(),
    finished_at = CASE WHEN cancel_requested_at IS NOT NULL
                         OR (alone_attempt = attempts AND attempts >= max_attempts)
                       THEN now() END,
    last_error_code = 'lease_expired',
    last_error_summary = 'lease of attempt ' || attempts || ' held by ' || coalesce(locked_by, '?')
        || ' expired at ' || lease_expires_at
        || CASE WHEN alone_attempt = attempts
                THEN '; it ran as a suspect, alone: the attempt counts'
                ELSE '; the attempt is given back (lost ' || CASE WHEN last_error_code =
                     'lease_expired' THEN lost_attempts + 1 ELSE 1 END || ' time(s) in a row;'
                     || ' from 2, its next attempt runs alone and counts)'
           END,
    lease_expires_at = NULL
WHERE status = 'leased'
  AND lease_expires_at < now()
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
RETURNING id, queue, status
"""

#: Say that a suspect (a job lost with its worker twice in a row) now starts alone in this
#: worker's process: should its lease expire, the attempt counts (RECOVER_EXPIRED_LEASES).
#:
#: Parameters: id uuid, attempt int, worker_id text. Fenced like RENEW_LEASES; returns the id
#: while the lease is held. ``alone_attempt`` is in no index: a HOT update. Every claim clears
#: it, so it speaks of the current attempt only.
MARK_ALONE = """
UPDATE jobs
SET alone_attempt = attempts
WHERE id = %s AND attempts = %s AND locked_by = %s AND status = 'leased'
RETURNING id
"""

#: Give back jobs this worker claimed but will not finish (graceful shutdown past its grace).
#:
#: Parameters: ids uuid[], attempts int[], worker_id text.
#:
#: They return to 'pending', due now, for another worker (or end 'cancelled' if that was
#: asked). The attempt stays counted: it did start, and its side effects may have happened
#: (handlers are idempotent). A job released during its last attempt is dead, as it would be
#: had its lease expired: it never gets more than ``max_attempts`` attempts.
RELEASE_JOBS = """
UPDATE jobs AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts THEN 'dead'
                  ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                       THEN now() END,
    run_at = now(),
    lease_expires_at = NULL,
    last_error_code = 'worker_shutdown',
    last_error_summary = 'released by ' || j.locked_by || ' at shutdown'
FROM unnest(%s::uuid[], %s::integer[]) AS u(id, attempt)
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND j.status = 'leased'
RETURNING j.id
"""

#: Give back claimed jobs whose handler never started (prefetched, at shutdown).
#:
#: Parameters: ids uuid[], attempts int[], worker_id text.
#:
#: Fenced like RELEASE_JOBS. Unlike it, the claim is undone: ``attempts`` goes back down and the
#: claim's entry leaves ``worker_ids``, since the attempt never began.
UNCLAIM_JOBS = """
UPDATE jobs AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() END,
    attempts = j.attempts - 1,
    worker_ids = j.worker_ids - (-1),
    run_at = now(),
    lease_expires_at = NULL
FROM unnest(%s::uuid[], %s::integer[]) AS u(id, attempt)
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND j.status = 'leased'
"""

# -- outbox --------------------------------------------------------------------------------------

#: Write one fact in the caller's transaction, and say so at commit.
#:
#: Named parameters: id uuid, organization_id uuid, aggregate_type text, aggregate_id uuid,
#: event_type text, schema_version int, payload text (JSON), occurred_at timestamptz (NULL =
#: now()), available_at timestamptz (NULL = now()), notify boolean, channel text.
#:
#: ``pg_notify`` runs in the same statement, inside the caller's transaction: the relay hears of
#: the event only once it is committed, and never after a rollback. ``occurred_at`` defaults to
#: ``now()``, the start of the business transaction, as the source text's example writes it.
PUBLISH_EVENT = """
INSERT INTO outbox_events (
    id, organization_id, aggregate_type, aggregate_id, event_type, schema_version, payload,
    occurred_at, available_at
)
VALUES (
    %(id)s, %(organization_id)s, %(aggregate_type)s, %(aggregate_id)s, %(event_type)s,
    %(schema_version)s, %(payload)s::jsonb, COALESCE(%(occurred_at)s, now()),
    COALESCE(%(available_at)s, now())
)
RETURNING occurred_at, available_at,
          CASE WHEN %(notify)s THEN pg_notify(%(channel)s, left(event_type, 200))::text END
"""

#: Run before CLAIM_EVENTS, in its transaction: the plan the claim is written for. The planner
#: cannot know that most unprocessed events head their aggregate, so it costs the claim as a scan of
#: the whole backlog. Two consequences (docs/benchmarks.md, "What profiling found", item 10): past
#: ``jit_above_cost`` (PostgreSQL's default: JIT on, above 100,000), each claim spent longer
#: compiling its plan than running it; and with statistics from a fuller backlog it preferred to
#: read every waiting event (a sequential or bitmap scan), check each one's aggregate, then sort, to
#: walking ``outbox_claim_idx`` in order until the batch is full.
CLAIM_EVENTS_PLAN = (
    "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)"
)

#: Claim a bounded batch of events to project: the source text's claim, plus order.
#:
#: Parameters: claim seconds float, limit int, max attempts int, relay_id text, crash code text,
#: crash summary text (retrying), crash summary text (dead).
#:
#: As in the source text: unprocessed, available, and not claimed (or claimed longer ago than
#: the claim lasts: a relay that died is taken over), oldest first, ``FOR UPDATE SKIP LOCKED``.
#: Two additions: dead events are never claimed, and only the *earliest* unprocessed event of
#: each aggregate is claimable, so that the events of one aggregate are projected one at a time,
#: in ``(occurred_at, id)`` order, however many relays run.
#:
#: A claim counts no attempt (``attempts`` counts failures, recorded by RECORD_EVENT_FAILURES),
#: except a claim *taken over*: an event whose last claim expired unfinished (only a projection
#: or a recorded failure clears ``claimed_at``; RELEASE_EXPIRED_EVENT_CLAIMS keeps it) was held
#: by a relay that died or stalled, perhaps because of that very event (a
#: subscriber's ``os._exit()``, a crash in native code, the OOM killer). Such a *suspect* is
#: counted here, in the claim, before any subscriber of it runs, with ``relay_crashed`` as its
#: last error, and dead once that count reaches ``MAX_ATTEMPTS``. At most one suspect is claimed
#: per batch (``reclaimed`` says which), the one that has cost the fewest attempts: the relay
#: projects it alone, so a relay that dies under it next time takes no other event down with it,
#: and the events reclaimed beside it, untouched here, keep their count until their own turn.
#: The ``claimed_at`` returned is the fencing token of the claim.
#:
#: Plan: ``outbox_claim_idx`` yields candidates in order, and the scan stops at ``LIMIT``; for each
#: candidate, the head of its aggregate is one probe of ``outbox_aggregate_pending_idx``. A
#: ``NOT EXISTS (earlier event)`` form reads the same, but PostgreSQL plans it as a hash anti join
#: over the whole backlog (docs/benchmarks.md, "What profiling found", item 10). The CTE is
#: MATERIALIZED so that ``LIMIT`` and the locks apply once, as in CLAIM_JOBS.
CLAIM_EVENTS = """
WITH candidates AS MATERIALIZED (
    SELECT e.id, e.claimed_at IS NOT NULL AS reclaimed, e.claimed_by AS holder, e.attempts,
           e.occurred_at
    FROM outbox_events AS e
    WHERE e.processed_at IS NULL
      AND e.dead_at IS NULL
      AND e.available_at <= now()
      AND (e.claimed_at IS NULL OR e.claimed_at < now() - make_interval(secs => %s))
      AND e.id = (
          SELECT head.id
          FROM outbox_events AS head
          WHERE head.aggregate_type = e.aggregate_type
            AND head.aggregate_id = e.aggregate_id
            AND head.processed_at IS NULL
          ORDER BY head.occurred_at, head.id
          LIMIT 1
      )
    ORDER BY e.occurred_at, e.id
    FOR UPDATE SKIP LOCKED
    LIMIT %s
),
chosen AS (
    SELECT id, false AS reclaimed, false AS spent, NULL::text AS holder
    FROM candidates
    WHERE NOT reclaimed
    UNION ALL
    (SELECT id, true, attempts + 1 >= %s, holder
     FROM candidates
     WHERE reclaimed
     ORDER BY attempts, occurred_at, id
     LIMIT 1)
)
UPDATE outbox_events AS o
SET claimed_at = CASE WHEN c.spent THEN NULL ELSE now() END,
    claimed_by = %s,
    attempts = o.attempts + c.reclaimed::int,
    dead_at = CASE WHEN c.spent THEN now() END,
    last_error_code = CASE WHEN c.reclaimed THEN %s ELSE o.last_error_code END,
    last_error = CASE WHEN c.reclaimed
                      THEN CASE WHEN c.spent THEN %s ELSE %s END
                           || coalesce(' (last held by ' || left(c.holder, 200) || ')', '')
                      ELSE o.last_error END
FROM chosen AS c
WHERE o.id = c.id
RETURNING o.id, o.organization_id, o.aggregate_type, o.aggregate_id, o.event_type,
          o.schema_version, o.payload::text, o.occurred_at, o.available_at, o.attempts,
          o.claimed_at, c.reclaimed, c.spent
"""

# LOCK_CLAIMED_EVENTS, MARK_EVENTS_PROCESSED and RECORD_EVENT_FAILURES take arrays of a batch's
# ids, sent in binary (``%b``, run with ``db.server_side_cursor``): quoting each UUID into the SQL
# text was a large part of a batch (docs/benchmarks.md, "What profiling found", item 10).

#: Lock the claimed events this relay still holds, at the start of the projecting transaction.
#:
#: Parameters: ids uuid[], claimed_at timestamptz[], relay_id text.
#:
#: The fence of the outbox: an event whose claim expired and was taken over by another relay
#: (its ``claimed_at`` moved on: each claim is a transaction of its own, with its own ``now()``)
#: is not returned, and is skipped; the lock keeps any other relay from claiming these rows
#: until this transaction ends.
#:
#: Each id is looked up by the primary key (``LATERAL``): as a join, the planner, trusting
#: statistics in which ``claimed_by`` is nearly always NULL, compared every claimed row with
#: every id (docs/benchmarks.md, "What profiling found", item 10).
LOCK_CLAIMED_EVENTS = """
SELECT o.id
FROM unnest(%s::uuid[], %s::timestamptz[]) AS c(id, claimed_at)
CROSS JOIN LATERAL (
    SELECT e.id
    FROM outbox_events AS e
    WHERE e.id = c.id
      AND e.claimed_at = c.claimed_at
      AND e.claimed_by = %s
      AND e.processed_at IS NULL
    FOR UPDATE
) AS o
""".replace("%s", "%b")

#: Mark events projected, in the transaction that committed what their subscribers wrote.
#:
#: Parameters: ids uuid[].
MARK_EVENTS_PROCESSED = """
UPDATE outbox_events
SET processed_at = now(), claimed_at = NULL
WHERE id = ANY(%s::uuid[])
""".replace("%s", "%b")

#: Record failed projections: retry later (backoff) or dead.
#:
#: Parameters: ids uuid[], dead boolean[], delays float8[] (seconds), codes text[],
#: errors text[], counted boolean[].
#:
#: Counts the failure (``attempts`` counts failures only, see CLAIM_EVENTS), unless the claim
#: counted this run already (``counted``: an event taken over, projected alone), so that a run
#: that fails after a takeover is one attempt, not two. The claim is released so that the retry
#: does not wait for the claim to expire.
RECORD_EVENT_FAILURES = """
UPDATE outbox_events AS o
SET attempts = o.attempts + (NOT f.counted)::int,
    available_at = CASE WHEN f.dead THEN o.available_at
                        ELSE now() + make_interval(secs => f.delay) END,
    dead_at = CASE WHEN f.dead THEN now() END,
    claimed_at = NULL,
    last_error_code = f.code,
    last_error = f.error
FROM unnest(%s::uuid[], %s::boolean[], %s::float8[], %s::text[], %s::text[], %s::boolean[])
    AS f(id, dead, delay, code, error, counted)
WHERE o.id = f.id
""".replace("%s", "%b")

# -- maintenance ---------------------------------------------------------------------------------

#: Delete up to ``limit`` jobs of one finished status older than the retention.
#:
#: Named parameters: status text ('completed' or 'cancelled'), age seconds float, limit int.
#:
#: The status test is explicit, so no other state can ever be deleted; ``jobs_finished_idx``
#: finds the oldest finished rows without reading the live ones.
PRUNE_JOBS = """
DELETE FROM jobs
WHERE id IN (
    SELECT id
    FROM jobs
    WHERE status = %(status)s
      AND status IN ('completed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(age)s)
    LIMIT %(limit)s
)
"""

#: Forget the heartbeats of processes not seen for a day (killed ones never delete their row).
PRUNE_HEARTBEATS = """
DELETE FROM worker_heartbeats WHERE last_seen_at < now() - interval '1 day'
"""

#: Delete up to ``limit`` processed events older than the retention.
#:
#: Named parameters: age seconds float, limit int.
PRUNE_EVENTS = """
DELETE FROM outbox_events
WHERE id IN (
    SELECT id
    FROM outbox_events
    WHERE processed_at IS NOT NULL
      AND processed_at < now() - make_interval(secs => %(age)s)
    LIMIT %(limit)s
)
"""

#: Release relay claims that expired without the event being processed.
#:
#: Parameters: claim seconds float.
#:
#: Expired claims are claimable anyway; clearing ``claimed_by`` keeps it truthful for operators.
#: ``claimed_at`` stays: it is how CLAIM_EVENTS knows that the event's last holder never
#: finished it, and counts that against it. A relay still projecting the event holds its row
#: lock, so this waits for it and then finds the event processed.
RELEASE_EXPIRED_EVENT_CLAIMS = """
UPDATE outbox_events
SET claimed_by = NULL
WHERE processed_at IS NULL
  AND claimed_by IS NOT NULL
  AND claimed_at < now() - make_interval(secs => %s)
"""

#: Count unprocessed events older than a threshold, and the oldest one's age in seconds.
#:
#: Parameters: threshold seconds float.
OVERDUE_EVENTS = """
SELECT count(*), extract(epoch FROM now() - min(occurred_at))
FROM outbox_events
WHERE processed_at IS NULL
  AND occurred_at < now() - make_interval(secs => %s)
"""

# -- dead letters --------------------------------------------------------------------------------
# Each takes ids uuid[] and touches only rows that are dead right now, so a stale admin page can
# never retry a job that a worker is running or cancel one that completed.

#: Put dead jobs back in their queue, due now, with a fresh attempt budget.
RETRY_DEAD_JOBS = """
UPDATE jobs
SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL,
    lease_expires_at = NULL
WHERE id = ANY(%s::uuid[]) AND status = 'dead'
"""

#: Give up on dead jobs for good: they become 'cancelled' (and are pruned later).
CANCEL_DEAD_JOBS = """
UPDATE jobs
SET status = 'cancelled', finished_at = now()
WHERE id = ANY(%s::uuid[]) AND status = 'dead'
"""

#: Make dead events claimable again, with a fresh attempt budget.
REDRIVE_DEAD_EVENTS = """
UPDATE outbox_events
SET dead_at = NULL, attempts = 0, available_at = now(), claimed_at = NULL, claimed_by = NULL
WHERE id = ANY(%s::uuid[]) AND dead_at IS NOT NULL AND processed_at IS NULL
"""

#: Mark dead events processed without projecting them: their aggregate's later events go on.
DISCARD_DEAD_EVENTS = """
UPDATE outbox_events
SET processed_at = now(), claimed_at = NULL,
    last_error = left('discarded by an operator; ' || coalesce(last_error, ''), 1000)
WHERE id = ANY(%s::uuid[]) AND dead_at IS NOT NULL AND processed_at IS NULL
"""

# -- cancellation --------------------------------------------------------------------------------

#: Cancel jobs: those not yet running end 'cancelled' at once; running ones are asked to stop.
#:
#: Parameters: ids uuid[], summary text, channel text, notify boolean. Returns (id, status) per
#: job found: 'cancelled' (cancelled now, or already), 'cancelling' (running, asked to stop), or
#: the finished status it already had ('completed', 'dead').
#:
#: ``FOR UPDATE`` makes a cancel that races a claim wait for it and see the job 'leased', so a
#: job is never both claimed and cancelled as pending. Workers hear of a request at their next
#: lease renewal, or at once when the notification on ``channel`` (payload: the queue) arrives.
CANCEL_JOBS = """
WITH targets AS MATERIALIZED (
    SELECT id, status, queue FROM jobs WHERE id = ANY(%s::uuid[]) FOR UPDATE
),
cancelled AS (
    UPDATE jobs AS j
    SET status = 'cancelled', finished_at = now(), last_error_code = 'cancelled',
        last_error_summary = %s, lease_expires_at = NULL
    FROM targets AS t
    WHERE j.id = t.id AND t.status IN ('pending', 'retrying')
    RETURNING j.id
),
requested AS (
    UPDATE jobs AS j
    SET cancel_requested_at = coalesce(j.cancel_requested_at, now())
    FROM targets AS t
    WHERE j.id = t.id AND t.status = 'leased'
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%s, queue) FROM (SELECT DISTINCT queue FROM requested) AS q WHERE %s
)
SELECT t.id,
       CASE WHEN t.status IN ('pending', 'retrying') THEN 'cancelled'
            WHEN t.status = 'leased' THEN 'cancelling'
            ELSE t.status END,
       (SELECT count(*) FROM woken)
FROM targets AS t
"""

# -- heartbeats and health -----------------------------------------------------------------------

#: Write (or refresh) this process's heartbeat row.
#:
#: Named parameters: worker_id text, hostname text, pid int, roles text (JSON array), queues text
#: (JSON array).
HEARTBEAT = """
INSERT INTO worker_heartbeats (worker_id, hostname, pid, roles, queues)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(roles)s::jsonb, %(queues)s::jsonb)
ON CONFLICT (worker_id) DO UPDATE SET
    last_seen_at = now(),
    -- a --worker-id used again by a new process: the row describes the new one
    hostname = EXCLUDED.hostname,
    pid = EXCLUDED.pid,
    roles = EXCLUDED.roles,
    queues = EXCLUDED.queues,
    started_at = CASE WHEN (worker_heartbeats.hostname, worker_heartbeats.pid)
                           IS DISTINCT FROM (EXCLUDED.hostname, EXCLUDED.pid)
                      THEN now() ELSE worker_heartbeats.started_at END
"""

#: Mark (or unmark) one queue of a worker as stuck in its heartbeat row.
#:
#: Named parameters: queue text, stuck boolean, worker_id text. One row's jsonb changes at once:
#: the dispatchers of a process's queues can each send theirs.
SET_STUCK_QUEUE = """
UPDATE worker_heartbeats
SET stuck_queues = (stuck_queues - %(queue)s::text)
    || CASE WHEN %(stuck)s THEN jsonb_build_array(%(queue)s::text) ELSE '[]'::jsonb END
WHERE worker_id = %(worker_id)s
"""

#: Every heartbeat row, with the seconds since it was last written by the database clock.
WORKER_HEARTBEATS = """
SELECT worker_id, hostname, pid, roles, queues, started_at,
       extract(epoch FROM now() - last_seen_at)::float8, stuck_queues
FROM worker_heartbeats
ORDER BY worker_id
"""

# -- gauges --------------------------------------------------------------------------------------

#: The jobs of each queue by status: (queue, status, count, scheduled, oldest due age).
#:
#: Each branch reads one partial index: the claim index (pending, retrying), the leased index,
#: the dead-letter index. Finished rows, however many, are never read.
JOB_GAUGES = """
SELECT queue, 'pending', count(*) FILTER (WHERE run_at <= now()),
       count(*) FILTER (WHERE run_at > now()),
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now())), 0)
FROM jobs WHERE status = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'retrying', count(*), 0, 0 FROM jobs WHERE status = 'retrying' GROUP BY queue
UNION ALL
SELECT queue, 'leased', count(*), 0, 0 FROM jobs WHERE status = 'leased' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*), 0, 0 FROM jobs WHERE status = 'dead' GROUP BY queue
"""

#: The outbox's backlog (waiting, dead, the oldest available event's age in seconds), the age of
#: the oldest open transaction (the xmin horizon that holds back vacuum), and the fraction of the
#: NOTIFY queue in use.
OUTBOX_AND_SERVER_GAUGES = """
SELECT
    (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NULL),
    (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NOT NULL),
    coalesce((SELECT extract(epoch FROM now() - min(occurred_at)) FROM outbox_events
              WHERE processed_at IS NULL AND dead_at IS NULL AND available_at <= now()), 0),
    coalesce((SELECT extract(epoch FROM now() - min(xact_start)) FROM pg_stat_activity
              WHERE xact_start IS NOT NULL AND backend_type = 'client backend'), 0),
    pg_notification_queue_usage()
"""

# -- schedules -----------------------------------------------------------------------------------

#: The database clock, which schedules follow.
DATABASE_NOW = "SELECT now()"

#: Take a schedule's advisory lock for the transaction, if no other scheduler holds it; and the
#: transaction's ``now()``.
#:
#: Parameters: lock key bigint.
SCHEDULE_LOCK = "SELECT pg_try_advisory_xact_lock(%s), now()"

#: The last slot a schedule enqueued, locked until the transaction ends.
#:
#: Parameters: name text.
SCHEDULE_CURSOR = "SELECT last_slot_at FROM schedule_cursors WHERE name = %s FOR UPDATE"

#: Start a schedule's cursor at a slot (its first sight: later slots only).
#:
#: Named parameters: name text, last_slot_at timestamptz.
START_SCHEDULE_CURSOR = """
INSERT INTO schedule_cursors (name, last_slot_at) VALUES (%(name)s, %(last_slot_at)s)
ON CONFLICT (name) DO UPDATE SET last_slot_at = EXCLUDED.last_slot_at, updated_at = now()
"""

#: Move a schedule's cursor to the last slot it enqueued.
#:
#: Named parameters: name text, last_slot_at timestamptz.
ADVANCE_SCHEDULE_CURSOR = """
UPDATE schedule_cursors SET last_slot_at = %(last_slot_at)s, updated_at = now()
WHERE name = %(name)s
"""

# -- system checks -------------------------------------------------------------------------------

#: Whether autovacuum is on (check ``pgoutbox.W001``).
AUTOVACUUM_ON = "SELECT current_setting('autovacuum')::boolean"


# -- how the dispatcher sends its statements -----------------------------------------------------


class Dispatched(NamedTuple):
    """A statement as a queue's lanes send it on their own connection (``send``)."""

    #: The SQL with binary parameters (``%b``): psycopg then sends arrays without quoting each
    #: element in Python. Django's cursors, which the tests use with the same statements, take
    #: the ``%s`` form of the constant of the same name.
    sql: str
    #: psycopg's ``prepare``: None (prepared after a few runs, as the connection says) or False.
    #: Those that join an array of (id, attempt) pairs to this worker's leased rows are False,
    #: planned each time knowing how many pairs they carry: a generic plan took the leased rows
    #: (estimated at one) as the outer side of a nested loop and read the whole array again for
    #: each row (docs/benchmarks.md, "What profiling found", item 17).
    prepare: bool | None


def _dispatched(name: str, *, prepare: bool | None) -> Dispatched:
    return Dispatched(globals()[name].replace("%s", "%b"), prepare)


#: The statements of a queue's lanes, by name.
DISPATCHED: dict[str, Dispatched] = {
    "CLAIM_JOBS": _dispatched("CLAIM_JOBS", prepare=None),
    "RECORD_AND_CLAIM": _dispatched("RECORD_AND_CLAIM", prepare=False),
    "RECORD_OUTCOMES": _dispatched("RECORD_OUTCOMES", prepare=False),
    "RENEW_LEASES": _dispatched("RENEW_LEASES", prepare=False),
    "UNCLAIM_JOBS": _dispatched("UNCLAIM_JOBS", prepare=False),
    "RELEASE_JOBS": _dispatched("RELEASE_JOBS", prepare=False),
}


def send(cursor: Any, name: str, params: list[Any]) -> None:
    """Run the dispatched statement ``name`` on a lane's psycopg ``cursor``."""
    statement = DISPATCHED[name]
    cursor.execute(statement.sql, params, prepare=statement.prepare)
