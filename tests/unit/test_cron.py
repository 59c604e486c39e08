"""Cron expressions, without a database."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from django_pgoutbox.cron import Cron, CronError, parse_zone


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("* * * * *", "2026-03-01 10:00:30", "2026-03-01 10:01"),
        ("*/15 * * * *", "2026-03-01 10:01", "2026-03-01 10:15"),
        ("0 3 * * *", "2026-03-01 03:00", "2026-03-02 03:00"),
        ("30 9 * * MON-FRI", "2026-03-06 10:00", "2026-03-09 09:30"),  # Friday -> Monday
        ("0 0 1 * *", "2026-01-15 00:00", "2026-02-01 00:00"),
        ("0 0 29 2 *", "2026-03-01 00:00", "2028-02-29 00:00"),  # the next leap day
        ("0 12 * JAN,jul *", "2026-02-01 00:00", "2026-07-01 12:00"),
        ("0 0 * * 7", "2026-03-01 12:00", "2026-03-08 00:00"),  # 7 is Sunday too
        ("0 0 13 * FRI", "2026-03-01 00:00", "2026-03-06 00:00"),  # day OR weekday
        # A field that starts with * counts as unrestricted, as in Vixie cron: day AND weekday.
        ("0 0 */2 * MON", "2026-03-01 00:00", "2026-03-09 00:00"),
        ("5-10/2 * * * *", "2026-03-01 10:06", "2026-03-01 10:07"),
        ("@hourly", "2026-03-01 10:59:59", "2026-03-01 11:00"),
        ("@daily", "2026-12-31 23:00", "2027-01-01 00:00"),
        ("@weekly", "2026-03-02 00:00", "2026-03-08 00:00"),
    ],
)
def test_next_slot(expression: str, after: str, expected: str) -> None:
    assert Cron.parse(expression).next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    ("expression", "moment", "expected"),
    [
        ("* * * * *", "2026-03-01 10:00:30", "2026-03-01 10:00"),
        ("0 3 * * *", "2026-03-01 02:59", "2026-02-28 03:00"),
        ("0 3 * * *", "2026-03-01 03:00", "2026-03-01 03:00"),
        ("@yearly", "2026-06-01 00:00", "2026-01-01 00:00"),
    ],
)
def test_latest_due_slot(expression: str, moment: str, expected: str) -> None:
    assert Cron.parse(expression).latest_at_or_before(at(moment)) == at(expected)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "has 4 fields"),
        ("0 * * * * *", "has 6 fields"),
        ("60 * * * *", "minute field '60' is not valid: it takes 0-59"),
        ("* 24 * * *", "hour field '24' is not valid: it takes 0-23"),
        ("* * 0 * *", "day of month field '0' is not valid"),
        ("0 0 31 2 *", "day of month field '31' is not valid: it takes 1-31 (a day that its"),
        ("* * * 13 *", "month field '13' is not valid: it takes 1-12 or JAN-DEC"),
        ("* * * * 8", "day of week field '8' is not valid"),
        ("*/0 * * * *", "minute field '*/0' is not valid"),
        ("10-5 * * * *", "minute field '10-5' is not valid"),
        ("a * * * *", "minute field 'a' is not valid"),
        ("1,,2 * * * *", "minute field '1,,2' is not valid"),
        ("@fortnightly", "has 1 fields"),
    ],
)
def test_bad_expressions_name_the_field(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=re.escape(message)):
        Cron.parse(expression)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Europe/Berln", "'Europe/Berln' is not a time zone of the IANA database"),
        ("../../etc/passwd", "is not a time zone of the IANA database"),
        ("", "must be an IANA time zone name"),
        (1, "must be an IANA time zone name such as 'Europe/Berlin', not 1"),
    ],
)
def test_bad_zones_are_refused(name: object, message: str) -> None:
    with pytest.raises(CronError, match=re.escape(message)):
        parse_zone(name)


def test_a_zone_object_is_taken_by_its_name() -> None:
    """What a Django project has at hand: a ``ZoneInfo``, or ``datetime.UTC``."""
    assert parse_zone(ZoneInfo("Europe/Berlin")) == ZoneInfo("Europe/Berlin")
    assert parse_zone(UTC).key == "UTC"
    with pytest.raises(CronError, match="must be an IANA time zone name"):
        parse_zone(timezone(timedelta(hours=2)))  # an offset is no zone


# -- time zones and the days the clocks change ----------------------------------------------------
# Europe/Berlin, 2026: at 02:00 CET on 29 March the clocks go to 03:00 CEST (02:xx does not
# exist); at 03:00 CEST on 25 October they go back to 02:00 CET (02:xx happens twice).

BERLIN = ZoneInfo("Europe/Berlin")
SPRING_FORWARD, FALL_BACK = "2026-03-29", "2026-10-25"


def berlin(expression: str) -> Cron:
    return Cron.parse(expression, BERLIN)


def slots_on(cron: Cron, day: str) -> list[datetime]:
    """The slots whose local date in the cron's zone is ``day``, as UTC instants."""
    # A second before local midnight, so that a slot at 00:00 counts.
    moment = datetime.fromisoformat(day).replace(tzinfo=cron.zone) - timedelta(seconds=1)
    slots = []
    while (moment := cron.next_after(moment)).astimezone(cron.zone).date().isoformat() == day:
        slots.append(moment)
    return slots


