"""Leases: renewal, recovery of expired ones, suspects, and giving jobs back at shutdown."""

from __future__ import annotations

from django_pgoutbox.queries.attempts import append_attempt
from django_pgoutbox.queries.results import notify_finished

#: Extend the leases of the attempts this worker is running; returns the ids still held, each
#: with whether its cancellation was requested.
#:
#: Parameters: lease seconds float, ids uuid[], attempts int[], worker_id text.
#:
#: Fenced like RECORD_OUTCOMES. Only ``lease_expires_at`` changes, a column in no index, so on
#: a page with free space (fillfactor 80) this is a HOT update that writes no index entry.
RENEW_LEASES = """
WITH u AS MATERIALIZED (
    SELECT id, attempt, %s::float8 AS lease
    FROM unnest(%s::uuid[], %s::integer[]) AS u(id, attempt)
    ORDER BY id
)
UPDATE jobs AS j
SET lease_expires_at = now() + make_interval(secs => u.lease)
FROM u
WHERE j.id = ANY(ARRAY(SELECT id FROM u))  -- by primary key, in id order (RECORD_OUTCOMES)
  AND j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND (j.status = 'leased') IS TRUE  -- not jobs_leased_idx (RECORD_OUTCOMES)
RETURNING j.id, j.cancel_requested_at IS NOT NULL
"""

# The summary of an attempt lost with its worker (RECOVER_EXPIRED_LEASES), read from its row.
_LOST_SUMMARY = """'lease of attempt ' || attempts || ' held by ' || coalesce(locked_by, '?')
        || ' expired at ' || lease_expires_at
        || CASE WHEN alone_attempt = attempts
                THEN '; it ran as a suspect, alone: the attempt counts'
                ELSE '; the attempt is given back (lost ' || CASE WHEN last_error_code =
                     'lease_expired' THEN lost_attempts + 1 ELSE 1 END || ' time(s) in a row;'
                     || ' from 2, its next attempt runs alone and counts)'
           END"""
_LOST_LOGGED = append_attempt(
    row="", outcome="'lost'", code="'lease_expired'", summary=_LOST_SUMMARY
)

#: Make jobs whose lease expired claimable again, or dead when that was their last attempt.
#:
#: Named parameters: queue text or NULL (every queue), notify boolean (tell the jobs it ends
#: dead or cancelled to their waiters, as RECORD_OUTCOMES does).
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
#:
#: Each lost attempt appends its entry to ``attempt_log`` (``queries.attempts``), outcome
#: ``lost``, with the code and summary written to the row.
# Whether the lost attempt was the job's last that counts (RECOVER_EXPIRED_LEASES): it dies,
# unless its cancellation was asked.
_LOST_LAST = "alone_attempt = attempts AND attempts >= max_attempts"
RECOVER_EXPIRED_LEASES = f"""
WITH recovered AS (
    UPDATE jobs
    SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN {_LOST_LAST} THEN 'dead'
                      ELSE 'retrying' END,
        attempts = CASE WHEN alone_attempt IS DISTINCT FROM attempts THEN attempts - 1
                        ELSE attempts END,
        lost_attempts = CASE WHEN last_error_code = 'lease_expired' THEN lost_attempts + 1
                             ELSE 1 END,
        run_at = now(),
        finished_at = CASE WHEN cancel_requested_at IS NOT NULL OR ({_LOST_LAST}) THEN now() END,
        last_error_code = 'lease_expired',
        last_error_summary = {_LOST_SUMMARY},
        attempt_log = {_LOST_LOGGED},
        dead_cause = CASE WHEN cancel_requested_at IS NULL AND {_LOST_LAST}
                          THEN pgoutbox_error_fingerprint(job_type, 'lease_expired',
                                                          {_LOST_SUMMARY})
                     END,
        lease_expires_at = NULL
    WHERE status = 'leased'
      AND lease_expires_at < now()
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    RETURNING id, queue, status
),
finished AS ({notify_finished("recovered", "%(notify)s")})
SELECT id, queue, status FROM recovered
WHERE (SELECT count(*) FROM finished) >= 0  -- reading it sends its notifications
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

_RELEASED_SUMMARY = "'released by ' || j.locked_by || ' at shutdown'"
# A unique job whose key is held while pending only (debounce, states=("pending",)) goes back to
# pending from outside its states: it drops its key, which a newer job may hold by now
# (docs/uniqueness.md, the traps). Any other keeps it: leased is in its states.
_UNIQUE_KEY_KEPT = """unique_key = CASE WHEN pgoutbox_unique_state(j.unique_states, 'leased')
                                 THEN j.unique_key END"""
_RELEASED_LOGGED = append_attempt(
    row="j.", outcome="'released'", code="'worker_shutdown'", summary=_RELEASED_SUMMARY
)

#: Give back jobs this worker claimed but will not finish (graceful shutdown past its grace).
#:
#: Parameters: ids uuid[], attempts int[], worker_id text.
#:
#: They return to 'pending', due now, for another worker (or end 'cancelled' if that was
#: asked). The attempt stays counted: it did start, and its side effects may have happened
#: (handlers are idempotent). A job released during its last attempt is dead, as it would be
#: had its lease expired: it never gets more than ``max_attempts`` attempts. The attempt appends
#: its entry to ``attempt_log`` (``queries.attempts``), outcome ``released``.
RELEASE_JOBS = f"""
UPDATE jobs AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts THEN 'dead'
                  ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                       THEN now() END,
    run_at = now(),
    lease_expires_at = NULL,
    last_error_code = 'worker_shutdown',
    last_error_summary = {_RELEASED_SUMMARY},
    attempt_log = {_RELEASED_LOGGED},
    dead_cause = CASE WHEN j.cancel_requested_at IS NULL AND j.attempts >= j.max_attempts
                      THEN pgoutbox_error_fingerprint(j.job_type, 'worker_shutdown',
                                                      {_RELEASED_SUMMARY})
                 END,
    {_UNIQUE_KEY_KEPT}
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
UNCLAIM_JOBS = f"""
UPDATE jobs AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() END,
    attempts = j.attempts - 1,
    worker_ids = j.worker_ids - (-1),
    run_at = now(),
    lease_expires_at = NULL,
    {_UNIQUE_KEY_KEPT}
FROM unnest(%s::uuid[], %s::integer[]) AS u(id, attempt)
WHERE j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %s
  AND j.status = 'leased'
"""
