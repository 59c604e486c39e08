"""Monitoring: heartbeats, gauges, the scheduler's cursors and the system checks."""

from __future__ import annotations

from django_pgoutbox.queries.deliveries import heads_its_subscriber_aggregate
from django_pgoutbox.queries.outbox import heads_its_aggregate

# A process's heartbeat row, as HEARTBEAT and TAKE_WORKER_ID write it.
_INSERT_HEARTBEAT = """INSERT INTO worker_heartbeats (worker_id, hostname, pid, roles, queues)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(roles)s::jsonb, %(queues)s::jsonb)"""

#: Write (or refresh) this process's heartbeat row.
#:
#: Named parameters: worker_id text, hostname text, pid int, roles text (JSON array), queues text
#: (JSON array).
HEARTBEAT = f"""
{_INSERT_HEARTBEAT}
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
#
# Every read below is bounded by a limit, never by the size of a table: a count stops at
# ``limit`` rows of a partial index of live rows (index-only where the visibility map allows), a
# queue's priorities are walked one index probe each, up to ``priorities``. Each count is
# ordered as its index is: without that, where one queue holds most rows, the planner would
# read the table from the start for every queue, hoping to meet ``limit`` matches early. A
# count that reaches its limit is replaced by the planner's estimate (``ESTIMATE_*``, run under
# ``EXPLAIN``), which reads the table's statistics and no row. ``gauges.database_gauges`` puts
# them together.

#: Run first, in the gauges' transaction: the plans they are written for. Each statement reads at
#: most a few thousand index entries, but the planner costs them as if they read the tables
#: (``LIMIT`` over a nested loop is costed from the whole of each side): past ``jit_above_cost``,
#: compiling took 110 ms of a 130 ms scrape on a million jobs, for a plan that runs in 20 ms.
#: And a sequential or bitmap scan of the jobs would read the table to count a thousand rows.
#: No parallel plan either: none is worth its workers here, and a parallel append would put the
#: estimates' branches out of their order.
GAUGES_PLAN = (
    "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('enable_bitmapscan', 'off', true),"
    " set_config('max_parallel_workers_per_gather', '0', true)"
)

#: What the gauges know of each queue: the configured ones, then up to ``unregistered`` others
#: that hold waiting, leased or dead jobs (a queue since removed from the settings, a row written
#: by hand), found by a loose index scan.
#:
#: Named parameters: queues text[] (the configured ones), limit int (counts stop there),
#: priorities int (the priorities walked per queue), probes int (the queue names looked up by
#: the loose scan: the configured ones plus ``unregistered`` plus one), unregistered int.
#:
#: Columns: queue, configured (boolean), how many priorities hold waiting jobs (at most
#: ``priorities`` + 1), the seconds since the oldest due waiting job (pending or retrying) became
#: due (among those priorities; NULL with none), retrying jobs due and not yet due, waiting jobs
#: due and not yet due (pending and retrying, counted up to ``limit`` + the retrying ones), dead
#: jobs, leased jobs, leased jobs of every queue (each count stops at ``limit``); then the
#: unregistered queues found beyond ``unregistered``, the same on every row.
JOB_GAUGES = """
WITH RECURSIVE
waiting_queues(queue) AS (
    (SELECT queue FROM jobs WHERE status IN ('pending', 'retrying') ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs j
            WHERE j.status IN ('pending', 'retrying') AND j.queue > w.queue
            ORDER BY j.queue LIMIT 1)
    FROM waiting_queues w WHERE w.queue IS NOT NULL
),
dead_queues(queue) AS (
    (SELECT queue FROM jobs WHERE status = 'dead' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs j
            WHERE j.status = 'dead' AND j.queue > d.queue ORDER BY j.queue LIMIT 1)
    FROM dead_queues d WHERE d.queue IS NOT NULL
),
leased AS MATERIALIZED (
    SELECT queue FROM jobs WHERE status = 'leased' ORDER BY locked_by LIMIT %(limit)s
),
leased_by_queue AS MATERIALIZED (
    SELECT queue, count(*) AS n FROM leased GROUP BY queue
),
unregistered AS MATERIALIZED (
    SELECT queue FROM (
        (SELECT queue FROM waiting_queues WHERE queue IS NOT NULL LIMIT %(probes)s)
        UNION
        (SELECT queue FROM dead_queues WHERE queue IS NOT NULL LIMIT %(probes)s)
        UNION
        SELECT queue FROM leased_by_queue
    ) found
    WHERE queue <> ALL(%(queues)s::text[])
),
queues(queue, configured) AS (
    SELECT queue, true FROM unnest(%(queues)s::text[]) AS configured(queue)
    UNION ALL
    (SELECT queue, false FROM unregistered ORDER BY queue LIMIT %(unregistered)s)
)
SELECT q.queue, q.configured, heads.n, heads.oldest_due_age,
       retry_due.n, retry_later.n, due.n, later.n, dead.n,
       coalesce((SELECT l.n FROM leased_by_queue l WHERE l.queue = q.queue), 0),
       (SELECT count(*) FROM leased),
       (SELECT count(*) FROM unregistered) - %(unregistered)s
