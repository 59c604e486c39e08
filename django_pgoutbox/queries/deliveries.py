"""Per-subscriber deliveries: the subscribers of an event that could not run with the others.

An event whose subscribers all run at once, in the relay's batch, leaves no row in
``outbox_deliveries`` (the fast path). When one of them fails, refuses the event's schema version,
or has an earlier delivery of the same aggregate still waiting, the relay writes a delivery for
that subscriber alone (WRITE_DELIVERIES) in the transaction that marks the event processed, and
the others' work commits. Deliveries are then claimed (CLAIM_DELIVERIES), fenced
(LOCK_CLAIMED_DELIVERIES) and finished (MARK_DELIVERED, RECORD_DELIVERY_FAILURES) like events:
the first undelivered delivery of each (aggregate, subscriber) only, so that each subscriber sees
an aggregate's events in order, and a dead one holds back that subscriber's later ones, never
another subscriber's.
"""

from __future__ import annotations

from django_pgoutbox.queries.params import binary


def waiting_subscribers(alias: str) -> str:
    """Which subscribers have an undelivered delivery of the aggregate of ``{alias}``: a column
    of the relay's claims (text[], empty when none). Such a subscriber does not run on the
    claimed event: its delivery of it waits behind the earlier one.

    A skip scan of ``outbox_deliveries_order_idx``: one probe per distinct subscriber, plus one.
    So an aggregate with ten thousand deliveries waiting behind a dead one costs as few probes as
    it has waiting subscribers, not a read of all ten thousand (``SELECT DISTINCT`` would). An
    ``EXISTS`` probe first: the fast path (no delivery at all) costs that one probe per claimed
    event, without the recursive scan's set-up (a claim of 500 events over 20,000 took 14.6 ms
    without the column, 16.1 with the scan alone, 15.0 with the probe first: medians of 15).
    """
    same = f"""w.aggregate_type = {alias}.aggregate_type
                  AND w.aggregate_id = {alias}.aggregate_id
                  AND w.delivered_at IS NULL"""
    order = "ORDER BY w.aggregate_type, w.aggregate_id, w.subscriber LIMIT 1"
    return f"""CASE WHEN EXISTS (
           SELECT 1 FROM outbox_deliveries AS w WHERE {same}
       ) THEN ARRAY(
           WITH RECURSIVE waiting(subscriber) AS (
               (SELECT w.subscriber FROM outbox_deliveries AS w
                WHERE {same}
                {order})
               UNION ALL
               SELECT (SELECT w.subscriber FROM outbox_deliveries AS w
                       WHERE {same} AND w.subscriber > waiting.subscriber
                       {order})
               FROM waiting
               WHERE waiting.subscriber IS NOT NULL
           )
           SELECT subscriber FROM waiting WHERE subscriber IS NOT NULL
       ) ELSE '{{}}'::text[] END"""


def heads_its_subscriber_aggregate(alias: str) -> str:
    """The condition that the delivery ``alias`` is the first undelivered one of its (aggregate,
    subscriber), in ``(occurred_at, event_id)`` order: one probe of ``outbox_deliveries_order_idx``.
    CLAIM_DELIVERIES claims only such deliveries (this text, with ``d``); the gauges call one
    abandoned by the same rule."""
    return f"""{alias}.id = (
          SELECT head.id
          FROM outbox_deliveries AS head
          WHERE head.aggregate_type = {alias}.aggregate_type
            AND head.aggregate_id = {alias}.aggregate_id
            AND head.subscriber = {alias}.subscriber
            AND head.delivered_at IS NULL
          ORDER BY head.occurred_at, head.event_id
          LIMIT 1
      )"""


#: Write deliveries of projected events, in the relay's transaction that marks them processed.
#:
#: Named parameters (binary): ids uuid[] (events), subscribers text[], attempts int[], delays
#: float8[] (seconds until due), dead boolean[], codes text[], errors text[] (NULL: a delivery
#: waiting behind an earlier one, not failed).
#:
#: The aggregate and ``occurred_at`` are copied from the event: the order of a subscriber's
#: deliveries. A delivery that exists already (an operator's replay) is left as it is.
WRITE_DELIVERIES = binary(
    """
INSERT INTO outbox_deliveries (
    event_id, subscriber, aggregate_type, aggregate_id, occurred_at, attempts, available_at,
    dead_at, last_error_code, last_error
)
SELECT d.event_id, d.subscriber, e.aggregate_type, e.aggregate_id, e.occurred_at, d.attempts,
       now() + make_interval(secs => d.delay), CASE WHEN d.dead THEN now() END, d.code, d.error
FROM unnest(
    %(ids)s::uuid[], %(subscribers)s::text[], %(attempts)s::int[], %(delays)s::float8[],
    %(dead)s::boolean[], %(codes)s::text[], %(errors)s::text[]
) AS d(event_id, subscriber, attempts, delay, dead, code, error)
JOIN outbox_events AS e ON e.id = d.event_id
ORDER BY e.occurred_at, e.id, d.subscriber
ON CONFLICT (event_id, subscriber) DO NOTHING
"""
)

