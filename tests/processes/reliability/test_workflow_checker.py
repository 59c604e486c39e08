"""The workflow checker on hand-made workflows: a sound one passes, and each rule, broken, is
named with its step."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.processes.reliability.workflow_checker import StepRecord, check_workflow

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def ran(
    name: str,
    *parents: str,
    start: int,
    end: int,
    saw: tuple[str, ...] | None = None,
    **changes: Any,
) -> StepRecord:
    """A step that started at ``start`` ms and completed at ``end`` ms, having read ``saw``
    (default: every parent)."""
    record = StepRecord(
        parents=parents,
        policy="cancel",
        told_to_fail=False,
        status="completed",
        attempts=1,
        max_attempts=2,
        waiting_for=0 if parents else None,
        last_error_code=None,
        completed_at=at(end),
        finished_at=at(end),
        result={"name": name, "saw": sorted(parents if saw is None else saw)},
        starts=((1, at(start)),),
    )
    return dataclasses.replace(record, **changes)


def failed(*parents: str, start: int, end: int, **changes: Any) -> StepRecord:
    """A step told to fail, dead at ``end`` ms."""
    record = ran(
        "",
        *parents,
        start=start,
        end=end,
        told_to_fail=True,
        status="dead",
        last_error_code="permanent",
        completed_at=None,
        result=None,
    )
    return dataclasses.replace(record, **changes)


def cancelled(*parents: str, end: int, **changes: Any) -> StepRecord:
    """A step cancelled at ``end`` ms because a parent ended dead or cancelled."""
    record = StepRecord(
        parents=parents,
        policy="cancel",
        told_to_fail=False,
        status="cancelled",
        attempts=0,
        max_attempts=2,
        waiting_for=1,
        last_error_code="upstream_failed",
        completed_at=None,
        finished_at=at(end),
        result=None,
    )
    return dataclasses.replace(record, **changes)


def sound() -> dict[str, StepRecord]:
    """a -> b, a -> c (told to fail), {b, c} -> d (cancelled with c's death) -> e (likewise), and
    {b, d} -> f, which runs on an upstream failure."""
    return {
        "a": ran("a", start=0, end=10),
        "b": ran("b", "a", start=20, end=30),
        "c": failed("a", start=15, end=35),
        "d": cancelled("b", "c", end=35),
        "e": cancelled("d", end=35),
        "f": ran("f", "b", "d", start=40, end=50, saw=("b",), policy="run"),
    }


def breaches_of(name: str, **changes: Any) -> list[str]:
    """The breaches of step ``name`` with ``changes`` (not those its dependants now show)."""
    steps = sound()
    steps[name] = dataclasses.replace(steps[name], **changes)
    return [b for b in check_workflow(steps) if b.startswith(f"{name}: ")]


def test_a_sound_workflow_passes() -> None:
    assert check_workflow(sound()) == []


def test_a_step_killed_on_every_attempt_that_counts_may_be_dead() -> None:
    assert breaches_of("b", status="dead", last_error_code="lease_expired", starts=()) == []


@pytest.mark.parametrize("status", ["waiting", "pending", "leased", "retrying"])
def test_rule_1_a_step_left_unsettled(status: str) -> None:
    assert breaches_of("e", status=status) == [f"e: rule 1: still {status}"]


@pytest.mark.parametrize(
    ("changes", "breach"),
    [
        ({"status": "cancelled"}, "b: rule 2: its parents all completed, yet cancelled"),
        ({"status": "dead"}, "b: rule 2: its parents all completed, yet dead"),
        ({"told_to_fail": True}, "b: rule 2: its parents all completed, yet completed"),
    ],
)
def test_rule_2_a_step_whose_parents_completed_did_not_end_as_told(
    changes: dict[str, Any], breach: str
) -> None:
    (found,) = breaches_of("b", **changes)
    assert found.startswith(breach)


def test_rule_3_a_step_started_before_a_parent_completed() -> None:
    assert breaches_of("b", starts=((1, at(20)), (1, at(5)))) == [
        "b: rule 3: attempt 1 started at 2026-01-01T00:00:00.005000+00:00, not after a ended"
        " (completed at 2026-01-01T00:00:00.010000+00:00)"
    ]


def test_rule_3_a_start_at_the_very_time_of_the_parents_end_is_too_early() -> None:
    (found,) = breaches_of("b", starts=((1, at(10)),))
    assert found.startswith("b: rule 3: attempt 1 started at")


def test_rule_3_a_clean_up_step_started_before_a_parent_was_cancelled() -> None:
    (found,) = breaches_of("f", starts=((1, at(33)),))
    assert found.startswith("f: rule 3:")
    assert "not after d ended (cancelled" in found


def test_rule_4_a_step_with_a_dead_parent_ran() -> None:
    record = ran("d", "b", "c", start=36, end=37, saw=("b",))
    assert breaches_of("d", **dataclasses.asdict(record)) == [
        "d: rule 4: a parent ended dead or cancelled, yet completed (None), not cancelled"
        " with upstream_failed",
        "d: rule 4: cancelled upstream, yet started 1 time(s)",
        "d: rule 6: cancelled upstream after 1 attempt(s)",
    ]


def test_rule_4_a_cancelled_step_without_the_code_or_started() -> None:
    assert breaches_of("e", last_error_code=None) == [
        "e: rule 4: a parent ended dead or cancelled, yet cancelled (None), not cancelled"
        " with upstream_failed"
    ]
    assert breaches_of("e", starts=((1, at(40)),)) == [
        "e: rule 4: cancelled upstream, yet started 1 time(s)"
    ]


def test_rule_4_a_clean_up_step_that_never_ran() -> None:
    found = breaches_of("f", status="cancelled", last_error_code="upstream_failed", starts=())
    assert found[0] == (
        "f: rule 4: its parents all finished, yet cancelled (upstream_failed), not completed"
    )


@pytest.mark.parametrize(
    ("result", "breach"),
    [
        ({"name": "b", "saw": []}, "b: rule 5: saw [], its completed parents ['a']"),
        ({"name": "x", "saw": ["a"]}, "b: rule 5: result names 'x'"),
        (None, "b: rule 5: result None, not its name and what it saw"),
    ],
)
def test_rule_5_a_result_that_read_the_wrong_parents(result: Any, breach: str) -> None:
    assert breaches_of("b", result=result) == [breach]


def test_rule_5_a_clean_up_step_saw_a_parent_that_did_not_complete() -> None:
    assert breaches_of("f", result={"name": "f", "saw": ["b", "d"]}) == [
        "f: rule 5: saw ['b', 'd'], its completed parents ['b']"
    ]


@pytest.mark.parametrize(
    ("changes", "breach"),
    [
        ({"attempts": 3}, "b: rule 6: completed after 3 of 2 attempt(s)"),
        ({"attempts": 2}, "b: rule 6: completed at attempt 2, which never started"),
        ({"starts": ((1, at(20)), (2, at(21)))}, "b: rule 6: attempt(s) [2] started, past its 1"),
        ({"waiting_for": -1}, "b: rule 6: waiting_for -1"),
        ({"waiting_for": 1}, "b: rule 6: released with waiting_for 1"),
    ],
)
def test_rule_6_attempts_starts_and_counts(changes: dict[str, Any], breach: str) -> None:
    assert breach in breaches_of("b", **changes)


def test_rule_6_repeated_starts_of_one_attempt_are_sound() -> None:
    assert breaches_of("b", starts=((1, at(20)), (1, at(22)))) == []


def test_rule_6_a_step_cancelled_upstream_after_an_attempt() -> None:
    assert breaches_of("e", attempts=1) == ["e: rule 6: cancelled upstream after 1 attempt(s)"]
