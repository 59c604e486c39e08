"""Workers cut off from the server inside a transaction that holds what other workers need.

Each host is a namespace on a bridge of this test's own (``netns.py``), the cluster listens on
the bridge's address, and a partition drops every packet of the host, silently (no RST): the
server sees a session idle inside its transaction, and keeps its locks until the partition
heals or its TCP keepalive gives up (two hours by default), unless the transaction bounds its
own idleness (``idle_in_transaction_session_timeout``). A trigger slows a statement of the
transaction, so that the test sees the worker inside it and cuts it off there.

- a relay cut off inside its claim (the claimed events locked until its COMMIT): the other
  relay projects the event once the server ended the session, long before the heal;
- a relay cut off while a subscriber of its batch runs (its events locked by the fence): the
  other relay takes the event over once the claim expired, long before the heal; the same two
  cuts for a delivery (``outbox_deliveries``) the relay runs;
- a worker cut off inside the claim of a queue with MAX_RUNNING (the queue's advisory lock) or
  FAIR (the claimed rows locked until the COMMIT): the other worker's claims of the queue go on,
  and the job the cut-off claim held is run by it, long before the heal.

Each time, the cut-off worker, once back, finds its session ended by the server (25P03, or the
connection gone) and reconnects. ``PGOUTBOX_LONG_TESTS=1``: also RATE_LIMIT and per-organization
limits, and several cuts in a row.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.processes import wait_for
from tests.reliability.netns import HostWorker
from tests.reliability.test_network import Site, built_site, wait_listening

LONG = os.environ.get("PGOUTBOX_LONG_TESTS") == "1"
ROUNDS = 3 if LONG else 1
#: The relays' claim, and so the bound of their transaction's idleness (3 s at least).
CLAIM_SECONDS = 3
#: How long a cut lasts at most: a worker that kept its locks through it fails the test. Twice
#: the time the fix needs (the server ends the session 3 s after its last statement, then a
#: poll, a claim, a run), for a loaded machine.
PARTITION_SECONDS = 12.0
#: A subscriber's run: the relay is inside its batch's transaction all this time, idle.
SUBSCRIBER_SECONDS = 1.5

#: A claim that takes a ``slow_claim`` job waits 0.5 s on the server: long enough for the test
#: to see the worker inside its claim's transaction and cut it off there.
SLOW_CLAIMS = """
CREATE FUNCTION prt_slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep(0.5);
    RETURN NEW;
END $$;
CREATE TRIGGER prt_slow_claim BEFORE UPDATE ON jobs FOR EACH ROW
    WHEN (OLD.status = 'pending' AND NEW.status = 'leased' AND NEW.payload ? 'slow_claim')
    EXECUTE FUNCTION prt_slow_claim();
CREATE TRIGGER prt_slow_claim BEFORE UPDATE ON outbox_events FOR EACH ROW
    WHEN (OLD.claimed_at IS NULL AND NEW.claimed_at IS NOT NULL AND NEW.payload ? 'slow_claim')
    EXECUTE FUNCTION prt_slow_claim();
CREATE TRIGGER prt_slow_claim BEFORE UPDATE ON outbox_deliveries FOR EACH ROW
    WHEN (OLD.claimed_at IS NULL AND NEW.claimed_at IS NOT NULL AND NEW.aggregate_type = 'slow')
    EXECUTE FUNCTION prt_slow_claim();
