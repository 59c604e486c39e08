"""Workflows: the statements that write a graph of jobs, and read a step's parents.

What a parent's end does to its waiting children is the triggers' of migration 0016, in the
transaction that writes the end, whichever statement writes it."""

from __future__ import annotations

from django_pgoutbox.queries.params import binary

#: Insert the steps of a workflow (or one job that waits for others), with parallel arrays as
#: ENQUEUE_JOBS does, and wake the queues of those that can run at once.
#:
#: Named parameters: ENQUEUE_JOBS's arrays, event_ids uuid[], trace_contexts text[] (JSON, or
#: NULL), and waiting_for int[] (how many parents each waits for; 0: none, so pending),
#: has_dependants boolean[], steps text[], on_upstream_failure text[], workflow_id uuid, channel
#: text, notify boolean. Sent in binary.
#:
#: A step with parents is 'waiting', in no claim index, until the triggers release it. A
#: repeated idempotency key returns no row (only ``enqueue(after=...)`` passes keys; the caller
#: then reads the existing job and writes no edge).
INSERT_STEPS = binary("""
WITH inserted AS (
    INSERT INTO jobs (
        id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at,
        max_attempts, event_id, trace_context, status, waiting_for, has_dependants,
        workflow_id, step, on_upstream_failure
    )
    SELECT r.id, r.organization_id, r.queue, r.job_type, r.payload::jsonb, r.idempotency_key,
           r.priority, COALESCE(r.run_at, now()) + make_interval(secs => r.delay),
           r.max_attempts, r.event_id, r.trace_context::jsonb,
           CASE WHEN r.waiting_for > 0 THEN 'waiting' ELSE 'pending' END,
           nullif(r.waiting_for, 0), nullif(r.has_dependants, false), %(workflow_id)s::uuid,
           r.step, r.on_upstream_failure
    FROM unnest(
        %(ids)s::uuid[], %(organization_ids)s::uuid[], %(queues)s::text[], %(job_types)s::text[],
        %(payloads)s::text[], %(idempotency_keys)s::text[], %(priorities)s::integer[],
        %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::integer[],
        %(event_ids)s::uuid[], %(trace_contexts)s::text[], %(waiting_for)s::integer[],
        %(has_dependants)s::boolean[], %(steps)s::text[], %(on_upstream_failure)s::text[]
    ) AS r(id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at,
           delay, max_attempts, event_id, trace_context, waiting_for, has_dependants, step,
           on_upstream_failure)
    ON CONFLICT (organization_id, job_type, idempotency_key)
        WHERE idempotency_key IS NOT NULL
        DO NOTHING
    RETURNING id, queue, status, run_at, created_at
),
woken AS (
    SELECT pg_notify(%(channel)s, queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'pending') AS q
    WHERE %(notify)s
)
SELECT id, run_at, created_at, (SELECT count(*) FROM woken) FROM inserted
""")

#: The edges of a graph: parent_ids uuid[], child_ids uuid[], external boolean[] (the parent was
#: not enqueued with the child: the constraint trigger of 0016 settles the edge at commit).
INSERT_EDGES = binary("""
INSERT INTO job_dependencies (parent_id, child_id, external)
SELECT * FROM unnest(%b::uuid[], %b::uuid[], %b::boolean[])
""")

#: The workflow's own row: id uuid, name text, organization_id uuid, steps int, first_step uuid,
#: last_step uuid (its steps' lowest and highest ids: see ``models.Workflow``).
INSERT_WORKFLOW = binary("""
INSERT INTO workflows (id, name, organization_id, steps, first_step, last_step)
VALUES (%b, %b, %b, %b, %b, %b)
RETURNING created_at
""")


#: The jobs of workflow ``w`` (an alias of ``workflows``) in table alias ``j``: those of its range
#: of the primary key that name it, read along ``jobs_pkey`` (no index of steps by workflow).
def steps_of(w: str, j: str) -> str:
    return f"{j}.id BETWEEN {w}.first_step AND {w}.last_step AND {j}.workflow_id = {w}.id"


#: Which of the given jobs exist (the parents a new job names that were not enqueued with it).
#: Parameter: ids uuid[].
EXISTING_JOBS = "SELECT id FROM jobs WHERE id = ANY(%s::uuid[])"

#: A step's parents, for ``ctx.parents``: id, step, status, result (JSON text), error code.
#: Parameter: the child's id.
PARENTS = """
SELECT p.id, p.step, p.status, p.result::text, p.last_error_code
FROM job_dependencies AS d JOIN jobs AS p ON p.id = d.parent_id
WHERE d.child_id = %s
ORDER BY p.step NULLS LAST, p.id
"""

#: The steps of a workflow not finished yet, for ``cancel_workflow``: one row per step, or one
#: row with a NULL id for a workflow with none; no row for an unknown workflow. Parameter:
#: workflow id.
UNFINISHED_STEPS = f"""
SELECT j.id
FROM workflows AS w
LEFT JOIN jobs AS j
    ON {steps_of("w", "j")} AND j.status NOT IN ('completed', 'dead', 'cancelled')
WHERE w.id = %s
"""
