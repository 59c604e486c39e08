"""What the testing helpers return: one attempt run (``JobRun``), a run's summary
(``RunSummary``), and the errors they raise."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django_pgoutbox.validation import short_repr

#: How many failures a summary's repr and an error's message list.
SHOWN = 5


@dataclass(frozen=True)
class JobRun:
    """One attempt that a helper ran, and its outcome as the worker would write it.

    ``status`` is the job's status after the attempt: ``completed``, ``retrying``, ``dead`` or
    ``cancelled`` (``snoozed`` says a ``retrying`` came from ``Snooze``, which spends no
    attempt). ``code`` and ``summary`` are what ``last_error_code`` and ``last_error_summary``
    get; ``result`` is the handler's return value after its JSON round trip. ``error`` is what
    the handler raised, its traceback intact (None when it raised nothing).
    """

    job_id: uuid.UUID
    job_type: str
    queue: str
    attempt: int
    payload: dict[str, Any]
    status: str
    code: str | None = None
    summary: str | None = None
    result_json: str | None = None
    #: Seconds until the retry, for ``retrying``.
    delay: float = 0.0
    snoozed: bool = False
    error: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def result(self) -> Any:
        """The handler's return value as a worker stores it (decoded from JSON; None if none)."""
        return None if self.result_json is None else json.loads(self.result_json)

    @property
    def failed(self) -> bool:
        """Whether the attempt did not complete its job (a snooze is not a failure)."""
        return self.status != "completed" and not self.snoozed

    @property
    def reason(self) -> str:
        """The code and summary in one line (the summary alone when it starts with the code,
        as the retry policy's do: ``TransientError: SMTP busy``)."""
        code, summary = self.code or "", self.summary or ""
        if not summary or summary.startswith(code):
            return summary or code
        return f"{code}: {summary}" if code else summary

    def __str__(self) -> str:
        outcome = "snoozed" if self.snoozed else self.status
        why = f" ({self.reason})" if self.code and not self.snoozed else ""
        return f"{self.job_type} [{self.queue}] attempt {self.attempt}: {outcome}{why}"


@dataclass(frozen=True)
class SubscriberFailure:
    """A subscriber that failed on an event the helpers projected: the delivery the relay wrote
    for it (``OutboxDelivery``), retried after its back-off, or dead (``dead``: a schema version
    it does not accept, say)."""

    subscriber: str
    event_type: str
    event_id: uuid.UUID
    code: str | None
    error: str | None
    dead: bool

    def __str__(self) -> str:
        what = "dead" if self.dead else "to be retried"
        return f"{self.subscriber} on {self.event_type} ({what}): {self.error or self.code}"


