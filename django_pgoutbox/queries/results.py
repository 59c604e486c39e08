"""The notification that wakes ``Job.wait()``: the jobs a statement finished, as short tags.

Every statement that ends jobs in numbers (a worker's batch of outcomes, the lease recovery, a
cancel) sends, when ``PGOUTBOX["NOTIFY"]`` is on, one notification on ``RESULTS_CHANNEL`` per
``TAGS_PER_NOTIFICATION`` jobs it finished: their *tags*, the last ``TAG_LENGTH`` hex digits of
each id, space-separated. A waiter listens for its own job's tag and then reads the row: a tag
of another job (one chance in 2^32 per job) only costs it a read. The tail of the id, not its
head: a UUIDv7 begins with its creation time, which jobs enqueued together share, and ends with
random bits. One notification per batch rather than per job: docs/benchmarks.md, "Waking
waiters", has the costs measured.

Only the jobs that someone waits for are told: a listener registers each job its waiters wait
for in ``job_waiters`` (migration 0016) before they read the job's row, so a statement that
finishes jobs no one waits for (a drain) sends no notification at all.
"""

from __future__ import annotations

from django_pgoutbox.conf import RESULTS_CHANNEL

#: Hex digits of a job's id in its tag: the id's last ones (random in UUIDv4 and v7 alike).
TAG_LENGTH = 8
#: Tags per notification: 800 tags and their separators are 7,199 bytes, under PostgreSQL's
#: 8,000-byte payload limit.
TAGS_PER_NOTIFICATION = 800


def notify_finished(rows: str, notify: str) -> str:
    """A SELECT that sends the notifications of the finished jobs among ``rows`` (a CTE with
    ``id`` and the new ``status`` of each row written), one row per notification, when the SQL
    expression ``notify`` is true. A statement must read it (``count(*)``): a CTE that no one
    reads is not run."""
    return f"""
    SELECT pg_notify('{RESULTS_CHANNEL}', string_agg(right(f.id::text, {TAG_LENGTH}), ' '))
    FROM (
        SELECT id, row_number() OVER () - 1 AS n
        FROM {rows}
        -- first, evaluated once: whether anyone waits for any job at all (nearly never in a
        -- drain), so that a batch no one waits on costs one probe of an empty table
        WHERE (SELECT EXISTS (SELECT 1 FROM job_waiters)) AND {notify}
          AND status IN ('completed', 'dead', 'cancelled')
          AND EXISTS (SELECT 1 FROM job_waiters AS w WHERE w.job_id = {rows}.id)
    ) AS f
    GROUP BY f.n / {TAGS_PER_NOTIFICATION}
"""


#: Register the jobs a listener's waiters wait for (its connection's server process is the
#: listener). Parameter: ids uuid[].
REGISTER_WAITERS = """
INSERT INTO job_waiters (job_id) SELECT unnest(%s::uuid[]) ON CONFLICT DO NOTHING
"""
#: Forget a job no waiter of this listener waits for any more. Parameter: id uuid.
UNREGISTER_WAITER = "DELETE FROM job_waiters WHERE job_id = %s AND listener_pid = pg_backend_pid()"
#: Forget what listeners gone (their server process ended) waited for.
PRUNE_WAITERS = """
DELETE FROM job_waiters AS w
WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a WHERE a.pid = w.listener_pid)
"""
