"""Operations: pruning, dead letters and cancellation."""

from __future__ import annotations

from django_pgoutbox.queries.results import notify_finished
from django_pgoutbox.queries.workflows import steps_of

#: Delete up to ``limit`` jobs of one finished status older than the retention.
#:
#: Named parameters: status text ('completed' or 'cancelled'), age seconds float, limit int.
#:
#: The status test is explicit, so no other state can ever be deleted; ``jobs_finished_idx``
#: finds the oldest finished rows without reading the live ones.
#: The edges that led to them (``job_dependencies``, keyed by child) go with them; an edge from
#: a pruned parent stays until its child is pruned.
#:
#: Kept whatever its age: a sequence job cancelled before its turn that has not passed it on yet
#: (``waiting_for`` > 0, migration 0018). It is the link from the job before it (running, or dead
#: for as long as no one acts) to the job after it: pruned with its edge, the end of the one
#: before would release nothing, and the rest of the sequence would wait for ever.
PRUNE_JOBS = """
WITH doomed AS (
    SELECT id
    FROM jobs
    WHERE status = %(status)s
      AND status IN ('completed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(age)s)
      AND (on_upstream_failure = 'hold' AND waiting_for > 0) IS NOT TRUE
    LIMIT %(limit)s
),
edges AS (
    DELETE FROM job_dependencies WHERE child_id IN (SELECT id FROM doomed)
)
DELETE FROM jobs
WHERE id IN (SELECT id FROM doomed)
"""

#: Delete up to ``limit`` workflows older than the retention whose steps are all pruned.
#: Named parameters: age seconds float, limit int.
PRUNE_WORKFLOWS = f"""
DELETE FROM workflows
WHERE id IN (
    SELECT w.id
    FROM workflows AS w
    WHERE w.created_at < now() - make_interval(secs => %(age)s)
      AND NOT EXISTS (SELECT 1 FROM jobs AS j WHERE {steps_of("w", "j")})
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
#:
#: A unique job whose key another job holds now stays dead (docs/uniqueness.md, the traps): back
#: in its states, it would hold the key twice, which ``jobs_unique_uq`` refuses, and the whole
#: statement with it. (One whose states include ``dead`` holds its key already.) Of several dead
#: jobs of one such key asked for together, the newest is retried and the others stay dead, for
#: the same reason. A holder that a concurrent transaction writes is unseen here: the statement
#: then fails on the index once that transaction commits, and ``control.retry_dead_jobs`` runs it
#: again.
RETRY_DEAD_JOBS = """
UPDATE jobs
SET status = 'pending', attempts = 0, run_at = now(), finished_at = NULL,
    lease_expires_at = NULL, dead_cause = NULL
FROM (SELECT DISTINCT ON (d.unique_key, CASE WHEN d.unique_key IS NULL THEN d.id END) d.id
      FROM jobs AS d
      WHERE d.id = ANY(%s::uuid[]) AND d.status = 'dead'
      ORDER BY d.unique_key, CASE WHEN d.unique_key IS NULL THEN d.id END, d.id DESC) AS one
WHERE jobs.id = one.id AND jobs.status = 'dead'
  AND (jobs.unique_key IS NULL
       OR pgoutbox_unique_state(jobs.unique_states, 'dead')
       OR NOT EXISTS (SELECT FROM jobs AS holder
                      WHERE holder.unique_key = jobs.unique_key
                        AND holder.unique_key IS NOT NULL
                        AND pgoutbox_unique_state(holder.unique_states, holder.status)))
"""

#: Give up on dead jobs for good: they become 'cancelled' (and are pruned later).
CANCEL_DEAD_JOBS = """
UPDATE jobs
SET status = 'cancelled', finished_at = now(), dead_cause = NULL
WHERE id = ANY(%s::uuid[]) AND status = 'dead'
"""

#: Give ``limit`` dead letters without a cause theirs: those that a worker of a release before
#: migration 0014 killed while it applied, or an ``UPDATE`` of the application's own (the lease
#: recovery's maintenance job runs it). Read from ``jobs_dead_uncaused_idx``, whose predicate is
#: this statement's: an index with no entry, nearly always.
#:
#: Named parameters: limit int. Returns (id) of each.
FILL_DEAD_CAUSES = """
UPDATE jobs
SET dead_cause = pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary)
WHERE id = ANY(ARRAY(
    SELECT id FROM jobs WHERE status = 'dead' AND dead_cause IS NULL LIMIT %(limit)s
))
  AND status = 'dead' AND dead_cause IS NULL
