"""Five-field cron expressions in a time zone: parse once, then ask for slots as UTC instants.

cronsim evaluates the expressions (docs/scheduling.md, "Time zones and DST", says why that
library and what it does on the days the clocks change). This module keeps what the docs promise
on top of it: five fields only (a slot is a minute), the ``@yearly`` ... ``@hourly`` aliases,
errors that name the field and its text, and slots handed out as aware UTC datetimes, which is how
the scheduler compares and stores them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: Each field's name, as our errors and cronsim's (``Bad day-of-month``) spell it, and its values.
FIELDS = (
    ("minute", "minute", "0-59"),
    ("hour", "hour", "0-23"),
    ("day of month", "day-of-month", "1-31 (a day that its months have) or L"),
    ("month", "month", "1-12 or JAN-DEC"),
    ("day of week", "day-of-week", "0-7 (0 and 7 are Sunday) or SUN-SAT"),
)
#: How far back the due slot is looked for: cronsim's own horizon for a next slot.
SEARCH_SPAN = timedelta(days=366 * 50)
FORMS = "values, ranges a-b, steps */n or a-b/n, and lists a,b,c"


class CronError(ValueError):
    """A cron expression or time zone that cannot be used; the message names the field."""


def parse_zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name`` (``"Europe/Berlin"``, or a ``ZoneInfo`` of the database,
    or ``datetime.UTC``); CronError if there is none."""
    if isinstance(name, ZoneInfo) and name.key:
        name = name.key  # made from the database, so a name it has
    elif name is UTC:
        name = "UTC"
    if not isinstance(name, str) or not name:
        raise CronError(f"must be an IANA time zone name such as 'Europe/Berlin', not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        # ValueError: a name that is not a key at all ("../etc/passwd", a NUL).
        raise CronError(
            f"{name!r} is not a time zone of the IANA database (such as 'Europe/Berlin'); on a "
            "system without /usr/share/zoneinfo, install the tzdata package"
        ) from None


@dataclass(frozen=True)
class Cron:
    """An expression as written, the five fields it stands for, and the zone it is read in."""

    expression: str
    fields: str
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))

    @classmethod
    def parse(cls, expression: str, zone: ZoneInfo | None = None) -> Cron:
        if not isinstance(expression, str):
            raise CronError(f"a cron expression must be a string, not {expression!r}")
        text = ALIASES.get(expression.strip().lower(), expression.strip())
        parts = text.split()
        if len(parts) != 5:
            raise CronError(
                f"{expression!r} has {len(parts)} fields; a cron expression has 5: "
                "minute hour day-of-month month day-of-week"
            )
        try:
            CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as error:
            raise CronError(_explain(expression, parts, str(error))) from None
        return cls(expression=expression, fields=" ".join(parts), zone=zone or ZoneInfo("UTC"))

    @property
    def _tz(self) -> tzinfo:
        # cronsim skips its DST handling for datetime.UTC: the same answers, found faster.
        return UTC if self.zone.key == "UTC" else self.zone

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (an aware datetime), in UTC."""
        # From a moment in the second pass of a repeated hour (the clocks went back), cronsim
        # may answer a slot of the first pass, before the moment: walk on past it.
        return next(slot for slot in self._slots_from(moment) if slot > moment)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last slot at or before ``moment``: the one that is due now."""
        # Walk forward from 1, 2, 4, ... minutes back until a window holds a slot, and keep
        # the last one: it covers at most about twice the gap between two slots. cronsim's own
        # reverse walk is not used: it loses the second pass of a repeated hour.
        back = timedelta(minutes=1)
        while back <= SEARCH_SPAN:
            latest = None
            for slot in self._slots_from(moment - back):
                if slot > moment:
                    break
                latest = slot
            if latest is not None:
                return latest
            back *= 2
        raise CronError(f"{self.expression!r} matched no time in the last 50 years")

    def _slots_from(self, moment: datetime) -> Iterator[datetime]:
        """The slots after ``moment`` in order, as UTC datetimes; CronError past 50 years."""
        # cronsim ends its iteration when 50 years hold no match.
        for slot in CronSim(self.fields, moment.astimezone(self._tz)):
            yield slot.astimezone(UTC)
        raise CronError(f"{self.expression!r} matches no time in the next 50 years")


def _explain(expression: str, parts: list[str], error: str) -> str:
    """Our message for cronsim's ``Bad minute``: the field, its text and what it takes."""
    for (name, cronsim_name, values), part in zip(FIELDS, parts, strict=True):
        if error == f"Bad {cronsim_name}":
            return f"{name} field {part!r} is not valid: it takes {values}, as {FORMS}"
    return f"{expression!r} is not a valid cron expression ({error})"
