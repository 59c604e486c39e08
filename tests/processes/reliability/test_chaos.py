"""Faults during a drain of thousands of jobs and events: nothing lost, duplicates bounded.

Several worker processes (jobs and relay roles) drain a backlog while the test SIGKILLs random
ones and restarts them, freezes one past its lease (SIGSTOP, then SIGCONT), terminates every
worker connection (the LISTEN ones included) and holds a transaction open to pin the xmin
horizon. Then the faults stop and everything must finish. transaction=True: other processes.
"""

from __future__ import annotations

import random
import signal
import time
import uuid
from typing import Any

import pytest
from django.db import transaction

from django_pgoutbox import enqueue_many, publish
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from testproject.testjobs.models import Projection, SideEffect
from tests.processes import other_backends, seed_or, wait_for
from tests.processes.reliability.checker import check

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 3000
EVENTS = 300
WORKERS = 3
CONCURRENCY = 4
SETTINGS = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.3, "OUTBOX": {"CLAIM_SECONDS": 2}}


def _terminate_worker_connections() -> int:
    return other_backends("backend_type = 'client backend'", count="pg_terminate_backend(pid)")


def test_drain_under_faults_loses_nothing(start_worker: Any, raw_connection_params: Any) -> None:
    seed = seed_or(20261129)
    rng = random.Random(seed)
    jobs = enqueue_many([{"job_type": "tests.behave", "payload": {"sleep": 0.05}}] * JOBS)
    with transaction.atomic():
        events = [
            publish(
                "tests.projected",
                aggregate_type="chaos",
                aggregate_id=uuid.uuid4(),
                payload={"sequence": 0},
            )
            for _ in range(EVENTS)
        ]

    def spawn(n: int) -> Any:
        return start_worker(
            "--roles",
            "jobs,relay",
            "--queues",
            "default",
            "--concurrency",
            str(CONCURRENCY),
            "--worker-id",
            f"chaos-{n}",
            **SETTINGS,
        )

    workers = [spawn(n) for n in range(WORKERS)]
    faults: list[str] = []
    kills = 0
    deadline = time.monotonic() + 15
    step = 0
    import psycopg

    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.5, 1.5))
        step += 1
        victim = rng.randrange(WORKERS)
        if step == 3:
            workers[victim].signal(signal.SIGSTOP)  # a zombie: frozen past its lease
            time.sleep(2.5)
            workers[victim].signal(signal.SIGCONT)
            faults.append("SIGSTOP 2.5 s then SIGCONT")
        elif step == 5:
            faults.append(f"pg_terminate_backend x{_terminate_worker_connections()}")
        elif step == 7:
            with psycopg.connect(**raw_connection_params) as holder:
                holder.execute("SELECT txid_current()")  # an open transaction pins xmin
                time.sleep(3)
            faults.append("transaction held open 3 s")
        else:
            workers[victim].kill()
            workers[victim] = spawn(100 + step)
            kills += 1
            faults.append("SIGKILL + restart")

    wait_for(
        lambda: (
            not Job.objects.exclude(status=JobStatus.COMPLETED).exists()
            and not OutboxEvent.objects.filter(processed_at__isnull=True).exists()
        ),
        timeout=120,
        interval=0.5,
    )
    for worker in workers:
        worker.signal(signal.SIGTERM)
        worker.wait(timeout=30)

    verdict = check(
        [j.pk for j in jobs],
        SideEffect.objects.filter(event="end").values_list("job_id", flat=True),
    )
    projections = Projection.objects.count()
    print(
        f"\nseed {seed}, faults: {faults}\njobs: {verdict}\n"
        f"events: {EVENTS} published, {projections} projected"
    )
    assert verdict.lost == 0
    assert verdict.unexpected == 0
    # Duplicates only for jobs in flight when a worker died or froze: at most its threads' worth.
    assert verdict.duplicated <= (kills + 1) * CONCURRENCY
    assert projections == EVENTS  # exactly once: a duplicate would violate the unique event id
    assert {p.event_id for p in Projection.objects.all()} == {e.id for e in events}
    assert not Job.objects.filter(status=JobStatus.LEASED).exists()
