"""Settings for the django-tasks-db peer benchmark: the test project plus django-tasks-db.

The test project's own ``TASKS["default"]`` (our queue) stays as it is; django-tasks-db is
reachable under the ``tasksdb`` alias, which its ``db_worker`` command takes as ``--backend``.
Under Django 6.x django-tasks-db uses Django's own ``django.tasks`` (not the backport).

``TASKSDB_BENCH_CONN_MAX_AGE`` (seconds, or ``none`` for a connection kept for good) overrides
the test project's ``CONN_MAX_AGE = 0``: the benchmark sweeps it for the workers.
"""

from __future__ import annotations

import os
from typing import Any

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES as _PROJECT_DATABASES
from testproject.settings import INSTALLED_APPS as _PROJECT_APPS
from testproject.settings import TASKS as _PROJECT_TASKS

# DEBUG keeps every query of a connection in memory, and makes db_worker autoreload by default.
DEBUG = False

INSTALLED_APPS = [*_PROJECT_APPS, "django_tasks_db"]

_TASKSDB_BACKEND: dict[str, Any] = {
    "BACKEND": "django_tasks_db.DatabaseBackend",
    "QUEUES": ["default"],
}
TASKS = {**_PROJECT_TASKS, "tasksdb": _TASKSDB_BACKEND}


def _conn_max_age(raw: str) -> int | None:
    return None if raw.strip().lower() == "none" else int(raw)


DATABASES = {name: dict(options) for name, options in _PROJECT_DATABASES.items()}
if os.environ.get("TASKSDB_BENCH_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = _conn_max_age(os.environ["TASKSDB_BENCH_CONN_MAX_AGE"])
