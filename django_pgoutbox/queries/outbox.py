"""The outbox: publishing a fact, and the relay's claim, fence and outcomes."""

from __future__ import annotations

from django_pgoutbox.queries.deliveries import waiting_subscribers
from django_pgoutbox.queries.params import binary

#: Write one fact in the caller's transaction, and say so at commit.
#:
#: Named parameters: id uuid, organization_id uuid, aggregate_type text, aggregate_id uuid,
#: event_type text, schema_version int, payload text (JSON), occurred_at timestamptz (NULL =
#: now()), available_at timestamptz (NULL = now()), trace_context text (JSON, or NULL: no span
#: was recording), notify boolean, channel text.
#:
#: ``pg_notify`` runs in the same statement, inside the caller's transaction: the relay hears of
#: the event only once it is committed, and never after a rollback. ``occurred_at`` defaults to
#: ``now()``, the start of the business transaction, as the source text's example writes it.
PUBLISH_EVENT = """
INSERT INTO outbox_events (
    id, organization_id, aggregate_type, aggregate_id, event_type, schema_version, payload,
    occurred_at, available_at, trace_context
)
VALUES (
    %(id)s, %(organization_id)s, %(aggregate_type)s, %(aggregate_id)s, %(event_type)s,
    %(schema_version)s, %(payload)s::jsonb, COALESCE(%(occurred_at)s, now()),
    COALESCE(%(available_at)s, now()), %(trace_context)s::jsonb
)
RETURNING occurred_at, available_at,
          CASE WHEN %(notify)s THEN pg_notify(%(channel)s, left(event_type, 200))::text END
"""

#: Run before CLAIM_EVENTS, in its transaction: the plan the claim is written for. The planner
#: cannot know that most unprocessed events head their aggregate, so it costs the claim as a scan of
#: the whole backlog. Two consequences (docs/benchmarks.md, "What profiling found", item 10): past
#: ``jit_above_cost`` (PostgreSQL's default: JIT on, above 100,000), each claim spent longer
#: compiling its plan than running it; and with statistics from a fuller backlog it preferred to
#: read every waiting event (a sequential or bitmap scan), check each one's aggregate, then sort, to
#: walking ``outbox_claim_idx`` in order until the batch is full.
#:
#: And ``idle_in_transaction_session_timeout`` of 3 s for this transaction: the claim locks the
#: rows it takes (``FOR UPDATE``) until its COMMIT, a round trip later, and the relay runs
#: nothing between its statements. A relay cut off from the server between them (a network
#: partition, its host gone, no RST) would otherwise keep those rows locked, so that every other
#: relay's claim skipped them (``SKIP LOCKED``), until the partition heals or the server's TCP
#: keepalive gives up (two hours by default); the server ends its session instead.
CLAIM_EVENTS_PLAN = (
    "SELECT set_config('jit', 'off', true), set_config('enable_seqscan', 'off', true),"
    " set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true),"
    " set_config('idle_in_transaction_session_timeout', '3s', true)"
)


def heads_its_aggregate(alias: str) -> str:
    """The condition that the event ``alias`` is the first unprocessed one of its aggregate, in
    ``(occurred_at, id)`` order: the relay claims only such events (one probe of
    ``outbox_aggregate_pending_idx``), and the gauges call an event abandoned by the same rule."""
    return f"""{alias}.id = (
          SELECT head.id
          FROM outbox_events AS head
          WHERE head.aggregate_type = {alias}.aggregate_type
            AND head.aggregate_id = {alias}.aggregate_id
            AND head.processed_at IS NULL
          ORDER BY head.occurred_at, head.id
          LIMIT 1
      )"""


