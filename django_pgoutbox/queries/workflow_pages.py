"""Workflows in the admin: the statements that read a page of workflows' states, a workflow's
steps and edges, and a job's parents and children. Each is bounded by a ``LIMIT`` that the
caller passes, whatever the graph holds."""

from __future__ import annotations

from django_pgoutbox.queries.workflows import steps_of

#: The states of a page of workflows: (workflow id, status, count) for each status found among
#: the first ``limit`` steps of each (a lateral scan of each one's range of ``jobs_pkey``).
#: A workflow whose counts add up to ``limit`` has more steps than were counted.
#: Parameters: ids uuid[], limit int.
WORKFLOW_STATES = f"""
SELECT w.id, s.status, count(*)::integer
FROM unnest(%s::uuid[]) AS u(id)
JOIN workflows AS w ON w.id = u.id
CROSS JOIN LATERAL (
    SELECT j.status FROM jobs AS j WHERE {steps_of("w", "j")} ORDER BY j.id LIMIT %s
) AS s
GROUP BY w.id, s.status
"""

#: A workflow's steps, the first ``limit`` in the order they were enqueued (ids are UUIDv7):
#: id, step, job_type, queue, status, attempts, max_attempts, waiting_for, run_at, locked_at,
#: finished_at, last_error_code. Parameters: workflow id, limit int.
WORKFLOW_STEPS = f"""
SELECT j.id, j.step, j.job_type, j.queue, j.status, j.attempts, j.max_attempts, j.waiting_for,
       j.run_at, j.locked_at, j.finished_at, j.last_error_code
FROM workflows AS w JOIN jobs AS j ON {steps_of("w", "j")}
WHERE w.id = %s
ORDER BY j.id
LIMIT %s
"""

#: The edges into a workflow's steps, the first ``limit``: parent id, child id, external
#: (the parent was enqueued before the workflow, not as a step of it). A parent that is neither
#: a step read nor external is a step that retention deleted. Read along the workflow's range of
#: ``jobs_pkey`` and ``job_dependencies_child_idx``. Parameters: workflow id, limit int.
WORKFLOW_EDGES = f"""
SELECT d.parent_id, d.child_id, d.external
FROM workflows AS w
JOIN jobs AS c ON {steps_of("w", "c")}
JOIN job_dependencies AS d ON d.child_id = c.id
WHERE w.id = %s
ORDER BY d.child_id, d.parent_id
LIMIT %s
"""

#: A job's parents, the first ``limit`` by id: parent id, its step, job type, status, workflow
#: (NULLs for a parent no longer kept). Parameters: the job's id, limit int.
JOB_PARENTS = """
SELECT d.parent_id, p.step, p.job_type, p.status, p.workflow_id
FROM job_dependencies AS d LEFT JOIN jobs AS p ON p.id = d.parent_id
WHERE d.child_id = %s
ORDER BY d.parent_id
LIMIT %s
"""

#: A job's children, the first ``limit`` by id, as JOB_PARENTS gives its parents (through the
#: primary key of ``job_dependencies``, which leads with the parent). Parameters: the job's id,
#: limit int.
JOB_CHILDREN = """
SELECT d.child_id, c.step, c.job_type, c.status, c.workflow_id
FROM job_dependencies AS d LEFT JOIN jobs AS c ON c.id = d.child_id
WHERE d.parent_id = %s
ORDER BY d.child_id
LIMIT %s
"""
