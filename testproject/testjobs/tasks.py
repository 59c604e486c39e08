"""django.tasks functions that the backend tests enqueue and real workers run."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from django_pgoutbox import PermanentError, TransientError
from django_pgoutbox._tasks import TaskContext, task


@task()
def add(a: int, b: int) -> int:
    return a + b


@task(priority=7, queue_name="reports")
def report(name: str, *, rows: int = 10) -> dict[str, Any]:
    return {"name": name, "rows": rows}


@task()
async def async_double(value: int) -> int:
    await asyncio.sleep(0)
    return value * 2


@task(takes_context=True)
async def async_where(context: TaskContext) -> dict[str, Any]:
    """Where an async task runs: its thread's name and its attempt."""
    await asyncio.sleep(0)
    return {"thread": threading.current_thread().name, "attempt": context.attempt}


@task(takes_context=True)
def flaky(context: TaskContext, fail_until: int) -> dict[str, Any]:
    if context.attempt < fail_until:
        raise TransientError(f"attempt {context.attempt} failed")
    return {"attempt": context.attempt, "workers": len(context.task_result.worker_ids)}


@task()
def broken() -> None:
    raise PermanentError("cannot ever work")


@task()
def returns_object() -> Any:
    return object()


@task()
def returns_text(characters: int, char: str = "x") -> str:
    return char * characters


# -- Poison values: tasks whose error PostgreSQL cannot store as given ---------

from testproject.testjobs.jobs import _UnprintableError  # noqa: E402


@task()
def poison_task_nul() -> None:
    raise ValueError("a NUL \x00 in the message")


@task()
def poison_task_surrogate() -> None:
    raise ValueError("a lone surrogate \udc80 in the message")


@task()
def poison_task_unprintable() -> None:
    raise _UnprintableError()
