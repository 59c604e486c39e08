"""A queue's connection lanes: threads that each send one statement at a time for the queue's
coordinator, on a connection of their own, and post the result back.

The coordinator never waits on the database: it hands a request to a free lane and goes on
with its mailbox. A queue has one lane, plus the ones ``CONNECTIONS`` adds for a backlog (while
one statement is in flight, the next is sent on another lane, so that two backends work at
once), plus, for a queue with FAIR or a limit, one on which renewals and recovery go while a
claim waits for the queue's lock. A lane opens its connection the first time it sends.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
from typing import Any, Protocol

import psycopg

from django_pgoutbox.db import DispatcherConnection, ErrorKind, classify_error
from django_pgoutbox.worker.mailbox import Mailbox

logger = logging.getLogger("django_pgoutbox.worker")

#: The message a lane posts: ``(REPLY, lane index, request, result, error, opened)``.
REPLY = "reply"


class Request(Protocol):
    """Work for a lane: one or a few statements, run on the lane's connection."""

    def run(self, connection: psycopg.Connection[Any]) -> Any: ...


class Lane:
    """One connection and the thread that sends on it."""

    def __init__(self, index: int, using: str, mailbox: Mailbox, name: str) -> None:
        self.index = index
        self._mailbox = mailbox
        self._connection = DispatcherConnection(using)
        self._inbox: queue_module.SimpleQueue[Request | None] = queue_module.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, request: Request) -> None:
        self._inbox.put(request)

    def stop(self, timeout: float | None = None) -> None:
        """Let the lane finish the statement it is sending, close its connection and end."""
        self._inbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _work(self) -> None:
        connection = self._connection
        try:
            while (request := self._inbox.get()) is not None:
                result: Any = None
                error: BaseException | None = None
                try:
                    result = request.run(connection.get())
                except BaseException as failure:
                    error = failure
                    if classify_error(failure) is ErrorKind.CONNECTION:
                        connection.close()
                self._mailbox.post((REPLY, self.index, request, result, error, connection.opened))
        finally:
            connection.close()
