from django.db import migrations, models

import django_pgoutbox.models


class Migration(migrations.Migration):
    # Priority aging (docs/workers.md, "Priority aging"). A nullable column with no default is
    # a change of the catalog only: no row is rewritten, and enqueue writes nothing more (the
    # column stays NULL until aging first raises the job). The new table is empty.
    dependencies = [
        ("pgoutbox", "0018_sequences"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueAging",
            fields=[
                ("queue", models.TextField(primary_key=True, serialize=False)),
                (
                    "aged_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
            ],
            options={
                "verbose_name": "queue aging",
                "db_table": "queue_aging",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="base_priority",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
    ]