@dataclass
class RunSummary:
    """What ``run_jobs()`` or ``drain()`` ran: every attempt in the order it ran (``runs``),
    counts by outcome, the failures; and, for ``drain(relay=True)``, the events projected."""

    runs: list[JobRun] = field(default_factory=list)
    #: Outbox events the relay projected (``drain(relay=True)``, ``run_relay()``).
    events: int = 0
    #: Outbox events left for a relay by ``drain()`` without ``relay=True``: the jobs their
    #: subscribers would enqueue were not run (at most 10,000 are counted).
    events_waiting: int = 0
    #: Queues that had jobs due but were paused (``pause_queue``): nothing was claimed there.
    paused: set[str] = field(default_factory=set)
    #: Queues whose claim took none of their jobs due (of ``job_types=``): its ``MAX_RUNNING``
    #: was reached, or its ``RATE_LIMIT``'s tokens spent (they do not come back while the
    #: test's transaction's clock stands still), or jobs of other types than ``job_types=``
    #: came first in its order and were given back.
    held_back: set[str] = field(default_factory=set)
    #: Subscribers that failed on the events projected (``drain(relay=True)``).
    subscriber_failures: list[SubscriberFailure] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """Attempts by outcome: ``completed``, ``retrying``, ``snoozed``, ``dead``,
        ``cancelled`` (only those that occurred)."""
        return dict(Counter("snoozed" if run.snoozed else run.status for run in self.runs))

    @property
    def completed(self) -> int:
        return self.counts.get("completed", 0)

    @property
    def retried(self) -> int:
        """Attempts that failed and left their job to be retried."""
        return self.counts.get("retrying", 0)

    @property
    def snoozed(self) -> int:
        return self.counts.get("snoozed", 0)

    @property
    def dead(self) -> int:
        return self.counts.get("dead", 0)

    @property
    def cancelled(self) -> int:
        return self.counts.get("cancelled", 0)

    @property
    def failures(self) -> list[JobRun]:
        """The attempts that did not complete their job, in the order they ran."""
        return [run for run in self.runs if run.failed]

    @property
    def job_types(self) -> list[str]:
        """The job type of each attempt, in the order they ran."""
        return [run.job_type for run in self.runs]

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        counts = ", ".join(f"{count} {outcome}" for outcome, count in self.counts.items())
        text = f"<RunSummary {len(self.runs)} attempt(s){': ' + counts if counts else ''}"
        if self.events:
            text += f"; {self.events} event(s) projected"
        if self.events_waiting:
            text += (
                f"; {self.events_waiting} outbox event(s) not projected "
                "(drain(relay=True) projects them)"
            )
        if self.subscriber_failures:
            failed = "; ".join(str(f) for f in self.subscriber_failures[:SHOWN])
            text += f"; subscribers failed: {failed}"
        if self.paused:
            text += f"; paused: {', '.join(sorted(self.paused))}"
        if self.held_back:
            text += (
                "; jobs due but not claimed (MAX_RUNNING, RATE_LIMIT, other types first): "
                f"{', '.join(sorted(self.held_back))}"
            )
        failures = self.failures
        if failures:
            shown = "; ".join(str(run) for run in failures[:SHOWN])
            more = f"; and {len(failures) - SHOWN} more" if len(failures) > SHOWN else ""
            text += f"; failures: {shown}{more}"
        return text + ">"


class AttemptFailed(AssertionError):
    """An attempt that a testing helper ran did not complete its job, and ``raise_on_failure``
    was set. ``run`` is the attempt; the handler's exception, if it raised one, is this one's
    ``__cause__``, so that the test's traceback shows where it was raised."""

    def __init__(self, run: JobRun, summary: RunSummary | None = None) -> None:
        self.run = run
        self.summary = summary
        detail = f": {run.reason}" if run.code else ""
        message = f"job {run.job_id} ({run.job_type}) attempt {run.attempt} ended {run.status}"
        super().__init__(
            f"{message}{detail}\n  payload: {short_repr(run.payload, 300)}\n"
            "  (pass raise_on_failure=False to get the outcome instead)"
        )


class SubscriberFailed(AssertionError):
    """A subscriber failed on an event that ``run_relay()`` or ``drain(relay=True)`` projected,
    and ``raise_on_failure`` was set. ``failures`` are the subscribers that failed (the relay
    logged each one's traceback); the events are processed, and each failure is a delivery."""

    def __init__(
        self, failures: list[SubscriberFailure], summary: RunSummary | None = None
    ) -> None:
        self.failures = failures
        self.summary = summary
        listed = "\n".join(f"  - {failure}" for failure in failures[:SHOWN])
        more = f"\n  ... and {len(failures) - SHOWN} more" if len(failures) > SHOWN else ""
        super().__init__(
            f"{len(failures)} subscriber(s) failed on the events projected:\n{listed}{more}\n"
            "  (their tracebacks are in the log of django_pgoutbox.relay; pass "
            "raise_on_failure=False to go on)"
        )


class DrainLimitExceeded(AssertionError):
    """``drain()`` ran ``max_jobs`` attempts (or the relay ``max_events`` events) and work was
    still due: a job that enqueues itself, or retries or snoozes for ever. ``summary`` is what
    ran; the message names the job types that ran most."""

    def __init__(self, limit: int, what: str, summary: RunSummary) -> None:
        self.summary = summary
        most = Counter(summary.job_types).most_common(3)
        busiest = ", ".join(f"{name} ({count} attempts)" for name, count in most)
        super().__init__(
            f"drain() stopped after {limit} {what} with work still due; the most run: "
            f"{busiest or 'none'}. A job that enqueues itself (or retries, or snoozes) for "
            "ever never drains: raise the bound (max_jobs=, max_events=) if the work is finite."
        )
