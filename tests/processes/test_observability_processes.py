"""Observability of a real ``runworkers`` process: its metrics endpoint and its heartbeat."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest

from django_pgoutbox import enqueue
from django_pgoutbox.health import health_report
from django_pgoutbox.models import Job
from tests.processes import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.django_db(transaction=True)  # a worker process
def test_runworkers_serves_its_metrics_and_heartbeat(start_worker: Any) -> None:
    port = _free_port()
    start_worker(
        "--roles", "jobs", "--queues", "default", "--metrics-port", str(port), POLL_INTERVAL=0.2
    )
    job = enqueue("tests.behave", {})
    wait_for(lambda: Job.objects.filter(pk=job.pk, status="completed").exists(), timeout=20)

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
                return str(page.read().decode())
        except OSError:
            return ""

    text = wait_for(lambda: "pgoutbox_job_outcomes_total{" in scrape() and scrape(), timeout=20)
    assert 'pgoutbox_jobs_claimed_total{queue="default"} 1.0' in text
    assert health_report(require=["jobs"]).healthy
