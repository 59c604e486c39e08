"""Traces with no database: the stored context, the attempt's span and what tracing must never
do (fail an attempt), with the SDK's in-memory exporter."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from django_pgoutbox import JobContext, TransientError, job, tracing
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.models import JobStatus
from django_pgoutbox.worker.execute import execute
from testproject.testjobs.jobs import Unprintable
from testproject.testjobs.traces import RaisingProcessor, RaisingPropagator
from tests.conftest import claimed_job

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def run(job_type: str, **fields: Any) -> Any:
    return execute(claimed_job(job_type, **fields), policy=POLICY, renew=lambda: None)


class TestStoredContext:
    def test_nothing_without_a_provider(self) -> None:
        assert not tracing.enabled()
        with trace.get_tracer("t").start_as_current_span("request"):
            assert tracing.current_context() is None

    def test_nothing_outside_a_span(self, traces: InMemorySpanExporter) -> None:
        assert tracing.enabled()
        assert tracing.current_context() is None

    def test_the_recording_span_is_stored(self, traces: InMemorySpanExporter) -> None:
        with trace.get_tracer("t").start_as_current_span("request") as span:
            stored = tracing.current_context()
        assert stored is not None
        context = span.get_span_context()
        ids = f"{context.trace_id:032x}-{context.span_id:016x}"
        assert json.loads(stored) == {"traceparent": f"00-{ids}-{context.trace_flags:02x}"}
        assert tracing.span_context(stored) is not None
        assert tracing.span_context(stored).span_id == context.span_id

    def test_nothing_for_a_span_not_sampled(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider(sampler=ALWAYS_OFF))
        with trace.get_tracer("t").start_as_current_span("request"):
            assert tracing.current_context() is None

    def test_a_raising_propagator_falls_back_to_w3c(
        self, traces: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", RaisingPropagator())
        with trace.get_tracer("t").start_as_current_span("request"):
            stored = tracing.current_context()
        assert stored is not None
        assert "traceparent" in json.loads(stored)

    @pytest.mark.parametrize(
        "garbage",
        [
            "not json",
            "[1, 2]",
            "null",
            {"traceparent": 5},
            {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
            {"traceparent": "nonsense"},
            {"tracestate": "a=b"},
            {"traceparent": "x" * 100_000},
            7,
        ],
    )
    def test_garbage_names_no_context(self, garbage: Any) -> None:
        assert tracing.span_context(garbage) is None


@pytest.mark.usefixtures("registry")
class TestAttemptSpan:
    def test_a_completed_attempt(self, traces: InMemorySpanExporter) -> None:
        seen: list[Any] = []

        @job("t.traced")
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            seen.append(trace.get_current_span().get_span_context())
            with trace.get_tracer("t").start_as_current_span("inner"):
                pass

        stored = json.dumps({"traceparent": TRACEPARENT, "tracestate": "k=v"})
        outcome = run("t.traced", trace_context=stored, attempt=2, queue="default")
        assert outcome.status == JobStatus.COMPLETED
        inner, span = traces.get_finished_spans()
        assert span.name == "process default"
        assert span.kind == SpanKind.CONSUMER
        assert span.parent is None
        assert [f"{link.context.span_id:016x}" for link in span.links] == ["b7ad6b7169203331"]
        assert span.links[0].context.trace_state.get("k") == "v"
        assert span.attributes is not None
        assert dict(span.attributes) == {
            "messaging.system": "pgoutbox",
            "messaging.destination.name": "default",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": str(outcome.job.id),
            "pgoutbox.job.type": "t.traced",
            "pgoutbox.job.attempt": 2,
            "pgoutbox.job.outcome": "completed",
        }
        assert span.status.status_code == StatusCode.UNSET
        assert inner.parent is not None
        assert inner.parent.span_id == span.context.span_id
        assert seen[0].span_id == span.context.span_id

    @pytest.mark.parametrize(
        ("error", "outcome", "code"),
        [
            (TransientError("busy"), "retrying", "TransientError"),
            (SystemExit(3), "retrying", "SystemExit"),
            (Unprintable(), "retrying", "Unprintable"),
        ],
    )
    def test_a_failed_attempt(
        self, traces: InMemorySpanExporter, error: BaseException, outcome: str, code: str
    ) -> None:
        @job("t.failing")
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            raise error

        assert run("t.failing").status.value == outcome
        (span,) = traces.get_finished_spans()
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes is not None
        assert span.attributes["pgoutbox.job.outcome"] == outcome
        assert code in str(span.attributes["error.type"])
        assert [event.name for event in span.events] == ["exception"]

    def test_garbage_context_runs_the_job(self, traces: InMemorySpanExporter) -> None:
        @job("t.plain")
        def handler(payload: dict[str, Any], ctx: JobContext) -> str:
            return "ran"

        outcome = run("t.plain", trace_context='{"traceparent": "garbage"}')
        assert outcome.status == JobStatus.COMPLETED
        assert outcome.result_json == '"ran"'
        (span,) = traces.get_finished_spans()
        assert span.links == ()

    def test_a_raising_processor_fails_no_attempt(self, monkeypatch: pytest.MonkeyPatch) -> None:
        provider = TracerProvider()
        provider.add_span_processor(RaisingProcessor())
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)

        @job("t.plain")
        def handler(payload: dict[str, Any], ctx: JobContext) -> str:
            return "ran"

        assert run("t.plain", trace_context=json.dumps({"traceparent": TRACEPARENT})).result_json
        assert run("t.plain").status == JobStatus.COMPLETED

    def test_an_attempt_past_its_timeout(self, traces: InMemorySpanExporter) -> None:
        @job("t.slow", timeout=0.01)
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            import time

            time.sleep(0.05)

        run("t.slow")
        (span,) = traces.get_finished_spans()
        assert span.attributes is not None
        assert span.attributes["pgoutbox.job.outcome"] == "timed_out"
        assert span.status.status_code == StatusCode.ERROR

    def test_no_span_without_a_provider(self) -> None:
        @job("t.plain")
        def handler(payload: dict[str, Any], ctx: JobContext) -> bool:
            return trace.get_current_span().is_recording()

        assert run("t.plain").result_json == "false"

    def test_the_next_attempt_links_the_failed_one(self, traces: InMemorySpanExporter) -> None:
        @job("t.flaky")
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            if ctx.attempt == 1:
                raise TransientError("once")

        enqueued = {"traceparent": TRACEPARENT}
        first = run("t.flaky", trace_context=json.dumps(enqueued))
        assert first.status == JobStatus.RETRYING
        assert first.attempt_trace is not None
        # RECORD_OUTCOMES keeps it under "attempt" beside the enqueuing context
        stored = {**enqueued, "attempt": json.loads(first.attempt_trace)}
        second = run("t.flaky", trace_context=json.dumps(stored), attempt=2, id=first.job.id)
        assert second.status == JobStatus.COMPLETED
        assert second.attempt_trace is None
        failed, completed = traces.get_finished_spans()
        assert [dict(link.attributes or {}) for link in completed.links] == [
            {"pgoutbox.link": "enqueued"},
            {"pgoutbox.link": "previous_attempt"},
        ]
        assert completed.links[1].context.span_id == failed.context.span_id
        assert [link.context.span_id for link in failed.links] == [int(TRACEPARENT[36:52], 16)]

    @pytest.mark.parametrize("number", [1, 5, "2", None])
    def test_no_link_to_an_attempt_not_the_previous(
        self, traces: InMemorySpanExporter, number: Any
    ) -> None:
        @job("t.plain")
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            pass

        kept = {"number": number, "traceparent": TRACEPARENT}
        run("t.plain", trace_context=json.dumps({"attempt": kept}), attempt=3)
        (span,) = traces.get_finished_spans()
        assert span.links == ()

    def test_a_context_that_cannot_be_made_current_ends_its_span(
        self, traces: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from opentelemetry import context

        def refuse(value: Any) -> Any:
            raise RuntimeError("a context that cannot be attached")

        monkeypatch.setattr(context, "attach", refuse)

        @job("t.plain")
        def handler(payload: dict[str, Any], ctx: JobContext) -> str:
            return "ran"

        assert run("t.plain").result_json == '"ran"'
        (span,) = traces.get_finished_spans()
        assert span.name == "process default"


@job("tracing.async_span", max_attempts=2)
async def async_span(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Open a span of its own after an await; fail with ``fail``."""
    import asyncio

    await asyncio.sleep(payload.get("sleep", 0))
    with trace.get_tracer("t").start_as_current_span(f"inner {payload['n']}"):
        await asyncio.sleep(0)
    if payload.get("fail"):
        raise TransientError("an async attempt fails")
    return payload["n"]


