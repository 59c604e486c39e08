"""Priority aging (``QUEUES[...]["PRIORITY_AGING"]``): the pass that raises the priority of the
jobs that wait, and the per-queue row that spaces the passes."""

from __future__ import annotations

#: Start a pass of aging on a queue, unless one started less than ``spacing`` seconds ago;
#: returns a row when this caller is to run it.
#:
#: Parameters: queue text, spacing seconds float.
#:
#: Every worker of an aging queue asks (with its lease recovery); one of them in each spacing
#: gets the row: the queue's passes do not grow with its workers. The pass is idempotent (see
#: AGE_PRIORITIES), so this only saves work: two passes at once, or a pass cut short, raise no
#: job twice and lose no raise.
START_AGING_PASS = """
INSERT INTO queue_aging AS a (queue, aged_at) VALUES (%s, now())
ON CONFLICT (queue) DO UPDATE SET aged_at = now()
WHERE a.aged_at <= now() - make_interval(secs => %s::float8)
   OR a.aged_at > now()  -- a clock set back, or a row written by hand: not a pass forever late
RETURNING 1
"""

# The priority a waiting job is due, from its priority before aging (``base_priority``, NULL
# until aging first raises it) and how long it has been due: one more per ``every`` seconds,
# never above ``up_to`` (nor below the priority it has). In bigint: a base near the int4 limit
# plus its steps does not overflow; ``up_to`` is an int4, and so is the result.
_DUE_PRIORITY = """least(
        %(up_to)s::bigint,
        coalesce({row}base_priority, {row}priority)::bigint
            + floor(extract(epoch FROM now() - {row}run_at)::float8 / %(every)s::float8)::bigint
    )"""

# The jobs of one queue whose due priority is above the one they have, in claim order, past a
# cursor: the rest of the cursor's priority after it, then the lower priorities (the two
# branches of the seek claim, ``claims._SEEK_CANDIDATES``, for the same reason: the index's
# order mixes directions). Each branch reads ``jobs_claim_idx`` from ``queue`` and the priority,
# ``run_at <= now() - every`` filters its entries in the index (a job due for less than a step
# has no raise due), and only the rest are read from the table.
_AGING_CANDIDATE = f"""
        SELECT id, priority, run_at, created_at
        FROM jobs
        WHERE queue = %(queue)s
          AND status IN ('pending', 'retrying')
          AND {{bound}}
          AND priority < %(up_to)s
          AND run_at <= now() - make_interval(secs => %(every)s::float8)
          AND isfinite(run_at)  -- '-infinity', written by hand, has no wait to measure
          AND {_DUE_PRIORITY.format(row="")} > priority
        ORDER BY priority DESC, run_at, created_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED"""

#: Raise the priority of up to ``limit`` waiting jobs of a queue to the priority their wait is
#: due (see ``_DUE_PRIORITY``), the first in claim order past the cursor; returns one row: how
#: many it raised, and the cursor for the next batch (the last job it read, NULLs when none).
#:
#: Named parameters: queue text, every seconds float, up_to int, limit int, channel text,
#: notify boolean (a wake-up of the queue when it raised a job), and the cursor:
#: after_priority int, after_run_at timestamptz, after_created_at timestamptz, after_id uuid.
#: A pass starts with ``after_priority = up_to`` (and any other cursor: nothing is below the
#: cap at the cap) and goes on from each batch's cursor until a batch comes back short.
#:
#: Idempotent: a job is written only when its due priority is above its priority, and then set
#: to it, never by a count of passes. So a pass run twice (two workers, a pass killed and run
#: again) raises nothing more, a job is written at most ``up_to - base`` times in its life, and
#: one aging skipped for a while catches up at once. ``priority < up_to`` leaves a job enqueued
#: at or above the cap as it is, and the priority is never lowered.
#:
#: A raised job moves up in the index, before the cursor: no later batch of the pass reads it
#: again. Rows locked by a claim in flight are skipped (SKIP LOCKED): the claim takes them
#: anyway; the lock's re-check of the ``WHERE`` leaves out a row leased meanwhile. The jobs are
#: written by ``id = ANY(ARRAY(...))``, probes of the primary key, as the claim's update does.
AGE_PRIORITIES = f"""
WITH due AS MATERIALIZED (
    SELECT * FROM ({
    _AGING_CANDIDATE.format(
        bound="priority = %(after_priority)s AND (run_at, created_at, id) "
        "> (%(after_run_at)s::timestamptz, %(after_created_at)s::timestamptz, %(after_id)s::uuid)"
    )
}
    ) AS rest_of_priority
    UNION ALL
    SELECT * FROM ({_AGING_CANDIDATE.format(bound="priority < %(after_priority)s")}
    ) AS lower_priorities
    LIMIT %(limit)s
),
raised AS (
    UPDATE jobs AS j
    SET base_priority = coalesce(j.base_priority, j.priority),
        priority = greatest(j.priority, {_DUE_PRIORITY.format(row="j.")})
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING j.id
),
-- Jobs raised sort before the seek claims' marks of the queue's workers: a wake-up makes each
-- take a full claim (claims.woken), as a job enqueued behind a mark does.
woken AS (
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE %(notify)s AND EXISTS (SELECT 1 FROM raised)
),
last AS (
    SELECT priority, run_at, created_at, id FROM due
    ORDER BY priority, run_at DESC, created_at DESC, id DESC  -- the last in claim order
    LIMIT 1
)
SELECT (SELECT count(*) FROM raised), (SELECT count(*) FROM due), (SELECT count(*) FROM woken),
       last.priority, last.run_at, last.created_at, last.id
FROM (SELECT 1) AS one LEFT JOIN last ON true
"""
