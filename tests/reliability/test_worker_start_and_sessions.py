"""A worker started while its database refuses connections: ``runworkers`` against a port nothing
listens on waits for the database (``runworkers.START_WAIT``). SIGTERM or Ctrl-C (SIGINT) during
that wait must end the process at once, with status 0 as after a stop of a running worker, one
line and no traceback; and the warning must name the reason the connection failed, not only
libpq's hint that follows it."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.processes import wait_for
from tests.reliability.cluster import free_port

QUIET = {"PGOUTBOX_DEBUG": "0"}


def _unreachable_url() -> str:
    return f"postgres://postgres@127.0.0.1:{free_port()}/hst_nowhere"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_the_start_wait_exits_at_once_without_a_traceback(
    start_worker: Any, signum: int
) -> None:
    worker = start_worker(database_url=_unreachable_url(), env=QUIET)

    def waiting() -> bool:
        """the worker says it waits for its database"""
        return "unavailable at start" in worker.output()

    wait_for(waiting, timeout=60)
    asked = time.monotonic()
    worker.signal(signum)
    status = worker.wait(timeout=20)
    took = time.monotonic() - asked
    output = worker.output()
    assert "Traceback" not in output, output
    assert status == 0, output
    assert took < 10, took
    assert signal.Signals(signum).name in output, output


def test_the_start_warning_names_why_the_connection_failed(start_worker: Any) -> None:
    worker = start_worker(database_url=_unreachable_url(), env=QUIET)

    def warned() -> str:
        """the worker says it waits for its database"""
        return next((line for line in worker.output().splitlines() if "at start" in line), "")

    line = wait_for(warned, timeout=60)
    # libpq's message is the failure, then a hint on a line of its own: both, on one line.
    assert "Connection refused" in line, line
    assert "Is the server running" in line, line