#: Claim a bounded batch of due deliveries.
#:
#: Named parameters: claim_seconds float, limit int, max_attempts int, relay_id text,
#: crashed_code text, summary text, dead_summary text: CLAIM_EVENTS's, with the same meaning.
#:
#: Due, not dead, not delivered, not claimed (or its claim expired), and the first undelivered
#: delivery of its (aggregate, subscriber): a dead one holds back that subscriber's later
#: deliveries of the aggregate. A delivery taken over (its claim expired unfinished: its relay
#: died, perhaps because of it) is counted an attempt here and run alone, as CLAIM_EVENTS does
#: with an event; at most one per claim (``attempts`` stops at the largest 32-bit integer, as
#: CLAIM_EVENTS's). Returns the event's columns with each delivery.
#:
#: ``idle_in_transaction_session_timeout`` is 3 s for its transaction, for the reason
#: CLAIM_EVENTS_PLAN gives: the rows it claims stay locked until the COMMIT, a round trip later.
#: Set in the UPDATE's join (one row), which runs whenever a row is claimed.
CLAIM_DELIVERIES = """
WITH candidates AS MATERIALIZED (
    SELECT d.id, d.claimed_at IS NOT NULL AS reclaimed, d.claimed_by AS holder, d.attempts,
           d.available_at
    FROM outbox_deliveries AS d
    WHERE d.delivered_at IS NULL
      AND d.dead_at IS NULL
      AND d.available_at <= now()
      AND (d.claimed_at IS NULL OR d.claimed_at < now() - make_interval(secs => %(claim_seconds)s))
      AND d.id = (
          SELECT head.id
          FROM outbox_deliveries AS head
          WHERE head.aggregate_type = d.aggregate_type
            AND head.aggregate_id = d.aggregate_id
            AND head.subscriber = d.subscriber
            AND head.delivered_at IS NULL
          ORDER BY head.occurred_at, head.event_id
          LIMIT 1
      )
    ORDER BY d.available_at, d.id
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
     ORDER BY attempts, available_at, id
     LIMIT 1)
)
UPDATE outbox_deliveries AS o
SET claimed_at = CASE WHEN c.spent THEN NULL ELSE now() END,
    claimed_by = %(relay_id)s,
    attempts = o.attempts + (c.reclaimed AND o.attempts < 2147483647)::int,
    dead_at = CASE WHEN c.spent THEN now() END,
    last_error_code = CASE WHEN c.reclaimed THEN %(crashed_code)s ELSE o.last_error_code END,
    last_error = CASE WHEN c.reclaimed
                      THEN CASE WHEN c.spent THEN %(dead_summary)s ELSE %(summary)s END
                           || coalesce(' (last held by ' || left(c.holder, 200) || ')', '')
                      ELSE o.last_error END
FROM chosen AS c, outbox_events AS e,
     (SELECT set_config('idle_in_transaction_session_timeout', '3s', true)) AS idle
WHERE o.id = c.id AND e.id = o.event_id
RETURNING o.id, o.subscriber, o.attempts, o.claimed_at, c.reclaimed, c.spent,
          e.id, e.organization_id, e.aggregate_type, e.aggregate_id, e.event_type,
          e.schema_version, e.payload::text, e.occurred_at, e.available_at, e.attempts,
          e.trace_context
"""

#: Lock the claimed deliveries this relay still holds: the fence, as LOCK_CLAIMED_EVENTS, and
#: the same ``idle_in_transaction_session_timeout`` for the transaction (its subscribers run
#: between the relay's statements; see there).
#:
#: Parameters (binary): idle text, ids bigint[], claimed_at timestamptz[], relay_id text.
LOCK_CLAIMED_DELIVERIES = binary(
    """
SELECT o.id
FROM (SELECT set_config('idle_in_transaction_session_timeout', %s::text, true)) AS idle,
     unnest(%s::bigint[], %s::timestamptz[]) AS c(id, claimed_at)
CROSS JOIN LATERAL (
    SELECT d.id
    FROM outbox_deliveries AS d
    WHERE d.id = c.id
      AND d.claimed_at = c.claimed_at
      AND d.claimed_by = %s
      AND d.delivered_at IS NULL
    FOR UPDATE
) AS o
"""
)

#: Mark deliveries done, in the transaction that committed what their subscriber wrote.
#:
#: Parameters (binary): ids bigint[].
MARK_DELIVERED = binary(
    """
UPDATE outbox_deliveries
SET delivered_at = now(), claimed_at = NULL
WHERE id = ANY(%s::bigint[])
"""
)

