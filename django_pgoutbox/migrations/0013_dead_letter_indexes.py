from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built CONCURRENTLY, so that upgrading a live jobs table blocks neither enqueues nor claims;
    # that needs a migration outside a transaction. Only dead jobs have entries: each index is
    # written when a job dies, never on the enqueue, claim or completion of a job.
    atomic = False
    dependencies = [
        ("pgoutbox", "0012_dead_letter_causes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["-finished_at", "-id"],
                name="jobs_dead_finished_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["job_type", "-finished_at", "-id"],
                name="jobs_dead_type_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["last_error_code", "-finished_at", "-id"],
                name="jobs_dead_code_idx",
            ),
        ),
    ]
