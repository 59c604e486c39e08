"""Metrics, gauges, exposition, stats, health, logs and signals."""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_pgoutbox import enqueue, enqueue_many, metrics, publish, queries, signals
from django_pgoutbox import gauges as db_gauges
from django_pgoutbox.conf import get_settings
from django_pgoutbox.health import Heartbeat, health_report
from django_pgoutbox.log import JSONFormatter
from django_pgoutbox.models import Job, OutboxEvent
from django_pgoutbox.prometheus import database_exposition, process_registry
from django_pgoutbox.scheduler import Scheduler
from django_pgoutbox.schedules import Schedule
from django_pgoutbox.worker import Worker
from django_pgoutbox.worker.relay import Relay
from tests.conftest import drain
from tests.processes import holds_for, scaled, wait_for

ALLOWED_LABELS = {
    "queue",
    "job_type",
    "outcome",
    "status",
    "role",
    "event_type",
    "schedule",
    "subscriber",
    "state",
    "limit",  # pgoutbox_queue_limit: concurrency, max_running or rate_limit
}


def gauges() -> db_gauges.DatabaseGauges:
    return db_gauges.database_gauges()


@pytest.mark.django_db(transaction=True)  # the worker threads see only committed jobs
class TestMetricsMove:
    def test_jobs_through_their_states(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETRY": {"BASE_DELAY": 60, "JITTER": 0}}
        claimed = metrics.JOBS_CLAIMED.value(queue="default")
        durations = metrics.JOB_DURATION.count(
            queue="default", job_type="tests.behave", outcome="completed"
        )
        claim_time = metrics.CLAIM_DURATION.count(queue="default")
        delays = metrics.JOB_START_DELAY.count(queue="default")
        batches = metrics.BATCH_DB_DURATION.count(role="jobs")

        enqueue_many([{"job_type": "tests.behave", "payload": {}}] * 3)
        enqueue("tests.behave", {"fail": "transient"})
        enqueue("tests.behave", {"fail": "permanent"})
        enqueue("tests.behave", {}, run_at=timedelta(hours=1))
        before = gauges().queues["default"]
        assert (before.pending, before.scheduled) == (5, 1)
        assert before.oldest_pending_age >= 0

        drain()
        after = gauges().queues["default"]
        assert (after.pending, after.scheduled, after.retrying, after.dead) == (0, 1, 1, 1)
        assert metrics.JOBS_CLAIMED.value(queue="default") - claimed == 5
        assert (
            metrics.JOB_DURATION.count(
                queue="default", job_type="tests.behave", outcome="completed"
            )
            - durations
            == 3
        )
        assert (
            metrics.JOB_OUTCOMES.value(queue="default", job_type="tests.behave", outcome="dead")
            >= 1
        )
        assert metrics.CLAIM_DURATION.count(queue="default") > claim_time
        assert metrics.JOB_START_DELAY.count(queue="default") - delays == 5
        assert metrics.BATCH_DB_DURATION.count(role="jobs") > batches

    def test_leased_gauge_and_lease_expiration(self) -> None:
        enqueue("tests.behave", {})
        with connection.cursor() as cursor:
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "crashed", "lease": 0.0},
            )
        assert gauges().queues["default"].leased == 1
        expired = metrics.LEASE_EXPIRATIONS.value(queue="default")
        drain()
        assert metrics.LEASE_EXPIRATIONS.value(queue="default") == expired + 1
        assert gauges().queues["default"].leased == 0

    def test_outbox_lag_and_projection_counts(self) -> None:
        event = publish(
            "tests.projected", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={}
        )
        OutboxEvent.objects.filter(pk=event.pk).update(
            occurred_at=timezone.now() - timedelta(minutes=5)
        )
        snapshot = gauges()
        assert snapshot.outbox_pending == 1
        assert snapshot.outbox_lag >= 299
        projected = metrics.EVENTS_PROJECTED.value(
            event_type="tests.projected", outcome="processed"
        )
        conf = get_settings()
        Relay(conf.outbox, relay_id="r", using="default", policy=conf.retry, burst=True).run()
        assert (
            metrics.EVENTS_PROJECTED.value(event_type="tests.projected", outcome="processed")
            == projected + 1
        )
        assert (gauges().outbox_pending, gauges().outbox_lag) == (0, 0)

    def test_scheduler_counts_slots(self) -> None:
        tick = Schedule(
            name="obs-tick", job_type="tests.noop", every=timedelta(seconds=60), queue="default"
        )
        loop = Scheduler({"obs-tick": tick}, using="default", poll_interval=1)
        now = timezone.now()
        before = metrics.SCHEDULE_SLOTS.value(schedule="obs-tick")
        loop.run_once(now)  # first sight
        loop.run_once(now + timedelta(minutes=1))
        assert metrics.SCHEDULE_SLOTS.value(schedule="obs-tick") == before + 1

    def test_xmin_horizon_and_notify_queue(self, raw_connection_params: dict[str, Any]) -> None:
        import psycopg

        with psycopg.connect(**raw_connection_params) as idle_in_transaction:
            idle_in_transaction.execute("SELECT 1")  # opens a transaction and leaves it open
            wait_for(lambda: gauges().oldest_transaction_age >= 1.0, timeout=5)
        assert 0 <= gauges().notification_queue_usage < 1


