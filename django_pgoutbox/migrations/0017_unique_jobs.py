from django.db import migrations, models

# Unique jobs (docs/uniqueness.md): a job's key (a 128-bit hash, as a uuid: its index compares 16
# bytes, not text by collation), and the states in which it holds it, a bit per state
# (uniqueness.STATE_BITS). jobs_unique_uq holds the key of every row whose state is in its
# own set, so that PostgreSQL refuses a second job with the key whatever the number of
# enqueuers, and a job that leaves its states (completes, dies) frees its key in the same
# statement. Rows without a key (every other job) have no entry; a worker's update of one
# evaluates the predicate's first test only.
#
# pgoutbox_unique_state() is IMMUTABLE, as an index predicate requires, and a plain SQL function
# with no SET clause, so that the planner inlines it: no call per row. INSERT ... ON CONFLICT
# names the same predicate to pick this index as its arbiter.
UNIQUE_STATE_FUNCTION = """
CREATE FUNCTION pgoutbox_unique_state(states integer, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (states & CASE status
    WHEN 'waiting' THEN 1 WHEN 'pending' THEN 2 WHEN 'leased' THEN 4 WHEN 'retrying' THEN 8
    WHEN 'completed' THEN 16 WHEN 'dead' THEN 32 WHEN 'cancelled' THEN 64 ELSE 0 END) <> 0
"""

UNIQUE_INDEX = """
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS jobs_unique_uq ON jobs (unique_key)
WHERE unique_key IS NOT NULL AND pgoutbox_unique_state(unique_states, status)
"""


class Migration(migrations.Migration):
    # The index built CONCURRENTLY, so that upgrading a live jobs table blocks neither enqueues
    # nor claims; that needs a migration outside a transaction.
    atomic = False
    dependencies = [
        ("pgoutbox", "0016_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_states",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.RunSQL(
            UNIQUE_STATE_FUNCTION,
            "DROP FUNCTION IF EXISTS pgoutbox_unique_state(integer, text)",
        ),
        migrations.RunSQL(UNIQUE_INDEX, "DROP INDEX CONCURRENTLY IF EXISTS jobs_unique_uq"),
    ]