FROM queues q
CROSS JOIN LATERAL (
    -- The first waiting job of each priority, highest first: each is the one that waited
    -- longest in its priority, and the priorities are what the due counts below walk.
    WITH RECURSIVE head(priority, run_at) AS (
        (SELECT priority, run_at FROM jobs
         WHERE status IN ('pending', 'retrying') AND queue = q.queue
         ORDER BY priority DESC, run_at LIMIT 1)
        UNION ALL
        SELECT below.priority, below.run_at FROM head
        CROSS JOIN LATERAL (
            SELECT priority, run_at FROM jobs
            WHERE status IN ('pending', 'retrying') AND queue = q.queue
              AND priority < head.priority
            ORDER BY priority DESC, run_at LIMIT 1
        ) below
    )
    SELECT count(*) AS n,
           extract(epoch FROM now() - min(run_at) FILTER (
               WHERE run_at <= now() AND walked.n <= %(priorities)s))::float8 AS oldest_due_age,
           array_agg(priority) FILTER (WHERE walked.n <= %(priorities)s) AS priorities
    FROM (
        -- One more than walked: whether there are more.
        SELECT priority, run_at, row_number() OVER () AS n FROM head LIMIT %(priorities)s + 1
    ) walked
) heads
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM jobs
        WHERE status = 'retrying' AND queue = q.queue AND run_at <= now()
        ORDER BY run_at LIMIT %(limit)s
    ) counted
) retry_due
CROSS JOIN LATERAL (
    -- A retrying count that reached its limit leaves pending unknown: no need to count further.
    SELECT CASE WHEN retry_due.n < %(limit)s THEN retry_due.n ELSE 0 END AS n
) due_retrying
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM jobs
        WHERE status = 'retrying' AND queue = q.queue AND run_at > now()
        ORDER BY run_at LIMIT %(limit)s
    ) counted
) retry_later
CROSS JOIN LATERAL (
    SELECT CASE WHEN retry_later.n < %(limit)s THEN retry_later.n ELSE 0 END AS n
) later_retrying
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM unnest(heads.priorities) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT 1 FROM jobs
            WHERE status IN ('pending', 'retrying') AND queue = q.queue
              AND priority = p.priority AND run_at <= now()
            ORDER BY run_at LIMIT %(limit)s + due_retrying.n
        ) one_priority
        LIMIT %(limit)s + due_retrying.n
    ) counted
) due
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM unnest(heads.priorities) AS p(priority)
        CROSS JOIN LATERAL (
            SELECT 1 FROM jobs
            WHERE status IN ('pending', 'retrying') AND queue = q.queue
              AND priority = p.priority AND run_at > now()
            ORDER BY run_at LIMIT %(limit)s + later_retrying.n
        ) one_priority
        LIMIT %(limit)s + later_retrying.n
    ) counted
) later
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM jobs WHERE status = 'dead' AND queue = q.queue
        ORDER BY finished_at DESC LIMIT %(limit)s
    ) counted
) dead
ORDER BY q.configured DESC
"""

#: The planner's estimate of each count of a queue's jobs, run as ``EXPLAIN (FORMAT JSON)``
#: where the count reached its limit. By count: pending (due), scheduled, retrying, leased, dead;
#: and waiting: pending, due or not.
#:
#: Parameters: queue text.
ESTIMATE_QUEUE_JOBS = {
    # Pending, due or not: where one side of now was counted exactly, the other is this less it.
    "waiting": "SELECT 1 FROM jobs WHERE queue = %s AND status = 'pending'",
    "pending": "SELECT 1 FROM jobs WHERE queue = %s AND status = 'pending' AND run_at <= now()",
    "scheduled": "SELECT 1 FROM jobs WHERE queue = %s AND status = 'pending' AND run_at > now()",
    "retrying": "SELECT 1 FROM jobs WHERE queue = %s AND status = 'retrying'",
    "leased": "SELECT 1 FROM jobs WHERE queue = %s AND status = 'leased'",
    "dead": "SELECT 1 FROM jobs WHERE queue = %s AND status = 'dead'",
}

#: The same estimates for the jobs of every queue not configured, together: where more such
#: queues hold jobs than the gauges count one by one.
#:
#: Parameters: the configured queues text[].
ESTIMATE_UNREGISTERED_JOBS = {
    status: sql.replace("queue = %s", "queue <> ALL(%s::text[])")
    for status, sql in ESTIMATE_QUEUE_JOBS.items()
}


#: Abandoned events among the first ``limit`` waiting ones (unprocessed, not dead), and the
#: seconds the longest of them has waited untouched (NULL if none).
#:
#: Abandoned: heading its aggregate (no unprocessed event of it, dead or not, comes first), not
#: dead, due for longer than ``overdue`` seconds and claimed by no relay for as long. The dead
#: events are stepped over, not counted among the first ``limit``: a thousand of them, left for
#: an operator ahead of the rest, would else hide every abandoned event behind them. The head of
#: each aggregate is one probe of ``outbox_aggregate_pending_idx``, as in CLAIM_EVENTS. For the
#: gauges, the health report and the outbox's reconciliation. Named parameters: limit int,
#: overdue seconds float.
ABANDONED_EVENTS = f"""
        SELECT count(*) AS n,
               max(extract(epoch FROM now() - greatest(available_at, claimed_at)))::float8 AS age
        FROM (
            SELECT id, aggregate_type, aggregate_id, available_at, claimed_at
            FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NULL
            ORDER BY occurred_at, id
            LIMIT %(limit)s
        ) waiting
        WHERE available_at < now() - make_interval(secs => %(overdue)s)
          AND (claimed_at IS NULL OR claimed_at < now() - make_interval(secs => %(overdue)s))
          AND {heads_its_aggregate("waiting")}
