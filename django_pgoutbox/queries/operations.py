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
