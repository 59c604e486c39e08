"""A second hostile pass over the coordinator: random interleavings of replies, lane errors,
handler events, timeouts, cancellations and a stop, with the queue's bookkeeping checked after
every turn; and the cases those walks (or a reading) turned up, each pinned alone."""

from __future__ import annotations

import os
import random
import threading

import psycopg
import pytest

from django_pgoutbox.models import JobStatus
from django_pgoutbox.worker.attempt import FINISHED, HELD, QUEUED, WRITING, Attempt
from django_pgoutbox.worker.claims import RecordAndClaim
from django_pgoutbox.worker.leases import GiveBack, MarkAlone, Renew, RenewalRequest
from django_pgoutbox.worker.mailbox import RENEW
from tests.unit.fakes import Harness, claim_row


def lost() -> psycopg.OperationalError:
    return psycopg.OperationalError("the connection was lost")


def sleeps(harness: Harness) -> float:
    return harness.runner._next_deadline() - harness.clock.now


class Walk:
    """One random walk: a coordinator, the world around it, and what it was told and did."""

    def __init__(self, seed: int, **settings: object) -> None:
        self.rng = random.Random(seed)
        self.harness = Harness(**settings)  # type: ignore[arg-type]
        self.fair = bool(settings.get("fair"))
        #: Keys whose outcome a successful write carried, and how many times.
        self.written: dict[object, int] = {}
        self.given_back: set[object] = set()
        self.stopped_at: int | None = None  # how many attempts were submitted at the stop
        self.stop_seen = False

    # -- the world -------------------------------------------------------------------------------

    def answer_lane(self, index: int) -> None:
        h, rng = self.harness, self.rng
        lane = h.lanes[index]
        request = lane.sent[0]
        if rng.random() < 0.15:
            lane.reply(error=lost())
            return
        if isinstance(request, RecordAndClaim):
            n = rng.randint(0, request.limit) if request.limit else 0
            request.rows = [claim_row(suspect=rng.random() < 0.1) for _ in range(n)]
            for outcome in request.batch:
                key = (outcome.job.id, outcome.job.attempt)
                self.written[key] = self.written.get(key, 0) + 1
            lane.reply()
        elif isinstance(request, Renew):
            held = {key[0]: rng.random() < 0.1 for key in request.keys if rng.random() < 0.95}
            lane.reply(held)
        elif isinstance(request, MarkAlone):
            lane.reply(rng.random() < 0.9)
        elif isinstance(request, GiveBack):
            self.given_back.update(request.keys)
            lane.reply(len(request.keys))
        else:
            lane.reply(None)

    def act(self) -> None:
        h, rng = self.harness, self.rng
        threads = h.threads
        choice = rng.random()
        busy = [i for i, lane in enumerate(h.lanes) if lane.sent]
        if choice < 0.35 and busy:
            self.answer_lane(rng.choice(busy))
        elif choice < 0.5 and threads.waiting:
            attempt = threads.waiting[0]
            deadline = h.clock.now + rng.choice([0.5, 5.0]) if rng.random() < 0.3 else None
            threads.begin(attempt, deadline)
        elif choice < 0.65 and threads.running:
            attempt = rng.choice(threads.running)
            threads.finish(attempt, rng.choice([JobStatus.COMPLETED, JobStatus.RETRYING]))
        elif choice < 0.67 and threads.running:
            threads.lose(rng.choice(threads.running), thread_died=rng.random() < 0.5)
        elif choice < 0.72:
            h.runner.wake()
        elif choice < 0.75:
            h.runner.check_cancellations()
        elif choice < 0.78 and threads.running:
            attempt = rng.choice(threads.running)
            h.runner._mailbox.post((RENEW, RenewalRequest(attempt.key, threading.Event())))
        elif choice < 0.80 and not self.stop_seen and rng.random() < 0.3:
            h.runner.stop()
            self.stop_seen = True
        else:
            h.clock.now += rng.choice([0.001, 0.01, 0.3, 2.0, 11.0])

    # -- what must hold after every turn ---------------------------------------------------------

    def check(self) -> None:
        h = self.harness
        runner, state = h.runner, h.runner._state
        attempts = list(state.attempts.values())
        assert state.queued == sum(a.state in (QUEUED, HELD) for a in attempts)
        assert state.writing == sum(a.state == WRITING for a in attempts)
        claims = [r for lane in h.lanes for r in lane.sent if isinstance(r, RecordAndClaim)]
        assert state.reserved == sum(r.limit for r in claims)
        assert state.claims_in_flight == sum(1 for r in claims if r.limit)
        if self.fair:
            assert state.claims_in_flight <= 1, "a fair queue with two claims in flight"
        for index, lane in enumerate(h.lanes):
            assert len(lane.sent) <= 1, f"lane {index} was sent two requests at once"
            assert (runner._lanes.in_flight[index] is None) == (not lane.sent)
        # One outcome in flight per attempt at most.
        keys = [(o.job.id, o.job.attempt) for r in claims for o in r.batch]
        assert len(keys) == len(set(keys)), "one attempt's outcome in two statements"
        assert all(count == 1 for count in self.written.values()), "an outcome written twice"
        # No row in two statements at once that lock many rows each (a renewal and an outcome
        # write, or a give-back): they would deadlock in PostgreSQL.
        renewed = {
            key for lane in h.lanes for r in lane.sent if isinstance(r, Renew) for key in r.keys
        }
        given = {
            key for lane in h.lanes for r in lane.sent if isinstance(r, GiveBack) for key in r.keys
        }
        assert not renewed & set(keys), "a renewal beside the write of the same attempt"
        assert not renewed & given, "a renewal beside the give-back of the same attempt"
        # Outcomes are held back only behind a renewal in flight, and only its own attempts'.
        renewals = [r for lane in h.lanes for r in lane.sent if isinstance(r, Renew)]
        if not renewals:
            assert not state.renewing, "a renewal answered and still counted as in flight"
            assert not state.held_back, "outcomes held back behind no renewal"
        assert all(a.slot in state.renewing for _, a in state.held_back)
        for attempt in attempts:
            assert attempt.state in (QUEUED, HELD, FINISHED, WRITING)
        if self.stop_seen and runner._stopping:
            if self.stopped_at is None:
                self.stopped_at = len(h.threads.submitted)
            started = h.threads.submitted[self.stopped_at :]
            # After the stop, only a held suspect whose cancellation was asked may be handed on.
            assert all(a.cancel.is_set() for a in started), "an attempt started after the stop"
        if not runner._done and not runner._mailbox._items:
            assert sleeps(h) > 0, f"the coordinator would spin ({sleeps(h)})"

    def run(self, steps: int) -> None:
        h = self.harness
        h.step()
        for _ in range(steps):
            if h.runner._done:
                break
            self.act()
            h.step()
            self.check()
        self.finish()

    def finish(self) -> None:
        """Stop, then let everything answer: the coordinator must end, with every attempt it
        holds written, given back or released."""
        h = self.harness
        h.runner.stop()
        self.stop_seen = True
        for _ in range(2000):
            h.step()
            self.check()
            if h.runner._done:
                break
            busy = [i for i, lane in enumerate(h.lanes) if lane.sent]
            if busy:
                self.answer_lane(busy[0])
            elif h.threads.running:
                h.threads.finish(h.threads.running[0])
            elif h.threads.waiting:
                h.threads.begin(h.threads.waiting[0])
            else:
                h.clock.now += 1.0
        else:
            pytest.fail("the coordinator never ended after its stop")
        state = h.runner._state
        if not h.runner._giving_up:
            assert not state.outcomes
            assert not state.held_back
            assert not state.to_unclaim