def _gauge_parameters() -> dict[str, Any]:
    configured = list(get_settings().queues)
    return {
        "queues": configured,
        "limit": db_gauges.EXACT_COUNT + 1,
        "priorities": db_gauges.MAX_PRIORITIES,
        "probes": len(configured) + db_gauges.MAX_UNREGISTERED_QUEUES + 1,
        "unregistered": db_gauges.MAX_UNREGISTERED_QUEUES,
    }


@pytest.mark.django_db
def test_gauges_read_only_partial_indexes_on_a_large_table() -> None:
    with connection.cursor() as cursor:
        # 200,000 finished jobs and events, a few live ones: the shape of a busy year.
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, finished_at) "
            "SELECT 'default', 'x', '{}', 'completed', now() FROM generate_series(1, 200000)"
        )
        cursor.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, schema_version, "
            "payload, processed_at) SELECT 'a', gen_random_uuid(), 'e', 1, '{}', now() "
            "FROM generate_series(1, 200000)"
        )
        enqueue_many([{"job_type": "x", "payload": {}}] * 10)
        cursor.execute("ANALYZE jobs")
        cursor.execute("ANALYZE outbox_events")
        for sql, params in (
            (queries.JOB_GAUGES, _gauge_parameters()),
            (
                queries.OUTBOX_AND_SERVER_GAUGES,
                {"limit": db_gauges.EXACT_COUNT + 1, "overdue": 300.0},
            ),
        ):
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on jobs" not in plan, plan
            assert "Seq Scan on outbox_events" not in plan, plan
        started = time.perf_counter()
        snapshot = gauges()
        elapsed = time.perf_counter() - started
    assert snapshot.queues["default"].pending == 10
    assert elapsed < scaled(0.5), elapsed  # a sanity bound; the plans above are the real check


@pytest.mark.django_db(transaction=True)
def test_no_label_carries_an_organization_or_a_payload_value() -> None:
    secret_org = uuid.uuid4()
    secret_value = f"payload-{uuid.uuid4()}"
    enqueue_many(
        [
            {
                "job_type": "tests.behave",
                "payload": {"v": secret_value},
                "organization_id": secret_org,
            }
        ]
        * 3
    )
    enqueue("tests.behave", {"fail": "permanent", "v": secret_value}, organization_id=secret_org)
    publish(
        "tests.projected",
        aggregate_type="t",
        aggregate_id=uuid.uuid4(),
        payload={"v": secret_value},
        organization_id=secret_org,
    )
    drain()
    conf = get_settings()
    Relay(conf.outbox, relay_id="r", using="default", policy=conf.retry, burst=True).run()

    for metric in metrics.REGISTRY.values():
        assert set(metric.labelnames) <= ALLOWED_LABELS, metric.name
        for key in metric.samples():
            for value in key:
                assert str(secret_org) not in value
                assert secret_value not in value
    text = database_exposition().decode()
    assert str(secret_org) not in text
    assert secret_value not in text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS | {"le"}, sample


