"""Sequences drained by two real ``runworkers`` processes under SIGKILL: never two jobs of one
key running at once, and each key's jobs completed in the order they were enqueued.

Keys of several jobs each (``tests.sequence_step``, sleeping up to 120 ms so that kills land
mid-job), enqueued half before the workers start and half while they run, by several
transactions. Beside them, in the same queue and batches, a poison key whose first job raises
SystemExit at every attempt: it ends dead and holds its key (the job behind it never runs),
the workers keep on; skipped, it lets that job run. From 0.3 s on, every 0.5 to 1.5 s, the
test SIGKILLs one worker and starts another.

The check reads the execution log each job writes (``testjobs_sideeffect``: a start and an end
per attempt, by the database's clock): per key, in enqueue order, every attempt of a job starts
after the end of the last attempt of the job before it. A killed attempt has a start and no end;
it is the job's own, and before the end of the attempt that completed it.

``PGOUTBOX_LONG_TESTS=1`` runs a longer variant. transaction=True: the workers are other
processes.
"""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import pytest

from django_pgoutbox import enqueue, enqueue_many
from django_pgoutbox.control import skip_dead_jobs
from django_pgoutbox.models import Job
from testproject.testjobs.models import SideEffect
from tests.processes import scaled, seed_or, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
KEYS, JOBS_PER_KEY, DEADLINE = (40, 30, 300) if LONG else (8, 12, 50)
SETTINGS = {"LEASE_SECONDS": 1, "POLL_INTERVAL": 0.3}


def _enqueue_keys(rng: random.Random, keys: list[str]) -> None:
    """Each key's jobs, in transactions of one to three jobs, keys interleaved."""
    pending = {key: list(range(JOBS_PER_KEY)) for key in keys}
    while pending:
        key = rng.choice(list(pending))
        take, pending[key] = pending[key][:3], pending[key][3:]
        items: list[dict[str, Any]] = [
            {
                "job_type": "tests.sequence_step",
                "payload": {"key": key, "n": n, "sleep": rng.uniform(0, 0.12)},
                "sequence": key,
            }
            for n in take
        ]
        if len(items) > 1:
            enqueue_many(items)
        else:
            enqueue("tests.sequence_step", items[0]["payload"], sequence=key)
        if not pending[key]:
            del pending[key]


def test_two_workers_under_kills_keep_each_sequence_one_at_a_time_and_in_order(
    start_worker: Any,
) -> None:
    rng = random.Random(seed_or(random.randrange(2**32)))
    keys = [f"account:{i}" for i in range(KEYS)]
    poison = enqueue("tests.sequence_step", {"exit": True}, sequence="poison")
    behind = enqueue("tests.sequence_step", {"key": "poison", "n": 1}, sequence="poison")
    _enqueue_keys(rng, keys[: KEYS // 2])

    spawned = 0

    def spawn() -> Any:
        nonlocal spawned
        spawned += 1
        return start_worker(
            "--queues", "default", "--concurrency", "4", "--worker-id", f"seq-{spawned}", **SETTINGS
        )

    workers = [spawn(), spawn()]
    _enqueue_keys(rng, keys[KEYS // 2 :])
    deadline = time.monotonic() + scaled(DEADLINE)
    next_kill = time.monotonic() + rng.uniform(0.3, 0.8)
    kills = 0

    def unfinished() -> int:
        return Job.objects.filter(sequence_key__in=keys).exclude(status="completed").count()

    while unfinished():
        assert time.monotonic() < deadline, f"{unfinished()} jobs unfinished after {kills} kills"
        if time.monotonic() >= next_kill:
            victim = rng.randrange(2)
            workers[victim].kill()
            workers[victim] = spawn()
            kills += 1
            next_kill = time.monotonic() + rng.uniform(0.5, 1.5)
        time.sleep(0.1)
    assert kills >= 1

    # the poison died (SystemExit is an attempt's failure, not the worker's end) and holds its key
    wait_for(lambda: Job.objects.filter(pk=poison.pk, status="dead").exists(), timeout=30)
    assert Job.objects.get(pk=behind.pk).status == "waiting"
    assert not SideEffect.objects.filter(job_id=behind.pk).exists()
    assert skip_dead_jobs([poison.pk], reason="a poison, skipped by the test") == 1
    wait_for(lambda: Job.objects.filter(pk=behind.pk, status="completed").exists(), timeout=30)
    for worker in workers:
        assert worker.process.poll() is None, worker.output()[-2000:]

    _check_log(keys)


def _check_log(keys: list[str]) -> None:
    attempts: dict[Any, dict[int, dict[str, datetime]]] = defaultdict(lambda: defaultdict(dict))
    for effect in SideEffect.objects.all():
        attempts[effect.job_id][effect.attempt][effect.event] = effect.at
    for key in keys:
        jobs = list(Job.objects.filter(sequence_key=key).order_by("sequence_position"))
        assert [job.payload["n"] for job in jobs] == list(range(JOBS_PER_KEY)), key
        previous_end: datetime | None = None
        for job in jobs:
            runs = attempts[job.pk]
            assert runs, f"{key} #{job.payload['n']} never ran"
            starts = [run["start"] for run in runs.values()]
            ends = [run["end"] for run in runs.values() if "end" in run]
            assert ends, f"{key} #{job.payload['n']} completed without an end logged"
            if previous_end is not None:
                assert min(starts) >= previous_end, (
                    f"{key} #{job.payload['n']} started at {min(starts)}, before the job before it"
                    f" ended at {previous_end}"
                )
            # its own killed attempts, if any, came before the one that completed it
            assert max(starts) <= max(ends)
            previous_end = max(ends)
