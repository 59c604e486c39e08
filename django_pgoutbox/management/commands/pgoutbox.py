"""``manage.py pgoutbox``: operations without the admin.

pgoutbox stats [--json] [--watch S]  counts by queue and state, backlog age, outbox lag, horizon
pgoutbox health [--require R,R]      workers, relay, scheduler alive? (exit 1 if not, 2 if misused)
                                     and who holds the xmin horizon (a warning, never unhealthy)
pgoutbox deadletters list [--queue Q] [--job-type T] [--code C] [--cause F] [--limit N]
pgoutbox deadletters show ID
pgoutbox deadletters causes [--limit N]               dead letters grouped by cause, biggest first
pgoutbox deadletters retry ID... | --all [filters]    back to pending, fresh budget
pgoutbox deadletters discard ID... | --all [filters]  cancelled: never run again
pgoutbox deadletters skip ID... --reason TEXT         cancelled (skipped): its sequence goes on
pgoutbox deadletters retry|discard --cause F [--yes]  every dead letter of one cause
pgoutbox events list [--state dead|failing|held_back|abandoned|delivering] [--event-type T]
pgoutbox events redrive ID... | --all [--event-type T] [--dead-for AGE] [--yes]
pgoutbox events discard ID... | --all [--event-type T] [--dead-for AGE] [--yes]
pgoutbox deliveries list|redrive|discard   a subscriber's deliveries, as events (deliveries.py)
pgoutbox outbox replay --subscriber S --since WHEN [--until WHEN] [--yes]
pgoutbox queues [list]               every queue, paused or not, with the values in effect
pgoutbox queues pause|resume NAME    stop every worker claiming a queue's jobs, or let them again
pgoutbox queues resize NAME [--concurrency N] [--max-running N] [--rate-limit R]  (queues.py)
pgoutbox schedules                   every schedule with its last and next slot
pgoutbox run-schedule NAME           enqueue a schedule's job now
pgoutbox recover-leases              return expired leases to their queue (or dead letters)
pgoutbox prune                       delete finished rows past their retention
pgoutbox reconcile-outbox            release expired relay claims, report overdue events
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router
from django.utils import timezone

from django_pgoutbox import control, maintenance, queue_controls, scheduler
from django_pgoutbox import gauges as db_gauges
from django_pgoutbox.attempts import AttemptRecord
from django_pgoutbox.db import require_migrated
from django_pgoutbox.health import (
    DEFAULT_MAX_AGE,
    MAX_AGE_LIMIT,
    ROLES,
    health_report,
    parse_max_age,
    parse_roles,
)
from django_pgoutbox.management import arguments, deliveries, queues, table
from django_pgoutbox.models import Job
from django_pgoutbox.schedules import load_schedules

LIMIT_HELP = f"At most {arguments.MAX_LIST_LIMIT:,}."

#: ``events list``: the error is cut (the admin shows it whole).
EVENT_COLUMNS = [
    table.Column("id"),
    table.Column("event type"),
    table.Column("aggregate"),
    table.Column("attempts", ">"),
    table.Column("occurred (UTC)"),
    table.Column("dead since (UTC)"),
    table.Column("error", max_width=60),
]

#: ``events list --state``: the admin's states but pending and processed.
LISTED_EVENT_STATES = ("dead", "failing", "held_back", "abandoned", "delivering")

#: ``deadletters causes``: the normalised summary is cut (the admin's page shows 300 characters).
CAUSE_COLUMNS = [
    table.Column("cause"),
    table.Column("dead letters", ">"),
    table.Column("job type"),
    table.Column("error code", max_width=30),
    table.Column("first seen (UTC)"),
    table.Column("last seen (UTC)"),
    table.Column("error summary (normalised)", max_width=60),
]

#: ``deadletters list``: the error summary is cut (``deadletters show ID`` prints it whole).
DEAD_LETTER_COLUMNS = [
    table.Column("id"),
    table.Column("queue"),
    table.Column("job type"),
    table.Column("error code", max_width=30),
    table.Column("dead since (UTC)"),
    table.Column("error", max_width=60),
]


#: ``deadletters show``: the job's attempts (``Job.attempt_history``), oldest first.
ATTEMPT_COLUMNS = [
    table.Column("attempt", align=">"),
    table.Column("worker", max_width=40),
    table.Column("started (UTC)"),
    table.Column("ended (UTC)"),
    table.Column("outcome"),
    table.Column("error code", max_width=30),
    table.Column("summary", max_width=80),
]


def _attempt_row(record: AttemptRecord) -> list[object]:
    return [
        "" if record.attempt is None else record.attempt,
        record.worker or "",
        arguments.utc(record.started_at) if record.started_at else "",
        arguments.utc(record.ended_at) if record.ended_at else "",
        record.outcome or "",
        record.error_code or "",
        record.summary or "",
    ]


def _shown(gauges: Any, field: str, spec: str = "") -> str:
    """A gauge's value for the stats table, ``~`` before an estimate."""
    text = format(getattr(gauges, field), spec)
    return f"~{text}" if field in gauges.estimated else text


