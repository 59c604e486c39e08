from django.db import migrations, models


class Migration(migrations.Migration):
    # A nullable column with no default: PostgreSQL adds it to the catalog only, at once, without
    # rewriting or scanning the live jobs table (its brief ACCESS EXCLUSIVE lock waits for, and
    # holds up, the statements in flight on it).
    dependencies = [
        ("pgoutbox", "0010_queue_minutes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="attempt_log",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
