"""One queue's loop: claim jobs in batches, run them on handler threads, record outcomes.

Each queue of a worker process has its own ``QueueRunner``: its own dispatcher thread with its own
database connection, and its own handler threads. A queue of slow reports therefore holds only its
own threads and its own connection, and can never delay the claims of ``critical_alerts``.

The dispatcher is the only thread that talks to the database about leases. It uses a psycopg
connection of its own (not Django's), with server-side parameters, so that its statements are sent
with their arrays bound, not spelled out, and the claim is prepared once (those that join arrays
to the leased rows are planned each time: see ``_UNPREPARED``). Each turn of its loop:

1. renews the leases of running attempts, in one statement, when a third of the lease is gone;
2. recovers this queue's expired leases, once per poll interval;
3. writes the outcomes that handlers produced since the last turn and claims as many jobs as
   there are free handler threads, plus a prefetch that follows the queue's pace (about a tenth
   of a second of work, at most ``PREFETCH``): both in one statement, one round trip;
4. waits until the threads run short of work, a notification arrives, the outcomes have waited a
   few milliseconds, or the poll interval passes.

No transaction is open while a handler runs: the claim commits before the handler starts, and
the outcome is written in a later, separate statement.

A queue with FAIR, MAX_RUNNING or RATE_LIMIT writes outcomes and claims in two steps instead: the
claim runs in a short transaction under the queue's advisory lock, so that its limits hold across
every worker (see ``queries.CLAIM_LOCK``). The dispatcher also fails attempts that run past their
job type's ``timeout`` (thread isolation), and passes cancellation requests, which it learns of at
each lease renewal, on to the handlers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue as queue_module
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import DatabaseError, connections

from django_pgoutbox import health, metrics, queries
from django_pgoutbox.conf import QueueSettings, RetrySettings
from django_pgoutbox.context import CancelFlag
from django_pgoutbox.db import ErrorKind, classify_error, dispatcher_connection_params
from django_pgoutbox.errors import JobTimeout, LeaseLost
from django_pgoutbox.maintenance import recover_expired_leases
from django_pgoutbox.models import JobStatus
from django_pgoutbox.registry import get_job
from django_pgoutbox.retry import backoff, bound, decide, summarize
from django_pgoutbox.worker.execute import ClaimedJob, Outcome, execute

logger = logging.getLogger("django_pgoutbox.worker")

#: Renew a running attempt's lease when this fraction of it has passed.
RENEW_FRACTION = 1 / 3

#: Back-off bounds (seconds) after a database error in the dispatcher.
ERROR_BACKOFF = (0.2, 10.0)

#: Outcomes wait at most this long (seconds) to be written with others in one statement.
FLUSH_DELAY = 0.005
#: ... or until this many have gathered.
FLUSH_SIZE = 500
#: The prefetch aims at this many seconds of work, at the queue's recent pace.
PREFETCH_SECONDS = 0.1
#: The pace is measured over windows of this many seconds (the first one a quarter as long).
PACE_WINDOW = 0.2

#: The dispatcher's statements with binary parameters (``%b``): psycopg then sends its arrays
#: without quoting each element in Python. It has a connection of its own with server-side
#: parameters; Django's cursors (which the tests use with the same statements) take ``%s`` only.
_BINARY = {
    name: getattr(queries, name).replace("%s", "%b")
    for name in (
        "RECORD_AND_CLAIM",
        "RECORD_OUTCOMES",
        "CLAIM_JOBS",
        "RENEW_LEASES",
        "UNCLAIM_JOBS",
        "RELEASE_JOBS",
    )
}

#: Statements that join an array of (id, attempt) pairs to this worker's leased rows: never
#: prepared, so that each is planned knowing how many pairs it carries. A prepared statement
#: runs, after five executions, a generic plan if that looks no dearer; for these the generic
#: plan took this worker's leased rows (estimated at one, from ``jobs_leased_idx``) as the outer
#: side of a nested loop and read the whole array again for each row: with 2,000 running jobs,
#: a lease renewal took 0.64 s instead of 10 ms, and an outcome write 1.4 s instead of 15 ms
#: (``python benchmarks/plans.py``). Planning costs a fraction of a millisecond per statement,
#: and each carries a batch.
_UNPREPARED = {
    "RECORD_AND_CLAIM",
    "RECORD_OUTCOMES",
    "RENEW_LEASES",
    "UNCLAIM_JOBS",
    "RELEASE_JOBS",
}


def _execute(cursor: psycopg.Cursor[Any], name: str, params: list[Any]) -> None:
    """Run the dispatcher's statement ``name``: prepared, unless it is one of ``_UNPREPARED``."""
    cursor.execute(_BINARY[name], params, prepare=False if name in _UNPREPARED else None)


#: Errors of a statement; ``db.classify_error`` says what each means (never its class here:
#: ``ProgramLimitExceeded``, a value too large, is a psycopg ``OperationalError``).
STATEMENT_ERRORS = (DatabaseError, psycopg.Error)

#: Error codes of the outcomes that the worker writes when it cannot write the attempt's own
#: (docs/workers.md, "When the worker itself fails").
WORKER_ERROR = "worker_error"
UNREADABLE_JOB = "unreadable_job"
UNWRITABLE_OUTCOME = "unwritable_outcome"


#: The longest wait (seconds) before a rate-limited queue looks for new tokens.
RATE_LIMIT_RETRY_CAP = 1.0

#: A running attempt's key: the job and its attempt number (the fencing token).
Key = tuple[uuid.UUID, int]


def _retried_kind(error: BaseException) -> ErrorKind:
    """CONNECTION or CONFLICT, which the dispatcher waits out and retries; re-raise the rest.

    A DATA error of the outcome writes is handled where it happens (``_write_one_by_one``);
    one anywhere else, like OTHER, is a bug or a schema the worker does not expect: the loop
    stops, and the worker with it, rather than send the same statement forever.
    """
    kind = classify_error(error)
    if kind in (ErrorKind.CONNECTION, ErrorKind.CONFLICT):
        return kind
    raise error


