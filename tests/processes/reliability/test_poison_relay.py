"""Poison events: whatever a subscriber does is that event's outcome, never the relay's.

Each case runs a real ``runworkers --roles relay`` process over one batch that holds the poison
event beside innocent events of other aggregates (``tests.projected``: a projection row and one
``tests.noop`` job each). The relay must still run at the end; each innocent event is projected
once, with its job enqueued once, and no failure counted against it; the poison event's
subscriber fails its delivery of it on its own (``outbox_deliveries``), with a searchable
``last_error_code``, its ``attempts`` counting its real failures. A subscriber that kills the
relay's process is the event's failure (``relay_crashed``): no one can tell which subscriber did.
The subscribers are at the end of ``testproject/testjobs/subscribers.py``.

transaction=True: the relay is another process and sees only committed rows.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from django_pgoutbox import publish
from django_pgoutbox.models import Job, OutboxDelivery, OutboxEvent
from testproject.testjobs.models import Projection
from tests.processes import WorkerProcess, holds_for, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

MAX_ATTEMPTS = 3
#: Quick retries (0.1 s, then 0.2 s), three attempts, and a claim that outlives the test.
SETTINGS: dict[str, Any] = {
    "POLL_INTERVAL": 0.2,
    "OUTBOX": {"MAX_ATTEMPTS": MAX_ATTEMPTS, "CLAIM_SECONDS": 30},
    "RETRY": {"BASE_DELAY": 0.05, "JITTER": 0},
}
INNOCENTS = 6


def publish_batch(*poisons: tuple[str, dict[str, Any]]) -> tuple[list[OutboxEvent], list[Any]]:
    """Innocent events around the poison ones, each of its own aggregate, in one transaction
    (so that one claim takes them all, in this order)."""
    with transaction.atomic():
        innocents = [innocent(n) for n in range(INNOCENTS // 2)]
        poisoned = [
            publish(
                event_type,
                aggregate_type="poison",
                aggregate_id=uuid.uuid4(),
                payload=payload,
            )
            for event_type, payload in poisons
        ]
        innocents += [innocent(n) for n in range(INNOCENTS // 2, INNOCENTS)]
    return innocents, poisoned


def innocent(sequence: int) -> OutboxEvent:
    return publish(
        "tests.projected",
        aggregate_type="innocent",
        aggregate_id=uuid.uuid4(),
        payload={"sequence": sequence},
    )


def relay(start_worker: Any) -> WorkerProcess:
    return start_worker("--roles", "relay", **SETTINGS)  # type: ignore[no-any-return]


def dead(event: OutboxEvent) -> bool:
    """The event is dead (its relays kept dying), or its subscriber's delivery of it is."""
    return (
        OutboxEvent.objects.filter(pk=event.pk, dead_at__isnull=False).exists()
        or OutboxDelivery.objects.filter(event_id=event.pk, dead_at__isnull=False).exists()
    )


def dead_or_exited(event: OutboxEvent, worker: WorkerProcess) -> Callable[[], bool]:
    def settled() -> bool:
        """the event is dead, or the relay's process exited"""
        return dead(event) or worker.process.poll() is not None

    return settled


def wait_until_dead(event: OutboxEvent, worker: WorkerProcess) -> None:
    """Until ``event`` is dead, or the relay exited (the failure this module is about)."""
    wait_for(dead_or_exited(event, worker), timeout=30)
    assert worker.process.poll() is None, worker.output()


def assert_innocents_projected_once(
    innocents: list[OutboxEvent], *, crashes: set[tuple[int, str | None]] | None = None
) -> None:
    """Each innocent projected once, its job enqueued once; ``(attempts, last_error_code)``
    ``(0, None)``, or one of ``crashes`` (the attempt counted when a claim is taken over from
    a relay that died holding it)."""
    ids = {event.pk for event in innocents}
    allowed = {(0, None), *(crashes or set())}
    for event in OutboxEvent.objects.filter(pk__in=ids):
        assert event.processed_at is not None, event
        assert (event.attempts, event.last_error_code) in allowed, event
    assert set(Projection.objects.values_list("event_id", flat=True)) >= ids
    jobs = Counter(
        Job.objects.filter(job_type="tests.noop").values_list("payload__event", flat=True)
    )
    assert all(jobs[str(event_id)] == 1 for event_id in ids), jobs


