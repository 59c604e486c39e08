"""The upgrade to migration 0014 on a jobs table that already has dead letters: each gets its
cause, in batches that cross the keyset's boundaries, and a dead job without ``finished_at``
too; a job that is not dead gets none; the index is the column's, under its old name."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from django_pgoutbox import queries
from django_pgoutbox.db import raw_connection_params
from tests.processes import ROOT, database_url_for_tests

#: More than two of the fill's batches (5,000), with deaths that share a moment.
DEAD = 12_345


@pytest.fixture
def scratch() -> Iterator[str]:
    name = f"pgoutbox_upgrade_{uuid.uuid4().hex[:8]}"
    admin = {**raw_connection_params("default"), "dbname": "postgres"}
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def migrate(name: str, *target: str) -> None:
    url = urlunsplit(urlsplit(database_url_for_tests())._replace(path=f"/{name}"))
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", *target],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def one(conn: psycopg.Connection[Any], sql: str) -> tuple[Any, ...]:
    row: tuple[Any, ...] | None = conn.execute(sql).fetchone()
    assert row is not None
    return row


def test_the_dead_letters_of_before_get_their_cause(scratch: str) -> None:
    migrate(scratch, "pgoutbox", "0013")
    params = {**raw_connection_params("default"), "dbname": scratch}
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, last_error_code,"
            " last_error_summary, finished_at) "
            "SELECT 'default', 'tests.t' || (n %% 3), '{}', 'dead', 'E' || (n %% 2),"
            " 'Order ' || n || ' not found', now() - (n / 7) * interval '1 second' "
            "FROM generate_series(1, %s) AS n",
            [DEAD],
        )
        conn.execute(
            "INSERT INTO jobs (queue, job_type, payload, status, last_error_code,"
            " last_error_summary, finished_at) VALUES "
            "('default', 'tests.t0', '{}', 'dead', 'E0', 'no finish', NULL),"
            "('default', 'tests.t0', '{}', 'retrying', 'E0', 'Order 1 not found', NULL)"
        )
    migrate(scratch)
    with psycopg.connect(**params, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT status, count(*), count(*) FILTER (WHERE dead_cause ="
            " pgoutbox_error_fingerprint(job_type, last_error_code, last_error_summary)),"
            " count(DISTINCT dead_cause) FROM jobs GROUP BY status ORDER BY status"
        ).fetchall()
        assert rows == [("dead", DEAD + 1, DEAD + 1, 7), ("retrying", 1, 0, 0)]
        (definition,) = one(conn, "SELECT pg_get_indexdef('jobs_dead_cause_idx'::regclass)")
        assert "(dead_cause, finished_at, id) WHERE (status = 'dead'::text)" in definition
        # A worker of the release before, still running, kills a job with its own statement: the
        # lease recovery's maintenance gives it its cause.
        conn.execute(
            "UPDATE jobs SET status = 'dead', finished_at = now() WHERE status = 'retrying'"
        )
        assert conn.execute(queries.FILL_DEAD_CAUSES, {"limit": 1000}).rowcount == 1
        (missing,) = one(
            conn, "SELECT count(*) FROM jobs WHERE status = 'dead' AND dead_cause IS NULL"
        )
        assert missing == 0
    migrate(scratch, "pgoutbox", "0013")  # and back: the old index, no column
    with psycopg.connect(**params, autocommit=True) as conn:
        (definition,) = one(conn, "SELECT pg_get_indexdef('jobs_dead_cause_idx'::regclass)")
        assert "pgoutbox_error_fingerprint(job_type, last_error_code" in definition
        columns = conn.execute(
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_name = 'jobs' AND column_name = 'dead_cause'"
        ).fetchall()
        assert columns == []


def test_a_role_that_did_not_migrate_kills_with_a_cause(scratch: str) -> None:
    """The tables in the schema named after the role that migrated (``"$user"``, first in the
    default search_path), and the application's own role, with that schema on its search_path,
    inserting a dead job, and giving one written dead its cause: the trigger and the statement
    find the fingerprint in the schema of the migration, whoever the session's user is."""
    params = {**raw_connection_params("default"), "dbname": scratch}
    role = f"pgoutbox_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**params, autocommit=True) as conn:
        (user,) = one(conn, "SELECT current_user")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(user)))
    migrate(scratch)
    with psycopg.connect(**params, autocommit=True) as conn:
        (where,) = one(
            conn,
            "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'jobs'::regclass",
        )
        assert where == user
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        try:
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                    sql.Identifier(user), sql.Identifier(role)
                )
            )
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE ON jobs TO {}").format(sql.Identifier(role))
            )
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(user)))
                conn.execute(
                    "INSERT INTO jobs (queue, job_type, payload, status, last_error_code,"
                    " last_error_summary, finished_at) VALUES"
                    " ('default', 'tests.t', '{}', 'dead', 'E', 'Order 7 lost', now()),"
                    " ('default', 'tests.t', '{}', 'retrying', 'E', 'Order 8 lost', NULL)"
                )
                conn.execute("UPDATE jobs SET status = 'dead' WHERE status = 'retrying'")
                filled = conn.execute(queries.FILL_DEAD_CAUSES, {"limit": 1000}).rowcount
                assert filled == 1
            row = one(
                conn,
                "SELECT count(*) FILTER (WHERE dead_cause = pgoutbox_error_fingerprint(job_type,"
                " last_error_code, last_error_summary)) FROM jobs",
            )
            assert row == (2,)
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
