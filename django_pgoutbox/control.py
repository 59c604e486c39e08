"""Acting on jobs and events already written: cancelling jobs, the dead letters (retry, give up,
re-drive, discard; and by cause) that the admin and ``manage.py pgoutbox`` operate on, and a
subscriber's deliveries (re-drive, discard, replay)."""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Exists, OuterRef, QuerySet

from django_pgoutbox import outbox, queries
from django_pgoutbox.conf import CANCEL_CHANNEL, get_settings
from django_pgoutbox.db import tables_required
from django_pgoutbox.errors import EnqueueError, InvalidInput
from django_pgoutbox.job_rows import job_database
from django_pgoutbox.models import Job, JobStatus, OutboxDelivery, OutboxEvent, Workflow
from django_pgoutbox.validation import checked_moment, optional_uuid, short_repr, utc_offset

# -- cancellation --------------------------------------------------------------------------------


def cancel(job_id: uuid.UUID | str, *, using: str | None = None) -> str:
    """Cancel one job and return what became of it.

    A job not running yet (``pending``, ``retrying``) is ``"cancelled"`` at once and never runs.
    A running one returns ``"cancelling"``: its handler sees ``ctx.cancelled`` (and
    ``ctx.renew_lease()`` raises ``Cancelled``) from the worker's next lease renewal, which a
    notification makes immediate; whatever the attempt's outcome, the job then ends
    ``cancelled`` (a result it returned is kept) and is never retried. A finished job keeps its
    state (``"completed"``, ``"dead"``, ``"cancelled"``). Raises ``Job.DoesNotExist`` for an
    unknown id.

    Joins the caller's transaction, like ``enqueue()``.
    """
    parsed = optional_uuid(job_id, "job_id", EnqueueError)
    if parsed is None:
        raise EnqueueError("job_id", "is required")
    result = cancel_jobs([parsed], using=using)
    if parsed not in result:
        raise Job.DoesNotExist(f"no job {parsed} in database {job_database(using)!r}")
    return result[parsed]


def cancel_jobs(
    job_ids: Iterable[uuid.UUID], *, using: str | None = None, by: str = "cancel()"
) -> dict[uuid.UUID, str]:
    """Cancel many jobs in one statement; returns job id -> state, as :func:`cancel` does."""
    alias = job_database(using)
    ids = list(job_ids)
    if not ids:
        return {}
    with tables_required(alias, EnqueueError), connections[alias].cursor() as cursor:
        cursor.execute(
            queries.CANCEL_JOBS,
            {
                "ids": ids,
                "summary": f"cancelled by {by} before it ran",
                "channel": CANCEL_CHANNEL,
                "notify": get_settings().notify,
            },
        )
        return {job_id: state for job_id, state, _ in cursor.fetchall()}


def cancel_workflow(
    workflow_id: uuid.UUID | str, *, using: str | None = None, by: str = "cancel_workflow()"
) -> dict[str, int]:
    """Cancel every step of a workflow not finished yet, as :func:`cancel` cancels a job: those
    waiting or not running yet at once, running ones asked to stop. Returns how many steps
    ended each way (``"cancelled"``, ``"cancelling"``). Raises ``Workflow.DoesNotExist`` for an
    unknown id."""
    parsed = optional_uuid(workflow_id, "workflow_id", EnqueueError)
    if parsed is None:
        raise EnqueueError("workflow_id", "is required")
    alias = job_database(using)
    with tables_required(alias, EnqueueError), connections[alias].cursor() as cursor:
        cursor.execute(queries.UNFINISHED_STEPS, [parsed])
        rows = cursor.fetchall()
    if not rows:
        raise Workflow.DoesNotExist(f"no workflow {parsed} in database {alias!r}")
    ids = [row[0] for row in rows if row[0] is not None]
    states = cancel_jobs(ids, using=alias, by=by)
    counts = {"cancelled": 0, "cancelling": 0}
    for state in states.values():
        if state in counts:
            counts[state] += 1
    return counts


# -- dead letters (the admin and ``pgoutbox deadletters``) ------------------------------------


def _update(sql: str, ids: list[Any], using: str | None) -> int:
    alias = using or router.db_for_write(Job)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [list(ids)])
        count: int = cursor.rowcount
    return count


