"""The ``@job`` registry: job types by name, each with its handler and its defaults."""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import sys
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias, overload

from django_pgoutbox.conf import MAX_DELAY_CEILING, MAX_INT32, QUEUE_NAME_RE, PgOutboxSettings
from django_pgoutbox.context import JobContext
from django_pgoutbox.errors import EnqueueError, JobRegistrationError, UnknownJobTypeWarning
from django_pgoutbox.uniqueness import Declared, Unique, policy
from django_pgoutbox.validation import MAX_NAME_BYTES, check_text, short_repr

if TYPE_CHECKING:
    from django_pgoutbox.models import Job

Payload: TypeAlias = dict[str, Any]
Handler: TypeAlias = Callable[[Payload, JobContext], Any]


def is_async_handler(func: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one (a class instance):
    each call makes a coroutine, to await on the queue's event loop."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(_call_method(func))


def _call_method(func: Callable[..., Any]) -> Any:
    """The ``__call__`` of an instance of a class (None for a function, a class, a partial)."""
    if inspect.isroutine(func) or inspect.isclass(func) or isinstance(func, functools.partial):
        return None
    return type(func).__call__ if callable(func) else None


class JobDefinition:
    """A registered handler with its defaults; calling it runs the handler in-process."""

    def __init__(
        self,
        func: Handler,
        *,
        name: str,
        queue: str,
        max_attempts: int | None,
        priority: int,
        timeout: float | None = None,
        isolation: str = "thread",
        unique: Declared | None = None,
        sequence_by: str | None = None,
    ) -> None:
        self.func = func
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.priority = priority
        #: Seconds an attempt may run before it fails with code ``timeout``; None: no limit.
        self.timeout = timeout
        #: "thread" (the worker's handler threads) or "process" (a child process per attempt,
        #: killed at the timeout or on cancellation).
        self.isolation = isolation
        #: An ``async def`` handler: its attempts run as coroutines on the queue's event loop
        #: (``worker.coroutines``), not on a handler thread.
        self.on_loop = is_async_handler(func) and isolation == "thread"
        #: What ``@job`` said of uniqueness (``unique``, ``on_conflict``, ``debounce``,
        #: ``throttle``), checked; each enqueue of the type applies it unless it overrides it.
        self.unique = unique
        #: The payload key whose value is the sequence key of each job of this type
        #: (``enqueue(sequence=...)`` given explicitly wins); None: no sequence.
        self.sequence_by = sequence_by
        #: Optional ``error -> (code, summary)`` replacing the class name and message that the
        #: retry policy records (the django.tasks backend stores a class path and a traceback).
        self.error_details: Callable[[BaseException], tuple[str, str]] | None = None
        #: Optional hooks the worker calls around each attempt, as it sends ``job_started`` and
        #: ``job_finished``, with the same arguments (the django.tasks backend sends Django's
        #: task signals from them): hooks of the handler that need them, rather than receivers
        #: that every job of every type would go through.
        self.on_started: Callable[..., None] | None = None
        self.on_finished: Callable[..., None] | None = None
        #: Optional: whether those hooks must run off the event loop now, for a coroutine's
        #: attempt (None: always). False lets them run on the loop's thread, where they neither
        #: block nor use the ORM, without the thread hop (``execute_async._off_loop``) each costs.
        self.hooks_off_loop: Callable[[], bool] | None = None
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__module__ = func.__module__

    def __repr__(self) -> str:
        return f"<JobDefinition {self.name!r} queue={self.queue!r}>"

    def __call__(self, payload: Payload, ctx: JobContext) -> Any:
        return self.func(payload, ctx)

    def enqueue(
        self,
        payload: Payload,
        *,
        idempotency_key: str | None = None,
        organization_id: uuid.UUID | str | None = None,
        priority: int | None = None,
        run_at: datetime | timedelta | None = None,
        queue: str | None = None,
        using: str | None = None,
        unique: Unique | bool | None = None,
        on_conflict: str | None = None,
        debounce: timedelta | float | None = None,
        throttle: timedelta | float | None = None,
        sequence: str | None = None,
    ) -> Job:
        """Enqueue this job type; see :func:`~django_pgoutbox.enqueue`."""
        # Imported here: enqueueing looks job types up in this registry, which is the lower layer.
        from django_pgoutbox.enqueueing import enqueue

        return enqueue(
            self.name,
            payload,
            idempotency_key=idempotency_key,
            organization_id=organization_id,
            priority=priority,
            run_at=run_at,
            queue=queue,
            using=using,
            unique=unique,
            on_conflict=on_conflict,
            debounce=debounce,
            throttle=throttle,
            sequence=sequence,
        )


_registry: dict[str, JobDefinition] = {}


def registered_jobs() -> Mapping[str, JobDefinition]:
    """Every registered job type, by name."""
    return dict(_registry)


def get_job(name: str) -> JobDefinition | None:
    """The definition registered under ``name``, or None (a handler deployed elsewhere)."""
    return _registry.get(name)


def check_undeclared_job_type(name: str, field: str, conf: PgOutboxSettings) -> None:
    """Say so when a job is enqueued under ``name``, which no ``@job`` of this process declares
    (``get_job`` found nothing): a warning (``UnknownJobTypeWarning``), or ``EnqueueError`` with
    ``STRICT_JOB_TYPES``. Names in ``REMOTE_JOB_TYPES`` are run by other services: silent."""
    if name in conf.remote_job_types:
        return
    close = _close_name(name, _generation)
    hint = f" (did you mean {close!r}?)" if close else ""
    message = (
        f"no @job named {name!r} is registered in this process{hint}. A worker that has no "
        "handler for it dead-letters its jobs as unknown_job_type; if a worker of another "
        "service runs it, list it in PGOUTBOX['REMOTE_JOB_TYPES']."
    )
    if conf.strict_job_types:
        raise EnqueueError(field, message)
    warnings.warn(f"{field}: {message}", UnknownJobTypeWarning, stacklevel=_caller_stacklevel())


def statement_job_types() -> frozenset[str]:
    """The job types whose ``@job`` makes them unique or sequenced: ``enqueue_many`` writes their
    jobs one statement each, never with ``COPY``."""
    return _statement_types(_generation)


@functools.lru_cache(maxsize=4)
def _statement_types(generation: int) -> frozenset[str]:
    return frozenset(
        name for name, d in _registry.items() if d.unique is not None or d.sequence_by is not None
    )


#: Bumped at each change of ``_registry``: the key that makes ``_close_name`` look again.
_generation = 0


@functools.lru_cache(maxsize=256)
def _close_name(name: str, generation: int) -> str | None:
    """The registered job type closest to ``name``, if one is close: cached, since the search
    grows with the registry and a service may enqueue another's job types at every request."""
    close = difflib.get_close_matches(name, list(_registry), n=1, cutoff=0.8)
    return close[0] if close else None


def _registry_changed() -> None:
    global _generation
    _generation += 1


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of a warning raised here that points at the first frame outside this
    package: the user's ``enqueue()`` line."""
    # With the separator: a package named django_pgoutbox_contrib is the user's.
    package = os.path.dirname(__file__) + os.sep
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def restore_registry(saved: Mapping[str, JobDefinition]) -> None:
    """Make the registry what ``registered_jobs()`` returned earlier: for tests that register
    job types of their own and must leave the registry as they found it."""
    _registry.clear()
    _registry.update(saved)
    _registry_changed()


@overload
def job(func: Handler, /) -> JobDefinition: ...


@overload
def job(
    name: str | None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    priority: int = 0,
    timeout: float | timedelta | None = None,
    isolation: str = "thread",
    unique: Unique | bool | None = None,
    on_conflict: str | None = None,
    debounce: timedelta | float | None = None,
    throttle: timedelta | float | None = None,
    sequence_by: str | None = None,
) -> Callable[[Handler], JobDefinition]: ...


def job(
    name: str | Handler | None = None,
    *,
    queue: str = "default",
    max_attempts: int | None = None,
    priority: int = 0,
    timeout: float | timedelta | None = None,
    isolation: str = "thread",
    unique: Unique | bool | None = None,
    on_conflict: str | None = None,
    debounce: timedelta | float | None = None,
    throttle: timedelta | float | None = None,
    sequence_by: str | None = None,
) -> JobDefinition | Callable[[Handler], JobDefinition]:
    """Register ``handler(payload: dict, ctx: JobContext)`` as a job type.

    Use it bare (``@job``) or with options (``@job("emails.send", queue="notifications")``). The
    name defaults to ``module.function``; it is what is stored in ``jobs.job_type``, so keep it
    stable across deployments. ``max_attempts`` defaults to ``PGOUTBOX["MAX_ATTEMPTS"]``.

    ``timeout`` (seconds or a timedelta) fails an attempt that runs longer with code ``timeout``,
    retried by the policy. ``isolation="process"`` runs each attempt in a child process that is
    killed at the timeout or on cancellation (see docs/jobs.md, "Timeouts").

    An ``async def`` handler runs as a coroutine on its queue's event loop, up to
    ``ASYNC_CONCURRENCY`` at once (docs/jobs.md, "Async handlers"); ``isolation="process"`` is
    refused for it.

    ``unique``, ``on_conflict``, ``debounce`` and ``throttle`` make every job of the type unique
    (docs/uniqueness.md); ``enqueue()`` may override each.

    ``sequence_by`` names a payload key: each job of this type runs in the sequence of that
    key's value (a string, or an integer as text), one at a time and in enqueue order, as
    ``enqueue(sequence=...)`` does (docs/uniqueness.md, "Sequences").
    """
    options = _Options(
        queue,
        max_attempts,
        priority,
        timeout,
        isolation,
        Declared(unique, on_conflict, debounce, throttle),
        sequence_by,
    )
    if callable(name):
        return _register(name, None, options)
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise JobRegistrationError(f"@job name must be a non-empty string, not {name!r}")

    def decorator(func: Handler) -> JobDefinition:
        return _register(func, name, options)

    return decorator


@dataclass(frozen=True)
class _Options:
    queue: str
    max_attempts: int | None
    priority: int
    timeout: float | timedelta | None
    isolation: str
    unique: Declared
    sequence_by: str | None = None


ISOLATION_MODES = ("thread", "process")


def _register(func: Handler, name: str | None, options: _Options) -> JobDefinition:
    if not callable(func):
        raise JobRegistrationError(f"@job must decorate a function, not {func!r}")
    job_name = name or f"{func.__module__}.{func.__qualname__}"
    try:
        # The name is stored in every job's job_type: enqueue() would refuse any other.
        job_name = check_text(job_name, "name", EnqueueError, MAX_NAME_BYTES)
    except EnqueueError as problem:
        raise JobRegistrationError(f"@job {short_repr(job_name)}: {problem}") from None
    queue, max_attempts, priority = options.queue, options.max_attempts, options.priority
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise JobRegistrationError(
            f"@job {job_name!r}: queue must be a queue name (1-63 letters, digits, '_', '.', "
            f"':' or '-', as PGOUTBOX['QUEUES'] has), not {short_repr(queue)}"
        )
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_INT32
    ):
        raise JobRegistrationError(
            f"@job {job_name!r}: max_attempts must be an integer from 1 to {MAX_INT32} "
            f"(a 32-bit integer column), not {max_attempts!r}"
        )
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -MAX_INT32 - 1 <= priority <= MAX_INT32
    ):
        raise JobRegistrationError(
            f"@job {job_name!r}: priority must be an integer from {-MAX_INT32 - 1} to "
            f"{MAX_INT32} (a 32-bit integer column), not {priority!r}"
        )
    timeout = options.timeout
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_DELAY_CEILING
    ):
        raise JobRegistrationError(
            f"@job {job_name!r}: timeout must be a number of seconds > 0 or a timedelta, at most "
            f"{MAX_DELAY_CEILING:.0f} seconds ({MAX_DELAY_CEILING / 86400:.0f} days), "
            f"not {options.timeout!r}"
        )
    if options.isolation not in ISOLATION_MODES:
        raise JobRegistrationError(
            f"@job {job_name!r}: isolation must be 'thread' or 'process', not {options.isolation!r}"
        )
    if inspect.isasyncgenfunction(func) or inspect.isasyncgenfunction(_call_method(func)):
        raise JobRegistrationError(
            f"@job {job_name!r}: an async generator (async def with yield) returns no result "
            "when awaited: every attempt would end dead (invalid_result); return a value instead"
        )
    if options.isolation == "process" and is_async_handler(func):
        raise JobRegistrationError(
            f"@job {job_name!r}: isolation='process' runs a plain function in a child process; "
            "an async def handler runs on the queue's event loop: drop isolation='process', or "
            "make the handler a def that calls asyncio.run()"
        )
    given = options.unique
    declared: Declared | None = None
    if given != Declared(None, None, None, None):
        try:
            checked = policy(
                *(given.unique, given.on_conflict, given.debounce, given.throttle),
                lambda field, message: EnqueueError(field, message),
            )
        except EnqueueError as problem:
            raise JobRegistrationError(f"@job {job_name!r}: {problem}") from None
        if checked is not None:
            declared = given
    sequence_by = options.sequence_by
    if sequence_by is not None and (not isinstance(sequence_by, str) or not sequence_by):
        raise JobRegistrationError(
            f"@job {job_name!r}: sequence_by must name a payload key (a non-empty string), "
            f"not {sequence_by!r}"
        )
    if sequence_by is not None and declared is not None:
        # every enqueue of the type would be refused (a unique job cannot be in a sequence)
        raise JobRegistrationError(
            f"@job {job_name!r}: sequence_by cannot go with unique, debounce or throttle: a "
            "unique job cannot be in a sequence (docs/uniqueness.md, the traps)"
        )
    _check_signature(job_name, func)
    existing = _registry.get(job_name)
    if existing is not None and _qualified(existing.func) != _qualified(func):
        raise JobRegistrationError(
            f"job type {job_name!r} is already registered by {_qualified(existing.func)}; "
            "give one of them another name"
        )
    definition = JobDefinition(
        func,
        name=job_name,
        queue=queue,
        max_attempts=max_attempts,
        priority=priority,
        timeout=None if timeout is None else float(timeout),
        isolation=options.isolation,
        unique=declared,
        sequence_by=sequence_by,
    )
    _registry[job_name] = definition
    _registry_changed()
    return definition


def _qualified(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{getattr(func, '__qualname__', repr(func))}"


def _check_signature(name: str, func: Callable[..., Any]) -> None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        signature.bind(object(), object())
    except TypeError:
        raise JobRegistrationError(
            f"@job {name!r}: the handler must accept (payload, ctx); its signature is "
            f"{func.__name__}{signature}"
        ) from None
