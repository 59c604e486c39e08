"""What a handler is given besides its payload: ``JobContext``, and the flag that cancels it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from django_pgoutbox.errors import Cancelled


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


class JobContext:
    """What a handler knows about the attempt it is running.

    Workers make one for each attempt; a test, or a caller that runs a handler in-process
    (``definition(payload, ctx)``), makes its own. ``renew`` is what :meth:`renew_lease` calls to
    extend the lease (None: there is no lease, nothing to do). ``cancel`` is the flag that the
    worker sets when the job's cancellation is requested (None: a flag of its own, never set
    unless the caller keeps it and sets it). ``worker_ids`` are the worker id of every attempt
    so far, this one last; ``using`` is the database alias the job lives in.
    """

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

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id!r}, job_type={self.job_type!r}, "
            f"attempt={self.attempt!r}, organization_id={self.organization_id!r}, "
            f"queue={self.queue!r}, worker_ids={self.worker_ids!r}, using={self.using!r})"
        )

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
