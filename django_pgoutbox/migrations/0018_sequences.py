import importlib

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

# Sequences (docs/uniqueness.md, "Sequences"): a job enqueued with sequence=KEY waits, by an edge
# of job_dependencies (migration 0016), for the job of its key enqueued before it that has not
# finished, so that only the head of each sequence is ever claimable and the claim is unchanged.
# Such a job is 'hold' in on_upstream_failure, a third behaviour beside cancel (NULL) and 'run':
#
# - the end of its parent releases it when the parent completed, or was cancelled after its turn
#   came (waiting_for 0 or NULL: it ran, or was released, then cancelled, or skipped when dead);
# - a dead parent holds it: it stays waiting, until the parent is retried (then completes) or
#   skipped (dead -> cancelled, which 0016's row trigger did not note: it notes it now, 'h', and
#   the statement trigger settles the hold children of such a job only, since cancel and 'run'
#   children counted the death already);
# - a parent cancelled before its turn (still waiting, waiting_for > 0) releases nothing: it
#   passes its turn on when its own parent ends. pgoutbox_settle then takes the cancelled hold
#   job as it takes a waiting one (its waiting_for goes to 0) and settles its children at the next
#   level. Releasing them at the cancel instead would run them beside a job of the key still
#   running; and a cancel never locks the job before it, so no deadlock with that job's end.
#
# Only pgoutbox_settle, pgoutbox_note_settled, pgoutbox_settle_noted and jobs_note_settled's
# WHEN change (CREATE OR REPLACE: no moment without them). A plain workflow's release pays one
# more count and a few CASE branches per child (docs/benchmarks.md, "Sequences").
SEQUENCE_FUNCTIONS = r"""
DO $do$
BEGIN
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION pgoutbox_settle(
    parents uuid[], only_children uuid[], any_failed boolean DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql SET search_path = %1$I SET plan_cache_mode = auto
AS $$
DECLARE
    level uuid[] := parents;
    to_lock uuid[];
    below uuid[];
    cancelling uuid[];
    expanded uuid[] := '{}';
BEGIN
    -- (See migration 0016 for the locking order; hold steps are never cancelled here.) A hold
    -- step cancelled before its turn passes it on a level further, as a cancel cascades: so a
    -- release that reaches one locks its levels first too, in id order (the ids of a sequence
    -- need not grow along it: an enqueue draws its id before the key's lock). The walk may
    -- lock a few rows that the levels then leave as they are: never fewer. Only a job of a
    -- sequence has hold steps behind it: its completion comes as if a parent had failed
    -- (any_failed, from pgoutbox_settle_noted's 's' notes), and a plain workflow's release
    -- reads its edges once, as before. (Reading them a second time for every release cost each
    -- completion of a parent 3 us, a tenth of it.)
    IF coalesce(any_failed, EXISTS (
        SELECT 1 FROM jobs WHERE id = ANY(parents) AND status IN ('dead', 'cancelled')))
    THEN
        SELECT array_agg(c.id),
               array_agg(DISTINCT c.id) FILTER (
                   WHERE (p.status <> 'completed' AND c.on_upstream_failure IS NULL)
                      OR c.status = 'cancelled')
        INTO to_lock, cancelling
        FROM jobs AS p
        JOIN job_dependencies AS d ON d.parent_id = p.id
        JOIN jobs AS c ON c.id = d.child_id
        WHERE p.id = ANY(parents)
          AND p.status IN ('completed', 'dead', 'cancelled')
          AND (only_children IS NULL OR d.child_id = ANY(only_children))
          AND ((c.status = 'waiting') IS TRUE
               OR (c.status = 'cancelled' AND c.on_upstream_failure = 'hold'
                   AND c.waiting_for > 0) IS TRUE);
        WHILE cancelling IS NOT NULL LOOP
            expanded := expanded || cancelling;
            SELECT array_agg(c.id),
                   array_agg(DISTINCT c.id) FILTER (
                       WHERE (c.on_upstream_failure IS NULL OR c.status = 'cancelled')
                         AND NOT c.id = ANY(expanded))
            INTO below, cancelling
            FROM job_dependencies AS d JOIN jobs AS c ON c.id = d.child_id
            WHERE d.parent_id = ANY(cancelling)
              AND ((c.status = 'waiting') IS TRUE
                   OR (c.status = 'cancelled' AND c.on_upstream_failure = 'hold'
                       AND c.waiting_for > 0) IS TRUE);
            to_lock := to_lock || below;
        END LOOP;
        PERFORM 1 FROM jobs WHERE id = ANY(to_lock) ORDER BY id FOR NO KEY UPDATE;
    END IF;
    LOOP
        WITH edges AS (
            SELECT d.child_id, p.status AS parent_status,
                   -- whether this end lets a hold step go (see the migration's head)
                   (p.status = 'completed'
                    OR (p.status = 'cancelled' AND coalesce(p.waiting_for, 0) = 0)) AS releases
            FROM jobs AS p JOIN job_dependencies AS d ON d.parent_id = p.id
            WHERE p.id = ANY(level)
              AND p.status IN ('completed', 'dead', 'cancelled')
              AND (only_children IS NULL OR d.child_id = ANY(only_children))
        ),
        changes AS (
            SELECT e.child_id AS id,
                   bool_or(e.parent_status <> 'completed') AS failed,
                   count(*)::integer AS n,
                   count(*) FILTER (WHERE e.releases)::integer AS released
            FROM edges AS e
            GROUP BY e.child_id
            -- in id order: see migration 0016
            ORDER BY e.child_id
        ),
        changed AS (
            UPDATE jobs AS c
            -- doomed: a parent failed, and the child is cancelled on an upstream failure
            -- (a hold step counts only the parents that let it go: ch.released)
            SET status = CASE WHEN (ch.failed AND c.on_upstream_failure IS NULL)
                              THEN 'cancelled'
                              WHEN c.status = 'cancelled' THEN 'cancelled'  -- passes its turn
                              WHEN c.waiting_for - (CASE WHEN c.on_upstream_failure = 'hold' THEN ch.released ELSE ch.n END) <= 0 THEN 'pending'
                              ELSE 'waiting' END,
                waiting_for = CASE WHEN (ch.failed AND c.on_upstream_failure IS NULL)
                                   THEN c.waiting_for
                                   ELSE greatest(c.waiting_for - (CASE WHEN c.on_upstream_failure = 'hold' THEN ch.released ELSE ch.n END), 0) END,
                run_at = CASE WHEN NOT (ch.failed AND c.on_upstream_failure IS NULL)
                                   AND c.status = 'waiting'
                                   AND c.waiting_for - (CASE WHEN c.on_upstream_failure = 'hold' THEN ch.released ELSE ch.n END) <= 0
                              THEN greatest(c.run_at, now()) ELSE c.run_at END,
                finished_at = CASE WHEN (ch.failed AND c.on_upstream_failure IS NULL)
                                   THEN now() ELSE c.finished_at END,
                last_error_code = CASE
                    WHEN (ch.failed AND c.on_upstream_failure IS NULL)
                    THEN 'upstream_failed'
                    ELSE c.last_error_code END,
                last_error_summary = CASE
                    WHEN (ch.failed AND c.on_upstream_failure IS NULL)
                    THEN 'cancelled: a job it waits for ended dead or cancelled'
                    ELSE c.last_error_summary END
            FROM changes AS ch
            WHERE c.id = ch.id
              AND ((c.status = 'waiting') IS TRUE
                   -- a hold step cancelled before its turn, which passes it on
                   OR (c.status = 'cancelled' AND c.on_upstream_failure = 'hold'
                       AND c.waiting_for > 0))
              -- a hold step that this end does not let go is left as it is, unwritten
              AND (c.on_upstream_failure IS DISTINCT FROM 'hold' OR ch.released > 0)
            RETURNING c.id, c.status, c.queue, c.on_upstream_failure, c.waiting_for
        ),
        woken AS (
            SELECT count(pg_notify('pgoutbox_jobs', q.queue)) AS n
            FROM (SELECT DISTINCT queue FROM changed WHERE status = 'pending') AS q
        ),
        told AS (  -- the waiters of a job cancelled here (Job.wait(), queries.results)
            SELECT count(pg_notify('pgoutbox_results', right(x.id::text, 8))) AS n
            FROM changed AS x
            WHERE x.status = 'cancelled' AND x.on_upstream_failure IS DISTINCT FROM 'hold'
              AND EXISTS (SELECT 1 FROM job_waiters AS w WHERE w.job_id = x.id)
        )
        -- the next level: the steps cancelled here, and the hold steps that passed their turn
        SELECT array_agg(id ORDER BY id) FILTER (
                   WHERE status = 'cancelled'
                     AND (on_upstream_failure IS DISTINCT FROM 'hold' OR waiting_for = 0))
        INTO level
        FROM changed, woken, told;
        EXIT WHEN level IS NULL;
        only_children := NULL;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION pgoutbox_note_settled() RETURNS trigger
LANGUAGE plpgsql SET search_path = %1$I
AS $$
DECLARE
    bucket integer;
    name text;
    noted text;
BEGIN
    -- (See migration 0016.) 'h': a dead job given up (skipped): only its hold steps settle.
    -- 's': a sequence's job completed, whose release may pass a turn on (pgoutbox_settle).
    bucket := coalesce(nullif(current_setting('pgoutbox.noted_bucket', true), ''), '0')::integer;
    name := 'pgoutbox.noted_' || bucket;
    noted := coalesce(current_setting(name, true), '');
    IF length(noted) >= 64 * 38 THEN
        bucket := bucket + 1;
        name := 'pgoutbox.noted_' || bucket;
        noted := '';
    END IF;
    PERFORM set_config(
        name,
        noted || CASE WHEN NEW.status = 'completed' AND NEW.sequence_key IS NULL THEN 'c'
                      WHEN NEW.status = 'completed' THEN 's'
                      WHEN OLD.status = 'dead' AND NEW.status = 'cancelled' THEN 'h'
                      WHEN NEW.status IN ('dead', 'cancelled') THEN 'x' ELSE 'r' END
            || NEW.id::text || ',',
        true
    ), set_config('pgoutbox.noted_bucket', bucket::text, true);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgoutbox_settle_noted() RETURNS trigger
LANGUAGE plpgsql SET search_path = %1$I SET plan_cache_mode = auto
AS $$
DECLARE
    buckets text := current_setting('pgoutbox.noted_bucket', true);
    statement_notes text := current_setting('pgoutbox.noted_statement', true);
    notes text[] := '{}';
    row_notes text[] := '{}';
    unsettled integer;
    finished uuid[];
    failed boolean;
    rearmed uuid[];
    skipped uuid[];
    held uuid[];
BEGIN
    PERFORM set_config('pgoutbox.noting', '', true);
    -- (See migration 0016.)
    IF coalesce(buckets, '') = '' AND coalesce(statement_notes, '') = '' THEN
        RETURN NULL;
    END IF;
    IF coalesce(statement_notes, '') <> '' THEN
        notes := string_to_array(statement_notes, ',');
        PERFORM set_config('pgoutbox.noted_statement', '', true);
    END IF;
    FOR bucket IN 0 .. coalesce(nullif(buckets, ''), '-1')::integer LOOP
        row_notes := row_notes || string_to_array(
            rtrim(coalesce(current_setting('pgoutbox.noted_' || bucket, true), ''), ','), ','
        );
        PERFORM set_config('pgoutbox.noted_' || bucket, '', true);
    END LOOP;
    notes := notes || row_notes;
    unsettled := coalesce(nullif(current_setting('pgoutbox.noted_rows', true), ''), '0')::integer
                 - coalesce(cardinality(row_notes), 0);
    PERFORM set_config('pgoutbox.noted_rows', CASE WHEN unsettled > 0 THEN unsettled::text ELSE '' END,
                       true),
            set_config('pgoutbox.noted_bucket', '', true),
            set_config('pgoutbox.settling', 'on', true);
    SELECT array_agg(substr(note, 2)::uuid) FILTER (WHERE left(note, 1) IN ('c', 's', 'x')),
           bool_or(left(note, 1) = 'x') OR bool_or(left(note, 1) = 's'),
           array_agg(substr(note, 2)::uuid) FILTER (WHERE left(note, 1) = 'r'),
           array_agg(substr(note, 2)::uuid) FILTER (WHERE left(note, 1) = 'h')
    INTO finished, failed, rearmed, skipped
    FROM unnest(notes) AS note;
    IF rearmed IS NOT NULL THEN
        PERFORM pgoutbox_rearm(rearmed);
    END IF;
    IF finished IS NOT NULL THEN
        PERFORM pgoutbox_settle(finished, NULL, failed);
    END IF;
    IF skipped IS NOT NULL THEN
        -- the hold steps of the dead jobs given up: the others counted their death already
        SELECT array_agg(d.child_id) INTO held
        FROM job_dependencies AS d JOIN jobs AS c ON c.id = d.child_id
        WHERE d.parent_id = ANY(skipped) AND c.on_upstream_failure = 'hold';
        IF held IS NOT NULL THEN
            PERFORM pgoutbox_settle(skipped, held, true);  -- a held step may pass its turn on
        END IF;
    END IF;
    PERFORM set_config('pgoutbox.settling', 'off', true);
    RETURN NULL;
END
$$;
$function$, current_schema());
END
$do$;

-- 0016's, with one more end noted: dead -> cancelled (a dead job given up, or skipped).
CREATE OR REPLACE TRIGGER jobs_note_settled
AFTER UPDATE OF status ON jobs
FOR EACH ROW WHEN (
    CASE
    WHEN NEW.has_dependants IS NOT TRUE THEN false
    WHEN current_setting('pgoutbox.noting', true) = 'on' THEN false
    WHEN current_setting('pgoutbox.settling', true) = 'on' THEN false
    WHEN OLD.status IS NOT DISTINCT FROM NEW.status THEN false
    WHEN (NEW.status IN ('completed', 'dead', 'cancelled')
          AND OLD.status NOT IN ('completed', 'dead', 'cancelled'))
         OR (OLD.status IN ('dead', 'cancelled')
             AND NEW.status NOT IN ('completed', 'dead', 'cancelled'))
         OR (OLD.status = 'dead' AND NEW.status = 'cancelled')
        THEN set_config(
            'pgoutbox.noted_rows',
            (coalesce(nullif(current_setting('pgoutbox.noted_rows', true), ''), '0')::integer
             + 1)::text,
            true
        ) IS NOT NULL
    ELSE false
    END
)
EXECUTE FUNCTION pgoutbox_note_settled();
"""

SEQUENCE_POSITIONS = "CREATE SEQUENCE pgoutbox_sequence_positions"


def _workflows_sql() -> str:
    """0016's functions and triggers, to put back when this migration is unapplied."""
    workflows = importlib.import_module("django_pgoutbox.migrations.0016_workflows")
    return f"{workflows.DROP_SETTLE_FUNCTIONS}\n{workflows.SETTLE_FUNCTIONS}"


class Migration(migrations.Migration):
    # The index is built CONCURRENTLY (as in 0016): that needs a migration outside a transaction.
    atomic = False
    dependencies = [
        ("pgoutbox", "0017_unique_jobs"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="sequence_key",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="sequence_position",
            field=models.BigIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.RunSQL(SEQUENCE_POSITIONS, "DROP SEQUENCE pgoutbox_sequence_positions"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("sequence_key__isnull", False))
                & ~models.Q(("status__in", ["completed", "cancelled"])),
                fields=["sequence_key", "sequence_position"],
                name="jobs_sequence_tail_idx",
            ),
        ),
        migrations.RunSQL(SEQUENCE_FUNCTIONS, _workflows_sql()),
    ]
