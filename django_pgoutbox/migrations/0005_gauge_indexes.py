from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The gauges' indexes are built CONCURRENTLY, so that upgrading live tables blocks neither
    # enqueues nor claims; that needs a migration outside a transaction.
    atomic = False
    dependencies = [
        ("pgoutbox", "0004_suspects_alone"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "retrying")),
                fields=["queue", "run_at"],
                name="jobs_retrying_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="outboxevent",
            index=models.Index(
                condition=models.Q(("dead_at__isnull", False), ("processed_at__isnull", True)),
                fields=["occurred_at"],
                name="outbox_dead_idx",
            ),
        ),
        # Which statuses each queue holds, from ANALYZE's sample: the planner's estimate of a
        # queue's jobs in one status, which the gauges give above their exact counts, no longer
        # multiplies the two columns' frequencies as if they were independent.
        migrations.RunSQL(
            "CREATE STATISTICS IF NOT EXISTS jobs_queue_status_stats (mcv) "
            "ON queue, status FROM jobs",
            reverse_sql="DROP STATISTICS IF EXISTS jobs_queue_status_stats",
        ),
        migrations.RunSQL("ANALYZE jobs (queue, status)", reverse_sql=migrations.RunSQL.noop),
    ]
