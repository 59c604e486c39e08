import django.contrib.postgres.functions
from django.db import migrations, models

import django_pgoutbox.ids
import django_pgoutbox.models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="ScheduleCursor",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("last_slot_at", models.DateTimeField(blank=True, null=True)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
            ],
            options={
                "verbose_name": "schedule cursor",
                "db_table": "schedule_cursors",
            },
        ),
        migrations.CreateModel(
            name="WorkerHeartbeat",
            fields=[
                ("worker_id", models.TextField(primary_key=True, serialize=False)),
                ("hostname", models.TextField()),
                ("pid", models.IntegerField()),
                ("roles", models.JSONField(default=list)),
                ("queues", models.JSONField(default=list)),
                (
                    "started_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
                (
                    "last_seen_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
            ],
            options={
                "verbose_name": "worker heartbeat",
                "db_table": "worker_heartbeats",
            },
        ),
        migrations.CreateModel(
            name="Job",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        db_default=django.contrib.postgres.functions.RandomUUID(),
                        default=django_pgoutbox.ids.uuid7,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("organization_id", models.UUIDField(blank=True, null=True)),
                ("queue", models.TextField()),
                ("job_type", models.TextField()),
                ("payload", models.JSONField()),
                ("idempotency_key", models.TextField(blank=True, null=True)),
                (
                    "status",
                    models.TextField(
                        choices=[
                            ("pending", "pending"),
                            ("leased", "leased"),
                            ("retrying", "retrying"),
                            ("completed", "completed"),
                            ("dead", "dead"),
                            ("cancelled", "cancelled"),
                        ],
                        db_default="pending",
                        default="pending",
                    ),
                ),
                ("priority", models.IntegerField(db_default=0, default=0)),
                (
                    "run_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
                ("attempts", models.IntegerField(db_default=0, default=0)),
                ("max_attempts", models.IntegerField(db_default=10, default=10)),
                ("locked_at", models.DateTimeField(blank=True, null=True)),
                ("locked_by", models.TextField(blank=True, null=True)),
                ("last_error_code", models.TextField(blank=True, null=True)),
                ("last_error_summary", models.TextField(blank=True, null=True)),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
                ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("result", models.JSONField(blank=True, null=True)),
                (
                    "worker_ids",
                    models.JSONField(db_default=models.Value([], models.JSONField()), default=list),
                ),
            ],
            options={
                "db_table": "jobs",
                "ordering": ["-created_at", "id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("status__in", ("pending", "retrying"))),
                        fields=["queue", "-priority", "run_at", "created_at", "id"],
                        name="jobs_claim_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status", "leased")),
                        fields=["locked_by"],
                        name="jobs_leased_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status", "dead")),
                        fields=["queue", "-finished_at"],
                        name="jobs_dead_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status__in", ("completed", "cancelled"))),
                        fields=["finished_at"],
                        name="jobs_finished_idx",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("organization_id", "job_type", "idempotency_key"),
                        name="jobs_idempotency_uq",
                        nulls_distinct=False,
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["pending", "leased", "retrying", "completed", "dead", "cancelled"],
                            )
                        ),
                        name="jobs_status_valid",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="DeadLetter",
            fields=[],
            options={
                "verbose_name": "dead letter",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("pgoutbox.job",),
        ),
        migrations.CreateModel(
            name="OutboxEvent",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        db_default=django.contrib.postgres.functions.RandomUUID(),
                        default=django_pgoutbox.ids.uuid7,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("organization_id", models.UUIDField(blank=True, null=True)),
                ("aggregate_type", models.TextField()),
                ("aggregate_id", models.UUIDField()),
                ("event_type", models.TextField()),
                ("schema_version", models.IntegerField()),
                ("payload", models.JSONField()),
                (
                    "occurred_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
                (
                    "available_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
                ("claimed_at", models.DateTimeField(blank=True, null=True)),
                ("claimed_by", models.TextField(blank=True, null=True)),
                ("processed_at", models.DateTimeField(blank=True, null=True)),
                ("attempts", models.IntegerField(db_default=0, default=0)),
                ("last_error", models.TextField(blank=True, null=True)),
                ("last_error_code", models.TextField(blank=True, null=True)),
                ("dead_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "outbox event",
                "db_table": "outbox_events",
                "ordering": ["occurred_at", "id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("processed_at__isnull", True)),
                        fields=["available_at", "occurred_at"],
                        name="outbox_pending_idx",
                    ),
                    models.Index(
                        condition=models.Q(("processed_at__isnull", True)),
                        fields=["occurred_at", "id"],
                        name="outbox_claim_idx",
                    ),
                    models.Index(
                        condition=models.Q(("processed_at__isnull", False)),
                        fields=["processed_at"],
                        name="outbox_processed_idx",
                    ),
                    models.Index(
                        condition=models.Q(("processed_at__isnull", True)),
                        fields=["aggregate_type", "aggregate_id", "occurred_at", "id"],
                        name="outbox_aggregate_pending_idx",
                    ),
                ],
            },
        ),
        # A queue table is rewritten at the rate it works: each job is inserted once and updated
        # at each claim, renewal and outcome. fillfactor leaves room on each page for those new
        # row versions (and lets renewals, which touch no indexed column, be HOT updates); the
        # autovacuum settings clean dead versions after 1% of the table changed instead of 20%,
        # because dead entries in the claim index slow down every claim. docs/tables.md says more.
        migrations.RunSQL(
            sql=[
                "ALTER TABLE jobs SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01, "
                "autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
                "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 1)",
                "ALTER TABLE outbox_events SET (fillfactor = 80, "
                "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
                "autovacuum_analyze_scale_factor = 0.02, "
                "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 1)",
            ],
            reverse_sql=[
                "ALTER TABLE jobs RESET (fillfactor, autovacuum_vacuum_scale_factor, "
                "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, "
                "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_cost_delay)",
                "ALTER TABLE outbox_events RESET (fillfactor, autovacuum_vacuum_scale_factor, "
                "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, "
                "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_cost_delay)",
            ],
        ),
    ]
