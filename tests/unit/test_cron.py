"""Cron expressions, without a database."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_pgoutbox.cron import Cron, CronError


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
        ("60 * * * *", "minute field: 60 is outside 0-59"),
        ("* 24 * * *", "hour field: 24 is outside 0-23"),
        ("* * 0 * *", "day of month field: 0 is outside 1-31"),
        ("* * * 13 *", "month field: 13 is outside 1-12"),
        ("* * * * 8", "day of week field: 8 is outside 0-7"),
        ("*/0 * * * *", "step '0' is not a number >= 1"),
        ("10-5 * * * *", "runs backwards"),
        ("a * * * *", "'a' is not a number or a name"),
        ("1,,2 * * * *", "empty list item"),
        ("@fortnightly", "has 1 fields"),
    ],
)
def test_bad_expressions_name_the_field(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace("*", r"\*")):
        Cron.parse(expression)


def test_impossible_date_fails_clearly() -> None:
    with pytest.raises(CronError, match="matches no time"):
        Cron.parse("0 0 31 2 *").next_after(at("2026-01-01 00:00"))