def test_slots_are_utc_instants() -> None:
    slot = berlin("0 8 * * *").next_after(at("2026-01-15 00:00"))
    assert slot.tzinfo is UTC
    assert slot == at("2026-01-15 07:00")


@pytest.mark.parametrize(
    ("day", "utc"),
    [("2026-01-15", "07:00"), ("2026-07-15", "06:00"), ("2026-03-30", "06:00")],
)
def test_eight_in_berlin_is_seven_utc_in_winter_and_six_in_summer(day: str, utc: str) -> None:
    assert slots_on(berlin("0 8 * * *"), day) == [at(f"{day} {utc}")]


def test_a_daily_0230_runs_once_at_0300_when_0230_does_not_exist() -> None:
    # 02:30 CET would be 01:30 UTC; the first local time after the gap is 03:00 CEST, 01:00 UTC.
    assert slots_on(berlin("30 2 * * *"), SPRING_FORWARD) == [at("2026-03-29 01:00")]
    assert slots_on(berlin("30 2 * * *"), "2026-03-28") == [at("2026-03-28 01:30")]
    assert slots_on(berlin("30 2 * * *"), "2026-03-30") == [at("2026-03-30 00:30")]


def test_a_daily_0230_runs_once_when_0230_happens_twice() -> None:
    # The first 02:30 (CEST, 00:30 UTC) runs; the second (CET, 01:30 UTC) does not.
    assert slots_on(berlin("30 2 * * *"), FALL_BACK) == [at("2026-10-25 00:30")]
    assert slots_on(berlin("30 2 * * *"), "2026-10-26") == [at("2026-10-26 01:30")]


@pytest.mark.parametrize(("day", "hours"), [(SPRING_FORWARD, 23), (FALL_BACK, 25)])
def test_an_hourly_schedule_runs_every_real_hour(day: str, hours: int) -> None:
    slots = slots_on(berlin("0 * * * *"), day)
    assert len(slots) == hours
    # One slot an hour, as the clock on the wall goes: no hour run twice, none skipped.
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(slots))


@pytest.mark.parametrize(
    ("expression", "day", "count"),
    [
        ("*/15 * * * *", SPRING_FORWARD, 23 * 4),
        ("*/15 * * * *", FALL_BACK, 25 * 4),
        ("0 */2 * * *", FALL_BACK, 13),  # 00, 02 CEST, 02 CET, 04 ... 22: the hour field is *
        ("15 1-3 * * *", FALL_BACK, 3),  # fixed hours: 02:15 once, as the daily 02:30
        ("15 1-3 * * *", SPRING_FORWARD, 3),  # 01:15 CET, 03:00 (for 02:15) and 03:15 CEST
        ("15,45 2 * * *", SPRING_FORWARD, 1),  # 02:15 and 02:45 both become 03:00: once
    ],
)
def test_other_expressions_on_the_dst_days(expression: str, day: str, count: int) -> None:
    assert len(slots_on(berlin(expression), day)) == count


@pytest.mark.parametrize("expression", ["30 2 * * *", "0 * * * *", "*/15 * * * *", "15 1-3 * * *"])
@pytest.mark.parametrize("day", [SPRING_FORWARD, FALL_BACK])
def test_the_due_slot_agrees_with_the_next_slot_minute_by_minute(expression: str, day: str) -> None:
    """What the scheduler relies on: the due slot is at or before now, and the next is after."""
    cron = berlin(expression)
    start = datetime.fromisoformat(day).replace(tzinfo=BERLIN).astimezone(UTC)
    for minute in range(0, 26 * 60, 7):
        for moment in (
            start + timedelta(minutes=minute),
            start + timedelta(minutes=minute, seconds=30),
        ):
            due = cron.latest_at_or_before(moment)
            assert due <= moment < cron.next_after(due), (expression, moment)
            assert cron.next_after(moment) > moment
            assert cron.latest_at_or_before(due) == due


def test_utc_is_the_default_zone() -> None:
    assert Cron.parse("0 8 * * *").zone.key == "UTC"
    assert Cron.parse("0 8 * * *").next_after(at("2026-07-15 00:00")) == at("2026-07-15 08:00")
