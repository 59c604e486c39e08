"""Fakes for driving a queue's coordinator with no database and no threads: lanes that keep
what they are sent until the test answers, handler threads that keep what they are given, and
a clock the test moves. The coordinator runs one turn at each ``QueueRunner.step()``."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from django_pgoutbox.conf import get_settings
from django_pgoutbox.models import JobStatus
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.worker.attempt import Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.controls import ReadControl
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.leases import Recover
from django_pgoutbox.worker.mailbox import FINISHED, LOST, REPLY, STARTED, Mailbox
from django_pgoutbox.worker.runner import QueueRunner

WORKER = "w-unit"
#: A queue with no row in ``queue_controls``: not paused, nothing set at run time.
NO_ROW = Control()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeLane:
    def __init__(self, index: int, mailbox: Mailbox) -> None:
        self.index = index
        self.mailbox = mailbox
        self.sent: list[Any] = []  # requests not answered yet, oldest first
        self.cancel_asked = False

    def start(self) -> None:
        pass

    def send(self, request: Any) -> None:
        self.sent.append(request)

    def stop(self, timeout: float | None = None) -> None:
        pass

    def cancel(self) -> None:
        """Ask for the statement in flight to be cancelled: at the next ``Harness.step()`` it
        fails with query_canceled, as the server would answer."""
        self.cancel_asked = True

    def answer_cancellation(self) -> None:
        if self.cancel_asked and self.sent:
            self.reply(error=psycopg.errors.QueryCanceled("canceling statement: user request"))
        self.cancel_asked = False

    def reply(self, result: Any = None, *, error: BaseException | None = None) -> Any:
        """Answer the oldest request: with ``result`` (a RecordAndClaim answers itself)."""
        request = self.sent.pop(0)
        if isinstance(request, RecordAndClaim) and result is None and error is None:
            request.written = request.batch
            request.applied = [o.job.id for o in request.batch]
            result = request
        if isinstance(request, ReadControl) and result is None and error is None:
            result = Control()  # the queue's row: none (not paused, nothing set at run time)
        if isinstance(request, Recover) and request.control is not None and error is None:
            request.read = request.read or Control()  # (its read of the queue's row, as above)
        self.mailbox.post((REPLY, self.index, request, result, error, True))
        return request


class FakeHandlers:
    def __init__(self, size: int, mailbox: Mailbox, run: Any) -> None:
        self.mailbox = mailbox
        self.run = run
        self.submitted: list[Attempt] = []  # every attempt ever submitted, in order
        self.waiting: list[Attempt] = []  # submitted, not yet taken by a "thread"
        self.running: list[Attempt] = []
        self.added = self.retired = 0

    def start(self) -> None:
        pass

    def submit(self, attempt: Attempt) -> None:
        self.submitted.append(attempt)
        self.waiting.append(attempt)

    def take_waiting(self) -> list[Attempt]:
        taken, self.waiting = self.waiting, []
        return taken

    def add_thread(self) -> None:
        self.added += 1

    def retire_thread(self) -> None:
        self.retired += 1

    def shutdown(self) -> None:
        pass

    # -- what a handler thread would post --------------------------------------------------------

    def begin(self, attempt: Attempt, deadline: float | None = None) -> None:
        self.waiting.remove(attempt)
        self.running.append(attempt)
        if deadline is not None:
            self.mailbox.post((STARTED, attempt, deadline), urgent=False)

    def finish(self, attempt: Attempt, status: JobStatus = JobStatus.COMPLETED) -> Outcome:
        if attempt in self.waiting:
            self.begin(attempt)
        self.running.remove(attempt)
        outcome = Outcome(attempt.bare_job(), status)
        self.mailbox.post((FINISHED, attempt, outcome), urgent=True)
        return outcome

    def lose(self, attempt: Attempt, *, thread_died: bool = False) -> None:
        self.running.remove(attempt)
        self.mailbox.post((LOST, attempt, thread_died))


def claim_row(*, suspect: bool = False, attempt: int = 1) -> ClaimRow:
    return ClaimRow(
        id=uuid.uuid4(),
        job_type="tests.noop",
        payload="{}",
        attempt=attempt,
        max_attempts=3,
        organization_id=None,
        queue="default",
        priority=0,
        created_at=datetime.now(UTC),
        waited=0.0,
        worker_ids=json.dumps([WORKER]),
        suspect=suspect,
    )


class Harness:
    """A coordinator of the default queue with fake lanes, handler threads and clock."""

    def __init__(
        self, *, lane_class: Any = None, control: Control | None = NO_ROW, **overrides: Any
    ) -> None:
        """``lane_class``: a FakeLane subclass for the lanes. ``control``: the queue's row of
        ``queue_controls`` as read at start (by default none: not paused, nothing set at run
        time); None: the coordinator's first turn reads it."""
        conf = get_settings()
        settings = dataclasses.replace(
            conf.queues["default"],
            **{"lease_seconds": 30.0, "poll_interval": 100.0, "prefetch": 0, **overrides},
        )
        self.clock = Clock()
        self.lanes: list[FakeLane] = []
        self.handlers: FakeHandlers | None = None

        def lane(index: int, mailbox: Mailbox) -> FakeLane:
            self.lanes.append((lane_class or FakeLane)(index, mailbox))
            return self.lanes[-1]

        def handlers(size: int, mailbox: Mailbox, run: Any) -> FakeHandlers:
            self.handlers = FakeHandlers(size, mailbox, run)
            return self.handlers

        self.runner = QueueRunner(
            settings,
            worker_id=WORKER,
            using="default",
            policy=conf.retry,
            concurrency=settings.concurrency,
            clock=self.clock,
            lane=lane,
            handlers=handlers,
            control=control,
        )
        assert self.handlers is not None
        self.threads: FakeHandlers = self.handlers

    def step(self, seconds: float = 0.0) -> None:
        self.clock.now += seconds
        for lane in self.lanes:
            lane.answer_cancellation()
        self.runner.step()

    def sent(self, kind: type, lane: int = 0) -> list[Any]:
        return [r for r in self.lanes[lane].sent if isinstance(r, kind)]

    def answer(self, kind: type, result: Any = None, *, lane: int = 0, **fields: Any) -> Any:
        """Answer the oldest request on ``lane``, which must be a ``kind``."""
        request = self.lanes[lane].sent[0]
        assert isinstance(request, kind), (request, kind)
        for name, value in fields.items():
            setattr(request, name, value)
        return self.lanes[lane].reply(result)

    def start_up(self) -> None:
        """The first turn: recovery is sent; answer it (an empty queue)."""
        from django_pgoutbox.worker.leases import Recover

        self.step()
        self.answer(Recover)
        self.step()

    def claim(self, rows: list[ClaimRow], lane: int = 0) -> list[Attempt]:
        """Answer the claim in flight on ``lane`` with ``rows``; the attempts submitted."""
        before = len(self.threads.submitted)
        self.answer(RecordAndClaim, lane=lane, rows=rows)
        self.step()
        return self.threads.submitted[before:]
