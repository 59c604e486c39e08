"""``ctx.set_progress()`` and ``ctx.set_meta()`` with no database: the checks at the call, the
context made without a worker, and the coordinator's coalescing (fake lanes and clock)."""

from __future__ import annotations

import enum
import logging
import math
import uuid
from typing import Any

import psycopg
import pytest

from django_pgoutbox.context import JobContext, ProgressNote
from django_pgoutbox.errors import InvalidProgress
from django_pgoutbox.models import JobStatus
from django_pgoutbox.progress import MAX_META_BYTES, MAX_PROGRESS_MESSAGE, check_progress
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.execute import Outcome
from django_pgoutbox.worker.mailbox import PROGRESS, REPLY, STARTED
from django_pgoutbox.worker.progress import PROGRESS_INTERVAL, WriteProgress
from tests.unit.fakes import Harness, claim_row


def context(report: Any = None) -> JobContext:
    logger = logging.LoggerAdapter(logging.getLogger("tests"), {})
    return JobContext(uuid.uuid4(), "tests.progress", 1, None, "default", logger, report=report)


class Seven(enum.IntEnum):
    SEVEN = 7


class TestChecks:
    @pytest.mark.parametrize(
        ("done", "total", "message", "expected"),
        [
            (0, None, None, (0, None, None)),
            (3, 10, "copying", (3, 10, "copying")),
            (2.5, 4, None, (2.5, 4, None)),
            (Seven.SEVEN, 7.0, "é" * MAX_PROGRESS_MESSAGE, (7, 7.0, "é" * MAX_PROGRESS_MESSAGE)),
            (5, 5, "", (5, 5, "")),
        ],
    )
    def test_values_kept(self, done: Any, total: Any, message: Any, expected: Any) -> None:
        checked = check_progress(done, total, message)
        assert checked == expected
        assert type(checked[0]) in (int, float)  # an IntEnum is written as its number

    @pytest.mark.parametrize(
        ("done", "total", "message", "error", "names"),
        [
            ("3", None, None, TypeError, "done"),
            (True, None, None, TypeError, "done"),
            (None, None, None, TypeError, "done"),
            (1, "10", None, TypeError, "total"),
            (1, None, 42, TypeError, "message"),
            (-1, None, None, InvalidProgress, "done"),
            (math.nan, None, None, InvalidProgress, "done"),
            (math.inf, None, None, InvalidProgress, "done"),
            (1, math.nan, None, InvalidProgress, "total"),
            (2**63, None, None, InvalidProgress, "done"),
            pytest.param(10**5000, None, None, InvalidProgress, "done", id="5001-digits"),
            (5, 4, None, InvalidProgress, "total"),
            (1, None, "x" * (MAX_PROGRESS_MESSAGE + 1), InvalidProgress, "message"),
            (1, None, "a\x00b", InvalidProgress, "message"),
            (1, None, "\ud800", InvalidProgress, "message"),
        ],
    )
    def test_values_refused_at_the_call(
        self, done: Any, total: Any, message: Any, error: type[Exception], names: str
    ) -> None:
        ctx = context(report=lambda note: pytest.fail("nothing is posted"))
        with pytest.raises(error, match=names):
            ctx.set_progress(done, total, message)
        assert ctx.progress is None

    def test_invalid_progress_is_a_value_error(self) -> None:
        assert issubclass(InvalidProgress, ValueError)

    @pytest.mark.parametrize(
        ("values", "names"),
        [
            ({"ratio": math.nan}, "ratio"),
            ({"when": object()}, "when"),
            ({"nested": {"deep": [1, {"x": math.inf}]}}, "nested"),
            ({"bad\x00key": 1}, "bad"),
            ({"text": "a\x00"}, "text"),
            ({"big": "x" * MAX_META_BYTES}, r"set_meta\(big\).*65,536"),
            pytest.param({"huge": 10**5000}, "set_meta", id="5001-digits"),
        ],
    )
    def test_meta_refused_at_the_call_keeps_the_earlier_values(
        self, values: dict[str, Any], names: str
    ) -> None:
        posted: list[ProgressNote] = []
        ctx = context(report=posted.append)
        ctx.set_meta(rows=1)
        with pytest.raises(InvalidProgress, match=names):
            ctx.set_meta(**values)
        assert ctx.meta == {"rows": 1}
        assert posted[0].latest == (None, '{"rows":1}')

    def test_meta_that_refers_to_itself_is_refused(self) -> None:
        loop: list[Any] = []
        loop.append(loop)
        ctx = context()
        with pytest.raises(InvalidProgress, match="loop"):
            ctx.set_meta(loop=loop)

    def test_meta_too_large_only_as_a_whole(self) -> None:
        ctx = context()
        half = "x" * (MAX_META_BYTES // 2)
        ctx.set_meta(a=half)
        with pytest.raises(InvalidProgress, match="over the limit"):
            ctx.set_meta(b=half)
        ctx.set_meta(a="small", b=half)  # replacing a key frees its room
        assert set(ctx.meta) == {"a", "b"}


class TestContextWithoutWorker:
    def test_values_are_kept_on_the_context(self) -> None:
        ctx = context()
        assert (ctx.progress, ctx.meta) == (None, {})
        ctx.set_progress(1, 4)
        ctx.set_progress(2, 4, "half")
        ctx.set_meta(rows=10)
        ctx.set_meta(source="s3", rows=12)
        ctx.set_meta()  # nothing to set: nothing changes
        assert ctx.progress == {"done": 2, "total": 4, "message": "half"}
        assert ctx.meta == {"rows": 12, "source": "s3"}
        assert ctx._reported() == ((2, 4, "half"), '{"rows":12,"source":"s3"}')

    def test_meta_is_a_copy(self) -> None:
        ctx = context()
        ctx.set_meta(rows=1)
        ctx.meta["rows"] = 2
        assert ctx.meta == {"rows": 1}


class TestContextInAWorker:
    def test_a_million_calls_post_one_note(self) -> None:
        posted: list[ProgressNote] = []
        ctx = context(report=posted.append)
        for done in range(1_000_000):
            ctx.set_progress(done, 1_000_000)
        ctx.set_meta(step="done")
        (note,) = posted
        assert note.latest == ((999_999, 1_000_000, None), '{"step":"done"}')


class TestCoalescing:
    """The coordinator writes the notes of its running attempts at most once a second, the
    values they hold then; the last ones go with the outcome."""

    def running(self, harness: Harness, count: int = 1) -> list[Any]:
        harness.start_up()
        attempts = harness.claim([claim_row() for _ in range(count)])
        for attempt in attempts:
            harness.threads.begin(attempt)
        harness.step()
        return attempts

    def note(self, harness: Harness, attempt: Any, done: int) -> ProgressNote:
        note = ProgressNote(attempt.key, ((done, 100, None), None))
        harness.runner._mailbox.post((PROGRESS, note), urgent=False)
        return note

    def test_one_write_a_second_with_the_last_value(self) -> None:
        harness = Harness()
        (attempt,) = self.running(harness)
        note = self.note(harness, attempt, 0)
        harness.step()
        (write,) = harness.sent(WriteProgress)
        assert write.rows == [(attempt.key, ((0, 100, None), None))]
        harness.answer(WriteProgress, [attempt.id])
        for done in range(1, 100_000):  # the handler's tight loop: no message, no write
            note.latest = ((done, 100_000, None), None)
        harness.step(0.5)
        assert harness.sent(WriteProgress) == []
        harness.step(PROGRESS_INTERVAL / 2)
        (write,) = harness.sent(WriteProgress)
        assert write.rows == [(attempt.key, ((99_999, 100_000, None), None))]
        harness.answer(WriteProgress, [attempt.id])
        harness.step(PROGRESS_INTERVAL)  # nothing changed since: nothing written
        assert harness.sent(WriteProgress) == []

    def test_deadline_wakes_the_coordinator_for_the_next_write(self) -> None:
        harness = Harness()
        (attempt,) = self.running(harness)
        note = self.note(harness, attempt, 0)
        harness.step()
        harness.answer(WriteProgress, [attempt.id])
        note.latest = ((1, 100, None), None)
        harness.step()
        assert harness.runner._next_deadline() == pytest.approx(
            harness.clock.now + PROGRESS_INTERVAL
        )

    def test_one_statement_for_every_running_attempt(self) -> None:
        harness = Harness()
        attempts = self.running(harness, 3)
        for index, attempt in enumerate(attempts):
            self.note(harness, attempt, index)
        harness.step()
        (write,) = harness.sent(WriteProgress)
        assert sorted(key for key, _ in write.rows) == sorted(a.key for a in attempts)

    def test_a_failed_write_goes_again(self) -> None:
        harness = Harness()
        (attempt,) = self.running(harness)
        self.note(harness, attempt, 5)
        harness.step()
        request = harness.lanes[0].sent.pop(0)
        lost = psycopg.OperationalError("the connection was lost")
        harness.lanes[0].mailbox.post((REPLY, 0, request, None, lost, False))
        harness.step()
        harness.step(PROGRESS_INTERVAL)  # past the lane's back-off
        (write,) = harness.sent(WriteProgress)
        assert write.rows == [(attempt.key, ((5, 100, None), None))]

    def test_a_finished_attempt_leaves_its_values_to_its_outcome(self) -> None:
        harness = Harness()
        (attempt,) = self.running(harness)
        note = self.note(harness, attempt, 1)
        harness.step()
        harness.answer(WriteProgress, [attempt.id])
        note.latest = ((2, 100, None), None)
        harness.threads.finish(attempt)
        harness.step(PROGRESS_INTERVAL)
        assert [r for r in harness.sent(RecordAndClaim) if r.batch]  # the outcome goes
        harness.answer(RecordAndClaim)
        harness.step(PROGRESS_INTERVAL)
        assert harness.sent(WriteProgress) == []
        assert harness.runner._reporting.notes == {}  # dropped at the next write's turn
        assert harness.runner._reporting.deadline() is None  # nothing more to wake for

    def test_a_note_posted_after_the_outcome_is_ignored(self) -> None:
        """A thread the handler started calls set_progress() after the handler returned."""
        harness = Harness()
        (attempt,) = self.running(harness)
        harness.threads.finish(attempt)
        harness.step()
        harness.answer(RecordAndClaim)
        self.note(harness, attempt, 1)
        harness.step(PROGRESS_INTERVAL)
        assert harness.sent(WriteProgress) == []
        assert harness.runner._reporting.notes == {}

    def test_a_timeout_outcome_carries_the_last_values(self) -> None:
        harness = Harness()
        (attempt,) = self.running(harness)
        harness.runner._mailbox.post((STARTED, attempt, harness.clock.now + 5.0), urgent=False)
        note = self.note(harness, attempt, 1)
        harness.step()
        harness.answer(WriteProgress, [attempt.id])
        note.latest = ((42, 100, "stuck"), '{"k":1}')
        harness.step(5.0)
        timeouts = [
            outcome
            for request in harness.sent(RecordAndClaim)
            for outcome in request.batch
            if outcome.timed_out
        ]
        (outcome,) = timeouts
        assert outcome.progress_json == '{"done":42,"total":100,"message":"stuck"}'
        assert outcome.meta_json == '{"k":1}'

    def test_plain_outcomes_carry_nothing(self) -> None:
        outcome = Outcome.completed(claim_job())
        assert (outcome.progress_json, outcome.meta_json) == (None, None)
        assert Outcome(claim_job(), JobStatus.DEAD).progress_json is None


def claim_job() -> Any:
    from django_pgoutbox.worker.attempt import Attempt

    return Attempt(claim_row()).bare_job()
