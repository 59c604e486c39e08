"""One live process per worker id: a ``runworkers`` process takes its id before it runs.

Two processes with one id would share a heartbeat row (and the first to stop would delete it,
hiding the other from the health report) and their leases would be told apart by nothing. A
process takes an id that no row holds, that its own row holds (the same hostname and pid: the
process started again by ``exec``, or a container's restart as pid 1 again), whose process is
gone from this host, or whose row is stale (not written for ``DEFAULT_MAX_AGE`` seconds: a
process killed elsewhere). Otherwise the id is in use, and the process does not start.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from django.db import connections, transaction

from django_pgoutbox import queries
from django_pgoutbox.health import DEFAULT_MAX_AGE


class WorkerIdInUse(ValueError):
    """Another live process runs under this worker id."""


def take(params: Mapping[str, Any], using: str) -> None:
    """Take ``params["worker_id"]`` for this process (``params``: HEARTBEAT's), writing its
    first heartbeat; raise ``WorkerIdInUse`` if a live process holds it."""
    worker_id = params["worker_id"]
    try:
        for _ in range(3):  # a row written by another process between our two statements
            with transaction.atomic(using=using), connections[using].cursor() as cursor:
                cursor.execute(queries.LOCK_WORKER_ID, [worker_id])
                row = cursor.fetchone()
                if row is None:
                    cursor.execute(queries.TAKE_WORKER_ID, dict(params))
                    if cursor.fetchone() is not None:
                        return
                    continue
                hostname, pid, age = row
                if _alive_elsewhere(hostname, pid, age):
                    raise WorkerIdInUse(
                        f"worker id {worker_id!r} is in use by process {pid} on {hostname}, "
                        f"seen {age:.0f}s ago; give this process another --worker-id (or none)"
                    )
                cursor.execute(queries.HEARTBEAT, dict(params))
                return
        raise WorkerIdInUse(f"worker id {worker_id!r} is being taken by another process")
    finally:
        if not connections[using].in_atomic_block:
            connections[using].close()  # the loops have their own connections


def _alive_elsewhere(hostname: str, pid: int, age: float) -> bool:
    """Whether the process of a heartbeat row, not this one, may still be running."""
    if age > DEFAULT_MAX_AGE:
        return False
    if hostname != socket.gethostname():
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
