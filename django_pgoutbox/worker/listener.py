"""The LISTEN connection: one per worker process, waking the loop that a notification concerns.

A notification says only "new work may exist in queue X". It is not durable: one sent while this
connection is down is lost. So on every (re)connect the listener wakes every queue, which then
claims from the table, and the queues poll on their own anyway. Losing notifications costs
latency, never a job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import psycopg
from psycopg import sql

from django_pgoutbox import metrics
from django_pgoutbox.db import raw_connection_params

logger = logging.getLogger("django_pgoutbox.worker")

#: How often the listener checks whether it should stop, in seconds.
STOP_CHECK_INTERVAL = 0.5
RECONNECT_BACKOFF = (0.5, 30.0)


class Listener:
    def __init__(
        self,
        *,
        using: str,
        channels: Mapping[str, Callable[[str], None]],
        on_connect: Callable[[], None],
    ) -> None:
        self.using = using
        self.channels = dict(channels)  # channel -> called with each notification's payload
        self.on_connect = on_connect
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgoutbox-listener", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        params = raw_connection_params(self.using)
        backoff = RECONNECT_BACKOFF[0]
        while not self._stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    for channel in self.channels:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.connected.set()
                    backoff = RECONNECT_BACKOFF[0]
                    # Anything sent while we were away is lost: look at every queue once.
                    self.on_connect()
                    while not self._stop.is_set():
                        for notification in conn.notifies(timeout=STOP_CHECK_INTERVAL):
                            self.channels[notification.channel](notification.payload)
            except psycopg.Error as error:
                self.connected.clear()
                if self._stop.is_set():
                    return
                metrics.NOTIFICATION_FAILURES.inc()
                logger.warning(
                    "LISTEN connection failed (%s); reconnecting in %.1fs, polling meanwhile",
                    error,
                    backoff,
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF[1])
