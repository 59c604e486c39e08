"""Logging: the loggers of job attempts, and a JSON formatter.

``job_logger()`` is the ``ctx.logger`` of an attempt (in a worker's thread or in the child
process of an isolated one); ``job_fields()`` are the fields a job's records carry.
``show_job_logs()`` prints those records on a worker's console unless the project's ``LOGGING``
routes them.

``JSONFormatter`` writes one object per line, with every ``extra`` field of the record.

Job records carry ``job_id``, ``job_type``, ``queue``, ``attempt`` and ``outcome``; the relay's
carry ``event_id`` and ``event_type``. Tracebacks go into ``exc_info`` as text, so a failed job's
traceback can be found by its id::

    LOGGING = {
        "version": 1,
        "formatters": {"json": {"()": "django_pgoutbox.log.JSONFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
        "loggers": {"django_pgoutbox": {"handlers": ["console"], "level": "INFO"}},
    }
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

#: The parent of every ``ctx.logger``: ``django_pgoutbox.jobs.<job type>``.
JOB_LOGGERS = "django_pgoutbox.jobs"
#: Set by ``show_job_logs()`` for the worker's isolated children (which set Django up anew):
#: the level their ``ctx.logger`` prints at.
SHOWN_LEVEL_VARIABLE = "PGOUTBOX_SHOW_JOB_LOGS"

#: Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class Attempt(Protocol):
    """What a job's log records say of its attempt (a claimed job has it)."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def job_type(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def attempt(self) -> int: ...


_job_loggers: dict[str, logging.Logger] = {}


def job_logger(job: Attempt) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose records carry the job's id, type, queue and attempt as ``extra`` fields."""
    base = _job_loggers.get(job.job_type)
    if base is None:  # getLogger takes the logging module's lock: once per job type
        base = _job_loggers[job.job_type] = logging.getLogger(
            f"django_pgoutbox.jobs.{job.job_type}"
        )
    return _JobLogger(base, job)


class _JobLogger(logging.LoggerAdapter[logging.Logger]):
    """``job_logger()``'s adapter: its ``extra`` is made at the first record, not for every job.

    Most handlers never log, and spelling out a job's id cost more than a no-op job's handler.
    """

    def __init__(self, logger: logging.Logger, job: Attempt) -> None:
        super().__init__(logger)
        self._job = job
        self._fields: dict[str, object] | None = None

    @property
    def extra(self) -> dict[str, object]:
        if self._fields is None:
            self._fields = job_fields(self._job)
        return self._fields

    @extra.setter
    def extra(self, value: object) -> None:
        # LoggerAdapter.__init__ assigns its own (empty) extra: the job's fields stand instead.
        pass


def show_job_logs(stream: TextIO, level: int) -> bool:
    """Print ``ctx.logger``'s records at ``level`` and above on ``stream``, unless the project's
    ``LOGGING`` gives them (or the root logger) a handler; whether it did.

    Python drops a record no handler takes, below WARNING: a handler's ``ctx.logger.info(...)``
    would vanish with Django's default ``LOGGING``, as runserver's requests would without the
    handler Django gives ``django.server``. A worker prints what its jobs log, as runserver does.
    """
    jobs = logging.getLogger(JOB_LOGGERS)
    if jobs.hasHandlers():
        return False
    handler = logging.StreamHandler(stream)
    handler.addFilter(_unrouted)
    handler.setFormatter(
        logging.Formatter(
            "job %(job_id)s (%(job_type)s) attempt %(attempt)s: %(message)s",
            defaults={"job_id": "-", "job_type": "-", "attempt": "-"},
        )
    )
    jobs.addHandler(handler)
    if jobs.level == logging.NOTSET:
        jobs.setLevel(level)
    os.environ[SHOWN_LEVEL_VARIABLE] = logging.getLevelName(jobs.getEffectiveLevel())
    return True


def _unrouted(record: logging.LogRecord) -> bool:
    """Whether no logger between ``record``'s and ``JOB_LOGGERS`` has a handler: LOGGING may
    route one job type's logger (``django_pgoutbox.jobs.<type>``), whose records it prints, and
    whose propagation to this handler would print them twice."""
    loggers = logging.Logger.manager.loggerDict
    name = record.name
    while name.startswith(JOB_LOGGERS + "."):
        logger = loggers.get(name)
        if isinstance(logger, logging.Logger) and logger.handlers:
            return False
        name = name.rpartition(".")[0]
    return True


def job_fields(job: Attempt) -> dict[str, object]:
    """A job's fields for a log record's ``extra``."""
    return {
        "job_id": str(job.id),
        "job_type": job.job_type,
        "queue": job.queue,
        "attempt": job.attempt,
    }
