"""The helpers bound to one database: what the pytest plugin's ``pgoutbox`` fixture gives."""

from __future__ import annotations

from typing import Any

from django_pgoutbox.models import Job
from django_pgoutbox.testing import assertions, running
from django_pgoutbox.testing.outcomes import JobRun, RunSummary


class Testing:
    """``django_pgoutbox.testing``'s helpers with ``using=`` set to one database alias (None:
    where the routers write jobs). Each method takes the same arguments as the function of
    its name; a ``using=`` given to it wins."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"<pgoutbox testing helpers, database {self.using or 'as routed'!r}>"

    def on(self, using: str) -> Testing:
        """The helpers bound to the database ``using`` instead."""
        return Testing(using)

    def _bound(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"using": self.using, **options}

    def assert_enqueued(self, *args: Any, **options: Any) -> Job:
        return assertions.assert_enqueued(*args, **self._bound(options))

    def refute_enqueued(self, *args: Any, **options: Any) -> None:
        assertions.refute_enqueued(*args, **self._bound(options))

    def enqueued_jobs(self, *args: Any, **options: Any) -> list[Job]:
        return assertions.enqueued_jobs(*args, **self._bound(options))

    def run_jobs(self, **options: Any) -> RunSummary:
        return running.run_jobs(**self._bound(options))

    def drain(self, **options: Any) -> RunSummary:
        return running.drain(**self._bound(options))

    def run_relay(self, **options: Any) -> int:
        return running.run_relay(**self._bound(options))

    def perform_job(self, *args: Any, **options: Any) -> JobRun:
        return running.perform_job(*args, **self._bound(options))
