"""``django.tasks`` (Django 6.0+) or, on Django 5.2, the ``django-tasks`` backport: one import.

The two packages have the same API under different module names (and one exception renamed);
for the type checker the names are ``Any``, since either may be the one installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    BaseTaskBackend: Any
    InvalidTask: Any
    Task: Any
    TaskContext: Any
    TaskError: Any
    TaskResult: Any
    TaskResultDoesNotExist: Any
    TaskResultStatus: Any
    normalize_json: Any
    task: Any
    task_enqueued: Any
    task_finished: Any
    task_started: Any
    log_task_finished: Any
    log_task_started: Any
else:
    try:
        from django.tasks import task
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import (
            log_task_finished,
            log_task_started,
            task_enqueued,
            task_finished,
            task_started,
        )
        from django.utils.json import normalize_json
    except ImportError:  # Django 5.2
        from django_tasks import task
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import (
            log_task_finished,
            log_task_started,
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "log_task_finished",
    "log_task_started",
    "normalize_json",
    "task",
    "task_enqueued",
    "task_finished",
    "task_started",
]
