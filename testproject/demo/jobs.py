"""Handlers of the demo project, found by autodiscovery of each app's jobs.py."""

from __future__ import annotations

from typing import Any

from django_pgoutbox import JobContext, job


@job("demo.send_notification", queue="notifications")
def send_notification(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.logger.info("notifying %s", payload.get("user"))
