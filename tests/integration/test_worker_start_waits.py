"""``runworkers`` at start: the database that answered its migrations check refuses the next
connection, the one that takes the worker id (a restart, or ``max_connections`` reached by
another client in between). The start waits for it as for the first, instead of a traceback."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError

from django_pgoutbox.models import ScheduleCursor
from django_pgoutbox.worker import worker_ids

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refusal_when_taking_the_worker_id_is_waited_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    take = worker_ids.take
    refusals: list[str] = []

    def refused_twice(params: Any, using: str) -> None:
        if len(refusals) < 2:
            refusals.append(using)
            raise OperationalError("connection failed: FATAL:  sorry, too many clients already")
        take(params, using)

    monkeypatch.setattr(worker_ids, "take", refused_twice)
    # At its end, runworkers leaves with os._exit(0) when daemon threads are alive (this
    # process has some): here it must return to the test.
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    call_command(
        "runworkers", "--burst", "--roles", "scheduler", "--worker-id", "start-waits", "-v", "0"
    )
    assert len(refusals) == 2
    warnings = [r.getMessage() for r in caplog.records if "unavailable at start" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "too many clients" in warnings[0]
    assert ScheduleCursor.objects.exists()  # the scheduler ran its turn
