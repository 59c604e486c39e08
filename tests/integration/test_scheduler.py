"""Schedules: slots, catch-up policies, the lock and the cursor, maintenance jobs."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import UTC, datetime, timedelta
from io import StringIO
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from django_pgoutbox import checks, enqueue, job, publish
from django_pgoutbox.cron import Cron
from django_pgoutbox.maintenance import prune, reconcile_outbox
from django_pgoutbox.models import Job, JobStatus, OutboxEvent, ScheduleCursor
from django_pgoutbox.scheduler import Scheduler, enqueue_due
from django_pgoutbox.schedules import Schedule, _decorated, load_schedules, schedule
from tests.processes import wait_for

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def every(seconds: float, **options: Any) -> Schedule:
    return Schedule(
        name="tick",
        job_type="tests.noop",
        every=timedelta(seconds=seconds),
        queue="default",
        **options,
    )


class TestSlots:
    def test_interval_slots_are_aligned_to_the_epoch(self) -> None:
        tick = every(60)
        assert tick.latest_due(T0 + timedelta(seconds=59)) == T0
        assert tick.next_after(T0) == T0 + timedelta(minutes=1)
        assert tick.next_after(T0 + timedelta(seconds=1)) == T0 + timedelta(minutes=1)

    def test_catch_up_latest(self) -> None:
        now = T0 + timedelta(seconds=10.5)
        assert every(1).slots_to_enqueue(T0, now) == [T0 + timedelta(seconds=10)]

    def test_catch_up_all_is_bounded(self) -> None:
        now = T0 + timedelta(seconds=10.5)
        all_slots = every(1, catch_up="all").slots_to_enqueue(T0, now)
        assert all_slots == [T0 + timedelta(seconds=n) for n in range(1, 11)]
        bounded = every(1, catch_up="all", max_catch_up=4).slots_to_enqueue(T0, now)
        assert bounded == [T0 + timedelta(seconds=n) for n in range(7, 11)]

    def test_catch_up_none_runs_only_a_fresh_slot(self) -> None:
        policy = every(1, catch_up="none", grace=timedelta(seconds=0.3))
        assert policy.slots_to_enqueue(T0, T0 + timedelta(seconds=10.2)) == [
            T0 + timedelta(seconds=10)
        ]
        assert policy.slots_to_enqueue(T0, T0 + timedelta(seconds=10.7)) == []

    def test_cron_catch_up_all(self) -> None:
        hourly = Schedule(
            name="h",
            job_type="tests.noop",
            cron=Cron.parse("0 * * * *"),
            queue="default",
            catch_up="all",
        )
        slots = hourly.slots_to_enqueue(T0, T0 + timedelta(hours=3, minutes=5))
        assert slots == [T0 + timedelta(hours=n) for n in (1, 2, 3)]

    def test_lock_keys_are_stable_and_distinct(self) -> None:
        assert every(1).lock_key == every(1).lock_key
        other = Schedule(name="tock", job_type="tests.noop", every=timedelta(seconds=1))
        assert other.lock_key != every(1).lock_key


class TestDeclaring:
    def test_builtins_are_on_by_default(self) -> None:
        schedules, problems = load_schedules()
        assert problems == []
        assert {"pgoutbox.recover_leases", "pgoutbox.prune", "pgoutbox.reconcile_outbox"} <= set(
            schedules
        )
        assert schedules["pgoutbox.prune"].queue == "default"

    def test_setting_adds_overrides_and_removes(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "MAINTENANCE_QUEUE": "maintenance",
            "SCHEDULES": {
                "nightly": {
                    "JOB": "tests.noop",
                    "CRON": "0 3 * * *",
                    "QUEUE": "reports",
                    "PAYLOAD": {"kind": "nightly"},
                    "CATCH_UP": "all",
                },
                "pgoutbox.prune": None,
                "pgoutbox.recover_leases": {"JOB": "pgoutbox.recover_leases", "EVERY": 5},
            },
        }
        schedules, problems = load_schedules()
        assert problems == []
        assert "pgoutbox.prune" not in schedules
        assert schedules["pgoutbox.recover_leases"].every == timedelta(seconds=5)
        assert schedules["pgoutbox.reconcile_outbox"].queue == "maintenance"
        nightly = schedules["nightly"]
        assert (nightly.spec, nightly.queue, nightly.catch_up) == (
            "0 3 * * * (UTC)",
            "reports",
            "all",
        )
        assert nightly.payload == {"kind": "nightly"}

    def test_a_schedule_is_read_in_its_tz_or_in_schedule_tz(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "SCHEDULE_TZ": "America/New_York",
            "SCHEDULES": {
                "berlin": {"JOB": "tests.noop", "CRON": "0 8 * * *", "TZ": "Europe/Berlin"},
                "default": {"JOB": "tests.noop", "CRON": "0 8 * * *"},
                "tick": {"JOB": "tests.noop", "EVERY": 60},
            },
        }
        schedules, problems = load_schedules()
        assert problems == []
        assert schedules["berlin"].spec == "0 8 * * * (Europe/Berlin)"
        assert schedules["default"].spec == "0 8 * * * (America/New_York)"
        assert schedules["tick"].spec == "every 60s"
        winter = datetime(2026, 1, 15, tzinfo=UTC)
        assert schedules["berlin"].next_after(winter) == winter.replace(hour=7)
        assert schedules["default"].next_after(winter) == winter.replace(hour=13)

    def test_a_tz_may_be_a_zoneinfo(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "SCHEDULE_TZ": ZoneInfo("America/New_York"),
            "SCHEDULES": {
                "berlin": {
                    "JOB": "tests.noop",
                    "CRON": "0 8 * * *",
                    "TZ": ZoneInfo("Europe/Berlin"),
                },
                "utc": {"JOB": "tests.noop", "CRON": "0 8 * * *", "TZ": UTC},
                "default": {"JOB": "tests.noop", "CRON": "0 8 * * *"},
            },
        }
        schedules, problems = load_schedules()
        assert problems == []
        assert [schedules[name].spec for name in ("berlin", "utc", "default")] == [
            "0 8 * * * (Europe/Berlin)",
            "0 8 * * * (UTC)",
            "0 8 * * * (America/New_York)",
        ]

    def test_decorator(self, registry: None) -> None:
        @schedule(every=10, payload={"x": 1}, grace=timedelta(minutes=5))
        @job("tests.decorated")
        def decorated(payload: dict[str, Any], ctx: Any) -> None:
            pass

        @schedule("30 2 * * *", tz="Europe/Berlin", name="tests.decorated_tz")
        @job("tests.decorated_tz")
        def decorated_tz(payload: dict[str, Any], ctx: Any) -> None:
            pass

        try:
            schedules, _ = load_schedules()
            assert schedules["tests.decorated"].every == timedelta(seconds=10)
            assert schedules["tests.decorated"].payload == {"x": 1}
            assert schedules["tests.decorated"].grace == timedelta(minutes=5)
            assert schedules["tests.decorated_tz"].spec == "30 2 * * * (Europe/Berlin)"
        finally:
            _decorated.pop("tests.decorated")
            _decorated.pop("tests.decorated_tz")

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"JOB": "tests.noop", "CRON": "61 * * * *"}, "minute field '61' is not valid"),
            (
                {"JOB": "tests.noop", "CRON": "0 8 * * *", "TZ": "Europe/Berln"},
                "TZ 'Europe/Berln' is not a time zone of the IANA database",
            ),
            (
                {"JOB": "tests.noop", "CRON": "0 8 * * *", "TZ": 1},
                "TZ must be an IANA time zone name such as 'Europe/Berlin', not 1",
            ),
            ({"JOB": "tests.noop", "EVERY": 5, "TZ": "UTC"}, "TZ applies to CRON only"),
            ({"JOB": "nope.missing", "EVERY": 5}, "'nope.missing' is not a registered @job"),
            ({"JOB": "tests.noop"}, "exactly one of CRON"),
            ({"JOB": "tests.noop", "EVERY": 5, "CRON": "* * * * *"}, "exactly one of CRON"),
            ({"JOB": "tests.noop", "EVERY": 0}, "EVERY must be a positive"),
            ({"JOB": "tests.noop", "EVERY": 5, "QUEUE": "nowhere"}, "queue 'nowhere'"),
            ({"JOB": "tests.noop", "EVERY": 5, "CATCH_UP": "some"}, "CATCH_UP must be one of"),
            ({"JOB": "tests.noop", "EVERY": 5, "MAX_CATCH_UP": 0}, "MAX_CATCH_UP must be"),
            ({"JOB": "tests.noop", "EVERY": 5, "PAYLOAD": [1]}, "PAYLOAD must be a dict"),
            ({"JOB": "tests.noop", "EVERY": 5, "WHEN": 1}, "unknown key 'WHEN'"),
            ("every minute", "must be a dict of options"),
        ],
    )
    def test_invalid_schedule_fails_the_checks(
        self, settings: Any, options: Any, message: str
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "SCHEDULES": {"bad": options}}
        messages = checks.check_schedules(None)
        assert [m.id for m in messages] == ["pgoutbox.E007"]
        assert messages[0].msg.startswith("schedule 'bad': ")
        assert message in messages[0].msg

    def test_maintenance_queue_must_exist(self) -> None:
        from django_pgoutbox.conf import parse_settings

        _, problems = parse_settings({"QUEUES": {"alerts": {}}})
        assert [p.key for p in problems] == ["PGOUTBOX['MAINTENANCE_QUEUE']"]


@pytest.mark.django_db
class TestEnqueueDue:
    def test_first_sight_starts_the_cursor_then_each_slot_once(self) -> None:
        tick = every(1)
        assert enqueue_due(tick, using="default", now=T0 + timedelta(seconds=0.5)) == []
        assert ScheduleCursor.objects.get(name="tick").last_slot_at == T0
        assert enqueue_due(tick, using="default", now=T0 + timedelta(seconds=0.9)) == []
        jobs = enqueue_due(tick, using="default", now=T0 + timedelta(seconds=1.2))
        assert jobs is not None
        assert len(jobs) == 1
        assert jobs[0].idempotency_key == "schedule:tick:2026-03-01T12:00:01+00:00"
        assert ScheduleCursor.objects.get(name="tick").last_slot_at == T0 + timedelta(seconds=1)
        assert enqueue_due(tick, using="default", now=T0 + timedelta(seconds=1.5)) == []
        assert Job.objects.count() == 1

    def test_a_cursor_lost_by_hand_still_enqueues_the_slot_once(self) -> None:
        tick = every(1)
        enqueue_due(tick, using="default", now=T0)
        enqueue_due(tick, using="default", now=T0 + timedelta(seconds=1))
        ScheduleCursor.objects.filter(name="tick").update(last_slot_at=T0)  # rewound
        enqueue_due(tick, using="default", now=T0 + timedelta(seconds=1))
        assert Job.objects.count() == 1  # the idempotency key held

    @pytest.mark.parametrize(
        ("policy", "expected"),
        [("latest", [10]), ("all", list(range(1, 11))), ("none", [])],
    )
    def test_scheduler_down_for_ten_slots(self, policy: str, expected: list[int]) -> None:
        tick = every(1, catch_up=policy, grace=timedelta(seconds=0.3))
        enqueue_due(tick, using="default", now=T0)
        enqueue_due(tick, using="default", now=T0 + timedelta(seconds=10.6))
        keys = sorted(key or "" for key in Job.objects.values_list("idempotency_key", flat=True))
        assert keys == [tick.idempotency_key(T0 + timedelta(seconds=n)) for n in expected]
        assert ScheduleCursor.objects.get(name="tick").last_slot_at == T0 + timedelta(seconds=10)

    @pytest.mark.parametrize(
        ("policy", "now", "enqueued"),
        [
            (
                "latest",
                10.6,
                "enqueued only the latest, 2026-03-01T12:00:10+00:00, and skipped the others",
            ),
            ("none", 10.6, "skipped them all"),
            (
                "none",
                10.2,
                "enqueued only the latest, 2026-03-01T12:00:10+00:00, and skipped the others",
            ),
        ],
    )
    def test_missed_slots_are_told_in_plain_words(
        self, policy: str, now: float, enqueued: str, caplog: Any
    ) -> None:
        tick = every(1, catch_up=policy, grace=timedelta(seconds=0.3))
        enqueue_due(tick, using="default", now=T0)
        with caplog.at_level("WARNING", logger="django_pgoutbox.scheduler"):
            enqueue_due(tick, using="default", now=T0 + timedelta(seconds=now))
        (record,) = caplog.records
        assert record.getMessage() == (
            "schedule tick: missed its slots after 2026-03-01T12:00:00+00:00 (no scheduler was "
            f"running at those times); CATCH_UP {policy!r} {enqueued}. Set this schedule's "
            "CATCH_UP to 'all' to enqueue every missed slot (docs/scheduling.md)."
        )

    def test_the_built_in_maintenance_notes_its_missed_slots_without_a_warning(
        self, caplog: Any
    ) -> None:
        """Recovery, pruning and reconciliation lose nothing by skipping slots: after a pause,
        each worker start would otherwise warn about them."""
        recover = dataclasses.replace(
            every(30, grace=timedelta(seconds=1)), name="pgoutbox.recover_leases"
        )
        enqueue_due(recover, using="default", now=T0)
        with caplog.at_level("INFO", logger="django_pgoutbox.scheduler"):
            enqueue_due(recover, using="default", now=T0 + timedelta(seconds=300))
        [missed] = [r for r in caplog.records if "missed its slots" in r.getMessage()]
        assert missed.levelname == "INFO"


def berlin_schedule(cron: str, catch_up: str = "latest") -> Schedule:
    return Schedule(
        name="berlin",
        job_type="tests.noop",
        cron=Cron.parse(cron, ZoneInfo("Europe/Berlin")),
        queue="default",
        catch_up=catch_up,
    )


def enqueued_slots() -> list[str]:
    keys = Job.objects.values_list("idempotency_key", flat=True)
    return sorted((key or "").removeprefix("schedule:berlin:") for key in keys)


@pytest.mark.django_db
class TestDaylightSavingTime:
    """Europe/Berlin, 2026: 02:xx does not exist on 29 March and happens twice on 25 October."""

    @pytest.mark.parametrize(
        ("day", "slot"),
        [("2026-03-29", "2026-03-29T01:00:00+00:00"), ("2026-10-25", "2026-10-25T00:30:00+00:00")],
    )
    def test_a_daily_0230_is_enqueued_once_on_the_day_the_clocks_change(
        self, day: str, slot: str
    ) -> None:
        nightly = berlin_schedule("30 2 * * *")
        midnight = datetime.fromisoformat(f"{day}T00:00:00+00:00")
        enqueue_due(nightly, using="default", now=midnight - timedelta(hours=2))
        # The scheduler's turns through the day, a minute apart, as run() would take them.
        for minute in range(24 * 60):
            enqueue_due(nightly, using="default", now=midnight + timedelta(minutes=minute))
        assert enqueued_slots() == [slot]

    @pytest.mark.parametrize(("day", "hours"), [("2026-03-29", 23), ("2026-10-25", 25)])
    def test_catch_up_all_across_the_change_enqueues_every_real_hour(
        self, day: str, hours: int
    ) -> None:
        hourly = berlin_schedule("0 * * * *", catch_up="all")
        # In UTC: arithmetic on a datetime in Europe/Berlin would add hours of the wall clock.
        midnight = datetime.fromisoformat(day).replace(tzinfo=ZoneInfo("Europe/Berlin"))
        midnight = midnight.astimezone(UTC)
        enqueue_due(hourly, using="default", now=midnight - timedelta(minutes=30))
        # Down all day: the scheduler comes back just after the next local midnight.
        enqueue_due(hourly, using="default", now=midnight + timedelta(hours=hours, seconds=1))
        slots = [datetime.fromisoformat(slot) for slot in enqueued_slots()]
        assert len(slots) == hours + 1  # the day's hours and the next midnight
        assert all(b - a == timedelta(hours=1) for a, b in pairwise(slots))


@pytest.mark.django_db(transaction=True)  # the lock holder is a second connection
def test_a_held_lock_makes_the_scheduler_skip(raw_connection_params: dict[str, Any]) -> None:
    tick = every(1)
    enqueue_due(tick, using="default", now=T0)
    with psycopg.connect(**raw_connection_params) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [tick.lock_key])
        assert enqueue_due(tick, using="default", now=T0 + timedelta(seconds=1)) is None
        other.execute("SELECT pg_advisory_unlock(%s)", [tick.lock_key])
    assert len(enqueue_due(tick, using="default", now=T0 + timedelta(seconds=1)) or []) == 1


@pytest.mark.django_db(transaction=True)  # the scheduler thread has its own connection
def test_scheduler_loop_enqueues_at_each_slot() -> None:
    tick = Schedule(
        name="fast", job_type="tests.noop", every=timedelta(seconds=0.2), queue="default"
    )
    import time

    def enqueued() -> int:
        return Job.objects.filter(idempotency_key__startswith="schedule:fast:").count()

    loop = Scheduler({"fast": tick}, using="default", poll_interval=5)
    thread = threading.Thread(target=loop.run)
    started = time.monotonic()
    thread.start()
    try:
        wait_for(lambda: enqueued() >= 5, timeout=10)  # slot after slot, with no notification
    finally:
        loop.stop()
        thread.join(timeout=10)
    elapsed = time.monotonic() - started
    # Never more than one a slot: slots fall on 0.2 s boundaries, and a run of elapsed seconds
    # spans at most elapsed / 0.2 + 1 of them.
    assert enqueued() <= elapsed / 0.2 + 1


@pytest.mark.django_db
class TestMaintenance:
    def test_retention_deletes_only_old_finished_rows(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "RETENTION": {"COMPLETED_JOBS": 60, "CANCELLED_JOBS": 60, "PROCESSED_EVENTS": 60},
        }
        old = timezone.now() - timedelta(hours=1)
        for status in JobStatus.values:
            for _ in range(3):
                created = enqueue("tests.noop", {})
                Job.objects.filter(pk=created.pk).update(
                    status=status, finished_at=old, completed_at=old
                )
        fresh = enqueue("tests.noop", {})
        Job.objects.filter(pk=fresh.pk).update(status="completed", finished_at=timezone.now())
        for processed in (old, None, timezone.now()):
            event = publish("x.y", aggregate_type="x", aggregate_id=fresh.pk, payload={})
            OutboxEvent.objects.filter(pk=event.pk).update(processed_at=processed)
        from django_pgoutbox.models import WorkerHeartbeat

        long_ago = timezone.now() - timedelta(days=2)
        for worker_id, seen in (("gone", long_ago), ("alive", old)):
            WorkerHeartbeat.objects.create(
                worker_id=worker_id, hostname="h", pid=1, roles=["jobs"], queues=["default"]
            )
            WorkerHeartbeat.objects.filter(pk=worker_id).update(last_seen_at=seen)
        result = prune(batch=2)
        assert (result.completed_jobs, result.cancelled_jobs, result.processed_events) == (3, 3, 1)
        assert result.stale_heartbeats == 1
        assert list(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == ["alive"]
        remaining = sorted(Job.objects.values_list("status", flat=True))
        assert remaining == sorted(
            ["waiting"] * 3
            + ["pending"] * 3
            + ["leased"] * 3
            + ["retrying"] * 3
            + ["dead"] * 3
            + ["completed"]
        )
        assert OutboxEvent.objects.count() == 2

    def test_retention_none_keeps_everything(self, settings: Any) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "RETENTION": {"COMPLETED_JOBS": None}}
        created = enqueue("tests.noop", {})
        Job.objects.filter(pk=created.pk).update(
            status="completed", finished_at=timezone.now() - timedelta(days=999)
        )
        assert prune().completed_jobs == 0

    def test_reconcile_releases_expired_claims_and_counts_overdue(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "OUTBOX": {"CLAIM_SECONDS": 60, "OVERDUE_SECONDS": 60},
        }
        event = publish(
            "x.y",
            aggregate_type="x",
            aggregate_id=uuid.uuid4(),
            payload={},
        )
        long_ago = timezone.now() - timedelta(hours=2)
        OutboxEvent.objects.filter(pk=event.pk).update(
            claimed_at=long_ago, claimed_by="dead-relay", occurred_at=long_ago
        )
        result = reconcile_outbox()
        assert (result.released_claims, result.overdue_events) == (1, 1)
        assert (result.oldest_overdue_seconds or 0) > 7000
        event.refresh_from_db()
        # The holder is forgotten; the claim's time stays, for the next claim to count it.
        assert (event.claimed_at, event.claimed_by) == (long_ago, None)
        assert reconcile_outbox().released_claims == 0

    def test_commands(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "SCHEDULES": {
                "morning": {"JOB": "tests.noop", "CRON": "0 8 * * *", "TZ": "Europe/Berlin"}
            },
        }
        job_row = enqueue("tests.behave", {})
        with connection.cursor() as cursor:
            from django_pgoutbox import queries

            # Inside the test's transaction now() stands still: a lease that already ended.
            cursor.execute(
                queries.CLAIM_JOBS,
                {"queue": "default", "limit": 1, "worker_id": "killed-worker", "lease": -1.0},
            )
        out = StringIO()
        call_command("pgoutbox", "recover-leases", stdout=out)
        assert "Recovered 1 expired lease(s)" in out.getvalue()
        job_row.refresh_from_db()
        assert job_row.status == JobStatus.RETRYING
        out = StringIO()
        call_command("pgoutbox", "run-schedule", "pgoutbox.prune", stdout=out)
        assert Job.objects.filter(job_type="pgoutbox.prune").count() == 1
        out = StringIO()
        call_command("pgoutbox", "schedules", stdout=out)
        assert "pgoutbox.recover_leases" in out.getvalue()
        assert "every 30s" in out.getvalue()
        assert "0 8 * * * (Europe/Berlin)" in out.getvalue()
        from django.core.management import CommandError

        with pytest.raises(CommandError, match="no schedule 'nope'"):
            call_command("pgoutbox", "run-schedule", "nope")


class TestPoisonValues:
    """Schedules that ``enqueue()`` would refuse at run time are refused at check, by enqueue's
    own validators, naming the schedule and the key."""

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"PRIORITY": 1099511627776}, "PRIORITY: 1099511627776 is outside the 32-bit"),
            ({"PAYLOAD": {"x": float("nan")}}, "PAYLOAD['x']: nan is not a JSON number"),
            ({"PAYLOAD": {"x": "a\x00b"}}, "PAYLOAD['x']: contains a NUL character"),
            ({"PAYLOAD": {"x": "\udc80"}}, "PAYLOAD['x']: contains an unpaired surrogate"),
            ({"PAYLOAD": {1: "int key"}}, "PAYLOAD[1]: JSON object keys must be strings"),
            ({"PAYLOAD": {"when": object()}}, "is not JSON-serialisable"),
            (
                {"EVERY": 1e300},
                "EVERY must be a positive number of seconds or a timedelta, at most",
            ),
            ({"EVERY": float("nan")}, "EVERY must be a positive number"),
            ({"EVERY": float("inf")}, "EVERY must be a positive number"),
            ({"EVERY": timedelta(days=400)}, "at most 365 days"),
            ({"EVERY": 1e-9}, "EVERY must be at least a microsecond"),
            ({"GRACE": float("inf")}, "GRACE must be a number of seconds >= 0"),
            ({"GRACE": 1e300}, "GRACE must be a number of seconds >= 0"),
        ],
    )
    def test_refused_at_check(self, settings: Any, options: Any, message: str) -> None:
        bad = {"JOB": "tests.noop", "EVERY": 5, **options}
        settings.PGOUTBOX = {**settings.PGOUTBOX, "SCHEDULES": {"bad": bad}}
        messages = checks.check_schedules(None)
        assert [m.id for m in messages] == ["pgoutbox.E007"]
        assert messages[0].msg.startswith("schedule 'bad': ")
        assert message in messages[0].msg

    def test_a_name_enqueue_would_refuse_as_an_idempotency_key(self, settings: Any) -> None:
        settings.PGOUTBOX = {
            **settings.PGOUTBOX,
            "SCHEDULES": {"bad\udc80": {"JOB": "tests.noop", "EVERY": 5}},
        }
        messages = checks.check_schedules(None)
        assert [m.id for m in messages] == ["pgoutbox.E007"]
        assert "the name: contains an unpaired surrogate" in messages[0].msg


@pytest.mark.django_db
def test_a_schedule_that_fails_is_counted_and_skipped_and_the_others_run() -> None:
    """One schedule whose enqueue the database refuses (a trigger): logged, counted in
    ``pgoutbox_schedule_failures_total``, skipped; the next schedule is enqueued."""
    from django_pgoutbox import metrics
    from tests.processes.reliability.test_poison_values import REFUSE_POISON_SCHEDULE

    with connection.cursor() as cursor:
        cursor.execute(REFUSE_POISON_SCHEDULE)
    bad = Schedule(
        name="bad", job_type="tests.poison_schedule", every=timedelta(seconds=1), queue="default"
    )
    good = every(1)
    loop = Scheduler({"bad": bad, "tick": good}, using="default", poll_interval=5)
    before = metrics.SCHEDULE_FAILURES.value(schedule="bad")
    loop.run_once(now=T0)  # places both cursors
    loop.run_once(now=T0 + timedelta(seconds=1))
    assert metrics.SCHEDULE_FAILURES.value(schedule="bad") == before + 1
    assert Job.objects.filter(job_type="tests.noop").count() == 1
    assert not Job.objects.filter(job_type="tests.poison_schedule").exists()
