"""A queue paused or resized at run time, as its coordinator knows it (``queue_controls``).

The coordinator reads its queue's row on a lane (``ReadControl``) before its first claim, when
the listener passes on a notification of a change, after a lane lost its connection (and with
it, maybe, a notification), and with each lease recovery (once per poll interval), which finds
a change whose notification was lost; ``Controls``,
its own, says when, and what changed since the last answer (``Change``), which the coordinator
then applies: no claim while paused (the attempts claimed but not started are given back),
handler threads added or retired, the claims' settings replaced.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg

from django_pgoutbox import queries
from django_pgoutbox.conf import QueueSettings
from django_pgoutbox.db import RECONNECT, ErrorKind, classify_error
from django_pgoutbox.queue_controls import Control
from django_pgoutbox.retry import summarize

logger = logging.getLogger("django_pgoutbox.worker")

#: The longest that notifications of changes hold a queue's claims back while their reads are
#: answered (seconds): they are read within a second, as a pause's reach is.
NOTICE_HOLD = 0.5

#: The SQLSTATEs of a read of ``queue_controls`` that will fail again until an operator acts:
#: no table (a release whose migration 0009 is not applied yet), no column, no privilege; the
#: queue then runs as its settings say. Any other failure (a lock timeout) may pass: a pause is
#: not lifted by it, and a worker that has not read the row yet claims nothing meanwhile.
LASTING_FAILURES = frozenset({"42P01", "42703", "42501"})


@dataclass(eq=False)
class ReadControl:
    """Read one queue's row of ``queue_controls``; returns its ``Control``.

    A lost connection is the lane's to retry; any other error is not the worker's end: one that
    lasts (the table gone, a permission taken away) runs the queue as its settings say, one that
    may pass (a lock timeout) keeps what was last read (``Controls``), and each says why."""

    #: A lock on ``queue_controls`` (a migration) can hold it up: then the other lanes do not
    #: wait for it (``lanes.SLOW_FIRST``).
    held_by_locks: ClassVar[bool] = True
    queue: str
    #: The notifications taken when it was sent (``Controls.notices``): those its answer covers.
    covers: int = 0

    def run(self, connection: psycopg.Connection[Any]) -> Control:
        try:
            with connection.cursor() as cursor:
                cursor.execute(queries.READ_QUEUE_CONTROL, [self.queue])
                row = cursor.fetchone()
        except psycopg.Error as error:
            if classify_error(error) in (*RECONNECT, ErrorKind.CONFLICT):
                raise
            problem = f"queue_controls could not be read ({summarize(error)})"
            lasting = getattr(error, "sqlstate", None) in LASTING_FAILURES
            return Control(problems=(problem,), unread=lasting)
        return Control() if row is None else Control.from_row(self.queue, *row)


@dataclass(frozen=True)
class Change:
    """What a new answer changes: the queue paused or resumed, its claims' settings (None:
    unchanged), how many handler threads to add (or, negative, to retire)."""

    paused: bool | None = None
    settings: QueueSettings | None = None
    threads: int = 0


class Controls:
    """When the coordinator reads its queue's row, and what it last read: the coordinator's
    own."""

    def __init__(self, settings: QueueSettings, concurrency: int) -> None:
        #: The settings and the concurrency the process started with: what a reset goes back to.
        self.base = settings
        self.base_concurrency = concurrency
        self.control = Control()
        #: No answer yet: the queue claims nothing (a paused queue stays paused at a restart).
        self.known = False
        #: Reads in flight: one, or two when a lost connection made the one in flight too old
        #: (``due``).
        self.reading = 0
        self.asked = True  # read now: at start, or a notification came
        #: The notifications taken, and how many of them the last answer had seen: a claim
        #: waits until the read sent after the last one is answered (``may_claim``), or
        #: ``NOTICE_HOLD`` since the first not seen yet.
        self.notices = 0
        self._covered = 0
        self._reading_covers = 0
        #: What the answer applied last covers: an older read answered after it is not applied.
        self._applied = -1
        self._unseen_since = 0.0
        #: A lane lost its connection (``doubted``): no claim until the answer to a read sent
        #: after the notice it counts as.
        self._doubt = 0
        self._said: set[str] = set()

    @property
    def claimable(self) -> bool:
        """Whether the queue may claim: its row read, and not paused."""
        return self.known and not self.control.paused

    def may_claim(self, now: float) -> bool:
        """Whether to send a claim now: ``claimable``, and no notification of a change waits
        for its read (a pause notified, then a job: the job is not claimed meanwhile). Not
        longer than ``NOTICE_HOLD``: notifications that keep coming faster than a read is
        answered would else hold the claims for as long as they come."""
        return self.claimable and self._covered >= self._doubt and self.hold_deadline(now) is None

    def hold_deadline(self, now: float) -> float | None:
        """When claims held back by a notification not yet read may go again (``may_claim``),
        if that is still to come: the coordinator must wake for it, though no message comes."""
        if self._covered == self.notices:
            return None
        at = self._unseen_since + NOTICE_HOLD
        return at if now < at else None

    def notified(self, now: float) -> None:
        """A notification (or a reconnect): the row may have changed; read it now."""
        if self._covered == self.notices:
            self._unseen_since = now
        self.asked = True
        self.notices += 1

    def doubted(self, now: float) -> None:
        """A lane's connection was lost: the listener's may be too, and a change notified
        meanwhile with it. A notice, whose read no claim goes before (a read in flight was
        sent too soon to count): it goes first on the lane that reconnects, so this costs no
        wait, and unlike a notification's hold it has no limit (a lane that cannot read
        cannot claim either)."""
        self.notified(now)
        self._doubt = self.notices

    def due(self) -> bool:
        """Whether to read the row now on its own: at start, after a notification or a failed
        read (else it goes with each lease recovery, ``periodic``). Not while a read is in
        flight, unless it was sent before a lost connection (``doubted``): it cannot lift the
        doubt, and it may be slow to come back (the poll's read goes with a lease recovery,
        which waits for a row lock or steps over a held horizon's dead entries) while the
        claims wait for the doubt to be lifted."""
        return self.asked and (not self.reading or self._reading_covers < self._doubt)

    def read(self) -> ReadControl:
        self.reading += 1
        self.asked = False
        self._reading_covers = self.notices
        return ReadControl(self.base.name, self.notices)

    def periodic(self) -> ReadControl | None:
        """The read to send with a lease recovery (once per poll interval), unless one is in
        flight."""
        return None if self.reading else self.read()

    def failed(self, covers: int) -> None:
        """The read sent when ``covers`` notifications were taken failed (the lane backs off):
        read again as soon as a lane is ready, unless a later read is in flight."""
        self.reading -= 1
        if covers >= self._reading_covers:
            self.asked = True

    def preset(self, control: Control) -> tuple[QueueSettings, int]:
        """The row as read before the coordinator started: the settings and the concurrency
        to start with."""
        self._apply(control, self.base, self.base_concurrency, self.notices)
        self.asked = False
        return control.settings(self.base), control.concurrency(self.base_concurrency)

    def answered(
        self, control: Control, settings: QueueSettings, concurrency: int, covers: int
    ) -> Change:
        """A read, sent when ``covers`` notifications were taken (``ReadControl.covers``), came
        back with ``control``; the coordinator runs with ``settings`` and ``concurrency``
        threads now. Returns what to change."""
        self.reading -= 1
        return self._apply(control, settings, concurrency, covers)

    def _apply(
        self, control: Control, settings: QueueSettings, concurrency: int, covers: int
    ) -> Change:
        if covers < self._applied:
            return Change()  # sent before the answer applied last: what it read is older
        queue = self.base.name
        kept = control.unread is False  # a failure that may pass: what was read stays
        if kept and covers >= self._doubt > self._covered:
            # Not the row: the doubt stays, until a read answers with it (the poll's, at the
            # latest: a failure that may pass is not read again at once).
            covers = self._doubt - 1
        self._covered = max(self._covered, covers)
        for problem in control.problems:
            if problem not in self._said:  # said once, not at every poll
                self._said.add(problem)
                then = (
                    ""
                    if control.unread is None
                    else "; the settings apply"
                    if not kept
                    else "; the values last read apply"
                    if self.known
                    else "; claiming none of its jobs until it is read"
                )
                logger.error("queue %s: %s%s", queue, problem, then, extra={"queue": queue})
        if kept:  # a pause is not lifted, nor a limit, by a read that failed
            return Change()
        self._applied = covers
        before, first = self.control, not self.known
        self.control, self.known = control, True
        paused = None
        if control.paused != before.paused or (first and control.paused):
            paused = control.paused
            logger.warning(
                "queue %s: %s",
                queue,
                "paused: claiming none of its jobs until it is resumed"
                if control.paused
                else "resumed",
                extra={"queue": queue},
            )
        wanted = control.settings(self.base)
        threads = control.concurrency(self.base_concurrency) - concurrency
        if wanted != settings or threads:
            logger.info(
                "queue %s: concurrency %d, max running %s, rate limit %s",
                queue,
                concurrency + threads,
                "none" if wanted.max_running is None else wanted.max_running,
                "none" if wanted.rate_limit is None else f"{wanted.rate_limit:g}/s",
                extra={"queue": queue},
            )
        return Change(paused, wanted if wanted != settings else None, threads)