class TestAsyncAttempts:
    """An ``async def`` handler's attempt (``execute_async``) is a span of its own, current in
    its coroutine's task only: two coroutines in flight on one loop each nest their own spans."""

    def test_two_coroutines_on_one_loop_keep_their_own_spans(
        self, traces: InMemorySpanExporter
    ) -> None:
        import asyncio

        from django_pgoutbox.worker.execute_async import execute_async

        async def both() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(
                        execute_async(
                            claimed_job("tracing.async_span", payload=payload),
                            policy=POLICY,
                            renew=lambda: None,
                        )
                        for payload in ({"n": 1, "sleep": 0.02}, {"n": 2, "fail": True})
                    )
                )
            )

        first, second = asyncio.run(both())
        assert (first.status, second.status) == (JobStatus.COMPLETED, JobStatus.RETRYING)
        spans = {span.name: span for span in traces.get_finished_spans()}
        assert set(spans) == {"inner 1", "inner 2", "process default"}
        attempts = [s for s in traces.get_finished_spans() if s.kind is SpanKind.CONSUMER]
        assert len(attempts) == 2
        by_id = {(a.attributes or {})["messaging.message.id"]: a for a in attempts}
        assert set(by_id) == {str(first.job.id), str(second.job.id)}
        for outcome, inner in ((first, spans["inner 1"]), (second, spans["inner 2"])):
            parent = by_id[str(outcome.job.id)]
            assert inner.parent is not None
            assert inner.parent.span_id == parent.context.span_id
        failed = by_id[str(second.job.id)]
        assert failed.status.status_code is StatusCode.ERROR
        assert (failed.attributes or {})["pgoutbox.job.outcome"] == "retrying"
        assert second.attempt_trace is not None
        assert trace.get_current_span() is trace.INVALID_SPAN
