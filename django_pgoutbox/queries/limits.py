"""The fair and limited claims: the queue's lock, its allowance, its tokens and the
per-organization claim.

A queue with FAIR, MAX_RUNNING or RATE_LIMIT claims through these instead of CLAIM_JOBS. Limits
are enforced in the database, so they hold across every worker on every host: the claim runs in
a short transaction that first takes the queue's advisory lock (CLAIM_LOCK), so that claims of
the queue are serialized, and every later statement of it starts after the previous claimer
committed and sees its leases and its tokens. ``statement_timestamp()`` rather than ``now()``
for the same reason: ``now()`` is the start of the transaction, before the lock was granted.
"""

from __future__ import annotations

from django_pgoutbox.queries.claims import CLAIM_RETURNING

#: Serialize the claims of one queue across every worker, until the transaction ends.
#: Parameters: queue text.
#:
#: With ``idle_in_transaction_session_timeout`` of 3 s for the transaction: the claim's
#: statements follow each other in milliseconds, each a round trip, the lock held across them.
#: A worker cut off from the server between two of them (a network partition, its host gone,
#: no RST) would otherwise keep the lock, and every other worker's claim of the queue would
#: wait for it, until the partition heals or the server's TCP keepalive gives up (two hours by
#: default); the server ends its session instead, and the lock goes with it.
CLAIM_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('pgoutbox.claim:' || %s, 0))"
    " FROM (SELECT set_config('idle_in_transaction_session_timeout', '3s', true)) AS timeout"
)

#: A queue-wide limit's allowance: jobs of the queue running now, and the tokens of its bucket.
#:
#: Named parameters: queue text, rate float8 (jobs/s, or NULL), burst float8.
#: Tokens refill at ``rate`` per second of the database clock up to ``burst``; a bucket that
#: does not exist yet is full.
QUEUE_ALLOWANCE = """
SELECT (SELECT count(*) FROM jobs WHERE queue = %(queue)s AND status = 'leased'),
       (SELECT least(%(rate)s::float8 * extract(epoch FROM statement_timestamp() - updated_at)
                     + tokens, %(burst)s::float8)
        FROM rate_limit_buckets WHERE key = %(queue)s)
"""

#: Take the tokens that a claim used from the buckets it used, creating them full first.
#:
#: Named parameters: keys text[], counts int[], rate float8, burst float8.
#: The inserted row's ``tokens`` is ``burst - count`` (a new bucket starts full); on conflict the
#: count is recovered as ``burst - EXCLUDED.tokens`` and taken from the refilled bucket.
TAKE_TOKENS = """
INSERT INTO rate_limit_buckets AS b (key, tokens, updated_at)
SELECT c.key, %(burst)s::float8 - c.n, statement_timestamp()
FROM unnest(%(keys)s::text[], %(counts)s::integer[]) AS c(key, n)
ON CONFLICT (key) DO UPDATE
SET tokens = least(b.tokens + %(rate)s::float8
                   * extract(epoch FROM statement_timestamp() - b.updated_at), %(burst)s::float8)
             - (%(burst)s::float8 - EXCLUDED.tokens),
    updated_at = statement_timestamp()
"""

# One organization's (or the organization-less jobs') first claimable jobs, in claim order, up
# to its allowance. ``{match}`` is ``= a.org`` or ``IS NULL``: both are index conditions of
# ``jobs_fair_claim_idx``, where a single ``IS NOT DISTINCT FROM`` would not be. A job's turn
# counts the jobs its organization already has running: the first job of an organization with
# three running comes after the first two of an organization with one. The inner ``LIMIT`` is
# the constant claim limit and the allowance is applied outside it: with a constant, the planner
# expects a few rows per organization and joins them back to ``jobs`` by primary key; with the
# allowance as the limit it guessed thousands and chose to hash the whole table.
_FAIR_BRANCH = """
    SELECT c.id, c.priority, c.run_at, c.created_at, a.running + c.place AS turn
    FROM allowed AS a,
    LATERAL (
        SELECT j.id, j.priority, j.run_at, j.created_at,
               row_number() OVER (
                   ORDER BY j.priority DESC, j.run_at, j.created_at, j.id) AS place
        FROM jobs AS j
        WHERE j.queue = %(queue)s
          AND j.organization_id {match}
          AND j.status IN ('pending', 'retrying')
          AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.created_at, j.id
        LIMIT %(limit)s
    ) AS c
    WHERE a.org {where}
      AND c.place <= a.allowance
"""

# Each organization's allowance: the claim's limit, cut by MAX_RUNNING minus its running jobs
# and by the whole tokens of its RATE_LIMIT bucket when the limits apply per organization.
_ORG_ALLOWANCE = """
    least(
        %(limit)s::integer,
        CASE WHEN %(max_running)s::integer IS NULL THEN %(limit)s::integer
             ELSE %(max_running)s::integer - coalesce(r.n, 0)
        END,
        CASE WHEN %(rate)s::float8 IS NULL THEN %(limit)s::integer
             ELSE floor(coalesce(
                 least(b.tokens + %(rate)s::float8
                       * extract(epoch FROM statement_timestamp() - b.updated_at), %(burst)s),
                 %(burst)s))::integer
        END
    )
"""

