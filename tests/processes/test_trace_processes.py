"""Traces through real ``runworkers`` processes, whose SDK (``testproject/testjobs/traces.py``)
writes every span ended to a file: a request's jobs, among them poison ones in the same batch,
each attempt's span linked to the request's and to the attempt before; the relay's chain
publish -> projection -> job; and tracing that fails (a processor and a propagator that raise,
garbage contexts in the rows; a processor that raises SystemExit and KeyboardInterrupt on the
handlers' and the relay's threads) failing no job and stopping no process.

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from opentelemetry import trace

from django_pgoutbox import enqueue, publish
from django_pgoutbox.models import Job, JobStatus
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"POLL_INTERVAL": 0.2, "RETRY": {"BASE_DELAY": 0.1, "MAX_DELAY": 0.2}}
SETTLED = (JobStatus.COMPLETED, JobStatus.DEAD)


def spans_in(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def link_ids(span: dict[str, Any]) -> list[tuple[str, str]]:
    return [(link["trace_id"], link["span_id"]) for link in span["links"]]


def attempts_of(spans: list[dict[str, Any]], job: Job) -> list[dict[str, Any]]:
    mine = [s for s in spans if s["attributes"].get("messaging.message.id") == str(job.pk)]
    return sorted(mine, key=lambda s: s["attributes"]["pgoutbox.job.attempt"])


def settled(*jobs: Job) -> bool:
    """every job is completed or dead"""
    return Job.objects.filter(pk__in=[j.pk for j in jobs], status__in=SETTLED).count() == len(jobs)


def test_a_requests_jobs_each_attempt_a_span_linked_to_it(
    start_worker: Any, tmp_path: Path, traces: Any
) -> None:
    request_span = trace.get_tracer("tests").start_as_current_span("request")
    with request_span as request, transaction.atomic():
        kinds = ("ok", "fail_once", "exit", "hang", "unprintable")
        jobs = {kind: enqueue("tests.traced", {"kind": kind}) for kind in kinds}
        jobs["innocent"] = enqueue("tests.noop", {})
        # in a process of its own, killed past its timeout at attempt 1
        jobs["isolated"] = enqueue("tests.isolated", {"sleep": 3})
    path = tmp_path / "spans.jsonl"
    worker = start_worker(
        "--queues", "default", "--concurrency", "4",
        env={"PGOUTBOX_TEST_TRACES": str(path)},
        **QUICK,
    )  # fmt: skip
    wait_for(lambda: settled(*jobs.values()), timeout=60)
    spawned = Job.objects.get(job_type="tests.noop", payload__from=str(jobs["ok"].pk))
    wait_for(lambda: settled(spawned), timeout=30)

    def every_span_written() -> bool:
        """the span of every attempt is written (a hung one's when its handler returns)"""
        spans = spans_in(path)
        return all(
            len(attempts_of(spans, job)) == Job.objects.get(pk=job.pk).attempts
            for job in [*jobs.values(), spawned]
        )

    wait_for(every_span_written, timeout=30)
    assert worker.process.poll() is None, "the worker kept on"
    status = {name: Job.objects.get(pk=job.pk).status for name, job in jobs.items()}
    assert status == {
        "ok": JobStatus.COMPLETED,
        "fail_once": JobStatus.COMPLETED,
        "exit": JobStatus.DEAD,
        "hang": JobStatus.DEAD,
        "unprintable": JobStatus.DEAD,
        "innocent": JobStatus.COMPLETED,
        "isolated": JobStatus.COMPLETED,
    }
    spans = spans_in(path)
    enqueued = ids(request)
    for name, job in jobs.items():
        for span in attempts_of(spans, job):
            assert span["name"] == "process default", name
            assert span["kind"] == "CONSUMER"
            assert span["parent"] is None
            assert span["trace_id"] != enqueued[0]  # a trace of its own, linked
            assert link_ids(span)[0] == enqueued, name
            assert span["attributes"]["messaging.system"] == "pgoutbox"
            assert span["attributes"]["messaging.destination.name"] == "default"
            assert span["attributes"]["messaging.operation.type"] == "process"
            assert span["attributes"]["pgoutbox.job.type"] == job.job_type

    first, second = attempts_of(spans, jobs["fail_once"])
    assert (first["status"], first["attributes"]["pgoutbox.job.outcome"]) == ("ERROR", "retrying")
    assert first["attributes"]["error.type"] == "TransientError"
    assert first["events"] == ["exception"]
    assert (second["status"], second["attributes"]["pgoutbox.job.outcome"]) == (
        "UNSET",
        "completed",
    )
    assert link_ids(second) == [enqueued, (first["trace_id"], first["span_id"])]

    for name, code in (("exit", "SystemExit"), ("unprintable", "Unprintable")):
        first, second = attempts_of(spans, jobs[name])
        assert [s["attributes"]["pgoutbox.job.outcome"] for s in (first, second)] == [
            "retrying",
            "dead",
        ]
        assert {s["status"] for s in (first, second)} == {"ERROR"}
        assert {s["attributes"]["error.type"] for s in (first, second)} == {code}
        assert link_ids(second)[1] == (first["trace_id"], first["span_id"])

    hung = attempts_of(spans, jobs["hang"])
    assert [s["attributes"]["pgoutbox.job.outcome"] for s in hung] == ["timed_out", "timed_out"]
    assert {s["status"] for s in hung} == {"ERROR"}
    assert link_ids(hung[1]) == [enqueued]  # the worker failed attempt 1: its span is not kept

    (ok,) = attempts_of(spans, jobs["ok"])
    (work,) = [s for s in spans if s["name"] == "handler work"]
    assert (work["trace_id"], work["parent"]) == (ok["trace_id"], ok["span_id"])
    (spawned_span,) = attempts_of(spans, spawned)
    assert link_ids(spawned_span) == [(work["trace_id"], work["span_id"])]
    killed, isolated = attempts_of(spans, jobs["isolated"])
    assert (killed["status"], killed["attributes"]["pgoutbox.job.outcome"]) == (
        "ERROR",
        "timed_out",
    )
    assert killed["attributes"]["error.type"] == "timeout"
    assert isolated["attributes"]["pgoutbox.job.outcome"] == "completed"
    assert link_ids(isolated) == [enqueued, (killed["trace_id"], killed["span_id"])]


def test_the_relays_chain_publish_projection_job(
    start_worker: Any, tmp_path: Path, traces: Any
) -> None:
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        event = publish(
            "tests.fan_out", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={"fan_out": 70}
        )
    poison = publish("poison.raise", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    path = tmp_path / "spans.jsonl"
    start_worker(
        "--roles", "relay,jobs", "--queues", "default",
        env={"PGOUTBOX_TEST_TRACES": str(path)},
        **QUICK,
    )  # fmt: skip
    jobs = Job.objects.filter(payload__event=str(event.pk))
    wait_for(lambda: jobs.filter(status=JobStatus.COMPLETED).count() == 4 + 70, timeout=60)

    def job_spans_written() -> bool:
        """every job's span is written"""
        spans = spans_in(path)
        return all(attempts_of(spans, job) for job in jobs)

    wait_for(job_spans_written, timeout=30)
    spans = spans_in(path)
    # the run whose jobs committed: with the poison event in its batch, the batch's first run
    # was rolled back, and each event ran again apart (worker/relay.py), a span each time
    runs = {
        (s["trace_id"], s["span_id"]): s
        for s in spans
        if s["name"] == "process outbox"
        and s["attributes"]["messaging.message.id"] == str(event.pk)
    }
    for run in runs.values():
        assert run["kind"] == "CONSUMER"
        assert run["attributes"]["pgoutbox.event.type"] == "tests.fan_out"
        assert run["attributes"]["pgoutbox.subscriber"].endswith("fan_out")
        assert link_ids(run) == [ids(request)]
    contexts: list[Any] = list(jobs.values_list("trace_context", flat=True))
    (projected,) = {tuple(context["traceparent"].split("-")[1:3]) for context in contexts}
    assert projected in runs
    for job in jobs:  # by every way a subscriber enqueues: deferred, keyed, insert, COPY
        (span,) = attempts_of(spans, job)
        assert link_ids(span) == [projected]
    failing = [s for s in spans if s["attributes"].get("messaging.message.id") == str(poison.pk)]
    assert failing
    assert {s["status"] for s in failing} == {"ERROR"}


def test_tracing_that_fails_fails_no_job(start_worker: Any, tmp_path: Path, traces: Any) -> None:
    """A span processor that raises at every start and end, a propagator that raises, and
    contexts in the rows written by hand: every job completes, and the worker keeps on."""
    with trace.get_tracer("tests").start_as_current_span("request"):
        traced = [enqueue("tests.noop", {}) for _ in range(3)]
        traced.append(enqueue("tests.traced", {"kind": "fail_once"}))
    garbage: list[Any] = [
        "not an object",
        [1, 2],
        {"traceparent": "00-zz-zz-01"},
        {"traceparent": 7, "attempt": {"number": "x"}},
        {"attempt": [1]},
        {"traceparent": "00-" + "f" * 32 + "-" + "f" * 16 + "-01", "tracestate": "=" * 600},
    ]
    hand_written = [enqueue("tests.noop", {}) for _ in garbage]
    for job, value in zip(hand_written, garbage, strict=True):
        Job.objects.filter(pk=job.pk).update(trace_context=value)
    failing = enqueue("tests.traced", {"kind": "fail_once"})
    Job.objects.filter(pk=failing.pk).update(trace_context={"attempt": "garbage"})
    path = tmp_path / "spans.jsonl"
    worker = start_worker(
        "--queues", "default",
        env={"PGOUTBOX_TEST_TRACES": str(path), "PGOUTBOX_TEST_TRACES_HOSTILE": "1"},
        **QUICK,
    )  # fmt: skip
    everything = [*traced, *hand_written, failing]
    wait_for(lambda: settled(*everything), timeout=60)
    assert {Job.objects.get(pk=j.pk).status for j in everything} == {JobStatus.COMPLETED}
    assert worker.process.poll() is None, "the worker kept on"
    assert "tracing:" in worker.output()  # said once per kind, with its traceback


def test_a_span_processor_raising_system_exit_fails_no_job(
    start_worker: Any, tmp_path: Path, traces: Any
) -> None:
    """A span processor that raises ``SystemExit`` at a span's start and ``KeyboardInterrupt``
    at every span's end, on the handlers' threads: every job completes, each at its first
    attempt that does not fail, and the worker keeps on."""
    with trace.get_tracer("tests").start_as_current_span("request"):
        jobs = [enqueue("tests.behave", {"record": False}) for _ in range(4)]
        jobs.append(enqueue("tests.traced", {"kind": "fail_once"}))
    worker = start_worker(
        "--queues", "default",
        env={"PGOUTBOX_TEST_TRACES": str(tmp_path / "spans.jsonl"),
             "PGOUTBOX_TEST_TRACES_HOSTILE": "exit"},
        **QUICK,
    )  # fmt: skip
    wait_for(lambda: settled(*jobs), timeout=60)
    rows = [Job.objects.get(pk=j.pk) for j in jobs]
    assert {row.status for row in rows} == {JobStatus.COMPLETED}
    assert [row.attempts for row in rows] == [1, 1, 1, 1, 2]
    assert worker.process.poll() is None, "the worker kept on"
    assert "tracing:" in worker.output()


def test_a_span_processor_raising_keyboard_interrupt_in_the_relay(
    start_worker: Any, tmp_path: Path, traces: Any
) -> None:
    """The same processor at the end of the relay's spans, on the relay's thread: each event is
    projected once, its jobs complete, and the worker keeps on."""
    with trace.get_tracer("tests").start_as_current_span("request"):
        event = publish(
            "tests.fan_out", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={"fan_out": 3}
        )
    worker = start_worker(
        "--roles", "relay,jobs", "--queues", "default",
        env={"PGOUTBOX_TEST_TRACES": str(tmp_path / "spans.jsonl"),
             "PGOUTBOX_TEST_TRACES_HOSTILE": "exit"},
        **QUICK,
    )  # fmt: skip
    jobs = Job.objects.filter(payload__event=str(event.pk))
    wait_for(lambda: jobs.filter(status=JobStatus.COMPLETED).count() == 4 + 3, timeout=60)
    assert jobs.count() == 4 + 3
    assert worker.process.poll() is None, "the worker kept on"
    event.refresh_from_db()
    assert event.processed_at is not None
