"""A failed attempt's outcome: the one function from a failure to what is written for it.

Every path that fails an attempt goes through :func:`failure_outcome`: a handler's exception
(``worker.execute``), a timeout (``worker.timeouts``), the worker's own failure around an attempt
(``worker.handlers``) and a subscriber's failure (``worker.relay``). It applies the retry policy
(``retry.decide``, whose table says what each failure becomes) and names the status to write.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from django_pgoutbox.conf import RetrySettings
from django_pgoutbox.models import JobStatus
from django_pgoutbox.retry import Action, Kind, decide

_ACTION_STATUS = {
    Action.RETRY: JobStatus.RETRYING,
    Action.DEAD: JobStatus.DEAD,
    Action.CANCEL: JobStatus.CANCELLED,
}


@dataclass(frozen=True)
class FailureOutcome:
    """What to write for a failed attempt: ``retrying`` (after ``delay`` seconds), ``dead`` or
    ``cancelled``, with the error's stable code and bounded summary. ``verdict`` ends the log
    line: the status, and which rule of the retry policy decided it, in plain words."""

    status: JobStatus
    code: str
    summary: str
    delay: float = 0.0
    verdict: str = ""

    @property
    def dead(self) -> bool:
        return self.status is JobStatus.DEAD


def failure_outcome(
    error: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    policy: RetrySettings,
    kind: Kind | None = None,
    code: str | None = None,
    summary: str | None = None,
    rng: random.Random | None = None,
) -> FailureOutcome:
    """The outcome of attempt number ``attempt`` (of ``max_attempts``) that failed with ``error``.

    ``kind`` overrides the row of the retry table read from ``error``'s class (``retry.decide``).
    ``code`` and ``summary``, when the caller describes the failure itself, replace those of
    ``error`` (bounded by the caller) and are written as they are. Never raises.
    """
    decision = decide(
        error, attempt=attempt, max_attempts=max_attempts, policy=policy, rng=rng, kind=kind
    )
    return FailureOutcome(
        _ACTION_STATUS[decision.action],
        decision.code if code is None else code,
        decision.summary if summary is None else summary,
        decision.delay,
        decision.verdict,
    )
