"""croniter against cronsim: their answers on the DST days, and the cost of a next slot.

    python -m venv /tmp/cronbench
    /tmp/cronbench/bin/pip install croniter cronsim
    /tmp/cronbench/bin/python benchmarks/cron_libraries.py [--calls 100000]

It needs neither Django nor a database: only the two libraries, which this package does not
both depend on (docs/scheduling.md says which one it uses and why). For each expression, in UTC
and in Europe/Berlin, it times ``--calls`` successive next-slot calls from one iterator, the way
a scheduler walks slots, and prints calls per second; then each library's slots on 2026-03-29
(spring forward) and 2026-10-25 (fall back) for a daily 02:30 and an hourly schedule.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from zoneinfo import ZoneInfo

from croniter import croniter
from cronsim import CronSim

EXPRESSIONS = ("* * * * *", "*/15 * * * *", "30 2 * * *", "0 9 * * MON-FRI", "0 0 13 * FRI")
BERLIN = ZoneInfo("Europe/Berlin")


def with_croniter(expression: str, start: datetime) -> Iterator[datetime]:
    walk = croniter(expression, start)
    while True:
        yield walk.get_next(datetime)


def with_cronsim(expression: str, start: datetime) -> Iterator[datetime]:
    return iter(CronSim(expression, start))


LIBRARIES: dict[str, Callable[[str, datetime], Iterator[datetime]]] = {
    f"croniter {version('croniter')}": with_croniter,
    f"cronsim {version('cronsim')}": with_cronsim,
}


def calls_per_second(
    slots: Callable[[str, datetime], Iterator[datetime]],
    expression: str,
    zone: ZoneInfo | None,
    calls: int,
) -> float:
    walk = slots(expression, datetime(2026, 1, 1, tzinfo=zone or UTC))
    started = time.perf_counter()
    for _ in range(calls):
        next(walk)
    return calls / (time.perf_counter() - started)


def slots_on(
    slots: Callable[[str, datetime], Iterator[datetime]], expression: str, day: str
) -> list[str]:
    # A second before midnight, so that a slot at 00:00 counts.
    start = datetime.fromisoformat(f"{day} 00:00").replace(tzinfo=BERLIN) - timedelta(seconds=1)
    found = []
    for slot in slots(expression, start):
        local = slot.astimezone(BERLIN)
        if local.date().isoformat() != day:
            break
        found.append(f"{local:%H:%M%z}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    calls = parser.parse_args().calls
    print(f"next-slot calls per second ({calls:,} successive calls each)")
    print(f"{'expression':<18} {'zone':<14} " + " ".join(f"{name:>16}" for name in LIBRARIES))
    for expression in EXPRESSIONS:
        for zone in (None, BERLIN):
            rates = [
                calls_per_second(slots, expression, zone, calls) for slots in LIBRARIES.values()
            ]
            print(
                f"{expression:<18} {zone or 'UTC'!s:<14} "
                + " ".join(f"{rate:>16,.0f}" for rate in rates)
            )
    for expression in ("30 2 * * *", "0 * * * *"):
        for day in ("2026-03-29", "2026-10-25"):
            for name, slots in LIBRARIES.items():
                found = slots_on(slots, expression, day)
                print(
                    f"{expression!r} Europe/Berlin {day} {name}: {len(found)} slot(s): "
                    + ", ".join(found)
                )


if __name__ == "__main__":
    main()
