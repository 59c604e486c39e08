from django.db import migrations, models


class Migration(migrations.Migration):
    # Traces (docs/observability.md, "Traces"): the W3C trace context of the span that enqueued
    # a job or published an event. Nullable columns with no default: a change of the catalog
    # only, no row rewritten; a row written with no span recording keeps them NULL.
    dependencies = [
        ("pgoutbox", "0019_priority_aging"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="outboxevent",
            name="trace_context",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
