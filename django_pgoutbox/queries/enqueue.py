"""Enqueue: the statements that write jobs (one row, many rows, COPY) and wake their queues."""

from __future__ import annotations

from django_pgoutbox.queries.params import binary


# The row insert and the wake-up that the enqueue statements share. ``event``: with the columns
# ``event_id`` and ``trace_context`` (the statements ``*_FROM_EVENT``, for rows enqueued by a
# subscriber or under a recording span); without them, no arrays of NULLs for the client to send
# and the server to unnest (2% of an INSERT of 63 rows).
def _insert_job_rows(*, event: bool) -> str:
    column, value, array, name = (
        (
            ", event_id, trace_context",
            ", r.event_id, r.trace_context::jsonb",
            ", %(event_ids)s::uuid[], %(trace_contexts)s::text[]",
            ", event_id, trace_context",
        )
        if event
        else ("", "", "", "")
    )
    return f"""INSERT INTO jobs (
        id, organization_id, queue, job_type, payload, idempotency_key,
        priority, run_at, max_attempts{column}
    )
    SELECT r.id, r.organization_id, r.queue, r.job_type, r.payload::jsonb, r.idempotency_key,
           r.priority, COALESCE(r.run_at, now()) + make_interval(secs => r.delay),
           r.max_attempts{value}
    FROM unnest(
        %(ids)s::uuid[], %(organization_ids)s::uuid[], %(queues)s::text[], %(job_types)s::text[],
        %(payloads)s::text[], %(idempotency_keys)s::text[], %(priorities)s::integer[],
        %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::integer[]{array}
    ) AS r(id, organization_id, queue, job_type, payload, idempotency_key,
           priority, run_at, delay, max_attempts{name})"""


# Wake the workers of each queue that got a row, once per queue, if ``notify``.
_WAKE_QUEUES = """woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM inserted) AS q
    WHERE %(notify)s
)"""


#: Insert many jobs in one statement and wake the workers of each queue that got one.
#:
#: Named parameters: ids uuid[], organization_ids uuid[], queues text[], job_types text[],
#: payloads text[] (JSON), idempotency_keys text[], priorities int[], run_ats timestamptz[]
#: (NULL = now), delays float8[] (seconds), max_attempts int[], channel text, notify boolean.
#:
#: Rows are passed as parallel arrays, so 5,000 jobs cost one statement with twelve parameters.
#: ``ON CONFLICT ... DO NOTHING`` on ``jobs_idempotency_uq`` makes a repeated key a no-op, also
#: against a concurrent transaction inserting the same key (the insert waits for it, then skips);
#: the caller then reads the existing row. ``run_at`` is computed from the database clock.
#: ``pg_notify`` runs once per distinct queue among the rows actually inserted, inside the
#: caller's transaction, so listeners hear of it only at commit and never after a rollback;
#: PostgreSQL also folds identical notifications of one transaction into one.
def _enqueue_jobs(*, event: bool) -> str:
    return f"""
WITH inserted AS (
    {_insert_job_rows(event=event)}
    ON CONFLICT (organization_id, job_type, idempotency_key)
        WHERE idempotency_key IS NOT NULL
        DO NOTHING
    RETURNING id, queue, run_at, created_at
),
{_WAKE_QUEUES}
SELECT id, run_at, created_at, (SELECT count(*) FROM woken) FROM inserted
"""


ENQUEUE_JOBS = _enqueue_jobs(event=False)

#: ENQUEUE_JOBS for rows that a subscriber enqueued or that carry a trace context, with two more
#: parameters: event_ids uuid[], trace_contexts text[] (JSON, or NULL).
ENQUEUE_JOBS_FROM_EVENT = _enqueue_jobs(event=True)


#: ENQUEUE_JOBS for rows without idempotency keys, which cannot conflict: nothing per row comes
#: back, only the transaction's ``now()``, from which the caller computes each row's ``run_at`` and
#: ``created_at`` as the defaults do. Same parameters as ENQUEUE_JOBS, sent in binary (``%b``):
#: psycopg then writes the arrays without quoting each element (docs/benchmarks.md, "What profiling
#: found", item 5). It needs a cursor with server-side parameters (``db.server_side_cursor``).
def _enqueue_jobs_unkeyed(*, event: bool) -> str:
    return binary(
        f"""
WITH inserted AS (
    {_insert_job_rows(event=event)}
    RETURNING queue
),
{_WAKE_QUEUES}
SELECT now(), (SELECT count(*) FROM woken)
"""
    )


