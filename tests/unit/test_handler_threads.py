"""HandlerThreads resized up and down many times (a queue resized at run time): it keeps the
threads that run, not every thread it ever started, and still runs each attempt it is given."""

from __future__ import annotations

import threading
import time
from typing import Any

from django_pgoutbox.worker.handlers import HandlerThreads
from django_pgoutbox.worker.mailbox import Mailbox


def test_a_thousand_resizes_leave_the_threads_that_run() -> None:
    ran: list[Any] = []
    done = threading.Event()

    def run(attempt: Any) -> None:
        ran.append(attempt)
        if len(ran) == 3:
            done.set()

    threads = HandlerThreads(2, "t", run, Mailbox())
    threads.start()
    for _ in range(1000):
        threads.add_thread()
        threads.retire_thread()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(t.is_alive() for t in threads._threads) > 3:
        time.sleep(0.01)
        threads.add_thread()  # each add forgets the threads that ended since
        threads.retire_thread()
    assert len(threads._threads) <= 4, len(threads._threads)
    for attempt in ("a", "b", "c"):
        threads.submit(attempt)  # type: ignore[arg-type]
    assert done.wait(10)
    assert sorted(ran) == ["a", "b", "c"]
    threads.shutdown()
