"""A ``django.tasks`` backend: Django's task API, stored as jobs and run by ``runworkers``.

    TASKS = {"default": {"BACKEND": "django_pgoutbox.backend.PgOutboxBackend"}}

A task becomes a job whose type is the task's module path, on the queue named by its
``queue_name``, with its priority, and ``run_at`` = ``run_after``. The payload is
``{"task": {"backend": alias}, "args": [...], "kwargs": {...}}``. Retries, leases, dead letters,
metrics and the admin apply to tasks as to any job. On Django 5.2 the same works with the
``django-tasks`` backport installed. docs/tasks.md maps Django's four statuses to the six states.
"""

from __future__ import annotations

import inspect
import json
import sys
import traceback
import uuid
from collections.abc import Sequence
from typing import Any

from django.apps import apps
from django.db import router, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from django_pgoutbox import metrics
from django_pgoutbox._tasks import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    log_task_finished,
    log_task_started,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
from django_pgoutbox.conf import get_settings
from django_pgoutbox.context import JobContext
from django_pgoutbox.enqueueing import enqueue_prepared, prepare_job
from django_pgoutbox.errors import EnqueueError, PermanentError
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.registry import JobDefinition
from django_pgoutbox.results import read_job
from django_pgoutbox.retry import MAX_CODE_LENGTH, bound, summarize

#: Our seven states, as Django's four task statuses.
STATUS = {
    JobStatus.WAITING: TaskResultStatus.READY,
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.RETRYING: TaskResultStatus.READY,
    JobStatus.LEASED: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}
FINISHED = {JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED}


class PgOutboxBackend(BaseTaskBackend):  # type: ignore[misc]
    """Stores tasks as jobs in PostgreSQL; ``runworkers`` runs them.

    ``OPTIONS``: ``DATABASE`` (an alias, default: the router's), ``ENQUEUE_ON_COMMIT`` (insert
    the job when the caller's transaction commits instead of inside it; default False).
    ``QUEUES`` defaults to the queues of ``PGOUTBOX['QUEUES']``.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if "QUEUES" not in params:
            self.queues = set(get_settings().queues)
        self.using: str | None = self.options.get("DATABASE")
        self.enqueue_on_commit = bool(self.options.get("ENQUEUE_ON_COMMIT", False))

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        self.validate_task(task)
        payload = {
            "task": {"backend": self.alias},
            "args": normalize_json(list(args)),
            "kwargs": normalize_json(dict(kwargs)),
        }
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": task.priority,
            "run_at": task.run_after,
            "using": self._database(),
        }
        try:
            # A task is a job type that no @job declares: validate_task vouched for it.
            row = prepare_job(task.module_path, payload, declared=True, **options)
            if self.enqueue_on_commit:
                transaction.on_commit(lambda: row.insert(), using=options["using"], robust=False)
                job_id, enqueued_at = row.id, None
            else:
                job = enqueue_prepared(row)
                job_id, enqueued_at = job.id, job.created_at
        except EnqueueError as error:
            raise InvalidTask(str(error)) from error
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        # the read that Job.wait() makes of a finished job (TaskResult.refresh() comes here)
        job = read_job(job_id, self._database())
        if job is None or not _is_task(job.payload):
            raise TaskResultDoesNotExist(result_id)
        return task_result(job, backend=self.alias)

    def _database(self) -> str:
        return self.using or router.db_for_write(Job)


def _is_task(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get("task"), dict)


class InvalidTaskJob(PermanentError):
    """A job stored as a task names something that is not a task this worker may run."""

    code = "invalid_task"


def _task(job_type: str, job: Job | None = None) -> Task:
    """The task a job's type names: ``ImportError`` if its module is not deployed here,
    ``InvalidTaskJob`` if the name may not be imported or is not a ``Task``.

    A job's type is data: only a module already imported, or one of an installed app's
    packages, is imported for it, so that a row can never make a worker import (and run the
    top level of) any module of its choosing.
    """
    module, _, name = job_type.rpartition(".")
    if not module or not name:
        raise InvalidTaskJob(f"{job_type!r} is not the module path of a task")
    if module not in sys.modules and not _in_installed_app(module):
        raise InvalidTaskJob(
            f"{job_type!r} is not in an installed app nor in a module this worker imported; "
            "tasks are imported only from those (see docs/tasks.md)"
        )
    try:
        found = import_string(job_type)
    except ImportError:
        raise
    except Exception as error:
        raise InvalidTaskJob(f"importing {job_type!r} failed: {summarize(error)}") from error
    if not isinstance(found, Task):
        raise InvalidTaskJob(f"{job_type!r} is a {type(found).__name__}, not a django.tasks Task")
    if job is None:
        return found
    return found.using(priority=job.priority, queue_name=job.queue)


def _in_installed_app(module: str) -> bool:
    return any(
        module == config.name or module.startswith(config.name + ".")
        for config in apps.get_app_configs()
    )


def task_result(job: Job, *, backend: str, status: Any = None) -> TaskResult:
    """The ``TaskResult`` of a task's job, as Django documents it."""
    job_status = JobStatus(job.status)
    errors = []
    if job.last_error_code and job_status != JobStatus.COMPLETED:
        errors.append(
            TaskError(
                exception_class_path=job.last_error_code,
                traceback=job.last_error_summary or "",
            )
        )
    result = TaskResult(
        task=_task(job.job_type, job),
        id=str(job.id),
        status=status or STATUS[job_status],
        enqueued_at=job.created_at,
        started_at=job.locked_at,
        finished_at=job.finished_at if job_status in FINISHED else None,
        last_attempted_at=job.locked_at,
        args=job.payload.get("args", []),
        kwargs=job.payload.get("kwargs", {}),
        backend=backend,
        errors=errors,
        worker_ids=list(job.worker_ids or []),
    )
    if job_status == JobStatus.COMPLETED:
        object.__setattr__(result, "_return_value", job.result)
    return result