class Command(BaseCommand):
    help = "Operate django-pgoutbox: schedules, lease recovery, pruning, outbox reconciliation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None, help="Database alias (default: router).")
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        stats = sub.add_parser(
            "stats", help="Counts by queue and state, backlog age, outbox lag, xmin horizon."
        )
        stats.add_argument("--json", action="store_true", help="One JSON object, for scripts.")
        stats.add_argument(
            "--watch",
            type=arguments.seconds,
            metavar="SECONDS",
            help="Refresh every SECONDS (0.1 to 86400) until Ctrl-C.",
        )
        health = sub.add_parser("health", help="Report liveness; exit status 1 when unhealthy.")
        health.add_argument(
            "--require",
            default=",".join(ROLES),
            metavar="ROLE[,ROLE]",
            help=f"Roles that must be alive, of {', '.join(ROLES)} (default: all).",
        )
        health.add_argument(
            "--max-age",
            type=float,
            default=DEFAULT_MAX_AGE,
            help=f"Seconds since a heartbeat, > 0 and <= {MAX_AGE_LIMIT:g} "
            f"(default {DEFAULT_MAX_AGE:g}).",
        )
        dead = sub.add_parser("deadletters", help="List, show, retry or discard dead jobs.")
        dead_actions = dead.add_subparsers(dest="dead_action", required=True, metavar="ACTION")
        for name, text in (
            ("list", "List dead jobs, newest first."),
            ("retry", "Put dead jobs back in their queue with a fresh attempt budget."),
            ("discard", "Cancel dead jobs: they never run again."),
        ):
            command = dead_actions.add_parser(name, help=text)
            command.add_argument("--queue", type=arguments.text)
            command.add_argument("--job-type", type=arguments.text)
            command.add_argument("--code", type=arguments.text, help="last_error_code")
            command.add_argument(
                "--cause",
                type=arguments.fingerprint,
                metavar="FINGERPRINT",
                help="Only the dead letters of this cause (as `deadletters causes` lists them)"
                + ("." if name == "list" else "; acts on all of them, asking first."),
            )
            if name == "list":
                command.add_argument(
                    "--limit",
                    type=arguments.limit,
                    default=50,
                    help=f"At most {arguments.MAX_LIST_LIMIT:,}.",
                )
            else:
                command.add_argument("ids", nargs="*", metavar="ID")
                command.add_argument(
                    "--all", action="store_true", help="Every dead job matching the filters."
                )
                command.add_argument(
                    "--yes", action="store_true", help="Do not ask before acting on --cause."
                )
        events = sub.add_parser(
            "events", help="List outbox events by state; re-drive or discard dead ones."
        )
        event_actions = events.add_subparsers(dest="events_action", required=True, metavar="ACTION")
        listed = event_actions.add_parser("list", help="Events of one state, oldest first.")
        listed.add_argument("--state", choices=LISTED_EVENT_STATES, default="dead")
        listed.add_argument("--event-type", type=arguments.text)
        listed.add_argument(
            "--limit",
            type=arguments.limit,
            default=50,
            help=f"At most {arguments.MAX_LIST_LIMIT:,}.",
        )
        for name, text in (
            ("redrive", "Make dead events claimable again, with a fresh attempt budget."),
            ("discard", "Mark dead events processed without projecting them."),
        ):
            command = event_actions.add_parser(name, help=text)
            command.add_argument("ids", nargs="*", metavar="ID")
            command.add_argument(
                "--all", action="store_true", help="Every dead event matching the filters."
            )
            command.add_argument("--event-type", type=arguments.text)
            command.add_argument(
                "--dead-for",
                type=arguments.age,
                metavar="AGE",
                help="Only events dead for at least AGE (seconds, or 90m, 12h, 7d): those whose "
                "cause was mended since.",
            )
            command.add_argument(
                "--yes", action="store_true", help="Do not ask before acting on --all."
            )
        deliveries.add_parsers(sub)
        queues.add_parsers(sub)
        show = dead_actions.add_parser("show", help="One dead job in full.")
        show.add_argument("id")
        skip = dead_actions.add_parser(
            "skip",
            help="End dead jobs of a sequence as cancelled (code skipped), with a reason: the "
            "next job of each one's sequence runs.",
        )
        skip.add_argument("ids", nargs="+", metavar="ID")
        skip.add_argument("--reason", type=arguments.text, required=True, help="Why (kept).")
        causes = dead_actions.add_parser(
            "causes",
            help="Dead jobs grouped by cause (job type, error code, the summary without its "
            "numbers, ids and quoted values), the biggest first.",
        )
        causes.add_argument(
            "--limit",
            type=arguments.cause_limit,
            default=control.MAX_CAUSES,
            help=f"Read at most this many causes (1 to {control.MAX_CAUSES:,}, the default).",
        )
        cancel = sub.add_parser(
            "cancel", help="Cancel jobs; running ones are asked to stop (ctx.cancelled)."
        )
        cancel.add_argument("ids", nargs="+", metavar="ID")
        sub.add_parser("schedules", help="List schedules with their last and next slot.")
        run = sub.add_parser("run-schedule", help="Enqueue a schedule's job now.")
        run.add_argument("name")
        sub.add_parser("recover-leases", help="Recover jobs whose lease expired.")
        sub.add_parser("prune", help="Delete finished rows older than PGOUTBOX['RETENTION'].")
        sub.add_parser("reconcile-outbox", help="Release expired claims, report overdue events.")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or router.db_for_write(Job)
        require_migrated(using)
        action = options["action"]
        if action == "stats":
            self._stats(using, as_json=options["json"], watch=options["watch"])
        elif action == "health":
            try:
                require = parse_roles(options["require"], "--require")
                max_age = parse_max_age(options["max_age"], "--max-age")
            except ValueError as error:
                # 2, as for any misuse of the command: 1 says unhealthy, 0 healthy.
                raise CommandError(str(error), returncode=2) from None
            report = health_report(max_age=max_age, require=require, using=using)
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
            if not report.healthy:
                sys.exit(1)
        elif action == "deadletters":
            self._deadletters(using, options)
        elif action == "events":
            self._events(using, options)
        elif action == "deliveries":
            deliveries.handle_deliveries(using, options, self.stdout.write, self._confirm)
        elif action == "outbox":
            deliveries.handle_outbox(using, options, self.stdout.write, self._confirm)
        elif action == "queues":
            queues.handle_queues(using, options, self.stdout.write)
        elif action == "cancel":
            ids = [arguments.identifier(value) for value in options["ids"]]
            states = control.cancel_jobs(ids, using=using, by="pgoutbox cancel")
            for job_id in ids:
                self.stdout.write(f"{job_id}: {states.get(job_id, 'not found')}")
        elif action == "schedules":
            self._schedules(using)
        elif action == "run-schedule":
            schedules, _ = load_schedules()
            if options["name"] not in schedules:
                raise CommandError(
                    f"no schedule {options['name']!r}; schedules: {', '.join(schedules)}"
                )
            job = scheduler.run_now(schedules[options["name"]], using=using)
            self.stdout.write(f"Enqueued job {job.id} ({job.job_type}) on queue {job.queue}.")
        elif action == "recover-leases":
            recovered = maintenance.recover_expired_leases(using=using)
            self.stdout.write(f"Recovered {len(recovered)} expired lease(s).")
            filled = maintenance.fill_dead_causes(using=using)
            if filled:
                self.stdout.write(f"Gave {filled} dead letter(s) their cause.")
        elif action == "prune":
            result = maintenance.prune(using=using)
            self.stdout.write(
                "Deleted "
                + ", ".join(f"{n} {what.replace('_', ' ')}" for what, n in asdict(result).items())
                + "."
            )
        elif action == "reconcile-outbox":
            reconciliation = maintenance.reconcile_outbox(using=using)
            self.stdout.write(
                f"Released {reconciliation.released_claims} expired claim(s); "
                f"{reconciliation.overdue_events} overdue event(s), "
                f"{reconciliation.abandoned_events} of them abandoned."
            )

    def _stats(self, using: str, *, as_json: bool, watch: float | None) -> None:
        try:
            while True:
                gauges = db_gauges.database_gauges(using)
                paused = queue_controls.paused_queues(using)
                holder = db_gauges.horizon_holder(using)
                warnings = db_gauges.horizon_warnings(holder)
                if as_json:
                    report = {
                        **asdict(gauges),
                        "paused_queues": paused,
                        "horizon": None if holder is None else asdict(holder),
                        "warnings": warnings,
                    }
                    self.stdout.write(json.dumps(report, indent=2))
                else:
                    if watch:
                        self.stdout.write("\x1b[2J\x1b[H", ending="")  # clear the terminal
                    self._stats_table(gauges, paused)
                    self._horizon(holder, warnings)
                if not watch:
                    return
                time.sleep(watch)
        except KeyboardInterrupt:
            if not watch:
                raise
            self.stdout.write("")  # Ctrl-C: how --watch ends, not an error

    def _stats_table(self, gauges: db_gauges.DatabaseGauges, paused: list[str]) -> None:
        counts = ("pending", "scheduled", "leased", "retrying", "dead")
        columns = [
            table.Column("queue"),
            *(table.Column(name, ">") for name in counts),
            table.Column("oldest due", ">"),
        ]
        rows = [
            (
                f"{queue.queue} (paused)" if queue.queue in paused else queue.queue,
                *(_shown(queue, name) for name in counts),
                _shown(queue, "oldest_pending_age", ".1f") + "s",
            )
            for queue in gauges.queues.values()
        ]
        for line in table.render(columns, rows):
            self.stdout.write(line)
        self.stdout.write(
            f"\noutbox: {_shown(gauges, 'outbox_pending')} pending, "
            f"{_shown(gauges, 'outbox_dead')} dead, {_shown(gauges, 'outbox_abandoned')} "
            f"abandoned, lag {_shown(gauges, 'outbox_lag', '.1f')}s\n"
            f"oldest open transaction: {gauges.oldest_transaction_age:.1f}s; "
            f"NOTIFY queue {gauges.notification_queue_usage:.1%} full"
        )
        self._deliveries(gauges)
        if any(queue.estimated for queue in gauges.queues.values()) or gauges.estimated:
            self.stdout.write(
                f"~: an estimate (counts over {db_gauges.EXACT_COUNT:,}); see docs/observability.md"
            )

    def _deliveries(self, gauges: db_gauges.DatabaseGauges) -> None:
        """A line per subscriber with deliveries not done (or abandoned), and their warnings."""
        pending = [sub for sub in gauges.deliveries.values() if sub.undelivered or sub.abandoned]
        if not pending:
            self.stdout.write("deliveries: none pending")
            return
        for sub in pending:
            self.stdout.write(
                f"deliveries {sub.subscriber}: {_shown(sub, 'waiting')} waiting, "
                f"{_shown(sub, 'failing')} failing, {_shown(sub, 'dead')} dead, "
                f"{_shown(sub, 'abandoned')} abandoned, lag {_shown(sub, 'lag', '.1f')}s"
            )
        for warning in db_gauges.delivery_warnings(gauges.deliveries):
            self.stdout.write(f"WARNING: {warning}")

    def _horizon(self, holder: db_gauges.HorizonHolder | None, warnings: list[str]) -> None:
        if holder is None:
            self.stdout.write("xmin horizon: held by no one")
        else:
            self.stdout.write(f"xmin horizon: held by {holder.describe()}")
        for warning in warnings:
            self.stdout.write(f"WARNING: {warning}")

    def _deadletters(self, using: str, options: dict[str, Any]) -> None:
        from django_pgoutbox.models import DeadLetter

        action = options["dead_action"]
        dead = DeadLetter.objects.using(using).order_by("-finished_at")
        if action == "show":
            job = dead.filter(pk=arguments.identifier(options["id"])).first()
            if job is None:
                raise CommandError(f"no dead job {options['id']!r}")
            for field in (
                "id",
                "job_type",
                "queue",
                "organization_id",
                "idempotency_key",
                "sequence_key",
                "attempts",
                "max_attempts",
                "last_error_code",
                "locked_by",
                "created_at",
                "finished_at",
            ):
                self.stdout.write(f"{field:>16}: {getattr(job, field)}")
            self.stdout.write(f"{'payload':>16}: {json.dumps(job.payload, indent=2)}")
            self.stdout.write(f"{'error':>16}: {job.last_error_summary}")
            self.stdout.write(f"{'attempts kept':>16}:")
            for line in table.render(ATTEMPT_COLUMNS, map(_attempt_row, job.attempt_history)):
                self.stdout.write(f"  {line}")
            return
        if action == "causes":
            self._causes(using, options["limit"])
            return
        if action == "skip":
            ids = [arguments.identifier(value) for value in options["ids"]]
            done = control.skip_dead_jobs(
                ids, reason=options["reason"], by="manage.py pgoutbox", using=using
            )
            self.stdout.write(f"Skipped {done} dead job(s).")
            return
        if action != "list" and options["cause"]:
            self._act_on_cause(using, action, options)
            return
        filtered = False
        for option, field in (
            ("queue", "queue"),
            ("job_type", "job_type"),
            ("code", "last_error_code"),
        ):
            if options.get(option):
                dead = dead.filter(**{field: options[option]})
                filtered = True
        if options.get("cause"):
            newest = control.newest_dead_of_cause(
                options["cause"],
                limit=options.get("limit") or arguments.MAX_LIST_LIMIT,
                using=using,
            )
            dead = dead.filter(pk__in=newest)
            filtered = True
        if action == "list":
            rows = [
                (
                    job.id,
                    job.queue,
                    job.job_type,
                    job.last_error_code or "",
                    arguments.utc(job.finished_at) if job.finished_at else "",
                    job.last_error_summary or "",
                )
                for job in dead[: options["limit"]]
            ]
            if not rows:
                self.stdout.write("No dead jobs" + (" match." if filtered else "."))
                return
            for line in table.render(DEAD_LETTER_COLUMNS, rows):
                self.stdout.write(line)
            return
        if options["ids"]:
            ids = [arguments.identifier(value) for value in options["ids"]]
        elif options["all"]:
            ids = list(dead.values_list("pk", flat=True))
        else:
            raise CommandError(f"deadletters {action}: give job ids, or --all with filters")
        perform = control.retry_dead_jobs if action == "retry" else control.cancel_dead_jobs
        done = perform(ids, using=using)
        verb = "Retried" if action == "retry" else "Discarded"
        self.stdout.write(f"{verb} {done} dead job(s).")

    def _causes(self, using: str, limit: int) -> None:
        found = control.dead_letter_causes(limit=limit, using=using)
        if not found.causes:
            self.stdout.write("No dead jobs.")
            return
        rows = [
            (
                cause.fingerprint,
                f"{cause.count:,}" if cause.exact else f"~{cause.count:,}",
                cause.job_type,
                cause.error_code or "",
                arguments.utc(cause.first_seen),
                arguments.utc(cause.last_seen),
                cause.pattern,
            )
            for cause in found.causes
        ]
        for line in table.render(CAUSE_COLUMNS, rows):
            self.stdout.write(line)
        if found.estimated:
            self.stdout.write(
                f"~: an estimate from the statistics ANALYZE last gathered (counts of "
                f"{control.CAUSE_COUNT_CAP} or more); `deadletters retry --cause F` counts exactly "
                "before it asks."
            )
        if found.more:
            self.stdout.write(
                f"More than {limit:,} causes: these are the first {limit:,} by fingerprint, an "
                "order that says nothing of their size."
            )

    def _act_on_cause(self, using: str, action: str, options: dict[str, Any]) -> None:
        if (
            options["ids"]
            or options["all"]
            or any(options.get(name) for name in ("queue", "job_type", "code"))
        ):
            raise CommandError(
                f"deadletters {action} --cause: the cause alone names the dead jobs (no ids, "
                "--all or other filters)"
            )
        fingerprint = options["cause"]
        as_of = control.database_now(using)
        count = control.count_dead_cause(fingerprint, as_of=as_of, using=using)
        if count == 0:
            self.stdout.write("No dead jobs of this cause.")
            return
        verb = "Retry" if action == "retry" else "Discard"
        self._confirm(f"{verb} {count:,} dead job(s) of cause {fingerprint}?", options["yes"])
        perform = control.retry_dead_cause if action == "retry" else control.discard_dead_cause
        done, _ = perform(fingerprint, as_of=as_of, using=using)
        verb = "Retried" if action == "retry" else "Discarded"
        message = f"{verb} {done:,} dead job(s)."
        left = count - done
        if left > 0:
            were = (
                "was no longer dead and was left as it is"
                if left == 1
                else ("were no longer dead and were left as they are")
            )
            message += f" {left:,} of the {count:,} counted {were}."
        self.stdout.write(message)

    def _events(self, using: str, options: dict[str, Any]) -> None:
        from django_pgoutbox.event_states import EVENT_STATES
        from django_pgoutbox.models import OutboxEvent

        action = options["events_action"]
        events = OutboxEvent.objects.using(using)
        if options.get("event_type"):
            events = events.filter(event_type=options["event_type"])
        if action == "list":
            state = options["state"]
            rows = [
                (
                    event.id,
                    event.event_type,
                    f"{event.aggregate_type}:{event.aggregate_id}",
                    event.attempts,
                    arguments.utc(event.occurred_at),
                    arguments.utc(event.dead_at) if event.dead_at else "",
                    event.last_error or "",
                )
                for event in events.filter(EVENT_STATES[state]()).order_by("occurred_at", "id")[
                    : options["limit"]
                ]
            ]
            if not rows:
                self.stdout.write(f"No {state.replace('_', ' ')} events.")
                return
            for line in table.render(EVENT_COLUMNS, rows):
                self.stdout.write(line)
            return
        dead = events.filter(EVENT_STATES["dead"]())
        if options["dead_for"] is not None:
            dead = dead.filter(dead_at__lte=timezone.now() - timedelta(seconds=options["dead_for"]))
        if options["ids"]:
            if options["all"]:
                raise CommandError(f"events {action}: give event ids or --all, not both")
            ids = [arguments.identifier(value, "an event id") for value in options["ids"]]
        elif options["all"]:
            ids = list(dead.values_list("pk", flat=True))
            if not ids:
                self.stdout.write("No dead events match.")
                return
            verb = "Re-drive" if action == "redrive" else "Discard"
            self._confirm(f"{verb} {len(ids):,} dead event(s)?", options["yes"])
        else:
            raise CommandError(f"events {action}: give event ids, or --all with filters")
        perform = (
            control.redrive_dead_events if action == "redrive" else control.discard_dead_events
        )
        done = perform(ids, using=using)
        verb = "Re-drove" if action == "redrive" else "Discarded"
        self.stdout.write(f"{verb} {done} dead event(s).")

    def _confirm(self, question: str, yes: bool) -> None:
        """Ask ``question`` on the terminal, unless ``--yes`` answered it; with no terminal to
        ask on, refuse: a script says ``--yes``."""
        if yes:
            return
        if not sys.stdin.isatty():
            raise CommandError(f"{question} Add --yes to confirm: no terminal to ask on.")
        answer = input(f"{question} [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise CommandError("Nothing done.", returncode=1)

    def _schedules(self, using: str) -> None:
        schedules, problems = load_schedules()
        for problem in problems:
            self.stderr.write(f"invalid: {problem}")
        now = scheduler.database_now(using)
        last_slots = scheduler.cursors(using)
        rows = []
        for name, entry in sorted(schedules.items()):
            last = last_slots.get(name)
            rows.append(
                (
                    name,
                    entry.job_type,
                    entry.queue or "",
                    entry.spec,
                    last.isoformat(timespec="seconds") if last else "-",
                    entry.next_after(now).isoformat(timespec="seconds"),
                )
            )
        columns = ("name", "job", "queue", "when", "last slot", "next slot")
        for line in table.render([table.Column(title) for title in columns], rows):
            self.stdout.write(line)
