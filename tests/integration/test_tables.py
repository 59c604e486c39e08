"""The tables as PostgreSQL sees them: every column, default and index of the source text."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

pytestmark = pytest.mark.django_db


def columns(table: str) -> dict[str, tuple[str, str, str | None]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_name = %s",
            [table],
        )
        return {name: (kind, nullable, default) for name, kind, nullable, default in cursor}


def indexes(table: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return dict(cursor.fetchall())


def reloptions(table: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        return set(cursor.fetchone()[0] or [])


TS = "timestamp with time zone"

SEED_OUTBOX = {
    "id": ("uuid", "NO", None),
    "organization_id": ("uuid", "YES", None),
    "aggregate_type": ("text", "NO", None),
    "aggregate_id": ("uuid", "NO", None),
    "event_type": ("text", "NO", None),
    "schema_version": ("integer", "NO", None),
    "payload": ("jsonb", "NO", None),
    "occurred_at": (TS, "NO", None),
    "available_at": (TS, "NO", "now()"),
    "claimed_at": (TS, "YES", None),
    "claimed_by": ("text", "YES", None),
    "processed_at": (TS, "YES", None),
    "attempts": ("integer", "NO", "0"),
    "last_error": ("text", "YES", None),
}

SEED_JOBS = {
    "id": ("uuid", "NO", None),
    "organization_id": ("uuid", "YES", None),
    "queue": ("text", "NO", None),
    "job_type": ("text", "NO", None),
    "payload": ("jsonb", "NO", None),
    "idempotency_key": ("text", "YES", None),
    "status": ("text", "NO", "'pending'::text"),
    "priority": ("integer", "NO", "0"),
    "run_at": (TS, "NO", "now()"),
    "attempts": ("integer", "NO", "0"),
    "max_attempts": ("integer", "NO", "10"),
    "locked_at": (TS, "YES", None),
    "locked_by": ("text", "YES", None),
    "last_error_code": ("text", "YES", None),
    "last_error_summary": ("text", "YES", None),
    "completed_at": (TS, "YES", None),
    "created_at": (TS, "NO", "now()"),
}


@pytest.mark.parametrize(("table", "seed"), [("outbox_events", SEED_OUTBOX), ("jobs", SEED_JOBS)])
def test_every_seed_column_with_its_type_and_default(
    table: str, seed: dict[str, tuple[str, str, str | None]]
) -> None:
    actual = columns(table)
    for name, (kind, nullable, default) in seed.items():
        assert actual[name][:2] == (kind, nullable), name
        if default is not None:
            assert actual[name][2] == default, name


def test_added_columns() -> None:
    assert set(columns("jobs")) - set(SEED_JOBS) == {
        "lease_expires_at",
        "finished_at",
        "result",
        "worker_ids",
        "cancel_requested_at",
        "alone_attempt",
        "lost_attempts",
        "attempt_log",
        "dead_cause",
        "event_id",
        "workflow_id",
        "step",
        "waiting_for",
        "has_dependants",
        "on_upstream_failure",
        "progress",
        "meta",
        "unique_key",
        "unique_states",
        "sequence_key",
        "sequence_position",
        "base_priority",
        "trace_context",
    }
    assert columns("jobs")["trace_context"] == ("jsonb", "YES", None)  # no default: no rewrite
    assert columns("jobs")["base_priority"] == ("integer", "YES", None)  # no default: no rewrite
    assert columns("queue_aging") == {"queue": ("text", "NO", None), "aged_at": (TS, "NO", "now()")}
    assert columns("jobs")["workflow_id"] == ("uuid", "YES", None)
    assert columns("jobs")["unique_key"] == ("uuid", "YES", None)
    assert columns("jobs")["unique_states"] == ("integer", "YES", None)
    assert columns("jobs")["waiting_for"] == ("integer", "YES", None)
    assert columns("jobs")["has_dependants"] == ("boolean", "YES", None)
    assert columns("jobs")["progress"] == ("jsonb", "YES", None)
    assert columns("job_dependencies") == {
        "parent_id": ("uuid", "NO", None),
        "child_id": ("uuid", "NO", None),
        "external": ("boolean", "NO", "false"),
    }
    assert columns("jobs")["attempt_log"] == ("jsonb", "YES", None)
    assert columns("jobs")["dead_cause"] == ("text", "YES", None)
    assert columns("jobs")["event_id"] == ("uuid", "YES", None)
    assert set(columns("outbox_events")) - set(SEED_OUTBOX) == {
        "last_error_code",
        "dead_at",
        "trace_context",
    }
    assert columns("outbox_events")["trace_context"] == ("jsonb", "YES", None)
    assert set(columns("worker_heartbeats")) == {
        "worker_id",
        "hostname",
        "pid",
        "roles",
        "queues",
        "started_at",
        "last_seen_at",
        "stuck_queues",
    }
    assert columns("schedule_cursors") == {
        "name": ("text", "NO", None),
        "last_slot_at": (TS, "YES", None),
        "updated_at": (TS, "NO", "now()"),
    }


def test_primary_keys_default_to_a_random_uuid_for_raw_inserts() -> None:
    assert columns("jobs")["id"][2] == "gen_random_uuid()"
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload) VALUES ('default', 'x', '{}') "
            "RETURNING id, status, run_at = now()"
        )
        _, status, run_at_is_now = cursor.fetchone()
    assert (status, run_at_is_now) == ("pending", True)


@pytest.mark.smoke
def test_seed_indexes_verbatim() -> None:
    assert indexes("outbox_events")["outbox_pending_idx"] == (
        "CREATE INDEX outbox_pending_idx ON public.outbox_events "
        "USING btree (available_at, occurred_at) WHERE (processed_at IS NULL)"
    )
    assert indexes("jobs")["jobs_idempotency_uq"] == (
        "CREATE UNIQUE INDEX jobs_idempotency_uq ON public.jobs "
        "USING btree (organization_id, job_type, idempotency_key) NULLS NOT DISTINCT "
        "WHERE (idempotency_key IS NOT NULL)"
    )


def test_outbox_order_index() -> None:
    assert indexes("outbox_events")["outbox_aggregate_pending_idx"] == (
        "CREATE INDEX outbox_aggregate_pending_idx ON public.outbox_events "
        "USING btree (aggregate_type, aggregate_id, occurred_at, id) WHERE (processed_at IS NULL)"
    )


def test_retention_and_relay_indexes() -> None:
    assert indexes("jobs")["jobs_finished_idx"] == (
        "CREATE INDEX jobs_finished_idx ON public.jobs USING btree (finished_at) "
        "WHERE (status = ANY (ARRAY['completed'::text, 'cancelled'::text]))"
    )
    assert indexes("outbox_events")["outbox_claim_idx"] == (
        "CREATE INDEX outbox_claim_idx ON public.outbox_events USING btree (occurred_at, id) "
        "WHERE (processed_at IS NULL)"
    )
    assert indexes("outbox_events")["outbox_processed_idx"] == (
        "CREATE INDEX outbox_processed_idx ON public.outbox_events USING btree (processed_at) "
        "WHERE (processed_at IS NOT NULL)"
    )


def test_claim_index_matches_the_claim_predicate() -> None:
    assert indexes("jobs")["jobs_claim_idx"] == (
        "CREATE INDEX jobs_claim_idx ON public.jobs "
        "USING btree (queue, priority DESC, run_at, created_at, id) "
        "WHERE (status = ANY (ARRAY['pending'::text, 'retrying'::text]))"
    )


def test_hot_tables_have_queue_storage_settings() -> None:
    for table in ("jobs", "outbox_events"):
        options = reloptions(table)
        assert "fillfactor=80" in options
        assert "autovacuum_vacuum_scale_factor=0.01" in options


def test_status_is_constrained() -> None:
    from django.db import IntegrityError, transaction

    with (
        pytest.raises(IntegrityError, match="jobs_status_valid"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload, status) VALUES ('q', 'x', '{}', 'done')"
        )


@pytest.mark.smoke
def test_migrations_match_the_models() -> None:
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
