"""Monitoring: heartbeats, gauges, the scheduler's cursors and the system checks."""

from __future__ import annotations

#: Write (or refresh) this process's heartbeat row.
#:
#: Named parameters: worker_id text, hostname text, pid int, roles text (JSON array), queues text
#: (JSON array).
HEARTBEAT = """
INSERT INTO worker_heartbeats (worker_id, hostname, pid, roles, queues)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(roles)s::jsonb, %(queues)s::jsonb)
ON CONFLICT (worker_id) DO UPDATE SET
    last_seen_at = now(),
    -- a --worker-id used again by a new process: the row describes the new one
    hostname = EXCLUDED.hostname,
    pid = EXCLUDED.pid,
    roles = EXCLUDED.roles,
    queues = EXCLUDED.queues,
    started_at = CASE WHEN (worker_heartbeats.hostname, worker_heartbeats.pid)
                           IS DISTINCT FROM (EXCLUDED.hostname, EXCLUDED.pid)
                      THEN now() ELSE worker_heartbeats.started_at END
"""

#: Mark (or unmark) one queue of a worker as stuck in its heartbeat row.
#:
#: Named parameters: queue text, stuck boolean, worker_id text. One row's jsonb changes at once:
#: the dispatchers of a process's queues can each send theirs.
SET_STUCK_QUEUE = """
UPDATE worker_heartbeats
SET stuck_queues = (stuck_queues - %(queue)s::text)
    || CASE WHEN %(stuck)s THEN jsonb_build_array(%(queue)s::text) ELSE '[]'::jsonb END
WHERE worker_id = %(worker_id)s
"""

#: Every heartbeat row, with the seconds since it was last written by the database clock.
WORKER_HEARTBEATS = """
SELECT worker_id, hostname, pid, roles, queues, started_at,
       extract(epoch FROM now() - last_seen_at)::float8, stuck_queues
FROM worker_heartbeats
ORDER BY worker_id
"""

# -- gauges --------------------------------------------------------------------------------------

#: The jobs of each queue by status: (queue, status, count, scheduled, oldest due age).
#:
#: Each branch reads one partial index: the claim index (pending, retrying), the leased index,
#: the dead-letter index. Finished rows, however many, are never read.
JOB_GAUGES = """
SELECT queue, 'pending', count(*) FILTER (WHERE run_at <= now()),
       count(*) FILTER (WHERE run_at > now()),
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now())), 0)
FROM jobs WHERE status = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'retrying', count(*), 0, 0 FROM jobs WHERE status = 'retrying' GROUP BY queue
UNION ALL
SELECT queue, 'leased', count(*), 0, 0 FROM jobs WHERE status = 'leased' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*), 0, 0 FROM jobs WHERE status = 'dead' GROUP BY queue
"""

#: The outbox's backlog (waiting, dead, the oldest available event's age in seconds), the age of
#: the oldest open transaction (the xmin horizon that holds back vacuum), and the fraction of the
#: NOTIFY queue in use.
OUTBOX_AND_SERVER_GAUGES = """
SELECT
    (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NULL),
    (SELECT count(*) FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NOT NULL),
    coalesce((SELECT extract(epoch FROM now() - min(occurred_at)) FROM outbox_events
              WHERE processed_at IS NULL AND dead_at IS NULL AND available_at <= now()), 0),
    coalesce((SELECT extract(epoch FROM now() - min(xact_start)) FROM pg_stat_activity
              WHERE xact_start IS NOT NULL AND backend_type = 'client backend'), 0),
    pg_notification_queue_usage()
"""

# -- schedules -----------------------------------------------------------------------------------

#: The database clock, which schedules follow.
DATABASE_NOW = "SELECT now()"

#: Take a schedule's advisory lock for the transaction, if no other scheduler holds it; and the
#: transaction's ``now()``.
#:
#: Parameters: lock key bigint.
SCHEDULE_LOCK = "SELECT pg_try_advisory_xact_lock(%s), now()"

#: The last slot a schedule enqueued, locked until the transaction ends.
#:
#: Parameters: name text.
SCHEDULE_CURSOR = "SELECT last_slot_at FROM schedule_cursors WHERE name = %s FOR UPDATE"

#: Start a schedule's cursor at a slot (its first sight: later slots only).
#:
#: Named parameters: name text, last_slot_at timestamptz.
START_SCHEDULE_CURSOR = """
INSERT INTO schedule_cursors (name, last_slot_at) VALUES (%(name)s, %(last_slot_at)s)
ON CONFLICT (name) DO UPDATE SET last_slot_at = EXCLUDED.last_slot_at, updated_at = now()
"""

#: Move a schedule's cursor to the last slot it enqueued.
#:
#: Named parameters: name text, last_slot_at timestamptz.
ADVANCE_SCHEDULE_CURSOR = """
UPDATE schedule_cursors SET last_slot_at = %(last_slot_at)s, updated_at = now()
WHERE name = %(name)s
"""

# -- system checks -------------------------------------------------------------------------------

#: Whether autovacuum is on (check ``pgoutbox.W001``).
AUTOVACUUM_ON = "SELECT current_setting('autovacuum')::boolean"

#: A worker id's heartbeat row, locked until the transaction ends: its process (hostname, pid)
#: and the seconds since it was last written. Parameters: worker_id text.
LOCK_WORKER_ID = """
SELECT hostname, pid, extract(epoch FROM now() - last_seen_at)::float8
FROM worker_heartbeats
WHERE worker_id = %s
FOR UPDATE
"""

#: Take a worker id no row holds: the first heartbeat of this process, unless another process
#: wrote one for the id meanwhile (then nothing is returned). Named parameters: those of
#: HEARTBEAT.
TAKE_WORKER_ID = """
INSERT INTO worker_heartbeats (worker_id, hostname, pid, roles, queues)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(roles)s::jsonb, %(queues)s::jsonb)
ON CONFLICT (worker_id) DO NOTHING
RETURNING worker_id
"""
