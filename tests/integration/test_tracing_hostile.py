"""Traces against hostile rows and configurations, with the database: a propagator that writes
what PostgreSQL's jsonb refuses, contexts written by hand in the rows that workers claim, a batch
of ten thousand jobs under one span, a publish rolled back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from opentelemetry import propagate, trace

from django_pgoutbox import enqueue, enqueue_many, publish, tracing
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from django_pgoutbox.testing import drain
from tests.integration.test_tracing import every_way, stored, traceparent
from tests.unit.test_tracing_hostile import WritingPropagator

pytestmark = pytest.mark.django_db

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def request_span(traces: Any) -> Iterator[Any]:
    with trace.get_tracer("tests").start_as_current_span("request") as span:
        yield span


@pytest.mark.parametrize(
    "fields",
    [
        {"traceparent": TRACEPARENT[:-2] + "\x00\x00"},
        {"traceparent": TRACEPARENT, "tracestate": "k=\x00"},
        {"traceparent": TRACEPARENT, "tracestate": "k=\ud800"},
        {"traceparent": "\udfff"},
    ],
)
def test_a_propagator_writing_what_jsonb_refuses_fails_no_enqueue(
    request_span: Any, monkeypatch: pytest.MonkeyPatch, fields: Any
) -> None:
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", WritingPropagator(**fields))
    with transaction.atomic():
        ids = every_way()
        event = publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    assert stored(ids) == {traceparent(request_span)}
    row = OutboxEvent.objects.get(pk=event.pk)
    assert row.trace_context == {"traceparent": traceparent(request_span)}


def test_ten_thousand_jobs_under_one_span_read_its_context_once(
    request_span: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = tracing.current_context

    def counted() -> str | None:
        calls.append(1)
        return real()

    monkeypatch.setattr("django_pgoutbox.enqueueing.current_context", counted)
    jobs = enqueue_many([{"job_type": "tests.noop", "payload": {"n": n}} for n in range(10_000)])
    assert len(jobs) == 10_000
    assert calls == [1]
    assert (
        Job.objects.filter(trace_context__traceparent=traceparent(request_span)).count() == 10_000
    )


def test_a_publish_rolled_back_leaves_nothing(request_span: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
        raise RuntimeError("rolled back")
    assert not OutboxEvent.objects.exists()


GARBAGE: list[Any] = [
    "a string",
    ["a", "list"],
    7,
    {"traceparent": "x" * 1_000_000},
    {"traceparent": TRACEPARENT, "tracestate": "k=" + "v" * 1_000_000},
    {"traceparent": TRACEPARENT.upper()},
    {"traceparent": "ff" + TRACEPARENT[2:]},
    {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"},
    {"traceparent": "\\u0001\n\t\"'"},
    {"attempt": {"number": 0, "traceparent": "garbage"}},
    {"attempt": "not an object", "traceparent": TRACEPARENT},
    {
        "a": {
            "b": {"c": {"d": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}
        }
    },
]


@pytest.mark.parametrize("traced", [True, False])
def test_garbage_contexts_in_the_rows_fail_no_job(
    request: pytest.FixtureRequest, traced: bool
) -> None:
    """Rows written by hand: every job completes, traced or not; a failing attempt keeps its
    span beside what was there, whatever it was, and the next attempt runs."""
    exported = request.getfixturevalue("traces") if traced else None
    ids = [enqueue("tests.behave", {"record": False}).pk for _ in GARBAGE]
    flaky = [
        enqueue("tests.behave", {"record": False, "fail": "transient", "fail_attempts": 1}).pk
        for _ in GARBAGE
    ]
    for pk, garbage in [*zip(ids, GARBAGE, strict=True), *zip(flaky, GARBAGE, strict=True)]:
        Job.objects.filter(pk=pk).update(trace_context=garbage)
    drain(raise_on_failure=False)
    statuses = set(Job.objects.filter(pk__in=ids + flaky).values_list("status", flat=True))
    assert statuses == {JobStatus.COMPLETED}
    if exported is not None:
        spans = [s for s in exported.get_finished_spans() if s.name == "process default"]
        assert len(spans) == len(ids) + 2 * len(flaky)
        # a span links the one valid context of the garbage, and a retried job its first attempt
        for span in spans:
            for link in span.links:
                kind = (link.attributes or {}).get("pgoutbox.link")
                assert kind == "previous_attempt" or f"{link.context.span_id:016x}" in TRACEPARENT


def test_a_cloudevent_of_garbage_rows(request_span: Any) -> None:
    event = publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    for garbage in GARBAGE:
        OutboxEvent.objects.filter(pk=event.pk).update(trace_context=garbage)
        cloudevent = OutboxEvent.objects.get(pk=event.pk).as_cloudevent()
        assert "traceparent" not in cloudevent or cloudevent["traceparent"] == TRACEPARENT
        json.dumps(cloudevent)


@pytest.mark.parametrize("garbage", [*GARBAGE[3:], {"traceparent": '<script>alert("x")</script>'}])
def test_the_admin_and_the_cli_show_rows_of_any_context(admin_client: Any, garbage: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    job = enqueue("tests.noop", {})
    Job.objects.filter(pk=job.pk).update(trace_context=garbage, status=JobStatus.DEAD)
    event = publish("tests.to_job", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    OutboxEvent.objects.filter(pk=event.pk).update(trace_context=garbage)
    for url in (
        f"/admin/pgoutbox/job/{job.pk}/change/",
        f"/admin/pgoutbox/deadletter/{job.pk}/change/",
        "/admin/pgoutbox/job/",
        f"/admin/pgoutbox/outboxevent/{event.pk}/change/",
        "/admin/pgoutbox/outboxevent/",
    ):
        page = admin_client.get(url)
        assert page.status_code == 200, url
        assert "<script>alert" not in page.content.decode()
    out = StringIO()
    call_command("pgoutbox", "deadletters", "show", str(job.pk), stdout=out)
    assert str(job.pk) in out.getvalue()
