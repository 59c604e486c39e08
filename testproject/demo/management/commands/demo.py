"""``manage.py demo``: make and migrate its database, enqueue a mixed batch into the seven
queues, run workers until done, and say what to try next."""

from __future__ import annotations

import shlex
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import Q

from django_pgoutbox import enqueue_many
from django_pgoutbox.db import raw_connection_params
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from django_pgoutbox.worker import Worker
from testproject.database import find_database
from testproject.demo.database import prepare_database
from testproject.demo.models import TrackingSession, complete_session

OPEN = (JobStatus.PENDING, JobStatus.LEASED, JobStatus.RETRYING)
#: What the demo's failures mean, for the ones it makes on purpose.
ON_PURPOSE = {
    "demo.export": "\n  (on purpose: the demo asks for an export format that does not exist; a "
    "PermanentError makes the job a dead letter at once, with no retry)",
}
DOCS = "https://github.com/django-pgoutbox/django-pgoutbox/tree/main/docs"


def demo_batch(batch: str) -> list[dict[str, Any]]:
    """One fleet's worth of work: mostly fine, a few transient failures, one of each worse case."""
    items: list[dict[str, Any]] = []

    def add(job_type: str, payload: dict[str, Any], **options: Any) -> None:
        items.append({"job_type": job_type, "payload": {"batch": batch, **payload}, **options})

    for n in range(20):
        add("demo.raise_alert", {"device": f"dev-{n}"})
    for n in range(50):
        add("demo.send_notification", {"user": f"user-{n}", "flaky": n % 10 == 0})
    for n in range(20):
        add(
            "demo.deliver_webhook",
            {"endpoint": f"https://partner.example/{n}", "throttled": n == 0},
        )
    for n in range(30):
        add("demo.derive_location", {"lat": 52.1 + n / 100, "lon": 4.3 + n / 100})
    for n in range(3):
        add("demo.build_report", {"report": n})
    add("demo.export", {"format": "csv"})
    add("demo.export", {"format": "xlsx"})  # not supported: dead-lettered at once
    add("demo.vacuum_sessions", {}, idempotency_key=f"vacuum:{batch}")
    return items


class Command(BaseCommand):
    help = (
        "Make and migrate the demo's database, enqueue a demo batch into the seven queues, "
        "complete a few tracking sessions (facts that the outbox relay projects into jobs), run "
        "the workers until all is done, summarise."
    )
    # The checks query the database, which may not exist yet: migrate runs them once it does.
    requires_system_checks: tuple[str, ...] = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="Give up after this many seconds."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(
            prepare_database(
                raw_connection_params(DEFAULT_DB_ALIAS),
                named_by_user=find_database().named_by_user,
            )
        )
        call_command("migrate", verbosity=0, interactive=False, skip_checks=False)
        batch = uuid.uuid4().hex[:8]
        with transaction.atomic():
            jobs = enqueue_many(demo_batch(batch))
        # The source text's example: completing a tracking session is a fact, committed with
        # the change; the relay projects it into a notification job and a report job.
        organization = uuid.uuid4()
        sessions = [
            TrackingSession.objects.create(organization_id=organization, device=f"{batch}-{n}")
            for n in range(3)
        ]
        for session in sessions:
            complete_session(session.id)
        self.stdout.write(
            f"Enqueued {len(jobs)} jobs (batch {batch}) into 7 queues and completed "
            f"{len(sessions)} tracking sessions; running the workers and the outbox relay (their "
            "log, on stderr, shows each retry and dead letter)..."
        )
        batch_jobs = Job.objects.filter(
            Q(pk__in=[job.pk for job in jobs]) | Q(organization_id=organization)
        )
        events = OutboxEvent.objects.filter(aggregate_id__in=[s.id for s in sessions])

        worker = Worker(grace_period=5)
        thread = threading.Thread(target=worker.run, name="demo-worker")
        started = time.monotonic()
        thread.start()
        try:
            while time.monotonic() - started < options["timeout"]:
                if not (
                    events.filter(processed_at__isnull=True).exists()
                    or batch_jobs.filter(status__in=OPEN).exists()
                ):
                    break
                time.sleep(0.2)
        finally:
            worker.stop()
            thread.join()
        projected = events.filter(processed_at__isnull=False).count()
        self.stdout.write(
            f"Outbox: {projected} of {events.count()} facts projected "
            "(tracking_session.started, tracking_session.completed)."
        )
        self._summarise(list(batch_jobs.values_list("pk", flat=True)), time.monotonic() - started)

    def _summarise(self, ids: list[uuid.UUID], elapsed: float) -> None:
        by_queue: dict[str, Counter[str]] = defaultdict(Counter)
        retried: Counter[str] = Counter()
        problems = []
        for job in Job.objects.filter(pk__in=ids).order_by("queue"):
            by_queue[job.queue][job.status] += 1
            if job.attempts > 1:
                retried[job.queue] += 1
            if job.status in (JobStatus.DEAD, JobStatus.CANCELLED):
                problems.append(job)
        columns = ["completed", "dead", "cancelled", "open"]
        self.stdout.write(f"\n{'queue':<22}" + "".join(f"{c:>11}" for c in [*columns, "retried"]))
        for queue, counts in sorted(by_queue.items()):
            open_count = sum(counts[s] for s in OPEN)
            row = [
                counts["completed"],
                counts["dead"],
                counts["cancelled"],
                open_count,
                retried[queue],
            ]
            self.stdout.write(f"{queue:<22}" + "".join(f"{n:>11}" for n in row))
        self.stdout.write(
            "retried: jobs that needed more than one attempt (here the flaky notifications and "
            "the rate-limited webhook, which fail once on purpose)."
        )
        for job in problems:
            self.stdout.write(
                f"\n{job.status}: {job.job_type} {job.id}\n  {job.last_error_summary}"
                + ON_PURPOSE.get(job.job_type, "")
            )
        still_open = Job.objects.filter(pk__in=ids, status__in=OPEN).count()
        self.stdout.write(f"\nDone in {elapsed:.1f}s; {still_open} job(s) still open.")
        self._next_steps()

    def _next_steps(self) -> None:
        manage = f"{_python()} manage.py"
        self.stdout.write(
            "\nNext:\n"
            f"  the admin:        {manage} createsuperuser, then {manage} runserver and open "
            "http://127.0.0.1:8000/admin/pgoutbox/ (dead letters: retry or discard)\n"
            f"  the command line: {manage} pgoutbox deadletters list (and pgoutbox --help)\n"
            f"  the workers:      {manage} runworkers (Ctrl-C stops them)\n"
            f"  the docs:         {DOCS} (start with tutorial.md)"
        )


def _python() -> str:
    """How to call this Python from here: the virtual environment's path if it is below the
    current directory (``.venv/bin/python``), else ``python``."""
    executable = Path(sys.executable)
    if executable.is_relative_to(Path.cwd()):
        return shlex.quote(str(executable.relative_to(Path.cwd())))
    return "python"
