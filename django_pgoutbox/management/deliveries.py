"""``pgoutbox deliveries list|redrive|discard`` and ``pgoutbox outbox replay``: a subscriber's
deliveries of events, as ``pgoutbox events`` has the events.

pgoutbox deliveries list [--subscriber S] [--state waiting|failing|dead|delivered]
                         [--event-type T] [--limit N]
pgoutbox deliveries redrive ID... | --all [--subscriber S] [--event-type T] [--dead-for AGE] [--yes]
pgoutbox deliveries discard ID... | --all [--subscriber S] [--event-type T] [--dead-for AGE] [--yes]
pgoutbox outbox replay --subscriber S --since WHEN [--until WHEN] [--yes]
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError
from django.db.models import F
from django.utils import timezone

from django_pgoutbox import control
from django_pgoutbox.delivery_states import DELIVERY_STATES
from django_pgoutbox.errors import InvalidInput
from django_pgoutbox.management import arguments, table
from django_pgoutbox.models import OutboxDelivery

#: ``deliveries list``: the error is cut (the admin shows it whole).
DELIVERY_COLUMNS = [
    table.Column("id", ">"),
    table.Column("event id"),
    table.Column("event type"),
    table.Column("subscriber"),
    table.Column("state"),
    table.Column("attempts", ">"),
    table.Column("due (UTC)"),
    table.Column("dead since (UTC)"),
    table.Column("error", max_width=60),
]

#: Asks a question (``Command._confirm``): returns if answered yes, raises ``CommandError`` else.
Confirm = Callable[[str, bool], None]
#: Writes one line of output.
Write = Callable[[str], None]


def plural(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"


def add_parsers(sub: Any) -> None:
    """The ``deliveries`` and ``outbox`` subcommands, on the command's subparsers ``sub``."""
    deliveries = sub.add_parser(
        "deliveries",
        help="List a subscriber's deliveries of events by state; re-drive or discard dead ones.",
    )
    actions = deliveries.add_subparsers(dest="deliveries_action", required=True, metavar="ACTION")
    listed = actions.add_parser("list", help="Deliveries of one state, oldest event first.")
    listed.add_argument("--subscriber", type=arguments.text, metavar="NAME")
    listed.add_argument("--state", choices=tuple(DELIVERY_STATES), default="dead")
    listed.add_argument("--event-type", type=arguments.text)
    listed.add_argument(
        "--limit", type=arguments.limit, default=50, help=f"At most {arguments.MAX_LIST_LIMIT:,}."
    )
    for name, text in (
        ("redrive", "Make dead deliveries due again, with a fresh attempt budget."),
        ("discard", "Mark dead deliveries delivered without running their subscriber."),
    ):
        command = actions.add_parser(name, help=text)
        command.add_argument("ids", nargs="*", metavar="ID")
        command.add_argument(
            "--all", action="store_true", help="Every dead delivery matching the filters."
        )
        command.add_argument("--subscriber", type=arguments.text, metavar="NAME")
        command.add_argument("--event-type", type=arguments.text)
        command.add_argument(
            "--dead-for",
            type=arguments.age,
            metavar="AGE",
            help="Only deliveries dead for at least AGE (seconds, or 90m, 12h, 7d): those whose "
            "cause was mended since.",
        )
        command.add_argument(
            "--yes", action="store_true", help="Do not ask before acting on --all."
        )
    outbox = sub.add_parser("outbox", help="Replay processed events to a subscriber.")
    outbox_actions = outbox.add_subparsers(dest="outbox_action", required=True, metavar="ACTION")
    replay = outbox_actions.add_parser(
        "replay",
        help="Give a subscriber added later the processed events of its types since WHEN: one "
        "waiting delivery each, in the events' order, which the relay delivers.",
    )
    replay.add_argument("--subscriber", required=True, metavar="NAME", type=arguments.text)
    when = (
        "an ISO 8601 date or time (2026-12-01, 2026-12-01T08:30:00Z; UTC unless it gives its "
        "offset), or an age with its unit (90m, 12h, 7d: that long ago)"
    )
    replay.add_argument(
        "--since",
        required=True,
        type=arguments.moment,
        metavar="WHEN",
        help=f"Events that occurred at or after WHEN: {when}.",
    )
    replay.add_argument(
        "--until",
        type=arguments.moment,
        metavar="WHEN",
        help="And before WHEN (default: no bound).",
    )
    replay.add_argument("--yes", action="store_true", help="Do not ask before writing.")


