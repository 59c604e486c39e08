"""Helpers for your own tests: assert what was enqueued, run jobs and the relay in-process.

``assert_enqueued``, ``refute_enqueued`` and ``enqueued_jobs`` read what a test enqueued;
``run_jobs``, ``drain``, ``run_relay`` and ``perform_job`` run jobs and events on the test's
thread and connection, through the worker's own claim, execution and outcome statements
(docs/howto/testing.md). The pytest plugin (``django_pgoutbox.testing.pytest_plugin``) gives
them as the ``pgoutbox`` fixture.

Nothing is imported until it is used: pytest loads the plugin, and with it this package,
before Django's settings are configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "AttemptFailed",
    "DrainLimitExceeded",
    "JobRun",
    "RunSummary",
    "SubscriberFailed",
    "SubscriberFailure",
    "Testing",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "perform_job",
    "refute_enqueued",
    "run_jobs",
    "run_relay",
]

if TYPE_CHECKING:
    from django_pgoutbox.testing.assertions import assert_enqueued, enqueued_jobs, refute_enqueued
    from django_pgoutbox.testing.bound import Testing
    from django_pgoutbox.testing.outcomes import (
        AttemptFailed,
        DrainLimitExceeded,
        JobRun,
        RunSummary,
        SubscriberFailed,
        SubscriberFailure,
    )
    from django_pgoutbox.testing.running import drain, perform_job, run_jobs, run_relay

_MODULES = {
    "assert_enqueued": "assertions",
    "enqueued_jobs": "assertions",
    "refute_enqueued": "assertions",
    "Testing": "bound",
    "AttemptFailed": "outcomes",
    "DrainLimitExceeded": "outcomes",
    "JobRun": "outcomes",
    "RunSummary": "outcomes",
    "SubscriberFailed": "outcomes",
    "SubscriberFailure": "outcomes",
    "drain": "running",
    "perform_job": "running",
    "run_jobs": "running",
    "run_relay": "running",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        import importlib

        module = importlib.import_module(f"django_pgoutbox.testing.{_MODULES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'django_pgoutbox.testing' has no attribute {name!r}")
