from django.db import migrations, models


class Migration(migrations.Migration):
    # A new table, empty: created in the migration's transaction, blocking nothing.
    dependencies = [
        ("pgoutbox", "0009_queue_controls"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueMinute",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", models.TextField()),
                ("minute", models.DateTimeField()),
                ("completed", models.IntegerField(db_default=0, default=0)),
                ("failed", models.IntegerField(db_default=0, default=0)),
                ("dead", models.IntegerField(db_default=0, default=0)),
                ("backlog", models.IntegerField(blank=True, null=True)),
                ("oldest_pending_age", models.FloatField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "queue minute",
                "db_table": "queue_minutes",
                "indexes": [models.Index(fields=["minute"], name="queue_minutes_minute_idx")],
                "constraints": [
                    models.UniqueConstraint(fields=("queue", "minute"), name="queue_minutes_uq")
                ],
            },
        ),
    ]
