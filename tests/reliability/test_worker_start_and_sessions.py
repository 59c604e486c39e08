"""A worker started while its database refuses connections, stopped during the wait; a scheduler
whose schedule transaction the server ends after 3 s of silence; a read-only database; a relay
whose session the server ends inside a batch.

Start: ``runworkers`` against a port nothing listens on waits for the database
(``runworkers.START_WAIT``). SIGTERM or Ctrl-C (SIGINT) during that wait must end the process at
once, with status 0 as after a stop of a running worker, one line and no traceback; and the
warning must name the reason the connection failed, not only libpq's hint that follows it.

Schedule transaction: the scheduler's transaction carries ``idle_in_transaction_session_timeout``
of 3 s (``queries.SCHEDULE_LOCK``). A lock wait is not idle; a process that stops between two
statements is. The test holds a SHARE lock on ``jobs`` in a transaction of its own, so that the
scheduler's insert of the slot's job waits (longer than the timeout: still waiting); stops the
worker process (SIGSTOP); rolls its own transaction back, so that the insert completes and the
server then waits for the stopped client; and resumes it after the timeout. The server has ended
the session (25P03; the client reads "server closed the connection unexpectedly"): the scheduler
must take it for a lost connection, say so in one warning (no traceback), reconnect and enqueue
the slot exactly once, and keep running.

Read-only database: a worker on a database whose writes fail (SQLSTATE 25006: a hot standby,
``default_transaction_read_only``) stops at start with one line that says so, not a traceback.

Relay: a subscriber that pauses longer than the database's ``idle_in_transaction_session_timeout``
must not stop the relay from projecting every other event.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from django_pgoutbox.schedules import Schedule
from tests.processes import wait_for
from tests.reliability.cluster import Cluster, free_port, own_cluster

QUIET = {"PGOUTBOX_DEBUG": "0"}


def _count(conn: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


def _unreachable_url() -> str:
    return f"postgres://postgres@127.0.0.1:{free_port()}/hst_nowhere"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_the_start_wait_exits_at_once_without_a_traceback(
    start_worker: Any, signum: int
) -> None:
    worker = start_worker(database_url=_unreachable_url(), env=QUIET)

    def waiting() -> bool:
        """the worker says it waits for its database"""
        return "unavailable at start" in worker.output()

    wait_for(waiting, timeout=60)
    asked = time.monotonic()
    worker.signal(signum)
    status = worker.wait(timeout=20)
    took = time.monotonic() - asked
    output = worker.output()
    assert "Traceback" not in output, output
    assert status == 0, output
    assert took < 10, took
    assert signal.Signals(signum).name in output, output


def test_the_start_warning_names_why_the_connection_failed(start_worker: Any) -> None:
    worker = start_worker(database_url=_unreachable_url(), env=QUIET)

    def warned() -> str:
        """the worker says it waits for its database"""
        return next((line for line in worker.output().splitlines() if "at start" in line), "")

    line = wait_for(warned, timeout=60)
    # libpq's message is the failure, then a hint on a line of its own: both, on one line.
    assert "Connection refused" in line, line
    assert "Is the server running" in line, line


# -- the schedule transaction ended by the server --------------------------------------------------

DATABASE = "sessions"
SCHEDULE = "hourly"
SCHEDULES: dict[str, Any] = {
    SCHEDULE: {"JOB": "tests.noop", "EVERY": 3600},
    "pgoutbox.prune": None,
    "pgoutbox.recover_leases": None,
    "pgoutbox.reconcile_outbox": None,
    "pgoutbox.sample_queues": None,
}
#: Longer than the schedule transaction's idle_in_transaction_session_timeout (3 s).
STOPPED = 6.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with own_cluster() as own:
        own.migrated_database(DATABASE)
        yield own


def test_a_schedule_transaction_ended_for_idleness_enqueues_the_slot_once(
    cluster: Cluster, start_worker: Any
) -> None:
    url = cluster.url(DATABASE)
    cluster.execute(DATABASE, "TRUNCATE jobs, schedule_cursors CASCADE")
    # The schedule has run before: its cursor is an hour back, so the hour's slot is due now.
    hour = cluster.execute(DATABASE, "SELECT date_trunc('hour', now())")[0][0]
    key = Schedule(name=SCHEDULE, job_type="tests.noop", every=timedelta(hours=1)).idempotency_key(
        hour
    )
    cluster.execute(
        DATABASE,
        "INSERT INTO schedule_cursors (name, last_slot_at) VALUES (%s, %s)",
        [SCHEDULE, hour - timedelta(hours=1)],
    )
    with cluster.connect(DATABASE) as holder:
        holder.autocommit = False
        # The scheduler's insert of the slot's job waits for this lock (not idle: waiting).
        holder.execute("LOCK TABLE jobs IN SHARE MODE")
        worker = start_worker(
            "--roles",
            "scheduler",
            database_url=url,
            env=QUIET,
            SCHEDULES=SCHEDULES,
        )
        with cluster.connect(DATABASE) as watcher:

            def waits_for_the_lock() -> bool:
                """the scheduler's insert of the slot's job waits for the test's lock"""
                return bool(
                    _count(
                        watcher,
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                        "AND wait_event_type = 'Lock'",
                        worker.application_name,
                    )
                )

            wait_for(waits_for_the_lock, timeout=60)
            # Waiting for a lock is not idle: past the timeout, the session still waits.
            time.sleep(STOPPED - 2)
            assert waits_for_the_lock()
            worker.signal(signal.SIGSTOP)
            holder.rollback()

            def ended() -> bool:
                """the server ended the stopped scheduler's session"""
                return not _count(
                    watcher,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND xact_start IS NOT NULL",
                    worker.application_name,
                )

            try:
                wait_for(ended, timeout=STOPPED + 10)
                time.sleep(STOPPED - 3)
            finally:
                worker.signal(signal.SIGCONT)

            def enqueued() -> int:
                """the slot's job is in the table"""
                return _count(watcher, "SELECT count(*) FROM jobs WHERE idempotency_key = %s", key)

            wait_for(enqueued, timeout=60)
            time.sleep(3)
            assert enqueued() == 1
            assert worker.process.poll() is None, worker.output()
            output = worker.output()
            assert "Traceback" not in output, output
            assert "scheduler: database unavailable" in output, output
            cursor = watcher.execute(
                "SELECT last_slot_at FROM schedule_cursors WHERE name = %s", [SCHEDULE]
            ).fetchone()
            assert cursor == (hour,)


