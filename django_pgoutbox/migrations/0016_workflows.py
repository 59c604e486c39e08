from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

import django_pgoutbox.ids
import django_pgoutbox.models

# Workflows: a job may wait for others (job_dependencies), in a state of its own, 'waiting',
# that no claim's index holds. The end of a parent settles its waiting children in the
# transaction that writes it, by triggers, whichever statement writes it (a worker's outcome,
# the lease recovery, a cancel, an UPDATE of yours), so that no release is lost and none waits
# for a poll:
#
# - jobs_note_settled (AFTER UPDATE OF status, FOR EACH ROW) notes, in settings local to the
#   transaction, the jobs with dependants that just finished (completed, dead, cancelled) or were
#   put back from dead or cancelled. Its WHEN is false for a job without dependants (every plain
#   job): one comparison per row, no call. AFTER, not BEFORE: a BEFORE UPDATE row trigger locks
#   each row before its WHEN is tested (migration 0014).
# - jobs_settle_noted (AFTER UPDATE, FOR EACH STATEMENT) settles them all at once, in
#   statements of their own: each reads the edges in a snapshot taken after the parents' rows
#   were written, so an edge that a transaction committed while it held such a row (see
#   job_dependencies_settle) is seen. One statement, not one per row, so that the children of
#   a batch of outcomes are locked in id order, as every writer of jobs locks them.
# - pgoutbox_settle() releases the children that waited for nothing else (waiting -> pending,
#   and a notification wakes their queue), and cancels with 'upstream_failed' those a dead or
#   cancelled parent dooms (all but steps that run on an upstream failure), then their own
#   children, a level per statement (each level reads its edges after it locked its rows). A
#   cascade first locks, in id order, all the rows its levels may change.
# - pgoutbox_rearm() puts back the steps that a parent's death cancelled when the parent is
#   retried, and counts again what each waits for.
# - job_dependencies_settle (a constraint trigger, at commit) settles an edge to a parent that was
#   not enqueued with its child: it locks the parent, so either the parent's end comes after this
#   commit (and reads the edge) or it came before (and this settles the edge now). The parent's
#   row is locked from then to the commit only, not while the caller's transaction runs.
#
# The functions' search_path is this migration's schema, named (as in 0014). Their tests of
# ``status = 'waiting'`` are written ``(...) IS TRUE``, which jobs_waiting_idx's predicate does
# not match: with that index, sure from statistics that few jobs wait, the planner read every
# waiting job for each parent (a chain of 2,000 steps cancelled in 8 minutes, not a second); it
# now probes the primary key for each child. Those that run statements of their own keep the
# server's own choice of plans for them (``plan_cache_mode = auto``): a worker's lanes plan each
# run of their prepared statements anew (``db.DispatcherConnection``), which would else replan
# every statement of these functions at every call.
SETTLE_FUNCTIONS = r"""
DO $do$
BEGIN
    EXECUTE format($function$
CREATE FUNCTION pgoutbox_settle(
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
    -- A cascade locks level after level, and a lower id may come at a later level: first lock,
    -- in id order, every row it may change (the waiting children, then the waiting children of
    -- those it cancels, and so on). Else it may hold a child while it waits for a grandchild
    -- that a release, locking both children in one statement, holds while waiting for the
    -- first: a deadlock. A release alone is a single level, locked in id order by its UPDATE.
    -- A statement per level, not a recursive CTE: its plan read every edge at each level.
    -- (any_failed: whether a parent ended dead or cancelled, when the caller knows; a batch of
    -- completions then costs no read of the parents for it)
    IF coalesce(any_failed, EXISTS (
        SELECT 1 FROM jobs WHERE id = ANY(parents) AND status IN ('dead', 'cancelled')))
    THEN
        SELECT array_agg(c.id),
               array_agg(DISTINCT c.id) FILTER (
                   WHERE p.status <> 'completed' AND c.on_upstream_failure IS DISTINCT FROM 'run')
        INTO to_lock, cancelling
        FROM jobs AS p
        JOIN job_dependencies AS d ON d.parent_id = p.id
        JOIN jobs AS c ON c.id = d.child_id
        WHERE p.id = ANY(parents)
          AND p.status IN ('completed', 'dead', 'cancelled')
          AND (only_children IS NULL OR d.child_id = ANY(only_children))
          AND (c.status = 'waiting') IS TRUE;
        WHILE cancelling IS NOT NULL LOOP
            expanded := expanded || cancelling;
            SELECT array_agg(c.id),
                   array_agg(DISTINCT c.id) FILTER (
                       WHERE c.on_upstream_failure IS DISTINCT FROM 'run'
                         AND NOT c.id = ANY(expanded))
            INTO below, cancelling
            FROM job_dependencies AS d JOIN jobs AS c ON c.id = d.child_id
            WHERE d.parent_id = ANY(cancelling)
              AND (c.status = 'waiting') IS TRUE;
            to_lock := to_lock || below;
        END LOOP;
        PERFORM 1 FROM jobs WHERE id = ANY(to_lock) ORDER BY id FOR NO KEY UPDATE;
    END IF;
    LOOP
        WITH edges AS (
            SELECT d.child_id, p.status AS parent_status
            FROM jobs AS p JOIN job_dependencies AS d ON d.parent_id = p.id
            WHERE p.id = ANY(level)
              AND p.status IN ('completed', 'dead', 'cancelled')
              AND (only_children IS NULL OR d.child_id = ANY(only_children))
        ),
        changes AS (
            -- the children's rows are read once, by the UPDATE (which skips those not waiting)
            SELECT e.child_id AS id,
                   bool_or(e.parent_status <> 'completed') AS failed,
                   count(*)::integer AS n
            FROM edges AS e
            GROUP BY e.child_id
            -- In id order: the UPDATE below probes jobs_pkey once per child, in this order, so
            -- it locks them in id order. Not c.id = ANY(the sorted ids) there: sure from this
            -- CTE's estimate of one row, the planner scanned the whole list again for each child
            -- (docs/benchmarks.md, "What profiling found", 28).
            ORDER BY e.child_id
        ),
        changed AS (
            UPDATE jobs AS c
            -- doomed: a parent failed, and the child does not run on an upstream failure
            SET status = CASE WHEN (ch.failed AND c.on_upstream_failure IS DISTINCT FROM 'run')
                              THEN 'cancelled'
                              WHEN c.waiting_for - ch.n <= 0 THEN 'pending'
                              ELSE 'waiting' END,
                waiting_for = CASE WHEN (ch.failed AND c.on_upstream_failure IS DISTINCT FROM 'run')
                                   THEN c.waiting_for
                                   ELSE greatest(c.waiting_for - ch.n, 0) END,
                run_at = CASE WHEN NOT (ch.failed AND c.on_upstream_failure IS DISTINCT FROM 'run')
                                   AND c.waiting_for - ch.n <= 0
                              THEN greatest(c.run_at, now()) ELSE c.run_at END,
                finished_at = CASE WHEN (ch.failed AND c.on_upstream_failure IS DISTINCT FROM 'run')
                                   THEN now() END,
                last_error_code = CASE
                    WHEN (ch.failed AND c.on_upstream_failure IS DISTINCT FROM 'run')
                    THEN 'upstream_failed'
                    ELSE c.last_error_code END,
                last_error_summary = CASE
                    WHEN (ch.failed AND c.on_upstream_failure IS DISTINCT FROM 'run')
                    THEN 'cancelled: a job it waits for ended dead or cancelled'
                    ELSE c.last_error_summary END
            FROM changes AS ch
            WHERE c.id = ch.id
              AND (c.status = 'waiting') IS TRUE
            RETURNING c.id, c.status, c.queue
        ),
        woken AS (
            SELECT count(pg_notify('pgoutbox_jobs', q.queue)) AS n
            FROM (SELECT DISTINCT queue FROM changed WHERE status = 'pending') AS q
        ),
        told AS (  -- the waiters of a job cancelled here (Job.wait(), queries.results)
            SELECT count(pg_notify('pgoutbox_results', right(x.id::text, 8))) AS n
            FROM changed AS x
            WHERE x.status = 'cancelled'
              AND EXISTS (SELECT 1 FROM job_waiters AS w WHERE w.job_id = x.id)
        )
        SELECT array_agg(id ORDER BY id) FILTER (WHERE status = 'cancelled')
        INTO level
        FROM changed, woken, told;
        EXIT WHEN level IS NULL;
        only_children := NULL;
    END LOOP;
END
$$;

CREATE FUNCTION pgoutbox_rearm(parents uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path = %1$I SET plan_cache_mode = auto
AS $$
DECLARE
    members uuid[];
    doomable uuid[];
    failed uuid[];
BEGIN
    -- the steps the parents' end cancelled (and so on down), and their children still waiting
    WITH RECURSIVE down(id) AS (
        SELECT d.child_id
        FROM job_dependencies AS d JOIN jobs AS c ON c.id = d.child_id
        WHERE d.parent_id = ANY(parents)
          AND ((c.status = 'waiting') IS TRUE
               OR (c.status = 'cancelled' AND c.last_error_code = 'upstream_failed'))
        UNION
        SELECT d.child_id
        FROM down AS x
        JOIN jobs AS xj ON xj.id = x.id AND xj.status = 'cancelled'
        JOIN job_dependencies AS d ON d.parent_id = x.id
        JOIN jobs AS c ON c.id = d.child_id
        WHERE (c.status = 'waiting') IS TRUE
           OR (c.status = 'cancelled' AND c.last_error_code = 'upstream_failed')
    )
    SELECT array_agg(id ORDER BY id) INTO members FROM down;
    IF members IS NULL THEN
        RETURN;
    END IF;
    -- Their parents first, then them: a parent that ends meanwhile either ended before the
    -- count below reads it, or settles them after this commit, and sees them waiting.
    PERFORM 1 FROM jobs
    WHERE id = ANY(ARRAY(SELECT DISTINCT parent_id FROM job_dependencies
                         WHERE child_id = ANY(members)))
    ORDER BY id FOR SHARE;
    PERFORM 1 FROM jobs WHERE id = ANY(members) ORDER BY id FOR UPDATE;
    UPDATE jobs AS c
    SET status = 'waiting', finished_at = NULL, last_error_code = NULL,
        last_error_summary = NULL,
        waiting_for = (
            SELECT count(*)
            FROM job_dependencies AS d JOIN jobs AS p ON p.id = d.parent_id
            WHERE d.child_id = c.id
              AND (d.parent_id = ANY(members)
                   OR NOT (p.status = 'completed'
                           OR (c.on_upstream_failure = 'run'
                               AND p.status IN ('dead', 'cancelled'))))
        )
    WHERE c.id = ANY(members)
      AND ((c.status = 'waiting') IS TRUE
           OR (c.status = 'cancelled' AND c.last_error_code = 'upstream_failed'));
    -- those another dead or cancelled parent still dooms, and their own
    SELECT array_agg(DISTINCT d.child_id), array_agg(DISTINCT d.parent_id)
    INTO doomable, failed
    FROM job_dependencies AS d
    JOIN jobs AS p ON p.id = d.parent_id
    JOIN jobs AS c ON c.id = d.child_id
    WHERE d.child_id = ANY(members)
      AND NOT d.parent_id = ANY(members)
      AND p.status IN ('dead', 'cancelled')
      AND c.on_upstream_failure IS DISTINCT FROM 'run';
    IF doomable IS NOT NULL THEN
        PERFORM pgoutbox_settle(failed, doomable);
    END IF;
END
$$;

CREATE FUNCTION pgoutbox_outcomes_written(
    ids uuid[], statuses text[], dependants boolean[], notify boolean
) RETURNS integer
LANGUAGE plpgsql SET search_path = %1$I SET plan_cache_mode = auto
AS $$
DECLARE
    noted text;
BEGIN
    -- Tell the waiters of the jobs that finished (Job.wait(): queries.results), 800 tags (the
    -- ids' last 8 hex digits) a notification, if anyone waits for any job at all.
    IF notify AND EXISTS (SELECT 1 FROM job_waiters) THEN
        PERFORM pg_notify('pgoutbox_results', string_agg(right(f.id::text, 8), ' '))
        FROM (
            SELECT r.id, row_number() OVER () - 1 AS n
            FROM unnest(ids, statuses) AS r(id, status)
            WHERE r.status IN ('completed', 'dead', 'cancelled')
              AND EXISTS (SELECT 1 FROM job_waiters AS w WHERE w.job_id = r.id)
        ) AS f
        GROUP BY f.n / 800;
    END IF;
    -- Note the ends of jobs with dependants for the statement trigger, which settles them.
    SELECT string_agg(CASE WHEN r.status = 'completed' THEN 'c' ELSE 'x' END || r.id::text, ',')
    INTO noted
    FROM unnest(ids, statuses, dependants) AS r(id, status, dependant)
    WHERE r.dependant AND r.status IN ('completed', 'dead', 'cancelled');
    IF noted IS NOT NULL THEN
        PERFORM set_config('pgoutbox.noted_statement', noted, true);
    END IF;
    RETURN 0;
END
$$;

CREATE FUNCTION pgoutbox_note_settled() RETURNS trigger
LANGUAGE plpgsql SET search_path = %1$I
AS $$
DECLARE
    bucket integer;
    name text;
    noted text;
BEGIN
    -- (Not called for a change that pgoutbox_settle or pgoutbox_rearm itself makes: the
    -- trigger's WHEN, which also counted this row in 'pgoutbox.noted_rows'.)
    -- The notes go to buckets of at most 64 (pgoutbox.noted_0, _1, ...): appending to one text
    -- for every row copied it whole each time, which an UPDATE of 20,000 steps paid 14 s for.
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
        noted || CASE WHEN NEW.status = 'completed' THEN 'c'
                      WHEN NEW.status IN ('dead', 'cancelled') THEN 'x' ELSE 'r' END
            || NEW.id::text || ',',
        true
    ), set_config('pgoutbox.noted_bucket', bucket::text, true);
    RETURN NULL;
END
$$;

CREATE FUNCTION pgoutbox_settle_noted() RETURNS trigger
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
BEGIN
    PERFORM set_config('pgoutbox.noting', '', true);
    -- Nothing noted yet: a statement that a function ran in the middle of another, whose rows
    -- the other noted (its row trigger is called at its own end): 'pgoutbox.noted_rows' still
    -- counts them, and the other's statement trigger settles them.
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
    SELECT array_agg(substr(note, 2)::uuid) FILTER (WHERE left(note, 1) IN ('c', 'x')),
           bool_or(left(note, 1) = 'x'),
           array_agg(substr(note, 2)::uuid) FILTER (WHERE left(note, 1) = 'r')
    INTO finished, failed, rearmed
    FROM unnest(notes) AS note;
    IF rearmed IS NOT NULL THEN
        PERFORM pgoutbox_rearm(rearmed);
    END IF;
    IF finished IS NOT NULL THEN
        PERFORM pgoutbox_settle(finished, NULL, failed);
    END IF;
    PERFORM set_config('pgoutbox.settling', 'off', true);
    RETURN NULL;
END
$$;

CREATE FUNCTION pgoutbox_settle_external_edge() RETURNS trigger
LANGUAGE plpgsql SET search_path = %1$I
AS $$
DECLARE
    parent_status text;
BEGIN
    SELECT status INTO parent_status FROM jobs WHERE id = NEW.parent_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job %% waits for job %%, which no longer exists',
            NEW.child_id, NEW.parent_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    -- Written even when already set: a transaction in REPEATABLE READ that ends the parent
    -- after this commit, its snapshot taken before it, could not see the edge; the new row
    -- version makes its write fail (a serialization failure, to retry) instead.
    UPDATE jobs SET has_dependants = true WHERE id = NEW.parent_id;
    IF parent_status IN ('completed', 'dead', 'cancelled') THEN
        PERFORM set_config('pgoutbox.settling', 'on', true);
        PERFORM pgoutbox_settle(ARRAY[NEW.parent_id], ARRAY[NEW.child_id]);
        PERFORM set_config('pgoutbox.settling', 'off', true);
    END IF;
    RETURN NULL;
END
$$;
$function$, current_schema());
END
$do$;

-- A CASE, whose branches are taken in order: the last test, true, also tells the statement
-- trigger that a row was noted ('pgoutbox.noted_rows', the count of rows noted and not yet
-- settled), as the row is written (a WHEN is tested then; the trigger itself is called only at
-- the statement's end, after the statement trigger's WHEN was tested). A count, not a flag: a
-- statement run in the middle of this one (by a function it calls) calls the statement trigger
-- at its own end, which settles the rows that statement noted and leaves this one's counted.
CREATE TRIGGER jobs_note_settled
AFTER UPDATE OF status ON jobs
FOR EACH ROW WHEN (
    CASE
    WHEN NEW.has_dependants IS NOT TRUE THEN false
    -- a worker's outcomes note their jobs themselves, set-based (RECORD_OUTCOMES)
    WHEN current_setting('pgoutbox.noting', true) = 'on' THEN false
    -- a change that pgoutbox_settle or pgoutbox_rearm itself makes
    WHEN current_setting('pgoutbox.settling', true) = 'on' THEN false
    WHEN OLD.status IS NOT DISTINCT FROM NEW.status THEN false
    WHEN (NEW.status IN ('completed', 'dead', 'cancelled')
          AND OLD.status NOT IN ('completed', 'dead', 'cancelled'))
         OR (OLD.status IN ('dead', 'cancelled')
             AND NEW.status NOT IN ('completed', 'dead', 'cancelled'))
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

-- Called only when the statement noted a job (the row trigger above, or a worker's outcomes,
-- which set 'pgoutbox.noting' for a job with dependants): every other UPDATE, the claims and
-- the outcomes of plain jobs among them, pays a test of the settings, not a call. Not only for
-- an UPDATE OF status: PostgreSQL fires a table's statement triggers once per statement, for the
-- last of its UPDATEs of the table to end (a data-modifying WITH may have two), and cancels those
-- queued before; the last may write other columns. Not for the statements of pgoutbox_settle
-- and pgoutbox_rearm, which settle what they change themselves.
CREATE TRIGGER jobs_settle_noted
AFTER UPDATE ON jobs
FOR EACH STATEMENT WHEN (
    (current_setting('pgoutbox.noting', true) = 'on'
     OR coalesce(current_setting('pgoutbox.noted_rows', true), '') NOT IN ('', '0'))
    AND current_setting('pgoutbox.settling', true) IS DISTINCT FROM 'on'
)
EXECUTE FUNCTION pgoutbox_settle_noted();

CREATE CONSTRAINT TRIGGER job_dependencies_settle
AFTER INSERT ON job_dependencies
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.external)
EXECUTE FUNCTION pgoutbox_settle_external_edge();
"""

