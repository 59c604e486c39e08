import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="TrackingSession",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, primary_key=True, serialize=False)),
                ("organization_id", models.UUIDField()),
                ("device", models.TextField()),
                ("status", models.TextField(default="active")),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                ("version", models.IntegerField(default=1)),
            ],
            options={
                "abstract": False,
            },
        ),
    ]
