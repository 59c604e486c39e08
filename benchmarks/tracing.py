"""What the OpenTelemetry hook costs an attempt, in one process, with no database.

    python benchmarks/tracing.py [--attempts 20000] [--sdk]

``execute()`` of a no-op job ``--attempts`` times, the best of five, CPU time per attempt (every
thread's: the SDK's batch processor's too): with OpenTelemetry not imported; then, with
``--sdk``, imported with no tracer provider set, then with the SDK's provider batching to an
exporter that sends nothing; and, to compare, ``traced_attempt`` around an attempt that returns
at once, against the same span made, made current and ended by hand, and against the SDK's span
alone (docs/benchmarks.md, item 34). Without ``--sdk`` it runs on a tree from before traces too
(copied there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _best(attempts: int, run: Callable[[], None]) -> float:
    """The best of five runs of ``run``, in µs of CPU per attempt."""
    runs = []
    for _ in range(5):
        started = time.process_time()
        run()
        runs.append((time.process_time() - started) / attempts * 1e6)
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--attempts", type=int, default=20_000)
    parser.add_argument("--sdk", action="store_true", help="then import OpenTelemetry, and its SDK")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django_pgoutbox.conf import RetrySettings
    from django_pgoutbox.worker.execute import Outcome, execute
    from tests.conftest import claimed_job

    policy = RetrySettings(base_delay=1.0, max_delay=600.0, jitter=0.0, unknown_error_retries=3)
    jobs = [claimed_job("tests.noop") for _ in range(args.attempts)]

    def attempts() -> None:
        for job in jobs:
            execute(job, policy=policy, renew=lambda: None)

    print(f"not imported: {_best(args.attempts, attempts):.2f} µs per attempt")
    if not args.sdk:
        return
    from opentelemetry import context, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from django_pgoutbox import tracing
    from testproject.testjobs.traces import NoExport

    print(f"imported, no provider: {_best(args.attempts, attempts):.2f} µs per attempt")
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NoExport()))
    trace.set_tracer_provider(provider)
    print(f"SDK, batched to no export: {_best(args.attempts, attempts):.2f} µs per attempt")

    done = [Outcome.completed(job) for job in jobs]
    tracer = trace.get_tracer("by hand")

    def wrapped() -> None:
        for job, outcome in zip(jobs, done, strict=True):
            tracing.traced_attempt(job, lambda outcome=outcome: outcome)  # type: ignore[misc]

    def attributes(job: Any) -> dict[str, Any]:
        return {
            "messaging.system": "pgoutbox",
            "messaging.destination.name": job.queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": str(job.id),
            "pgoutbox.job.type": job.job_type,
            "pgoutbox.job.attempt": job.attempt,
        }

    def by_hand(current: bool) -> Callable[[], None]:
        def spans() -> None:
            for job in jobs:
                span = tracer.start_span(
                    f"process {job.queue}",
                    context=context.Context(),
                    kind=trace.SpanKind.CONSUMER,
                    attributes=attributes(job),
                )
                if current:
                    context.detach(context.attach(trace.set_span_in_context(span)))
                span.set_attribute("pgoutbox.job.outcome", "completed")
                span.end()

        return spans

    print(f"traced_attempt alone: {_best(args.attempts, wrapped):.2f} µs")
    print(f"the same span by hand, made current: {_best(args.attempts, by_hand(True)):.2f} µs")
    print(f"the SDK's span alone: {_best(args.attempts, by_hand(False)):.2f} µs")
    provider.shutdown()


if __name__ == "__main__":
    main()
