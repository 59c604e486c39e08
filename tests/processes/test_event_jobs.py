"""The jobs an event's subscribers enqueue record the event (``Job.event_id``), whichever way
they are written, by a real relay and its delivery runner, beside a poison event in the same
batch; the admin links the event and its jobs both ways.

transaction=True: the worker is another process and sees only committed rows.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from django_pgoutbox import publish
from django_pgoutbox.models import Job, OutboxDelivery, OutboxEvent
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: The COPY path's jobs per event: from enqueue_many's COPY_MIN_ROWS (64) up.
COPIED = 70


def test_every_job_a_subscriber_enqueues_records_its_event(
    start_worker: Any, admin_client: Client
) -> None:
    fanned = [
        publish(
            "tests.fan_out",
            aggregate_type="t",
            aggregate_id=uuid.uuid4(),
            payload={"fan_out": COPIED},
        )
        for _ in range(3)
    ]
    poison = publish("poison.raise", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={})
    # Fails in the relay after enqueueing (the job is taken back), then goes through on the
    # delivery runner's retry, which enqueues it again.
    flaky = publish(
        "tests.to_three", aggregate_type="t", aggregate_id=uuid.uuid4(), payload={"fail": True}
    )
    start_worker("--roles", "relay", OUTBOX={"BATCH_SIZE": 10})

    def projected() -> bool:
        """each innocent event's jobs are written"""
        return Job.objects.filter(job_type="tests.noop").count() == 3 * (4 + COPIED) + 3

    wait_for(projected, timeout=60)
    wait_for(OutboxDelivery.objects.filter(event_id=poison.pk, last_error__isnull=False).exists)

    for event in fanned:
        jobs = Job.objects.filter(payload__event=str(event.pk))
        by = sorted(jobs.values_list("payload__by", "event_id"))
        expected = ["copy"] * COPIED + ["deferred", "insert", "insert", "keyed"]
        assert [way for way, _ in by] == expected
        assert {event_id for _, event_id in by} == {event.pk}
    three = Job.objects.filter(payload__event=str(flaky.pk))
    assert sorted(three.values_list("payload__by", flat=True)) == ["first", "flaky", "second"]
    assert set(three.values_list("event_id", flat=True)) == {flaky.pk}
    # Nothing else records an event: the poison's subscriber enqueued nothing.
    assert Job.objects.exclude(event_id=None).count() == 3 * (4 + COPIED) + 3
    assert not Job.objects.filter(event_id=poison.pk).exists()

    # The event's page lists its jobs, the first 20 and a link to them all; a job's page links
    # its event; the Jobs page filtered to the event shows its jobs alone.
    page = admin_client.get(f"/admin/pgoutbox/outboxevent/{fanned[0].pk}/change/").content.decode()
    assert "Jobs its subscribers enqueued" in page
    assert page.count("tests.noop <a href=") == 20
    assert f'href="/admin/pgoutbox/job/?event={fanned[0].pk}"' in page
    keyed = Job.objects.get(idempotency_key=f"fan-out:{fanned[0].pk}")
    job_page = admin_client.get(f"/admin/pgoutbox/job/{keyed.pk}/change/").content.decode()
    assert f'href="/admin/pgoutbox/outboxevent/{fanned[0].pk}/change/"' in job_page
    listed = admin_client.get(f"/admin/pgoutbox/job/?event={fanned[1].pk}").content.decode()
    assert f"{4 + COPIED} jobs" in listed
    assert str(fanned[0].pk) not in listed
    for value in ("not-a-uuid", "%00", "x" * 10_000):
        assert admin_client.get(f"/admin/pgoutbox/job/?event={value}").status_code == 200
    assert OutboxEvent.objects.count() == 5
