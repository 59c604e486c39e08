"""What the testing helpers return and raise, with no database: ``JobRun``, ``RunSummary``
(its counts and a repr bounded for a failed assertion), ``AttemptFailed``,
``DrainLimitExceeded``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from django_pgoutbox.testing.outcomes import (
    SHOWN,
    AttemptFailed,
    DrainLimitExceeded,
    JobRun,
    RunSummary,
    SubscriberFailed,
    SubscriberFailure,
)


def run(status: str = "completed", **fields: Any) -> JobRun:
    values: dict[str, Any] = {
        "job_id": uuid.uuid4(),
        "job_type": "shop.send_receipt",
        "queue": "notifications",
        "attempt": 1,
        "payload": {"order": 1},
        "status": status,
        **fields,
    }
    return JobRun(**values)


def test_a_run_says_what_became_of_its_attempt() -> None:
    done = run(result_json='{"sent": 1}')
    assert done.result == {"sent": 1}
    assert not done.failed
    assert str(done) == "shop.send_receipt [notifications] attempt 1: completed"
    failed = run("retrying", code="TransientError", summary="TransientError: later", delay=2.0)
    assert failed.failed
    assert str(failed).endswith("retrying (TransientError: later)")
    assert run("dead", code="timeout", summary="ran past 5s").reason == "timeout: ran past 5s"
    snoozed = run("retrying", code="snoozed", summary="snoozed for 5s", snoozed=True)
    assert not snoozed.failed
    assert str(snoozed).endswith(": snoozed")
    assert run().result is None


def test_the_error_is_kept_but_not_compared_nor_shown() -> None:
    error = ValueError("x")
    first = run("dead", error=error)
    assert first.error is error
    assert "ValueError" not in repr(first)
    assert first == JobRun(**{**first.__dict__, "error": None})


def test_a_summary_counts_by_outcome() -> None:
    summary = RunSummary(
        [
            run(),
            run(),
            run("retrying", code="E"),
            run("retrying", code="snoozed", snoozed=True),
            run("dead", code="E"),
            run("cancelled", code="Revoked"),
        ]
    )
    assert summary.counts == {
        "completed": 2,
        "retrying": 1,
        "snoozed": 1,
        "dead": 1,
        "cancelled": 1,
    }
    assert (summary.completed, summary.retried, summary.snoozed) == (2, 1, 1)
    assert (summary.dead, summary.cancelled, len(summary)) == (1, 1, 6)
    assert [r.status for r in summary.failures] == ["retrying", "dead", "cancelled"]
    assert summary.job_types == ["shop.send_receipt"] * 6


def test_a_summarys_repr_is_bounded() -> None:
    empty = RunSummary()
    assert repr(empty) == "<RunSummary 0 attempt(s)>"
    many = RunSummary([run("dead", code="E", summary="s" * 10) for _ in range(SHOWN + 4)])
    many.events, many.paused, many.held_back = 2, {"reports", "default"}, {"api", "mail"}
    text = repr(many)
    assert text.startswith(f"<RunSummary {SHOWN + 4} attempt(s): {SHOWN + 4} dead")
    assert "2 event(s) projected; paused: default, reports" in text
    assert (
        "; jobs due but not claimed (MAX_RUNNING, RATE_LIMIT, other types first): api, mail;"
        in (text)
    )
    assert text.count("[notifications]") == SHOWN
    assert text.endswith("and 4 more>")


def test_attempt_failed_names_the_job_and_how_to_get_the_outcome() -> None:
    failed = run("dead", code="PermanentError", summary="PermanentError: no such order")
    error = AttemptFailed(failed)
    assert isinstance(error, AssertionError)
    assert error.run is failed
    message = str(error)
    assert f"job {failed.job_id} (shop.send_receipt) attempt 1 ended dead" in message
    assert "PermanentError: no such order" in message
    assert "payload: {'order': 1}" in message
    assert "raise_on_failure=False" in message


def test_drain_limit_names_the_busiest_job_types() -> None:
    summary = RunSummary([run(job_type="a")] * 5 + [run(job_type="b")] * 2)
    error = DrainLimitExceeded(7, "attempts", summary)
    assert "stopped after 7 attempts" in str(error)
    assert "a (5 attempts), b (2 attempts)" in str(error)
    assert error.summary is summary
    with pytest.raises(AssertionError):
        raise error


def test_subscriber_failures_are_listed() -> None:
    failures = [
        SubscriberFailure(
            "shop.project", "order.placed", uuid.uuid4(), "ValueError", "ValueError: x", False
        ),
        SubscriberFailure(
            "shop.v1_only", "order.placed", uuid.uuid4(), "unsupported_schema_version", None, True
        ),
    ]
    assert str(failures[0]) == "shop.project on order.placed (to be retried): ValueError: x"
    assert str(failures[1]) == "shop.v1_only on order.placed (dead): unsupported_schema_version"
    error = SubscriberFailed(failures)
    assert isinstance(error, AssertionError)
    assert str(error).startswith(
        "2 subscriber(s) failed on the events projected:\n  - shop.project"
    )
    summary = RunSummary(subscriber_failures=failures[:1])
    assert repr(summary) == (
        "<RunSummary 0 attempt(s); subscribers failed: shop.project on order.placed (to be "
        "retried): ValueError: x>"
    )
