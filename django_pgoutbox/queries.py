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
#: (NULL = now), delays interval[], max_attempts int[], channel text, notify boolean.
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
           r.priority, COALESCE(r.run_at, now()) + r.delay, r.max_attempts
    FROM unnest(
        %s::uuid[], %s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[],
        %s::integer[], %s::timestamptz[], %s::interval[], %s::integer[]
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