class _Running:
    """One claimed attempt, from its claim to its outcome's write (a slotted class: one is made
    for every job claimed)."""

    __slots__ = (
        "_job",
        "attempt",
        "cancel",
        "deadline",
        "finished",
        "id",
        "lease_lost",
        "row",
        "worker_ids",
    )

    def __init__(self, row: tuple[Any, ...], worker_ids: tuple[str, ...] | None = None) -> None:
        self.id: uuid.UUID = row[0]
        self.attempt: int = row[3]
        #: The claim's row; the handler's thread turns it into a ClaimedJob (parsing the payload
        #: off the dispatcher's thread).
        self.row = row
        #: The attempt's worker_ids when the row's are this worker's alone (no JSON to parse).
        self.worker_ids = worker_ids
        self._job: ClaimedJob | None = None
        #: Set when the job's cancellation was requested; the handler's ctx reads it.
        self.cancel = CancelFlag()
        #: When the dispatcher fails the attempt for its timeout (monotonic); thread isolation
        #: only. Set when the handler starts: a prefetched job waits without its clock running.
        self.deadline: float | None = None
        self.lease_lost = False
        #: Its handler returned: its outcome waits to be written, or is being written.
        self.finished = False

    @property
    def job(self) -> ClaimedJob:
        if self._job is None:
            row = self.row
            payload = row[2]
            self._job = ClaimedJob.from_claim(
                row[0],
                row[1],
                # An empty payload, the commonest, without the JSON decoder's two calls.
                {} if payload == "{}" else json.loads(payload),
                row[3],
                row[4],
                row[5],
                row[6],
                row[7],
                row[8],
                row[9],
                self.worker_ids if self.worker_ids is not None else json.loads(row[10]),
            )
        return self._job

    def bare_job(self) -> ClaimedJob:
        """The attempt's job with neither its payload nor its worker_ids parsed: for the
        outcome of an attempt whose row could not be turned into a job (``job`` raised)."""
        row = self.row
        return ClaimedJob.from_claim(
            row[0], row[1], {}, row[3], row[4], row[5], row[6], row[7], row[8], row[9], ()
        )


@dataclass
class _RenewalRequest:
    key: Key
    done: threading.Event = field(default_factory=threading.Event)
    held: bool = False


class _HandlerThreads:
    """A set of daemon threads running handlers, fed by a queue of claimed jobs.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not hold the process open at exit: once
    the grace period is over and the unfinished jobs are released, a hung handler must not keep
    the worker alive.
    """

    def __init__(self, size: int, name: str, run: Any, lost: Any) -> None:
        self._name = name
        self._run = run  # called with each entry taken from the queue
        #: Called with an entry that ``run`` left without an outcome, and whether its thread
        #: is dying (the entry is None when a thread died between two entries).
        self._lost = lost
        self._tasks: queue_module.SimpleQueue[_Running | None] = queue_module.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{index}", daemon=True)
            for index in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, entry: _Running) -> None:
        self._tasks.put(entry)

    def waiting(self) -> int:
        """Claimed jobs that no thread has taken yet (approximate, as any queue size)."""
        return self._tasks.qsize()

    def take_waiting(self) -> list[_Running]:
        """Take back the jobs that no thread has started (at shutdown)."""
        taken: list[_Running] = []
        retirements = 0
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue_module.Empty:
                break
            if item is None:
                retirements += 1
            else:
                taken.append(item)
        for _ in range(retirements):
            self._tasks.put(None)
        return taken

    def add_thread(self) -> None:
        """Start one more thread, in place of one that a timed-out handler still occupies."""
        thread = threading.Thread(
            target=self._work, name=f"{self._name}+{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def retire_thread(self) -> None:
        """Let one idle thread end: a timed-out handler returned, its thread is free again."""
        self._tasks.put(None)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)

    def _work(self) -> None:
        entry: _Running | None = None
        retired = False
        try:
            while (entry := self._tasks.get()) is not None:
                try:
                    self._run(entry)
                except BaseException:
                    logger.exception("%s: running a job failed in the worker", self._name)
                if not entry.finished:
                    self._lost(entry, False)
                entry = None
            retired = True
        finally:
            if not retired:  # the thread dies: the dispatcher starts another in its place
                self._lost(entry, True)


