"""Five-field cron expressions, evaluated in UTC: parse once, then ask for the next slot.

Supported: ``*``, numbers, ranges ``a-b``, steps ``*/n`` and ``a-b/n``, lists ``a,b,c``, month
names ``JAN``-``DEC``, weekday names ``SUN``-``SAT`` (0 and 7 are both Sunday), and the aliases
``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and
``@hourly``. As in Vixie cron, when both day-of-month and day-of-week are restricted, a day
matches if either does.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
MONTHS = {name: n for n, name in enumerate(calendar.month_abbr) if name}
WEEKDAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {k.upper(): v for k, v in MONTHS.items()}),
    ("day of week", 0, 7, WEEKDAYS),
)

#: The search for a next slot gives up after this many years (an expression like "0 0 31 2 *"
#: never matches).
SEARCH_YEARS = 8


class CronError(ValueError):
    """A cron expression that cannot be parsed; the message names the field."""


@dataclass(frozen=True)
class Cron:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, expression: str) -> Cron:
        if not isinstance(expression, str):
            raise CronError(f"a cron expression must be a string, not {expression!r}")
        text = ALIASES.get(expression.strip().lower(), expression.strip())
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                f"{expression!r} has {len(parts)} fields; a cron expression has 5: "
                "minute hour day-of-month month day-of-week"
            )
        values = [
            _parse_field(part, name, low, high, names)
            for part, (name, low, high, names) in zip(parts, FIELDS, strict=True)
        ]
        weekdays = frozenset(0 if day == 7 else day for day in values[4])
        return cls(
            expression=expression,
            minutes=values[0],
            hours=values[1],
            days=values[2],
            months=values[3],
            weekdays=weekdays,
            days_restricted=parts[2] != "*",
            weekdays_restricted=parts[4] != "*",
        )

    def matches_day(self, day: datetime) -> bool:
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (an aware datetime), in UTC."""
        current = moment.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = current.year + SEARCH_YEARS
        while current.year <= limit:
            if current.month not in self.months:
                year, month = divmod(current.month, 12)  # month is 1-based: this is "next"
                current = current.replace(
                    year=current.year + year, month=month + 1, day=1, hour=0, minute=0
                )
                continue
            if not self.matches_day(current):
                current = (current + timedelta(days=1)).replace(hour=0, minute=0)
                continue
            if current.hour not in self.hours:
                current = (current + timedelta(hours=1)).replace(minute=0)
                continue
            if current.minute not in self.minutes:
                current += timedelta(minutes=1)
                continue
            return current
        raise CronError(f"{self.expression!r} matches no time in the next {SEARCH_YEARS} years")

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last slot at or before ``moment``: the one that is due now."""
        # Look back 1, 2, 4, ... minutes until a window holds a slot, then walk forward to the
        # latest: the walk covers at most about twice the gap between two slots.
        probe = moment.astimezone(UTC)
        back = timedelta(minutes=1)
        while back <= timedelta(days=366 * SEARCH_YEARS):
            slot = self.next_after(probe - back)
            if slot <= probe:
                while (following := self.next_after(slot)) <= probe:
                    slot = following
                return slot
            back *= 2
        raise CronError(f"{self.expression!r} matched no time in the last {SEARCH_YEARS} years")


def _parse_field(
    text: str, name: str, low: int, high: int, names: dict[str, int]
) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{name} field {text!r} has an empty list item")
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{name} field {text!r}: step {step_text!r} is not a number >= 1")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _value(first, name, low, high, names), _value(last, name, low, high, names)
            if start > end:
                raise CronError(f"{name} field {text!r}: range {base!r} runs backwards")
        else:
            start = _value(base, name, low, high, names)
            end = high if step_text else start
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, name: str, low: int, high: int, names: dict[str, int]) -> int:
    if text.upper() in names:
        return names[text.upper()]
    if not text.isdigit():
        raise CronError(f"{name} field: {text!r} is not a number or a name")
    number = int(text)
    if not low <= number <= high:
        raise CronError(f"{name} field: {number} is outside {low}-{high}")
    return number
