"""The worker: claim -> execute -> record, per queue, woken by LISTEN and by polling.

Nothing is imported here until it is used: the child process of an isolated attempt imports
``worker.isolated_child`` before Django is set up, and ``worker.execute`` must not pull in the
supervisor, which imports the runner, which imports ``worker.execute``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_pgoutbox.worker.supervisor import Worker, default_worker_id

__all__ = ["Worker", "default_worker_id"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from django_pgoutbox.worker import supervisor

        return getattr(supervisor, name)
    raise AttributeError(f"module 'django_pgoutbox.worker' has no attribute {name!r}")
