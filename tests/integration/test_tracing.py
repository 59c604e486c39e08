"""The trace context stored with a job or an event, by every way of writing one: the context of
the span recording at the enqueue, and nothing at all without one; the claim returns it, and a
retried dead letter keeps it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from opentelemetry import trace

from django_pgoutbox import enqueue, enqueue_many, publish, queries, workflow
from django_pgoutbox.control import retry_dead_jobs
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from testproject.testjobs import tasks

pytestmark = pytest.mark.django_db


def traceparent(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


@pytest.fixture
def request_span(traces: Any) -> Iterator[Any]:
    """A recording span, current for the test's body: a request's."""
    with trace.get_tracer("tests").start_as_current_span("request") as span:
        yield span


def stored(job_ids: list[Any]) -> set[str | None]:
    rows = Job.objects.filter(pk__in=job_ids).values_list("trace_context", flat=True)
    return {None if value is None else value["traceparent"] for value in rows}


def every_way() -> list[Any]:
    """A job by each way of enqueueing one; their ids."""
    ids = [
        enqueue("tests.noop", {}).pk,
        enqueue("tests.noop", {}, idempotency_key=f"k-{uuid.uuid4()}").pk,
        enqueue("tests.noop", {"u": str(uuid.uuid4())}, unique=True).pk,
        enqueue("tests.step", {}, sequence=f"s-{uuid.uuid4()}").pk,
        tasks.report.enqueue("fleet", rows=1).id,
    ]
    parent = enqueue("tests.noop", {})
    ids += [parent.pk, enqueue("tests.noop", {}, after=[parent]).pk]
    ids += [j.pk for j in enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 3)]
    ids += [j.pk for j in enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 70)]  # COPY
    keyed = [
        {"job_type": "tests.noop", "payload": {}, "idempotency_key": f"m-{uuid.uuid4()}"}
        for _ in range(2)
    ]
    ids += [j.pk for j in enqueue_many(keyed)]
    flow = workflow("traced")
    first = flow.add("tests.noop", {}, name="first")
    flow.add("tests.noop", {}, name="second", after=[first])
    ids += [j.pk for j in flow.enqueue().jobs.values()]
    return ids


def test_every_way_of_enqueueing_stores_the_recording_span(request_span: Any) -> None:
    ids = every_way()
    assert len(ids) == 5 + 2 + 3 + 70 + 2 + 2
    assert stored(ids) == {traceparent(request_span)}


def test_nothing_is_stored_without_a_provider() -> None:
    with trace.get_tracer("tests").start_as_current_span("request"):  # the API's no-op span
        assert stored(every_way()) == {None}


def test_nothing_is_stored_outside_a_span(traces: Any) -> None:
    assert stored(every_way()) == {None}
    event = publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    assert OutboxEvent.objects.get(pk=event.pk).trace_context is None


def test_publish_stores_the_recording_span(request_span: Any) -> None:
    event = publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    assert event.trace_context == {"traceparent": traceparent(request_span)}
    row = OutboxEvent.objects.get(pk=event.pk)
    assert row.trace_context == {"traceparent": traceparent(request_span)}


def test_the_claim_returns_it_and_a_retried_dead_letter_keeps_it(request_span: Any) -> None:
    job = enqueue("tests.noop", {}, queue="exports")
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CLAIM_JOBS, {"queue": "exports", "limit": 5, "worker_id": "w", "lease": 60.0}
        )
        row = queries.ClaimRow._make(cursor.fetchone())
    assert row.id == job.pk
    assert row.trace_context is not None
    assert json.loads(row.trace_context) == {"traceparent": traceparent(request_span)}
    Job.objects.filter(pk=job.pk).update(status=JobStatus.DEAD)
    with trace.get_tracer("tests").start_as_current_span("an operator's request"):
        assert retry_dead_jobs([job.pk]) == 1
    assert stored([job.pk]) == {traceparent(request_span)}
    assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING


def test_an_outcome_keeps_a_traced_attempts_span_beside_the_enqueuing_context(
    request_span: Any,
) -> None:
    from django_pgoutbox.worker import outcomes
    from django_pgoutbox.worker.execute import Outcome
    from tests.conftest import claimed_job

    traced, untraced, garbage = (enqueue("tests.noop", {}, queue="exports") for _ in range(3))
    Job.objects.filter(pk=garbage.pk).update(trace_context=["not", "an", "object"])
    with connection.cursor() as cursor:
        cursor.execute(
            queries.CLAIM_JOBS, {"queue": "exports", "limit": 5, "worker_id": "w", "lease": 60.0}
        )
        assert len(cursor.fetchall()) == 3
    kept = '{"number":1,"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'
    batch = [
        Outcome(claimed_job("tests.noop", id=job.pk), JobStatus.RETRYING, delay=60.0, code="x")
        for job in (traced, untraced, garbage)
    ]
    batch[0] = Outcome(batch[0].job, JobStatus.RETRYING, delay=60.0, code="x", attempt_trace=kept)
    batch[2] = Outcome(batch[2].job, JobStatus.DEAD, code="x", attempt_trace=kept)
    with connection.cursor() as cursor:
        cursor.execute(queries.RECORD_OUTCOMES, outcomes.params(batch, "w"))
        assert len(cursor.fetchall()) == 3
    enqueued = {"traceparent": traceparent(request_span)}
    assert Job.objects.get(pk=traced.pk).trace_context == {**enqueued, "attempt": json.loads(kept)}
    assert Job.objects.get(pk=untraced.pk).trace_context == enqueued
    assert Job.objects.get(pk=garbage.pk).trace_context == {"attempt": json.loads(kept)}
    assert outcomes.params(batch[1:2], "w")["traces"] == []


# A process with OpenTelemetry not installed (its import refused), which enqueues, publishes and
# drains: the jobs and the event go through, untraced; and one with it installed that never
# imports it itself: nothing of it is imported.
_WITHOUT_OTEL = """
import os, sys
if sys.argv[1] == "blocked":
    sys.modules["opentelemetry"] = None  # import opentelemetry raises ImportError
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django.setup()
import uuid
from django.db import transaction
from django_pgoutbox import enqueue, enqueue_many, publish
from django_pgoutbox.models import Job, OutboxEvent
from django_pgoutbox.worker import Worker
with transaction.atomic():
    enqueue("tests.noop", {})
    enqueue("tests.behave", {"fail": "permanent"})
    enqueue_many([{"job_type": "tests.noop", "payload": {}}] * 70)
    publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
