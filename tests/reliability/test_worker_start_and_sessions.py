"""A worker started while its database refuses connections: ``runworkers`` against a port nothing
listens on waits for the database (``runworkers.START_WAIT``), and its warning must name the
reason the connection failed, not only libpq's hint that follows it."""

from __future__ import annotations

from typing import Any

from tests.processes import wait_for
from tests.reliability.cluster import free_port

QUIET = {"PGOUTBOX_DEBUG": "0"}


def _unreachable_url() -> str:
    return f"postgres://postgres@127.0.0.1:{free_port()}/hst_nowhere"


def test_the_start_warning_names_why_the_connection_failed(start_worker: Any) -> None:
    worker = start_worker(database_url=_unreachable_url(), env=QUIET)

    def warned() -> str:
        """the worker says it waits for its database"""
        return next((line for line in worker.output().splitlines() if "at start" in line), "")

    line = wait_for(warned, timeout=60)
    # libpq's message is the failure, then a hint on a line of its own: both, on one line.
    assert "Connection refused" in line, line
    assert "Is the server running" in line, line