"""


#: The outbox's backlog, the age of the oldest open transaction of this database (the xmin
#: horizon that holds back vacuum of the queue tables), and the fraction of the NOTIFY queue in
#: use.
#:
#: Named parameters: limit int (counts stop there), overdue seconds float
#: (``OUTBOX["OVERDUE_SECONDS"]``).
#:
#: Columns: dead events (up to ``limit``); unprocessed events, dead ones included (up to
#: ``limit`` + the dead ones, while those are under the limit); the seconds since the oldest
#: available, unprocessed, live event occurred, looked for among the first ``limit`` unprocessed
#: ones (NULL if none of those);
#: where it is NULL and more events wait, the age of the next one (the lag is at most that);
#: the estimate of dead events (for where they reached the limit: the entries of their partial
#: index as of the last ``VACUUM`` or ``ANALYZE``, scaled to the index's size now as the planner
#: scales a table's; the planner, taking ``processed_at IS NULL`` and ``dead_at IS NOT NULL`` for
#: independent, would halve them; NULL before the first ``ANALYZE``); the oldest transaction's
#: age; the NOTIFY queue's usage; abandoned events (among the first ``limit`` waiting ones: a
#: lower bound where more wait) and the seconds the longest abandoned one has waited
#: untouched (NULL if none).
OUTBOX_AND_SERVER_GAUGES = f"""
SELECT counts.dead, counts.unprocessed, counts.lag,
       CASE WHEN counts.lag IS NULL THEN (
           SELECT extract(epoch FROM now() - occurred_at)::float8 FROM outbox_events
           WHERE processed_at IS NULL
           ORDER BY occurred_at, id OFFSET %(limit)s LIMIT 1
       ) END,
       (SELECT CASE WHEN c.reltuples < 0 THEN NULL
                    WHEN c.relpages = 0 THEN c.reltuples
                    ELSE c.reltuples / c.relpages
                         * (pg_relation_size(c.oid) / current_setting('block_size')::int8) END
        FROM pg_class c WHERE c.oid = 'outbox_dead_idx'::regclass),
       coalesce((SELECT extract(epoch FROM now() - min(xact_start))::float8
                 FROM pg_stat_activity
                 WHERE xact_start IS NOT NULL AND backend_type = 'client backend'
                   AND datname = current_database()), 0),
       pg_notification_queue_usage(),
       counts.abandoned, counts.abandoned_age
