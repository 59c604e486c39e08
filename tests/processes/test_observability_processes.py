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


def _listening_on(port: int) -> set[str]:
    """The IPv4 addresses a socket of this host listens on at ``port`` (``/proc/net/tcp``)."""
    addresses = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                addresses.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return addresses


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
    assert 'job_type="tests.behave"' in text  # a registered job type keeps its name
    assert health_report(require=["jobs"]).healthy
    # This host only, unless --metrics-host says otherwise.
    assert _listening_on(port) == {"127.0.0.1"}


@pytest.mark.django_db(transaction=True)  # a worker process
def test_metrics_host_chooses_the_address(start_worker: Any) -> None:
    port = _free_port()
    start_worker(
        "--roles",
        "jobs",
        "--queues",
        "default",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "0.0.0.0",
        POLL_INTERVAL=0.2,
    )
    wait_for(lambda: _listening_on(port), timeout=20)
    assert _listening_on(port) == {"0.0.0.0"}
