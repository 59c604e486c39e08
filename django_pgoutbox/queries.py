"""Every hot-path SQL statement, named and commented, in one place.

The rest of the code calls these by name. Parameters are positional ``%s`` placeholders, in the
order each statement's docstring-comment gives; arrays are passed as Python lists.
"""

from __future__ import annotations

# -- enqueue -------------------------------------------------------------------------------------

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
ENQUEUE_JOBS = """
WITH inserted AS (
    INSERT INTO jobs (
        id, organization_id, queue, job_type, payload, idempotency_key,
        priority, run_at, max_attempts
    )
    SELECT r.id, r.organization_id, r.queue, r.job_type, r.payload::jsonb, r.idempotency_key,
           r.priority, COALESCE(r.run_at, now()) + make_interval(secs => r.delay), r.max_attempts
    FROM unnest(
        %s::uuid[], %s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[],
        %s::integer[], %s::timestamptz[], %s::float8[], %s::integer[]
    ) AS r(id, organization_id, queue, job_type, payload, idempotency_key,
           priority, run_at, delay, max_attempts)
    ON CONFLICT (organization_id, job_type, idempotency_key)
        WHERE idempotency_key IS NOT NULL
        DO NOTHING
    RETURNING id, queue, run_at, created_at
),
woken AS (
    SELECT pg_notify(%s, queue) FROM (SELECT DISTINCT queue FROM inserted) AS q WHERE %s
)
SELECT id, run_at, created_at, (SELECT count(*) FROM woken) FROM inserted
"""

# -- claim and outcomes --------------------------------------------------------------------------

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
_CLAIM_UPDATE = """
UPDATE jobs AS j
SET status = 'leased',
    locked_at = now(),
    locked_by = w.id,
    lease_expires_at = now() + make_interval(secs => w.lease),
    attempts = j.attempts + 1,
    worker_ids = j.worker_ids || jsonb_build_array(w.id)
FROM candidates AS c, (SELECT %s::text AS id, %s::float8 AS lease) AS w
WHERE j.id = c.id
RETURNING j.id, j.job_type, j.payload::text, j.attempts, j.max_attempts, j.organization_id,
          j.queue, j.priority, j.created_at, extract(epoch FROM now() - j.run_at)::float8,
          j.worker_ids::text
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
CLAIM_JOBS = f"""
WITH candidates AS MATERIALIZED ({_CLAIM_CANDIDATES})
{_CLAIM_UPDATE}
"""

#: Record the outcomes of many attempts in one statement; returns the ids it applied.
#:
#: Parameters: ids uuid[], attempts int[], statuses text[] ('completed', 'retrying', 'dead' or
#: 'cancelled'), delays float8[] (seconds, for 'retrying'), codes text[], summaries text[],
#: results text[] (JSON), worker_id text.
#:
#: Fenced: a row is written only while it is still leased by this worker *for this attempt*.
#: ``attempts`` is the fencing token: every claim increments it, so once a lease expired and
#: another worker claimed the job, the stale worker's (id, attempt) matches nothing and its
#: outcome is dropped. A job whose expired lease was only recovered (status no longer 'leased')
#: is protected by the status test. The caller compares the returned ids with what it sent.
RECORD_OUTCOMES = """
UPDATE jobs AS j
SET status = u.status,
    run_at = CASE WHEN u.status = 'retrying' THEN now() + make_interval(secs => u.delay)
                  ELSE j.run_at END,
    completed_at = CASE WHEN u.status = 'completed' THEN now() END,
    finished_at = CASE WHEN u.status <> 'retrying' THEN now() END,
    last_error_code = CASE WHEN u.status = 'completed' THEN j.last_error_code ELSE u.code END,
    last_error_summary = CASE
        WHEN u.status = 'completed' THEN j.last_error_summary ELSE u.summary END,
    result = u.result::jsonb,
    lease_expires_at = NULL
FROM unnest(
    %s::uuid[], %s::integer[], %s::text[], %s::float8[], %s::text[], %s::text[], %s::text[]
) AS u(id, attempt, status, delay, code, summary, result)
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND j.status = 'leased'
RETURNING j.id
"""

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
SELECT false, id, NULL, NULL, NULL::integer, NULL::integer, NULL::uuid, NULL, NULL::integer,
       NULL::timestamptz, NULL::float8, NULL::text
FROM recorded
UNION ALL
SELECT true, * FROM claimed
"""