RETURNING id
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

#: Cancel jobs: those not yet running (or waiting for others) end 'cancelled' at once; running
#: ones are asked to stop. Waiting jobs that wait for one cancelled here are cancelled too, in
#: this transaction (the triggers of migration 0016).
#:
#: Named parameters: ids uuid[], summary text, channel text, notify boolean. Returns (id, status,
#: a count) per job found: 'cancelled' (cancelled now, or already), 'cancelling' (running, asked
#: to stop), or the finished status it already had ('completed', 'dead').
#:
#: ``FOR UPDATE`` makes a cancel that races a claim wait for it and see the job 'leased', so a
#: job is never both claimed and cancelled as pending. Workers hear of a request at their next
#: lease renewal, or at once when the notification on ``channel`` (payload: the queue) arrives.
#: With ``notify``, the jobs cancelled now are told to their waiters (``queries.results``).
CANCEL_JOBS = f"""
WITH targets AS MATERIALIZED (
    -- locked in id order, as a worker's renewals and outcome writes mostly take them
    SELECT id, status, queue FROM jobs WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id FOR UPDATE
),
cancelled AS (
    UPDATE jobs AS j
    SET status = 'cancelled', finished_at = now(), last_error_code = 'cancelled',
        last_error_summary = %(summary)s, lease_expires_at = NULL
    FROM targets AS t
    WHERE j.id = t.id AND t.status IN ('waiting', 'pending', 'retrying')
    RETURNING j.id, j.status
),
requested AS (
    UPDATE jobs AS j
    SET cancel_requested_at = coalesce(j.cancel_requested_at, now())
    FROM targets AS t
    WHERE j.id = t.id AND t.status = 'leased'
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM requested) AS q
    WHERE %(notify)s
),
finished AS ({notify_finished("cancelled", "%(notify)s")})
SELECT t.id,
       CASE WHEN t.status IN ('waiting', 'pending', 'retrying') THEN 'cancelled'
            WHEN t.status = 'leased' THEN 'cancelling'
            ELSE t.status END,
       (SELECT count(*) FROM woken) + (SELECT count(*) FROM finished)
FROM targets AS t
"""

# -- dead letters by cause -----------------------------------------------------------------------
# A cause is pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary) (migration
# 0012), which the statements that kill a job write into dead_cause (0014: models.Job has who);
# jobs_dead_cause_idx holds it, with finished_at and id, for every dead job. Each cause is found
# by one descent, its newest and oldest dead letters by one descent each, and a cause is counted
# from the index's entries alone (an index-only scan, with status in the index's predicate).

#: Run before each statement below, in its transaction: the plans they are written for, along
#: jobs_dead_cause_idx. For a big cause the planner may prefer a bitmap scan, which reads every
#: row of the cause where the index alone answers.
DEAD_CAUSE_PLAN = (
    "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('enable_bitmapscan', 'off', true)"
)

