from django.db import migrations, models

import django_pgoutbox.models


class Migration(migrations.Migration):
    # A new table, empty: created in the migration's transaction, blocking nothing.
    dependencies = [
        ("pgoutbox", "0008_publish_order"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueControl",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("paused_by", models.TextField(blank=True, null=True)),
                (
                    "overrides",
                    models.JSONField(db_default=models.Value({}, models.JSONField()), default=dict),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
                ("updated_by", models.TextField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "queue control",
                "db_table": "queue_controls",
            },
        ),
    ]
