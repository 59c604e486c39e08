"""Timeouts (thread isolation): the outcome of an attempt that ran past its job type's timeout.

The coordinator learns when an attempt's clock starts (its handler thread posts ``STARTED``),
and fails it at its deadline unless its handler's outcome came first. Its thread is left running
(Python cannot stop a thread); the queue gets another in its place, and whatever that handler
returns at last is discarded.
"""

from __future__ import annotations

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.errors import JobTimeout
from django_pgoutbox.failures import failure_outcome
from django_pgoutbox.registry import get_job
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.execute import Outcome, log_failure


def timed_out(attempt: Attempt, policy: RetrySettings) -> Outcome:
    """The outcome of ``attempt``, failed for its timeout (logged)."""
    job = attempt.bare_job()
    definition = get_job(job.job_type)
    timeout = definition.timeout if definition is not None and definition.timeout else 0.0
    error = JobTimeout(
        f"attempt {job.attempt} ran longer than its timeout of {timeout:g}s; its thread "
        "was left running and its result will be discarded"
    )
    failed = failure_outcome(
        error, attempt=job.attempt, max_attempts=job.max_attempts, policy=policy
    )
    log_failure(job, error, failed)
    return Outcome(
        job,
        failed.status,
        delay=failed.delay,
        code=failed.code,
        summary=failed.summary,
        timed_out=True,
    )
