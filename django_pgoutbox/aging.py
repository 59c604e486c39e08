"""Priority aging: a queue's waiting jobs gain priority with their wait, so that a steady stream
of higher-priority work cannot hold a lower-priority job back forever (docs/workers.md,
"Priority aging"; the setting: ``QUEUES[...]["PRIORITY_AGING"]``).

The claim is left as it is, an index scan in priority order: a pass *raises* the priority of
the jobs that waited (AGE_PRIORITIES), which each worker of an aging queue runs with its lease
recovery, at most a few times per step across the queue's workers (START_AGING_PASS).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import connections, router

from django_pgoutbox import queries
from django_pgoutbox.conf import JOBS_CHANNEL, PriorityAging, get_settings
from django_pgoutbox.models import Job

logger = logging.getLogger("django_pgoutbox.aging")

#: Passes per step: a job gets its raise at most a quarter of a step (or a poll interval of the
#: queue's workers, if longer) after its wait earns it.
PASSES_PER_STEP = 4
#: Jobs raised per statement (and transaction): short transactions, short row locks.
AGING_BATCH = 1000
#: A pass stops after this many seconds and goes on at the next (it is idempotent): it runs on
#: a lane of the queue's worker, whose claims go to its other lane meanwhile.
AGING_TIME_BUDGET = 2.0


def age_priorities(
    queue: str,
    aging: PriorityAging,
    *,
    using: str | None = None,
    connection: Any = None,
    spaced: bool = True,
    batch: int = AGING_BATCH,
    budget: float = AGING_TIME_BUDGET,
) -> int:
    """Raise the priority of ``queue``'s waiting jobs to what their wait is due; return how
    many jobs it raised. ``spaced``: only if no pass started on the queue in the last
    ``aging.every / PASSES_PER_STEP`` seconds (else none runs, and this returns 0).
    ``connection``: a psycopg connection in autocommit to use instead of Django's (a worker's
    lane); each batch is then its own transaction."""
    if connection is None:
        connection = connections[using or router.db_for_write(Job)]
    with connection.cursor() as cursor:
        if spaced:
            cursor.execute(queries.START_AGING_PASS, [queue, aging.every / PASSES_PER_STEP])
            if cursor.fetchone() is None:
                return 0
        deadline = time.monotonic() + budget
        params: dict[str, Any] = {
            "queue": queue,
            "every": aging.every,
            "up_to": aging.up_to,
            "limit": batch,
            "after_priority": aging.up_to,
            "after_run_at": None,
            "after_created_at": None,
            "after_id": None,
            "channel": JOBS_CHANNEL,
            "notify": get_settings().notify,
        }
        total: int = 0
        while True:
            cursor.execute(queries.AGE_PRIORITIES, params)
            raised, read, _woken, *after = cursor.fetchone()
            total += int(raised)
            if read < batch or time.monotonic() > deadline:
                break
            params.update(
                zip(
                    ("after_priority", "after_run_at", "after_created_at", "after_id"),
                    after,
                    strict=True,
                )
            )
    if total:
        logger.info(
            "queue %s: raised the priority of %d waiting job(s)",
            queue,
            total,
            extra={"queue": queue, "raised": total},
        )
    return total
