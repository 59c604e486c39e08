"""``manage.py demo``: enqueue a mixed batch into the seven queues and run workers until done."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.db.models import Q

from django_pgoutbox import enqueue_many
from django_pgoutbox.models import Job, JobStatus, OutboxEvent
from django_pgoutbox.worker import Worker
from testproject.demo.models import TrackingSession, complete_session

OPEN = (JobStatus.PENDING, JobStatus.LEASED, JobStatus.RETRYING)


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
        "Enqueue a demo batch into the seven queues, complete a few tracking sessions (facts "
        "that the outbox relay projects into jobs), run the workers until all is done, summarise."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--timeout", type=float, default=60.0, help="Give up after this many seconds."
        )

    def handle(self, *args: Any, **options: Any) -> None:
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
            f"{len(sessions)} tracking sessions; running the workers and the outbox relay..."
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
        for job in problems:
            self.stdout.write(
                f"\n{job.status}: {job.job_type} {job.id}\n  {job.last_error_summary}"
            )
        still_open = Job.objects.filter(pk__in=ids, status__in=OPEN).count()
        self.stdout.write(f"\nDone in {elapsed:.1f}s; {still_open} job(s) still open.")