#: Claim a bounded batch of events to project: the source text's claim, plus order.
#:
#: Named parameters: claim_seconds float, limit int, max_attempts int, relay_id text,
#: crashed_code text, summary text (a reclaimed event, retrying), dead_summary text (dead).
#:
#: As in the source text: unprocessed, available, and not claimed (or claimed longer ago than
#: the claim lasts: a relay that died is taken over), oldest first, ``FOR UPDATE SKIP LOCKED``.
#: Two additions: dead events are never claimed, and only the *earliest* unprocessed event of
#: each aggregate is claimable, so that the events of one aggregate are projected one at a time,
#: in ``(occurred_at, id)`` order, however many relays run.
#:
#: A claim counts no attempt (an event's ``attempts`` counts the relays that died under it: a
#: subscriber's failure is its delivery's, in ``outbox_deliveries``), except a claim *taken
#: over*: an event whose last claim expired unfinished (only a projection clears
#: ``claimed_at``; RELEASE_EXPIRED_EVENT_CLAIMS keeps it) was held
#: by a relay that died or stalled, perhaps because of that very event (a
#: subscriber's ``os._exit()``, a crash in native code, the OOM killer). Such a *suspect* is
#: counted here, in the claim, before any subscriber of it runs, with ``relay_crashed`` as its
#: last error, and dead once that count reaches ``MAX_ATTEMPTS`` (the count stops at the largest
#: 32-bit integer: a row written so by hand fails no claim). At most one suspect is claimed
#: per batch (``reclaimed`` says which), the one that has cost the fewest attempts: the relay
#: projects it alone, so a relay that dies under it next time takes no other event down with it,
#: and the events reclaimed beside it, untouched here, keep their count until their own turn.
#: The ``claimed_at`` returned is the fencing token of the claim. The last column names the
#: subscribers with an undelivered delivery of the event's aggregate (``outbox_deliveries``):
#: they do not run on it, their delivery of it waits behind the earlier one.
#:
#: Plan: ``outbox_claim_idx`` yields candidates in order, and the scan stops at ``LIMIT``; for each
#: candidate, the head of its aggregate is one probe of ``outbox_aggregate_pending_idx``. A
#: ``NOT EXISTS (earlier event)`` form reads the same, but PostgreSQL plans it as a hash anti join
#: over the whole backlog (docs/benchmarks.md, "What profiling found", item 10). The CTE is
#: MATERIALIZED so that ``LIMIT`` and the locks apply once, as in CLAIM_JOBS.
#:
#: ``{past_the_mark}`` is empty here; SEEK_CLAIM_EVENTS bounds the scan with it.
_CLAIM_EVENTS = """
WITH candidates AS MATERIALIZED (
    SELECT e.id, e.claimed_at IS NOT NULL AS reclaimed, e.claimed_by AS holder, e.attempts,
           e.occurred_at
    FROM outbox_events AS e
    WHERE e.processed_at IS NULL
      AND e.dead_at IS NULL
      AND e.available_at <= now()
      AND (e.claimed_at IS NULL OR e.claimed_at < now() - make_interval(secs => %(claim_seconds)s))
{past_the_mark}      AND {heads_its_aggregate}
    ORDER BY e.occurred_at, e.id
    FOR UPDATE SKIP LOCKED
    LIMIT %(limit)s
),
chosen AS (
    SELECT id, false AS reclaimed, false AS spent, NULL::text AS holder
    FROM candidates
    WHERE NOT reclaimed
    UNION ALL
    (SELECT id, true, attempts >= %(max_attempts)s - 1, holder
     FROM candidates
     WHERE reclaimed
     ORDER BY attempts, occurred_at, id
     LIMIT 1)
)
UPDATE outbox_events AS o
SET claimed_at = CASE WHEN c.spent THEN NULL ELSE now() END,
    claimed_by = %(relay_id)s,
    attempts = o.attempts + (c.reclaimed AND o.attempts < 2147483647)::int,
    dead_at = CASE WHEN c.spent THEN now() END,
    last_error_code = CASE WHEN c.reclaimed THEN %(crashed_code)s ELSE o.last_error_code END,
    last_error = CASE WHEN c.reclaimed
                      THEN CASE WHEN c.spent THEN %(dead_summary)s ELSE %(summary)s END
                           || coalesce(' (last held by ' || left(c.holder, 200) || ')', '')
                      ELSE o.last_error END
FROM chosen AS c
WHERE o.id = c.id
RETURNING o.id, o.organization_id, o.aggregate_type, o.aggregate_id, o.event_type,
          o.schema_version, o.payload::text, o.occurred_at, o.available_at, o.attempts,
          o.trace_context, o.claimed_at, c.reclaimed, c.spent, {waiting_subscribers}
"""
#: The full claim: _CLAIM_EVENTS from the start of ``outbox_claim_idx`` (its comment says all).
CLAIM_EVENTS = _CLAIM_EVENTS.format(
    past_the_mark="",
    heads_its_aggregate=heads_its_aggregate("e"),
    waiting_subscribers=waiting_subscribers("o"),
)

