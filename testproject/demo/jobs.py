"""Handlers of the demo project, found by autodiscovery of each app's jobs.py."""

from __future__ import annotations

import time
from typing import Any

from django_pgoutbox import JobContext, PermanentError, RateLimited, TransientError, job


@job("demo.raise_alert", queue="critical_alerts", priority=10)
def raise_alert(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.logger.info("alert: device %s left its geofence", payload["device"])


@job("demo.send_notification", queue="notifications")
def send_notification(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    if payload.get("flaky") and ctx.attempt == 1:
        raise TransientError("push gateway timed out")
    return {"delivered_to": payload["user"]}


@job("demo.deliver_webhook", queue="webhooks")
def deliver_webhook(payload: dict[str, Any], ctx: JobContext) -> None:
    if payload.get("throttled") and ctx.attempt == 1:
        raise RateLimited(retry_after=1, message="partner answered 429, Retry-After: 1")


@job("demo.derive_location", queue="location_derivation")
def derive_location(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    return {"cell": f"{payload['lat']:.2f},{payload['lon']:.2f}"}


@job("demo.build_report", queue="reports")
def build_report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    time.sleep(0.5)  # a slow job: it holds only the reports queue's thread
    return {"rows": 1000}


@job("demo.export", queue="exports")
def export(payload: dict[str, Any], ctx: JobContext) -> None:
    if payload.get("format") not in {"csv", "json"}:
        raise PermanentError(f"unknown export format {payload.get('format')!r}")


@job("demo.vacuum_sessions", queue="maintenance")
def vacuum_sessions(payload: dict[str, Any], ctx: JobContext) -> None:
    ctx.logger.info("expired sessions removed")
