"""Operations: pruning, dead letters and cancellation."""

from __future__ import annotations

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

#: Delete up to ``limit`` processed events older than the retention, with their deliveries (the
#: foreign key cascades); never one that a subscriber's delivery still waits for.
#:
#: Named parameters: age seconds float, limit int.
PRUNE_EVENTS = """
DELETE FROM outbox_events
WHERE id IN (
    SELECT id
    FROM outbox_events
    WHERE processed_at IS NOT NULL
      AND processed_at < now() - make_interval(secs => %(age)s)
      AND NOT EXISTS (
          SELECT 1 FROM outbox_deliveries AS d
          WHERE d.event_id = outbox_events.id AND d.delivered_at IS NULL
      )
    LIMIT %(limit)s
)
"""

#: Delete up to ``limit`` inbox messages received longer ago than the retention: a redelivery
#: of one of them is accepted again.
#:
#: Named parameters: age seconds float, limit int. ``inbox_received_idx`` finds the oldest.
PRUNE_INBOX_MESSAGES = """
DELETE FROM inbox_messages
WHERE id IN (
    SELECT id
    FROM inbox_messages
    WHERE received_at < now() - make_interval(secs => %(age)s)
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
    -- locked in id order, as a worker's renewals and outcome writes mostly take them
    SELECT id, status, queue FROM jobs WHERE id = ANY(%s::uuid[]) ORDER BY id FOR UPDATE
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

# -- dead letters by cause -----------------------------------------------------------------------
# A cause is pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary) (migration
# 0010); jobs_dead_cause_idx holds it, with finished_at and id, for every dead job. PostgreSQL
# reads an expression index with the row beside each entry (an index-only scan needs the columns
# the expression is made of in the index), so nothing here reads every entry of a big cause: each
# cause is found by one descent, its newest and oldest dead letters by one descent each, and it
# is counted entry by entry only up to a cap. The fingerprint is compared, never selected or
# sorted on where many rows pass: the index has it, the row does not, and worked out again from
# a row it costs tens of microseconds (the regular expressions of pgoutbox_error_pattern).

#: Run before each statement below, in its transaction: the plans they are written for, one index
#: entry and its row at a time. The planner prices the fingerprint as a few cheap function calls
#: and, for a big cause, prefers a bitmap scan; gone lossy, it works the fingerprint out again for
#: every row of every page it reads: minutes at a million dead letters.
DEAD_CAUSE_PLAN = (
    "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('enable_bitmapscan', 'off', true)"
)

#: The causes of the dead letters, in fingerprint order, at most ``limit`` of them, each with its
#: newest dead letter (the example), when it first and last died, and its size.
#:
#: Named parameters: limit int, cap int. Returns (fingerprint, example id, queue, job type, error
#: code, normalised summary, first seen, last seen, counted, estimate): ``counted`` is exact when
#: under ``cap``, else ``cap``; ``estimate`` is the share of the index's entries that ANALYZE
#: found for the cause (its most common values) times the entries, or NULL when it found too
#: few to say or the user may not read the index's statistics (only its owner may).
#:
#: A loose index scan of ``jobs_dead_cause_idx``: one descent per cause, never a pass over the
#: million entries of a ``GROUP BY``; the ``LIMIT`` ends the recursion.
DEAD_CAUSES = """
WITH RECURSIVE causes (fingerprint) AS (
    (SELECT pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary)
     FROM jobs
     WHERE status = 'dead'
     ORDER BY 1
     LIMIT 1)
    UNION ALL
    SELECT (
        SELECT pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
        FROM jobs AS j
        WHERE j.status = 'dead'
          AND pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
              > causes.fingerprint
        ORDER BY 1
        LIMIT 1
    )
    FROM causes
    WHERE causes.fingerprint IS NOT NULL
),
found AS (
    SELECT fingerprint FROM causes WHERE fingerprint IS NOT NULL LIMIT %(limit)s
),
estimates AS (
    SELECT u.fingerprint, u.share * i.reltuples AS rows
    FROM pg_class AS i
    JOIN pg_namespace AS n ON n.oid = i.relnamespace
    JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = i.relname
    CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
        AS u (fingerprint, share)
    WHERE i.oid = to_regclass('jobs_dead_cause_idx') AND i.reltuples > 0
)
SELECT c.fingerprint, newest.id, newest.queue, newest.job_type, newest.last_error_code,
       pgoutbox_error_pattern(newest.last_error_summary), oldest.finished_at,
       newest.finished_at, counted.n, round(e.rows)::bigint
FROM found AS c
CROSS JOIN LATERAL (
    SELECT j.id, j.queue, j.job_type, j.last_error_code, j.last_error_summary, j.finished_at
    FROM jobs AS j
    WHERE j.status = 'dead'
      AND pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
          = c.fingerprint
    ORDER BY j.finished_at DESC, j.id DESC
    LIMIT 1
) AS newest
CROSS JOIN LATERAL (
    SELECT j.finished_at
    FROM jobs AS j
    WHERE j.status = 'dead'
      AND pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
          = c.fingerprint
    ORDER BY j.finished_at, j.id
    LIMIT 1
) AS oldest
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (
        SELECT
        FROM jobs AS j
        WHERE j.status = 'dead'
          AND pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
              = c.fingerprint
        LIMIT %(cap)s
    ) AS capped
) AS counted
LEFT JOIN estimates AS e ON e.fingerprint = c.fingerprint
"""

#: The next ``limit`` dead letters of one cause, in (finished_at, id) order after a key, among
#: those dead at or before a moment (the confirmation page's: one that died later is left out).
#:
#: Named parameters: fingerprint text, as_of timestamptz, after_at timestamptz, after_id uuid
#: (``'-infinity'`` and any id to start), limit int. Returns (id, finished_at).
#:
DEAD_CAUSE_IDS = """
SELECT j.id, j.finished_at
FROM jobs AS j
WHERE j.status = 'dead'
  AND pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
      = %(fingerprint)s
  AND j.finished_at <= %(as_of)s
  AND (j.finished_at, j.id) > (%(after_at)s, %(after_id)s)
ORDER BY j.finished_at, j.id
LIMIT %(limit)s
"""

#: The newest ``limit`` dead letters of one cause, newest first (the dead letters' changelist
#: filtered to a cause, which shows 10,000 at most).
#:
#: Named parameters: fingerprint text, limit int. Returns (id).
DEAD_CAUSE_NEWEST = """
SELECT j.id
FROM jobs AS j
WHERE j.status = 'dead'
  AND pgoutbox_error_fingerprint(j.job_type, j.last_error_code, j.last_error_summary)
      = %(fingerprint)s
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s
"""