# -- the seek claim (issue 31) ---------------------------------------------------------------------
#
# With a transaction holding the xmin horizon, every projected event leaves a dead entry in
# ``outbox_claim_idx`` (MARK_EVENTS_PROCESSED takes it out of the index's predicate) that neither
# vacuum nor the index's hints can remove: CLAIM_EVENTS steps over all of them, one heap visit
# each, before the first live event. The seek claim starts at a *mark* instead: the
# ``(occurred_at, id)`` of the *first* event the relay's last claim took. It starts there, not past
# the last event, because the events that claim skipped for not heading their aggregate (the next
# event of an aggregate whose earlier one it took) sort after that first event: once the batch is
# projected, they head their aggregates and the next seek takes them. So the scan crosses about one
# batch of dead entries (the last one's, and what other relays took since), however long the horizon
# is held. Everything else that becomes claimable behind the mark (a retry whose ``available_at``
# passed, an event a late-committing transaction published with an older ``occurred_at``, a claim
# taken over, a re-driven dead event, the next event of an aggregate held by another relay) is the
# full claim's (CLAIM_EVENTS): the relay runs it at least every few tenths of a second and whenever
# the seek comes back short or a publication wakes it, within a time budget (``SeekPolicy``).
#
# The order of an aggregate's events is the same check as CLAIM_EVENTS's: the mark only narrows
# the candidates, each one is still claimed only if it heads its aggregate.

#: CLAIM_EVENTS from the mark on. Named parameters: CLAIM_EVENTS's, and mark_occurred_at
#: timestamptz, mark_id uuid. ``(occurred_at, id) >= (mark)`` is a bound of the scan of
#: ``outbox_claim_idx``, which is ordered by that very key.
SEEK_CLAIM_EVENTS = _CLAIM_EVENTS.format(
    heads_its_aggregate=heads_its_aggregate("e"),
    waiting_subscribers=waiting_subscribers("o"),
    past_the_mark="      AND (e.occurred_at, e.id) >= (%(mark_occurred_at)s, %(mark_id)s)\n",
)

# LOCK_CLAIMED_EVENTS and MARK_EVENTS_PROCESSED take arrays of a batch's
# ids, sent in binary (``%b``, run with ``db.server_side_cursor``): quoting each UUID into the SQL
# text was a large part of a batch (docs/benchmarks.md, "What profiling found", item 10).

#: Lock the claimed events this relay still holds, at the start of the projecting transaction.
#:
#: Parameters: idle text (an ``idle_in_transaction_session_timeout``), ids uuid[],
#: claimed_at timestamptz[], relay_id text.
#:
#: The fence of the outbox: an event whose claim expired and was taken over by another relay
#: (its ``claimed_at`` moved on: each claim is a transaction of its own, with its own ``now()``)
#: is not returned, and is skipped; the lock keeps any other relay from claiming these rows
#: until this transaction ends.
#:
#: It also sets ``idle_in_transaction_session_timeout`` for the transaction to ``idle``: the
#: relay's ``CLAIM_SECONDS``, 3 s at least (``deliveries.idle_bound``). The subscribers run
#: between the relay's statements, so the transaction waits on the relay for as long as they
#: take; a relay cut off from the server there (a network partition, no RST) would keep the
#: events locked, and no other relay could take them over, until the partition heals or the
#: server's TCP keepalive gives up (two hours by default). Not a fixed few seconds: a
#: subscriber may work that long without a statement. After ``CLAIM_SECONDS`` of silence the
#: claim has expired anyway (it was taken before the transaction began), so another relay may
#: take the events over: the server ends the session then, and the lock goes with it.
#:
#: Each id is looked up by the primary key (``LATERAL``): as a join, the planner, trusting
#: statistics in which ``claimed_by`` is nearly always NULL, compared every claimed row with
#: every id (docs/benchmarks.md, "What profiling found", item 10).
LOCK_CLAIMED_EVENTS = binary(
    """
SELECT o.id
FROM (SELECT set_config('idle_in_transaction_session_timeout', %s::text, true)) AS idle,
     unnest(%s::uuid[], %s::timestamptz[]) AS c(id, claimed_at)
CROSS JOIN LATERAL (
    SELECT e.id
    FROM outbox_events AS e
    WHERE e.id = c.id
      AND e.claimed_at = c.claimed_at
      AND e.claimed_by = %s
      AND e.processed_at IS NULL
    FOR UPDATE
) AS o
"""
)

#: Mark events projected, in the transaction that committed what their subscribers wrote.
#:
#: Parameters: ids uuid[].
MARK_EVENTS_PROCESSED = binary(
    """
UPDATE outbox_events
SET processed_at = now(), claimed_at = NULL
WHERE id = ANY(%s::uuid[])
"""
)
