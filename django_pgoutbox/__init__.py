"""Durable asynchronous work for Django on PostgreSQL alone.

The public API; import from here rather than from the modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "EnqueueError",
    "Event",
    "InboxAutocommitWarning",
    "InboxError",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotCompleted",
    "JobTimeout",
    "OutboxModelMixin",
    "PermanentError",
    "PublishError",
    "RateLimited",
    "Revoked",
    "Snooze",
    "TransientError",
    "Unique",
    "UnknownJobTypeWarning",
    "WaitInTransaction",
    "WaitTimeout",
    "accept_message",
    "cancel",
    "cancel_workflow",
    "chain",
    "enqueue",
    "enqueue_many",
    "group",
    "job",
    "pause_queue",
    "publish",
    "resize_queue",
    "resume_queue",
    "step",
    "subscriber",
    "workflow",
]

if TYPE_CHECKING:
    from django_pgoutbox.context import JobContext
    from django_pgoutbox.control import cancel, cancel_workflow
    from django_pgoutbox.enqueueing import enqueue, enqueue_many
    from django_pgoutbox.errors import (
        Cancelled,
        EnqueueError,
        InboxAutocommitWarning,
        InboxError,
        JobCancelled,
        JobFailed,
        JobNotCompleted,
        JobTimeout,
        PermanentError,
        PublishError,
        RateLimited,
        Revoked,
        Snooze,
        TransientError,
        UnknownJobTypeWarning,
        WaitInTransaction,
        WaitTimeout,
    )
    from django_pgoutbox.inbox import accept_message
    from django_pgoutbox.outbox import Event, OutboxModelMixin, publish, subscriber
    from django_pgoutbox.queue_controls import pause_queue, resize_queue, resume_queue
    from django_pgoutbox.registry import job
    from django_pgoutbox.uniqueness import Unique
    from django_pgoutbox.workflows import chain, group, step, workflow

#: Where each name of the API that is not an exception lives (the exceptions: in errors).
_LAZY = {
    "accept_message": "inbox",
    "JobContext": "context",
    "cancel": "control",
    "cancel_workflow": "control",
    "chain": "workflows",
    "group": "workflows",
    "step": "workflows",
    "workflow": "workflows",
    "enqueue": "enqueueing",
    "enqueue_many": "enqueueing",
    "job": "registry",
    "Unique": "uniqueness",
    "Event": "outbox",
    "OutboxModelMixin": "outbox",
    "publish": "outbox",
    "subscriber": "outbox",
    "pause_queue": "queue_controls",
    "resume_queue": "queue_controls",
    "resize_queue": "queue_controls",
}


def __getattr__(name: str) -> Any:
    # Most of the API imports the models, which need the app registry: each name is imported on
    # first use, so that settings files and apps.py can import this package before Django is set
    # up. The errors too, so that importing any module of the package never runs this one's
    # imports first (a circle: errors imports conf, whose package would import errors).
    if name in __all__:
        import importlib

        module = importlib.import_module(f"django_pgoutbox.{_LAZY.get(name, 'errors')}")
        return getattr(module, name)
    raise AttributeError(f"module 'django_pgoutbox' has no attribute {name!r}")
