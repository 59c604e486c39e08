"""An OpenTelemetry SDK for the test project's processes, when ``PGOUTBOX_TEST_TRACES`` names a
file: every span ended is written there as a JSON line (``span_line``), as an exporter would send
it. ``PGOUTBOX_TEST_TRACES_HOSTILE=1`` adds a span processor that raises at every span's start
and end, and a global propagator that raises; ``=exit``, a span processor that raises
``SystemExit`` and ``KeyboardInterrupt``: tracing must fail no job and stop no process.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)


def span_line(span: ReadableSpan) -> dict[str, Any]:
    """What the tests read of a span: its ids, parent, links, kind, status, attributes, events."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_line(span), default=str) + "\n" for span in spans)
        with self.lock, open(self.path, "a") as file:
            file.write(lines)
        return SpanExportResult.SUCCESS


class RaisingProcessor(SpanProcessor):
    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        raise RuntimeError("a span processor that raises at start")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("a span processor that raises at end")


class ExitingProcessor(SpanProcessor):
    """A span processor that raises what is no ``Exception``: ``SystemExit`` at the start of a
    ``tests.traced`` attempt's span, ``KeyboardInterrupt`` at every span's end (on a handler's
    thread: no Ctrl-C)."""

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        attributes = span.attributes or {}
        if attributes.get("pgoutbox.job.type") == "tests.traced":
            raise SystemExit("a span processor that exits at start")

    def on_end(self, span: ReadableSpan) -> None:
        raise KeyboardInterrupt("a span processor that interrupts at end")


class RaisingPropagator(TextMapPropagator):
    def extract(self, carrier: Any, context: Context | None = None, getter: Any = None) -> Context:
        raise RuntimeError("a propagator that raises")

    def inject(self, carrier: Any, context: Context | None = None, setter: Any = None) -> None:
        raise RuntimeError("a propagator that raises")

    @property
    def fields(self) -> set[str]:
        return {"traceparent"}


class NoExport(SpanExporter):
    """An exporter that sends nothing: the cost of making the spans alone (benchmarks)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def configure() -> None:
    """Set the SDK up, with the spans written to the file ``PGOUTBOX_TEST_TRACES`` names; or,
    for ``PGOUTBOX_TEST_TRACES=noexport``, batched to an exporter that sends nothing, as a
    deployment's exporter would take them; ``imported``: OpenTelemetry imported, no SDK set up
    (the two for benchmarks/drain_cpu.py)."""
    path = os.environ["PGOUTBOX_TEST_TRACES"]
    if path == "imported":  # the API imported (this module did), and no provider set
        return
    provider = TracerProvider()
    if os.environ.get("PGOUTBOX_TEST_TRACES_HOSTILE") == "1":
        provider.add_span_processor(RaisingProcessor())
        propagate.set_global_textmap(RaisingPropagator())
    elif os.environ.get("PGOUTBOX_TEST_TRACES_HOSTILE") == "exit":
        provider.add_span_processor(ExitingProcessor())
    if path == "noexport":
        provider.add_span_processor(BatchSpanProcessor(NoExport()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(path)))
    trace.set_tracer_provider(provider)
