"""Writing what running handlers say of their progress and metadata, at most once a second.

A handler's ``ctx.set_progress()`` and ``ctx.set_meta()`` replace the values of the attempt's
``ProgressNote``; the first call posts the note to the coordinator (``(PROGRESS, note)``), the
rest cost no message. The coordinator (``Reporting``, its own) reads every note once a second
at most and sends the values that changed since it last wrote them, for all its
running attempts in one statement (``WriteProgress``, WRITE_PROGRESS) on a lane. A handler
that calls ``set_progress()`` a million times a second costs one write a second; its last
values go with its outcome (``Outcome.progress_json``), whatever was written before.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from django_pgoutbox import queries
from django_pgoutbox.context import ProgressNote
from django_pgoutbox.db import ErrorKind, classify_error
from django_pgoutbox.progress import Report, progress_json
from django_pgoutbox.retry import summarize
from django_pgoutbox.worker.attempt import QUEUED, Attempt, Key, slot
from django_pgoutbox.worker.execute import Outcome, with_report
from django_pgoutbox.worker.outcomes import STATEMENT_ERRORS

if TYPE_CHECKING:
    from django_pgoutbox.worker.state import QueueState

logger = logging.getLogger("django_pgoutbox.worker")

#: A job's progress and metadata are written at most once per this many seconds.
PROGRESS_INTERVAL = 1.0


@dataclass(eq=False)
class WriteProgress:
    """Write the progress and metadata of running attempts (WRITE_PROGRESS); the result: the
    ids written. A value PostgreSQL refuses (which the checks at the call should make
    impossible) costs its own job's write only: the rows go again one by one, and the
    refused one is logged and left out."""

    #: Each attempt's key and the values to write (read from its note by the coordinator).
    rows: list[tuple[Key, Report]]
    worker_id: str

    def run(self, connection: psycopg.Connection[Any]) -> list[uuid.UUID]:
        with connection.cursor() as cursor:
            try:
                queries.send(cursor, "WRITE_PROGRESS", self._params(self.rows))
            except STATEMENT_ERRORS as error:
                if classify_error(error) is not ErrorKind.DATA:
                    raise
                return self._one_by_one(cursor)
            return [row[0] for row in cursor.fetchall()]

    def _one_by_one(self, cursor: psycopg.Cursor[Any]) -> list[uuid.UUID]:
        written: list[uuid.UUID] = []
        for row in self.rows:
            try:
                queries.send(cursor, "WRITE_PROGRESS", self._params([row]))
            except STATEMENT_ERRORS as error:
                if classify_error(error) is not ErrorKind.DATA:
                    raise
                logger.error(
                    "job %s attempt %d: its progress could not be stored (%s); left out",
                    *(row[0][0], row[0][1], summarize(error)),
                    extra={"job_id": str(row[0][0])},
                )
                continue
            written.extend(found[0] for found in cursor.fetchall())
        return written

    def _params(self, rows: list[tuple[Key, Report]]) -> dict[str, Any]:
        ids, attempts, progress, meta = [], [], [], []
        for key, report in rows:
            try:  # checked at the call; a handler that wrote the context's privates is not
                done, meta_json = report
                text = None if done is None else progress_json(done)
                if meta_json is not None and type(meta_json) is not str:
                    raise TypeError(f"metadata of type {type(meta_json).__name__}")
            except Exception as error:
                logger.error(
                    "job %s attempt %d: its progress cannot be written (%s); left out",
                    *(key[0], key[1], summarize(error)),
                    extra={"job_id": str(key[0])},
                )
                continue
            ids.append(key[0])
            attempts.append(key[1])
            progress.append(text)
            meta.append(meta_json)
        return {
            "ids": ids,
            "attempts": attempts,
            "progress": progress,
            "meta": meta,
            "worker_id": self.worker_id,
        }


class Reporting:
    """The notes of a queue's running attempts, and when their values are written: the
    coordinator's own (its thread alone calls these)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        #: The notes posted, by ``Attempt.slot``, each with its attempt and the values last
        #: sent (None: none yet). A note leaves once its attempt is no longer running.
        self.notes: dict[tuple[int, int], tuple[Attempt, ProgressNote, Report | None]] = {}
        #: A write is in flight (one at a time).
        self.writing = False
        #: No write goes before this time (monotonic): once a second at most.
        self.next_write = 0.0

    def noted(self, note: ProgressNote, state: QueueState) -> None:
        """A handler's first ``set_progress()`` or ``set_meta()`` of its attempt."""
        attempt = state.attempts.get(slot(note.key))
        # Else its outcome (or its timeout's) carries the values, or it is no longer this
        # queue's (a thread the handler started calls after it returned).
        if attempt is not None and attempt.state == QUEUED:
            self.notes[attempt.slot] = (attempt, note, None)

    def due(self, now: float) -> bool:
        return bool(self.notes) and not self.writing and now >= self.next_write

    def deadline(self) -> float | None:
        """When a write may go, while notes are held and none is in flight."""
        return self.next_write if self.notes and not self.writing else None

    def take(self, now: float) -> WriteProgress | None:
        """The write of every value set since the last one (None: nothing changed). Attempts
        that ended are dropped: their outcome carries their last values."""
        self.next_write = now + PROGRESS_INTERVAL
        rows: list[tuple[Key, Report]] = []
        notes = self.notes
        for key, (attempt, note, sent) in list(notes.items()):
            if attempt.state != QUEUED:
                del notes[key]
                continue
            latest = note.latest
            if latest is not sent and not attempt.lease_lost:
                rows.append((attempt.key, latest))
        if not rows:
            return None
        self.writing = True
        return WriteProgress(rows, self.worker_id)

    def answered(self, request: WriteProgress, *, failed: bool) -> None:
        """The write came back; after a failure its values go again with the next (a value
        refused and left out counts as sent: it would be refused again)."""
        self.writing = False
        if failed:
            return
        notes = self.notes
        for key, latest in request.rows:
            found = notes.get((key[0].int, key[1]))
            if found is not None:
                notes[found[0].slot] = (found[0], found[1], latest)

    def last_values(self, attempt: Attempt, outcome: Outcome) -> Outcome:
        """``outcome``, made by the coordinator for ``attempt`` (its timeout), with the last
        values its handler had set."""
        found = self.notes.pop(attempt.slot, None)
        if found is None:
            return outcome
        return with_report(outcome, found[1].latest)
