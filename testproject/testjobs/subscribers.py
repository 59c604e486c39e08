"""Subscribers that tests (and relay subprocesses started by tests) run, steered by the payload."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, close_old_connections, connection

from django_pgoutbox import enqueue, enqueue_many, subscriber
from django_pgoutbox.models import OutboxDelivery, OutboxEvent
from testproject.testjobs.models import DeliveryRecord, Projection


@subscriber("tests.projected")
def project(event: OutboxEvent) -> None:
    """Record the projection and enqueue a job for it, in the relay's transaction.

    With ``fail``, it raises after both: what it wrote and what it enqueued (a deferred job of
    the relay's batch) must both be undone.
    """
    if event.payload.get("sleep"):
        time.sleep(event.payload["sleep"])
    Projection.objects.create(
        event_id=event.id,
        aggregate_id=event.aggregate_id,
        sequence=event.payload.get("sequence", 0),
        relay=event.claimed_by or "",
    )
    enqueue("tests.noop", {"event": str(event.id)})
    if event.payload.get("fail"):
        raise ValueError(f"cannot project {event.payload.get('sequence')}")


@subscriber("tests.stamped")
def stamp(event: OutboxEvent) -> None:
    """Enqueue a job that carries when the projection ran (wall clock), for lag measurements."""
    enqueue("tests.noop", {"event": str(event.id), "projected": time.time()})


@subscriber("tests.to_job")
def to_job(event: OutboxEvent) -> None:
    """Project the event into one job, and nothing else: the outbox benchmark's projection."""
    enqueue("tests.noop", {"event": str(event.id)})


@subscriber("tests.fan_out")
def fan_out(event: OutboxEvent) -> None:
    """Enqueue by every path: a job without a key (deferred to the batch's end), one with a key
    (written at once), a few with ``enqueue_many`` (an INSERT) and ``fan_out`` more (a COPY)."""
    tag = {"event": str(event.id)}
    enqueue("tests.noop", {**tag, "by": "deferred"})
    enqueue("tests.noop", {**tag, "by": "keyed"}, idempotency_key=f"fan-out:{event.id}")
    enqueue_many([{"job_type": "tests.noop", "payload": {**tag, "by": "insert"}}] * 2)
    many = event.payload.get("fan_out", 0)
    enqueue_many([{"job_type": "tests.noop", "payload": {**tag, "by": "copy"}}] * many)


# -- Three subscribers of one event type, one of them failing the events marked ``fail`` the first
# time it sees them (no delivery of the event yet), then succeeding on the retry: the outbox
# benchmark's per-subscriber case (benchmarks/outbox.py --three).


@subscriber("tests.to_three", name="tests.three.first")
def three_first(event: OutboxEvent) -> None:
    enqueue("tests.noop", {"event": str(event.id), "by": "first"})


@subscriber("tests.to_three", name="tests.three.second")
def three_second(event: OutboxEvent) -> None:
    enqueue("tests.noop", {"event": str(event.id), "by": "second"})


@subscriber("tests.to_three", name="tests.three.flaky")
def three_flaky(event: OutboxEvent) -> None:
    enqueue("tests.noop", {"event": str(event.id), "by": "flaky"})
    if event.payload.get("fail") and not OutboxDelivery.objects.filter(event=event).exists():
        raise RuntimeError(f"flaky once for {event.id}")


# -- Poison subscribers of the outbox relay (tests/processes/reliability/test_poison_relay.py) -----
# Each misbehaves in one way; the relay must make it that event's failure alone.


@subscriber("poison.exit")
def poison_exit(event: OutboxEvent) -> None:
    raise SystemExit(2)


@subscriber("poison.raise")
def poison_raise(event: OutboxEvent) -> None:
    raise ValueError(f"poison event {event.id}")


@subscriber("poison.far_run_at")
def poison_far_run_at(event: OutboxEvent) -> None:
    """A delay of 3,000,000 days: no date Python reads back can hold it."""
    enqueue("tests.noop", {"event": str(event.id)}, run_at=timedelta(days=3_000_000))


@subscriber("poison.priority")
def poison_priority(event: OutboxEvent) -> None:
    """A job of priority 2**40, which no ``integer`` column holds."""
    enqueue("tests.noop", {"event": str(event.id)}, priority=2**40)


@subscriber("poison.unwritable")
def poison_unwritable(event: OutboxEvent) -> None:
    """A job that the test's trigger on ``jobs`` refuses with a data error when it is written."""
    enqueue("tests.noop", {"event": str(event.id), "unwritable": True})


@subscriber("poison.terminate_once")
def poison_terminate_once(event: OutboxEvent) -> None:
    """Terminate the relay's own backend the first time (``marker``, a file, says it was done:
    a row would be rolled back with the batch); afterwards, project as ``tests.projected``."""
    try:
        os.close(os.open(event.payload["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        project(event)
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@subscriber("poison.swallow_database_error")
def poison_swallow_database_error(event: OutboxEvent) -> None:
    """Enqueue its job, then run a statement that fails and catch the error: the relay's
    transaction is left aborted, and every later statement of it would fail."""
    enqueue("tests.noop", {"event": str(event.id)})
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    except DatabaseError:
        pass


@subscriber("poison.leave_settings")
def poison_leave_settings(event: OutboxEvent) -> None:
    """Project the event, then change the relay connection's session settings with SET (not
    SET LOCAL), as a tenant's code may: the settings ``payload["settings"]`` names, each to a
    value under which the relay's own statements would fail or go wrong. With ``fail_first``,
    its first run raises (so that its delivery runs it again)."""
    if (
        event.payload.get("fail_first")
        and not OutboxDelivery.objects.filter(event_id=event.id).exists()
    ):
        raise ValueError("the first run of a subscriber that leaves settings behind")
    project(event)
    statements = {
        "search_path": "SET search_path TO pg_catalog",
        "read_only": "SET default_transaction_read_only TO on",
        "replica": "SET session_replication_role TO replica",
        "role": "SET ROLE pg_monitor",
        "strings": "SET standard_conforming_strings TO off",
    }
    with connection.cursor() as cursor:
        for name in event.payload.get("settings", list(statements)):
            cursor.execute(statements[name])


@subscriber("poison.close_connection")
def poison_close_connection(event: OutboxEvent) -> None:
    """Close the relay's connection, as code written for threads may (inside an atomic block,
    ``close_old_connections()`` always closes it)."""
    close_old_connections()


@subscriber("poison.stall")
def poison_stall(event: OutboxEvent) -> None:
    """Keep the relay's transaction silent (no statement) for ``seconds``, as an HTTP call made
    from a subscriber does."""
    time.sleep(event.payload["seconds"])


@subscriber("poison.os_exit")
def poison_os_exit(event: OutboxEvent) -> None:
    """Kill the relay's whole process, as a crash in native code or the OOM killer would."""
    os._exit(9)


# -- Hostile subscribers (tests/processes/reliability/test_poison_hostile.py) ----------------------


class _HostileClassError(Exception):
    """An exception whose ``__class__`` raises: every traceback printed of it raises too."""

    @property  # type: ignore[misc]
    def __class__(self) -> Any:
        raise RuntimeError("no class for you")


@subscriber("hostile.unprintable_class")
def hostile_unprintable_class(event: OutboxEvent) -> None:
    raise _HostileClassError("boom")


# -- A webhook publisher, when a test gives a server to send to (tests/processes/
# test_publisher_processes.py): events of type tests.webhook go out as pgoutbox.publish jobs.

TEST_WEBHOOK_SECRET = "whsec_" + "c2VjcmV0LW9mLXRoaXJ0eS10d28tYnl0ZXMtLS0tLS0="

if os.environ.get("PGOUTBOX_TEST_WEBHOOK_URL"):
    from django_pgoutbox.publishers import WebhookPublisher, send_events

    send_events(
        WebhookPublisher(
            "tests.hooks",
            os.environ["PGOUTBOX_TEST_WEBHOOK_URL"],
            secret=TEST_WEBHOOK_SECRET,
            timeout=2.0,
        ),
        "tests.webhook",
    )


# -- Two subscribers of one event type, one of them flaky (tests/processes/reliability/
# test_delivery_chaos.py). Each records its run in the relay's transaction (a DeliveryRecord):
# the committed rows are the runs that took effect.

CHAOS_HEALTHY = "chaos.healthy"
CHAOS_FLAKY = "chaos.flaky"

#: The flaky subscriber fails one run in FLAKY_ONE_IN of an event, for the first FLAKY_FAILURES
#: attempts of its delivery at most: always delivered before OUTBOX["MAX_ATTEMPTS"] runs out.
FLAKY_ONE_IN = 5
FLAKY_FAILURES = 3


def _record(event: OutboxEvent, subscriber: str, attempts: int) -> None:
    DeliveryRecord.objects.create(
        event_id=event.id,
        aggregate_id=event.aggregate_id,
        sequence=event.payload["sequence"],
        subscriber=subscriber,
        attempts=attempts,
        pid=os.getpid(),
    )


def _delivery_attempts(event: OutboxEvent, subscriber: str) -> int:
    """The attempts its delivery counts (failures, and relays that died under it); 0 in the
    relay's batch, where it has none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attempts FROM outbox_deliveries WHERE event_id = %s AND subscriber = %s",
            [event.id, subscriber],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def flaky_roll(event_id: object, attempts: int) -> int:
    """A number in [0, 1000) drawn from the event and the attempt, the same in every process."""
    digest = hashlib.sha256(f"{event_id}/{attempts}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000


@subscriber("chaos.delivered", name=CHAOS_HEALTHY)
def chaos_healthy(event: OutboxEvent) -> None:
    _record(event, CHAOS_HEALTHY, 0)


@subscriber("chaos.delivered", name=CHAOS_FLAKY)
def chaos_flaky(event: OutboxEvent) -> None:
    """Records its run, then, for one run in FLAKY_ONE_IN, raises: its record is rolled back
    with it. Sleeps 10 ms in one run of ten."""
    attempts = _delivery_attempts(event, CHAOS_FLAKY)
    roll = flaky_roll(event.id, attempts)
    if roll % 10 == 1:
        time.sleep(0.01)
    _record(event, CHAOS_FLAKY, attempts)
    if attempts < FLAKY_FAILURES and roll < 1000 // FLAKY_ONE_IN:
        raise RuntimeError(f"flaky: event {event.id}, attempt {attempts + 1}")
