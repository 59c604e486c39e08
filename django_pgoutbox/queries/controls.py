"""Queues paused, resumed and resized at run time (``queue_controls``)."""

from __future__ import annotations

#: The columns every statement here returns, in this order (``queue_controls.ControlRow``).
_CONTROL_COLUMNS = "queue, paused_at, paused_by, overrides, updated_at, updated_by"

#: Pause a queue (a queue already paused keeps when and by whom); tell the workers.
#:
#: Named parameters: queue text, by text, channel text.
PAUSE_QUEUE = f"""
WITH c AS (
    INSERT INTO queue_controls AS c (queue, paused_at, paused_by, updated_by)
    VALUES (%(queue)s, now(), %(by)s, %(by)s)
    ON CONFLICT (queue) DO UPDATE
    SET paused_at = coalesce(c.paused_at, now()),
        paused_by = CASE WHEN c.paused_at IS NULL THEN EXCLUDED.paused_by ELSE c.paused_by END,
        updated_at = now(),
        updated_by = EXCLUDED.updated_by
    RETURNING {_CONTROL_COLUMNS}
)
SELECT {_CONTROL_COLUMNS}, pg_notify(%(channel)s, queue) FROM c
"""

#: Resume a queue (nothing to do for one not paused, or with no row); tell the workers.
#:
#: Named parameters: queue text, by text, channel text.
RESUME_QUEUE = f"""
WITH c AS (
    UPDATE queue_controls
    SET paused_at = NULL, paused_by = NULL, updated_at = now(), updated_by = %(by)s
    WHERE queue = %(queue)s AND paused_at IS NOT NULL
    RETURNING {_CONTROL_COLUMNS}
)
SELECT {_CONTROL_COLUMNS}, pg_notify(%(channel)s, queue) FROM c
"""

#: Set some of a queue's values in place of its settings and reset others to them; tell the
#: workers.
#:
#: Named parameters: queue text, set jsonb (an object: key -> value), reset text[] (keys), by
#: text, channel text.
RESIZE_QUEUE = f"""
WITH c AS (
    INSERT INTO queue_controls AS c (queue, overrides, updated_by)
    VALUES (%(queue)s, %(set)s::jsonb, %(by)s)
    ON CONFLICT (queue) DO UPDATE
    SET overrides = (c.overrides - %(reset)s::text[]) || EXCLUDED.overrides,
        updated_at = now(),
        updated_by = EXCLUDED.updated_by
    RETURNING {_CONTROL_COLUMNS}
)
SELECT {_CONTROL_COLUMNS}, pg_notify(%(channel)s, queue) FROM c
"""

#: Every queue's row (few: one per queue an operator changed).
QUEUE_CONTROLS = f"SELECT {_CONTROL_COLUMNS} FROM queue_controls ORDER BY queue"

#: One queue's row, as its workers read it: whether it is paused, and its overrides (as text:
#: ``Control.from_row`` decodes it, and says so if it cannot, where the driver's loader would
#: raise on the lane).
#:
#: Positional parameter: queue text.
READ_QUEUE_CONTROL = (
    "SELECT paused_at IS NOT NULL, overrides::text FROM queue_controls WHERE queue = %s"
)


# -- queue_minutes: the admin's charts -----------------------------------------------------------

#: Add a process's outcome counts to this minute's rows, one per queue (the heartbeat's).
#:
#: Named parameters: queues text[], completed int[], failed int[], dead int[]. Rows are written
#: in queue order, so that two processes adding at once lock them in one order.
ADD_QUEUE_OUTCOMES = """
INSERT INTO queue_minutes AS m (queue, minute, completed, failed, dead)
SELECT queue, date_trunc('minute', now()), completed, failed, dead
FROM unnest(%(queues)s::text[], %(completed)s::integer[], %(failed)s::integer[],
            %(dead)s::integer[]) AS u(queue, completed, failed, dead)
ORDER BY queue
ON CONFLICT (queue, minute) DO UPDATE
SET completed = m.completed + EXCLUDED.completed,
    failed = m.failed + EXCLUDED.failed,
    dead = m.dead + EXCLUDED.dead
"""

#: Record a sample of each queue's backlog in this minute's row (the largest of the minute).
#:
#: Named parameters: queues text[], backlogs int[], ages float8[].
SAMPLE_QUEUE_BACKLOGS = """
INSERT INTO queue_minutes AS m (queue, minute, backlog, oldest_pending_age)
SELECT queue, date_trunc('minute', now()), backlog, age
FROM unnest(%(queues)s::text[], %(backlogs)s::integer[], %(ages)s::float8[])
    AS u(queue, backlog, age)
ORDER BY queue
ON CONFLICT (queue, minute) DO UPDATE
SET backlog = GREATEST(m.backlog, EXCLUDED.backlog),
    oldest_pending_age = GREATEST(m.oldest_pending_age, EXCLUDED.oldest_pending_age)
"""

#: Delete the minutes older than the charts show.
#:
#: Positional parameter: hours float.
PRUNE_QUEUE_MINUTES = """
DELETE FROM queue_minutes WHERE minute < now() - make_interval(secs => %s * 3600)
"""

#: The minutes of the last hours, every queue's, in order: what the charts draw; each row with the
#: current minute (one row with a null queue when there are none).
#:
#: Positional parameter: hours float.
QUEUE_MINUTES = """
SELECT m.queue, m.minute, m.completed, m.failed, m.dead, m.backlog, m.oldest_pending_age, n.now
FROM (SELECT date_trunc('minute', now()) AS now) AS n
LEFT JOIN queue_minutes AS m ON m.minute >= n.now - make_interval(secs => %s * 3600)
ORDER BY m.queue, m.minute
"""
