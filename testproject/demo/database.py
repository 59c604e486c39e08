"""The demo's database: made if it is the demo's own and missing, else one line saying what to do.

A first run must not end in a traceback from the first query: a database that does not exist, or
that this user may not make, is one line that names the server, the database and the command that
makes it (``createdb``), as a command-line error.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import psycopg
from django.core.management import CommandError
from psycopg import sql

from testproject.database import DEMO_DATABASE, EMBEDDED_DATA


def describe_server(params: dict[str, Any]) -> str:
    """The server of psycopg connection ``params`` in a few words: host and port, or its socket."""
    host = params.get("host") or "localhost"
    if host.startswith("/"):
        if Path(host).resolve() == EMBEDDED_DATA.resolve():
            return f"the embedded server in {host}"
        return f"the server of socket directory {host}"
    return f"{host}:{params.get('port') or 5432}"


def createdb_command(params: dict[str, Any], *, owner: str | None = None) -> str:
    """The ``createdb`` command line that makes the database of ``params`` on its server."""
    words = ["createdb"]
    if params.get("host"):
        words += ["-h", params["host"]]
    if params.get("port"):
        words += ["-p", str(params["port"])]
    words += ["-O", owner] if owner else ["-U", params.get("user") or "postgres"]
    return shlex.join([*words, params["dbname"]])


def prepare_database(params: dict[str, Any], *, named_by_user: bool) -> str:
    """Make sure the database of psycopg ``params`` exists and say which it is, in one line.

    The demo's own database (``named_by_user`` false) is made when missing. One that
    ``DATABASE_URL`` names is never made: a typo there must not leave a stray database behind.
    Raises ``CommandError`` (one line) when the database cannot be reached or made.
    """
    name, server = params["dbname"], describe_server(params)
    whose = "from DATABASE_URL" if named_by_user else "the demo's own; DATABASE_URL picks another"
    try:
        psycopg.connect(**params).close()
    except psycopg.OperationalError as error:
        unreachable = error
    else:
        return f"Database {name!r} on {server} ({whose})."
    try:
        # The server's maintenance database, to tell a missing database from any other failure.
        with psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if found is None and named_by_user:
                raise CommandError(
                    f"Database {name!r} does not exist on {server} (DATABASE_URL names it): make "
                    f"it with `{createdb_command(params)}`, or unset DATABASE_URL and the demo "
                    f"makes its own, {DEMO_DATABASE!r}."
                )
            if found is None:
                return _create(conn, params, server)
    except psycopg.OperationalError:
        pass
    raise CommandError(f"Cannot connect to {name!r} on {server}: {_one_line(unreachable)}")


def _create(conn: psycopg.Connection[Any], params: dict[str, Any], server: str) -> str:
    name, user = params["dbname"], params.get("user") or "postgres"
    try:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege:
        raise CommandError(
            f"User {user!r} may not make databases on {server}, and the demo needs its own, "
            f"{name!r}: ask someone who may to run `{createdb_command(params, owner=user)}`, "
            "or set DATABASE_URL to a database you have."
        ) from None
    except psycopg.errors.DuplicateDatabase:
        pass  # another demo made it a moment ago: it is there, as wanted
    return f"Made database {name!r} on {server} for the demo (DATABASE_URL picks another)."


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