FROM (
    SELECT dead.n AS dead,
           abandoned.n AS abandoned, abandoned.age AS abandoned_age,
           (SELECT count(*) FROM (
                SELECT 1 FROM outbox_events WHERE processed_at IS NULL
                ORDER BY occurred_at, id
                -- Dead events past the limit leave the waiting ones unknown: count no further.
                LIMIT %(limit)s + CASE WHEN dead.n < %(limit)s THEN dead.n ELSE 0 END
            ) counted) AS unprocessed,
           (SELECT extract(epoch FROM now() - occurred_at)::float8 FROM (
                SELECT occurred_at, id, available_at, dead_at FROM outbox_events
                WHERE processed_at IS NULL
                ORDER BY occurred_at, id LIMIT %(limit)s
            ) first_waiting
            WHERE dead_at IS NULL AND available_at <= now()
            ORDER BY occurred_at, id LIMIT 1) AS lag
    FROM (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM outbox_events
            WHERE processed_at IS NULL AND dead_at IS NOT NULL ORDER BY occurred_at LIMIT %(limit)s
        ) counted
    ) dead
    CROSS JOIN LATERAL ({ABANDONED_EVENTS}) abandoned
) counts
"""

#: The subscribers' undelivered deliveries (``outbox_deliveries``), per subscriber: the registered
#: ones, then up to ``unregistered`` others that have undelivered deliveries (a subscriber since
#: renamed or removed, a row written by hand), found by a loose scan of
#: ``outbox_deliveries_sub_idx``.
#:
#: Each subscriber's first ``limit`` undelivered deliveries, oldest written first, are read from
#: ``outbox_deliveries_sub_idx`` (and their rows), never more: with more, the counts are lower
#: bounds, and the lag and the abandoned ones are those of the first ``limit``. Abandoned: as
#: ABANDONED_EVENTS says of an event, a delivery not dead, due for longer than ``overdue``
#: seconds, claimed by no relay for as long, and first undelivered one of its (aggregate,
#: subscriber) (one probe of ``outbox_deliveries_order_idx``, as CLAIM_DELIVERIES).
#:
#: Measured with EXPLAIN (ANALYZE, BUFFERS), after GAUGES_PLAN, on 1,000,000 delivered rows and
#: 100,000 undelivered ones of one subscriber (90,000 waiting written first, then 9,000 failing
#: and 1,000 dead, each of its own aggregate, all due for an hour), three other registered
#: subscribers with none, tables vacuumed and analyzed: 3.4 ms and 4,042 shared buffers with
#: ``OVERDUE_SECONDS`` 300 (all of the first 1,001 overdue: one head probe each, the worst
#: case); 0.7 ms and 38 buffers with none overdue. With 1,000 undelivered instead of 100,000:
#: the same work (4,040 buffers). The delivered rows are not read at all.
#:
#: Named parameters: subscribers text[] (the registered ones), limit int (the deliveries read per
#: subscriber), overdue seconds float (``OUTBOX["OVERDUE_SECONDS"]``), probes int (the names
#: walked by the loose scan: the registered ones plus ``unregistered`` plus one), unregistered
#: int.
#:
#: Columns: subscriber, registered (boolean), deliveries read (up to ``limit``): waiting
#: (undelivered, not dead, never failed), failing (not dead, failed at least once) and dead; the
#: seconds since the oldest event of a waiting or failing one occurred (NULL if none); abandoned
#: ones and the seconds the longest of them has waited untouched (NULL if none); then the
#: subscribers found beyond ``unregistered`` that are not registered, the same on every row.
DELIVERY_GAUGES = f"""
WITH RECURSIVE
found(subscriber) AS (
    (SELECT subscriber FROM outbox_deliveries WHERE delivered_at IS NULL
     ORDER BY subscriber LIMIT 1)
    UNION ALL
    SELECT (SELECT d.subscriber FROM outbox_deliveries AS d
            WHERE d.delivered_at IS NULL AND d.subscriber > f.subscriber
            ORDER BY d.subscriber LIMIT 1)
    FROM found AS f WHERE f.subscriber IS NOT NULL
),
unregistered AS MATERIALIZED (
    SELECT subscriber FROM (
        SELECT subscriber FROM found WHERE subscriber IS NOT NULL LIMIT %(probes)s
    ) AS walked
    WHERE subscriber <> ALL(%(subscribers)s::text[])
),
named(subscriber, registered) AS (
    SELECT subscriber, true FROM unnest(%(subscribers)s::text[]) AS r(subscriber)
    UNION ALL
    (SELECT subscriber, false FROM unregistered ORDER BY subscriber LIMIT %(unregistered)s)
)
SELECT n.subscriber, n.registered, c.waiting, c.failing, c.dead, c.lag, c.abandoned,
       c.abandoned_age, (SELECT count(*) FROM unregistered) - %(unregistered)s
