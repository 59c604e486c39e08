"""Waiting for a job's result: ``Job.wait()`` and ``Job.await_result()`` (docs/results.md).

A waiter reads the job's status, and reads it again whenever the job may have finished: when a
notification on ``RESULTS_CHANNEL`` carries its job's tag (``queries.results``), when the
listener (re)connects, and on a poll that backs off from 1 s to ``PGOUTBOX["POLL_INTERVAL"]``.
So a lost notification costs latency, never a result.

The waiters of a process share one LISTEN connection per database (``ResultListener``): its
thread alone owns the connection and the map of tags to waiters; waiters post ``Watch`` and
``Unwatch`` messages to it and are woken through a callback (a ``threading.Event`` for
``wait()``, the event loop's own thread for ``await_result()``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import psycopg
from asgiref.sync import sync_to_async
from django.db import connections, router
from psycopg import sql

from django_pgoutbox import queries
from django_pgoutbox.conf import MAX_DELAY_CEILING, RESULTS_CHANNEL, get_settings
from django_pgoutbox.db import raw_connection_params
from django_pgoutbox.errors import (
    JobCancelled,
    JobFailed,
    WaitInTransaction,
    WaitTimeout,
)
from django_pgoutbox.models import FINISHED_STATUSES, Job, JobStatus
from django_pgoutbox.queries.results import TAG_LENGTH

logger = logging.getLogger("django_pgoutbox.results")

#: The first poll of a waiter comes this many seconds after its first read (or sooner, if
#: ``POLL_INTERVAL`` is shorter); each next one twice as late, up to ``POLL_INTERVAL``.
FIRST_POLL = 1.0
#: How long a waiter waits for the listener to say it listens before it reads the row anyway
#: (and relies on its polls): a database that does not answer must not hold up ``wait()``.
LISTEN_PATIENCE = 2.0
#: Seconds the listener keeps its connection once no one waits: a burst of waits shares one.
IDLE_SECONDS = 10.0
#: The listener's reconnect back-off, in seconds (first, most).
RECONNECT_BACKOFF = (0.5, 10.0)


def tag(job_id: uuid.UUID) -> str:
    """A job's tag in the notifications: its id's last hex digits (``queries.results``)."""
    return job_id.hex[-TAG_LENGTH:]


def job_alias(job: Job, using: str | None = None) -> str:
    """The database of ``job``: ``using``, the one it was read from or saved to, or the router's."""
    return using or job._state.db or router.db_for_read(Job)


def read_job(job_id: uuid.UUID, using: str) -> Job | None:
    """The row of job ``job_id``, or None: the one read of a job's outcome that ``wait()``, its
    async twin and the ``django.tasks`` backend's ``get_result()`` share."""
    return Job.objects.using(using).filter(pk=job_id).first()


def seconds(timeout: float | timedelta | None) -> float | None:
    """``timeout`` in seconds (None: no limit); ``TypeError`` unless a number or a ``timedelta``,
    ``ValueError`` if negative or NaN. Infinity is no limit; a longer one is cut to 365 days."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        value = timeout.total_seconds()
    elif isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be seconds or a timedelta, not {timeout!r}")
    else:
        value = float(min(timeout, MAX_DELAY_CEILING + 1))
    if math.isnan(value) or value < 0:
        raise ValueError(f"timeout must be None or >= 0 seconds, not {timeout!r}")
    return None if value > MAX_DELAY_CEILING else value


def _status(job_id: uuid.UUID, using: str) -> str:
    """The job's status now; ``Job.DoesNotExist`` if there is no such job."""
    found = Job.objects.using(using).filter(pk=job_id).values_list("status", flat=True).first()
    if found is None:
        raise Job.DoesNotExist(f"no job {job_id} in database {using!r}")
    return found


def _may_block(job: Job, using: str) -> None:
    """Refuse to block inside a transaction of the job's database (``WaitInTransaction``)."""
    if connections[using].in_atomic_block:
        raise WaitInTransaction(
            f"job {job.id} is {job.status}: wait() for it inside transaction.atomic() would "
            "hold the transaction open, and a job enqueued in it cannot run before it commits. "
            "Wait after the commit (transaction.on_commit, or outside the atomic block)."
        )