# -- a read-only database ------------------------------------------------------------------------


def test_a_worker_on_a_read_only_database_stops_in_one_line(
    cluster: Cluster, start_worker: Any
) -> None:
    """A hot standby, or a database with ``default_transaction_read_only`` (a primary being
    demoted): the first write at start fails with SQLSTATE 25006. One line that says so, not a
    traceback."""
    url = cluster.migrated_database("readonly")
    cluster.execute("postgres", "ALTER DATABASE readonly SET default_transaction_read_only = on")
    worker = start_worker(database_url=url, env=QUIET)
    status = worker.wait(timeout=60)
    output = worker.output()
    assert status != 0, output
    assert "Traceback" not in output, output
    assert "read-only" in output, output
    assert "primary" in output, output


# -- a subscriber slower than the server's idle_in_transaction_session_timeout --------------------


def test_a_subscriber_paused_past_the_idle_timeout_does_not_halt_the_relay(
    cluster: Cluster, start_worker: Any
) -> None:
    """The relay's connection is idle inside its batch's transaction while subscriber code runs.
    The database's own ``idle_in_transaction_session_timeout`` (1 s here) does not apply there:
    the batch's transaction sets the relay's bound, ``CLAIM_SECONDS`` (3 s), so a subscriber
    pausing 2 s is projected. One pausing past that bound fails its delivery
    (``subscriber_timeout``) at each try, dead after its attempts, while the rest of its batch
    is projected: the batch is never projected again and again for ever."""
    url = cluster.migrated_database("idle_relay")
    cluster.execute(
        "postgres", "ALTER DATABASE idle_relay SET idle_in_transaction_session_timeout = '1s'"
    )
    with cluster.connect("idle_relay") as conn:
        for payload in ('{"sleep": 2}', '{"sleep": 4}', "{}"):
            conn.execute(
                "INSERT INTO outbox_events (id, event_type, schema_version, aggregate_type, "
                "aggregate_id, payload) VALUES (gen_random_uuid(), 'tests.projected', 1, 't', "
                "gen_random_uuid(), %s)",
                [payload],
            )
    worker = start_worker(
        "--roles",
        "relay",
        database_url=url,
        env=QUIET,
        OUTBOX={"CLAIM_SECONDS": 3, "MAX_ATTEMPTS": 2},
        RETRY={"BASE_DELAY": 0.05, "JITTER": 0},
    )
    with cluster.connect("idle_relay") as watcher:

        def others_projected() -> bool:
            """the event without a pause and the one pausing 2 s are projected"""
            return (
                _count(
                    watcher,
                    "SELECT count(*) FROM testjobs_projection p JOIN outbox_events e "
                    "ON e.id = p.event_id WHERE e.payload IN ('{}'::jsonb, '{\"sleep\": 2}')",
                )
                == 2
            )

        wait_for(others_projected, timeout=90)

        def slow_one_dead() -> int:
            """the delivery of the event pausing 4 s is dead after its attempts"""
            return _count(
                watcher,
                "SELECT count(*) FROM outbox_deliveries d JOIN outbox_events e "
                "ON e.id = d.event_id WHERE d.dead_at IS NOT NULL "
                "AND d.last_error_code = 'subscriber_timeout' AND e.payload = '{\"sleep\": 4}'",
            )

        wait_for(slow_one_dead, timeout=90)
    assert worker.process.poll() is None, worker.output()
    # One abandoned batch per failure at most: never the same batch again and again.
    assert worker.output().count("database unavailable") <= 2, worker.output()
