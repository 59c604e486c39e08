"""Unique jobs: the insert that yields to a job holding the key, the update of the job that waits
(``on_conflict="replace"``, ``debounce``) and the read of the job that holds it
(docs/uniqueness.md, ``uniqueness``)."""

from __future__ import annotations

from django_pgoutbox.queries.params import binary

# The job's run_at: the requested moment (NULL = now) plus the delay; with ``next_window``, the
# start of the period's next window after it (a throttled job whose window is taken). The window
# of a moment is floor(epoch / period), an exact numeric: a window's start is in it.
_AT = "(COALESCE(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8))"
_RUN_AT = f"""(CASE WHEN %(next_window)s
    THEN to_timestamp(((floor(extract(epoch FROM {_AT}) / %(period)s::bigint) + 1)
                       * %(period)s::bigint)::float8)
    ELSE {_AT} END)"""
# The job's key: its policy's hash, then, with a period, the window of its run_at.
_KEY = f"""(%(unique_key)s::text || CASE WHEN %(period)s::bigint IS NULL THEN ''
    ELSE '@' || floor(extract(epoch FROM {_RUN_AT}) / %(period)s::bigint)::bigint::text END)"""


#: One unique job: ENQUEUE_JOB's row, with its key and states.
#:
#: Named parameters: ENQUEUE_JOB's (id, organization_id, queue, job_type, payload,
#: idempotency_key, priority, run_at, delay, max_attempts, event_id, notify, channel) and
#: unique_key text (the policy's hash), unique_states int, period bigint (seconds; NULL: none),
#: next_window boolean. Sent in binary.
#:
#: ``ON CONFLICT ... DO NOTHING`` on ``jobs_unique_uq``: a held key makes it a no-op, also against
#: a concurrent transaction inserting the key (the insert waits for it, then skips). A conflict
#: returns no row; the caller then updates or reads the job that holds the key.
def _enqueue_unique_job(conflict: str) -> str:
    return binary(f"""
INSERT INTO jobs (
    id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at, max_attempts,
    event_id, unique_key, unique_states
)
VALUES (%(id)s, %(organization_id)s, %(queue)s, %(job_type)s, %(payload)s::jsonb,
        %(idempotency_key)s, %(priority)s, {_RUN_AT}, %(max_attempts)s, %(event_id)s::uuid,
        {_KEY}, %(unique_states)s::integer)
ON CONFLICT {conflict} DO NOTHING
RETURNING run_at, created_at, unique_key,
    CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue)::text END
""")


ENQUEUE_UNIQUE_JOB = _enqueue_unique_job(
    "(unique_key) WHERE unique_key IS NOT NULL AND pgoutbox_unique_state(unique_states, status)"
)

#: ENQUEUE_UNIQUE_JOB for a job with an idempotency key too: every unique index is an arbiter,
#: so that either key held makes it a no-op. (Naming only ``jobs_unique_uq`` spares the others'
#: checks when there is no idempotency key, which cannot conflict.)
ENQUEUE_UNIQUE_KEYED_JOB = _enqueue_unique_job("")

#: The job that waits with the key (pending or retrying), given the new payload
#: (``on_conflict="replace"``) and run_at (``replace`` or ``debounce``; a throttled job keeps the
#: start of its window), and its queue woken.
#:
#: Named parameters: ENQUEUE_UNIQUE_JOB's, and replace boolean, move boolean. Sent in binary.
#: Returns the job's id, or nothing if no job with the key waits (it runs, or it is gone).
#: A plain UPDATE, not ``ON CONFLICT DO UPDATE``: that one locks the row that holds the key
#: whatever its state, and a leased job's row locked until the enqueuer commits would hold up the
#: worker that records its outcome.
UPDATE_WAITING_UNIQUE_JOB = binary(f"""
UPDATE jobs
SET payload = CASE WHEN %(replace)s THEN %(payload)s::jsonb ELSE payload END,
    run_at = CASE WHEN %(move)s THEN {_RUN_AT} ELSE run_at END
WHERE unique_key = {_KEY}
  AND unique_key IS NOT NULL AND pgoutbox_unique_state(unique_states, status)
  AND status IN ('pending', 'retrying')
RETURNING id, CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue)::text END
""")

#: The id of the job that holds the key, if one does.
#:
#: Named parameters: ENQUEUE_UNIQUE_JOB's. Sent in binary. Read from ``jobs_unique_uq``.
FIND_UNIQUE_JOB = binary(f"""
SELECT id FROM jobs
WHERE unique_key = {_KEY}
  AND unique_key IS NOT NULL AND pgoutbox_unique_state(unique_states, status)
""")