class _Connection:
    """A dispatcher's own psycopg connection (autocommit): opened on first use and after errors."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._db: psycopg.Connection[Any] | None = None

    @property
    def opened(self) -> bool:
        return self._db is not None

    def get(self) -> psycopg.Connection[Any]:
        if self._db is None or self._db.closed:
            self._db = psycopg.connect(**dispatcher_connection_params(self.using), autocommit=True)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(psycopg.Error):  # closing a broken connection
                self._db.close()
            self._db = None


class _Helper:
    """One more dispatcher of a queue, with a connection of its own (``CONNECTIONS`` > 1).

    A drain of fast jobs waits on its statements: PostgreSQL writes the outcomes and leases
    the next jobs while the worker waits, then the worker hands them out while PostgreSQL
    waits. While the main dispatcher waits on one statement, a helper sends the next, with the
    outcomes written since and a claim for the threads that will be free: two backends work
    at once. It shares the runner's running attempts, outcomes and threads.
    """

    def __init__(self, runner: QueueRunner, index: int) -> None:
        self.runner = runner
        self.index = index
        self.wake = threading.Event()
        #: Whether it is waiting on a statement now.
        self.sending = False
        #: Set when it should end (the runner stops, or a burst is over).
        self.done = False
        #: Statements it sent (for tests and the curious).
        self.turns = 0
        self.thread: threading.Thread | None = None
        #: Opened the first time it sends: an idle queue has none.
        self.connection = _Connection(runner.using)

    def start(self) -> None:
        self.done = False
        self.thread = threading.Thread(
            target=self.runner._help,
            args=(self,),
            name=f"pgoutbox-dispatch-{self.runner.queue}-{self.index}",
            daemon=True,
        )
        self.thread.start()


class AloneGate:
    """The one token of a worker process that lets a suspect run alone, passed from queue to
    queue: at most one queue holds it, and the holder alone owns it until it gives it back.

    The queues of one process share one gate, so that two suspects never run marked at once
    there (a crash would then count against both). The wake-ups are registered when the
    queues are made, before any thread runs, and only read afterwards.
    """

    def __init__(self) -> None:
        self._token: queue_module.SimpleQueue[bool] = queue_module.SimpleQueue()
        self._token.put(True)
        self._wakes: list[Callable[[], None]] = []

    def register(self, wake: Callable[[], None]) -> None:
        self._wakes.append(wake)

    def take(self) -> bool:
        """Take the token if it is free; False when another queue holds it."""
        try:
            return self._token.get_nowait()
        except queue_module.Empty:
            return False

    def give_back(self) -> None:
        self._token.put(True)
        for wake in self._wakes:  # a queue may have a suspect waiting for it
            wake()


class QueueRunner:
    """Claims, runs and records the jobs of one queue."""

    def __init__(
        self,
        settings: QueueSettings,
        *,
        worker_id: str,
        using: str,
        policy: RetrySettings,
        concurrency: int | None = None,
        burst: bool = False,
        grace_period: float = 30.0,
        gate: AloneGate | None = None,
    ) -> None:
        self.queue = settings.name
        self.settings = settings
        self.worker_id = worker_id
        self.using = using
        self.policy = policy
        self.concurrency = concurrency or settings.concurrency
        self.burst = burst
        self.grace_period = grace_period
        self.lease_seconds = settings.lease_seconds
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._outcomes: deque[Outcome] = deque()
        self._renewals: deque[_RenewalRequest] = deque()
        self._running: dict[Key, _Running] = {}
        #: The running attempts with a deadline (a timeout under thread isolation), added by
        #: their handler threads: the dispatcher looks at these at every turn, not at every
        #: claimed job.
        self._timed: dict[Key, _Running] = {}
        #: Attempts failed for their timeout whose handler has not returned yet.
        self._abandoned: set[Key] = set()
        self._check_cancel = False
        #: Prefetch only where claims are not shaped by fairness or limits: jobs held by one
        #: worker would count against a cap, or skip the organizations' turns.
        self._prefetch_max = 0 if (settings.fair or settings.limited) else settings.prefetch
        self._pace = 0.0  # completions per second, smoothed
        #: Wake the dispatcher to claim more once fewer jobs than this wait for a thread.
        self._low_water = self.concurrency
        self._pace_count = 0
        self._pace_since = time.monotonic()
        self._db = _Connection(using)
        #: Held while a dispatcher reads or changes ``_running``, ``_timed``, ``_abandoned``,
        #: ``_reserved`` or the pace: a queue with more than one connection has a dispatcher
        #: thread on each (see ``_Helper``).
        self._lock = threading.Lock()
        #: Jobs asked for by claims still in flight: counted as busy by the other dispatchers.
        self._reserved = 0
        #: Outcomes being written by statements in flight (their attempts no longer hold a
        #: thread, but are still in ``_running`` until written).
        self._writing = 0
        #: Whether the main dispatcher is waiting on a statement now.
        self._sending = False
        #: The queue's other connections. A fair or limited queue claims under its lock: one.
        lanes = 1 if (settings.fair or settings.limited) else settings.connections
        self._helpers = [_Helper(self, index) for index in range(1, lanes)]
        self._helper_error: BaseException | None = None
        #: A claim's worker_ids text when this worker ran every attempt (the first, usually),
        #: and the value it stands for.
        self._own_worker_ids = (json.dumps([worker_id]), (worker_id,))
        #: Attempts that their handler thread left without an outcome, posted by that thread
        #: with whether it died: the dispatcher stops renewing them (see ``_forget_lost``).
        self._lost: deque[tuple[_Running | None, bool]] = deque()
        #: Whether this queue is stuck, as the dispatcher last told the heartbeat row (None:
        #: not told yet); see ``_publish_health``.
        self._published_stuck: bool | None = False
        #: The suspect claimed and held back (one at most): a job lost with its worker twice in
        #: a row, to run alone (see ``_start_alone``). While one is held, or runs alone
        #: (``_alone``), the queue claims nothing. Under ``_lock``.
        self._held: _Running | None = None
        #: The suspect started alone, until it ends or ``_alone_until`` (monotonic) passes:
        #: the queue claims nothing meanwhile, and holds the process's gate.
        self._alone: _Running | None = None
        self._alone_until = 0.0
        #: When the suspect held began to wait for the queue's other attempts to end.
        self._suspect_since = 0.0
        #: Suspects claimed while one is held or runs alone: given back at once, for another
        #: worker to run alone meanwhile. Under ``_lock``.
        self._give_back: list[_Running] = []
        self._gate = gate or AloneGate()
        self._gate.register(self.wake)
        self._has_token = False  # this queue holds the gate's token (the dispatcher's own)
        self._threads = _HandlerThreads(
            self.concurrency, f"pgoutbox-{self.queue}", self._run_attempt, self._post_lost
        )
        self.finished = threading.Event()

    # -- called from other threads ---------------------------------------------------------------

    def wake(self) -> None:
        """New work may exist (a notification, a reconnect): claim now instead of at the poll."""
        self._wake.set()

    def stop(self) -> None:
        """Stop claiming; let running attempts finish within the grace period."""
        self._stopping.set()
        self._wake.set()
        for helper in self._helpers:
            helper.wake.set()

    def check_cancellations(self) -> None:
        """A running job of this queue was asked to stop: look at the running jobs now."""
        self._check_cancel = True
        self._wake.set()

    def renew(self, key: Key) -> None:
        """Renew one attempt's lease now (``ctx.renew_lease()``); raise ``LeaseLost`` if gone."""
        request = _RenewalRequest(key)
        self._renewals.append(request)
        self._wake.set()
        if not request.done.wait(timeout=self.lease_seconds):
            raise TimeoutError(f"the lease of job {key[0]} could not be renewed in time")
        if not request.held:
            raise LeaseLost(f"the lease of job {key[0]} was lost; its outcome will be discarded")

    # -- the dispatcher --------------------------------------------------------------------------

    def run(self) -> None:
        """The dispatcher loop; returns when stopped (or, in burst mode, when nothing is due)."""
        renew_every = self.lease_seconds * RENEW_FRACTION
        next_renewal = time.monotonic() + renew_every
        next_recovery = 0.0
        next_poll = 0.0
        stop_deadline: float | None = None
        flush_at: float | None = None  # when the outcomes waiting now must be written
        pause = ERROR_BACKOFF[0]
        try:
            for helper in self._helpers:
                helper.start()
            while True:
                self._wake.clear()
                if self._helper_error is not None:
                    raise self._helper_error
                now = time.monotonic()
                if self._outcomes and not self._stopping.is_set():
                    flush_at = flush_at or now + FLUSH_DELAY
                    if self._gathering(now, flush_at):
                        # The threads have work: let more outcomes gather for one statement.
                        self._wake.wait(flush_at - now)
                        continue
                flush_at = None
                try:
                    if self._lost:
                        self._forget_lost()
                    if self._alone is not None:
                        self._end_alone(now)
                    if self._held is not None and not self._stopping.is_set():
                        self._start_alone(now)
                    self._expire_timeouts(now)
                    if self._published_stuck != self._stuck():
                        self._publish_health()
                    if (
                        self._renewals
                        or (self._check_cancel and self._running)
                        or (self._running and now >= next_renewal)
                    ):
                        self._check_cancel = False
                        self._renew_leases()
                        next_renewal = now + renew_every
                    if now >= next_recovery:
                        recover_expired_leases(self.queue, connection=self._connection())
                        next_recovery = now + self.settings.poll_interval
                    if self._stopping.is_set():
                        # A helper's claim in flight lands before the waiting jobs are given back.
                        self._join_helpers()
                        self._unclaim_waiting()
                        self._record_and_claim(claim=False)
                        stop_deadline = stop_deadline or now + self.grace_period
                        if not self._running:
                            return
                        if now >= stop_deadline:
                            self._release_unfinished()
                            return
                    else:
                        claimed, requested, retry_in = self._record_and_claim(claim=True)
                        if requested:
                            next_poll = now + min(self.settings.poll_interval, retry_in)
                        throttled = retry_in != math.inf
                        if (
                            self.burst
                            and not claimed
                            and not self._running
                            and not self._reserved
                            and not throttled
                        ):
                            return
                        if requested and len(claimed) == requested:
                            continue  # the queue may hold more: fill the threads that free up
                        if claimed and self._held is not None:
                            continue  # a suspect held: it may start now
                    pause = ERROR_BACKOFF[0]
                except STATEMENT_ERRORS as error:
                    kind = _retried_kind(error)
                    logger.warning(
                        "queue %s: %s (%s); retrying in %.1fs",
                        self.queue,
                        "database unavailable" if kind is ErrorKind.CONNECTION else "conflict",
                        error,
                        pause,
                        extra={"queue": self.queue},
                    )
                    if kind is ErrorKind.CONNECTION:
                        self._disconnect()
                    self._stopping.wait(pause)
                    pause = min(pause * 2, ERROR_BACKOFF[1])
                    continue
                deadlines = [next_poll, next_recovery]
                if self._running:
                    deadlines.append(next_renewal)
                    deadlines.extend(r.deadline for r in list(self._timed.values()) if r.deadline)
                if self._held is not None:
                    deadlines.append(self._suspect_since + self.lease_seconds)
                if self._alone is not None:
                    deadlines.append(self._alone_until)
                if stop_deadline is not None:
                    deadlines.append(stop_deadline)
                self._wake.wait(max(0.0, min(deadlines) - time.monotonic()))
        finally:
            if self._has_token:
                self._has_token = False
                self._gate.give_back()
            self._join_helpers()
            self._threads.shutdown()
            self._disconnect()
            connections[self.using].close()
            self.finished.set()

    def _gathering(self, now: float, flush_at: float) -> bool:
        """Whether the outcomes waiting now should wait for more, to go in one statement: for
        at most ``FLUSH_DELAY`` and ``FLUSH_SIZE``, while the threads have enough work."""
        return (
            now < flush_at
            and len(self._outcomes) < FLUSH_SIZE
            and self._threads.waiting() >= self._low_water
            and not self._renewals
        )

    def _wake_dispatcher(self) -> None:
        """Outcomes to write or threads short of work: wake a dispatcher that is free to send.

        The main one, unless it is waiting on a statement and a helper is not: then the helper
        sends the next statement while the first is still in flight.
        """
        if self._sending and not self._stopping.is_set():
            for helper in self._helpers:
                if not helper.sending:
                    if not helper.wake.is_set():  # setting it takes its lock: once is enough
                        helper.wake.set()
                    return
        if not self._wake.is_set():
            self._wake.set()

    def _help(self, helper: _Helper) -> None:
        """A helper's loop: when woken, write the outcomes and claim, on its own connection.

        Only the main dispatcher polls, listens, renews leases, recovers expired ones, fails
        timed-out attempts and shuts down: a helper sends statements while the main one is busy
        with its own, and an idle queue never wakes it.
        """
        pause = ERROR_BACKOFF[0]
        flush_at: float | None = None
        try:
            while True:
                helper.wake.wait(
                    None if flush_at is None else max(0.0, flush_at - time.monotonic())
                )
                helper.wake.clear()
                if self._stopping.is_set() or helper.done:
                    return
                now = time.monotonic()
                if self._outcomes:
                    flush_at = flush_at or now + FLUSH_DELAY
                    if self._gathering(now, flush_at):
                        continue
                flush_at = None
                try:
                    self._record_and_claim(claim=True, helper=helper)
                    pause = ERROR_BACKOFF[0]
                except STATEMENT_ERRORS as error:
                    kind = _retried_kind(error)
                    logger.warning(
                        "queue %s: %s on connection %d (%s); retrying in %.1fs",
                        self.queue,
                        "database unavailable" if kind is ErrorKind.CONNECTION else "conflict",
                        helper.index + 1,
                        error,
                        pause,
                        extra={"queue": self.queue},
                    )
                    if kind is ErrorKind.CONNECTION:
                        helper.connection.close()
                    self._stopping.wait(pause)
                    pause = min(pause * 2, ERROR_BACKOFF[1])
        except BaseException as error:
            # The main dispatcher raises it: the worker stops, as for its own errors.
            self._helper_error = error
            self._wake.set()
        finally:
            helper.connection.close()

    def _join_helpers(self) -> None:
        """Let the helpers finish the statement they are sending, and end."""
        for helper in self._helpers:
            helper.done = True
            helper.wake.set()
        for helper in self._helpers:
            if helper.thread is not None:
                helper.thread.join()

    def _connection(self) -> psycopg.Connection[Any]:
        """The main dispatcher's connection (autocommit), opened on first use and after errors."""
        return self._db.get()

    def _disconnect(self) -> None:
        self._db.close()

    def _record_and_claim(
        self, *, claim: bool, helper: _Helper | None = None
    ) -> tuple[list[_Running], int, float]:
        """Write the finished attempts' outcomes and, with ``claim``, fill the free threads.

        One statement either way (RECORD_AND_CLAIM when there is both to do), or, for a queue
        with limits or fairness, the outcomes then a claim under the queue's lock. Returns the
        jobs claimed, how many were asked for, and how soon (seconds) a claim that a limit cut
        short should be tried again (``inf`` when no limit did).
        """
        batch: list[Outcome] = []
        take = self._outcomes.popleft
        with contextlib.suppress(IndexError):  # another dispatcher may take the last one
            while True:
                batch.append(take())
        # Attempts with an outcome no longer hold a thread, though they are running until it
        # is written (a timed-out one is no longer counted as running).
        finishing = sum(1 for o in batch if not o.timed_out)
        limit = 0
        with self._lock:
            if claim and not self._holding_alone():
                busy = len(self._running) - self._writing - finishing - len(self._outcomes)
                limit = max(
                    0, self.concurrency + self._prefetch(len(batch)) - busy - self._reserved
                )
            if helper is not None and not limit and len(batch) < FLUSH_SIZE:
                # Nothing to claim: these outcomes go with the main dispatcher's next turn.
                self._pace_count -= len(batch)  # counted again then
                self._outcomes.extendleft(reversed(batch))
                self._wake.set()
                return [], 0, math.inf
            self._reserved += limit
            self._writing += finishing
        if not batch and not limit:
            return [], 0, math.inf
        outcome_params = self._outcome_params(batch)
        special = self.settings.fair or self.settings.limited
        claim_params: list[Any] = [self.queue, limit, self.worker_id, self.lease_seconds]
        applied: list[uuid.UUID] = []
        rows: list[tuple[Any, ...]] = []
        retry_in = math.inf
        started = time.perf_counter()
        if helper is None:
            self._sending = True
        else:
            helper.sending = True
            helper.turns += 1
        sent = batch
        try:
            connection = self._connection() if helper is None else helper.connection.get()
            with connection.cursor() as cursor:
                if batch and limit > 0 and not special:
                    try:
                        _execute(cursor, "RECORD_AND_CLAIM", outcome_params + claim_params)
                    except STATEMENT_ERRORS as error:
                        # Nothing of it was written, the claim neither: the outcomes one by
                        # one, then the claim, once.
                        batch, applied = self._write_one_by_one(cursor, batch, error)
                        _execute(cursor, "CLAIM_JOBS", claim_params)
                        rows = cursor.fetchall()
                    else:
                        for is_claim, *row in cursor.fetchall():
                            if is_claim:
                                rows.append(tuple(row))
                            else:
                                applied.append(row[0])
                else:
                    if batch:
                        try:
                            _execute(cursor, "RECORD_OUTCOMES", outcome_params)
                            applied = [row[0] for row in cursor.fetchall()]
                        except STATEMENT_ERRORS as error:
                            batch, applied = self._write_one_by_one(cursor, batch, error)
                    if limit > 0 and special:
                        rows, retry_in = self._claim_limited(limit)
                    elif limit > 0:
                        _execute(cursor, "CLAIM_JOBS", claim_params)
                        rows = cursor.fetchall()
        except STATEMENT_ERRORS:
            # Not written: keep them (and their leases, still renewed) for the next turn.
            self._outcomes.extendleft(reversed(sent))
            with self._lock:
                self._reserved -= limit
                self._writing -= finishing
            raise
        finally:
            if helper is None:
                self._sending = False
            else:
                helper.sending = False
        elapsed = time.perf_counter() - started
        metrics.BATCH_DB_DURATION.observe(elapsed, role="jobs")
        if limit > 0:
            metrics.CLAIM_DURATION.observe(elapsed, queue=self.queue)
        with self._lock:
            self._reserved -= limit
            self._writing -= finishing
            self._settle(batch, applied)
            claimed = self._start(rows)
            extra, self._give_back = self._give_back, []
        if extra:
            self._unclaim_suspects(connection, extra)
        return claimed, limit, retry_in

    def _unclaim_suspects(self, connection: psycopg.Connection[Any], extra: list[_Running]) -> None:
        """Give back the suspects claimed beyond the one this queue holds, attempt and all:
        another worker may run them alone meanwhile. Should this fail, their leases expire."""
        try:
            with connection.cursor() as cursor:
                _execute(
                    cursor,
                    "UNCLAIM_JOBS",
                    [[r.id for r in extra], [r.attempt for r in extra], self.worker_id],
                )
        except STATEMENT_ERRORS as error:
            logger.warning(
                "queue %s: %d suspect(s) claimed beyond the one held could not be given back "
                "(%s); their leases will expire",
                self.queue,
                len(extra),
                summarize(error),
                extra={"queue": self.queue},
            )

    def _outcome_params(self, batch: list[Outcome]) -> list[Any]:
        """RECORD_OUTCOMES's parameters for ``batch``."""
        return [
            [o.job.id for o in batch],
            [o.job.attempt for o in batch],
            ["snoozed" if o.snoozed else o.status.value for o in batch],
            [o.delay for o in batch],
            [o.code for o in batch],
            [o.summary for o in batch],
            [o.result_json for o in batch],
            self.worker_id,
        ]

    def _write_one_by_one(
        self, cursor: psycopg.Cursor[Any], batch: list[Outcome], error: BaseException
    ) -> tuple[list[Outcome], list[uuid.UUID]]:
        """After ``error`` failed the statement that carried ``batch``: if a value of it cannot
        be stored (a DATA error), write its outcomes one by one, so that only the attempt whose
        outcome PostgreSQL refuses loses it (``_unwritable``); else raise ``error`` again.

        Returns the outcomes written (the refused ones replaced) and the ids applied.
        """
        if classify_error(error) is not ErrorKind.DATA:
            raise error
        written: list[Outcome] = []
        applied: list[uuid.UUID] = []
        for outcome in batch:
            try:
                _execute(cursor, "RECORD_OUTCOMES", self._outcome_params([outcome]))
            except STATEMENT_ERRORS as row_error:
                if classify_error(row_error) is not ErrorKind.DATA:
                    raise
                outcome = self._unwritable(outcome, row_error)
                # Its code and summary are the worker's own, bounded: this one can be stored.
                _execute(cursor, "RECORD_OUTCOMES", self._outcome_params([outcome]))
            applied.extend(row[0] for row in cursor.fetchall())
            written.append(outcome)
        return written, applied

    def _unwritable(self, outcome: Outcome, error: BaseException) -> Outcome:
        """The dead letter in place of an outcome PostgreSQL refuses to store (its result or a
        delay out of range, say): written again it would fail again."""
        job = outcome.job
        summary = bound(
            f"the outcome of attempt {job.attempt} ({outcome.status.value}"
            f"{', ' + outcome.code if outcome.code else ''}) could not be stored, so its result "
            f"was dropped: {summarize(error)}"
        )
        logger.error(
            "job %s attempt %d: %s -> dead",
            job.id,
            job.attempt,
            summary,
            extra={
                "job_id": str(job.id),
                "job_type": job.job_type,
                "queue": self.queue,
                "attempt": job.attempt,
                "outcome": "dead",
                "error_code": UNWRITABLE_OUTCOME,
            },
        )
        return Outcome(
            job,
            JobStatus.DEAD,
            code=UNWRITABLE_OUTCOME,
            summary=summary,
            timed_out=outcome.timed_out,  # written by the dispatcher: its thread still runs
        )

    def _claim_limited(self, limit: int) -> tuple[list[tuple[Any, ...]], float]:
        """The claim of a queue with FAIR, MAX_RUNNING or RATE_LIMIT; see ``queries``.

        Returns the claimed rows and, when a limit cut the claim short, how soon to try again.
        """
        conf = self.settings
        per_org = conf.limit_by == "organization"
        rate = conf.rate_limit
        burst = max(1.0, rate or 0.0)
        retry_in = math.inf
        connection = self._connection()
        with connection.transaction(), connection.cursor() as cursor:
            if conf.limited:
                cursor.execute(queries.CLAIM_LOCK, [self.queue])
            wanted = limit
            if conf.limited and not per_org:
                cursor.execute(queries.QUEUE_ALLOWANCE, [self.queue, rate, burst, self.queue])
                running, tokens = cursor.fetchone() or (0, None)
                if conf.max_running is not None:
                    limit = min(limit, conf.max_running - running)
                if rate is not None:
                    available = burst if tokens is None else float(tokens)
                    limit = min(limit, math.floor(available))
                    if limit < wanted:
                        retry_in = min(RATE_LIMIT_RETRY_CAP, (1 - available % 1) / rate)
                if limit <= 0:
                    return [], min(retry_in, conf.poll_interval)
            if conf.fair or per_org:
                cursor.execute(queries.FAIR_PLAN)
                cursor.execute(
                    queries.FAIR_CLAIM if conf.fair else queries.ORGANIZATION_LIMITED_CLAIM,
                    {
                        "queue": self.queue,
                        "limit": limit,
                        "worker_id": self.worker_id,
                        "lease": self.lease_seconds,
                        "max_running": conf.max_running if per_org else None,
                        "rate": rate if per_org else None,
                        "burst": burst if per_org else None,
                    },
                )
            else:
                _execute(
                    cursor, "CLAIM_JOBS", [self.queue, limit, self.worker_id, self.lease_seconds]
                )
            rows = cursor.fetchall()
            if rate is not None and rows:
                counts: dict[str, int] = {}
                for row in rows:
                    key = self.queue
                    if per_org:
                        key = f"{self.queue}/{row[5] or 'none'}"
                    counts[key] = counts.get(key, 0) + 1
                cursor.execute(
                    queries.TAKE_TOKENS,
                    [burst, list(counts), list(counts.values()), rate, burst, burst],
                )
            if per_org and rate is not None and len(rows) < wanted:
                # Some organization may be out of tokens: look again when one may have refilled.
                retry_in = min(RATE_LIMIT_RETRY_CAP, 1 / rate)
        return rows, retry_in

    def _start(self, rows: list[tuple[Any, ...]]) -> list[_Running]:
        if rows:
            metrics.JOBS_CLAIMED.inc(len(rows), queue=self.queue)
        started = []
        own, alone = self._own_worker_ids
        for row in rows:
            # A first attempt's worker_ids are this worker's id alone: no JSON to parse.
            entry = _Running(row, alone if row[10] == own else None)
            key = (entry.id, entry.attempt)
            running = self._running.get(key)
            if running is not None:
                # Still running here: its lease expired (a stall past it) and was recovered,
                # its attempt given back, and this worker claimed it again. The run goes on
                # under the new lease; no second one starts.
                running.lease_lost = False
                logger.warning(
                    "job %s attempt %d: claimed again while its attempt still runs here; it "
                    "goes on under the new lease",
                    entry.id,
                    entry.attempt,
                    extra={"job_id": str(entry.id), "queue": self.queue},
                )
                continue
            if row[11]:  # a suspect: it waits to run alone, one at a time
                if self._held is not None or self._alone is not None:
                    self._give_back.append(entry)
                    continue
                self._suspect_since = time.monotonic()
                self._held = entry
            else:
                self._threads.submit(entry)
            self._running[key] = entry
            started.append(entry)
        return started

    def _holding_alone(self) -> bool:
        """Whether a suspect waits to run alone, or runs alone (under ``_lock``): then the
        queue claims nothing, so that nothing starts beside it."""
        return self._held is not None or self._alone is not None

    def _start_alone(self, now: float) -> None:
        """Start the suspect held, once nothing else of the queue runs in this worker and the
        process's gate is this queue's.

        A suspect is a job lost with its worker twice in a row (``lost_attempts`` >= 2):
        perhaps a neighbour killed the process, perhaps it did. Its attempts came back at the
        recoveries. MARK_ALONE writes in its row, before it starts, that this attempt counts
        should the process die now (RECOVER_EXPIRED_LEASES); it starts alone, and for a lease
        period nothing else starts in the queue, nor another suspect in the process: a crash
        then is its own, and costs the others nothing. Should the attempts beside it not end
        within a lease period (a handler longer than that), it is given back unstarted, its
        attempt with it, and claims resume: it runs alone later, here or in another worker.
        """
        with self._lock:
            entry = self._held
            if entry is None:
                return
            if entry.cancel.is_set():  # ends cancelled at once, without its handler
                self._held = None
                self._threads.submit(entry)
                return
            busy = sum(1 for e in self._running.values() if not e.finished and e is not entry)
            busy += self._reserved + len(self._abandoned)
        if busy and now < self._suspect_since + self.lease_seconds:
            return  # the dispatcher looks again when an attempt ends, or at that deadline
        if busy:
            self._unclaim_suspects(self._connection(), [entry])
            with self._lock:
                self._held = None
                self._running.pop((entry.id, entry.attempt), None)
            logger.warning(
                "job %s attempt %d: a suspect, given back unstarted: %d other attempt(s) did "
                "not end within %gs for it to run alone",
                entry.id,
                entry.attempt,
                busy,
                self.lease_seconds,
                extra={"job_id": str(entry.id), "queue": self.queue},
            )
            return
        if not self._has_token:
            if not self._gate.take():
                return  # another queue's suspect runs alone; its queue wakes this one after
            self._has_token = True
        with self._connection().cursor() as cursor:
            cursor.execute(queries.MARK_ALONE, [entry.id, entry.attempt, self.worker_id])
            held = cursor.fetchone() is not None
        with self._lock:
            self._held = None
            if held:
                self._alone, self._alone_until = entry, now + self.lease_seconds
            else:
                self._running.pop((entry.id, entry.attempt), None)
        fields = {"job_id": str(entry.id), "queue": self.queue}
        if not held:
            self._has_token = False
            self._gate.give_back()
            logger.warning(
                "job %s attempt %d: lease lost before it started; not run",
                entry.id,
                entry.attempt,
                extra=fields,
            )
            return
        logger.warning(
            "job %s attempt %d: lost with its worker twice in a row; it runs alone",
            entry.id,
            entry.attempt,
            extra=fields,
        )
        self._threads.submit(entry)

    def _end_alone(self, now: float) -> None:
        """The suspect running alone ended, or its lease period is over: claims resume, and
        the process's gate goes to the next queue with a suspect."""
        alone = self._alone
        assert alone is not None
        with self._lock:
            ended = alone.finished or self._running.get((alone.id, alone.attempt)) is not alone
            if not ended and now < self._alone_until:
                return
            self._alone = None
        if self._has_token:
            self._has_token = False
            self._gate.give_back()

    def _prefetch(self, finished: int) -> int:
        """How many jobs beyond the busy threads to claim now: about PREFETCH_SECONDS of work."""
        if not self._prefetch_max:
            return 0
        now = time.monotonic()
        self._pace_count += finished
        elapsed = now - self._pace_since
        # The first measure comes soon, so that a drain starts at its pace within a few turns;
        # later ones over longer windows, for a steadier figure.
        if elapsed >= (PACE_WINDOW if self._pace else PACE_WINDOW / 4):
            recent = self._pace_count / elapsed
            self._pace = recent if not self._pace else (self._pace + recent) / 2
            self._pace_count, self._pace_since = 0, now
        prefetch = min(self._prefetch_max, int(self._pace * PREFETCH_SECONDS))
        # Claim again while half the prefetch is still waiting, so that the threads never run
        # dry during the round trip.
        self._low_water = max(self.concurrency, prefetch // 2)
        return prefetch

    def _run_attempt(self, entry: _Running) -> None:
        """Run one claimed attempt on a handler thread and hand its outcome to the dispatcher.

        Every path ends in an outcome: should running the attempt fail in the worker itself
        (its row cannot be read, ``execute()`` raised), the outcome says so (``_worker_error``).
        """
        try:
            outcome = self._attempt(entry)
        except BaseException as error:
            outcome = self._worker_error(entry, error)
        entry.finished = True
        first = not self._outcomes
        self._outcomes.append(outcome)
        if first or self._threads.waiting() < self._low_water or self._stopping.is_set():
            self._wake_dispatcher()

    def _attempt(self, entry: _Running) -> Outcome:
        job = entry.job
        if entry.cancel.is_set():
            return Outcome(
                job,
                JobStatus.CANCELLED,
                code="cancelled",
                summary="cancelled before its handler started",
            )
        definition = get_job(job.job_type)
        if definition is not None and definition.timeout and definition.isolation == "thread":
            entry.deadline = time.monotonic() + definition.timeout
            self._timed[(entry.id, entry.attempt)] = entry
        return execute(
            job,
            policy=self.policy,
            renew=lambda: self.renew((job.id, job.attempt)),
            cancel=entry.cancel,
            using=self.using,
        )

    def _worker_error(self, entry: _Running, error: BaseException) -> Outcome:
        """The outcome of an attempt that failed in the worker rather than in its handler,
        built without calling anything of the job's (nor the error's ``__str__`` unguarded).

        A row that cannot be turned into a job (a payload nested deeper than Python's parser
        goes, say) reads the same way at every attempt: dead at once, code ``unreadable_job``,
        its payload intact for an operator. Anything else is ``worker_error``, retried with
        the policy's backoff until the attempts run out.
        """
        try:
            job = entry.job
            code = WORKER_ERROR
        except BaseException:
            job = entry.bare_job()
            code = UNREADABLE_JOB
        dead = code == UNREADABLE_JOB or job.attempt >= job.max_attempts
        status = JobStatus.DEAD if dead else JobStatus.RETRYING
        what = "could not read this job" if code == UNREADABLE_JOB else "failed to run this attempt"
        summary = bound(f"the worker {what} ({summarize(error)}); see the worker's log")
        fields = {"job_id": str(job.id), "queue": self.queue, "error_code": code}
        try:
            logger.error(
                "job %s attempt %d: %s -> %s",
                job.id,
                job.attempt,
                summary,
                status.value,
                exc_info=error,
                extra=fields,
            )
        except BaseException:  # a traceback that cannot be formatted (its __class__ raises)
            logger.error(
                "job %s attempt %d: %s -> %s (its traceback could not be formatted)",
                job.id,
                job.attempt,
                summary,
                status.value,
                extra=fields,
            )
        delay = 0.0 if dead else backoff(job.attempt, self.policy)
        return Outcome(job, status, delay=delay, code=code, summary=summary)

    def _stuck(self) -> bool:
        """Whether every handler thread of the queue is held by an attempt that outlived its
        timeout: the queue runs on replacement threads, one more for each hung attempt."""
        return len(self._abandoned) >= self.concurrency

    def _publish_health(self) -> None:
        """Tell this worker's heartbeat row whether the queue is stuck (``/pgoutbox/health``
        reads it): one statement when that changes, none otherwise."""
        stuck = self._stuck()
        if stuck:
            logger.error(
                "queue %s: all %d handler threads are held by attempts that outlived their "
                "timeout; reported unhealthy until they return",
                self.queue,
                self.concurrency,
                extra={"queue": self.queue},
            )
        health.publish_stuck(self._connection(), self.worker_id, self.queue, stuck)
        self._published_stuck = stuck

    def _post_lost(self, entry: _Running | None, thread_died: bool) -> None:
        """On a handler thread: ``entry`` has no outcome and never will; tell the dispatcher."""
        self._lost.append((entry, thread_died))
        self._wake.set()

    def _forget_lost(self) -> None:
        """The last resort, for attempts left without an outcome: stop renewing their leases,
        so that they expire and recovery takes them; free their slot; replace a dead thread."""
        while self._lost:
            entry, thread_died = self._lost.popleft()
            abandoned = False
            if entry is not None:
                key = (entry.id, entry.attempt)
                with self._lock:
                    if self._running.get(key) is entry:
                        del self._running[key]
                    self._timed.pop(key, None)
                    abandoned = key in self._abandoned
                    self._abandoned.discard(key)
                logger.error(
                    "job %s attempt %d: its handler thread %s without an outcome; its lease is "
                    "no longer renewed and will expire",
                    entry.id,
                    entry.attempt,
                    "died" if thread_died else "returned",
                    extra={"job_id": str(entry.id), "queue": self.queue, "outcome": "lost"},
                )
            if thread_died and not abandoned:
                logger.error("queue %s: a handler thread died; starting another", self.queue)
                self._threads.add_thread()
            elif abandoned and not thread_died:
                self._threads.retire_thread()  # its replacement can go, as in ``_settle``

    def _settle(self, batch: list[Outcome], applied: list[uuid.UUID]) -> None:
        """Forget the attempts of ``batch``; count what was written and what was fenced off.

        ``applied``: the ids the statement wrote. As many as the batch holds means every one
        (the ids written are among the batch's, each once), the common case: no set to build.
        """
        written = None if len(applied) == len(batch) else set(applied)
        counts: dict[tuple[str, str, str], int] = {}
        running, timed, abandoned = self._running, self._timed, self._abandoned
        for outcome in batch:
            job = outcome.job
            key = (job.id, job.attempt)
            late = False
            if not outcome.timed_out:
                running.pop(key, None)
                if timed:
                    timed.pop(key, None)
                if abandoned and key in abandoned:
                    # The handler of an attempt failed for its timeout returned at last: its
                    # thread is free again, and the replacement started meanwhile can go.
                    self._abandoned.discard(key)
                    self._threads.retire_thread()
                    late = True
            if written is None or job.id in written:
                labels = (self.queue, job.job_type, outcome.status.value)
                counts[labels] = counts.get(labels, 0) + 1
            else:
                metrics.STALE_OUTCOMES.inc(queue=self.queue)
                logger.warning(
                    "job %s attempt %d: outcome %s discarded, %s",
                    job.id,
                    job.attempt,
                    outcome.status.value,
                    "it came after the attempt's timeout" if late else "the lease was taken over",
                    extra={
                        "job_id": str(job.id),
                        "job_type": job.job_type,
                        "queue": self.queue,
                        "attempt": job.attempt,
                        "outcome": "stale",
                    },
                )
        for labels, count in counts.items():
            metrics.JOB_OUTCOMES.inc_key(labels, count)

    def _expire_timeouts(self, now: float) -> None:
        """Fail the attempts that ran past their timeout; their handlers' threads are replaced."""
        if not self._timed:
            return
        with self._lock:
            self._expire_timeouts_locked(now)

    def _expire_timeouts_locked(self, now: float) -> None:
        for key, entry in list(self._timed.items()):
            if self._running.get(key) is not entry:
                self._timed.pop(key, None)  # its outcome was written meanwhile
                continue
            if entry.deadline is None or now < entry.deadline:
                continue
            job = entry.job
            definition = get_job(job.job_type)
            timeout = definition.timeout if definition is not None else None
            error = JobTimeout(
                f"attempt {job.attempt} ran longer than its timeout of {timeout:g}s; its thread "
                "was left running and its result will be discarded"
            )
            decision = decide(
                error, attempt=job.attempt, max_attempts=job.max_attempts, policy=self.policy
            )
            status = JobStatus.DEAD if decision.action.value == "dead" else JobStatus.RETRYING
            logger.error(
                "job %s (%s) attempt %d/%d: %s -> %s",
                job.id,
                job.job_type,
                job.attempt,
                job.max_attempts,
                decision.summary,
                status.value,
                extra={
                    "job_id": str(job.id),
                    "job_type": job.job_type,
                    "queue": self.queue,
                    "attempt": job.attempt,
                    "outcome": status.value,
                    "error_code": decision.code,
                },
            )
            del self._running[key]
            del self._timed[key]
            self._abandoned.add(key)
            self._threads.add_thread()
            self._outcomes.appendleft(
                Outcome(
                    job,
                    status,
                    delay=decision.delay,
                    code=decision.code,
                    summary=decision.summary,
                    timed_out=True,
                )
            )

    def _renew_leases(self) -> None:
        requests: list[_RenewalRequest] = []
        while self._renewals:
            requests.append(self._renewals.popleft())
        held: dict[uuid.UUID, bool] = {}  # job id -> cancellation requested
        with self._lock:
            running = [r for r in self._running.values() if not r.lease_lost]
        if running:
            try:
                with self._connection().cursor() as cursor:
                    _execute(
                        cursor,
                        "RENEW_LEASES",
                        [
                            self.lease_seconds,
                            [r.id for r in running],
                            [r.attempt for r in running],
                            self.worker_id,
                        ],
                    )
                    held = {job_id: bool(cancelled) for job_id, cancelled in cursor.fetchall()}
            except STATEMENT_ERRORS:
                self._renewals.extend(requests)
                raise
        for entry in running:
            if entry.id not in held:
                if entry.finished:
                    # Its outcome may have been written meanwhile, on another connection; if
                    # the lease was really lost, that write says so (a stale outcome).
                    continue
                entry.lease_lost = True
                logger.warning(
                    "job %s attempt %d: lease lost; its outcome will be discarded",
                    entry.id,
                    entry.attempt,
                    extra={"job_id": str(entry.id), "queue": self.queue},
                )
            elif held[entry.id] and not entry.cancel.is_set():
                entry.cancel.set()
                logger.info(
                    "job %s attempt %d: cancellation requested; told the handler",
                    entry.id,
                    entry.attempt,
                    extra={"job_id": str(entry.id), "queue": self.queue},
                )
        for request in requests:
            asked = self._running.get(request.key)
            request.held = asked is not None and not asked.lease_lost and request.key[0] in held
            request.done.set()

    def _unclaim_waiting(self) -> None:
        """At shutdown: give back the prefetched jobs that no thread started, and the suspects
        held, attempt and all."""
        waiting = self._threads.take_waiting()
        with self._lock:
            if self._held is not None:
                waiting.append(self._held)
                self._held = None
        if not waiting:
            return
        with self._connection().cursor() as cursor:
            _execute(
                cursor,
                "UNCLAIM_JOBS",
                [
                    [r.id for r in waiting],
                    [r.attempt for r in waiting],
                    self.worker_id,
                ],
            )
        with self._lock:
            for entry in waiting:
                self._running.pop((entry.id, entry.attempt), None)

    def _release_unfinished(self) -> None:
        with self._lock:
            unfinished = list(self._running.values())
        if not unfinished:
            return
        with self._connection().cursor() as cursor:
            _execute(
                cursor,
                "RELEASE_JOBS",
                [
                    [r.id for r in unfinished],
                    [r.attempt for r in unfinished],
                    self.worker_id,
                ],
            )
            released = cursor.rowcount
        logger.warning(
            "queue %s: grace period over; released %d unfinished job(s) for another worker",
            self.queue,
            released,
            extra={"queue": self.queue},
        )
        self._running.clear()