def test_label_values_by_position_count_as_by_name() -> None:
    counter = metrics.Counter("test_positional_total", "test", ["queue", "outcome"])
    counter.inc_key(("q", "completed"), 2)
    counter.inc(queue="q", outcome="completed")
    assert counter.value(queue="q", outcome="completed") == 3
    histogram = metrics.Histogram("test_positional_seconds", "test", ["queue"], buckets=[1.0])
    histogram.observe_key(("q",), 0.5)
    histogram.observe(2.0, queue="q")
    assert histogram.count(queue="q") == 2
    with pytest.raises(ValueError, match="takes labels"):
        counter.inc_key(("q",))
    with pytest.raises(ValueError, match="takes labels"):
        histogram.observe_key(("q", "extra"), 1.0)


@pytest.mark.django_db
class TestExposition:
    def test_database_gauges_exposition(self) -> None:
        enqueue("tests.noop", {}, queue="reports")
        families = {
            f.name: f for f in text_string_to_metric_families(database_exposition().decode())
        }
        jobs = {
            (s.labels["queue"], s.labels["status"]): s.value
            for s in families["pgoutbox_jobs"].samples
        }
        assert jobs[("reports", "pending")] == 1
        assert jobs[("default", "dead")] == 0
        for name in (
            "pgoutbox_oldest_pending_age_seconds",
            "pgoutbox_outbox_lag_seconds",
            "pgoutbox_oldest_transaction_age_seconds",
            "pgoutbox_notification_queue_usage_ratio",
            "pgoutbox_outbox_events_pending",
        ):
            assert name in families

    def test_process_metrics_exposition(self) -> None:
        from prometheus_client import generate_latest

        metrics.JOB_DURATION.observe(0.003, queue="q", job_type="t", outcome="completed")
        text = generate_latest(process_registry()).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["pgoutbox_job_duration_seconds"].type == "histogram"
        assert families["pgoutbox_job_outcomes"].type == "counter"  # exposed as ..._total
        assert "pgoutbox_job_outcomes_total" in text

    def test_metrics_view(self, admin_client: Any) -> None:
        response = admin_client.get("/pgoutbox/metrics")
        assert response.status_code == 200
        assert b"pgoutbox_jobs{" in response.content


@pytest.mark.django_db(transaction=True)
class TestHealth:
    def test_no_worker_is_unhealthy(self, admin_client: Any) -> None:
        response = admin_client.get("/pgoutbox/health")
        assert response.status_code == 503
        assert response.json()["roles"] == {"jobs": False, "relay": False, "scheduler": False}

    def test_heartbeat_makes_roles_healthy_until_it_stops_or_ages(self, admin_client: Any) -> None:
        beat = Heartbeat("w1", ["jobs", "relay"], ["default"], "default")
        beat.start()
        try:
            response = admin_client.get("/pgoutbox/health?require=jobs,relay")
            assert response.status_code == 200
            assert response.json()["workers"][0]["queues"] == ["default"]
            assert admin_client.get("/pgoutbox/health").status_code == 503  # no scheduler
            wait_for(lambda: not health_report(max_age=0.1, require=["jobs"]).healthy)  # too old
        finally:
            beat.stop()
        assert admin_client.get("/pgoutbox/health?require=jobs").status_code == 503  # row deleted
        assert admin_client.get("/pgoutbox/health?max_age=soon").status_code == 400

    @pytest.mark.django_db(transaction=True, databases=["default", "secondary"])
    def test_health_view_reads_the_database_asked_for(self, admin_client: Any) -> None:
        beat = Heartbeat("w1", ["jobs"], ["default"], "default")
        beat.start()
        try:
            assert admin_client.get("/pgoutbox/health?require=jobs").status_code == 200
            elsewhere = admin_client.get("/pgoutbox/health?require=jobs&database=secondary")
            assert elsewhere.status_code == 503
            assert elsewhere.json()["workers"] == []
            unknown = admin_client.get("/pgoutbox/health?database=nope")
            assert unknown.status_code == 400
            assert unknown.json() == {
                "error": "database must be the alias of a PostgreSQL database that holds the "
                "pgoutbox tables (default, secondary, direct), not 'nope'"
            }
        finally:
            beat.stop()

    def test_a_reused_worker_id_describes_the_new_process(self) -> None:
        from django_pgoutbox.models import WorkerHeartbeat

        WorkerHeartbeat.objects.create(
            worker_id="w1", hostname="old-host", pid=1, roles=["relay"], queues=[]
        )
        WorkerHeartbeat.objects.filter(pk="w1").update(
            started_at=timezone.now() - timedelta(days=1)
        )
        beat = Heartbeat("w1", ["jobs"], ["default"], "default")
        beat.beat()
        row = WorkerHeartbeat.objects.get(pk="w1")
        assert (row.hostname, row.roles, row.queues) == (
            socket.gethostname(),
            ["jobs"],
            ["default"],
        )
        assert row.pid != 1
        assert timezone.now() - row.started_at < timedelta(minutes=1)
        started = row.started_at
        beat.beat()  # the same process again: started_at stays
        assert WorkerHeartbeat.objects.get(pk="w1").started_at == started
        WorkerHeartbeat.objects.filter(pk="w1").delete()

    def test_a_scheduler_alone_listens_to_nothing(self) -> None:
        import threading

        worker = Worker(roles=["scheduler"])
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            wait_for(lambda: worker.scheduler is not None and thread.is_alive())
            holds_for(lambda: worker.listener is None, 0.3)
        finally:
            worker.stop()
            thread.join(timeout=10)
        assert not thread.is_alive()

    def test_health_command_exit_status(self) -> None:
        out = StringIO()
        with pytest.raises(SystemExit) as exited:
            call_command("pgoutbox", "health", stdout=out)
        assert exited.value.code == 1
        assert json.loads(out.getvalue())["healthy"] is False


