"""``manage.py pgoutbox``: operations without the admin.

pgoutbox schedules                  every schedule with its last and next slot
pgoutbox run-schedule NAME          enqueue a schedule's job now
pgoutbox recover-leases             return expired leases to their queue (or dead letters)
pgoutbox prune                      delete finished rows past their retention
pgoutbox reconcile-outbox           release expired relay claims, report overdue events
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import router

from django_pgoutbox import maintenance, scheduler
from django_pgoutbox.models import Job


class Command(BaseCommand):
    help = "Operate django-pgoutbox: schedules, lease recovery, pruning, outbox reconciliation."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=None, help="Database alias (default: router).")
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        sub.add_parser("schedules", help="List schedules with their last and next slot.")
        run = sub.add_parser("run-schedule", help="Enqueue a schedule's job now.")
        run.add_argument("name")
        sub.add_parser("recover-leases", help="Recover jobs whose lease expired.")
        sub.add_parser("prune", help="Delete finished rows older than PGOUTBOX['RETENTION'].")
        sub.add_parser("reconcile-outbox", help="Release expired claims, report overdue events.")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or router.db_for_write(Job)
        action = options["action"]
        if action == "schedules":
            self._schedules(using)
        elif action == "run-schedule":
            schedules, _ = scheduler.load_schedules()
            if options["name"] not in schedules:
                raise CommandError(
                    f"no schedule {options['name']!r}; schedules: {', '.join(schedules)}"
                )
            job = scheduler.run_now(schedules[options["name"]], using=using)
            self.stdout.write(f"Enqueued job {job.id} ({job.job_type}) on queue {job.queue}.")
        elif action == "recover-leases":
            recovered = maintenance.recover_expired_leases(using=using)
            self.stdout.write(f"Recovered {len(recovered)} expired lease(s).")
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
                f"{reconciliation.overdue_events} overdue event(s)."
            )

    def _schedules(self, using: str) -> None:
        schedules, problems = scheduler.load_schedules()
        for problem in problems:
            self.stderr.write(f"invalid: {problem}")
        now = scheduler.database_now(using)
        last_slots = scheduler.cursors(using)
        header = f"{'name':<28} {'job':<28} {'queue':<14} {'when':<18} {'last slot':<26} next slot"
        self.stdout.write(header)
        for name, entry in sorted(schedules.items()):
            last = last_slots.get(name)
            self.stdout.write(
                f"{name:<28} {entry.job_type:<28} {entry.queue or '':<14} {entry.spec:<18} "
                f"{last.isoformat(timespec='seconds') if last else '-':<26} "
                f"{entry.next_after(now).isoformat(timespec='seconds')}"
            )
