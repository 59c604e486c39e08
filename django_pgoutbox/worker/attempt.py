"""One claimed attempt, from its claim to its outcome's write."""

from __future__ import annotations

import json
import uuid
from typing import Any, Final

from django_pgoutbox.context import CancelFlag
from django_pgoutbox.queries import ClaimRow
from django_pgoutbox.worker.execute import ClaimedJob

#: A running attempt's key: the job and its attempt number (the fencing token).
Key = tuple[uuid.UUID, int]

# Where an attempt stands, as its queue's coordinator sees it (``Attempt.state``).
#: Handed to the handler threads: waiting for one, or running.
QUEUED: Final = 0
#: A suspect held back to run alone (``runner``, "Suspects").
HELD: Final = 1
#: Its handler returned: its outcome waits to be written.
FINISHED: Final = 2
#: Its outcome is being written, by a statement in flight on a lane.
WRITING: Final = 3
#: Failed for its timeout while its handler still runs: whatever that handler returns is late.
TIMED_OUT: Final = 4
#: Its handler thread left it without an outcome; its lease is left to expire.
LOST: Final = 5


class Attempt:
    """One claimed attempt (a slotted class: one is made for every job claimed).

    The claim's row and ``cancel`` are what a handler thread reads; every other field belongs
    to the queue's coordinator thread, which alone writes and reads it.
    """

    __slots__ = (
        "attempt",
        "cancel",
        "deadline",
        "id",
        "lease_lost",
        "low_water",
        "row",
        "slot",
        "state",
        "worker_ids",
    )

    def __init__(
        self, row: ClaimRow, worker_ids: tuple[str, ...] | None = None, low_water: int = 0
    ) -> None:
        self.id: uuid.UUID = row.id
        self.attempt: int = row.attempt
        #: The key of the coordinator's table of attempts: ``key`` with the id as an int, whose
        #: hash costs no Python call (a UUID's does).
        self.slot = (row.id.int, row.attempt)
        #: The claim's row: the handler thread turns it into a ClaimedJob (``job()``), so that
        #: payloads are parsed off the coordinator's thread.
        self.row = row
        #: The attempt's worker_ids when the row's are this worker's alone (no JSON to parse).
        self.worker_ids = worker_ids
        #: Set by the coordinator when the job's cancellation is requested; the handler's
        #: ``ctx.cancelled`` reads it.
        self.cancel = CancelFlag()
        #: When its handler's thread finishes it with fewer than this many claimed jobs left
        #: waiting for a thread, the coordinator is woken to claim more (set at the claim, read
        #: by the handler thread: a message, not shared state).
        self.low_water = low_water
        # -- the coordinator's own -------------------------------------------------------------
        self.state: int = QUEUED
        #: When the coordinator fails it for its timeout (monotonic; thread isolation only). Set
        #: when its handler starts: a prefetched job waits without its clock running.
        self.deadline: float | None = None
        self.lease_lost = False

    @property
    def key(self) -> Key:
        return (self.id, self.attempt)

    def job(self) -> ClaimedJob:
        """The attempt's job, its payload parsed (on the handler's thread); raises for a row
        that cannot be read (a payload nested deeper than Python's parser goes, say)."""
        payload, worker_ids = self.row.payload, self.worker_ids
        return self._job(
            # An empty payload, the commonest, without the JSON decoder's two calls.
            {} if payload == "{}" else json.loads(payload),
            worker_ids if worker_ids is not None else json.loads(self.row.worker_ids),
        )

    def bare_job(self) -> ClaimedJob:
        """The attempt's job with neither its payload nor its worker_ids parsed: what the
        coordinator's own outcomes (a timeout) and the outcome of an unreadable row carry."""
        return self._job({}, ())

    def _job(self, payload: dict[str, Any], worker_ids: tuple[str, ...] | list[str]) -> ClaimedJob:
        row = self.row
        return ClaimedJob.from_claim(
            row.id,
            row.job_type,
            payload,
            row.attempt,
            row.max_attempts,
            row.organization_id,
            row.queue,
            row.priority,
            row.created_at,
            row.waited,
            worker_ids,
        )


def slot(key: Key) -> tuple[int, int]:
    """The ``Attempt.slot`` of ``key``."""
    return (key[0].int, key[1])