DROP_SETTLE_FUNCTIONS = """
DROP TRIGGER IF EXISTS job_dependencies_settle ON job_dependencies;
DROP TRIGGER IF EXISTS jobs_settle_noted ON jobs;
DROP TRIGGER IF EXISTS jobs_note_settled ON jobs;
DROP FUNCTION IF EXISTS pgoutbox_settle_external_edge();
DROP FUNCTION IF EXISTS pgoutbox_settle_noted();
DROP FUNCTION IF EXISTS pgoutbox_note_settled();
DROP FUNCTION IF EXISTS pgoutbox_outcomes_written(uuid[], text[], boolean[], boolean);
DROP FUNCTION IF EXISTS pgoutbox_rearm(uuid[]);
DROP FUNCTION IF EXISTS pgoutbox_settle(uuid[], uuid[], boolean);
"""

# Who waits for which job (Job.wait(), results.ResultListener): a row per job and listening
# connection (its server process), so that the statements that finish jobs notify only those
# that someone waits for, and a drain that no one waits on sends nothing. UNLOGGED: after a crash
# the listeners register again; rows of a listener gone are pruned (maintenance.prune).
JOB_WAITERS = """
CREATE UNLOGGED TABLE job_waiters (
    job_id uuid NOT NULL,
    listener_pid integer NOT NULL DEFAULT pg_backend_pid(),
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, listener_pid)
)
"""