# -- running tasks in the worker -----------------------------------------------------------------


def task_runs_on_loop(job_type: str) -> bool:
    """Whether ``job_type`` names an ``async def`` task of a module already imported: its jobs
    run on the queue's event loop. Imports nothing (the worker's coordinator asks, for each job
    of a type no ``@job`` declares); a task of a module not imported yet runs on a handler
    thread (through ``async_to_sync``), which imports it for the next ones."""
    module, _, name = job_type.rpartition(".")
    found = getattr(sys.modules.get(module), name, None)
    return isinstance(found, Task) and inspect.iscoroutinefunction(found.func)


def task_definition(job_type: str, payload: dict[str, Any]) -> JobDefinition | None:
    """A handler that runs the task stored in a job, or None if the job is not a task.

    An import error (the task's code is not deployed here) also gives None: the worker then
    dead-letters the job as ``unknown_job_type``, payload intact, retryable once deployed. A
    name that may not be imported, or is not a ``Task``, raises ``InvalidTaskJob``: the worker
    dead-letters the job as ``invalid_task``.
    """
    if not _is_task(payload):
        return None
    try:
        task = _task(job_type)
    except ImportError:
        return None
    # A task of the code: its name may label metrics (as a registered job type's does).
    metrics.register_label_value("job_type", job_type)

    def run(payload: dict[str, Any], ctx: JobContext) -> Any:
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if task.takes_context:
            return task.call(
                TaskContext(task_result=_running_result(ctx, task, payload)), *args, **kwargs
            )
        return task.call(*args, **kwargs)

    async def run_async(payload: dict[str, Any], ctx: JobContext) -> Any:
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if task.takes_context:
            return await task.acall(
                TaskContext(task_result=_running_result(ctx, task, payload)), *args, **kwargs
            )
        return await task.acall(*args, **kwargs)

    # An async def task runs as a coroutine on the queue's event loop (docs/tasks.md).
    handler = run_async if inspect.iscoroutinefunction(task.func) else run
    definition = JobDefinition(
        handler, name=job_type, queue=task.queue_name, max_attempts=None, priority=task.priority
    )
    definition.error_details = _error_details
    definition.on_started = _on_job_started
    definition.on_finished = _on_job_finished
    definition.hooks_off_loop = _task_signals_beyond_logging
    return definition


def _task_signals_beyond_logging() -> bool:
    """Whether Django's task signals have receivers other than Django's own, which only log
    (always connected): those run on an event loop's thread as they are, the others off it."""
    own = _OWN_RECEIVERS
    return any(
        entry[0][0] not in own for entry in (*task_started.receivers, *task_finished.receivers)
    )


#: The lookup ids of Django's own receivers of its task signals (its log lines).
_OWN_RECEIVERS = frozenset({id(log_task_started), id(log_task_finished)})


def _running_result(ctx: JobContext, task: Task, payload: dict[str, Any]) -> TaskResult:
    return TaskResult(
        task=task,
        id=str(ctx.job_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=payload["task"].get("backend", "default"),
        errors=[],
        worker_ids=list(ctx.worker_ids),
    )


def _error_details(error: BaseException) -> tuple[str, str]:
    """For tasks: the exception's class path, and the end of its traceback, through ``bound()``
    as every stored code and summary (no NUL, no lone surrogate, at most 1,000 characters)."""
    kind = type(error)
    code = bound(f"{kind.__module__}.{kind.__qualname__}", MAX_CODE_LENGTH)
    try:
        text = "".join(traceback.format_exception(error))
    except Exception:  # traceback prints what it can of odd exceptions; this is the rest
        text = summarize(error)
    return code, bound(text, keep="tail")


def _claimed_result(claimed: Any, status: Any, detail: Any = None) -> TaskResult | None:
    """A ``TaskResult`` of an attempt as the worker sees it (its outcome is not written yet)."""
    try:
        task = _task(claimed.job_type).using(priority=claimed.priority, queue_name=claimed.queue)
    except (ImportError, InvalidTaskJob):
        return None
    now = timezone.now()
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    result = TaskResult(
        task=task,
        id=str(claimed.id),
        status=status,
        enqueued_at=claimed.created_at,
        started_at=now,
        finished_at=now if finished else None,
        last_attempted_at=now,
        args=claimed.payload.get("args", []),
        kwargs=claimed.payload.get("kwargs", {}),
        backend=claimed.payload["task"].get("backend", "default"),
        errors=[TaskError(exception_class_path=detail.code or "", traceback=detail.summary or "")]
        if detail is not None and detail.code
        else [],
        worker_ids=list(claimed.worker_ids),
    )
    if status == TaskResultStatus.SUCCESSFUL and detail is not None and detail.result_json:
        object.__setattr__(result, "_return_value", json.loads(detail.result_json))
    return result


def _on_job_started(job: Any, **kwargs: Any) -> None:
    if _is_task(job.payload):
        result = _claimed_result(job, TaskResultStatus.RUNNING)
        if result is not None:
            task_started.send(PgOutboxBackend, task_result=result)


def _on_job_finished(job: Any, outcome: str, detail: Any = None, **kwargs: Any) -> None:
    # Django's task_finished means final: a retry is not a finish, the task is READY again.
    if not _is_task(job.payload) or outcome == JobStatus.RETRYING:
        return
    status = (
        TaskResultStatus.SUCCESSFUL if outcome == JobStatus.COMPLETED else TaskResultStatus.FAILED
    )
    result = _claimed_result(job, status, detail)
    if result is not None:
        task_finished.send(PgOutboxBackend, task_result=result)
