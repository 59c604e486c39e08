"""The worker: claim -> execute -> record, per queue, woken by LISTEN and by polling."""

from django_pgoutbox.worker.supervisor import Worker, default_worker_id

__all__ = ["Worker", "default_worker_id"]