#: The fair (or per-organization limited) claim. Named parameters: queue, limit, worker_id,
#: lease, max_running (per organization, or NULL), rate and burst (per organization, or NULL).
#:
#: 1. ``orgs``: a loose index scan over ``jobs_fair_claim_idx`` lists the organizations that
#:    have claimable jobs, one index probe each, however many jobs each holds; the jobs without
#:    an organization form one more group. ``running`` counts each group's leased jobs.
#: 2. ``ranked``: each group's first jobs in claim order, up to its allowance, with their turn:
#:    the group's running jobs plus the job's place in the group.
#: 3. ``candidates``: the best ``limit`` of those, ordered by turn first when FAIR, so that a
#:    free slot goes to the organization with the fewest jobs running (the oldest head job
#:    breaks ties). ``FOR UPDATE SKIP LOCKED`` sits under the ``LIMIT``: rows are locked one by
#:    one in that order, and only ``limit`` of them.
#:
#: The per-organization bucket key is ``queue/organization`` (``queue/none`` without one).
FAIR_CLAIM_TEMPLATE = """
WITH RECURSIVE orgs(org) AS (
    (SELECT organization_id FROM jobs
     WHERE queue = %(queue)s AND status IN ('pending', 'retrying')
       AND organization_id IS NOT NULL
     ORDER BY organization_id LIMIT 1)
    UNION ALL
    SELECT (SELECT j.organization_id FROM jobs AS j
            WHERE j.queue = %(queue)s AND j.status IN ('pending', 'retrying')
              AND j.organization_id > o.org
            ORDER BY j.organization_id LIMIT 1)
    FROM orgs AS o
    WHERE o.org IS NOT NULL
),
running AS (
    SELECT coalesce(organization_id::text, 'none') AS org_key, count(*)::integer AS n
    FROM jobs
    WHERE queue = %(queue)s AND status = 'leased'
    GROUP BY 1
),
allowed AS (
    SELECT g.org, coalesce(r.n, 0) AS running, {allowance} AS allowance
    FROM (SELECT org FROM orgs WHERE org IS NOT NULL UNION ALL SELECT NULL::uuid) AS g
    LEFT JOIN running AS r ON r.org_key = coalesce(g.org::text, 'none')
    LEFT JOIN rate_limit_buckets AS b
        ON b.key = %(queue)s || '/' || coalesce(g.org::text, 'none')
),
ranked AS (
    {organization_branch}
    UNION ALL
    {null_branch}
),
candidates AS MATERIALIZED (
    SELECT j.id
    FROM ranked AS r
    JOIN jobs AS j ON j.id = r.id
    WHERE j.status IN ('pending', 'retrying') AND j.run_at <= now()
    ORDER BY {order}
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE jobs AS j
SET status = 'leased',
    locked_at = now(),
    locked_by = %(worker_id)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    attempts = least(j.attempts, 2147483646) + 1,  -- a row at the int4 limit fails no claim
    worker_ids = j.worker_ids || jsonb_build_array(%(worker_id)s::text),
    alone_attempt = NULL
FROM candidates AS c
WHERE j.id = c.id
RETURNING {returning}
"""


#: Run before FAIR_CLAIM in its transaction. However the per-organization lists are written, the
#: planner cannot know they hold a few rows each (it assumes a hundred organizations and many rows
#: each), and on a small table it prefers to join them back to ``jobs`` by hashing the whole table,
#: which grows with the table (docs/benchmarks.md, "What profiling found", item 7). Without hash and
#: merge joins it probes the primary key for each candidate. ``is_local``: the settings end with the
#: transaction. JIT is off for the reason CLAIM_EVENTS_PLAN gives; and the transaction's
#: ``idle_in_transaction_session_timeout`` is 3 s for the reason CLAIM_LOCK gives (a FAIR queue
#: without limits takes no lock, but the rows it claims stay locked until its COMMIT).
FAIR_PLAN = (
    "SELECT set_config('enable_hashjoin', 'off', true),"
    " set_config('enable_mergejoin', 'off', true),"
    " set_config('jit', 'off', true),"
    " set_config('idle_in_transaction_session_timeout', '3s', true)"
)


def fair_claim(*, fair: bool) -> str:
    """The claim of FAIR_CLAIM_TEMPLATE, ordered by turn first (FAIR) or by priority only."""
    order = "r.priority DESC, r.run_at, r.created_at, r.id"
    return FAIR_CLAIM_TEMPLATE.format(
        allowance=_ORG_ALLOWANCE,
        organization_branch=_FAIR_BRANCH.format(match="= a.org", where="IS NOT NULL"),
        null_branch=_FAIR_BRANCH.format(match="IS NULL", where="IS NULL"),
        order=f"r.turn, {order}" if fair else order,
        returning=CLAIM_RETURNING,
    )


#: The claim of a FAIR queue: a free slot goes to the organization with the fewest jobs running.
FAIR_CLAIM = fair_claim(fair=True)
#: The claim of a queue limited per organization but not FAIR: in priority order only.
ORGANIZATION_LIMITED_CLAIM = fair_claim(fair=False)
