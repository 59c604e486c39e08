"""The checker of workflows drained under faults: from each step's final row, its parents' rows and
its execution log, the rules a step's life must follow, each broken one named with its step.

Pure functions of what the test read from the database: ``check_workflow`` takes one workflow's
steps by name and returns the breaches found, one line each (none: the workflow is sound).

The rules (issue 24):

1. *settled*: no step is left waiting, pending, leased or retrying.
2. *released*: a step whose parents all completed ran to its end: completed, or dead if it was
   told to fail (or lost with its worker on every attempt that counts, ``lease_expired``).
3. *after its parents*: each start of a step (every attempt, a repeated one too) is later than
   each parent's end (``completed_at`` for a completed parent, else ``finished_at``). Both are
   the database's clock, and a parent's end is its outcome transaction's ``now()``, so strictly
   before the child could be claimed.
4. *upstream failures*: a step with a dead or cancelled parent is cancelled with
   ``upstream_failed`` and never started, unless it runs on an upstream failure: then it ran once
   its parents had all finished (rule 3 checks when), as a step whose parents completed (rule 2).
5. *results*: a completed step's result names it and saw exactly its completed parents.
6. *once*: attempts in 1..max_attempts for a step that ran, with a start of its last attempt and
   none of a later one; 0 and no start for a step cancelled upstream; ``waiting_for`` never below
   0, and 0 for every step released from waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

UNSETTLED = frozenset({"waiting", "pending", "leased", "retrying"})
#: The code of a step cancelled because a job it waits for ended dead or cancelled.
UPSTREAM_FAILED = "upstream_failed"
#: The code of a job whose attempts were lost with their workers (RECOVER_EXPIRED_LEASES).
LEASE_EXPIRED = "lease_expired"


@dataclass(frozen=True)
class StepRecord:
    """One step as the test planned it and as the database holds it at the end."""

    parents: tuple[str, ...]
    #: ``on_upstream_failure``: "cancel" (the default) or "run"
    policy: str
    #: the payload told the handler to fail for good
    told_to_fail: bool
    status: str
    attempts: int
    max_attempts: int
    waiting_for: int | None
    last_error_code: str | None
    completed_at: datetime | None
    finished_at: datetime | None
    result: Any
    #: (attempt, clock_timestamp()) of each start of its handler, in any order
    starts: tuple[tuple[int, datetime], ...] = ()

    @property
    def end(self) -> datetime | None:
        """When it finished: its completion, or its death or cancellation."""
        return self.completed_at if self.status == "completed" else self.finished_at


def check_workflow(steps: Mapping[str, StepRecord]) -> list[str]:
    """The breaches of rules 1-6 in one workflow (``steps`` by name), each naming its step."""
    breaches: list[str] = []
    for name, s in sorted(steps.items()):
        breaches.extend(f"{name}: {breach}" for breach in _check_step(name, s, steps))
    return breaches


def lost_to_kills(s: StepRecord) -> bool:
    """Dead because its attempts were lost with their workers (not a breach: a step killed on each
    attempt that counts spends them, by design)."""
    return s.status == "dead" and not s.told_to_fail and s.last_error_code == LEASE_EXPIRED


def _check_step(name: str, s: StepRecord, steps: Mapping[str, StepRecord]) -> list[str]:
    if s.status in UNSETTLED:
        return [f"rule 1: still {s.status}"]
    parents = [steps[p] for p in s.parents]
    if any(p.status in UNSETTLED for p in parents):
        return [f"rule 1: {s.status} while a parent is unsettled"]
    breaches: list[str] = []
    doomed = s.policy != "run" and any(p.status != "completed" for p in parents)
    if doomed:
        if (s.status, s.last_error_code) != ("cancelled", UPSTREAM_FAILED):
            breaches.append(
                f"rule 4: a parent ended dead or cancelled, yet {s.status}"
                f" ({s.last_error_code}), not cancelled with {UPSTREAM_FAILED}"
            )
        if s.starts:
            breaches.append(f"rule 4: cancelled upstream, yet started {len(s.starts)} time(s)")
        if s.attempts != 0:
            breaches.append(f"rule 6: cancelled upstream after {s.attempts} attempt(s)")
    else:
        expected = "dead" if s.told_to_fail else "completed"
        if s.status != expected and not lost_to_kills(s):
            upstream_failed = any(p.status != "completed" for p in parents)
            why = "its parents all finished" if upstream_failed else "its parents all completed"
            breaches.append(
                f"rule {4 if upstream_failed else 2}: {why}, yet {s.status}"
                f" ({s.last_error_code}), not {expected}"
            )
        breaches.extend(_check_run(s))
    for attempt, at in sorted(s.starts):
        for parent_name, p in zip(s.parents, parents, strict=True):
            if p.end is None or at <= p.end:
                breaches.append(
                    f"rule 3: attempt {attempt} started at {at.isoformat()}, not after"
                    f" {parent_name} ended ({p.status} at {p.end and p.end.isoformat()})"
                )
    if s.status == "completed":
        breaches.extend(_check_result(name, s, steps))
    if s.waiting_for is not None and s.waiting_for < 0:
        breaches.append(f"rule 6: waiting_for {s.waiting_for}")
    if s.parents and not doomed and s.waiting_for != 0:
        breaches.append(f"rule 6: released with waiting_for {s.waiting_for}")
    return breaches


def _check_run(s: StepRecord) -> list[str]:
    """Rule 6 for a step that ran: its attempts and its starts."""
    if lost_to_kills(s):
        return []  # its last attempt may have been lost before its handler started
    breaches: list[str] = []
    if not 1 <= s.attempts <= s.max_attempts:
        breaches.append(f"rule 6: {s.status} after {s.attempts} of {s.max_attempts} attempt(s)")
    started = {attempt for attempt, _ in s.starts}
    if s.attempts not in started:
        breaches.append(f"rule 6: {s.status} at attempt {s.attempts}, which never started")
    later = sorted(a for a in started if a > s.attempts)
    if later:
        breaches.append(f"rule 6: attempt(s) {later} started, past its {s.attempts}")
    return breaches


def _check_result(name: str, s: StepRecord, steps: Mapping[str, StepRecord]) -> list[str]:
    """Rule 5: the result names the step and the parents whose results it read."""
    completed = sorted(p for p in s.parents if steps[p].status == "completed")
    if not isinstance(s.result, dict):
        return [f"rule 5: result {s.result!r}, not its name and what it saw"]
    breaches = []
    if s.result.get("name") != name:
        breaches.append(f"rule 5: result names {s.result.get('name')!r}")
    if s.result.get("saw") != completed:
        breaches.append(f"rule 5: saw {s.result.get('saw')!r}, its completed parents {completed}")
    return breaches