SETTINGS = [
    {"connections": 1, "concurrency": 1},
    {"connections": 2, "concurrency": 2},
    {"connections": 2, "concurrency": 3, "prefetch": 4},
    {"connections": 2, "concurrency": 2, "fair": True},
    {"connections": 1, "concurrency": 2, "max_running": 3},
]


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
@pytest.mark.parametrize("seed", range(int(os.environ.get("PGOUTBOX_WALKS", "40"))))
def test_random_walks_keep_the_books(settings: dict[str, object], seed: int) -> None:
    Walk(seed, poll_interval=1.0, **settings).run(300)


class FailingRenewals(Walk):
    """A walk in which every renewal fails (a statement_timeout on a row another session
    keeps locked), while every other statement goes through."""

    def answer_lane(self, index: int) -> None:
        lane = self.harness.lanes[index]
        if isinstance(lane.sent[0], Renew):
            lane.reply(error=psycopg.errors.QueryCanceled("canceling statement: timeout"))
        else:
            super().answer_lane(index)

    def drain(self) -> None:
        """No handler returns any more: every outcome that came must be written, however
        often the renewals fail."""
        h = self.harness
        for _ in range(400):
            if h.runner._done:
                return
            for index, lane in enumerate(h.lanes):
                if lane.sent:
                    self.answer_lane(index)
            h.step(0.3)
            self.check()
        state = h.runner._state
        assert not state.outcomes, "outcomes never written"
        assert not state.held_back, "outcomes held back for ever"


