"""The child process of an ``isolation="process"`` attempt (see ``worker.isolated``).

The forkserver imports this module once, before any fork: importing it sets Django up, so that
each attempt's child starts with its settings, apps and job registry loaded, and with no database
connection open. So that the forkserver can import it before Django is set up, neither it nor its
package (``django_pgoutbox.worker``, whose ``__init__`` imports nothing eagerly) imports models at
module level.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import uuid
from typing import Any

import django
from django.apps import apps

from django_pgoutbox.errors import InvalidResult
from django_pgoutbox.log import SHOWN_LEVEL_VARIABLE, show_job_logs

if not apps.ready:
    django.setup()
# Django's set-up configured logging anew: print ctx.logger's records as the worker does.
if _shown_level := os.environ.get(SHOWN_LEVEL_VARIABLE):
    show_job_logs(sys.stderr, logging.getLevelName(_shown_level))


def run_attempt(
    job_type: str, payload: dict[str, Any], fields: dict[str, Any], sender: Any
) -> None:  # pragma: no cover - runs in the child process; covered by the process tests
    from django.db import connections

    from django_pgoutbox.context import JobContext
    from django_pgoutbox.log import job_logger
    from django_pgoutbox.registry import get_job

    # Ctrl-C in a terminal, or a supervisor that signals the whole process group, must not kill
    # the attempt: the worker stops it (SIGKILL) at its timeout, at a cancel, or when the grace
    # period of a shutdown runs out, and lets it finish otherwise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    definition = get_job(job_type)
    message: tuple[str, Any]
    ctx: JobContext | None = None
    try:
        if definition is None:
            raise LookupError(f"no handler for job type {job_type!r} in the isolated process")
        logger = job_logger(_Attempt(fields))
        ctx = JobContext(**fields, logger=logger)
        message = ("return", definition.func(payload, ctx))
    except BaseException as error:
        message = ("raise", error)
    finally:
        connections.close_all()
    # The progress and metadata the handler set last go with its answer: the worker writes
    # them with the outcome (none while the child runs: docs/progress.md).
    sender.send_bytes(_portable(message) + pickle.dumps(None if ctx is None else ctx._reported()))
    sender.close()


class _Attempt:
    """The attempt that ``job_logger()`` names, from the fields the worker sent."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.id: uuid.UUID = fields["job_id"]
        self.job_type: str = fields["job_type"]
        self.queue: str = fields["queue"]
        self.attempt: int = fields["attempt"]


def _portable(message: tuple[str, Any]) -> bytes:
    """``message`` pickled so that the worker can unpickle it, or a stand-in that it can."""
    kind, value = message
    try:
        data = pickle.dumps(message)
        pickle.loads(data)
        return data
    except Exception as error:
        if kind == "return":
            stand_in: BaseException = InvalidResult(
                f"the handler returned {type(value).__name__}, which cannot leave its "
                f"process: {error}"
            )
        else:
            # Keep the class name and the message of an exception that cannot be pickled.
            stand_in = RuntimeError(f"{type(value).__name__}: {value}")
        return pickle.dumps(("raise", stand_in))