FROM named AS n
CROSS JOIN LATERAL (
    WITH first_ones AS MATERIALIZED (
        SELECT id, aggregate_type, aggregate_id, subscriber, occurred_at, available_at,
               claimed_at, dead_at, last_error
        FROM outbox_deliveries
        WHERE delivered_at IS NULL AND subscriber = n.subscriber
        ORDER BY created_at
        LIMIT %(limit)s
    )
    SELECT counts.waiting, counts.failing, counts.dead, counts.lag,
           abandoned.n AS abandoned, abandoned.age AS abandoned_age
    FROM (
        SELECT count(*) FILTER (WHERE dead_at IS NULL AND last_error IS NULL) AS waiting,
               count(*) FILTER (WHERE dead_at IS NULL AND last_error IS NOT NULL) AS failing,
               count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
               extract(epoch FROM now() - min(occurred_at) FILTER (WHERE dead_at IS NULL))::float8
                   AS lag
        FROM first_ones
    ) AS counts
    CROSS JOIN (
        SELECT count(*) AS n,
               max(extract(epoch FROM now() - greatest(available_at, claimed_at)))::float8 AS age
        FROM first_ones AS w
        WHERE w.dead_at IS NULL
          AND w.available_at < now() - make_interval(secs => %(overdue)s)
          AND (w.claimed_at IS NULL OR w.claimed_at < now() - make_interval(secs => %(overdue)s))
          AND {heads_its_subscriber_aggregate("w")}
    ) AS abandoned
) AS c
ORDER BY n.registered DESC
"""

#: The oldest holder of this database's xmin horizon: what keeps vacuum from removing the dead
#: row versions of ``jobs`` and ``outbox_events`` (docs/operations.md, "When the queue slows").
#: ``OUTBOX_AND_SERVER_GAUGES``'s oldest transaction is the alarm; this is the diagnosis.
#:
#: Holders, by kind:
#:
#: - ``session``: a backend of this database with a transaction id (it has written) or a snapshot
#:   (``REPEATABLE READ``, a statement running). Sessions of other databases hold back only their
#:   own tables; autovacuum's workers and parallel workers (their leader is listed) hold nothing
#:   that vacuum waits for. This session itself is left out.
#: - ``standby``: a walsender without a slot, holding the horizon that its standby's
#:   ``hot_standby_feedback`` reports, for every database.
#: - ``prepared``: a prepared transaction of this database that nobody committed or rolled back.
#: - ``slot``: a replication slot's ``xmin`` (a physical slot of a standby with feedback, kept
#:   while the standby is down or gone). A slot's ``catalog_xmin`` holds back the system catalogs
#:   alone, not the queue's tables: it is not counted.
#:
#: No parameters. One row or none. Columns: kind; seconds it has held the horizon (sessions:
#: since their transaction began; prepared: since ``PREPARE``; slot: since it became inactive,
#: on PostgreSQL 17 and later; else NULL); ``age(xmin)`` in transactions; pid (a session's or a
#: standby's, an active slot's walsender); name (a prepared transaction's gid, a slot's name);
#: role; application_name; client address; state (a session's, or a slot's ``active`` /
#: ``inactive``); the first 200 characters of a session's last query. The holder whose horizon
#: is the oldest (most transactions behind) comes first; of those holding the same, the longest.
#: Ages are counted to ``clock_timestamp()``, not to ``now()``: asked inside a transaction (an
#: admin request under ``ATOMIC_REQUESTS``), ``now()`` is when that began.
HORIZON_HOLDER = """
SELECT kind, age, xmin_age, pid, name, usename, application_name, client_addr, state, query
FROM (
    SELECT CASE WHEN a.backend_type = 'walsender' THEN 'standby' ELSE 'session' END AS kind,
           extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS age,
           greatest(age(a.backend_xid), age(a.backend_xmin)) AS xmin_age,
           a.pid, NULL::text AS name, a.usename::text AS usename, a.application_name,
           host(a.client_addr) AS client_addr, a.state, left(a.query, 200) AS query
    FROM pg_stat_activity a
    WHERE (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
      AND a.pid <> pg_backend_pid()
      AND a.backend_type NOT IN ('autovacuum worker', 'parallel worker')
      AND (a.datname = current_database() OR a.backend_type = 'walsender')
    UNION ALL
    SELECT 'prepared', extract(epoch FROM clock_timestamp() - p.prepared)::float8,
           age(p.transaction), NULL, p.gid, p.owner::text, NULL, NULL, NULL, NULL
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
    UNION ALL
    -- inactive_since is a column from PostgreSQL 17 on: read through jsonb, NULL before
    SELECT 'slot',
           extract(epoch FROM clock_timestamp()
                              - (to_jsonb(s) ->> 'inactive_since')::timestamptz)::float8,
           age(s.xmin), s.active_pid, s.slot_name::text, NULL, NULL, NULL,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL
) holders
ORDER BY xmin_age DESC, age DESC NULLS LAST
LIMIT 1
"""

#: The planner's estimate of the outbox's waiting events (neither projected nor dead), where the
#: count reached its limit.
ESTIMATE_OUTBOX_PENDING = (
    "SELECT 1 FROM outbox_events WHERE processed_at IS NULL AND dead_at IS NULL"
)


# -- schedules -----------------------------------------------------------------------------------

#: The database clock, which schedules follow.
DATABASE_NOW = "SELECT now()"

#: Take a schedule's advisory lock for the transaction, if no other scheduler holds it; and the
#: transaction's ``now()``.
#:
#: Parameters: lock key bigint.
#:
#: For this transaction only, the server ends the session if the scheduler goes silent for 3 s
#: between two of its statements (which follow each other in milliseconds): a replica cut off
#: from the server inside the transaction (a network partition, its host gone, no RST) would
#: otherwise hold the lock, and the cursor's row, until the partition heals or the server's TCP
#: keepalive gives up (two hours by default), and every other replica would skip the schedule
#: all that time (tests/reliability/test_network.py).
SCHEDULE_LOCK = (
    "SELECT pg_try_advisory_xact_lock(%s), now()"
    " FROM (SELECT set_config('idle_in_transaction_session_timeout', '3s', true)) AS timeout"
)

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
TAKE_WORKER_ID = f"""
{_INSERT_HEARTBEAT}
ON CONFLICT (worker_id) DO NOTHING
RETURNING worker_id
"""
