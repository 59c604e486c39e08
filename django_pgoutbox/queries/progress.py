"""Progress and metadata of running jobs (``ctx.set_progress()``, ``ctx.set_meta()``)."""

from __future__ import annotations

#: Write what running attempts of this worker said of their progress and metadata; returns the
#: ids written.
#:
#: Named parameters: ids uuid[], attempts int[], progress text[] (JSON, or NULL: leave the
#: column), meta text[] (the same), worker_id text.
#:
#: Fenced like RECORD_OUTCOMES: a row is written only while this worker holds its lease for
#: this attempt. A stale worker's write matches nothing; so does a write that comes after the
#: job's outcome, which carries the attempt's last values itself (RECORD_OUTCOMES), so that a
#: finished job's progress is never overwritten. The rows are probed by primary key in id
#: order, the order RENEW_LEASES and RECORD_OUTCOMES lock them in. ``progress`` and ``meta``
#: are in no index: on a page with free space, a HOT update that writes no index entry.
WRITE_PROGRESS = """
WITH u AS MATERIALIZED (
    SELECT DISTINCT ON (id) id, attempt, progress, meta
    FROM unnest(
        %(ids)s::uuid[], %(attempts)s::integer[], %(progress)s::text[], %(meta)s::text[]
    ) AS u(id, attempt, progress, meta)
    ORDER BY id
)
UPDATE jobs AS j
SET progress = coalesce(u.progress::jsonb, j.progress),
    meta = coalesce(u.meta::jsonb, j.meta)
FROM u
WHERE j.id = ANY(ARRAY(SELECT id FROM u))  -- by primary key, in id order (RECORD_OUTCOMES)
  AND j.id = u.id
  AND j.attempts = u.attempt
  AND j.locked_by = %(worker_id)s
  AND (j.status = 'leased') IS TRUE  -- not jobs_leased_idx (RECORD_OUTCOMES)
RETURNING j.id
"""
