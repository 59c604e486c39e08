"""Events sent out by a webhook publisher, through a real relay and real workers: one job per
event, a refused event dead on its own beside the innocent ones, a rate-limited one sent again
after the server's Retry-After; an aggregate's events sent in order, a failing one holding back
the later ones of its aggregate only."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import Any

import pytest

from django_pgoutbox import publish
from django_pgoutbox.models import Job, JobStatus
from django_pgoutbox.publishers import PUBLISH_JOB, verify_webhook
from testproject.testjobs.subscribers import TEST_WEBHOOK_SECRET
from tests.processes import wait_for
from tests.webhook_server import Answer, Received, Server

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refused_event_dies_alone_and_a_rate_limited_one_waits(start_worker: Any) -> None:
    limited_once: set[str] = set()

    def answer_for(got: Received) -> Answer:
        data = json.loads(got.body)["data"]
        if data.get("refuse"):
            return Answer(422, body=b'{"error": "unknown customer"}')
        if data.get("limit") and data["n"] not in limited_once:
            limited_once.add(data["n"])
            return Answer(429, {"Retry-After": "1"})
        return Answer(204)

    server = Server(answer_for)
    try:
        events = {
            name: publish(
                "tests.webhook",
                aggregate_type="order",
                aggregate_id=uuid.uuid4(),
                payload={"n": name, **extra},
            )
            for name, extra in [
                *((f"innocent-{i}", {}) for i in range(5)),
                ("poison", {"refuse": True}),
                ("limited", {"limit": True}),
            ]
        }
        start_worker(
            "--roles",
            "relay,jobs",
            "--concurrency",
            "4",
            env={"PGOUTBOX_TEST_WEBHOOK_URL": server.url},
        )

        def settled() -> Counter[str]:
            jobs = Job.objects.filter(job_type=PUBLISH_JOB)
            return Counter(jobs.values_list("status", flat=True))

        wait_for(lambda: settled() == Counter({JobStatus.COMPLETED: 6, JobStatus.DEAD: 1}))
        dead = Job.objects.get(job_type=PUBLISH_JOB, status=JobStatus.DEAD)
        assert dead.payload == {
            "publisher": "tests.hooks",
            "event": str(events["poison"].id),
            "aggregate": f"order/{events['poison'].aggregate_id}",
        }
        assert dead.last_error_code == "http_422"
        assert "unknown customer" in (dead.last_error_summary or "")
        assert dead.attempts == 1  # a 4xx is never retried

        by_event: dict[str, list[Received]] = {}
        for got in server.received:
            verify_webhook(TEST_WEBHOOK_SECRET, got.headers, got.body, tolerance=60)
            by_event.setdefault(json.loads(got.body)["data"]["n"], []).append(got)
        # Each innocent event sent once; the limited one twice, a Retry-After apart.
        assert {name: len(sent) for name, sent in by_event.items()} == {
            **{f"innocent-{i}": 1 for i in range(5)},
            "poison": 1,
            "limited": 2,
        }
        first, second = by_event["limited"]
        assert second.at - first.at >= 0.9
    finally:
        server.close()


def test_an_aggregates_events_are_sent_in_order_beside_a_failing_one(start_worker: Any) -> None:
    """Four events of one aggregate and four of another, four workers: the server fails the
    second event of the first aggregate twice (503, retried). No event of an aggregate is sent
    before the one before it was answered 2xx; the other aggregate is not held back."""
    failures: Counter[str] = Counter()
    log: list[tuple[str, int, int]] = []  # (aggregate, n, status), in the order they came

    def answer_for(got: Received) -> Answer:
        data = json.loads(got.body)["data"]
        status = 204
        if data["n"] == 1 and data["aggregate"] == "a" and failures["a1"] < 2:
            failures["a1"] += 1
            status = 503
        log.append((data["aggregate"], data["n"], status))
        return Answer(status)

    server = Server(answer_for)
    try:
        aggregates = {"a": uuid.uuid4(), "b": uuid.uuid4()}
        for n in range(4):
            for name, aggregate in aggregates.items():
                publish(
                    "tests.webhook",
                    aggregate_type="order",
                    aggregate_id=aggregate,
                    payload={"n": n, "aggregate": name},
                )
        start_worker(
            "--roles",
            "relay,jobs",
            "--concurrency",
            "4",
            RETRY={"BASE_DELAY": 0.2, "JITTER": 0},
            env={"PGOUTBOX_TEST_WEBHOOK_URL": server.url},
        )

        def completed() -> int:
            return Job.objects.filter(job_type=PUBLISH_JOB, status=JobStatus.COMPLETED).count()

        wait_for(lambda: completed() == 8, timeout=60)
        answered: dict[str, int] = {"a": -1, "b": -1}  # the last n answered 2xx, by aggregate
        for name, n, status in log:
            assert n == answered[name] + 1, (name, n, answered, log)
            if 200 <= status < 300:
                answered[name] = n
        assert answered == {"a": 3, "b": 3}
        assert failures["a1"] == 2
        # The first aggregate's later events snoozed behind its failing one, spending nothing.
        held = Job.objects.filter(job_type=PUBLISH_JOB, payload__n__gt=1)
        assert set(held.values_list("attempts", flat=True)) <= {1}
    finally:
        server.close()
