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

#: One queue's row, as its workers read it: whether it is paused, and its overrides.
#:
#: Positional parameter: queue text.
READ_QUEUE_CONTROL = "SELECT paused_at IS NOT NULL, overrides FROM queue_controls WHERE queue = %s"