# -- leases --------------------------------------------------------------------------------------

#: Extend the leases of the attempts this worker is running; returns the ids still held.
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
RETURNING j.id
"""

#: Make jobs whose lease expired claimable again, or dead when that was their last attempt.
#:
#: Parameters: queue text or NULL (every queue).
#:
#: A worker that crashed or stalled past its lease never recorded an outcome; its job goes back
#: to 'retrying' due now, or to 'dead' if the budget is spent. Concurrent recoverers are safe:
#: under READ COMMITTED the second re-checks ``status = 'leased'`` on the locked row after the
#: first commits and skips it, so each expiry is returned, and counted, exactly once.
#: The scan reads ``jobs_leased_idx``: only the rows that are running.
RECOVER_EXPIRED_LEASES = """
UPDATE jobs
SET status = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'retrying' END,
    run_at = now(),
    finished_at = CASE WHEN attempts >= max_attempts THEN now() END,
    last_error_code = 'lease_expired',
    last_error_summary = 'lease of attempt ' || attempts || ' held by ' || coalesce(locked_by, '?')
        || ' expired at ' || lease_expires_at,
    lease_expires_at = NULL
WHERE status = 'leased'
  AND lease_expires_at < now()
  AND (%s::text IS NULL OR queue = %s::text)
RETURNING id, queue, status
"""

#: Give back jobs this worker claimed but will not finish (graceful shutdown past its grace).
#:
#: Parameters: ids uuid[], attempts int[], worker_id text.
#:
#: They return to 'pending', due now, for another worker. The attempt stays counted: it did
#: start, and its side effects may have happened (handlers are idempotent).
RELEASE_JOBS = """
UPDATE jobs AS j
SET status = 'pending',
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

# -- outbox --------------------------------------------------------------------------------------

#: Write one fact in the caller's transaction, and say so at commit.
#:
#: Parameters: id uuid, organization_id uuid, aggregate_type text, aggregate_id uuid,
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
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, COALESCE(%s, now()), COALESCE(%s, now()))
RETURNING occurred_at, available_at,
          CASE WHEN %s THEN pg_notify(%s, id::text)::text END
"""

#: Claim a bounded batch of events to project: the source text's claim, plus order.
#:
#: Parameters: claim seconds float, limit int, relay_id text.
#:
#: As in the source text: unprocessed, available, and not claimed (or claimed longer ago than
#: the claim lasts: a relay that died is taken over), oldest first, ``FOR UPDATE SKIP LOCKED``,
#: ``attempts + 1``. Two additions: dead events are never claimed, and only the *earliest*
#: unprocessed event of each aggregate is claimable, so that the events of one aggregate are
#: projected one at a time, in ``(occurred_at, id)`` order, however many relays run.
#:
#: Plan: ``outbox_claim_idx`` yields candidates in order, and the scan stops at ``LIMIT``; for
#: each candidate, the head of its aggregate is one probe of ``outbox_aggregate_pending_idx``.
#: (A ``NOT EXISTS (earlier event)`` form reads the same, but PostgreSQL plans it as a hash anti
#: join over the whole backlog: 72 ms instead of 0.3 ms for a claim of 10 out of 10,000.) The
#: CTE is MATERIALIZED so that ``LIMIT`` and the locks apply once, as in CLAIM_JOBS.
CLAIM_EVENTS = """
WITH candidates AS MATERIALIZED (
    SELECT e.id
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
)
UPDATE outbox_events AS o
SET claimed_at = now(),
    claimed_by = %s,
    attempts = o.attempts + 1
FROM candidates AS c
WHERE o.id = c.id
RETURNING o.id, o.organization_id, o.aggregate_type, o.aggregate_id, o.event_type,
          o.schema_version, o.payload::text, o.occurred_at, o.available_at, o.attempts
