"""A JSON log formatter: one object per line, with every ``extra`` field of the record.

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
from datetime import UTC, datetime
from typing import Any

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
