"""Three scheduler processes on one schedule: each slot once, none missed when one is killed.

transaction=True: the schedulers are other processes and see only committed rows.
"""

from __future__ import annotations

import signal
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from django_pgoutbox.models import Job, ScheduleCursor
from tests.processes import holds_for, scaled, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TICK = {"JOB": "tests.noop", "EVERY": 1}
ONLY_TICK = {
    "SCHEDULES": {
        "tick": TICK,
        "pgoutbox.prune": None,
        "pgoutbox.recover_leases": None,
        "pgoutbox.reconcile_outbox": None,
    }
}
SLOTS = 20


def tick_slots() -> list[tuple[datetime, datetime]]:
    """(slot, created_at) of every job the schedule enqueued, in slot order."""
    rows = Job.objects.filter(idempotency_key__startswith="schedule:tick:").values_list(
        "idempotency_key", "created_at"
    )
    return sorted(
        (datetime.fromisoformat((key or "").split(":", 2)[2]), created) for key, created in rows
    )


def test_three_schedulers_enqueue_every_slot_exactly_once(start_worker: Any) -> None:
    # CATCH_UP "all": a stall of the loaded machine past a slot (which "latest" skips, by
    # design) must not read as a slot missed.
    settings = {"SCHEDULES": {**ONLY_TICK["SCHEDULES"], "tick": {**TICK, "CATCH_UP": "all"}}}
    schedulers = [start_worker("--roles", "scheduler", **settings) for _ in range(3)]
    wait_for(lambda: ScheduleCursor.objects.filter(name="tick").exists(), timeout=30)
    started_at = ScheduleCursor.objects.get(name="tick").last_slot_at
    assert started_at is not None

    wait_for(lambda: len(tick_slots()) >= SLOTS // 2, timeout=60, interval=0.2)
    schedulers[0].kill()  # mid-run: the other two carry on
    wait_for(lambda: len(tick_slots()) >= SLOTS, timeout=60, interval=0.2)
    for survivor in schedulers[1:]:
        survivor.signal(signal.SIGTERM)
        assert survivor.wait(timeout=15) == 0

    slots = tick_slots()
    times = [slot for slot, _ in slots]
    assert len(times) == len(set(times))  # each slot once
    assert times[0] == started_at + timedelta(seconds=1)  # the first slot after start-up
    gaps = [b - a for a, b in pairwise(times)]
    assert set(gaps) == {timedelta(seconds=1)}, gaps  # no slot missed, the kill included
    lateness = [(created - slot).total_seconds() for slot, created in slots]
    # Enqueued about on time by whichever replica (the figure is printed; the bound is loose:
    # a loaded machine's stalls are no scheduler's fault).
    assert max(lateness) < scaled(3.0), max(lateness)
    latest_ms = max(lateness) * 1000
    print(f"\n{len(times)} slots, each once; latest enqueue {latest_ms:.0f} ms after its slot")


def test_scheduler_down_catches_up_by_its_policy(start_worker: Any) -> None:
    settings = {
        "SCHEDULES": {
            **ONLY_TICK["SCHEDULES"],
            "tick": {"JOB": "tests.noop", "EVERY": 1, "CATCH_UP": "all"},
        }
    }
    first = start_worker("--roles", "scheduler", **settings)
    wait_for(lambda: len(tick_slots()) >= 2, timeout=30, interval=0.2)
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0
    enqueued = len(tick_slots())
    holds_for(lambda: len(tick_slots()) == enqueued, 10)  # ten slots pass, no scheduler running
    second = start_worker("--roles", "scheduler", **settings)
    wait_for(lambda: len(tick_slots()) >= 14, timeout=30, interval=0.2)
    second.signal(signal.SIGTERM)
    second.wait(timeout=15)
    times = [slot for slot, _ in tick_slots()]
    gaps = {b - a for a, b in pairwise(times)}
    assert gaps == {timedelta(seconds=1)}  # CATCH_UP "all": the missed slots were enqueued too