STATUSES = "'waiting', 'pending', 'leased', 'retrying', 'completed', 'dead', 'cancelled'"
OLD_STATUSES = "'pending', 'leased', 'retrying', 'completed', 'dead', 'cancelled'"


def _status_check(statuses: str) -> str:
    # NOT VALID, then VALIDATE: the check of every row then takes no lock that blocks writes.
    return f"""
ALTER TABLE jobs DROP CONSTRAINT jobs_status_valid;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_valid CHECK (status IN ({statuses})) NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_status_valid;
"""


class Migration(migrations.Migration):
    # The index on jobs is built CONCURRENTLY, so that upgrading a live jobs table blocks
    # neither enqueues nor claims; that needs a migration outside a transaction.
    atomic = False
    dependencies = [
        ("pgoutbox", "0015_job_event"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "parent_id",
                        "child_id",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("parent_id", models.UUIDField()),
                ("child_id", models.UUIDField()),
                ("external", models.BooleanField(db_default=False, default=False)),
            ],
            options={
                "db_table": "job_dependencies",
                "indexes": [
                    models.Index(fields=["child_id"], name="job_dependencies_child_idx"),
                ],
            },
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=django_pgoutbox.ids.uuid7,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("name", models.TextField()),
                ("organization_id", models.UUIDField(blank=True, null=True)),
                ("steps", models.IntegerField()),
                ("first_step", models.UUIDField()),
                ("last_step", models.UUIDField()),
                (
                    "created_at",
                    models.DateTimeField(db_default=django_pgoutbox.models.TransactionNow()),
                ),
            ],
            options={
                "db_table": "workflows",
                "ordering": ["-created_at", "id"],
                "indexes": [
                    models.Index(fields=["-created_at", "id"], name="workflows_created_idx"),
                ],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="has_dependants",
            field=models.BooleanField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="meta",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="on_upstream_failure",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="step",
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="waiting_for",
            field=models.IntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="workflow_id",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.TextField(
                choices=[
                    ("waiting", "waiting"),
                    ("pending", "pending"),
                    ("leased", "leased"),
                    ("retrying", "retrying"),
                    ("completed", "completed"),
                    ("dead", "dead"),
                    ("cancelled", "cancelled"),
                ],
                db_default="pending",
                default="pending",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="jobs_status_valid"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "waiting",
                                    "pending",
                                    "leased",
                                    "retrying",
                                    "completed",
                                    "dead",
                                    "cancelled",
                                ],
                            )
                        ),
                        name="jobs_status_valid",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(_status_check(STATUSES), _status_check(OLD_STATUSES)),
            ],
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["queue", "created_at"],
                name="jobs_waiting_idx",
            ),
        ),
        migrations.RunSQL(JOB_WAITERS, "DROP TABLE job_waiters"),
        migrations.RunSQL(SETTLE_FUNCTIONS, DROP_SETTLE_FUNCTIONS),
    ]
