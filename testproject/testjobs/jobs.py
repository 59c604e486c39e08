"""Handlers that tests (and worker subprocesses started by tests) run, steered by the payload."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection

from django_pgoutbox import (
    JobContext,
    PermanentError,
    RateLimited,
    Revoked,
    Snooze,
    TransientError,
    enqueue,
    job,
)
from testproject.testjobs.models import SideEffect


def record(ctx: JobContext, event: str) -> None:
    SideEffect.objects.create(
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        event=event,
        pid=os.getpid(),
        worker_thread=threading.current_thread().name,
    )


def _failure(kind: str, payload: dict[str, Any]) -> BaseException:
    if kind == "transient":
        return TransientError("upstream timed out")
    if kind == "rate_limited":
        return RateLimited(retry_after=payload.get("retry_after"))
    if kind == "permanent":
        return PermanentError("invalid payload")
    if kind == "revoked":
        return Revoked("authorization withdrawn")
    if kind == "huge":
        return ValueError("x" * 1_000_000)
    return KeyError("unexpected")


@job("tests.behave")
def behave(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Record a start, maybe sleep, maybe fail (while attempt <= fail_attempts), record an end."""
    if payload.get("record", True):
        record(ctx, "start")
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("renew"):
        ctx.renew_lease()
    if payload.get("fail") and ctx.attempt <= payload.get("fail_attempts", 10**6):
        raise _failure(payload["fail"], payload)
    if payload.get("record", True):
        record(ctx, "end")
    if "result" in payload:
        return payload["result"]
    return {"pid": os.getpid()}


@job("tests.noop")
def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Does nothing: for throughput measurements."""


@job("tests.bad_result")
def bad_result(payload: dict[str, Any], ctx: JobContext) -> Any:
    return {"when": object()}


@job("tests.stamp")
def stamp(payload: dict[str, Any], ctx: JobContext) -> dict[str, float]:
    """Return when the handler started (wall clock), for wake-up latency measurements."""
    return {"started": time.time()}


@job("tests.misbehave")
def misbehave(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Fails in the ways a careless handler can: steered by payload["how"]."""
    how = payload["how"]
    if how == "system_exit":
        raise SystemExit(3)
    if how == "keyboard_interrupt":
        raise KeyboardInterrupt
    if how == "memory_error":
        raise MemoryError("pretend the heap is full")
    if how == "surrogate_result":
        return {"text": "\ud800"}
    if how == "surrogate_error":
        raise ValueError("bad \ud800 byte")
    if how == "nul_result":
        return {"text": "a\x00b"}
    if how == "print_megabyte":
        raise ValueError("e" * 1_000_000)
    if how == "hostile_megabyte":  # NUL bytes and lone surrogates through a megabyte
        raise ValueError("\x00\ud800<b>&" * 200_000)
    return None


