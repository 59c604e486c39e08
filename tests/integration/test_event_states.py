"""Failing, dead, held back, abandoned: an outbox event's states, and the bulk re-drive of dead
events by age. Each state is made on real rows, then read by every place that reports it: the
gauges (`pgoutbox stats`, Prometheus), the health report, the reconciliation, the admin's
filter and `pgoutbox events list`."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from django_pgoutbox import gauges, publish
from django_pgoutbox.event_states import EVENT_STATES
from django_pgoutbox.health import health_report
from django_pgoutbox.maintenance import reconcile_outbox
from django_pgoutbox.models import OutboxEvent
from django_pgoutbox.prometheus import database_exposition

pytestmark = pytest.mark.django_db

EVENTS = "/admin/pgoutbox/outboxevent/"


def event(aggregate: uuid.UUID, **fields: Any) -> OutboxEvent:
    """An event of ``aggregate``, its columns then set as ``fields`` say (ages in seconds ago)."""
    made = publish("x.happened", aggregate_type="x", aggregate_id=aggregate, payload={})
    now = timezone.now()
    values = {
        name: now - timedelta(seconds=value) if name.endswith("_at") else value
        for name, value in fields.items()
    }
    OutboxEvent.objects.filter(pk=made.pk).update(**values)
    return OutboxEvent.objects.get(pk=made.pk)


def old(seconds: float) -> dict[str, float]:
    return {"occurred_at": seconds, "available_at": seconds}


@pytest.fixture
def states() -> dict[str, OutboxEvent]:
    """One event of each kind, on the default OVERDUE_SECONDS (300)."""
    a, b, c, d, e, f = (uuid.uuid4() for _ in range(6))
    return {
        "abandoned": event(a, **old(400)),
        "behind_abandoned": event(a, **old(399)),
        "failing": event(b, occurred_at=900, available_at=-30, last_error="boom", attempts=2),
        "failing_due": event(f, occurred_at=900, available_at=350, last_error="boom", attempts=1),
        "dead": event(c, **old(800), dead_at=700, attempts=5, last_error="gave up"),
        "behind_dead": event(c, **old(790)),
        "claimed": event(d, **old(600), claimed_at=10, claimed_by="relay-1"),
        "new": event(e),
        "processed": event(uuid.uuid4(), **old(1000), processed_at=900),
    }


def ids(*events: OutboxEvent) -> set[uuid.UUID]:
    return {e.pk for e in events}


def chosen(state: str) -> set[uuid.UUID]:
    return set(OutboxEvent.objects.filter(EVENT_STATES[state]()).values_list("pk", flat=True))


class TestStates:
    def test_each_state_selects_its_events(self, states: dict[str, OutboxEvent]) -> None:
        s = states
        # A failing event whose back-off ended 350 s ago and that no relay retried since is
        # abandoned too: nothing runs it.
        assert chosen("abandoned") == ids(s["abandoned"], s["failing_due"])
        assert chosen("failing") == ids(s["failing"], s["failing_due"])
        assert chosen("held_back") == ids(s["behind_abandoned"], s["behind_dead"])
        assert chosen("dead") == ids(s["dead"])
        assert chosen("processed") == ids(s["processed"])
        assert s["new"].pk in chosen("pending")

    def test_the_gauges_the_health_report_and_the_reconciliation_count_them(
        self, states: dict[str, OutboxEvent]
    ) -> None:
        measured = gauges.database_gauges()
        assert measured.outbox_abandoned == 2
        assert 349 < measured.outbox_abandoned_age < 420  # the older of the two: untouched 400 s
        assert "outbox_abandoned" not in measured.estimated
        counted = gauges.abandoned_events()
        assert (counted.count, counted.at_least) == (2, False)
        report = health_report(require=["jobs"])
        assert report.as_dict()["abandoned_events"]["count"] == 2
        (warning,) = [w for w in report.warnings if "outbox event" in w]
        assert warning.startswith("2 outbox event(s) due for over PGOUTBOX['OUTBOX']")
        result = reconcile_outbox()
        assert result.abandoned_events == 2
        assert result.overdue_events == 7  # abandoned, held back, failing, dead and claimed
        exposition = database_exposition("default").decode()
        assert "\npgoutbox_outbox_events_abandoned 2.0\n" in exposition

    def test_stats_shows_them(self, states: dict[str, OutboxEvent]) -> None:
        out = io.StringIO()
        call_command("pgoutbox", "stats", stdout=out)
        assert "1 dead, 2 abandoned" in out.getvalue()

    def test_a_longer_threshold_abandons_nothing(
        self, settings: Any, states: dict[str, OutboxEvent]
    ) -> None:
        settings.PGOUTBOX = {**settings.PGOUTBOX, "OUTBOX": {"OVERDUE_SECONDS": 3600}}
        assert gauges.database_gauges().outbox_abandoned == 0
        assert gauges.abandoned_events().count == 0
        assert not chosen("abandoned")
        assert not [w for w in health_report(require=["jobs"]).warnings if "outbox" in w]

    def test_the_admin_filter(self, admin_client: Any, states: dict[str, OutboxEvent]) -> None:
        for state in ("abandoned", "failing", "held_back", "dead"):
            page = admin_client.get(f"{EVENTS}?state={state}").content.decode()
            shown = {event.pk for event in states.values() if f"{event.pk}/change/" in page}
            assert shown == chosen(state), state
        page = admin_client.get(f"{EVENTS}?state=nope")
        assert page.status_code == 200
        assert not [e for e in states.values() if f"{e.pk}/change/" in page.content.decode()]

    def test_events_list(self, states: dict[str, OutboxEvent]) -> None:
        out = io.StringIO()
        call_command("pgoutbox", "events", "list", "--state", "abandoned", stdout=out)
        lines = out.getvalue().splitlines()
        assert lines[0].split()[:3] == ["id", "event", "type"]
        assert [line.split()[0] for line in lines[1:]] == [
            str(states["failing_due"].pk),
            str(states["abandoned"].pk),
        ]
        out = io.StringIO()
        call_command("pgoutbox", "events", "list", "--state", "dead", stdout=out)
        assert "gave up" in out.getvalue()
        out = io.StringIO()
        call_command("pgoutbox", "events", "list", "--event-type", "none.such", stdout=out)
        assert out.getvalue().strip() == "No dead events."


@pytest.mark.parametrize("use_tz", [True, False])
def test_events_list_shows_utc_whatever_the_time_zone(settings: Any, use_tz: bool) -> None:
    """The columns say UTC: with ``USE_TZ = False`` Django reads the database's times in
    ``TIME_ZONE``, and those were shown as they came, nine hours off in Tokyo."""
    settings.USE_TZ, settings.TIME_ZONE = use_tz, "Asia/Tokyo"
    made = event(uuid.uuid4(), dead_at=0, attempts=5)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
            "FROM outbox_events WHERE id = %s",
            [made.pk],
        )
        (utc,) = cursor.fetchone()
    out = io.StringIO()
    call_command("pgoutbox", "events", "list", "--state", "dead", stdout=out)
    (row,) = [line for line in out.getvalue().splitlines() if str(made.pk) in line]
    assert utc in row


class TestManyDeadAhead:
    def test_abandoned_events_behind_many_dead_ones_are_reported(self) -> None:
        """More dead events than the gauges look at (``EXACT_COUNT``) came first, left for an
        operator; then the relay stopped. The abandoned events behind the dead ones are
        abandoned all the same: the gauges, the health report and the reconciliation must not
        say none are (it said "none of them abandoned: failing, dead or held back")."""
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, "
                "schema_version, payload, occurred_at, available_at, dead_at, attempts) "
                "SELECT gen_random_uuid(), 'x', gen_random_uuid(), 'x.happened', 1, '{}', "
                "now() - interval '2 days' + g * interval '1 ms', now() - interval '2 days', "
                "now() - interval '1 day', 5 FROM generate_series(1, %s) g",
                [gauges.EXACT_COUNT + 1],
            )
        abandoned = [event(uuid.uuid4(), **old(600)) for _ in range(3)]
        assert chosen("abandoned") == ids(*abandoned)
        assert gauges.database_gauges().outbox_abandoned == 3
        assert gauges.abandoned_events().count == 3
        assert [w for w in health_report(require=["jobs"]).warnings if "outbox event" in w]
        assert reconcile_outbox().abandoned_events == 3


class TestRedriveByAge:
    @pytest.fixture
    def dead(self) -> dict[str, OutboxEvent]:
        return {
            "week": event(uuid.uuid4(), **old(8 * 86400), dead_at=7 * 86400 + 60, attempts=5),
            "hours": event(uuid.uuid4(), **old(5 * 3600), dead_at=3 * 3600, attempts=5),
            "now": event(uuid.uuid4(), **old(60), dead_at=5, attempts=5),
        }

    def test_dead_for_chooses_the_old_ones(self, dead: dict[str, OutboxEvent]) -> None:
        out = io.StringIO()
        call_command(
            "pgoutbox", "events", "redrive", "--all", "--dead-for", "1h", "--yes", stdout=out
        )
        assert out.getvalue().strip() == "Re-drove 2 dead event(s)."
        assert chosen("dead") == ids(dead["now"])
        redriven = OutboxEvent.objects.get(pk=dead["week"].pk)
        assert (redriven.dead_at, redriven.attempts) == (None, 0)

    def test_discard_for_a_week(self, dead: dict[str, OutboxEvent]) -> None:
        out = io.StringIO()
        call_command(
            "pgoutbox", "events", "discard", "--all", "--dead-for", "7d", "--yes", stdout=out
        )
        assert out.getvalue().strip() == "Discarded 1 dead event(s)."
        assert chosen("dead") == ids(dead["hours"], dead["now"])

    def test_all_asks_first_and_refuses_without_a_terminal(
        self, dead: dict[str, OutboxEvent], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        with pytest.raises(CommandError, match=r"Re-drive 3 dead event\(s\)\? Add --yes"):
            call_command("pgoutbox", "events", "redrive", "--all")
        assert chosen("dead") == ids(*dead.values())

    def test_a_no_at_the_prompt_does_nothing(
        self, dead: dict[str, OutboxEvent], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        class Terminal(io.StringIO):
            def isatty(self) -> bool:
                return True

        monkeypatch.setattr("sys.stdin", Terminal("n\n"))
        with pytest.raises(CommandError, match="Nothing done"):
            call_command("pgoutbox", "events", "redrive", "--all", stdout=io.StringIO())
        assert chosen("dead") == ids(*dead.values())
        monkeypatch.setattr("sys.stdin", Terminal("y\n"))
        out = io.StringIO()
        call_command("pgoutbox", "events", "redrive", "--all", "--dead-for", "2d", stdout=out)
        assert out.getvalue().strip() == "Re-drove 1 dead event(s)."

    def test_ids_and_bad_arguments(self, dead: dict[str, OutboxEvent]) -> None:
        out = io.StringIO()
        call_command("pgoutbox", "events", "redrive", str(dead["now"].pk), stdout=out)
        assert out.getvalue().strip() == "Re-drove 1 dead event(s)."
        with pytest.raises(CommandError, match="not an event id"):
            call_command("pgoutbox", "events", "redrive", "nope")
        with pytest.raises(CommandError, match="ids or --all, not both"):
            call_command("pgoutbox", "events", "redrive", str(dead["week"].pk), "--all")
        with pytest.raises(CommandError, match="give event ids, or --all"):
            call_command("pgoutbox", "events", "discard")
        for args in (["list"], ["redrive", "--all"], ["discard", "--all", "--yes"]):
            with pytest.raises(CommandError, match="event-type"):  # PostgreSQL text holds no NUL
                call_command("pgoutbox", "events", *args, "--event-type", "x\x00")
        for bad in ("soon", "-1h", "nan", "1e300"):
            with pytest.raises(CommandError, match="dead-for"):
                call_command("pgoutbox", "events", "redrive", "--all", "--dead-for", bad)
        out = io.StringIO()
        call_command(
            "pgoutbox", "events", "redrive", "--all", "--event-type", "none.such", stdout=out
        )
        assert out.getvalue().strip() == "No dead events match."

    def test_the_admin_filter_dead_for(
        self, admin_client: Any, dead: dict[str, OutboxEvent]
    ) -> None:
        def chosen_by(value: str) -> set[uuid.UUID]:
            page = admin_client.get(f"{EVENTS}?dead_for={value}").content.decode()
            return {event.pk for event in dead.values() if f"{event.pk}/change/" in page}

        assert chosen_by("1h") == ids(dead["week"], dead["hours"])
        assert chosen_by("1d") == ids(dead["week"])
        assert chosen_by("7d") == ids(dead["week"])
        assert chosen_by("1y") == set()

    def test_the_admin_filter_dead_for_leaves_out_the_discarded(
        self, admin_client: Any, dead: dict[str, OutboxEvent]
    ) -> None:
        """A discarded event keeps its ``dead_at`` but is processed: it is no dead letter to
        re-drive. (The filter, reading ``dead_at`` over every event, was also a scan of the whole
        table on each page load: through ``outbox_dead_idx`` it reads the dead ones only.)"""
        call_command("pgoutbox", "events", "discard", str(dead["week"].pk), stdout=io.StringIO())
        page = admin_client.get(f"{EVENTS}?dead_for=1h").content.decode()
        assert {event.pk for event in dead.values() if f"{event.pk}/change/" in page} == ids(
            dead["hours"]
        )
