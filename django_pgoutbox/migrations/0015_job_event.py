from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The index built CONCURRENTLY, so that upgrading a live jobs table blocks neither enqueues
    # nor claims; that needs a migration outside a transaction. Only the jobs that an event's
    # subscribers enqueue have entries.
    atomic = False
    dependencies = [
        ("pgoutbox", "0014_dead_cause_column"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="event_id",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("event_id__isnull", False)),
                fields=["event_id"],
                name="jobs_event_idx",
            ),
        ),
    ]