@job("tests.cancellable")
def cancellable(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Work in small steps for up to ``seconds``; stop when cancelled (by flag or by renewal)."""
    record(ctx, "start")
    deadline = time.monotonic() + payload.get("seconds", 30)
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if payload.get("mode") == "renew":
            ctx.renew_lease()  # raises Cancelled once the request is seen
        elif ctx.cancelled:
            record(ctx, "saw-cancel")
            return {"stopped": "cancelled"}
    record(ctx, "end")
    return {"stopped": "finished"}


@job("tests.renew_storm")
def renew_storm(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Renew its lease again and again, each time as soon as the last one is answered, for
    ``seconds``."""
    record(ctx, "start")
    deadline = time.monotonic() + payload.get("seconds", 10)
    renewals = 0
    while time.monotonic() < deadline:
        ctx.renew_lease()
        renewals += 1
    return {"renewals": renewals}


@job("tests.lose_connection", max_attempts=10)
def lose_connection(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Terminate its own database session on its first ``times`` attempts: the error it gets
    is raised (``swallow``: caught, the broken connection left to the worker), then complete."""
    if ctx.attempt <= payload["times"]:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
                cursor.execute("SELECT 1")
        except DatabaseError:
            if not payload.get("swallow"):
                raise
            return {"swallowed": ctx.attempt}
    record(ctx, "end")
    return {"attempt": ctx.attempt}


@job("tests.snooze")
def snooze(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Snooze (after ``sleep`` seconds) until this job has started ``times`` times, then return
    the attempt number."""
    record(ctx, "start")
    time.sleep(payload.get("sleep", 0))
    starts = SideEffect.objects.filter(job_id=ctx.job_id, event="start").count()
    if starts < payload["times"]:
        if payload.get("return"):
            return Snooze(payload.get("seconds", 0.1))
        raise Snooze(payload.get("seconds", 0.1))
    return {"attempt": ctx.attempt, "starts": starts}


@job("tests.timeout", timeout=1, max_attempts=3)
def timeout(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Sleep ``sleep`` seconds on the attempts up to ``slow_attempts``; 1 s timeout."""
    record(ctx, "start")
    if ctx.attempt <= payload.get("slow_attempts", 1):
        time.sleep(payload["sleep"])
    record(ctx, "end")
    return {"attempt": ctx.attempt}


@job("tests.just_in_time", timeout=0.5, max_attempts=1)
def just_in_time(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Return ``margin`` seconds before the 0.5 s timeout: the outcome and the timeout race."""
    time.sleep(0.5 - payload["margin"])
    return None


@job("tests.isolated", timeout=1, max_attempts=2, isolation="process")
def isolated(payload: dict[str, Any], ctx: JobContext) -> Any:
    """In its own process: sleep ``sleep`` seconds on attempt 1, fail or return its pid."""
    record(ctx, "start")
    if ctx.attempt <= payload.get("slow_attempts", 1):
        time.sleep(payload.get("sleep", 0))
    if payload.get("fail"):
        raise _failure(payload["fail"], payload)
    if payload.get("exit"):
        os._exit(3)
    record(ctx, "end")
    return {"attempt": ctx.attempt, "pid": os.getpid()}


#: The same in its own process, without a timeout: for tests of shutdown, where a timeout of a
#: second would race the grace period on a busy machine.
isolated_untimed = job("tests.isolated_untimed", max_attempts=2, isolation="process")(isolated.func)


# -- Poison values: handlers and tasks whose raise or return is hostile ---------
# tests/processes/reliability/test_poison_values.py runs them beside innocent jobs in real workers.


class _UnprintableError(Exception):
    """An exception whose message cannot be read: ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("this message cannot be printed")


class _UnprintablePermanentError(PermanentError):
    def __str__(self) -> str:
        raise RuntimeError("this message cannot be printed either")


class _BadCodeError(TransientError):
    """A failure whose ``code`` is not a string."""

    code = 5  # type: ignore[assignment]


def _poison(kind: str) -> BaseException | Snooze:
    if kind == "rate_limited_inf":
        return RateLimited(retry_after=float("inf"))  # the constructor raises TypeError
    if kind == "rate_limited_nan":
        return RateLimited(retry_after=float("nan"))
    if kind == "rate_limited_huge":
        return RateLimited(retry_after=1e300)
    if kind == "snooze_huge":
        return Snooze(1e15)
    if kind == "snooze_tampered":
        snooze = Snooze(1)
        snooze.seconds = float("inf")  # changed after the constructor checked it
        return snooze
    if kind == "unprintable":
        return _UnprintableError()
    if kind == "unprintable_permanent":
        return _UnprintablePermanentError()
    if kind == "bad_code":
        return _BadCodeError("its code is an int")
    raise AssertionError(kind)


@job("tests.poison_raise", max_attempts=3)
def poison_raise(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Raise the hostile value named by ``kind`` (see ``_poison``)."""
    record(ctx, "start")
    raise _poison(payload["kind"])


@job("tests.poison_return")
def poison_return(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Return ``result``; with ``nul``, a dict holding a real NUL character."""
    record(ctx, "start")
    if payload.get("nul"):
        return {"text": "a\x00b"}
    return payload["result"]


@job("tests.poison_big_result")
def poison_big_result(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Return ``characters`` copies of ``char`` (default ``x``): a result of that many
    characters and up to four times as many bytes of JSON."""
    record(ctx, "start")
    return {"text": payload.get("char", "x") * payload["characters"]}


@job("tests.poison_schedule")
def poison_schedule(payload: dict[str, Any], ctx: JobContext) -> None:
    """The job of a schedule whose enqueue a test makes the database refuse."""


# -- Poison handlers of the worker's runner (tests/processes/reliability/test_poison_runner.py) ----


@job("tests.poison_big_number", max_attempts=3)
def poison_big_number(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Return an integer of 140,001 digits: valid JSON that jsonb refuses (numeric overflow)."""
    import sys

    sys.set_int_max_str_digits(0)  # Python's own guard, lifted as a careless handler might
    return {"n": 10**140_000}


@job("tests.poison_deep_result", max_attempts=3)
def poison_deep_result(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Return ``depth`` nested lists: valid JSON, too deep for a server with a small stack."""
    value: list[Any] = []
    for _ in range(payload.get("depth", 900)):
        value = [value]
    return value


@job("tests.poison_hang", timeout=1, max_attempts=1)
def poison_hang(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Hold its thread for ``seconds``, long past its 1 s timeout."""
    record(ctx, "start")
    time.sleep(payload.get("seconds", 5))
    return None


# -- Hostile handlers (tests/processes/reliability/test_poison_hostile.py) -------------------------


class _HostileFloat(float):
    """A float whose comparisons raise: a delay that breaks whoever checks it."""

    def __ge__(self, other: Any) -> bool:
        raise RuntimeError("no comparing me")


class _HostileClassError(Exception):
    """An exception whose ``__class__`` raises: ``isinstance()`` on it raises too."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        raise RuntimeError("no class for you")


class _HostileSnooze(Snooze):
    """A Snooze whose ``seconds`` cannot be read (its constructor, which checks it, skipped)."""

    def __init__(self) -> None:
        Exception.__init__(self, "hostile snooze")

    @property
    def seconds(self) -> float:  # type: ignore[override]
        raise RuntimeError("no seconds for you")


def _hostile(kind: str) -> Any:
    if kind == "class_raises":
        return _HostileClassError("boom")
    if kind == "snooze_property":
        return _HostileSnooze()
    if kind == "rate_hostile_float":
        error = RateLimited(1)
        error.retry_after = _HostileFloat(5)
        return error
    raise AssertionError(kind)


@job("tests.hostile_raise", max_attempts=3)
def hostile_raise(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Raise the hostile value named by ``kind`` (see ``_hostile``)."""
    raise _hostile(payload["kind"])


@job("tests.hostile_open_transaction")
def hostile_open_transaction(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Start a transaction behind Django's back (a raw BEGIN) and return with it open."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
    return None


@job("tests.poison_exit", max_attempts=3)
def poison_exit(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Kill the whole worker process at once, as a crashing C extension or the OOM killer would."""
    record(ctx, "start")
    time.sleep(payload.get("after", 0.0))
    os._exit(9)


@job("tests.poison_neighbour", max_attempts=2)
def poison_neighbour(payload: dict[str, Any], ctx: JobContext) -> Any:
    """An innocent job with a small budget, to sit beside a poison: sleeps, then returns."""
    record(ctx, "start")
    time.sleep(payload.get("sleep", 1.0))
    record(ctx, "end")
    return {"attempt": ctx.attempt}


@job("tests.hostile_fork", max_attempts=2)
def hostile_fork(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Fork, and return (or raise, with ``raise``) in both processes: the parent's outcome is
    the job's; the child must not go on as a worker."""
    child = os.fork()
    if payload.get("raise"):
        raise RuntimeError(f"forked {child}")
    return {"child": child}


@job("tests.snooze_then_sleep", max_attempts=2)
def snooze_then_sleep(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Snooze at its first start, then sleep ``sleep`` seconds and complete: an innocent job."""
    record(ctx, "start")
    if SideEffect.objects.filter(job_id=ctx.job_id, event="start").count() < 2:
        raise Snooze(payload.get("seconds", 0.1))
    time.sleep(payload.get("sleep", 3.0))
    record(ctx, "end")
    return {"attempt": ctx.attempt}


# -- Leaks (tests/processes/test_recycling.py) --------------------------------------------

#: What ``tests.leak`` keeps, for the life of its process: a handler that leaks.
_LEAKED: list[bytes] = []


@job("tests.leak")
def leak(payload: dict[str, Any], ctx: JobContext) -> None:
    """Keep ``mb`` MiB (touched, so resident) for as long as the process lives."""
    _LEAKED.append(b"x" * (payload.get("mb", 10) * 2**20))
    record(ctx, "end")


@job("tests.spawn")
def spawn(payload: dict[str, Any], ctx: JobContext) -> None:
    """Enqueue a ``tests.behave`` job of ``priority`` (a follow-up that should run first)."""
    enqueue("tests.behave", {"n": "child"}, priority=payload.get("priority", 0))


@job("tests.step", max_attempts=2)
def workflow_step(payload: dict[str, Any], ctx: JobContext) -> Any:
    """A workflow's step: record its start by the database's clock (to compare with its
    parents' ``completed_at``), maybe sleep or fail for good, return its name and the parents
    whose results it read."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testjobs_sideeffect (job_id, attempt, event, pid, worker_thread, at)"
            " VALUES (%s, %s, 'start', %s, %s, clock_timestamp())",
            [ctx.job_id, ctx.attempt, os.getpid(), threading.current_thread().name],
        )
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise PermanentError(f"step {payload.get('name')} told to fail")
    return {"name": payload.get("name"), "saw": sorted(ctx.parent_results)}


@job("tests.group_done")
def group_done(payload: dict[str, Any], ctx: JobContext) -> Any:
    """A group's callback: what its members came to."""
    return {"counts": ctx.parent_counts, "members": sorted(str(p.id) for p in ctx.parents)}


@job("tests.progress")
def progress(payload: dict[str, Any], ctx: JobContext) -> int:
    """Call ``ctx.set_progress()`` in a tight loop for ``seconds`` (a count of calls in meta
    each 1,000th), and ``meta`` as given; then wait for ``sleep`` seconds; return the calls."""
    deadline = time.monotonic() + payload.get("seconds", 0)
    total = payload.get("total", 10**9)
    calls = 0
    while calls < payload.get("calls", 0) or time.monotonic() < deadline:
        calls += 1
        ctx.set_progress(calls, max(total, calls), "spinning")
        if calls % 1000 == 0:
            ctx.set_meta(calls=calls)
    ctx.set_progress(calls, max(total, calls), payload.get("message", "done"))
    ctx.set_meta(calls=calls, **payload.get("meta", {}))
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise TransientError("failed after its progress")
    return calls


@job("tests.progress_isolated", max_attempts=1, isolation="process")
def progress_isolated(payload: dict[str, Any], ctx: JobContext) -> str:
    """An isolated attempt that sets its progress and metadata."""
    ctx.set_progress(3, 4, "in a child process")
    ctx.set_meta(pid=os.getpid())
    return "ok"


@job("tests.sequence_step", max_attempts=2)
def sequence_step(payload: dict[str, Any], ctx: JobContext) -> Any:
    """A job of a sequence: record its start and its end by the database's clock (an
    execution log that shows two jobs of one key running at once, if they ever do), sleeping
    between them; ``exit``: raise SystemExit instead (a poison that dies, holding its key)."""
    sql = (
        "INSERT INTO testjobs_sideeffect (job_id, attempt, event, pid, worker_thread, at)"
        " VALUES (%s, %s, %s, %s, %s, clock_timestamp())"
    )
    where: list[Any] = [ctx.job_id, ctx.attempt]
    who: list[Any] = [os.getpid(), threading.current_thread().name]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*where, "start", *who])
    if payload.get("exit"):
        raise SystemExit(3)
    time.sleep(payload.get("sleep", 0.0))
    with connection.cursor() as cursor:
        cursor.execute(sql, [*where, "end", *who])
    return {"n": payload.get("n")}


class Unprintable(Exception):
    """An exception whose ``str()`` and ``repr()`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("cannot print this exception")

    def __repr__(self) -> str:
        raise RuntimeError("cannot print this exception")


@job("tests.traced", timeout=1, max_attempts=2)
def traced(payload: dict[str, Any], ctx: JobContext) -> Any:
    """For the tests of traces. ``kind``: "ok" opens a span of its own and enqueues a
    ``tests.noop`` under it; "fail_once" fails its first attempt; "exit" raises SystemExit;
    "hang" sleeps 2.5 s, past its 1 s timeout; "unprintable" raises ``Unprintable``."""
    kind = payload["kind"]
    if kind == "ok":
        from opentelemetry import trace

        with trace.get_tracer("testjobs").start_as_current_span("handler work"):
            enqueue("tests.noop", {"from": str(ctx.job_id)})
        return None
    if kind == "fail_once" and ctx.attempt == 1:
        raise TransientError("the first attempt fails")
    if kind == "exit":
        raise SystemExit(3)
    if kind == "hang":
        time.sleep(2.5)
    if kind == "unprintable":
        raise Unprintable()
    return None


# -- async def handlers (tests/processes/test_async_processes.py) ----------------------------------


async def _arecord(ctx: JobContext, event: str) -> None:
    await SideEffect.objects.acreate(
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        event=event,
        pid=os.getpid(),
        worker_thread=threading.current_thread().name,
    )


@job("tests.async_behave", max_attempts=3)
async def async_behave(payload: dict[str, Any], ctx: JobContext) -> Any:
    """``tests.behave`` as a coroutine: record (through the async ORM, or ``sync_to_async``
    with ``"through": "sync_to_async"``), sleep without blocking the loop, fail, snooze."""
    if payload.get("record", True):
        if payload.get("through") == "sync_to_async":
            await sync_to_async(record, thread_sensitive=False)(ctx, "start")
        else:
            await _arecord(ctx, "start")
    await asyncio.sleep(payload.get("sleep", 0))
    if payload.get("fail") and ctx.attempt <= payload.get("fail_attempts", 10**6):
        raise _failure(payload["fail"], payload)
    if payload.get("snooze") and ctx.attempt == 1:
        starts = await SideEffect.objects.filter(job_id=ctx.job_id, event="start").acount()
        if starts < payload["snooze"]:
            raise Snooze(0.1)
    if payload.get("record", True):
        await _arecord(ctx, "end")
    if "result" in payload:
        return payload["result"]
    return {"thread": threading.current_thread().name}


@job("tests.async_noop")
async def async_noop(payload: dict[str, Any], ctx: JobContext) -> None:
    """Does nothing, as a coroutine: for throughput measurements."""


@job("tests.async_sleep")
async def async_sleep(payload: dict[str, Any], ctx: JobContext) -> None:
    """``await asyncio.sleep(seconds)``: for throughput measurements of coroutines in flight."""
    await asyncio.sleep(payload.get("seconds", 0.01))


@job("tests.async_timeout", timeout=1, max_attempts=1)
async def async_timeout(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Sleep ``sleep`` seconds past its 1 s timeout; ``swallow``: catch the cancellation and
    go on sleeping as if nothing happened."""
    await _arecord(ctx, "start")
    try:
        await asyncio.sleep(payload["sleep"])
    except asyncio.CancelledError:
        if not payload.get("swallow"):
            await _arecord(ctx, "cancelled")
            raise
        await asyncio.sleep(payload.get("after", 0.5))
    return {"slept": payload["sleep"]}


@job("tests.async_cancellable", max_attempts=1)
async def async_cancellable(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Record a start, then wait (for ever) to be cancelled; ``swallow``: return a value once
    cancelled instead of letting the cancellation through."""
    await _arecord(ctx, "start")
    try:
        while True:
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        if payload.get("swallow"):
            return {"swallowed": True}
        raise


@job("tests.async_hostile", max_attempts=1)
async def async_hostile(payload: dict[str, Any], ctx: JobContext) -> Any:
    """What a coroutine should not do, by ``kind``: raise what is not an Exception, return what
    is not JSON, raise an exception that cannot be printed, stop or close its event loop, block
    the loop's thread (``time.sleep``)."""
    kind = payload["kind"]
    await asyncio.sleep(payload.get("sleep", 0))
    if kind == "system_exit":
        raise SystemExit(3)
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt
    if kind == "base_exception":
        raise BaseException("a bare BaseException")
    if kind == "non_json":
        return object()
    if kind == "unprintable":
        raise _HostileClassError("boom")
    if kind == "stop_loop":
        asyncio.get_event_loop().stop()
        await asyncio.sleep(0.05)
        return {"stopped": True}
    if kind == "close_loop":
        asyncio.get_running_loop().close()
        return {"closed": True}
    if kind == "callback_exit":
        asyncio.get_running_loop().call_soon(sys.exit, 4)
        await asyncio.sleep(0.05)
        return {"exited": False}
    if kind == "block":
        time.sleep(payload.get("seconds", 1000))
        return None
    if kind == "pool_hog":  # a thread of the loop's default executor, held
        await _arecord(ctx, "start")
        await asyncio.to_thread(time.sleep, payload.get("seconds", 1000))
        return None
    if kind == "sensitive_hog":  # asgiref's one thread-sensitive thread, held
        await _arecord(ctx, "start")
        await sync_to_async(time.sleep)(payload.get("seconds", 1000))
        return None
    raise AssertionError(kind)


# -- retry storms and connection exhaustion (tests/reliability/test_storms.py) ---------------------

_storm_connections = threading.local()


def _record_on_own_connection(ctx: JobContext, event: str) -> None:
    """``record`` on a psycopg connection this thread keeps open (Django's closes after each
    attempt with ``CONN_MAX_AGE = 0``, and a new one per job would be most of a storm's time)."""
    import psycopg

    from django_pgoutbox.db import raw_connection_params

    conn = getattr(_storm_connections, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(**raw_connection_params("default"), autocommit=True)
        _storm_connections.conn = conn
    conn.execute(
        "INSERT INTO testjobs_sideeffect (job_id, attempt, event, pid, worker_thread, at) "
        "VALUES (%s, %s, %s, %s, %s, now())",
        [ctx.job_id, ctx.attempt, event, os.getpid(), threading.current_thread().name],
    )


@job("tests.storm", max_attempts=50)
def storm(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Fail with a ``TransientError`` on attempts up to ``fail_attempts`` without touching the
    database; then maybe sleep, and record an end: through the ORM (``orm``: a connection opened
    for the attempt, as a handler does), else on a connection the thread keeps."""
    if ctx.attempt <= payload.get("fail_attempts", 0):
        raise TransientError("upstream down")
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("orm"):
        record(ctx, "end")
    else:
        _record_on_own_connection(ctx, "end")
    return None


# -- Hosts on a misbehaving network (tests/reliability/test_network.py) ----------------------------


@job("tests.leased_step", max_attempts=5)
def leased_step(payload: dict[str, Any], ctx: JobContext) -> Any:
    """Append a start line and an end line (JSON) to the file named by
    ``PGOUTBOX_TEST_EXECUTION_LOG``, sleeping ``seconds`` between them: an execution log kept
    off the database, which a host cut off from it still writes. The start line holds the lease
    expiry the claim wrote (read at the start, while the host still reaches the database)."""
    import json

    def log(event: str, **values: Any) -> None:
        line = {
            "job": str(ctx.job_id),
            "attempt": ctx.attempt,
            "worker": ctx.worker_ids[-1] if ctx.worker_ids else None,
            "host": os.environ.get("PGOUTBOX_TEST_HOST"),
            "event": event,
            "at": time.time(),
            **values,
        }
        with open(os.environ["PGOUTBOX_TEST_EXECUTION_LOG"], "a") as file:
            file.write(json.dumps(line) + "\n")

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM lease_expires_at) FROM jobs WHERE id = %s AND attempts = %s",
            [ctx.job_id, ctx.attempt],
        )
        row = cursor.fetchone()
    log("start", lease_expires_at=None if row is None or row[0] is None else float(row[0]))
    time.sleep(payload.get("seconds", 1.0))
    log("end")
    return {"host": os.environ.get("PGOUTBOX_TEST_HOST"), "attempt": ctx.attempt}


# -- a held xmin horizon through a worker (tests/reliability/test_horizon.py) ----------------------


@job("tests.once")
def once(payload: dict[str, Any], ctx: JobContext) -> None:
    """Record one end row: the checker's proof that the handler ran, once per completed run.

    On the thread's own connection: Django's (``CONN_MAX_AGE`` 0) would be a new session per
    job, and at a thousand jobs a second the server's forks would be the bottleneck, not the
    queue."""
    _record_on_own_connection(ctx, "end")
