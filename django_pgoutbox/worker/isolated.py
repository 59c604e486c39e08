"""``@job(isolation="process")``: each attempt in a child process that can really be stopped.

A thread cannot be stopped from outside, so a thread-isolated attempt that passes its timeout is
failed by the worker while its handler goes on running (see ``runner``). A process-isolated
attempt runs in a child process instead, which the worker kills at the timeout or when the job's
cancellation is requested: the handler stops mid-statement, its open transaction (if any) is
rolled back by PostgreSQL when the connection drops.

Children come from a ``forkserver`` whose process has imported Django and set it up once
(``set_forkserver_preload`` of :mod:`django_pgoutbox.worker.isolated_child`), so starting an
attempt costs a fork, not an interpreter start. The child receives the job type and payload, looks
the handler up in its own registry, runs it, and sends back the return value or the exception,
pickled; the worker's thread re-raises the exception, so the retry policy decides exactly as for a
thread-isolated handler.
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.connection
import pickle
import threading
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any

from django_pgoutbox.errors import Cancelled, JobTimeout
from django_pgoutbox.worker import isolated_child

if TYPE_CHECKING:
    from django_pgoutbox.context import CancelFlag
    from django_pgoutbox.progress import Report
    from django_pgoutbox.registry import JobDefinition
    from django_pgoutbox.worker.execute import ClaimedJob

#: How often (seconds) the worker's thread looks at the cancellation flag while a child runs.
CHECK_INTERVAL = 0.05

_context: BaseContext | None = None
_context_lock = threading.Lock()


class HandlerProcessDied(RuntimeError):
    """The child process of an isolated attempt ended without an answer (killed, crashed)."""


def _mp_context() -> BaseContext:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["django_pgoutbox.worker.isolated_child"])
            _context = context
        return _context


#: The children of the attempts running now (a process ignores SIGINT and SIGTERM).
_LIVE: set[Any] = set()


def kill_isolated_children() -> None:
    """Kill the children of attempts still running: at exit, once their jobs were released."""
    for process in list(_LIVE):
        if process.is_alive():
            process.kill()


def run_isolated(
    job: ClaimedJob,
    definition: JobDefinition,
    cancel: CancelFlag,
    using: str,
    adopt: Callable[[Report], None] | None = None,
) -> Any:
    """Run ``job``'s handler in a child process; return its value or raise its exception.

    Raises ``JobTimeout`` at the job type's timeout and ``Cancelled`` when ``cancel`` is set,
    having killed the child first. ``adopt`` is given the progress and metadata the handler
    set last, if any, before its value or exception.
    """
    context = _mp_context()
    receiver, sender = context.Pipe(duplex=False)
    fields = {
        "job_id": job.id,
        "job_type": job.job_type,
        "attempt": job.attempt,
        "organization_id": job.organization_id,
        "queue": job.queue,
        "worker_ids": list(job.worker_ids),
        "using": using,
    }
    process = context.Process(  # type: ignore[attr-defined]
        target=isolated_child.run_attempt,
        args=(job.job_type, job.payload, fields, sender),
        name=f"pgoutbox-isolated-{job.id}",
        daemon=True,
    )
    process.start()
    _LIVE.add(process)
    sender.close()
    deadline = None if definition.timeout is None else time.monotonic() + definition.timeout
    data: bytes | None = None
    try:
        while True:
            ready = multiprocessing.connection.wait(
                [receiver, process.sentinel], timeout=CHECK_INTERVAL
            )
            if receiver in ready or (ready and receiver.poll(0)):
                try:
                    data = receiver.recv_bytes()
                except EOFError:
                    data = None
                break
            if ready:  # the child ended and sent nothing
                break
            if cancel.is_set():
                process.kill()
                raise Cancelled(f"job {job.id} was cancelled; its process was killed")
            if deadline is not None and time.monotonic() >= deadline:
                process.kill()
                raise JobTimeout(
                    f"attempt {job.attempt} ran longer than its timeout of "
                    f"{definition.timeout:g}s; its process was killed"
                )
    finally:
        if process.is_alive():
            process.kill()
        process.join(timeout=10)
        _LIVE.discard(process)
        receiver.close()
    if data is None:
        raise HandlerProcessDied(
            f"the process running attempt {job.attempt} exited with code {process.exitcode} "
            "before it answered"
        )
    answer = io.BytesIO(data)
    kind, value = pickle.load(answer)
    reported = pickle.load(answer)
    if reported is not None and adopt is not None:
        adopt(reported)
    if kind == "raise":
        raise value
    return value