def _outcome(job: Job, using: str) -> Any:
    """Read the whole row into ``job``; return its result if completed, raise if it ended dead
    or cancelled. The caller knows it finished."""
    fresh = read_job(job.id, using)
    if fresh is None:
        raise Job.DoesNotExist(f"no job {job.id} in database {using!r}")
    for column in Job._meta.concrete_fields:
        setattr(job, column.attname, getattr(fresh, column.attname))
    job._state.db = using
    if job.status == JobStatus.DEAD:
        raise JobFailed(job)
    if job.status == JobStatus.CANCELLED:
        raise JobCancelled(job)
    return job.result


def _timed_out(job: Job, using: str, timeout: float) -> WaitTimeout:
    fresh = read_job(job.id, using)
    if fresh is not None:
        for column in Job._meta.concrete_fields:
            setattr(job, column.attname, getattr(fresh, column.attname))
    return WaitTimeout(job, timeout)


def _polls(first: float | None = None) -> Iterator[float]:
    cap = max(get_settings().poll_interval, 0.01)
    interval = min(first or FIRST_POLL, cap)
    while True:
        yield interval
        interval = min(interval * 2, cap)


def wait(job: Job, timeout: float | timedelta | None = None, using: str | None = None) -> Any:
    """``Job.wait()``: block until ``job`` finishes; its result, or ``JobFailed``,
    ``JobCancelled``, ``WaitTimeout``, ``WaitInTransaction``, ``Job.DoesNotExist``."""
    limit = seconds(timeout)
    alias = job_alias(job, using)
    start = time.monotonic()
    if _status(job.id, alias) in FINISHED_STATUSES:
        return _outcome(job, alias)
    if limit == 0:
        raise _timed_out(job, alias, 0.0)
    _may_block(job, alias)
    woken = threading.Event()
    with _watching(job.id, alias, woken.set) as listening:
        listening.wait(_remaining(start, limit, LISTEN_PATIENCE))
        for poll in _polls():
            woken.clear()  # before the read: a wake-up after it is not lost
            if _status(job.id, alias) in FINISHED_STATUSES:
                return _outcome(job, alias)
            left = _remaining(start, limit, poll)
            if left <= 0:
                raise _timed_out(job, alias, limit or 0.0)
            woken.wait(left)
    raise AssertionError("unreachable")  # pragma: no cover


async def await_result(
    job: Job, timeout: float | timedelta | None = None, using: str | None = None
) -> Any:
    """``Job.await_result()``: ``wait()`` for asyncio, which never blocks the event loop."""
    limit = seconds(timeout)
    alias = job_alias(job, using)
    start = time.monotonic()
    status = sync_to_async(_status)
    if await status(job.id, alias) in FINISHED_STATUSES:
        return await sync_to_async(_outcome)(job, alias)
    if limit == 0:
        raise await sync_to_async(_timed_out)(job, alias, 0.0)
    await sync_to_async(_may_block)(job, alias)
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    listening = asyncio.Event()

    def wake() -> None:
        loop.call_soon_threadsafe(woken.set)

    def heard() -> None:
        loop.call_soon_threadsafe(listening.set)

    with _watching(job.id, alias, wake, heard):
        with suppress(TimeoutError):
            await asyncio.wait_for(listening.wait(), _remaining(start, limit, LISTEN_PATIENCE))
        for poll in _polls():
            woken.clear()
            if await status(job.id, alias) in FINISHED_STATUSES:
                return await sync_to_async(_outcome)(job, alias)
            left = _remaining(start, limit, poll)
            if left <= 0:
                raise await sync_to_async(_timed_out)(job, alias, limit or 0.0)
            with suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), left)
    raise AssertionError("unreachable")  # pragma: no cover


def _remaining(start: float, limit: float | None, most: float) -> float:
    """Seconds to wait now: ``most``, or less if the wait's limit comes first."""
    if limit is None:
        return most
    return max(0.0, min(most, start + limit - time.monotonic()))


@contextmanager
def _watching(
    job_id: uuid.UUID,
    using: str,
    wake: Callable[[], None],
    heard: Callable[[], None] | None = None,
) -> Iterator[threading.Event]:
    """Have ``wake`` called whenever job ``job_id`` may have finished, while in the block.

    Yields an event set once the listener listens for it (or will not: notifications off, or no
    connection), after which a completion committed is either seen by a read or woken for.
    """
    listening = threading.Event()

    def said() -> None:
        listening.set()
        if heard is not None:
            heard()

    if not get_settings().notify:
        said()
        yield listening
        return
    listener = ResultListener.of(get_settings().listen_databases.get(using, using))
    watch = Watch(tag(job_id), wake, said, job_id)
    listener.post(watch)
    try:
        yield listening
    finally:
        listener.post(Unwatch(watch))