"""


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with built_site(2, SLOW_CLAIMS) as built:
        yield built


@pytest.fixture
def running(site: Site) -> Iterator[Site]:
    try:
        yield site
    finally:
        for host in site.hosts:
            host.heal()
        site.stop_all()


def cut_off(site: Site, victim: HostWorker, done: Callable[[], bool], what: str) -> float:
    """Partition ``victim``'s host until ``done()`` (or ``PARTITION_SECONDS``); then check that
    the victim, back, reconnected (its session was ended, not kept). Returns how long after the
    cut ``done()`` held; fails if ``done()`` never held in it."""
    lost_before = victim.output().count("database unavailable")
    victim.host.partition()
    cut_at = time.monotonic()
    took = None
    try:
        while time.monotonic() - cut_at < PARTITION_SECONDS:
            if done():
                took = time.monotonic() - cut_at
                break
            time.sleep(0.1)
    finally:
        victim.host.heal()
    lasted = time.monotonic() - cut_at
    assert took is not None, (
        f"{what}: still not done {lasted:.1f} s after {victim.application} was cut off inside "
        "its transaction: its locks were kept through the partition"
    )
    # Back, it finds its session ended by the server (25P03, or the connection gone): a lost
    # connection, waited out and reconnected, not an error that stops the worker.
    wait_for(
        lambda: (
            victim.output().count("database unavailable") > lost_before
            or victim.process.poll() is not None
        ),
        timeout=60,
    )
    assert victim.process.poll() is None, victim.output()[-3000:]
    return took


def idle_inside(site: Site, workers: list[HostWorker], seconds: float) -> HostWorker | None:
    """A worker whose session has been idle inside a transaction for ``seconds``."""
    rows = site.query(
        "SELECT application_name FROM pg_stat_activity WHERE state = 'idle in transaction'"
        " AND state_change < clock_timestamp() - make_interval(secs => %s)"
        " AND application_name = ANY(%s)",
        [seconds, [w.application for w in workers]],
    )
    return next((w for w in workers if rows and w.application == rows[0][0]), None)


def sleeping_inside(site: Site, workers: list[HostWorker]) -> HostWorker | None:
    """A worker whose statement waits in ``pg_sleep`` (the slow claim's trigger)."""
    rows = site.query(
        "SELECT application_name FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
        " AND application_name = ANY(%s)",
        [[w.application for w in workers]],
    )
    return next((w for w in workers if rows and w.application == rows[0][0]), None)


# -- a relay cut off inside its transactions ------------------------------------------------------

SUBSCRIBER = "testproject.testjobs.subscribers.project"

#: Where a relay is cut off, and the row it holds there: an event (``aggregate_type`` 'prt') or
#: a delivery of a projected event ('delivery'), with its payload. Inside the claim (slowed by
#: the trigger, before its COMMIT), or inside the transaction that runs a subscriber (after the
#: fence, while the subscriber sleeps).
RELAY_CUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "event claim": ("event", {"slow_claim": True}),
    "event batch": ("event", {"sleep": SUBSCRIBER_SECONDS}),
    "delivery claim": ("delivery", {}),
    "delivery run": ("delivery", {"sleep": SUBSCRIBER_SECONDS}),
}