ENQUEUE_JOBS_UNKEYED = _enqueue_jobs_unkeyed(event=False)

#: ENQUEUE_JOBS_UNKEYED for rows that a subscriber enqueued or that carry a trace context, with
#: two more parameters: event_ids uuid[], trace_contexts text[] (JSON, or NULL).
ENQUEUE_JOBS_UNKEYED_FROM_EVENT = _enqueue_jobs_unkeyed(event=True)

#: Run before COPY_JOBS in its transaction: the transaction's ``now()``, from which the client
#: computes each row's ``run_at`` as the column's default would.
COPY_JOBS_NOW = "SELECT now()"

#: Run after COPY_JOBS: wake the workers of each queue that got jobs (at commit, as always).
#:
#: Parameters: channel text, queues text[]. Sent in binary.
WAKE_QUEUES = "SELECT count(pg_notify(%b, q)) FROM unnest(%b::text[]) AS q"

#: Many jobs without idempotency keys, in COPY's binary format, a row per job: id,
#: organization_id, queue, job_type, payload (jsonb), priority, run_at, max_attempts, event_id,
#: trace_context (jsonb).
#:
#: ``enqueue_many`` and the relay's deferred jobs use it for batches of ``COPY_MIN_ROWS`` and more.
#: The client packs each row with ``struct`` (no arrays for psycopg to dump element by element in
#: Python), streams it while it checks the next items, and the server writes the rows in groups
#: without a plan or ``unnest``; binary rather than text spares it parsing each value
#: (docs/benchmarks.md, "What profiling found", item 11). Rows with keys cannot use it: COPY has no
#: ``ON CONFLICT``. ``created_at`` is the column's default.
COPY_JOBS = """COPY jobs (
    id, organization_id, queue, job_type, payload, priority, run_at, max_attempts, event_id,
    trace_context
) FROM STDIN (FORMAT BINARY)"""

# The one-row insert and its RETURNING, shared by ENQUEUE_JOB and ENQUEUE_JOB_UNKEYED.
_INSERT_JOB_ROW = """INSERT INTO jobs (
    id, organization_id, queue, job_type, payload, idempotency_key, priority, run_at, max_attempts,
    event_id, trace_context
)
VALUES (%(id)b, %(organization_id)b, %(queue)b, %(job_type)b, %(payload)b::jsonb,
        %(idempotency_key)b, %(priority)b,
        COALESCE(%(run_at)b::timestamptz, now()) + make_interval(secs => %(delay)b::float8),
        %(max_attempts)b, %(event_id)b::uuid, %(trace_context)b::text::jsonb)"""
_INSERT_JOB_ROW_RETURNING = (
    "RETURNING run_at, created_at,"
    " CASE WHEN %(notify)b THEN pg_notify(%(channel)b, queue)::text END"
)

#: One job: ENQUEUE_JOBS for a single row, the common case of ``enqueue()``.
#:
#: Named parameters: id uuid, organization_id uuid, queue text, job_type text, payload text (JSON),
#: idempotency_key text, priority int, run_at timestamptz (NULL = now), delay float8 (seconds),
#: max_attempts int, event_id uuid, trace_context text (JSON, or NULL), notify boolean, channel
#: text. Sent in binary, like
#: ENQUEUE_JOBS_UNKEYED.
#:
#: A plain ``VALUES`` row and ``pg_notify`` in ``RETURNING``: no ``unnest``, no CTE, no
#: ``DISTINCT``, which the server spends more time planning and running than inserting one row
#: (docs/benchmarks.md, "What profiling found", item 8). A repeated key returns no row; the caller
#: then reads the job that holds it.
ENQUEUE_JOB = f"""
{_INSERT_JOB_ROW}
ON CONFLICT (organization_id, job_type, idempotency_key)
    WHERE idempotency_key IS NOT NULL
    DO NOTHING
{_INSERT_JOB_ROW_RETURNING}
"""

#: ENQUEUE_JOB for a job without an idempotency key, with the same parameters: it cannot conflict
#: (``jobs_idempotency_uq`` holds only rows with a key), and ``ON CONFLICT`` makes the insert
#: speculative, a check and a confirmation more per row (docs/benchmarks.md, "What profiling found",
#: item 18).
ENQUEUE_JOB_UNKEYED = f"""
{_INSERT_JOB_ROW}
{_INSERT_JOB_ROW_RETURNING}
"""
