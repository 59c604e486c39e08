"""``pgoutbox queues``: every queue paused or not, with the values in effect; pause, resume
and resize one at run time (``queue_controls``).

pgoutbox queues [list]
pgoutbox queues pause NAME
pgoutbox queues resume NAME
pgoutbox queues resize NAME [--concurrency N|default] [--max-running N|none|default]
                            [--rate-limit PER_SECOND|none|default]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from django_pgoutbox import queue_controls
from django_pgoutbox.management import arguments, table
from django_pgoutbox.queue_controls import DEFAULT, KEEP, QueueControlError, QueueStatus

COLUMNS = [
    table.Column("queue"),
    table.Column("state"),
    table.Column("concurrency", ">"),
    table.Column("max running", ">"),
    table.Column("rate limit", ">"),
    table.Column("changed by", max_width=40),
]

Write = Callable[[str], None]


def _value(kind: type[int] | type[float], *, none: bool) -> Callable[[str], Any]:
    """A resize value: a number, ``default`` (back to the setting), or ``none`` (no limit)."""

    def parse(value: str) -> Any:
        word = value.strip().lower()
        if word == "default":
            return DEFAULT
        if word == "none" and none:
            return None
        try:
            return kind(value)
        except ValueError:
            also = ", 'none'" if none else ""
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a {'whole number' if kind is int else 'number'}"
                f"{also} or 'default'"
            ) from None

    return parse


def add_parsers(sub: Any) -> None:
    """The ``queues`` subcommand, on the command's subparsers ``sub``."""
    queues = sub.add_parser(
        "queues",
        help="List queues, paused or not, with the values in effect; pause, resume, resize.",
    )
    actions = queues.add_subparsers(dest="queues_action", metavar="ACTION")
    actions.add_parser("list", help="Every queue, paused or not, with the values in effect.")
    for name, text in (
        ("pause", "Stop every worker claiming the queue's jobs (running ones finish)."),
        ("resume", "Let every worker claim the queue's jobs again."),
    ):
        command = actions.add_parser(name, help=text)
        command.add_argument("name", type=arguments.text, metavar="NAME")
    resize = actions.add_parser(
        "resize", help="Set the queue's values in place of its settings, or back to them."
    )
    resize.add_argument("name", type=arguments.text, metavar="NAME")
    resize.add_argument(
        "--concurrency",
        default=KEEP,
        type=_value(int, none=False),
        help="Handler threads per worker process, or 'default'.",
    )
    resize.add_argument(
        "--max-running",
        default=KEEP,
        type=_value(int, none=True),
        help="Jobs running at once across every worker; 'none' for no cap, or 'default'.",
    )
    resize.add_argument(
        "--rate-limit",
        default=KEEP,
        type=_value(float, none=True),
        help="Jobs started per second across every worker; 'none' for no limit, or 'default'.",
    )


def _limit(value: float | None, overridden: bool, unit: str = "") -> str:
    """A limit, ``-`` for none; ``(set)`` when set at run time (``none (set)``: lifted)."""
    if overridden:
        return f"{'none' if value is None else f'{value:g}{unit}'} (set)"
    return "-" if value is None else f"{value:g}{unit}"


def _row(status: QueueStatus) -> list[object]:
    set_ = status.overridden
    by = status.paused_by if status.paused else status.updated_by
    return [
        status.queue,
        "paused" if status.paused else "running",
        f"{status.concurrency} (set)" if "CONCURRENCY" in set_ else status.concurrency,
        _limit(status.max_running, "MAX_RUNNING" in set_),
        _limit(status.rate_limit, "RATE_LIMIT" in set_, "/s"),
        by or "",
    ]


def handle_queues(using: str, options: dict[str, Any], write: Write) -> None:
    action = options.get("queues_action") or "list"
    by = f"pgoutbox queues {action}"
    try:
        if action == "list":
            statuses = list(queue_controls.queue_statuses(using).values())
        elif action == "pause":
            statuses = [queue_controls.pause_queue(options["name"], using=using, by=by)]
        elif action == "resume":
            statuses = [queue_controls.resume_queue(options["name"], using=using, by=by)]
        else:
            keys = ("concurrency", "max_running", "rate_limit")
            given = {key: options[key] for key in keys if options.get(key, KEEP) is not KEEP}
            statuses = [queue_controls.resize_queue(options["name"], using=using, by=by, **given)]
    except QueueControlError as error:
        raise CommandError(str(error)) from None
    for line in table.render(COLUMNS, [_row(status) for status in statuses]):
        write(line)
    for status in statuses:
        for problem in status.problems:
            write(f"warning: {problem}")