def handle_deliveries(using: str, options: dict[str, Any], write: Write, confirm: Confirm) -> None:
    action = options["deliveries_action"]
    deliveries = OutboxDelivery.objects.using(using)
    if options.get("subscriber"):
        deliveries = deliveries.filter(subscriber=options["subscriber"])
    if options.get("event_type"):
        deliveries = deliveries.filter(event__event_type=options["event_type"])
    if action == "list":
        state = options["state"]
        found = (
            deliveries.filter(DELIVERY_STATES[state]())
            .annotate(event_type=F("event__event_type"))
            .order_by("occurred_at", "event_id", "subscriber")[: options["limit"]]
        )
        rows = [
            (
                delivery.id,
                delivery.event_id,
                delivery.event_type,
                delivery.subscriber,
                delivery.state,
                delivery.attempts,
                arguments.utc(delivery.available_at),
                arguments.utc(delivery.dead_at) if delivery.dead_at else "",
                delivery.last_error or "",
            )
            for delivery in found
        ]
        if not rows:
            write(f"No {state} deliveries.")
            return
        for line in table.render(DELIVERY_COLUMNS, rows):
            write(line)
        return
    dead = deliveries.filter(DELIVERY_STATES["dead"]())
    if options["dead_for"] is not None:
        dead = dead.filter(dead_at__lte=timezone.now() - timedelta(seconds=options["dead_for"]))
    if options["ids"]:
        if options["all"]:
            raise CommandError(f"deliveries {action}: give delivery ids or --all, not both")
        ids = [arguments.row_number(value, "a delivery id") for value in options["ids"]]
    elif options["all"]:
        found_ids = list(dead.order_by("id").values_list("id", "subscriber"))
        if not found_ids:
            write("No dead deliveries match.")
            return
        ids = [pk for pk, _ in found_ids]
        subscribers = {name for _, name in found_ids}
        verb = "Re-drive" if action == "redrive" else "Discard"
        whose = (
            f"of subscriber {next(iter(subscribers))!r}"
            if options.get("subscriber")
            else f"of {plural(len(subscribers), 'subscriber', 'subscribers')}"
        )
        confirm(
            f"{verb} {plural(len(ids), 'dead delivery', 'dead deliveries')} {whose}?",
            options["yes"],
        )
    else:
        raise CommandError(f"deliveries {action}: give delivery ids, or --all with filters")
    perform = (
        control.redrive_dead_deliveries if action == "redrive" else control.discard_dead_deliveries
    )
    done = perform(ids, using=using)
    verb = "Re-drove" if action == "redrive" else "Discarded"
    write(f"{verb} {plural(done, 'dead delivery', 'dead deliveries')}.")


def handle_outbox(using: str, options: dict[str, Any], write: Write, confirm: Confirm) -> None:
    # "replay", the only action
    name, since, until = options["subscriber"], options["since"], options["until"]
    try:
        count = control.events_to_replay(name, since=since, until=until, using=using).count()
    except InvalidInput as problem:
        raise CommandError(f"outbox replay: --{problem.field}: {problem.message}") from None
    if count == 0:
        write(f"No events to replay to {name!r}.")
        return
    event_types = control.subscriber_event_types(name)
    shown = ", ".join(event_types[:5]) + (
        f" and {len(event_types) - 5:,} more" if len(event_types) > 5 else ""
    )
    confirm(
        f"Replay {plural(count, 'processed event', 'processed events')} ({shown}) to {name!r}, "
        "one waiting delivery each?",
        options["yes"],
    )
    written = control.replay_events(name, since=since, until=until, using=using)
    write(
        f"Wrote {plural(written, 'delivery', 'deliveries')} for {name!r}; the relay delivers "
        "them in the events' order."
    )
