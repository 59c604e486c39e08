"""Traces against what a propagator writes and what a row written by hand holds, with no
database: what PostgreSQL's jsonb or a reader of a CloudEvent cannot take is never stored or
handed on."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_pgoutbox import tracing
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.models import OutboxEvent
from django_pgoutbox.worker.execute import execute
from tests.conftest import claimed_job

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def run(job_type: str, **fields: Any) -> Any:
    return execute(claimed_job(job_type, **fields), policy=POLICY, renew=lambda: None)


class WritingPropagator(TextMapPropagator):
    """A propagator that writes ``fields`` into the carrier, whatever the span."""

    def __init__(self, **fields: Any) -> None:
        self.written = fields

    def extract(self, carrier: Any, context: Context | None = None, getter: Any = None) -> Context:
        return context or Context()

    def inject(self, carrier: Any, context: Context | None = None, setter: Any = None) -> None:
        carrier.update(self.written)

    @property
    def fields(self) -> set[str]:
        return set(self.written)


class TestWhatAPropagatorWrites:
    @pytest.mark.parametrize(
        "fields",
        [
            {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x00"},
            {"traceparent": "\ud800"},
            {"traceparent": "garbage"},
            {"traceparent": TRACEPARENT.upper()},
            {"traceparent": "x" * 10_000_000},
        ],
    )
    def test_a_traceparent_no_reader_takes_is_replaced_by_w3c(
        self, traces: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, fields: Any
    ) -> None:
        monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", WritingPropagator(**fields))
        with trace.get_tracer("t").start_as_current_span("request") as span:
            stored = tracing.current_context()
        assert stored is not None
        assert len(stored) < 200
        assert "\\u0000" not in stored
        assert "\\ud800" not in stored
        found = tracing.span_context(stored)
        assert found is not None
        assert found.span_id == span.get_span_context().span_id

    @pytest.mark.parametrize("tracestate", ["a=b\x00", "a=\ud800", "k=" + "v" * 10_000_000, 5])
    def test_a_tracestate_no_reader_takes_is_left_out(
        self, traces: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, tracestate: Any
    ) -> None:
        with trace.get_tracer("t").start_as_current_span("request") as span:
            context = span.get_span_context()
            ids = f"{context.trace_id:032x}-{context.span_id:016x}"
            traceparent = f"00-{ids}-{context.trace_flags:02x}"
            monkeypatch.setattr(
                propagate,
                "_HTTP_TEXT_FORMAT",
                WritingPropagator(traceparent=traceparent, tracestate=tracestate),
            )
            stored = tracing.current_context()
        assert stored is not None
        assert json.loads(stored) == {"traceparent": traceparent}


class TestStoredRows:
    def test_a_huge_tracestate_is_read_quickly(self, traces: InMemorySpanExporter) -> None:
        import time

        stored = json.dumps({"traceparent": TRACEPARENT, "tracestate": "a=b," * 2_500_000})
        started = time.monotonic()
        tracing.span_context(stored)
        assert time.monotonic() - started < 1.0

    def test_deep_json(self, traces: InMemorySpanExporter) -> None:
        stored = "[" * 100_000 + "]" * 100_000
        assert tracing.span_context(stored) is None
        assert tracing._previous_attempt(stored, 2) is None

    @pytest.mark.parametrize(
        "trace_context",
        [
            {"traceparent": "garbage"},
            {"traceparent": "x" * 1_000_000},
            {"traceparent": TRACEPARENT + "\n"},
            {"traceparent": TRACEPARENT.upper()},
            {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
        ],
    )
    def test_a_cloudevent_carries_no_garbage(self, trace_context: Any) -> None:
        event = OutboxEvent(
            event_type="t", aggregate_type="a", trace_context=trace_context, occurred_at=NOW
        )
        assert "traceparent" not in event.as_cloudevent()

    def test_a_cloudevent_with_a_valid_context(self) -> None:
        event = OutboxEvent(
            event_type="t",
            aggregate_type="a",
            trace_context={"traceparent": TRACEPARENT, "tracestate": "k=v"},
            occurred_at=NOW,
        )
        cloudevent = event.as_cloudevent()
        assert cloudevent["traceparent"] == TRACEPARENT
        assert cloudevent["tracestate"] == "k=v"
