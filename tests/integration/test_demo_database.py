"""The demo's database (testproject/demo/database.py): made when it is the demo's own and
missing, else one line that says what to run. Each test uses databases and a role of its own,
named after the test database, and drops them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError
from psycopg import sql

from django_pgoutbox.db import raw_connection_params
from testproject.demo.database import createdb_command, prepare_database

pytestmark = pytest.mark.django_db


@pytest.fixture
def params() -> dict[str, Any]:
    return raw_connection_params("default")


def admin(params: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)


def exists(params: dict[str, Any], name: str) -> bool:
    with admin(params) as conn:
        query = "SELECT 1 FROM pg_database WHERE datname = %s"
        return conn.execute(query, [name]).fetchone() is not None


@pytest.fixture
def missing(params: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Connection parameters naming a database that does not exist (dropped after the test)."""
    name = f"{params['dbname']}_demo_{uuid.uuid4().hex[:8]}"
    yield {**params, "dbname": name}
    with admin(params) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def test_an_existing_database_is_named_with_its_server(params: dict[str, Any]) -> None:
    line = prepare_database(params, named_by_user=True)
    host = params.get("host") or "localhost"
    assert line.startswith(f"Database {params['dbname']!r} on {host}")
    assert line.endswith("(from DATABASE_URL).")


def test_the_demos_own_database_is_made(params: dict[str, Any], missing: dict[str, Any]) -> None:
    line = prepare_database(missing, named_by_user=False)
    assert line.startswith(f"Made database {missing['dbname']!r} on ")
    assert exists(params, missing["dbname"])
    again = prepare_database(missing, named_by_user=False)
    assert again.startswith(f"Database {missing['dbname']!r} on ")
    assert again.endswith("(the demo's own; DATABASE_URL picks another).")


def test_a_missing_database_that_database_url_names_is_one_line_and_not_made(
    params: dict[str, Any], missing: dict[str, Any]
) -> None:
    with pytest.raises(CommandError) as raised:
        prepare_database(missing, named_by_user=True)
    message = str(raised.value)
    assert "\n" not in message
    assert f"Database {missing['dbname']!r} does not exist on " in message
    assert f"`{createdb_command(missing)}`" in message
    assert not exists(params, missing["dbname"])


def test_a_user_who_may_not_make_databases_is_told_what_to_ask_for(
    params: dict[str, Any], missing: dict[str, Any]
) -> None:
    role = f"{params['dbname']}_nocreatedb_{uuid.uuid4().hex[:8]}"
    with admin(params) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB").format(sql.Identifier(role)))
    try:
        with pytest.raises(CommandError) as raised:
            prepare_database({**missing, "user": role}, named_by_user=False)
    finally:
        with admin(params) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    message = str(raised.value)
    assert "\n" not in message
    assert f"User {role!r} may not make databases on " in message
    assert f"-O {role} {missing['dbname']}`" in message
    assert not exists(params, missing["dbname"])


def test_a_server_that_does_not_answer_is_one_line(params: dict[str, Any]) -> None:
    nowhere = {**params, "host": "127.0.0.1", "port": 1, "connect_timeout": 5}
    with pytest.raises(CommandError, match=r"^Cannot connect to .* on 127\.0\.0\.1:1: ") as raised:
        prepare_database(nowhere, named_by_user=False)
    assert "\n" not in str(raised.value)


def test_the_createdb_command_names_the_server() -> None:
    tcp = {"host": "db.example", "port": 5433, "user": "ada", "dbname": "pgoutbox_demo"}
    assert createdb_command(tcp) == "createdb -h db.example -p 5433 -U ada pgoutbox_demo"
    socket = {"host": "/srv/my data", "user": "ada", "dbname": "x"}
    assert createdb_command(socket, owner="ada") == "createdb -h '/srv/my data' -O ada x"