"""

#: Lock the claimed events this relay still holds, at the start of the projecting transaction.
#:
#: Parameters: ids uuid[], attempts int[], relay_id text.
#:
#: The fence of the outbox: an event whose claim expired and was taken over by another relay
#: (its ``attempts`` moved on) is not returned, and is skipped; the lock keeps any other relay
#: from claiming these rows until this transaction ends.
LOCK_CLAIMED_EVENTS = """
SELECT o.id
FROM outbox_events AS o
JOIN unnest(%s::uuid[], %s::integer[]) AS c(id, attempt) ON o.id = c.id
WHERE o.attempts = c.attempt
  AND o.claimed_by = %s
  AND o.processed_at IS NULL
FOR UPDATE OF o
"""

#: Mark events projected, in the transaction that committed what their subscribers wrote.
#:
#: Parameters: ids uuid[].
MARK_EVENTS_PROCESSED = """
UPDATE outbox_events
SET processed_at = now(), claimed_at = NULL
WHERE id = ANY(%s::uuid[])
"""

#: Record failed projections: retry later (backoff) or dead.
#:
#: Parameters: ids uuid[], dead boolean[], delays float8[] (seconds), codes text[],
#: errors text[].
#:
#: The claim is released so that the retry does not wait for the claim to expire.
RECORD_EVENT_FAILURES = """
UPDATE outbox_events AS o
SET available_at = CASE WHEN f.dead THEN o.available_at
                        ELSE now() + make_interval(secs => f.delay) END,
    dead_at = CASE WHEN f.dead THEN now() END,
    claimed_at = NULL,
    last_error_code = f.code,
    last_error = f.error
FROM unnest(%s::uuid[], %s::boolean[], %s::float8[], %s::text[], %s::text[])
    AS f(id, dead, delay, code, error)
WHERE o.id = f.id
"""

# -- maintenance ---------------------------------------------------------------------------------

#: Delete up to ``limit`` jobs of one finished status older than the retention.
#:
#: Parameters: status text ('completed' or 'cancelled'), age seconds float, limit int.
#:
#: The status test is explicit, so no other state can ever be deleted; ``jobs_finished_idx``
#: finds the oldest finished rows without reading the live ones.
PRUNE_JOBS = """
DELETE FROM jobs
WHERE id IN (
    SELECT id
    FROM jobs
    WHERE status = %s
      AND status IN ('completed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %s)
    LIMIT %s
)
"""

#: Delete up to ``limit`` processed events older than the retention.
#:
#: Parameters: age seconds float, limit int.
PRUNE_EVENTS = """
DELETE FROM outbox_events
WHERE id IN (
    SELECT id
    FROM outbox_events
    WHERE processed_at IS NOT NULL
      AND processed_at < now() - make_interval(secs => %s)
    LIMIT %s
)
"""

#: Clear relay claims that expired without the event being processed.
#:
#: Parameters: claim seconds float.
#:
#: Expired claims are claimable anyway; clearing them keeps ``claimed_by`` truthful for
#: operators. A relay still projecting the event holds its row lock, so this waits for it and
#: then finds the event processed.
RELEASE_EXPIRED_EVENT_CLAIMS = """
UPDATE outbox_events
SET claimed_at = NULL, claimed_by = NULL
WHERE processed_at IS NULL
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

RETRY_DEAD_JOBS = """
UPDATE jobs
SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL,
    lease_expires_at = NULL
WHERE id = ANY(%s::uuid[]) AND status = 'dead'
"""

CANCEL_DEAD_JOBS = """
UPDATE jobs
SET status = 'cancelled', finished_at = now()
WHERE id = ANY(%s::uuid[]) AND status = 'dead'
"""

REDRIVE_DEAD_EVENTS = """
UPDATE outbox_events
SET dead_at = NULL, attempts = 0, available_at = now(), claimed_at = NULL, claimed_by = NULL
WHERE id = ANY(%s::uuid[]) AND dead_at IS NOT NULL AND processed_at IS NULL
"""

DISCARD_DEAD_EVENTS = """
UPDATE outbox_events
SET processed_at = now(), claimed_at = NULL,
    last_error = left('discarded by an operator; ' || coalesce(last_error, ''), 1000)
WHERE id = ANY(%s::uuid[]) AND dead_at IS NOT NULL AND processed_at IS NULL
"""
