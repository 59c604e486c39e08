"""Sequences: the statements that put a job at the end of its sequence, and skip a dead one.

A sequence job waits (an edge of job_dependencies) for the job of its key enqueued before it
that has not finished; the triggers of migrations 0016 and 0018 release it. See
``django_pgoutbox.sequences``."""

from __future__ import annotations

from django_pgoutbox.queries.params import binary

#: The advisory lock of each sequence key, for the transaction, in the order of the lock keys (an
#: ``enqueue_many`` of several keys takes them in the order every other one does: no deadlock
#: between two enqueuers of the same keys given in opposite orders). Namespaced as CLAIM_LOCK.
#: Also returns the transaction's isolation level: in REPEATABLE READ, the tail read after the
#: lock would come from a snapshot taken before it (``sequences.enqueue_in_sequence`` refuses).
#:
#: Parameter: keys text[].
LOCK_SEQUENCES = """
SELECT count(pg_advisory_xact_lock(k.lock)), current_setting('transaction_isolation')
FROM (
    SELECT DISTINCT hashtextextended('pgoutbox.sequence:' || key, 0) AS lock
    FROM unnest(%s::text[]) AS key
    -- the enqueue is refused in any other: it must not hold the keys to the caller's end
    WHERE current_setting('transaction_isolation') = 'read committed'
    ORDER BY 1
) AS k
"""

#: Insert one job at the end of its sequence, under the key's lock (LOCK_SEQUENCES, in a
#: statement before this one, so that this statement's snapshot sees every enqueue of the key
#: that committed before the lock was granted).
#:
#: The tail is the newest job of the key that has not completed or been cancelled (a dead job
#: holds its sequence), one descent of jobs_sequence_tail_idx. With one, the job is 'waiting'
#: for it, by an edge that the caller inserts once every row of its batch is written
#: (INSERT_EDGES, in parent order). The edge is ``external``: the constraint trigger of 0016
#: locks the tail at the commit and settles the edge then if the tail ended meanwhile (this
#: statement's snapshot may not see that end, and the end's settling not this edge). The
#: triggers lock the parents in the order their edges were inserted: in the order of a batch's
#: items, a batch naming keys whose tails' ids go down held one tail while waiting for another
#: that a worker or a cancel, locking both in id order, held while waiting for the first.
#:
#: Named parameters: id, organization_id, queue, job_type, payload (JSON text),
#: idempotency_key, priority, run_at, delay, max_attempts, event_id, trace_context (JSON text),
#: sequence_key, channel, notify. Returns (id, status, run_at, created_at, sequence_position,
#: parent id) of the job written (the parent: the tail, to insert the edge from); no row for a
#: repeated idempotency key.
ENQUEUE_IN_SEQUENCE = binary("""
WITH tail AS MATERIALIZED (
    SELECT t.id FROM jobs AS t
    WHERE t.sequence_key = %(sequence_key)s
      AND t.sequence_key IS NOT NULL AND NOT (t.status IN ('completed', 'cancelled'))
    ORDER BY t.sequence_position DESC
    LIMIT 1
),
inserted AS (
    INSERT INTO jobs (
        id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at,
        max_attempts, event_id, trace_context, status, waiting_for, on_upstream_failure,
        sequence_key, sequence_position
    )
    SELECT %(id)s::uuid, %(organization_id)s::uuid, %(queue)s::text, %(job_type)s::text,
           %(payload)s::text::jsonb, %(idempotency_key)s::text, %(priority)s::integer,
           COALESCE(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s::float8),
           %(max_attempts)s::integer, %(event_id)s::uuid, %(trace_context)s::text::jsonb,
           CASE WHEN p.id IS NULL THEN 'pending' ELSE 'waiting' END,
           CASE WHEN p.id IS NULL THEN NULL ELSE 1 END,
           'hold', %(sequence_key)s::text, nextval('pgoutbox_sequence_positions')
    FROM (SELECT 1) AS one LEFT JOIN tail AS p ON true
    ON CONFLICT (organization_id, job_type, idempotency_key)
        WHERE idempotency_key IS NOT NULL
        DO NOTHING
    RETURNING id, queue, status, run_at, created_at, sequence_position
),
woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM inserted WHERE status = 'pending' AND %(notify)s
)
SELECT i.id, i.status, i.run_at, i.created_at, i.sequence_position, (SELECT id FROM tail),
       (SELECT count(*) FROM woken)
FROM inserted AS i
""")

#: Skip dead jobs: they end 'cancelled' with code 'skipped' and the operator's reason, which
#: releases the next job of their sequence (the row trigger of 0018 notes dead -> cancelled).
#: Named parameters: ids uuid[], summary text. Returns (id) of each.
SKIP_DEAD_JOBS = """
UPDATE jobs
SET status = 'cancelled', finished_at = now(), dead_cause = NULL,
    last_error_code = 'skipped', last_error_summary = %(summary)s
WHERE id = ANY(%(ids)s::uuid[]) AND status = 'dead'
RETURNING id
"""
