from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Projection",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("event_id", models.UUIDField(unique=True)),
                ("aggregate_id", models.UUIDField()),
                ("sequence", models.IntegerField()),
                ("relay", models.TextField()),
            ],
        ),
        migrations.CreateModel(
            name="SideEffect",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_id", models.UUIDField(db_index=True)),
                ("attempt", models.IntegerField()),
                ("event", models.TextField()),
                ("pid", models.IntegerField()),
                ("worker_thread", models.TextField()),
                ("at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