@pytest.mark.django_db
def test_stats_command_on_a_known_state() -> None:
    enqueue_many([{"job_type": "x", "payload": {}, "queue": "webhooks"}] * 4)
    dead = enqueue("x", {}, queue="webhooks")
    Job.objects.filter(pk=dead.pk).update(status="dead")
    enqueue("x", {}, queue="webhooks", run_at=timedelta(hours=1))
    out = StringIO()
    call_command("pgoutbox", "stats", stdout=out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("webhooks"))
    assert row.split()[:6] == ["webhooks", "4", "1", "0", "0", "1"]
    assert "outbox: 0 pending, 0 dead" in out.getvalue()
    out = StringIO()
    call_command("pgoutbox", "stats", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["queues"]["webhooks"]["pending"] == 4
    assert data["queues"]["webhooks"]["dead"] == 1


@pytest.mark.django_db(transaction=True)
def test_signals_and_json_logs(caplog: Any) -> None:
    seen: list[tuple[str, Any]] = []

    def started(sender: Any, job: Any, **kwargs: Any) -> None:
        seen.append(("started", job.job_type))

    def finished(sender: Any, job: Any, outcome: str, duration: float, **kwargs: Any) -> None:
        seen.append((outcome, duration >= 0))

    signals.job_started.connect(started)
    signals.job_finished.connect(finished)
    try:
        failing = enqueue("tests.behave", {"fail": "permanent"})
        with caplog.at_level(logging.DEBUG, logger="django_pgoutbox"):
            drain()
    finally:
        signals.job_started.disconnect(started)
        signals.job_finished.disconnect(finished)
    assert seen == [("started", "tests.behave"), ("dead", True)]
    line, traceback = (
        json.loads(JSONFormatter().format(r))
        for r in caplog.records
        if getattr(r, "job_id", None) == str(failing.id) and r.name == "django_pgoutbox.worker"
    )
    assert line["job_id"] == str(failing.id)
    assert (line["job_type"], line["queue"], line["attempt"], line["outcome"]) == (
        "tests.behave",
        "default",
        1,
        "dead",
    )
    assert line["message"].endswith(
        "-> dead: a permanent failure (PermanentError) is never retried"
    )
    assert "exc_info" not in line  # a failure the handler chose: one line
    assert traceback["level"] == "DEBUG"
    assert "PermanentError: invalid payload" in traceback["exc_info"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_handlers_logger_carries_the_jobs_fields(caplog: Any) -> None:
    from django_pgoutbox.log import job_logger
    from tests.conftest import claimed_job

    job = claimed_job("reports.build", attempt=2, queue="reports")
    adapter = job_logger(job)
    with caplog.at_level(logging.INFO, logger="django_pgoutbox.jobs.reports.build"):
        adapter.info("built %d rows", 3)
        adapter.warning("and once more", extra={"rows": 3})
    first, second = caplog.records
    assert first.name == "django_pgoutbox.jobs.reports.build"
    assert first.getMessage() == "built 3 rows"
    for record in (first, second):
        assert (record.job_id, record.job_type, record.queue, record.attempt) == (
            str(job.id),
            "reports.build",
            "reports",
            2,
        )
    assert adapter.extra == {
        "job_id": str(job.id),
        "job_type": "reports.build",
        "queue": "reports",
        "attempt": 2,
    }


# -- the gauges' cost and exactness --------------------------------------------------------------


def _buffers(sql: str, params: dict[str, Any]) -> int:
    """Shared buffers the statement touched, planning aside."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def _fill(rows: int) -> None:
    """``rows`` each of due, scheduled, retrying, leased and dead jobs, and of waiting and dead
    events; then statistics."""
    with connection.cursor() as cursor:
        for status, offset in (
            ("pending", "-1 minute"),
            ("pending", "1 hour"),
            ("retrying", "-1 second"),
            ("leased", "-1 minute"),
            ("dead", "-1 day"),
        ):
            cursor.execute(
                "INSERT INTO jobs (queue, job_type, payload, status, priority, run_at, "
                "finished_at) SELECT 'default', 'x', '{}', %s, n %% 3, now() + %s::interval, "
                "CASE WHEN %s = 'dead' THEN now() END FROM generate_series(1, %s) AS n",
                [status, offset, status, rows],
            )
        cursor.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, schema_version, "
            "payload, dead_at) SELECT 'a', gen_random_uuid(), 'e', 1, '{}', "
            "CASE WHEN n %% 2 = 0 THEN now() END FROM generate_series(1, %s) AS n",
            [2 * rows],
        )
        cursor.execute("ANALYZE jobs")
        cursor.execute("ANALYZE outbox_events")


@pytest.mark.django_db
def test_a_scrape_reads_as_much_at_any_size() -> None:
    """The gauges' statements touch about as many buffers with ten times the rows: each count
    stops at its limit, whatever the tables hold."""
    statements = (
        (queries.JOB_GAUGES, _gauge_parameters()),
        (queries.OUTBOX_AND_SERVER_GAUGES, {"limit": db_gauges.EXACT_COUNT + 1, "overdue": 300.0}),
    )
    _fill(3_000)
    small = [_buffers(sql, params) for sql, params in statements]
    _fill(27_000)  # 30,000 of each now
    large = [_buffers(sql, params) for sql, params in statements]
    for before, after in zip(small, large, strict=True):
        assert after <= before * 1.25 + 20, (small, large)
    snapshot = gauges()
    default = snapshot.queues["default"]
    assert set(default.estimated) == {"pending", "scheduled", "retrying", "leased", "dead"}
    for status in default.estimated:
        assert getattr(default, status) > db_gauges.EXACT_COUNT
    # Abandoned events are looked for among the first ones only: a lower bound here.
    assert set(snapshot.estimated) == {"outbox_pending", "outbox_dead", "outbox_abandoned"}
    assert snapshot.outbox_dead > db_gauges.EXACT_COUNT


def _job(queue: str, status: str, *, run_at: str = "-1 minute", priority: int = 0) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, priority, run_at, finished_at) "
            "VALUES (%s, 'x', '{}', %s, %s, now() + %s::interval, "
            "CASE WHEN %s = 'dead' THEN now() END)",
            [queue, status, priority, run_at, status],
        )


@pytest.mark.django_db
def test_counts_are_exact_up_to_the_limit_then_at_least_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(db_gauges, "EXACT_COUNT", 3)
    for status, run_at in (
        ("pending", "-1 minute"),
        ("pending", "-2 minutes"),
        ("pending", "1 hour"),
        ("retrying", "-1 second"),
        ("retrying", "1 minute"),
        ("leased", "-1 minute"),
        ("dead", "-1 day"),
        ("dead", "-1 day"),
    ):
        _job("webhooks", status, run_at=run_at)
    webhooks = gauges().queues["webhooks"]
    assert (
        webhooks.pending,
        webhooks.scheduled,
        webhooks.retrying,
        webhooks.leased,
        webhooks.dead,
        webhooks.estimated,
    ) == (2, 1, 2, 1, 2, ())
    assert 110 <= webhooks.oldest_pending_age < 600
    for _ in range(5):
        _job("webhooks", "pending")
    webhooks = gauges().queues["webhooks"]
    assert webhooks.estimated == ("pending",)
    assert webhooks.pending > 3  # at least what was counted past the limit
    assert (webhooks.scheduled, webhooks.retrying, webhooks.dead) == (1, 2, 2)


@pytest.mark.django_db
def test_the_oldest_due_job_of_any_priority_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    _job("reports", "pending", priority=9, run_at="-1 minute")
    _job("reports", "pending", priority=5, run_at="-1 hour")
    _job("reports", "retrying", priority=0, run_at="-2 hours")
    _job("reports", "pending", priority=-3, run_at="1 day")  # not due
    reports = gauges().queues["reports"]
    assert 7190 <= reports.oldest_pending_age < 7500
    assert reports.estimated == ()
    monkeypatch.setattr(db_gauges, "MAX_PRIORITIES", 2)  # the walk stops before priority 0
    reports = gauges().queues["reports"]
    assert 3590 <= reports.oldest_pending_age < 3900
    assert set(reports.estimated) == {"pending", "scheduled", "oldest_pending_age"}


@pytest.mark.django_db
def test_outbox_counts_and_lag_past_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db_gauges, "EXACT_COUNT", 3)

    def event(*, minutes_ago: int, dead: bool = False, backoff: bool = False) -> None:
        OutboxEvent.objects.filter(
            pk=publish("e", aggregate_type="a", aggregate_id=uuid.uuid4(), payload={}).pk
        ).update(
            occurred_at=timezone.now() - timedelta(minutes=minutes_ago),
            dead_at=timezone.now() if dead else None,
            available_at=timezone.now() + timedelta(hours=1 if backoff else -1),
        )

    event(minutes_ago=50, dead=True)
    event(minutes_ago=40, backoff=True)
    event(minutes_ago=30)
    snapshot = gauges()
    assert (snapshot.outbox_pending, snapshot.outbox_dead, snapshot.estimated) == (2, 1, ())
    assert 1790 <= snapshot.outbox_lag < 2100  # dead and backing-off events do not count
    for minutes in (49, 48, 47):
        event(minutes_ago=minutes, dead=True)
    snapshot = gauges()
    assert "outbox_dead" in snapshot.estimated
    assert snapshot.outbox_dead >= 4
    # The first four waiting events are dead: the lag is at most the age of the fifth.
    assert "outbox_lag" in snapshot.estimated
    assert 2390 <= snapshot.outbox_lag < 2700


@pytest.mark.django_db
def test_jobs_of_queues_not_configured_are_unregistered(monkeypatch: pytest.MonkeyPatch) -> None:
    _job("gone-queue", "pending")
    _job("gone-queue", "dead")
    _job("other-gone", "retrying")
    unregistered = gauges().queues[metrics.UNREGISTERED]
    assert (unregistered.pending, unregistered.retrying, unregistered.dead) == (1, 1, 1)
    assert unregistered.estimated == ()
    text = database_exposition().decode()
    assert 'pgoutbox_jobs{queue="unregistered",status="pending"} 1.0' in text
    assert "gone" not in text
    monkeypatch.setattr(db_gauges, "MAX_UNREGISTERED_QUEUES", 1)  # more of them than counted
    unregistered = gauges().queues[metrics.UNREGISTERED]
    assert {"pending", "retrying", "dead"} <= set(unregistered.estimated)
    assert unregistered.dead >= 1


@pytest.mark.django_db(transaction=True, databases=["default", "secondary"])
def test_the_xmin_gauge_counts_only_the_jobs_database() -> None:
    import psycopg

    from django_pgoutbox.db import raw_connection_params

    with psycopg.connect(**raw_connection_params("secondary")) as elsewhere:
        elsewhere.execute("SELECT 1")  # a transaction left open in another database
        pid = elsewhere.info.backend_pid

        def its_age() -> float:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT extract(epoch FROM now() - xact_start) FROM pg_stat_activity "
                    "WHERE pid = %s",
                    [pid],
                )
                return float(cursor.fetchone()[0])

        wait_for(lambda: its_age() >= 1.5, timeout=10)
        assert gauges().oldest_transaction_age < 1.0


# -- labels only from declared names -------------------------------------------------------------


def test_label_values_are_declared_names_cut_short() -> None:
    value = metrics.label_value
    assert value("job_type", "tests.behave") == "tests.behave"
    assert value("job_type", "tests.nobody") == metrics.UNREGISTERED
    assert value("queue", "webhooks") == "webhooks"
    assert value("queue", "webhooks2") == metrics.UNREGISTERED
    assert value("event_type", "tests.projected") == "tests.projected"
    assert value("event_type", "x" * 100_000) == metrics.UNREGISTERED
    assert value("outcome", "completed") == "completed"
    long_one, long_two = (value("schedule", "s" * 500 + tail) for tail in ("a", "b"))
    assert len(long_one) == len(long_two) == metrics.MAX_LABEL_LENGTH
    assert long_one != long_two
    assert value("schedule", "é" * 300).startswith("é" * 90)
    metrics.register_label_value("job_type", "tests.a_task")
    assert value("job_type", "tests.a_task") == "tests.a_task"
    counter = metrics.Counter("test_long_total", "test", ["schedule", "queue"])
    for _ in range(3):  # the second and third time from what the first remembered
        counter.inc_key(("s" * 500, "default"))
        counter.inc_key(("t", "webhooks-gone"))
    assert counter.samples() == {
        (value("schedule", "s" * 500), "default"): 3.0,  # the same cut every time
        ("t", metrics.UNREGISTERED): 3.0,
    }


@pytest.mark.django_db(transaction=True)
def test_unregistered_job_types_make_one_series() -> None:
    with connection.cursor() as cursor:  # rows written by hand, or by another deployment
        cursor.execute(
            "INSERT INTO jobs (queue, job_type, payload) "
            "SELECT 'default', 'junk.' || n, '{}' FROM generate_series(1, 300) AS n"
        )
    before = set(metrics.JOB_OUTCOMES.samples())
    drain()
    assert Job.objects.filter(status="dead", last_error_code="unknown_job_type").count() == 300
    added = set(metrics.JOB_OUTCOMES.samples()) - before
    assert {job_type for _, job_type, _ in added} <= {metrics.UNREGISTERED}
    assert (
        metrics.JOB_OUTCOMES.value(queue="default", job_type=metrics.UNREGISTERED, outcome="dead")
        >= 300
    )
    for metric in (metrics.JOB_DURATION, metrics.JOB_OUTCOMES):
        assert not any(key[1].startswith("junk.") for key in metric.samples())
    from prometheus_client import generate_latest

    assert "junk." not in generate_latest(process_registry()).decode()


@pytest.mark.django_db(transaction=True)
def test_a_100_kb_event_type_makes_no_long_line() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, schema_version, "
            "payload) VALUES ('a', gen_random_uuid(), repeat('e', 100000), 1, '{}')"
        )
    conf = get_settings()
    Relay(conf.outbox, relay_id="r", using="default", policy=conf.retry, burst=True).run()
    assert OutboxEvent.objects.filter(processed_at__isnull=False).count() == 1
    from prometheus_client import generate_latest

    text = generate_latest(process_registry()).decode()
    assert max(len(line) for line in text.splitlines()) < 300
    assert 'pgoutbox_events_projected_total{event_type="unregistered",outcome="processed"}' in text


@pytest.mark.django_db
def test_an_expired_lease_of_a_queue_not_configured_counts_as_unregistered() -> None:
    from django_pgoutbox import maintenance

    _job("gone-queue", "leased")
    Job.objects.filter(queue="gone-queue").update(
        lease_expires_at=timezone.now() - timedelta(minutes=1), locked_by="w", attempts=1
    )
    before = metrics.LEASE_EXPIRATIONS.value(queue=metrics.UNREGISTERED)
    assert len(maintenance.recover_expired_leases()) == 1
    assert metrics.LEASE_EXPIRATIONS.value(queue=metrics.UNREGISTERED) == before + 1
    assert not any("gone" in key[0] for key in metrics.LEASE_EXPIRATIONS.samples())


@pytest.mark.django_db
def test_a_metrics_host_that_cannot_be_bound_is_a_command_error() -> None:
    from django.core.management import CommandError

    for host in ("203.0.113.7", "no-such-host.invalid"):
        with pytest.raises(CommandError, match=f"--metrics-host '{host}' --metrics-port 1"):
            call_command("runworkers", "--burst", "--metrics-port", "1", "--metrics-host", host)
    with pytest.raises(CommandError, match="--metrics-host must be an address"):
        call_command("runworkers", "--burst", "--metrics-port", "1", "--metrics-host", " ")
    with pytest.raises(CommandError, match="--metrics-host needs --metrics-port"):
        call_command("runworkers", "--burst", "--metrics-host", "0.0.0.0")
