"""The management commands: argument validation and the demo."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_pgoutbox.models import Job, JobStatus


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be at least 1"),
        (["--concurrency", "many"], "is not an integer"),
        (["--grace-period", "-1"], "must be >= 0"),
        (["--queues", ","], "expected comma-separated queue names"),
        (["--queues", "nope"], "unknown queue(s) 'nope'"),
        (
            [
                "--exclude-queues",
                "default,critical_alerts,notifications,webhooks,location_derivation,"
                "reports,exports,maintenance",
            ],
            "no queue left to run",
        ),
    ],
)
def test_runworkers_rejects_bad_arguments(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("runworkers", *args)


@pytest.mark.django_db(transaction=True)  # the demo's worker threads must see its commits
def test_demo_runs_the_batch_to_the_end() -> None:
    out = StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    assert "0 job(s) still open" in text
    assert "Outbox: 6 of 6 facts projected" in text
    demo_jobs = Job.objects.exclude(job_type__startswith="pgoutbox.")  # not the maintenance
    counts = {s: demo_jobs.filter(status=s).count() for s in JobStatus.values}
    # 126 jobs enqueued, plus a notification and a report for each of 3 completed sessions.
    assert counts == {
        "pending": 0,
        "leased": 0,
        "retrying": 0,
        "completed": 131,
        "dead": 1,
        "cancelled": 0,
    }
    assert Job.objects.get(status="dead").job_type == "demo.export"
    assert (
        Job.objects.filter(attempts=2, status="completed").count() == 6
    )  # five flaky notifications, one throttled webhook
