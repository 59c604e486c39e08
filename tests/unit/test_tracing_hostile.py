"""Traces against hostile configurations and rows, with no database: span processors and
propagators that raise what is no ``Exception``, propagators that write what PostgreSQL or a
reader cannot take, a handler that leaves a context current, a sampler that samples nothing."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry import context, propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from django_pgoutbox import JobContext, TransientError, job, tracing
from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.models import JobStatus, OutboxEvent
from django_pgoutbox.worker.execute import execute
from tests.conftest import claimed_job

POLICY = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def run(job_type: str, **fields: Any) -> Any:
    return execute(claimed_job(job_type, **fields), policy=POLICY, renew=lambda: None)


class BaseExceptionProcessor(SpanProcessor):
    def __init__(self, error: type[BaseException], at: str) -> None:
        self.error, self.at = error, at

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        if self.at == "start":
            raise self.error("a span processor's")

    def on_end(self, span: ReadableSpan) -> None:
        if self.at == "end":
            raise self.error("a span processor's")


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


class ExitingPropagator(WritingPropagator):
    def inject(self, carrier: Any, context: Context | None = None, setter: Any = None) -> None:
        raise SystemExit("a propagator's")


def provider_with(monkeypatch: pytest.MonkeyPatch, processor: SpanProcessor) -> None:
    provider = TracerProvider()
    provider.add_span_processor(processor)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)


@pytest.mark.usefixtures("registry")
class TestProcessorsRaisingBaseException:
    @pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt, GeneratorExit])
    @pytest.mark.parametrize("at", ["start", "end"])
    def test_the_attempt_keeps_its_outcome_on_a_handler_thread(
        self, monkeypatch: pytest.MonkeyPatch, error: type[BaseException], at: str
    ) -> None:
        provider_with(monkeypatch, BaseExceptionProcessor(error, at))
        calls: list[int] = []

        @job("t.once")
        def handler(payload: dict[str, Any], ctx: JobContext) -> str:
            calls.append(1)
            return "ran"

        outcomes: list[Any] = []
        thread = threading.Thread(target=lambda: outcomes.append(run("t.once")))
        thread.start()
        thread.join()
        (outcome,) = outcomes
        assert outcome.status == JobStatus.COMPLETED
        assert outcome.result_json == '"ran"'
        assert calls == [1]

    @pytest.mark.parametrize("at", ["start", "end"])
    def test_system_exit_on_the_main_thread_too(
        self, monkeypatch: pytest.MonkeyPatch, at: str
    ) -> None:
        provider_with(monkeypatch, BaseExceptionProcessor(SystemExit, at))

        @job("t.once")
        def handler(payload: dict[str, Any], ctx: JobContext) -> str:
            return "ran"

        assert run("t.once").result_json == '"ran"'

    @pytest.mark.parametrize("at", ["start", "end"])
    def test_a_keyboard_interrupt_on_the_main_thread_still_stops(
        self, monkeypatch: pytest.MonkeyPatch, at: str
    ) -> None:
        # Ctrl-C reaches the main thread alone, wherever it is: it is not tracing's to swallow
        provider_with(monkeypatch, BaseExceptionProcessor(KeyboardInterrupt, at))
        with (
            pytest.raises(KeyboardInterrupt),
            tracing.traced_event(OutboxEvent(event_type="t"), "s"),
        ):
            pass

    @pytest.mark.parametrize("error", [SystemExit, GeneratorExit])
    @pytest.mark.parametrize("at", ["start", "end"])
    def test_an_events_span(
        self, monkeypatch: pytest.MonkeyPatch, error: type[BaseException], at: str
    ) -> None:
        provider_with(monkeypatch, BaseExceptionProcessor(error, at))
        ran = []
        with tracing.traced_event(OutboxEvent(event_type="t"), "s"):
            ran.append(1)
        assert ran == [1]

    def test_a_propagator_raising_system_exit(
        self, traces: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", ExitingPropagator())
        with trace.get_tracer("t").start_as_current_span("request"):
            stored = tracing.current_context()
        assert stored is not None
        assert tracing.span_context(stored) is not None


class TestWhatAPropagatorWrites:
    @pytest.mark.parametrize(
        "fields",
        [
            {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\x00"},
            {"traceparent": "\ud800"},
            {"traceparent": "garbage"},
            {"traceparent": TRACEPARENT.upper()},
            {"traceparent": "x" * 10_000_000},
            {"traceparent": TRACEPARENT.encode()},
            {"traceparent": ["00", "0af7651916cd43dd8448eb211c80319c"]},
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


class TestHandlersThatLeaveAContext:
    def leaky(self) -> None:
        @job("t.leaky")
        def leaky(payload: dict[str, Any], ctx: JobContext) -> None:
            span = trace.get_tracer("t").start_span("leaked")
            context.attach(trace.set_span_in_context(span))  # never detached

        @job("t.reader")
        def reader(payload: dict[str, Any], ctx: JobContext) -> str | None:
            return tracing.current_context()

    @pytest.mark.usefixtures("registry")
    def test_the_next_attempt_on_the_thread_inherits_nothing(
        self, traces: InMemorySpanExporter
    ) -> None:
        self.leaky()
        results: list[Any] = []

        def worker_thread() -> None:
            results.append(run("t.leaky"))
            results.append(run("t.reader"))
            results.append(trace.get_current_span().is_recording())

        thread = threading.Thread(target=worker_thread)
        thread.start()
        thread.join()
        _, reader, after = results
        # the span of the reader's attempt: its own, not the one the first handler left current
        spans = [s for s in traces.get_finished_spans() if s.name == "process default"]
        assert len(spans) == 2
        assert after is False
        stored = json.loads(json.loads(reader.result_json))
        assert int(stored["traceparent"][36:52], 16) == spans[1].context.span_id

    @pytest.mark.usefixtures("registry")
    def test_a_handler_that_ends_its_attempts_span_or_makes_the_root_current(
        self, traces: InMemorySpanExporter
    ) -> None:
        @job("t.ender")
        def ender(payload: dict[str, Any], ctx: JobContext) -> str:
            trace.get_current_span().end()
            context.attach(Context())  # the root, never detached
            return "ran"

        @job("t.reader")
        def reader(payload: dict[str, Any], ctx: JobContext) -> str | None:
            return tracing.current_context()

        assert run("t.ender").result_json == '"ran"'
        stored = run("t.reader").result_json
        assert stored is not None
        assert trace.get_current_span().is_recording() is False
        ended, read = traces.get_finished_spans()
        assert ended.name == read.name == "process default"
        assert f"{read.context.span_id:016x}" in json.loads(stored)

    @pytest.mark.usefixtures("registry")
    def test_untraced_by_a_refusing_processor_inherits_nothing(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # the attempt's span cannot start (its processor raises): the handler's own spans can
        # (another provider), and one it left current must not be the next job's
        from testproject.testjobs.traces import RaisingProcessor

        provider_with(monkeypatch, RaisingProcessor())
        own = TracerProvider()
        self.leaky()

        @job("t.leaky2")
        def leaky(payload: dict[str, Any], ctx: JobContext) -> None:
            span = own.get_tracer("t").start_span("leaked")
            context.attach(trace.set_span_in_context(span))

        results: list[Any] = []

        def worker_thread() -> None:
            results.append(run("t.leaky2"))
            results.append(run("t.reader"))
            results.append(trace.get_current_span().is_recording())

        thread = threading.Thread(target=worker_thread)
        thread.start()
        thread.join()
        assert results[1].result_json is None
        assert results[2] is False


class TestSubscribersThatLeaveAContext:
    def test_untraced_by_a_refusing_processor_leaves_nothing(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from testproject.testjobs.traces import RaisingProcessor

        provider_with(monkeypatch, RaisingProcessor())
        own = TracerProvider()
        with tracing.traced_event(OutboxEvent(event_type="t"), "s"):
            span = own.get_tracer("t").start_span("leaked")
            context.attach(trace.set_span_in_context(span))  # never detached
        assert trace.get_current_span().is_recording() is False
        assert tracing.current_context() is None


@pytest.mark.usefixtures("registry")
class TestSnoozes:
    def test_the_attempt_after_a_snooze_links_it(self, traces: InMemorySpanExporter) -> None:
        from django_pgoutbox import Snooze

        @job("t.snoozing")
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            if ctx.attempt == 1 and not payload.get("woke"):
                raise Snooze(60)

        first = run("t.snoozing")
        assert first.gives_back_attempt
        assert first.attempt_trace is not None
        # a snooze gives its attempt back: the next claim counts attempt 1 again
        stored = json.dumps({"attempt": json.loads(first.attempt_trace)})
        second = run("t.snoozing", payload={"woke": True}, trace_context=stored, id=first.job.id)
        assert second.status == JobStatus.COMPLETED
        snoozed, completed = traces.get_finished_spans()
        assert snoozed.status.status_code.name == "UNSET"
        assert [link.context.span_id for link in completed.links] == [snoozed.context.span_id]


@pytest.mark.usefixtures("registry")
class TestSamplers:
    def test_an_attempt_not_sampled_keeps_no_span_for_the_next(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider(sampler=ALWAYS_OFF))

        @job("t.failing")
        def handler(payload: dict[str, Any], ctx: JobContext) -> None:
            raise TransientError("busy")

        outcome = run("t.failing", trace_context=json.dumps({"traceparent": TRACEPARENT}))
        assert outcome.status == JobStatus.RETRYING
        assert outcome.attempt_trace is None


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


class TestAProviderNamedInTheEnvironment:
    def test_one_that_cannot_be_loaded_is_tried_once(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        # OTEL_PYTHON_TRACER_PROVIDER naming no installed provider (a typo, a package missing
        # from the workers' image): each attempt and each event asked the API again, which
        # scanned the entry points (a few hundred µs) and logged an ERROR with its traceback
        monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "no_such_provider")
        monkeypatch.setattr(tracing, "_PROVIDER_FROM_ENVIRONMENT", True)
        monkeypatch.setattr(tracing._said, "environment_failed", False, raising=False)
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
        for _ in range(20):
            assert not tracing.enabled()
        failed = [r for r in caplog.records if "Failed to load configured provider" in r.message]
        assert len(failed) == 1
        # one set in code later is taken all the same
        monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
        assert tracing.enabled()


class TestAnIncomingTracestate:
    def test_a_requests_long_tracestate_is_cut_as_w3c_says(
        self, traces: InMemorySpanExporter
    ) -> None:
        # a client's tracestate header of 32 long members, taken by the request's span, was
        # stored whole (16 KB) with every job that request enqueued
        long = [(f"k{n}", "v" * 250) for n in range(30)]
        short = [("a", "1"), ("b", "2")]
        state = TraceState([long[0], short[0], *long[1:], short[1]])
        assert len(state.to_header()) > 7_000
        parent = SpanContext(
            int(TRACEPARENT[3:35], 16), int(TRACEPARENT[36:52], 16), True, TraceFlags(1), state
        )
        with trace.get_tracer("t").start_as_current_span(
            "request", context=trace.set_span_in_context(NonRecordingSpan(parent))
        ):
            stored = tracing.current_context()
        assert stored is not None
        # the members over 128 characters go first, then the last ones, to 512 at most
        assert json.loads(stored)["tracestate"] == "a=1,b=2"

    def test_one_within_512_characters_is_kept_whole(self, traces: InMemorySpanExporter) -> None:
        members = [(f"k{n}", "v" * 100) for n in range(4)]
        state = TraceState(members)
        parent = SpanContext(
            int(TRACEPARENT[3:35], 16), int(TRACEPARENT[36:52], 16), True, TraceFlags(1), state
        )
        with trace.get_tracer("t").start_as_current_span(
            "request", context=trace.set_span_in_context(NonRecordingSpan(parent))
        ):
            stored = tracing.current_context()
        assert stored is not None
        assert json.loads(stored)["tracestate"] == state.to_header()
