"""The tasks the django-tasks-db peer benchmark enqueues, on the ``tasksdb`` backend alias.

django-tasks-db 0.13 on Django 6.x resolves a row's ``task_path`` to a ``django.tasks.Task``
(it raises SuspiciousOperation for anything else), so these use Django's own ``@task``.
"""

from __future__ import annotations

import os
import time

from django.tasks import task

BACKEND_ALIAS = "tasksdb"
LATENCY_FILE_ENV = "TASKSDB_BENCH_LATENCY_FILE"


@task(backend=BACKEND_ALIAS)
def noop() -> None:
    """Do nothing: the drain measures the queue, not the work."""


@task(backend=BACKEND_ALIAS)
def record_start(seq: int) -> None:
    """Append ``seq`` and the time this task started to the file named by the env var."""
    started = time.time()
    with open(os.environ[LATENCY_FILE_ENV], "a", encoding="utf-8") as out:
        out.write(f"{seq} {started!r}\n")
