"""``pgoutbox deliveries list|redrive|discard`` and ``pgoutbox outbox replay`` on real rows, as
``pgoutbox events`` is tested in test_event_states.py."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_pgoutbox.models import OutboxDelivery, OutboxEvent
from tests.integration.test_delivery_operations import (
    FIRST,
    LATE,
    SECOND,
    add_late_subscriber,
    delivery,
    event,
    register_two,
    relay,
    seen_by,
    states,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_subscribers(registry: None) -> None:
    register_two()


def run(*args: str, **kwargs: Any) -> str:
    out = io.StringIO()
    call_command("pgoutbox", *args, stdout=out, **kwargs)
    return out.getvalue()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def rows() -> dict[str, OutboxDelivery]:
    """Deliveries of each state, of two subscribers; dead ones dead for a week, hours, now."""
    week = event(1, ago=8 * 86400)
    hours = event(2, ago=5 * 3600)
    now = event(3, ago=60)
    other = event(4, event_type="tests.ops.other", ago=30)
    return {
        "week": delivery(week, FIRST, "dead", dead_ago=7 * 86400 + 60),
        "hours": delivery(hours, SECOND, "dead", dead_ago=3 * 3600),
        "now": delivery(now, FIRST, "dead", dead_ago=5),
        "failing": delivery(week, SECOND, "failing"),
        "waiting": delivery(hours, FIRST, "waiting"),
        "delivered": delivery(now, SECOND, "delivered"),
        "other": delivery(other, FIRST, "dead", dead_ago=10),
    }


def dead() -> set[int]:
    return {pk for pk, state in states().items() if state == "dead"}


def pks(rows: dict[str, OutboxDelivery], *names: str) -> set[int]:
    return {rows[name].pk for name in names}


class TestList:
    def test_each_state(self, rows: dict[str, OutboxDelivery]) -> None:
        lines = run("deliveries", "list").splitlines()
        assert lines[0].split() == [
            "id",
            "event",
            "id",
            "event",
            "type",
            "subscriber",
            "state",
            "attempts",
            "due",
            "(UTC)",
            "dead",
            "since",
            "(UTC)",
            "error",
        ]
        listed = [int(line.split()[0]) for line in lines[1:]]
        # Oldest event first.
        assert listed == [rows[name].pk for name in ("week", "hours", "now", "other")]
        assert "tests.ops.other" in lines[-1]
        assert "RuntimeError: no" in lines[1]
        for state in ("waiting", "failing", "delivered"):
            (line,) = run("deliveries", "list", "--state", state).splitlines()[1:]
            assert int(line.split()[0]) == rows[state].pk
            assert f" {state} " in line

    def test_filters_and_limit(self, rows: dict[str, OutboxDelivery]) -> None:
        def listed(*args: str) -> set[int]:
            return {
                int(line.split()[0]) for line in run("deliveries", "list", *args).splitlines()[1:]
            }

        assert listed("--subscriber", SECOND) == pks(rows, "hours")
        assert listed("--event-type", "tests.ops.other") == pks(rows, "other")
        assert listed("--subscriber", FIRST, "--event-type", "tests.ops") == pks(
            rows, "week", "now"
        )
        assert listed("--limit", "1") == pks(rows, "week")
        assert run("deliveries", "list", "--subscriber", "nobody").strip() == "No dead deliveries."
        assert run("deliveries", "list", "--state", "waiting", "--event-type", "x").strip() == (
            "No waiting deliveries."
        )

    @pytest.mark.parametrize("use_tz", [True, False])
    def test_times_are_utc_whatever_the_time_zone(
        self, settings: Any, use_tz: bool, rows: dict[str, OutboxDelivery]
    ) -> None:
        settings.USE_TZ, settings.TIME_ZONE = use_tz, "Asia/Tokyo"
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT to_char(dead_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') "
                "FROM outbox_deliveries WHERE id = %s",
                [rows["hours"].pk],
            )
            (utc,) = cursor.fetchone()
        (line,) = [
            line
            for line in run("deliveries", "list").splitlines()
            if line.split()[0] == str(rows["hours"].pk)
        ]
        assert utc in line


class TestRedriveAndDiscard:
    def test_ids(self, rows: dict[str, OutboxDelivery]) -> None:
        assert run("deliveries", "redrive", str(rows["now"].pk)).strip() == (
            "Re-drove 1 dead delivery."
        )
        assert rows["now"].pk not in dead()
        # Not dead: touched by neither.
        for action in ("redrive", "discard"):
            for name in ("failing", "waiting", "delivered", "now"):
                assert run("deliveries", action, str(rows[name].pk)).strip() == (
                    f"{'Re-drove' if action == 'redrive' else 'Discarded'} 0 dead deliveries."
                )
        assert run(
            "deliveries", "discard", str(rows["week"].pk), str(rows["hours"].pk)
        ).strip() == ("Discarded 2 dead deliveries.")
        assert dead() == pks(rows, "other")

    def test_all_asks_with_the_count_and_the_subscribers(
        self, rows: dict[str, OutboxDelivery], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        with pytest.raises(
            CommandError,
            match=r"Re-drive 4 dead deliveries of 2 subscribers\? Add --yes to confirm",
        ):
            run("deliveries", "redrive", "--all")
        with pytest.raises(
            CommandError,
            match=rf"Discard 3 dead deliveries of subscriber '{FIRST}'\? Add --yes",
        ):
            run("deliveries", "discard", "--all", "--subscriber", FIRST)
        with pytest.raises(CommandError, match=r"Discard 1 dead delivery of 1 subscriber\?"):
            run("deliveries", "discard", "--all", "--event-type", "tests.ops.other")
        assert dead() == pks(rows, "week", "hours", "now", "other")

    def test_a_no_at_the_prompt_does_nothing_and_a_yes_acts(
        self, rows: dict[str, OutboxDelivery], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr("sys.stdin", Terminal("n\n"))
        with pytest.raises(CommandError, match="Nothing done"):
            run("deliveries", "redrive", "--all")
        assert dead() == pks(rows, "week", "hours", "now", "other")
        monkeypatch.setattr("sys.stdin", Terminal("y\n"))
        assert (
            run("deliveries", "redrive", "--all", "--dead-for", "2d")
            .strip()
            .endswith("Re-drove 1 dead delivery.")
        )
        assert dead() == pks(rows, "hours", "now", "other")

    def test_dead_for_and_the_subscriber_choose(self, rows: dict[str, OutboxDelivery]) -> None:
        out = run("deliveries", "redrive", "--all", "--dead-for", "1h", "--yes")
        assert out.strip() == "Re-drove 2 dead deliveries."
        assert dead() == pks(rows, "now", "other")
        out = run("deliveries", "discard", "--all", "--subscriber", FIRST, "--yes")
        assert out.strip() == "Discarded 2 dead deliveries."
        assert dead() == set()
        assert run("deliveries", "discard", "--all", "--yes").strip() == "No dead deliveries match."

    def test_bad_arguments(self, rows: dict[str, OutboxDelivery]) -> None:
        for bad in ("nope", "0", "-1", "1.5", str(2**63), "1" * 40, "٣"):
            with pytest.raises(CommandError, match="is not a delivery id"):
                run("deliveries", "redrive", bad)
        with pytest.raises(CommandError, match="ids or --all, not both"):
            run("deliveries", "redrive", str(rows["week"].pk), "--all")
        with pytest.raises(CommandError, match="give delivery ids, or --all"):
            run("deliveries", "discard")
        for args in (["list"], ["redrive", "--all"], ["discard", "--all", "--yes"]):
            for option in ("--event-type", "--subscriber"):
                with pytest.raises(CommandError, match=option[2:]):  # text holds no NUL
                    run("deliveries", *args, option, "x\x00")
        for bad in ("soon", "-1h", "-5", "nan", "1e300", "\x00", "1\x00d"):
            with pytest.raises(CommandError, match="dead-for"):
                run("deliveries", "redrive", "--all", "--dead-for", bad)
        with pytest.raises(CommandError, match="invalid choice: 'abandoned'"):
            run("deliveries", "list", "--state", "abandoned")
        assert dead() == pks(rows, "week", "hours", "now", "other")


@pytest.mark.django_db(transaction=True)
def test_a_discard_from_the_command_line_lets_the_subscriber_go_on(two_subscribers: None) -> None:
    aggregate = uuid.uuid4()
    head, behind = event(1, aggregate=aggregate, ago=30), event(2, aggregate=aggregate, ago=20)
    dead_one = delivery(head, FIRST, "dead")
    delivery(behind, FIRST, "waiting")
    relay().run()
    assert seen_by(FIRST) == []
    run("deliveries", "discard", "--all", "--subscriber", FIRST, "--yes")
    relay().run()
    assert seen_by(FIRST) == [2]
    assert OutboxDelivery.objects.get(pk=dead_one.pk).state == "delivered"


class TestReplay:
    def test_asks_with_the_count_then_writes(
        self, two_subscribers: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        add_late_subscriber()
        for n in range(3):
            event(n, ago=3600 - n)
        event(9, ago=3 * 86400)  # before --since
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        with pytest.raises(
            CommandError,
            match=rf"Replay 3 processed events \(tests.ops, tests.ops.other\) to '{LATE}', "
            r"one waiting delivery each\? Add --yes",
        ):
            run("outbox", "replay", "--subscriber", LATE, "--since", "2d")
        assert not OutboxDelivery.objects.exists()
        monkeypatch.setattr("sys.stdin", Terminal("yes\n"))
        out = run("outbox", "replay", "--subscriber", LATE, "--since", "2d")
        assert out.strip().endswith(
            f"Wrote 3 deliveries for '{LATE}'; the relay delivers them in the events' order."
        )
        assert set(states().values()) == {"waiting"}
        # Twice: nothing left to replay, nothing written twice.
        out = run("outbox", "replay", "--subscriber", LATE, "--since", "2d", "--yes")
        assert out.strip() == f"No events to replay to '{LATE}'."
        assert OutboxDelivery.objects.count() == 3

    def test_since_and_until_as_iso_times_in_utc(self, two_subscribers: None) -> None:
        add_late_subscriber()
        made = [event(n) for n in range(5)]
        for n, e in enumerate(made):  # 2026-03-01, at 00:00, 01:00 ... 04:00 UTC
            OutboxEvent.objects.filter(pk=e.pk).update(
                occurred_at=datetime(2026, 3, 1, n, tzinfo=UTC)
            )
        # Naive times are UTC, as the lists show them; an offset is taken as given.
        out = run(
            "outbox",
            "replay",
            "--subscriber",
            LATE,
            "--since",
            "2026-03-01T01:00",
            "--until",
            "2026-03-01T04:00:00+01:00",
            "--yes",
        )
        assert "Wrote 2 deliveries" in out
        assert set(OutboxDelivery.objects.values_list("event_id", flat=True)) == {
            made[1].pk,
            made[2].pk,
        }
        out = run("outbox", "replay", "--subscriber", LATE, "--since", "2026-03-01", "--yes")
        assert "Wrote 3 deliveries" in out

    def test_an_unknown_subscriber_is_a_clear_error(self, two_subscribers: None) -> None:
        event(1, ago=60)
        with pytest.raises(
            CommandError,
            match=r"outbox replay: --subscriber: no subscriber 'tests.ops.frist' is registered; "
            rf"did you mean '{FIRST}'\?",
        ):
            run("outbox", "replay", "--subscriber", "tests.ops.frist", "--since", "1d", "--yes")
        assert not OutboxDelivery.objects.exists()

    def test_until_before_since_is_refused(self, two_subscribers: None) -> None:
        with pytest.raises(CommandError, match=r"--until: .* must be after since"):
            run("outbox", "replay", "--subscriber", FIRST, "--since", "1d", "--until", "2d")

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--since", "3600"], "'3600' is not a time"),
            (["--since", "yesterday"], "'yesterday' is not a time"),
            (["--since", "2026-13-01"], "is not a time"),
            (["--since=-7d"], "must be from 0 seconds to 100 years"),
            (["--since", "2026-01-01\x00"], "is not a time"),
            (["--since", "0001-01-01T00:00:00+05:00"], "is outside 0001-01-02 to 9999-12-30"),
            (["--since", "1d", "--until", "soon"], "'soon' is not a time"),
            ([], "the following arguments are required: --since"),
        ],
    )
    def test_bad_times_are_usage_errors(
        self, two_subscribers: None, args: list[str], message: str
    ) -> None:
        with pytest.raises(CommandError, match=message):
            run("outbox", "replay", "--subscriber", FIRST, *args)
        assert not OutboxDelivery.objects.exists()