@pytest.mark.parametrize(
    "settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
@pytest.mark.parametrize("seed", range(int(os.environ.get("PGOUTBOX_WALKS", "40")) // 4))
def test_renewals_that_keep_failing_hold_no_outcome_back_for_ever(
    settings: dict[str, object], seed: int
) -> None:
    walk = FailingRenewals(seed, poll_interval=1.0, **settings)
    h = walk.harness
    h.step()
    for _ in range(150):
        if h.runner._done:
            break
        walk.act()
        h.step()
        walk.check()
    walk.drain()


def held_suspect(harness: Harness) -> Attempt:
    """Claim one suspect: it is held, and (nothing else running) MARK_ALONE goes."""
    harness.start_up()
    harness.answer(RecordAndClaim, rows=[claim_row(suspect=True)])
    harness.step()
    (attempt,) = list(harness.runner._state.attempts.values())
    assert harness.runner._suspects.held is attempt
    assert harness.sent(MarkAlone)
    return attempt


class TestSuspectsAtTheStop:
    def test_a_stop_during_mark_alone_does_not_start_the_suspect(self) -> None:
        """The stop comes while MARK_ALONE is in flight: its reply must not start the suspect
        (nothing starts once stopping); it is given back unstarted, as a held one is."""
        harness = Harness()
        attempt = held_suspect(harness)
        harness.runner.stop()
        harness.step()
        harness.answer(MarkAlone, True)
        harness.step()
        assert attempt not in harness.threads.submitted
        (give_back,) = harness.sent(GiveBack)
        assert give_back.keys == [attempt.key]
        harness.answer(GiveBack, 1)
        harness.step()
        assert harness.runner.snapshot().ended
        assert harness.runner._suspects.gate.take(), "the process's token was kept"

    def test_a_mark_alone_that_failed_does_not_keep_the_token(self) -> None:
        """MARK_ALONE lost with its connection, then the stop: the suspect is given back, and
        the process's token is free for another queue's suspect (not held until this queue's
        loop ends, which a hung handler can make last the grace period)."""
        harness = Harness(connections=1)
        held_suspect(harness)
        harness.lanes[0].reply(error=lost())
        harness.step()
        harness.runner.stop()
        harness.step()
        assert harness.runner._suspects.gate.take(), "the process's token was kept"


def test_a_stop_beside_a_fair_claim_stuck_on_the_lock_keeps_its_grace_period() -> None:
    """A fair queue's claim waits on the queue's lock (another session holds it) when the stop
    comes. Its second lane is free: the outcome of the job that finished is written there, and
    at the end of the grace period the job still running is released, rather than both wait
    for as long as the lock is held."""
    harness = Harness(fair=True, concurrency=3)
    harness.start_up()
    done, running = harness.claim([claim_row(), claim_row()])
    harness.threads.begin(running)
    harness.runner.wake()  # a notification: a claim for the free thread, stuck on the lock
    harness.step()
    (claim,) = harness.sent(RecordAndClaim)
    assert claim.limit == 1
    harness.threads.finish(done)
    harness.step()
    harness.runner.stop()
    harness.step()
    (write,) = harness.sent(RecordAndClaim, lane=1) or [None]
    assert write is not None, "the outcome waits behind the stuck claim"
    assert [o.job.id for o in write.batch] == [done.id]
    harness.answer(RecordAndClaim, lane=1)
    harness.step(harness.runner.grace_period)
    for _ in range(3):  # a renewal may go first
        if harness.sent(GiveBack, lane=1):
            break
        harness.answer(Renew, {running.id: False}, lane=1)
        harness.step()
    (release,) = harness.sent(GiveBack, lane=1)
    assert release.keys == [running.key]


def test_a_statement_that_never_returns_does_not_hold_the_worker_past_its_grace() -> None:
    """A fair claim stuck on the queue's lock (another session holds it) when the grace period
    ends: it is cancelled, its claim rolled back, and the coordinator ends."""
    harness = Harness(fair=True, concurrency=3)
    harness.start_up()
    (running,) = harness.claim([claim_row()])
    harness.threads.begin(running)
    harness.runner.wake()
    harness.step()
    assert harness.sent(RecordAndClaim)  # stuck on the queue's lock, never answered
    harness.runner.stop()
    harness.step()
    for _ in range(10):
        harness.step(harness.runner.grace_period)
        for request in list(harness.lanes[1].sent):
            harness.lanes[1].reply(len(request.keys) if isinstance(request, GiveBack) else {})
        harness.step()
    assert harness.runner.snapshot().ended