#: Runs of RETRY_DEAD_JOBS, each after a concurrent transaction wrote a holder of a key it retried.
_RETRY_ROUNDS = 3


def retry_dead_jobs(ids: list[Any], *, using: str | None = None) -> int:
    """Put dead jobs back in their queue, due now, with a fresh attempt budget; return how many.

    A unique job whose key another job holds now stays dead (docs/uniqueness.md, the traps), as
    do all but the newest of several dead jobs of one key. A holder of a key that a concurrent
    transaction wrote is unseen by the statement, which then fails on ``jobs_unique_uq`` once that
    transaction commits: it is run again (in a savepoint), and sees the holder.
    """
    alias = using or router.db_for_write(Job)
    for _ in range(_RETRY_ROUNDS - 1):
        try:
            with transaction.atomic(using=alias):
                return _update(queries.RETRY_DEAD_JOBS, ids, alias)
        except IntegrityError as error:
            if not _unique_key_met(error):
                raise
    with transaction.atomic(using=alias):  # the last round: its error is the caller's
        return _update(queries.RETRY_DEAD_JOBS, ids, alias)


def _unique_key_met(error: IntegrityError) -> bool:
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None) == "jobs_unique_uq"


def cancel_dead_jobs(ids: list[Any], *, using: str | None = None) -> int:
    """Give up on dead jobs for good: they become ``cancelled`` (and are pruned later)."""
    return _update(queries.CANCEL_DEAD_JOBS, ids, using)


def skip_dead_jobs(
    ids: list[Any], *, reason: str, by: str = "skip_dead_jobs()", using: str | None = None
) -> int:
    """End dead jobs as ``cancelled`` (code ``skipped``, with ``reason`` in their last error),
    which lets the next job of their sequence run; returns how many were dead. Jobs that are not
    dead are left as they are. Joins the caller's transaction."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("reason", f"must say why (a non-empty string), not {short_repr(reason)}")
    alias = job_database(using)
    with tables_required(alias, EnqueueError), connections[alias].cursor() as cursor:
        cursor.execute(
            queries.SKIP_DEAD_JOBS,
            {
                "ids": [optional_uuid(i, "ids", InvalidInput) for i in ids],
                "summary": f"skipped by {by}: {reason}"[:1000],
            },
        )
        return len(cursor.fetchall())


def redrive_dead_events(ids: list[Any], *, using: str | None = None) -> int:
    """Make dead outbox events claimable again, with a fresh attempt budget."""
    return _update(queries.REDRIVE_DEAD_EVENTS, ids, using)


def discard_dead_events(ids: list[Any], *, using: str | None = None) -> int:
    """Mark dead events processed without projecting them: their aggregate's later events go on."""
    return _update(queries.DISCARD_DEAD_EVENTS, ids, using)


# -- dead letters by cause (the admin's "Dead letters by cause", ``pgoutbox deadletters causes``) --

#: The most causes that :func:`dead_letter_causes` reads: one index descent each.
MAX_CAUSES = 1000
#: A cause is counted exactly up to this many dead letters; a bigger one is estimated.
CAUSE_COUNT_CAP = 100
#: Dead letters per statement (and per transaction) of a retry or discard of a cause.
CAUSE_BATCH = 500

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class DeadLetterCause:
    """The dead letters of one cause: same job type, same error code, and error summaries that
    are the same once their numbers, ids and quoted values are taken out (``pattern``)."""

    fingerprint: str  # 16 hex digits: pgoutbox_error_fingerprint(job type, code, summary)
    job_type: str
    error_code: str | None
    pattern: str  # the summary, normalised (docs/admin.md, "Dead letters by cause")
    queue: str  # the example's: a cause's dead letters may be in several queues
    example_id: uuid.UUID  # the newest of its dead letters
    first_seen: datetime
    last_seen: datetime
    #: Exact when ``exact``; else an estimate, at least ``CAUSE_COUNT_CAP``.
    count: int
    exact: bool


@dataclass(frozen=True)
class DeadLetterCauses:
    causes: list[DeadLetterCause]  # the biggest first, then the most recent
    #: True when there are more causes than were read (``limit``): those read are the first by
    #: fingerprint, an order that says nothing of their size.
    more: bool
    #: How many of ``causes`` are estimated, not counted.
    estimated: int


