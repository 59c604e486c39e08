"""Unique jobs: the insert that yields to a job holding the key, the update of the job that waits
(``on_conflict="replace"``, ``debounce``) and the read of the job that holds it
(docs/uniqueness.md, ``uniqueness``).

Each comes in two versions: without a period, the key is the policy's hash as given; with one
(``Unique(period=...)``, ``throttle``), the statement appends the window of the job's ``run_at``
by the database's clock. The window's expressions cost the plain version a third of its time
(``benchmarks/unique.py``), so a job without a period never carries them.
"""

from __future__ import annotations

from django_pgoutbox.queries.params import binary

# The job's run_at: the requested moment (NULL = now) plus the delay.
_AT = "COALESCE(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8)"
# With a period: with ``next_window``, the start of the period's next window after it (a
# throttled job whose window is taken). The window of a moment is floor(epoch / period), an
# exact numeric: a window's start is in it.
_WINDOW_RUN_AT = f"""(CASE WHEN %(next_window)s
    THEN to_timestamp(((floor(extract(epoch FROM {_AT}) / %(period)s::bigint) + 1)
                       * %(period)s::bigint)::float8)
    ELSE {_AT} END)"""
# The job's key: the policy's hash; with a period, the md5 of that and the window of its run_at.
_WINDOW_KEY = f"""md5(%(unique_key)s::uuid::text || '@'
    || floor(extract(epoch FROM {_WINDOW_RUN_AT}) / %(period)s::bigint)::bigint::text)::uuid"""
_KEY = "%(unique_key)s::uuid"

_HELD = "unique_key IS NOT NULL AND pgoutbox_unique_state(unique_states, status)"


def _insert(run_at: str, key: str) -> str:
    return binary(f"""
INSERT INTO jobs (
    id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at, max_attempts,
    event_id, trace_context, unique_key, unique_states
)
VALUES (%(id)s, %(organization_id)s, %(queue)s, %(job_type)s, %(payload)s::jsonb,
        %(idempotency_key)s, %(priority)s, {run_at}, %(max_attempts)s, %(event_id)s::uuid,
        %(trace_context)s::text::jsonb, {key}, %(unique_states)s::integer)
ON CONFLICT DO NOTHING
RETURNING run_at, created_at, unique_key,
    CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue)::text END
""")


#: One unique job: ENQUEUE_JOB's row, with its key and states.
#:
#: Named parameters: ENQUEUE_JOB's (id, organization_id, queue, job_type, payload,
#: idempotency_key, priority, run_at, delay, max_attempts, event_id, trace_context, notify,
#: channel) and unique_key uuid (the policy's hash), unique_states int. The ``*_PERIOD_*``
#: versions take period bigint (seconds) and next_window boolean too. Sent in binary.
#:
#: ``ON CONFLICT DO NOTHING`` names no index: a held key (``jobs_unique_uq``) and a repeated
#: idempotency key both make it a no-op, also against a concurrent transaction inserting either
#: (the insert waits for it, then skips). A conflict returns no row; the caller then updates or
#: reads the job that holds the key. (Naming ``jobs_unique_uq`` with its predicate made the
#: statement a quarter slower: ``benchmarks/unique.py``, docs/benchmarks.md item 33.)
ENQUEUE_UNIQUE_JOB = _insert(_AT, _KEY)
ENQUEUE_UNIQUE_PERIOD_JOB = _insert(_WINDOW_RUN_AT, _WINDOW_KEY)


def _update(run_at: str, key: str) -> str:
    return binary(f"""
UPDATE jobs
SET payload = CASE WHEN %(replace)s THEN %(payload)s::jsonb ELSE payload END,
    run_at = CASE WHEN %(move)s THEN {run_at} ELSE run_at END
WHERE unique_key = {key} AND {_HELD}
  AND status IN ('pending', 'retrying')
RETURNING id, CASE WHEN %(notify)s THEN pg_notify(%(channel)s, queue)::text END
""")


#: The job that waits with the key (pending or retrying), given the new payload
#: (``on_conflict="replace"``) and run_at (``replace`` or ``debounce``; a throttled job keeps the
#: start of its window), and its queue woken.
#:
#: Named parameters: ENQUEUE_UNIQUE_JOB's (or the period version's), and replace boolean, move
#: boolean. Sent in binary. Returns the job's id, or nothing if no job with the key waits (it
#: runs, or it is gone). A plain UPDATE, not ``ON CONFLICT DO UPDATE``: that one locks the row
#: that holds the key whatever its state, and a leased job's row locked until the enqueuer
#: commits would hold up the worker that records its outcome.
UPDATE_WAITING_UNIQUE_JOB = _update(_AT, _KEY)
UPDATE_WAITING_UNIQUE_PERIOD_JOB = _update(_WINDOW_RUN_AT, _WINDOW_KEY)

#: The id of the job that holds the key, if one does.
#:
#: Named parameters: ENQUEUE_UNIQUE_JOB's (or the period version's). Sent in binary. Read from
#: ``jobs_unique_uq``.
FIND_UNIQUE_JOB = binary(f"SELECT id FROM jobs WHERE unique_key = {_KEY} AND {_HELD}")
FIND_UNIQUE_PERIOD_JOB = binary(f"SELECT id FROM jobs WHERE unique_key = {_WINDOW_KEY} AND {_HELD}")
