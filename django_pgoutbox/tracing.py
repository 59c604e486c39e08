"""OpenTelemetry traces: the enqueuing span's context kept with a job or an event, and a span for
each attempt and each projected event, linked to it (docs/observability.md, "Traces").

``opentelemetry`` is optional (the ``[otel]`` extra), and this module never imports it: a
process whose code never imported ``opentelemetry.trace`` has no tracer provider configured, so
every hook here is then a cheap no-op, without the API's import (a tenth of a second at start-up,
and in each child of an isolated job type). Where the process did import it but set no tracer
provider (no SDK configured), nothing is stored and no span is started either. Nothing here may
fail an enqueue, an attempt or a process: a propagator, an exporter or a span processor that
raises, or a garbage context in a row written by hand, is logged once per thread and the work
goes on untraced.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import cache, lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django_pgoutbox.errors import JobTimeout
from django_pgoutbox.models import JobStatus
from django_pgoutbox.registry import get_job

if TYPE_CHECKING:
    from django_pgoutbox.worker.execute import ClaimedJob, Outcome

logger = logging.getLogger("django_pgoutbox.tracing")

#: ``messaging.system`` of every span.
SYSTEM = "pgoutbox"
#: The stored context's keys: the W3C Trace Context fields.
FIELDS = ("traceparent", "tracestate")
#: The key of ``jobs.trace_context`` under which a traced attempt that did not complete its job
#: keeps its span (its number and ``traceparent``), for the next attempt's link.
ATTEMPT = "attempt"

#: What each thread has said failed (``_warn_once``): its own, shared with no other thread.
_said = threading.local()
_UNKNOWN = object()
#: The API's way to name a provider without code: ``get_tracer_provider()`` loads it, so the
#: API is imported here at once (if installed) for the first call to find.
_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
if _PROVIDER_FROM_ENVIRONMENT:
    with suppress(ImportError):
        import opentelemetry.trace  # noqa: F401
#: ``_said.environment_failed``, each thread's own: set once the provider that variable names
#: failed to load on it (no such entry point, or its code raised): else the API tries again at
#: each call, scanning the installed packages' entry points (a few hundred µs, forty no-op jobs'
#: time) and logging an ERROR with its traceback each time. Each thread tries once: no flag is
#: shared between handler threads.


def _api() -> ModuleType | None:
    """``opentelemetry.trace`` if this process imported it (its SDK's configuration did)."""
    return sys.modules.get("opentelemetry.trace")


def enabled() -> bool:
    """Whether traces are made: the process imported the API and set a tracer provider (an
    SDK's). Never raises.

    Asked once per attempt and per event. ``trace.get_tracer_provider()`` looks
    ``OTEL_PYTHON_TRACER_PROVIDER`` up in ``os.environ`` each time no provider is set: 2 µs, a
    twentieth of a no-op job's time in the worker (docs/benchmarks.md, "What profiling found",
    item 34). So the API's own global is read (a provider set, or None), and the function is
    called only where it has something to do: that variable set, or an API without the global.
    """
    trace = _api()
    if trace is None:
        return False
    provider: Any = None
    try:
        provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
        if provider is None and (
            not _PROVIDER_FROM_ENVIRONMENT or getattr(_said, "environment_failed", False)
        ):
            return False  # a provider set in code later is read from the global all the same
        if provider is None or provider is _UNKNOWN:
            provider = trace.get_tracer_provider()
        return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    except BaseException as raised:  # an API half imported by another thread, or one that changed
        if not _tolerated(raised):
            raise
        if provider is None:  # the one the environment names did not load: not tried again
            _said.environment_failed = True
        _warn_once("asking for the tracer provider")
        return False


def _tolerated(error: BaseException) -> bool:
    """Whether tracing swallows ``error``, raised by OpenTelemetry or what it calls (a span
    processor, an exporter, a propagator, a sampler): anything, ``SystemExit`` and a
    ``KeyboardInterrupt`` raised on another thread included (that processor's code, not the
    process's: on a handler's thread it replaced the outcome of an attempt that had run, and its
    job ran again), but Ctrl-C's ``KeyboardInterrupt`` on the main thread, which stops the run
    wherever it arrives."""
    return not isinstance(error, KeyboardInterrupt) or (
        threading.current_thread() is not threading.main_thread()
    )


def _warn_once(what: str) -> None:
    """Log, once per thread and kind, that tracing failed (with its traceback); never raises."""
    warned: set[str] = _said.__dict__.setdefault("warned", set())
    if what in warned:
        return
    warned.add(what)
    with suppress(Exception):  # a broken handler of this logger must not fail the work either
        logger.warning(
            "tracing: %s failed; the work goes on untraced (logged once per thread)",
            what,
            exc_info=True,
        )


def current_context() -> str | None:
    """The W3C trace context of the span current here, as JSON text to store with a job or an
    event; None when no span is recording (no SDK, no span, a span not sampled), the common case.
    """
    trace = _api()
    if trace is None:
        return None
    try:
        span = trace.get_current_span()
        if not span.is_recording() or not span.get_span_context().is_valid:
            return None
        return _inject()
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("reading the current span's context")
        return None


def _inject() -> str | None:
    """The current context by the configured propagator's W3C fields; by the W3C propagator if
    it writes none of them (another format configured) or raises."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    try:
        propagate.inject(carrier)
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("the configured propagator")
        carrier = {}
    kept = w3c_fields(carrier)
    if kept is None or len(kept) != sum(isinstance(carrier.get(name), str) for name in FIELDS):
        # none written (another format configured), or what no reader takes: a NUL or a lone
        # surrogate (which PostgreSQL's jsonb refuses: the enqueue failed), uppercase hex, a
        # traceparent of another form, a tracestate of megabytes stored with every job
        carrier = {}
        _w3c().inject(carrier)
        kept = w3c_fields(carrier)
    return None if kept is None else json.dumps(kept, separators=(",", ":"))


#: A W3C ``traceparent`` as this package stores and hands on: version, trace id, parent id and
#: flags, lowercase hex (version ff is invalid; the all-zero ids are checked apart).
_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
#: A ``tracestate``: printable ASCII, at most what W3C's 32 members of 256-character keys and
#: values make.
_TRACESTATE = re.compile(r"[\x20-\x7e]{0,16447}")


def w3c_fields(carrier: Any) -> dict[str, str] | None:
    """The W3C fields of ``carrier`` that are valid: its ``traceparent`` (None without a valid
    one) and its ``tracestate`` if valid too. Needs no OpenTelemetry (``as_cloudevent()``)."""
    if not isinstance(carrier, dict):
        return None
    traceparent = carrier.get("traceparent")
    if (
        not isinstance(traceparent, str)
        or _TRACEPARENT.fullmatch(traceparent) is None
        or traceparent[3:35] == "0" * 32
        or traceparent[36:52] == "0" * 16
    ):
        return None
    kept = {"traceparent": traceparent}
    tracestate = carrier.get("tracestate")
    if isinstance(tracestate, str) and _TRACESTATE.fullmatch(tracestate) is not None:
        tracestate = _cut(tracestate)
        if tracestate:
            kept["tracestate"] = tracestate
    return kept


#: The length of a ``tracestate`` kept whole: W3C's vendors propagate at least 512 characters,
#: and may cut a longer one.
TRACESTATE_KEPT = 512


def _cut(tracestate: str) -> str:
    """``tracestate`` cut to ``TRACESTATE_KEPT`` characters as W3C says: its members longer
    than 128 characters removed first, then its last ones. A request's span takes the header its
    client sent (up to 32 members of 513 characters), and each job the request enqueues stored
    it whole."""
    if len(tracestate) <= TRACESTATE_KEPT:
        return tracestate
    members = [m.strip() for m in tracestate.split(",") if m.strip() and len(m.strip()) <= 128]
    while members and len(",".join(members)) > TRACESTATE_KEPT:
        members.pop()
    return ",".join(members)


def span_context(stored: Any) -> Any:
    """The ``SpanContext`` that a stored context (JSON text or its parsed object) names, or None
    for none or for anything that is not a valid W3C context (a row written by hand)."""
    trace = _api()
    if trace is None or stored is None:
        return None
    try:
        carrier = json.loads(stored) if isinstance(stored, str) else stored
        if not isinstance(carrier, dict):
            return None
        fields = {name: carrier[name] for name in FIELDS if isinstance(carrier.get(name), str)}
        if "traceparent" not in fields:
            return None
        found = trace.get_current_span(_w3c().extract(fields)).get_span_context()
        return found if found.is_valid else None
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("reading a stored trace context")
        return None


def _links(stored: Any, attempt: int | None = None) -> list[Any]:
    """The links of a span: to the span that enqueued (or published) it, and, for attempt
    ``attempt``, to the span of the attempt before it if that one was traced and failed."""
    trace, _ = _otel()
    if stored is None:
        return []
    links = []
    found = span_context(stored)
    if found is not None:
        links.append(trace.Link(found, {"pgoutbox.link": "enqueued"}))
    if attempt is not None:
        previous = _previous_attempt(stored, attempt)
        if previous is not None:
            links.append(trace.Link(previous, {"pgoutbox.link": "previous_attempt"}))
    return links


def _previous_attempt(stored: Any, attempt: int) -> Any:
    """The span of the attempt before ``attempt`` that the row keeps (``ATTEMPT``), if it is
    that one: the same number after a snooze, which gives its number back; one less else. An
    older attempt's (the one between was not traced: a timeout, a lost lease) is no link."""
    try:
        carrier = json.loads(stored) if isinstance(stored, str) else stored
        kept = carrier.get(ATTEMPT) if isinstance(carrier, dict) else None
        if not isinstance(kept, dict) or kept.get("number") not in (attempt - 1, attempt):
            return None
        return span_context(kept)
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("reading a stored trace context")
        return None


def attempt_trace(span: Any, attempt: int) -> str | None:
    """What the outcome of a traced attempt that did not complete its job writes under
    ``ATTEMPT`` in ``jobs.trace_context`` (RECORD_OUTCOMES), for the next attempt's link."""
    context = span.get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None  # a span not sampled is exported nowhere: no link to it
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    return json.dumps({"number": attempt, "traceparent": traceparent}, separators=(",", ":"))


def traced_attempt(job: ClaimedJob, run: Callable[[], Outcome]) -> Outcome:
    """``run()`` (one attempt) inside its span: ``process <queue>``, kind CONSUMER, linked to
    the span that enqueued the job, current while the handler runs; ended whatever ``run()``
    does. An attempt that ran as long as its job type's timeout was failed for it by the worker,
    whatever its handler returned at last: its outcome is "timed_out".
    """
    started = _start_attempt(job)
    if started is None:
        return _untraced(run)
    outcome: Outcome | None = None
    try:
        outcome = run()
    finally:
        _end_attempt(*started, outcome)
    return _kept(started[0], job, outcome)


async def traced_attempt_async(job: ClaimedJob, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """``traced_attempt`` for a coroutine: its span is current in the coroutine's own task."""
    started = _start_attempt(job)
    if started is None:
        with _context_of_its_own():
            return await run()
    outcome: Outcome | None = None
    try:
        outcome = await run()
    finally:
        _end_attempt(*started, outcome)
    return _kept(started[0], job, outcome)


def _start_attempt(job: ClaimedJob) -> tuple[Any, Any, float | None, float] | None:
    """The attempt's span started and made current (its span, the token that detaches it, the
    job type's timeout, when it started); None if that failed (the attempt runs untraced)."""
    span = None
    try:
        trace, otel_context = _otel()
        timeout = _timeout(job.job_type)
        span = _tracer().start_span(
            f"process {job.queue}",
            context=otel_context.Context(),  # a root: the enqueuing span is a link, not a parent
            kind=trace.SpanKind.CONSUMER,
            links=_links(job.trace_context, job.attempt),
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": job.queue,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.message.id": str(job.id),
                "pgoutbox.job.type": job.job_type,
                "pgoutbox.job.attempt": job.attempt,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("starting an attempt's span")
        if span is not None:  # started, not made current: ended at once, never left open
            with suppress(BaseException):
                span.end()
        return None
    return span, token, timeout, time.monotonic()


def _kept(span: Any, job: ClaimedJob, outcome: Outcome) -> Outcome:
    """``outcome``, carrying the attempt's span for the next attempt's link unless it completed
    the job."""
    if outcome.status is JobStatus.COMPLETED:
        return outcome
    try:
        return replace(outcome, attempt_trace=attempt_trace(span, job.attempt))
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("keeping an attempt's span for the next one")
        return outcome


def _untraced(run: Callable[[], Outcome]) -> Outcome:
    """``run()`` with no span, in a context of its own all the same: one that its handler makes
    current and never detaches is not the next attempt's on the thread (nor its jobs')."""
    with _context_of_its_own():
        return run()


@contextmanager
def _context_of_its_own() -> Iterator[None]:
    """An empty OpenTelemetry context current for the block, the one before it current again
    after, whatever the block attached and never detached (if it can be attached at all)."""
    token = None
    try:
        _, otel_context = _otel()
        token = otel_context.attach(otel_context.Context())
    except BaseException as raised:
        if not _tolerated(raised):
            raise
    try:
        yield
    finally:
        if token is not None:
            with suppress(Exception):
                otel_context.detach(token)


def _timeout(job_type: str) -> float | None:
    """The timeout that the worker enforces from outside the handler's thread, if any: with
    ``isolation="process"`` the child is killed instead, and the outcome says so itself."""
    definition = get_job(job_type)
    if definition is None or not definition.timeout or definition.isolation == "process":
        return None
    return definition.timeout


def _end_attempt(
    span: Any, token: Any, timeout: float | None, started: float, outcome: Outcome | None
) -> None:
    trace, otel_context = _otel()
    timed_out = timeout is not None and time.monotonic() - started >= timeout

    with _guarded("detaching an attempt's context"):
        otel_context.detach(token)
    with _guarded("setting an attempt's outcome on its span"):
        if outcome is None:
            span.set_attribute("pgoutbox.job.outcome", "worker_error")
            span.set_status(trace.StatusCode.ERROR, "the worker failed around this attempt")
        else:
            timed_out = timed_out or outcome.code == JobTimeout.code
            status = "timed_out" if timed_out else outcome.status.value
            span.set_attribute("pgoutbox.job.outcome", status)
            if outcome.code is not None and outcome.code != "snoozed":
                span.set_attribute("error.type", "timeout" if timed_out else outcome.code)
                span.set_status(trace.StatusCode.ERROR, outcome.summary)
            elif timed_out:
                span.set_attribute("error.type", "timeout")
                span.set_status(trace.StatusCode.ERROR, "the attempt ran past its timeout")
    _end(span)


@contextmanager
def _guarded(what: str) -> Iterator[None]:
    """The block, whose failure (what ``_tolerated`` swallows) is logged once as ``what``
    failing, and goes no further."""
    try:
        yield
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once(what)


def _end(span: Any) -> None:
    """End ``span``; its processor or exporter failing fails nothing."""
    with _guarded("ending a span (its processor or exporter)"):
        span.end()


def record_failure(error: BaseException) -> None:
    """Record what a handler raised on the current span, if it is recording; never raises (an
    exception whose ``str()`` raises is recorded by its type alone)."""
    trace = _api()
    if trace is None:
        return
    try:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        try:
            span.record_exception(error, escaped=True)
        except Exception:
            span.add_event("exception", {"exception.type": type(error).__qualname__})
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("recording an exception on a span")


@contextmanager
def traced_event(event: Any, subscriber: str) -> Iterator[None]:
    """The relay's span of one subscriber's run on ``event`` (``process outbox``, kind
    CONSUMER, linked to the span that published it), current while the subscriber runs: the
    jobs it enqueues carry its context. Nothing when traces are not made."""
    if not enabled():
        yield
        return
    span = None
    try:
        trace, otel_context = _otel()
        span = _tracer().start_span(
            "process outbox",
            context=otel_context.Context(),
            kind=trace.SpanKind.CONSUMER,
            links=_links(getattr(event, "trace_context", None)),
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": "outbox",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.message.id": str(event.id),
                "pgoutbox.event.type": event.event_type,
                "pgoutbox.subscriber": subscriber,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
    except BaseException as raised:
        if not _tolerated(raised):
            raise
        _warn_once("starting an event's span")
        if span is not None:
            with suppress(BaseException):
                span.end()
        with _context_of_its_own():
            yield
        return
    try:
        yield
    except BaseException as error:
        record_failure(error)
        with _guarded("setting an event's status on its span"):
            span.set_status(trace.StatusCode.ERROR, type(error).__qualname__)
        raise
    finally:
        with _guarded("detaching an event's context"):
            otel_context.detach(token)
        _end(span)


@cache
def _w3c() -> Any:
    """W3C's own propagator: what the stored context is read with, whatever is configured."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


@cache
def _otel() -> tuple[Any, Any]:
    """``opentelemetry.trace`` and ``opentelemetry.context``, imported at the first span: no
    import statement run again at each span."""
    from opentelemetry import context, trace

    return trace, context


def _tracer() -> Any:
    return _tracer_of(_otel()[0].get_tracer_provider())


@lru_cache(maxsize=4)
def _tracer_of(provider: Any) -> Any:
    """This package's tracer from ``provider``: made once, not at each span (the SDK's
    ``get_tracer()`` makes a new one at each call)."""
    from django_pgoutbox import __version__

    return provider.get_tracer("django_pgoutbox", __version__)