@dataclass(eq=False)
class Watch:
    """A waiter's message: wake me (``wake``) when ``tag`` is heard; ``listening`` is called
    once the listener listens (or cannot)."""

    tag: str
    wake: Callable[[], None]
    listening: Callable[[], None]
    job_id: uuid.UUID


@dataclass(eq=False)
class Unwatch:
    watch: Watch


class Close:
    """Close the connection and end the thread (``ResultListener.close_all()``)."""


@dataclass
class _State:
    """The listener thread's own state: no other thread reads or writes it."""

    connection: psycopg.Connection[Any] | None = None
    watches: dict[str, set[Watch]] = field(default_factory=dict)
    #: How many watches each job has: the jobs registered in ``job_waiters`` for this listener.
    jobs: dict[uuid.UUID, int] = field(default_factory=dict)
    idle_since: float = 0.0
    retry_at: float = 0.0
    backoff: float = RECONNECT_BACKOFF[0]
    ever_connected: bool = False
    closed: bool = False


class ResultListener:
    """The LISTEN connection of one process and database for its waiters, owned by one thread.

    Waiters ``post()`` messages; the thread connects when the first one comes, wakes the
    waiters whose tag a notification carries, wakes them all on a reconnect (notifications sent
    meanwhile are lost), and closes the connection after ``IDLE_SECONDS`` without waiters.
    """

    _registry: ClassVar[dict[tuple[int, str], ResultListener]] = {}
    _registry_lock = threading.Lock()

    @classmethod
    def of(cls, using: str) -> ResultListener:
        """The listener of database ``using`` in this process (a forked child gets its own)."""
        key = (os.getpid(), using)
        with cls._registry_lock:
            listener = cls._registry.get(key)
            if listener is None:
                listener = cls._registry[key] = cls(using)
        return listener

    def __init__(self, using: str) -> None:
        self.using = using
        self._inbox: queue.SimpleQueue[Watch | Unwatch | Close] = queue.SimpleQueue()
        self._pid: int | None = None  # written by the thread alone
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._thread = threading.Thread(
            target=self._run, name=f"pgoutbox-results-{using}", daemon=True
        )
        self._thread.start()

    @classmethod
    def close_all(cls) -> None:
        """Close every listener of this process (their waiters poll on) and forget them: the
        test suite's, before it drops its database."""
        with cls._registry_lock:
            listeners = list(cls._registry.values())
            cls._registry.clear()
        for listener in listeners:
            listener.post(Close())
        for listener in listeners:
            listener._thread.join(timeout=5)

    def post(self, message: Watch | Unwatch | Close) -> None:
        self._inbox.put(message)
        # a socket full of wake-ups already: the thread will read the inbox anyway
        with suppress(BlockingIOError):
            self._wake_writer.send(b"\0")

    @property
    def backend_pid(self) -> int | None:
        """The server process of the LISTEN connection, or None (read from another thread: a
        snapshot, which the tests use to end that connection from the server side)."""
        return self._pid

    def _run(self) -> None:
        state = _State(idle_since=time.monotonic())
        while not state.closed:
            try:
                self._turn(state)
            except Exception:  # a bug here must not leave waiters to their polls for ever
                logger.exception("result listener of %r: unexpected error", self.using)
                self._drop(state)
                time.sleep(RECONNECT_BACKOFF[0])

    def _turn(self, state: _State) -> None:
        sockets: list[Any] = [self._wake_reader]
        connection = state.connection
        if connection is not None:
            sockets.append(connection.pgconn.socket)
        readable, _, _ = select.select(sockets, [], [], self._timeout(state))
        if self._wake_reader in readable:
            with suppress(BlockingIOError):
                while self._wake_reader.recv(4096):
                    pass
        self._read_inbox(state)
        if connection is not None and connection is state.connection and sockets[-1] in readable:
            self._read_notifications(state)
        now = time.monotonic()
        if state.watches and state.connection is None and now >= state.retry_at:
            self._connect(state)
        idle = now - state.idle_since >= IDLE_SECONDS
        if not state.watches and state.connection is not None and idle:
            self._drop(state)

    def _timeout(self, state: _State) -> float:
        if state.watches and state.connection is None:
            return max(0.0, state.retry_at - time.monotonic())
        if not state.watches and state.connection is not None:
            return max(0.0, state.idle_since + IDLE_SECONDS - time.monotonic())
        return IDLE_SECONDS

    def _read_inbox(self, state: _State) -> None:
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, Close):
                self._drop(state)
                self._wake_all(state)
                state.closed = True
                return
            if isinstance(message, Watch):
                if state.connection is None and time.monotonic() >= state.retry_at:
                    self._connect(state)
                state.watches.setdefault(message.tag, set()).add(message)
                count = state.jobs.get(message.job_id, 0)
                state.jobs[message.job_id] = count + 1
                if count == 0:
                    # registered before the waiter reads the row: a completion after that read
                    # is notified (queries.results)
                    self._execute(state, queries.REGISTER_WAITERS, [[message.job_id]])
                _call(message.listening)
            else:
                tagged = state.watches.get(message.watch.tag)
                if tagged is not None and message.watch in tagged:
                    tagged.discard(message.watch)
                    if not tagged:
                        del state.watches[message.watch.tag]
                    job_id = message.watch.job_id
                    state.jobs[job_id] -= 1
                    if not state.jobs[job_id]:
                        del state.jobs[job_id]
                        self._execute(state, queries.UNREGISTER_WAITER, [job_id])
                if not state.watches:
                    state.idle_since = time.monotonic()

    def _connect(self, state: _State) -> None:
        try:
            connection = psycopg.connect(**raw_connection_params(self.using), autocommit=True)
            connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(RESULTS_CHANNEL)))
        except psycopg.Error as error:
            logger.warning(
                "result listener of %r: cannot LISTEN (%s); waiters poll, retry in %.1fs",
                self.using,
                error,
                state.backoff,
            )
            state.retry_at = time.monotonic() + state.backoff
            state.backoff = min(state.backoff * 2, RECONNECT_BACKOFF[1])
            return
        state.connection, state.backoff = connection, RECONNECT_BACKOFF[0]
        self._pid = connection.info.backend_pid
        if state.jobs:  # the registrations of the connection before ended with it
            self._execute(state, queries.REGISTER_WAITERS, [list(state.jobs)])
        if state.ever_connected:
            self._wake_all(state)  # what was sent while it was away is lost
        state.ever_connected = True

    def _execute(self, state: _State, statement: str, params: list[Any]) -> None:
        """Run a registration on the listening connection; a failure there is the connection's
        loss (its waiters poll until the next connection registers them again)."""
        if state.connection is None:
            return
        try:
            state.connection.execute(statement, params)
        except psycopg.Error as error:
            logger.warning(
                "result listener of %r: connection lost (%s); waiters poll", self.using, error
            )
            self._drop(state)
            state.retry_at = time.monotonic() + state.backoff
            self._wake_all(state)

    def _drop(self, state: _State) -> None:
        if state.connection is not None:
            with suppress(psycopg.Error):
                state.connection.close()
        state.connection, self._pid = None, None

    def _read_notifications(self, state: _State) -> None:
        assert state.connection is not None
        pgconn = state.connection.pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error as error:
            logger.warning(
                "result listener of %r: connection lost (%s); waiters poll", self.using, error
            )
            self._drop(state)
            state.retry_at = time.monotonic() + state.backoff
            self._wake_all(state)
            return
        while (notification := pgconn.notifies()) is not None:
            if not state.watches:
                continue
            tags = notification.extra.decode("ascii", "replace").split()
            for found in state.watches.keys() & set(tags):
                for watch in state.watches[found]:
                    _call(watch.wake)
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            self._drop(state)
            state.retry_at = time.monotonic() + state.backoff
            self._wake_all(state)

    def _wake_all(self, state: _State) -> None:
        for watches in state.watches.values():
            for watch in watches:
                _call(watch.wake)


def _call(callback: Callable[[], None]) -> None:
    """Call a waiter's callback: one whose event loop closed must not stop the listener."""
    with suppress(RuntimeError):
        callback()