def test_relay_cut_off_inside_its_transactions(running: Site, tmp_path: Path) -> None:
    """Two relays; one cut off at each place in turn (the same two relays throughout)."""
    site = running
    relays = [
        site.start(
            host,
            "--roles",
            "relay",
            log_dir=tmp_path,
            OUTBOX={"CLAIM_SECONDS": CLAIM_SECONDS, "POLL_INTERVAL": 0.2},
        )
        for host in site.hosts
    ]
    wait_listening(site, relays)
    figures = []
    for where, (row, payload) in [*RELAY_CUTS.items()] * ROUNDS:
        slow_claim = where.endswith("claim")
        if row == "event":
            ((event,),) = site.query(
                "INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type,"
                " schema_version, payload) VALUES ('prt', gen_random_uuid(), 'tests.projected',"
                " 1, %s) RETURNING id",
                [json.dumps(payload)],
            )
            check = "SELECT processed_at IS NOT NULL FROM outbox_events WHERE id = %s"
        else:
            ((event, delivery),) = site.query(
                "WITH e AS (INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type,"
                " schema_version, payload, processed_at) VALUES (%s, gen_random_uuid(),"
                " 'tests.projected', 1, %s, now()) RETURNING *)"
                " INSERT INTO outbox_deliveries (event_id, subscriber, aggregate_type,"
                " aggregate_id, occurred_at) SELECT id, %s, aggregate_type, aggregate_id,"
                " occurred_at FROM e RETURNING event_id, id",
                ["slow" if slow_claim else "prt", json.dumps(payload), SUBSCRIBER],
            )
            check = "SELECT delivered_at IS NOT NULL FROM outbox_deliveries WHERE id = %s"
        if slow_claim:
            victim = wait_for(lambda: sleeping_inside(site, relays), timeout=30, interval=0.01)
        else:  # the fence holds the row, its subscriber sleeps
            victim = wait_for(lambda: idle_inside(site, relays, 0.3), timeout=30, interval=0.02)
        ((holder,),) = site.query("SELECT claimed_by FROM outbox_events WHERE id = %s", [event])
        key = event if row == "event" else delivery

        def done(check: str = check, key: Any = key) -> bool:
            return bool(site.query(check, [key])[0][0])

        took = cut_off(site, victim, done, f"{where} {key}")
        if row == "event":
            ((taker, attempts),) = site.query(
                "SELECT claimed_by, attempts FROM outbox_events WHERE id = %s", [event]
            )
            if slow_claim:
                # The cut-off claim was rolled back with its session: never committed, so no
                # takeover was counted.
                assert (holder, attempts) == (None, 0), (where, holder, attempts)
            else:
                # Taken over once its claim expired: an attempt counted, the other relay's.
                assert taker != holder, (where, taker, holder)
                assert attempts == 1, (where, attempts)
        # Run once: the cut-off relay's work was rolled back with its session.
        ((projections,),) = site.query(
            "SELECT count(*) FROM testjobs_projection WHERE event_id = %s", [event]
        )
        assert projections == 1, (where, projections)
        figures.append(f"{where} {took:.1f}")
    print(
        f"\nrelay cut off inside a transaction (CLAIM_SECONDS={CLAIM_SECONDS}, cuts of at most "
        f"{PARTITION_SECONDS:.0f} s): done by the other relay after (s) {'; '.join(figures)}"
    )


# -- a worker cut off inside a limited or fair claim -----------------------------------------------

QUEUES: dict[str, dict[str, Any]] = {
    "prt_max_running": {"MAX_RUNNING": 50},
    "prt_fair": {"FAIR": True},
}
if LONG:
    QUEUES |= {
        "prt_rate_limit": {"RATE_LIMIT": 100},
        "prt_per_organization": {"MAX_RUNNING": 5, "LIMIT_BY": "organization"},
    }


def test_claims_cut_off_inside_their_transaction(running: Site, tmp_path: Path) -> None:
    """Two workers of every queue; one cut off inside a claim of each queue in turn."""
    site = running
    workers = [
        site.start(
            host,
            "--roles",
            "jobs",
            "--queues",
            ",".join(QUEUES),
            "--concurrency",
            "2",
            log_dir=tmp_path,
            QUEUES=QUEUES,
            POLL_INTERVAL=0.2,
        )
        for host in site.hosts
    ]
    wait_listening(site, workers)

    def insert(queue: str, count: int, **payload: Any) -> list[uuid.UUID]:
        rows = site.query(
            "INSERT INTO jobs (queue, job_type, payload, organization_id)"
            " SELECT %s, 'tests.noop', %s, gen_random_uuid() FROM generate_series(1, %s)"
            " RETURNING id",
            [queue, json.dumps(payload), count],
        )
        return [row[0] for row in rows]

    figures = []
    for queue in [*QUEUES] * ROUNDS:
        (slow,) = insert(queue, 1, slow_claim=True)
        victim = wait_for(lambda: sleeping_inside(site, workers), timeout=30, interval=0.01)
        after = insert(queue, 10)

        def all_done(jobs: list[uuid.UUID] = [slow, *after]) -> bool:  # noqa: B006
            rows = site.query(
                "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status <> 'completed'", [jobs]
            )
            return bool(rows[0][0] == 0)

        took = cut_off(site, victim, all_done, f"queue {queue}")
        figures.append(f"{queue} {took:.1f}")
    print(
        f"\nworker cut off inside a claim (cuts of at most {PARTITION_SECONDS:.0f} s): the job "
        f"it held and 10 more run by the other worker after (s) {'; '.join(figures)}"
    )
