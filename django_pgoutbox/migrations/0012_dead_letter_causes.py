from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

import django_pgoutbox.models

# The rules of docs/admin.md, "Dead letters by cause", in order: the first 2,000 characters of
# the summary; quoted values (a quote that opens after a letter or a digit is an apostrophe);
# UUIDs; e-mail addresses; ids (0x..., 8+ hex digits, 16+ letters and digits: each with a digit
# and a letter); numbers; whitespace; the first 500 characters of the result. Only ASCII classes: what a character is never depends on
# the database's locale, so an index built under one libc agrees with another's.
#
# These functions are what jobs_dead_cause_idx holds: changing what they return is a new
# migration that drops that index, replaces them and builds it again.
ERROR_PATTERN = r"""
CREATE FUNCTION pgoutbox_error_pattern(summary text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN left(btrim(regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(
    regexp_replace(left(summary, 2000),
        '(?<![0-9A-Za-z])''[^'']*''', '''…''', 'g'),
        '"[^"]*"', '"…"', 'g'),
        '[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}',
        '<uuid>', 'g'),
        '[A-Za-z0-9._+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}', '<email>', 'g'),
        '(?<![0-9A-Za-z])(0[xX][0-9A-Fa-f]+|(?=[0-9A-Za-z]*[0-9])(?=[0-9A-Za-z]*[A-Za-z])'
        '([0-9A-Fa-f]{8,}|[0-9A-Za-z]{16,}))(?![0-9A-Za-z])', '<id>', 'g'),
        '[0-9]+([.,][0-9]+)*', '<n>', 'g'),
        '[ \t\n\r\f\v]+', ' ', 'g')), 500)
"""

# The parts length-prefixed, so that no job type and code run into each other; a SQL-standard
# body (RETURN), so that the call of pgoutbox_error_pattern is bound when it is created, whatever
# search_path an index build or a vacuum runs with later. Both stay plain SQL functions that the
# planner inlines: a call it cannot inline (a SET clause, PL/pgSQL) took two to four times longer.
ERROR_FINGERPRINT = """
CREATE FUNCTION pgoutbox_error_fingerprint(job_type text, code text, summary text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN left(md5(
    length(job_type)::text || ':' || job_type
    || length(coalesce(code, ''))::text || ':' || coalesce(code, '')
    || coalesce(pgoutbox_error_pattern(summary), '')
), 16)
"""


class Migration(migrations.Migration):
    # Built CONCURRENTLY, so that upgrading a live jobs table blocks neither enqueues nor claims;
    # that needs a migration outside a transaction. Only dead jobs have entries.
    atomic = False
    dependencies = [
        ("pgoutbox", "0011_attempt_history"),
    ]

    operations = [
        migrations.RunSQL(
            ERROR_PATTERN, reverse_sql="DROP FUNCTION IF EXISTS pgoutbox_error_pattern(text)"
        ),
        migrations.RunSQL(
            ERROR_FINGERPRINT,
            reverse_sql="DROP FUNCTION IF EXISTS pgoutbox_error_fingerprint(text, text, text)",
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                django_pgoutbox.models.ErrorFingerprint(),
                models.F("finished_at"),
                models.F("id"),
                condition=models.Q(("status", "dead")),
                name="jobs_dead_cause_idx",
            ),
        ),
        # The statistics of the index's expression, which the causes page's estimates read.
        migrations.RunSQL("ANALYZE jobs", reverse_sql=migrations.RunSQL.noop),
    ]
