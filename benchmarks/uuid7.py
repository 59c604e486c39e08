"""Version 7 UUIDs: ours (``django_pgoutbox.ids``) against the kept implementations.

    python benchmarks/uuid7.py [--count 100000] [--rounds 5]

Each way makes ``--count`` ids as ``uuid.UUID`` objects (what Django's ``UUIDField`` and psycopg
take), one call per id, or in one call where the implementation has a bulk form; the ways run
alternated, ``--rounds`` times, and the best and median of each are printed. Ways whose package
is not installed are skipped, and so said: Python 3.14's ``uuid.uuid7``, ``uuid-utils``
(``uuid_utils.compat.uuid7`` returns ``uuid.UUID``; ``uuid_utils.uuid7`` its own type, converted
here) and ``uuid6``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from django_pgoutbox.ids import uuid7, uuid7_many


def ways(count: int) -> tuple[dict[str, Callable[[], list[Any]]], list[str]]:
    found: dict[str, Callable[[], list[Any]]] = {
        "django_pgoutbox.ids.uuid7()": lambda: [uuid7() for _ in range(count)],
        "django_pgoutbox.ids.uuid7_many()": lambda: uuid7_many(count),
    }
    missing: list[str] = []
    stdlib = getattr(uuid, "uuid7", None)
    if stdlib is not None:
        found["uuid.uuid7() (Python 3.14+)"] = lambda: [stdlib() for _ in range(count)]
    else:
        missing.append(f"uuid.uuid7 (Python {sys.version.split()[0]} has none)")
    try:
        compat = importlib.import_module("uuid_utils.compat")
        native = importlib.import_module("uuid_utils")
    except ImportError:
        missing.append("uuid-utils (pip install uuid-utils)")
    else:
        found["uuid_utils.compat.uuid7()"] = lambda: [compat.uuid7() for _ in range(count)]
        found["uuid_utils.uuid7(), as uuid.UUID"] = lambda: [
            uuid.UUID(bytes=native.uuid7().bytes) for _ in range(count)
        ]
    try:
        six = importlib.import_module("uuid6")
    except ImportError:
        missing.append("uuid6 (pip install uuid6)")
    else:
        found["uuid6.uuid7()"] = lambda: [six.uuid7() for _ in range(count)]
    return found, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    found, missing = ways(args.count)
    times: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(args.rounds):
        for name, way in found.items():
            started = time.perf_counter()
            made = way()
            times[name].append(time.perf_counter() - started)
            assert len(made) == args.count, name
            assert isinstance(made[0], uuid.UUID), name
            assert made[0].version == 7, name
    print(f"{args.count:,} ids, best and median of {args.rounds} alternated rounds:")
    for name, seconds in times.items():
        best = min(seconds)
        print(
            f"  {name:36s} best {best * 1000:7.1f} ms, median "
            f"{statistics.median(seconds) * 1000:7.1f} ms ({best / args.count * 1e9:,.0f} ns/id)"
        )
    for name in missing:
        print(f"  skipped: {name}")


if __name__ == "__main__":
    main()