#: Record failed deliveries: retry later (back-off) or dead.
#:
#: Named parameters (binary): ids bigint[], dead boolean[], delays float8[], codes text[],
#: errors text[], counted boolean[].
#:
#: Counts the failure, unless the claim counted this run already (``counted``: a delivery taken
#: over), and releases the claim, so that the retry does not wait for it to expire. ``attempts``
#: stops at the largest 32-bit integer (a row written by hand) rather than fail the statement.
RECORD_DELIVERY_FAILURES = binary(
    """
UPDATE outbox_deliveries AS o
SET attempts = o.attempts + (NOT f.counted AND o.attempts < 2147483647)::int,
    available_at = CASE WHEN f.dead THEN o.available_at
                        ELSE now() + make_interval(secs => f.delay) END,
    dead_at = CASE WHEN f.dead THEN now() END,
    claimed_at = NULL,
    last_error_code = f.code,
    last_error = f.error
FROM unnest(
    %(ids)s::bigint[], %(dead)s::boolean[], %(delays)s::float8[], %(codes)s::text[],
    %(errors)s::text[], %(counted)s::boolean[]
) AS f(id, dead, delay, code, error, counted)
WHERE o.id = f.id
"""
)

# -- operators -------------------------------------------------------------------------------------
# Each takes ids bigint[] and touches only rows that are dead right now.

#: Make dead deliveries due again, with a fresh attempt budget.
REDRIVE_DEAD_DELIVERIES = """
UPDATE outbox_deliveries
SET dead_at = NULL, attempts = 0, available_at = now(), claimed_at = NULL, claimed_by = NULL
WHERE id = ANY(%s::bigint[]) AND dead_at IS NOT NULL AND delivered_at IS NULL
"""

#: Give up on dead deliveries: marked delivered without running, so that their subscriber's
#: later deliveries of the aggregate go on.
DISCARD_DEAD_DELIVERIES = """
UPDATE outbox_deliveries
SET delivered_at = now(), claimed_at = NULL,
    last_error = left('discarded by an operator; ' || coalesce(last_error, ''), 1000)
WHERE id = ANY(%s::bigint[]) AND dead_at IS NOT NULL AND delivered_at IS NULL
"""

#: Give a subscriber the events it never saw: one waiting delivery per event of the given types
#: that occurred at or after ``since`` and was processed without that subscriber (no delivery of
#: it yet), in event order, at most ``limit`` events past ``(after_at, after_id)`` a statement.
#: A discarded event (processed, its ``dead_at`` kept) is no fact that any subscriber saw: left
#: out.
#:
#: Named parameters: subscriber text, event_types text[], since timestamptz, until timestamptz
#: (NULL: no bound), after_at timestamptz and after_id uuid (NULL: from ``since``; else the last
#: row of the previous batch), limit int. Returns one row, (written, last occurred_at, last id),
#: the last of the events read, whether written or not; no row when none was left to read.
#:
#: An event that has a delivery of that subscriber already (a replay that ran before, a failure)
#: is read and left as it is: the keyset moves past it, so that a batch of such events does not
#: stop the replay, nor does the next batch read the same events again.
REPLAY_EVENTS = """
WITH chosen AS MATERIALIZED (
    SELECT e.id, e.aggregate_type, e.aggregate_id, e.occurred_at
    FROM outbox_events AS e
    WHERE e.event_type = ANY(%(event_types)s::text[])
      AND e.occurred_at >= %(since)s::timestamptz
      AND (%(until)s::timestamptz IS NULL OR e.occurred_at < %(until)s::timestamptz)
      AND (%(after_at)s::timestamptz IS NULL
           OR (e.occurred_at, e.id) > (%(after_at)s::timestamptz, %(after_id)s::uuid))
      AND e.processed_at IS NOT NULL
      AND e.dead_at IS NULL
    ORDER BY e.occurred_at, e.id
    LIMIT %(limit)s
),
written AS (
    INSERT INTO outbox_deliveries (
        event_id, subscriber, aggregate_type, aggregate_id, occurred_at, attempts
    )
    SELECT c.id, %(subscriber)s, c.aggregate_type, c.aggregate_id, c.occurred_at, 0
    FROM chosen AS c
    ORDER BY c.occurred_at, c.id
    ON CONFLICT (event_id, subscriber) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM written), last.occurred_at, last.id
FROM (SELECT occurred_at, id FROM chosen ORDER BY occurred_at DESC, id DESC LIMIT 1) AS last
"""

#: The subscribers that have undelivered deliveries, in order, at most ``%s`` of them: a loose
#: scan of ``outbox_deliveries_sub_idx``, one index descent per subscriber (the admin's filter).
DELIVERY_SUBSCRIBERS = """
WITH RECURSIVE subscribers (subscriber) AS (
    (SELECT subscriber FROM outbox_deliveries
     WHERE delivered_at IS NULL
     ORDER BY subscriber LIMIT 1)
    UNION ALL
    SELECT (
        SELECT d.subscriber FROM outbox_deliveries AS d
        WHERE d.delivered_at IS NULL AND d.subscriber > subscribers.subscriber
        ORDER BY d.subscriber
        LIMIT 1
    )
    FROM subscribers
    WHERE subscribers.subscriber IS NOT NULL
)
SELECT subscriber FROM subscribers WHERE subscriber IS NOT NULL LIMIT %s
"""