def checked_fingerprint(value: Any) -> str:
    """``value`` if it is a fingerprint (16 lowercase hex digits), else ``InvalidInput``."""
    if isinstance(value, str) and _FINGERPRINT.fullmatch(value):
        return value
    raise InvalidInput(
        "fingerprint", f"must be 16 hex digits (as the causes list), not {short_repr(value, 40)}"
    )


def _read_planned(alias: str, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Run a read of ``jobs_dead_cause_idx`` with the plan it is written for
    (``queries.DEAD_CAUSE_PLAN``), in a transaction or a savepoint that is then rolled back, so
    that the plan settings never outlive it."""
    with tables_required(alias, InvalidInput, added_later=True), transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            cursor.execute(queries.DEAD_CAUSE_PLAN)
            cursor.execute(sql, params)
            rows: list[tuple[Any, ...]] = cursor.fetchall()
        transaction.set_rollback(True, using=alias)
    return rows


def dead_letter_causes(*, limit: int = MAX_CAUSES, using: str | None = None) -> DeadLetterCauses:
    """The causes of the dead letters, the biggest first: each with its job type, error code,
    normalised summary, count, when one of them first and last died, and its newest dead letter.

    A cause of fewer than ``CAUSE_COUNT_CAP`` dead letters is counted; a bigger one is estimated
    from the statistics of ``jobs.dead_cause`` that ANALYZE last gathered (for a cause that
    ANALYZE did not see often enough, the estimate is ``CAUSE_COUNT_CAP``; :func:`count_dead_cause`
    counts one exactly). At most ``limit`` causes are read.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CAUSES:
        raise InvalidInput("limit", f"must be an integer from 1 to {MAX_CAUSES}, not {limit!r}")
    alias = using or router.db_for_read(Job)
    rows = _read_planned(alias, queries.DEAD_CAUSES, {"limit": limit + 1, "cap": CAUSE_COUNT_CAP})
    causes = []
    for fingerprint, example, queue, job_type, code, pattern, first, last, counted, guess in rows[
        :limit
    ]:
        exact = counted < CAUSE_COUNT_CAP
        causes.append(
            DeadLetterCause(
                fingerprint=fingerprint,
                job_type=job_type,
                error_code=code,
                pattern=pattern or "",
                queue=queue,
                example_id=example,
                first_seen=first,
                last_seen=last,
                count=counted if exact else max(CAUSE_COUNT_CAP, guess or 0),
                exact=exact,
            )
        )
    causes.sort(key=lambda cause: (cause.count, cause.last_seen), reverse=True)
    return DeadLetterCauses(
        causes=causes,
        more=len(rows) > limit,
        estimated=sum(1 for cause in causes if not cause.exact),
    )


def database_now(using: str | None = None) -> datetime:
    """The database clock: the moment a confirmation counts a cause's dead letters at."""
    with connections[using or router.db_for_read(Job)].cursor() as cursor:
        cursor.execute(queries.DATABASE_NOW)
        moment: datetime = cursor.fetchone()[0]
    return moment


def dead_cause_batches(
    fingerprint: str,
    *,
    as_of: datetime,
    batch: int = CAUSE_BATCH,
    using: str | None = None,
) -> Iterator[list[uuid.UUID]]:
    """The ids of the dead letters of a cause that died at or before ``as_of``, ``batch`` at a
    time, oldest first: each batch one statement, in a transaction of its own (none is held
    while the caller acts on a batch)."""
    fingerprint = checked_fingerprint(fingerprint)
    alias = using or router.db_for_write(Job)
    params: dict[str, Any] = {
        "fingerprint": fingerprint,
        "as_of": as_of,
        "after_at": "-infinity",
        "after_id": uuid.UUID(int=0),
        "limit": batch,
    }
    while rows := _read_planned(alias, queries.DEAD_CAUSE_IDS, params):
        yield [job_id for job_id, _ in rows]
        params["after_id"], params["after_at"] = rows[-1]


def count_dead_cause(
    fingerprint: str, *, as_of: datetime | None = None, using: str | None = None
) -> int:
    """How many dead letters of a cause died at or before ``as_of`` (default: now), exactly,
    from the entries of ``jobs_dead_cause_idx`` (docs/admin.md, "Dead letters by cause")."""
    alias = using or router.db_for_read(Job)
    params = {
        "fingerprint": checked_fingerprint(fingerprint),
        "as_of": as_of or database_now(alias),
    }
    ((count,),) = _read_planned(alias, queries.COUNT_DEAD_CAUSE, params)
    return int(count)


def newest_dead_of_cause(
    fingerprint: str, *, limit: int, using: str | None = None
) -> list[uuid.UUID]:
    """The ids of the newest ``limit`` dead letters of a cause, newest first."""
    alias = using or router.db_for_read(Job)
    rows = _read_planned(
        alias,
        queries.DEAD_CAUSE_NEWEST,
        {"fingerprint": checked_fingerprint(fingerprint), "limit": limit},
    )
    return [job_id for (job_id,) in rows]


def act_on_dead_cause(
    fingerprint: str,
    perform: Callable[[list[Any]], int],
    *,
    as_of: datetime | None = None,
    using: str | None = None,
) -> tuple[int, int]:
    """Call ``perform`` on the dead letters of a cause that died at or before ``as_of`` (default:
    now), ``CAUSE_BATCH`` at a time; each batch is locked, checked (still dead, not died again
    since ``as_of``) and acted on in a transaction of its own. Returns (acted on, left alone:
    no longer dead when its batch came)."""
    alias = using or router.db_for_write(Job)
    moment = as_of or database_now(alias)
    done = seen = 0
    for ids in dead_cause_batches(fingerprint, as_of=moment, using=alias):
        seen += len(ids)
        with transaction.atomic(using=alias):
            locked = list(
                Job.objects.using(alias)
                .filter(pk__in=ids, status=JobStatus.DEAD, finished_at__lte=moment)
                .order_by("pk")
                .select_for_update()
                .values_list("pk", flat=True)
            )
            if locked:
                done += perform(locked)
    return done, seen - done


def retry_dead_cause(
    fingerprint: str, *, as_of: datetime | None = None, using: str | None = None
) -> tuple[int, int]:
    """Retry every dead letter of a cause (as :func:`retry_dead_jobs`), ``CAUSE_BATCH`` at a
    time; returns (retried, left alone). ``InvalidInput`` for a fingerprint that is not one."""
    alias = using or router.db_for_write(Job)
    return act_on_dead_cause(
        fingerprint, lambda ids: retry_dead_jobs(ids, using=alias), as_of=as_of, using=alias
    )


def discard_dead_cause(
    fingerprint: str, *, as_of: datetime | None = None, using: str | None = None
) -> tuple[int, int]:
    """Cancel every dead letter of a cause (as :func:`cancel_dead_jobs`), ``CAUSE_BATCH`` at a
    time; returns (cancelled, left alone)."""
    alias = using or router.db_for_write(Job)
    return act_on_dead_cause(
        fingerprint, lambda ids: cancel_dead_jobs(ids, using=alias), as_of=as_of, using=alias
    )


# -- deliveries (the admin and ``pgoutbox deliveries``, ``pgoutbox outbox replay``) -------------


def redrive_dead_deliveries(ids: list[Any], *, using: str | None = None) -> int:
    """Make dead deliveries due again, with a fresh attempt budget: their subscriber runs on the
    event again, then on its later deliveries of the aggregate. Deliveries that are not dead
    (any more) are left as they are; returns how many were re-driven."""
    return _update(queries.REDRIVE_DEAD_DELIVERIES, ids, using)


def discard_dead_deliveries(ids: list[Any], *, using: str | None = None) -> int:
    """Give up on dead deliveries: marked delivered without running, so that their subscriber's
    later deliveries of the aggregate go on. Deliveries that are not dead (any more) are left as
    they are; returns how many were discarded."""
    return _update(queries.DISCARD_DEAD_DELIVERIES, ids, using)


#: Subscribers named in the error of an unknown one: the first few, sorted.
NAMED_SUBSCRIBERS = 10


def registered_subscribers() -> dict[str, tuple[str, ...]]:
    """Each subscriber this process registers (``@subscriber``), by name, with its event types."""
    found: dict[str, set[str]] = {}
    for event_type in outbox.subscribed_event_types():
        for registered in outbox.subscribers_for(event_type):
            found.setdefault(registered.name, set()).add(event_type)
    return {name: tuple(sorted(types)) for name, types in found.items()}


def subscriber_event_types(name: Any) -> tuple[str, ...]:
    """The event types that the subscriber ``name`` takes; ``InvalidInput`` (a ``ValueError``)
    naming ``subscriber`` unless this process registers it."""
    registered = registered_subscribers()
    if isinstance(name, str) and name in registered:
        return registered[name]
    names = sorted(registered)
    if not names:
        known = "this process registers no subscriber (are their modules imported?)"
    else:
        shown = ", ".join(short_repr(n, 60) for n in names[:NAMED_SUBSCRIBERS])
        more = len(names) - NAMED_SUBSCRIBERS
        known = f"registered: {shown}" + (f" (and {more:,} more)" if more > 0 else "")
        if isinstance(name, str):
            close = difflib.get_close_matches(name[:300], names, n=3, cutoff=0.8)
            if close:
                known = f"did you mean {' or '.join(short_repr(n, 60) for n in close)}? {known}"
    raise InvalidInput("subscriber", f"no subscriber {short_repr(name)} is registered; {known}")


def _aware(value: Any, where: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidInput(where, f"must be an aware datetime, not {short_repr(value)}")
    if utc_offset(value, where, InvalidInput) is None:
        raise InvalidInput(
            where, f"{value.isoformat()} has no time zone: give an aware datetime (tzinfo=UTC)"
        )
    return checked_moment(value, where, InvalidInput)


def _replay_window(
    subscriber: Any, since: Any, until: Any
) -> tuple[tuple[str, ...], datetime, datetime | None]:
    event_types = subscriber_event_types(subscriber)
    start = _aware(since, "since")
    end = None if until is None else _aware(until, "until")
    if end is not None and end <= start:
        raise InvalidInput("until", f"{end.isoformat()} must be after since, {start.isoformat()}")
    return event_types, start, end


def events_to_replay(
    subscriber: str,
    *,
    since: datetime,
    until: datetime | None = None,
    using: str | None = None,
) -> QuerySet[OutboxEvent]:
    """The events that :func:`replay_events` would give ``subscriber`` now, as a queryset (to
    count before acting); raises as it does."""
    event_types, start, end = _replay_window(subscriber, since, until)
    events = OutboxEvent.objects.using(using or router.db_for_write(Job)).filter(
        event_type__in=event_types,
        occurred_at__gte=start,
        processed_at__isnull=False,
        dead_at__isnull=True,
    )
    if end is not None:
        events = events.filter(occurred_at__lt=end)
    delivered = OutboxDelivery.objects.filter(event=OuterRef("pk"), subscriber=subscriber)
    return events.filter(~Exists(delivered))


def replay_events(
    subscriber: str,
    *,
    since: datetime,
    until: datetime | None = None,
    using: str | None = None,
    batch: int = 10_000,
) -> int:
    """Give the subscriber ``subscriber`` the processed events of its types that occurred at or
    after ``since`` (and before ``until``, if given): one waiting delivery each, in the events'
    order, which the relay then delivers as it does a failed subscriber's. Returns how many it
    wrote.

    For a subscriber added after the events were processed: the relay ran the subscribers of
    the time, and keeps no record of who ran on the fast path, so a subscriber that existed then
    would run again on them. An event that has a delivery of that subscriber already is left as
    it is, so a second replay writes nothing twice; so is a discarded event (never projected).
    ``batch`` events a statement, each committed on its own unless the caller's transaction
    holds them.

    Raises ``InvalidInput`` (a ``ValueError``) naming the argument: a subscriber this process
    does not register, a ``since`` or ``until`` that is not an aware datetime, an ``until`` not
    after ``since``, a ``batch`` under 1.
    """
    event_types, start, end = _replay_window(subscriber, since, until)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidInput("batch", f"must be an integer >= 1, not {short_repr(batch)}")
    alias = using or router.db_for_write(Job)
    params: dict[str, Any] = {
        "subscriber": subscriber,
        "event_types": list(event_types),
        "since": start,
        "until": end,
        "after_at": None,
        "after_id": None,
        "limit": batch,
    }
    total = 0
    with connections[alias].cursor() as cursor:
        while True:
            cursor.execute(queries.REPLAY_EVENTS, params)
            row = cursor.fetchone()
            if row is None:  # no event left past the last batch
                return total
            written, params["after_at"], params["after_id"] = row
            total += int(written)
