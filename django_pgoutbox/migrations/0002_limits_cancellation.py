from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

import django_pgoutbox.models


class Migration(migrations.Migration):
    # The new index is built CONCURRENTLY, so that upgrading a live jobs table does not block
    # enqueues and claims while it builds; that needs a migration outside a transaction.
    atomic = False
    dependencies = [
        ("pgoutbox", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateLimitBucket",
            fields=[
                ("key", models.TextField(primary_key=True, serialize=False)),
                ("tokens", models.FloatField()),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
            ],
            options={
                "verbose_name": "rate limit bucket",
                "db_table": "rate_limit_buckets",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ("pending", "retrying"))),
                fields=["queue", "organization_id", "-priority", "run_at", "created_at", "id"],
                name="jobs_fair_claim_idx",
            ),
        ),
    ]
