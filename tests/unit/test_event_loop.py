"""A queue's event loop (``worker.coroutines``) driven directly, no database: its slots, what it
posts, and a loop that a coroutine blocks, left behind for a fresh one."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.coroutines import Coroutines, stall_after
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.mailbox import BEAT, ENDED, RETURNED, Mailbox
from tests.unit.fakes import Harness, claim_row


def _messages(mailbox: Mailbox, kind: str, count: int, timeout: float = 5.0) -> list[Any]:
    """Wait until ``count`` messages of ``kind`` came; return them (the others are dropped)."""
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(found) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} {kind} messages"
        found += [message for message in mailbox.wait(0.05) if message[0] == kind]
    return found


def test_at_most_capacity_coroutines_run_at_once() -> None:
    in_flight, highest = 0, 0

    async def run(attempt: Attempt) -> Outcome:
        nonlocal in_flight, highest
        in_flight += 1
        highest = max(highest, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return Outcome.completed(attempt.bare_job())

    mailbox = Mailbox()
    coroutines = Coroutines("default", 3, run, mailbox, lease_seconds=60)
    attempts = [Attempt(claim_row()) for _ in range(10)]
    for attempt in attempts:
        coroutines.submit(attempt, time.monotonic())
    coroutines.flush()
    ended = _messages(mailbox, ENDED, 10)
    for _, loop, attempt, outcome in ended:
        coroutines.ended(loop, attempt, time.monotonic())
        assert outcome.job.id == attempt.id
    assert highest == 3
    assert not coroutines.on_loop
    assert coroutines.loop is not None
    assert coroutines.loop.name == "pgoutbox-default-loop-1"
    coroutines.shutdown()


def test_attempts_not_started_come_back() -> None:
    release = threading.Event()

    async def run(attempt: Attempt) -> Outcome:
        while not release.is_set():
            await asyncio.sleep(0.01)
        return Outcome.completed(attempt.bare_job())

    mailbox = Mailbox()
    coroutines = Coroutines("default", 2, run, mailbox, lease_seconds=60)
    attempts = [Attempt(claim_row()) for _ in range(5)]
    for attempt in attempts:
        coroutines.submit(attempt, time.monotonic())
    coroutines.flush()
    assert coroutines.take_waiting() == []  # all sent: the loop gives back what it holds
    ((_, loop, given),) = _messages(mailbox, RETURNED, 1)
    assert [a.id for a in coroutines.returned(loop, given)] == [a.id for a in attempts[2:]]
    release.set()
    assert len(_messages(mailbox, ENDED, 2)) == 2
    coroutines.shutdown()


def test_a_blocked_loop_is_left_behind_and_a_fresh_one_runs_the_next() -> None:
    blocked = threading.Event()

    async def run(attempt: Attempt) -> Outcome:
        if not blocked.is_set():
            blocked.set()
            time.sleep(2)  # holds the loop's thread: no beat, no other coroutine
        await asyncio.sleep(0)
        return Outcome.completed(attempt.bare_job())

    mailbox = Mailbox()
    coroutines = Coroutines("default", 10, run, mailbox, lease_seconds=1)
    assert coroutines.stall_after == stall_after(1) == 1.0
    first = [Attempt(claim_row()) for _ in range(3)]
    started = time.monotonic()
    for attempt in first:
        coroutines.submit(attempt, started)
    coroutines.flush()
    assert blocked.wait(5)
    assert coroutines.stalled(started + 0.5) == []
    assert coroutines.deadline() == started + 1.0
    left = coroutines.stalled(started + 1.0)
    assert {a.id for a in left} == {a.id for a in first}
    assert coroutines.loop is None
    assert coroutines.deadline() is None
    after = Attempt(claim_row())
    coroutines.submit(after, time.monotonic())
    coroutines.flush()
    assert coroutines.loop is not None
    assert coroutines.loop.name == "pgoutbox-default-loop-2"
    ended = _messages(mailbox, ENDED, 1)
    fresh = [message for message in ended if message[2] is after]
    assert fresh
    assert fresh[0][1] is coroutines.loop
    coroutines.shutdown()


def test_a_loop_with_work_beats() -> None:
    async def run(attempt: Attempt) -> Outcome:
        await asyncio.sleep(0.6)
        return Outcome.completed(attempt.bare_job())

    mailbox = Mailbox()
    coroutines = Coroutines("default", 10, run, mailbox, lease_seconds=60)
    coroutines.submit(Attempt(claim_row()), time.monotonic())
    coroutines.flush()
    ((_, loop),) = _messages(mailbox, BEAT, 1)
    assert coroutines.heard_from(loop, 123.0)
    assert coroutines.heard == 123.0
    coroutines.shutdown()


def _async_row() -> Any:
    return claim_row()._replace(job_type="tests.async_noop")


def test_the_claims_count_the_coroutine_slots_from_the_first_async_attempt() -> None:
    """A queue claims for its threads until it runs an ``async def`` handler; from then on for
    its threads and its coroutine slots. Its threads are not handed the async attempt, whose
    outcome comes from the loop as a thread's would."""
    harness = Harness(concurrency=4, async_concurrency=10)
    harness.start_up()
    (claim,) = [request for request in harness.sent(RecordAndClaim) if request.limit]
    assert claim.limit == 4
    harness.answer(RecordAndClaim, rows=[_async_row()])
    harness.step()
    assert harness.threads.submitted == []
    (again,) = [request for request in harness.sent(RecordAndClaim) if request.limit]
    assert again.limit == 4 + 10 - 1  # the async attempt holds one of the slots
    deadline = time.monotonic() + 5
    while harness.runner.snapshot().outcomes_waiting == 0:
        assert time.monotonic() < deadline, "the coroutine's outcome never came"
        time.sleep(0.01)
        harness.step()
    harness.runner._coroutines.shutdown()


def test_a_loop_left_behind_counts_as_an_abandoned_thread_while_blocked() -> None:
    """``runworkers --max-abandoned-threads`` counts a loop left behind while a coroutine still
    blocks its thread (a blocker on every attempt leaks one each time), and no longer once
    the thread ended."""
    release = threading.Event()

    async def run(attempt: Attempt) -> Outcome:
        release.wait(10)  # holds the loop's thread
        return Outcome.completed(attempt.bare_job())

    mailbox = Mailbox()
    coroutines = Coroutines("default", 10, run, mailbox, lease_seconds=1)
    started = time.monotonic()
    coroutines.submit(Attempt(claim_row()), started)
    coroutines.flush()
    assert coroutines.left_behind() == 0
    assert len(coroutines.stalled(started + 1.0)) == 1
    assert coroutines.left_behind() == 1
    release.set()
    deadline = time.monotonic() + 5
    while coroutines.left_behind():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    coroutines.shutdown()