def assert_dead(event: OutboxEvent, code: str) -> OutboxEvent | OutboxDelivery:
    """Dead after its own failures, one per attempt, and none of its jobs written: the event's
    (poison) subscriber's delivery of it, the event processed; or, for ``relay_crashed``, the
    event itself."""
    assert not Job.objects.filter(payload__event=str(event.pk)).exists()
    stored = OutboxEvent.objects.get(pk=event.pk)
    if code == "relay_crashed":
        assert (stored.processed_at, stored.claimed_at) == (None, None)
        assert (stored.attempts, stored.last_error_code) == (MAX_ATTEMPTS, code), stored.last_error
        return stored
    assert stored.processed_at is not None
    assert (stored.attempts, stored.dead_at) == (0, None)
    delivery = OutboxDelivery.objects.get(event_id=event.pk)
    assert (delivery.state, delivery.claimed_at) == ("dead", None)
    assert (delivery.attempts, delivery.last_error_code) == (MAX_ATTEMPTS, code), (
        delivery.last_error
    )
    return delivery


def test_a_subscriber_raising_system_exit_fails_its_delivery_only(start_worker: Any) -> None:
    innocents, [poison] = publish_batch(("poison.exit", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    assert "SystemExit" in (assert_dead(poison, "SystemExit").last_error or "")


def test_a_job_dated_past_any_calendar_fails_the_delivery_that_enqueued_it(
    start_worker: Any,
) -> None:
    innocents, [poison] = publish_batch(("poison.far_run_at", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    assert "run_at" in (assert_dead(poison, "EnqueueError").last_error or "")


def test_a_job_of_priority_2_to_the_40_fails_the_delivery_that_enqueued_it(
    start_worker: Any,
) -> None:
    innocents, [poison] = publish_batch(("poison.priority", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    assert "priority" in (assert_dead(poison, "EnqueueError").last_error or "")


@pytest.fixture
def jobs_refusing_unwritable() -> Iterator[None]:
    """A trigger on ``jobs`` that refuses, with a data error (SQLSTATE 22003), a job whose
    payload has ``unwritable``: a job that passes every check of ``enqueue()`` and still cannot
    be written when the relay's batch writes its jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION poison_refuse_unwritable() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.payload ? 'unwritable' THEN
                    RAISE EXCEPTION 'job % cannot be written', NEW.id
                        USING ERRCODE = 'numeric_value_out_of_range';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER poison_refuse_unwritable BEFORE INSERT ON jobs
                FOR EACH ROW EXECUTE FUNCTION poison_refuse_unwritable();
            """
        )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER poison_refuse_unwritable ON jobs;"
                "DROP FUNCTION poison_refuse_unwritable();"
            )


@pytest.mark.usefixtures("jobs_refusing_unwritable")
def test_a_job_refused_when_the_batch_is_written_fails_the_delivery_that_enqueued_it(
    start_worker: Any,
) -> None:
    innocents, [poison] = publish_batch(("poison.unwritable", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    stored = assert_dead(poison, "unwritable_job")
    assert "cannot be written" in (stored.last_error or "")


def test_the_relay_connection_lost_in_the_event_by_event_rerun_retries_the_batch(
    start_worker: Any, tmp_path: Path
) -> None:
    """The first poison always raises, so the batch is run again event by event; there, the
    second terminates the relay's own backend, once. The batch is abandoned and run again
    on a new connection, and the lost connection counts against no event."""
    marker = tmp_path / "terminated"
    innocents, [raising, terminating] = publish_batch(
        ("poison.raise", {}), ("poison.terminate_once", {"marker": str(marker)})
    )
    worker = relay(start_worker)
    wait_until_dead(raising, worker)
    assert marker.exists()  # the connection was terminated
    assert "database unavailable" in worker.output()
    assert_innocents_projected_once([*innocents, terminating])
    assert_dead(raising, "ValueError")


def test_a_subscriber_closing_the_relay_connection_fails_its_delivery_only(
    start_worker: Any,
) -> None:
    """``close_old_connections()`` in a subscriber ends the batch's transaction: that
    subscriber's failed delivery is recorded apart, and the rest of the batch is projected again
    without it; its retries, run by the relay's delivery runner, fail the same way."""
    innocents, [poison] = publish_batch(("poison.close_connection", {}))
    worker = relay(start_worker)
    wait_until_dead(poison, worker)
    assert_innocents_projected_once(innocents)
    stored = assert_dead(poison, "closed_relay_connection")
    assert "close_old_connections()" in (stored.last_error or "")


def test_a_subscriber_silent_past_the_claim_fails_its_delivery_only(start_worker: Any) -> None:
    """A subscriber that keeps the relay's transaction idle for longer than ``CLAIM_SECONDS``
    (3 s here, the least the relay allows) gets the session ended by the server
    (``idle_in_transaction_session_timeout``, which bounds how long a relay cut off from the
    server holds its events). That is the subscriber's failure, recorded apart; the rest of the
    batch is projected, and the relay does not project the same batch again and again."""
    innocents, [poison] = publish_batch(("poison.stall", {"seconds": 4}))
    worker = start_worker("--roles", "relay", **{**SETTINGS, "OUTBOX": {
        "MAX_ATTEMPTS": MAX_ATTEMPTS, "CLAIM_SECONDS": 3,
    }})  # fmt: skip
    wait_for(dead_or_exited(poison, worker), timeout=90)
    assert worker.process.poll() is None, worker.output()
    assert_innocents_projected_once(innocents)
    stored = assert_dead(poison, "subscriber_timeout")
    assert "OUTBOX['CLAIM_SECONDS']" in (stored.last_error or "")
    # One abandoned batch per attempt of the poison, at most: no loop over the same batch.
    assert worker.output().count("database unavailable") <= MAX_ATTEMPTS, worker.output()


def test_a_subscriber_killing_its_process_ends_dead_alone_and_the_relay_runs_on(
    start_worker: Any,
) -> None:
    """``os._exit(9)`` in a subscriber: the relay's process dies with the batch's transaction,
    and a supervisor restarts it (here, the loop). The events it held are taken over one per
    transaction, each counted one attempt when it is: the innocents complete (those reached
    before the poison after the first restart, the rest first thing after the second) and the
    poison, alone, spends its attempts and ends dead."""
    innocents, [poison] = publish_batch(("poison.os_exit", {}))
    settings = {**SETTINGS, "OUTBOX": {"MAX_ATTEMPTS": MAX_ATTEMPTS, "CLAIM_SECONDS": 1}}
    worker = start_worker("--roles", "relay", **settings)
    restarts = 0
    while not dead(poison):
        wait_for(dead_or_exited(poison, worker), timeout=30)
        if dead(poison):
            break
        assert worker.wait(timeout=10) == 9, worker.output()
        restarts += 1
        assert restarts <= MAX_ATTEMPTS + 3, f"still crash-looping after {restarts} restarts"
        worker = start_worker("--roles", "relay", **settings)

    def running() -> bool:
        """the last relay started is still running"""
        return worker.process.poll() is None

    holds_for(running, 2)
    assert restarts <= MAX_ATTEMPTS  # each restart spent one of the poison's attempts
    assert_innocents_projected_once(innocents, crashes={(1, "relay_crashed")})
    stored = assert_dead(poison, "relay_crashed")
    assert "stopped before finishing it" in (stored.last_error or "")
    assert not OutboxEvent.objects.filter(claimed_at__isnull=False).exists()


def test_a_relay_killed_holding_a_batch_counts_at_most_one_attempt_per_kill(
    start_worker: Any,
) -> None:
    """Killed three times while projecting, each time at a random point of its batch (20
    events, 4 s of subscribers): each kill counts one attempt at most against the events it
    held, so none of them comes near ``MAX_ATTEMPTS`` (10 here) and none ends dead."""
    with transaction.atomic():
        events = [
            publish(
                "tests.projected",
                aggregate_type="innocent",
                aggregate_id=uuid.uuid4(),
                payload={"sequence": n, "sleep": 0.2},
            )
            for n in range(20)
        ]
    settings = {**SETTINGS, "OUTBOX": {"MAX_ATTEMPTS": 10, "CLAIM_SECONDS": 1}}
    for _ in range(3):
        victim = start_worker("--roles", "relay", **settings)
        wait_for(victim.in_transaction)  # projecting: a subscriber is sleeping
        victim.kill()
    assert OutboxEvent.objects.filter(processed_at__isnull=True).exists()
    worker = start_worker("--roles", "relay", **settings)
    wait_for(lambda: not OutboxEvent.objects.filter(processed_at__isnull=True).exists())
    assert worker.process.poll() is None, worker.output()
    assert_innocents_projected_once(events, crashes={(n, "relay_crashed") for n in range(1, 4)})


def test_a_relay_whose_table_is_gone_stops_after_repeated_failures(start_worker: Any) -> None:
    """A turn failing the same unexpected way again and again (a schema gone) is logged and
    retried, and after five in a row stops the process, like the job dispatcher's loop."""
    worker = relay(start_worker)
    wait_for(lambda: "Worker " in worker.output())
    try:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE outbox_events RENAME TO outbox_events_elsewhere")
        assert worker.wait(timeout=30) == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE outbox_events_elsewhere RENAME TO outbox_events")
    output = worker.output()
    assert "4 time(s) in a row" in output
    assert "pgoutbox-relay failed; stopping this worker" in output


def test_a_relay_turn_failing_a_few_times_is_retried_not_fatal(start_worker: Any) -> None:
    worker = relay(start_worker)
    wait_for(lambda: "Worker " in worker.output())
    try:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE outbox_events RENAME TO outbox_events_elsewhere")
        wait_for(
            lambda: "relay: turn failed" in worker.output() or worker.process.poll() is not None,
            timeout=10,
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE outbox_events_elsewhere RENAME TO outbox_events")
    event = innocent(0)
    wait_for(
        lambda: OutboxEvent.objects.filter(pk=event.pk, processed_at__isnull=False).exists(),
        timeout=15,
    )
    assert worker.process.poll() is None, worker.output()


def projected_with_job(event: OutboxEvent) -> Callable[[], bool]:
    def done() -> bool:
        """the event is processed and its subscriber's job written"""
        return (
            OutboxEvent.objects.filter(pk=event.pk, processed_at__isnull=False).exists()
            and Job.objects.filter(payload__event=str(event.pk)).exists()
        )

    return done


@pytest.mark.parametrize("fail_first", [False, True], ids=["batch", "delivery"])
def test_a_subscriber_leaving_session_settings_behind_changes_nothing_for_the_relay(
    start_worker: Any, fail_first: bool
) -> None:
    """A subscriber that SETs (not SET LOCAL) the relay connection's search_path, role,
    default_transaction_read_only, session_replication_role and standard_conforming_strings:
    its work stands, the settings are put back before the relay's own statements (in the batch,
    or in the delivery that runs it again), and the events after it are projected as before.
    Without that, the relay's next statement failed (``relation "jobs" does not exist``) in
    every batch until the same error stopped the worker."""
    innocents, [poison] = publish_batch(("poison.leave_settings", {"fail_first": fail_first}))
    worker = relay(start_worker)
    for event in [poison, *innocents]:
        wait_for(projected_with_job(event), timeout=30)
    assert_innocents_projected_once(innocents)
    if fail_first:
        delivery = OutboxDelivery.objects.get(event_id=poison.pk)
        assert delivery.state == "delivered", delivery.last_error
    later = [innocent(n) for n in range(3)]
    for event in later:
        wait_for(projected_with_job(event), timeout=30)
    assert worker.process.poll() is None, worker.output()
    output = worker.output()
    assert "changed the relay connection's session settings" in output, output
    assert "search_path" in output, output
    assert "turn failed" not in output, output