Worker(burst=True, roles=["relay"]).run()
Worker(burst=True, roles=["jobs"], queues=["default"]).run()
print(sorted(set(Job.objects.values_list("status", flat=True))))
print(Job.objects.filter(trace_context__isnull=False).count(), Job.objects.count())
print(OutboxEvent.objects.filter(processed_at__isnull=False).count())
print(sorted(n for n, m in sys.modules.items() if n.startswith("opentelemetry") and m))
"""


@pytest.mark.django_db(transaction=True)  # the process is another: only commits are seen
@pytest.mark.parametrize("how", ["blocked", "not imported"])
def test_without_opentelemetry(how: str) -> None:
    import os
    import subprocess
    import sys

    from tests.processes import ROOT, database_url_for_tests, scaled

    env = {**os.environ, "DATABASE_URL": database_url_for_tests(), "PYTHONPATH": str(ROOT)}
    env.pop("PGOUTBOX_TEST_TRACES", None)
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL, how],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    statuses, traced, processed, imported = done.stdout.splitlines()[-4:]
    assert statuses == "['completed', 'dead']"
    assert traced == "0 73"
    assert processed == "1"
    assert imported == "[]"


def test_a_scheduled_slot_has_no_context(traces: Any) -> None:
    """The scheduler's enqueue runs under no span (docs/observability.md, "Traces")."""
    from datetime import UTC, datetime, timedelta

    from django_pgoutbox.scheduler import enqueue_due
    from django_pgoutbox.schedules import Schedule

    start = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    tick = Schedule(name="traced-tick", job_type="tests.noop", every=timedelta(seconds=1))
    assert enqueue_due(tick, using="default", now=start) == []
    jobs = enqueue_due(tick, using="default", now=start + timedelta(seconds=1.5))
    assert jobs
    assert stored([j.pk for j in jobs]) == {None}


def test_a_cloudevent_carries_the_publishing_context(request_span: Any) -> None:
    event = publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    cloud = OutboxEvent.objects.get(pk=event.pk).as_cloudevent()
    assert cloud["traceparent"] == traceparent(request_span)
    assert "tracestate" not in cloud
    OutboxEvent.objects.filter(pk=event.pk).update(
        trace_context={"traceparent": 5, "tracestate": "a=b"}
    )
    assert "traceparent" not in OutboxEvent.objects.get(pk=event.pk).as_cloudevent()
    OutboxEvent.objects.filter(pk=event.pk).update(trace_context=["garbage"])
    assert "tracestate" not in OutboxEvent.objects.get(pk=event.pk).as_cloudevent()
