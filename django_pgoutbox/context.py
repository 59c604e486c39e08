"""What a handler is given besides its payload: ``JobContext``, and the flag that cancels it."""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_pgoutbox import queries
from django_pgoutbox.errors import Cancelled
from django_pgoutbox.progress import Progress, Report, check_progress, merge_meta


@dataclass(frozen=True)
class ParentOutcome:
    """A job that a step waited for, as it ended (``ctx.parents``)."""

    id: uuid.UUID
    step: str | None
    status: str
    result: Any
    error_code: str | None

    @property
    def key(self) -> str:
        """Its step name, or its id as text if it is no step of a workflow."""
        return self.step if self.step is not None else str(self.id)


def read_parents(job_id: uuid.UUID, using: str) -> tuple[ParentOutcome, ...]:
    """The parents of ``job_id`` as they are now, in step-name order."""
    with connections[using].cursor() as cursor:
        cursor.execute(queries.PARENTS, [job_id])
        return tuple(
            ParentOutcome(
                parent_id,
                step,
                status,
                None if result is None else json.loads(result),
                error_code,
            )
            for parent_id, step, status, result, error_code in cursor.fetchall()
        )


class CancelFlag:
    """Whether a running job's cancellation was requested: set by the worker, read by the handler.

    A bare attribute rather than a ``threading.Event``, which costs a lock and a condition for
    every job claimed; setting and reading one attribute is atomic in Python.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class ProgressNote:
    """What a running attempt's handler set last (``ctx.set_progress()``, ``ctx.set_meta()``),
    for its worker to write: ``latest`` is written by the handler's thread alone, replaced whole
    by an immutable ``Report`` at each call, and read by the queue's coordinator when it writes
    (``worker.progress``), at most once a second. One writer, one reader, one attribute, no
    lock: as ``CancelFlag``, the other way round. The handler's thread posts the note once, at
    the attempt's first call; the calls after it cost no message. ``key`` is the attempt's
    (job id, attempt number).
    """

    __slots__ = ("key", "latest")

    def __init__(self, key: tuple[uuid.UUID, int], latest: Report) -> None:
        self.key = key
        self.latest = latest


class JobContext:
    """What a handler knows about the attempt it is running.

    Workers make one for each attempt; a test, or a caller that runs a handler in-process
    (``definition(payload, ctx)``), makes its own. ``renew`` is what :meth:`renew_lease` calls to
    extend the lease (None: there is no lease, nothing to do). ``cancel`` is the flag that the
    worker sets when the job's cancellation is requested (None: a flag of its own, never set
    unless the caller keeps it and sets it). ``worker_ids`` are the worker id of every attempt
    so far, this one last; ``using`` is the database alias the job lives in. ``report`` is
    what the first :meth:`set_progress` or :meth:`set_meta` calls with the attempt's
    ``ProgressNote`` (None: nothing is written, the values are only kept here).
    """

    # What this attempt set (its handler's thread alone writes these), and the note that the
    # worker reads them from once posted: class defaults, so that a job that sets nothing costs
    # no assignment.
    _progress: Progress | None = None
    _meta: dict[str, Any] | None = None
    _meta_json: str | None = None
    _note: ProgressNote | None = None

    def __init__(
        self,
        job_id: uuid.UUID,
        job_type: str,
        attempt: int,
        organization_id: uuid.UUID | None,
        queue: str,
        logger: logging.LoggerAdapter[logging.Logger],
        *,
        renew: Callable[[], None] | None = None,
        cancel: CancelFlag | None = None,
        worker_ids: list[str] | None = None,
        using: str = "default",
        report: Callable[[ProgressNote], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.job_type = job_type
        self.attempt = attempt
        self.organization_id = organization_id
        self.queue = queue
        self.logger = logger
        #: The worker id of every attempt so far, this one last.
        self.worker_ids: list[str] = [] if worker_ids is None else worker_ids
        #: The database alias the job lives in (``runworkers --database``): where a handler that
        #: enqueues follow-up work, or reads the jobs tables, should do it.
        self.using = using
        self._renew = renew
        self._cancel = CancelFlag() if cancel is None else cancel
        self._parents: tuple[ParentOutcome, ...] | None = None
        self._report = report

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id!r}, job_type={self.job_type!r}, "
            f"attempt={self.attempt!r}, organization_id={self.organization_id!r}, "
            f"queue={self.queue!r}, worker_ids={self.worker_ids!r}, using={self.using!r})"
        )

    @property
    def parents(self) -> tuple[ParentOutcome, ...]:
        """The jobs this one waited for (``enqueue(after=...)``, a workflow's steps), read from
        the database at the first use: each one's id, step name, status, result and error code.
        Empty for a job that waited for none."""
        if self._parents is None:
            self._parents = read_parents(self.job_id, self.using)
        return self._parents

    @property
    def parent_results(self) -> dict[str, Any]:
        """The results of the parents that completed, by step name (by job id, as text, for a
        parent that is no step of a workflow, or whose step name another parent has: steps of
        two workflows may share one)."""
        names = Counter(parent.step for parent in self.parents if parent.step is not None)
        shared = {name for name, count in names.items() if count > 1}
        return {
            str(parent.id) if parent.step in shared else parent.key: parent.result
            for parent in self.parents
            if parent.status == "completed"
        }

    @property
    def parent_counts(self) -> dict[str, int]:
        """How many parents ended each way: ``completed``, ``dead``, ``cancelled`` (a group's
        callback reads its members' outcomes here)."""
        counts = dict.fromkeys(("completed", "dead", "cancelled"), 0)
        for parent in self.parents:
            counts[parent.status] = counts.get(parent.status, 0) + 1
        return counts

    @property
    def cancelled(self) -> bool:
        """True once someone asked this job to stop (seen at the worker's next lease renewal).

        Cooperative: check it between steps, and return or ``raise_if_cancelled()`` to stop.
        """
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~django_pgoutbox.errors.Cancelled` if cancellation was requested."""
        if self._cancel.is_set():
            raise Cancelled(f"job {self.job_id} was cancelled while it ran")

    def renew_lease(self) -> None:
        """Extend this attempt's lease now (workers also renew it on their own while it runs).

        Raises :class:`~django_pgoutbox.errors.Cancelled` if the job's cancellation was requested,
        and :class:`~django_pgoutbox.errors.LeaseLost` if another worker took the job over.
        """
        if self._renew is not None:
            self._renew()
        self.raise_if_cancelled()

    @property
    def progress(self) -> dict[str, Any] | None:
        """What :meth:`set_progress` was last given, as ``jobs.progress`` holds it
        (``{"done": ..., "total": ..., "message": ...}``), or None."""
        if self._progress is None:
            return None
        done, total, message = self._progress
        return {"done": done, "total": total, "message": message}

    @property
    def meta(self) -> dict[str, Any]:
        """Every value :meth:`set_meta` was given, by key (a copy)."""
        return dict(self._meta or {})

    def set_progress(
        self, done: int | float, total: int | float | None = None, message: str | None = None
    ) -> None:
        """Say how far this attempt has come: ``done`` of ``total`` (None: unknown), and what
        it is doing (``message``, at most 1,000 characters).

        Call it as often as you like: the worker writes the job's ``progress`` at most once a
        second, the last value each time, and the last of all with the job's outcome. Raises
        ``TypeError`` or ``ValueError`` (:class:`~django_pgoutbox.errors.InvalidProgress`)
        naming the argument that cannot be stored: a negative or non-finite count, ``total``
        below ``done``, a message too long or with a NUL character.
        """
        self._progress = check_progress(done, total, message)
        self._publish()

    def set_meta(self, **values: Any) -> None:
        """Set keys of this job's metadata (``jobs.meta``, a JSON object), written as
        :meth:`set_progress` writes progress; keys not named keep their values.

        Values must be JSON (no NaN, no cycles) and the whole object at most 64 KiB of JSON;
        else :class:`~django_pgoutbox.errors.InvalidProgress` (a ``ValueError``) names the key,
        and nothing of the call is kept. The values are copied as JSON at the call.
        """
        if not values:
            return
        self._meta, self._meta_json = merge_meta(self._meta or {}, values)
        self._publish()

    def _publish(self) -> None:
        """Give the worker the values set now: the first time, post the note; after, replace
        what it holds (one attribute: the worker reads it when it writes)."""
        latest: Report = (self._progress, self._meta_json)
        if self._note is not None:
            self._note.latest = latest
        elif self._report is not None:
            self._note = ProgressNote((self.job_id, self.attempt), latest)
            self._report(self._note)

    def _adopt(self, report: Report) -> None:
        """Take the values a handler set in another process (``isolation="process"``): they
        are written with the outcome."""
        progress, meta_json = report
        self._progress, self._meta_json = progress, meta_json
        self._meta = None if meta_json is None else json.loads(meta_json)

    def _reported(self) -> Report | None:
        """What this attempt set, as the worker writes it with the outcome (None: nothing)."""
        if self._progress is None and self._meta_json is None:
            return None
        return (self._progress, self._meta_json)