#: The causes of the dead letters, in fingerprint order, at most ``limit`` of them, each with its
#: newest dead letter (the example), when it first and last died, and its size.
#:
#: Named parameters: limit int, cap int. Returns (fingerprint, example id, queue, job type, error
#: code, normalised summary, first seen, last seen, counted, estimate): ``counted`` is exact when
#: under ``cap``, else ``cap``; ``estimate`` is the share of the rows of ``jobs`` that ANALYZE
#: found with the cause (the column's most common values) times the rows, or NULL when it found
#: too few to say.
#:
#: A loose index scan of ``jobs_dead_cause_idx``: one descent per cause, never a pass over the
#: million entries of a ``GROUP BY``; the ``LIMIT`` ends the recursion.
DEAD_CAUSES = """
WITH RECURSIVE causes (fingerprint) AS (
    (SELECT dead_cause
     FROM jobs
     WHERE status = 'dead' AND dead_cause IS NOT NULL
     ORDER BY dead_cause
     LIMIT 1)
    UNION ALL
    SELECT (
        SELECT j.dead_cause
        FROM jobs AS j
        WHERE j.status = 'dead' AND j.dead_cause > causes.fingerprint
        ORDER BY j.dead_cause
        LIMIT 1
    )
    FROM causes
    WHERE causes.fingerprint IS NOT NULL
),
found AS (
    SELECT fingerprint FROM causes WHERE fingerprint IS NOT NULL LIMIT %(limit)s
),
estimates AS (
    SELECT u.fingerprint, u.share * t.reltuples AS rows
    FROM pg_class AS t
    JOIN pg_namespace AS n ON n.oid = t.relnamespace
    JOIN pg_stats AS s
      ON s.schemaname = n.nspname AND s.tablename = t.relname AND s.attname = 'dead_cause'
    CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
        AS u (fingerprint, share)
    WHERE t.oid = to_regclass('jobs') AND t.reltuples > 0
)
SELECT c.fingerprint, newest.id, newest.queue, newest.job_type, newest.last_error_code,
       pgoutbox_error_pattern(newest.last_error_summary), oldest.finished_at,
       newest.finished_at, counted.n, round(e.rows)::bigint
FROM found AS c
CROSS JOIN LATERAL (
    SELECT j.id, j.queue, j.job_type, j.last_error_code, j.last_error_summary, j.finished_at
    FROM jobs AS j
    WHERE j.status = 'dead' AND j.dead_cause = c.fingerprint
    ORDER BY j.finished_at DESC, j.id DESC
    LIMIT 1
) AS newest
CROSS JOIN LATERAL (
    SELECT j.finished_at
    FROM jobs AS j
    WHERE j.status = 'dead' AND j.dead_cause = c.fingerprint
    ORDER BY j.finished_at, j.id
    LIMIT 1
) AS oldest
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (
        SELECT
        FROM jobs AS j
        WHERE j.status = 'dead' AND j.dead_cause = c.fingerprint
        LIMIT %(cap)s
    ) AS capped
) AS counted
LEFT JOIN estimates AS e ON e.fingerprint = c.fingerprint
"""

#: The next ``limit`` dead letters of one cause, in (finished_at, id) order after a key, among
#: those dead at or before a moment (the confirmation page's: one that died later is left out).
#: The moment and the key are compared as rows that lead with the cause, which only
#: ``jobs_dead_cause_idx`` serves: with ``finished_at`` alone, a planner sure that a cause is
#: small read ``jobs_dead_finished_idx`` and tested every dead letter's cause (as here) instead.
#:
#: Named parameters: fingerprint text, as_of timestamptz, after_at timestamptz, after_id uuid
#: (``'-infinity'`` and any id to start), limit int. Returns (id, finished_at).
DEAD_CAUSE_IDS = """
SELECT j.id, j.finished_at
FROM jobs AS j
WHERE j.status = 'dead'
  AND j.dead_cause = %(fingerprint)s
  AND (j.dead_cause, j.finished_at) <= (%(fingerprint)s, %(as_of)s)
  AND (j.dead_cause, j.finished_at, j.id) > (%(fingerprint)s, %(after_at)s, %(after_id)s)
ORDER BY j.dead_cause, j.finished_at, j.id
LIMIT %(limit)s
"""

#: How many dead letters of one cause died at or before a moment: from the entries of
#: ``jobs_dead_cause_idx`` alone, where the visibility map says their pages hold no change to
#: check (vacuum sets it; a page changed since is read to check its rows). The moment is
#: compared as DEAD_CAUSE_IDS compares it.
#:
#: Named parameters: fingerprint text, as_of timestamptz. Returns (count).
COUNT_DEAD_CAUSE = """
SELECT count(*)
FROM jobs AS j
WHERE j.status = 'dead'
  AND j.dead_cause = %(fingerprint)s
  AND (j.dead_cause, j.finished_at) <= (%(fingerprint)s, %(as_of)s)
"""

#: The newest ``limit`` dead letters of one cause, newest first (the dead letters' changelist
#: filtered to a cause, which shows 1,000 at most).
#:
#: Named parameters: fingerprint text, limit int. Returns (id).
DEAD_CAUSE_NEWEST = """
SELECT j.id
FROM jobs AS j
WHERE j.status = 'dead' AND j.dead_cause = %(fingerprint)s
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s
"""
