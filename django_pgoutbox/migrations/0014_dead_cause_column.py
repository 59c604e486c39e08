from typing import Any

from django.apps.registry import Apps
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# A dead job's cause, worked out once, when it dies, into a column of its own: an index of the
# column answers "how many dead letters of this cause" from its entries alone (an index-only
# scan), where the index of 0012 on the expression had to read each row of the cause.
#
# The statements that kill a job write it (RECORD_OUTCOMES, RECOVER_EXPIRED_LEASES,
# RELEASE_JOBS), and those that retry or cancel a dead job clear it. A trigger writes it for a
# row inserted dead (a fixture, a copy of rows): AFTER INSERT, where a BEFORE INSERT row
# trigger, even one whose WHEN is false for every row, makes COPY write its rows one by one
# (enqueue_many() of 100,000 jobs was 7% slower with one); its WHEN is tested before the function
# is called, one comparison per row. No trigger on UPDATE: a BEFORE UPDATE row trigger locks each
# row before its WHEN is tested, a lock that claims and outcomes paid on every job (54% more WAL
# for an UPDATE of 100,000 rows). What a worker of the release before writes dead while this
# migration applies, maintenance.fill_dead_causes gives its cause (the lease recovery's job).
#
# The function's search_path is the schema this migration creates it in (current_schema(),
# named: not the text of the search_path, whose "$user" is the user of the session that inserts,
# another role than the one that migrated perhaps), so that pgoutbox_error_fingerprint is the one
# of 0012 and jobs this table, whatever search_path and role that session has.
INSERTED_DEAD_FUNCTION = """
DO $do$
BEGIN
    EXECUTE format($function$
CREATE FUNCTION pgoutbox_inserted_dead() RETURNS trigger
LANGUAGE plpgsql SET search_path = %I
AS $$
BEGIN
    UPDATE jobs
    SET dead_cause = pgoutbox_error_fingerprint(
        NEW.job_type, NEW.last_error_code, NEW.last_error_summary
    )
    WHERE id = NEW.id AND status = 'dead';
    RETURN NULL;
END
$$
$function$, current_schema());
END
$do$
"""

INSERTED_DEAD_TRIGGER = """
CREATE TRIGGER jobs_inserted_dead
AFTER INSERT ON jobs
FOR EACH ROW WHEN (NEW.status = 'dead')
EXECUTE FUNCTION pgoutbox_inserted_dead()
"""

#: The dead jobs of before this migration, a batch (one transaction) at a time, newest death
#: first along jobs_dead_finished_idx (0013); each batch starts after the last one's key.
FILL_BATCH = """
WITH batch AS (
    SELECT id, finished_at
    FROM jobs
    WHERE status = 'dead' AND (finished_at, id) < (%s, %s)
    ORDER BY finished_at DESC, id DESC
    LIMIT 5000
),
filled AS (
    UPDATE jobs AS j
    SET dead_cause = pgoutbox_error_fingerprint(j.job_type, j.last_error_code,
                                                j.last_error_summary)
    FROM batch
    WHERE j.id = batch.id AND j.status = 'dead' AND j.dead_cause IS NULL
)
SELECT finished_at, id FROM batch ORDER BY finished_at, id LIMIT 1
"""

#: Dead jobs with no finished_at, which the keyset above cannot reach (none that this app wrote).
FILL_UNFINISHED = """
UPDATE jobs
SET dead_cause = pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary)
WHERE status = 'dead' AND finished_at IS NULL AND dead_cause IS NULL
"""


def fill(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    key: list[Any] = ["infinity", "ffffffff-ffff-ffff-ffff-ffffffffffff"]
    while True:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            cursor.execute(FILL_BATCH, key)
            row = cursor.fetchone()
        if row is None:
            break
        key = [row[0], row[1]]
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute(FILL_UNFINISHED)


class Migration(migrations.Migration):
    # Outside a transaction: each batch of the fill commits on its own, and the index is built
    # CONCURRENTLY, so that upgrading a live jobs table blocks neither enqueues nor claims.
    atomic = False
    dependencies = [
        ("pgoutbox", "0013_dead_letter_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="dead_cause",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.RunSQL(
            INSERTED_DEAD_FUNCTION,
            reverse_sql="DROP FUNCTION IF EXISTS pgoutbox_inserted_dead()",
        ),
        migrations.RunSQL(
            INSERTED_DEAD_TRIGGER,
            reverse_sql="DROP TRIGGER IF EXISTS jobs_inserted_dead ON jobs",
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                fields=["dead_cause", "finished_at", "id"],
                condition=models.Q(("status", "dead")),
                name="jobs_dead_cause_col_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                fields=["id"],
                condition=models.Q(("dead_cause__isnull", True), ("status", "dead")),
                name="jobs_dead_uncaused_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="jobs_dead_cause_idx"),
        migrations.RenameIndex(
            model_name="job", new_name="jobs_dead_cause_idx", old_name="jobs_dead_cause_col_idx"
        ),
        # The column's statistics, which the causes page's estimates read.
        migrations.RunSQL("ANALYZE jobs", reverse_sql=migrations.RunSQL.noop),
    ]
