"""``db.classify_error``: what a failed statement's error means, from real server errors."""

from __future__ import annotations

import struct
from typing import Any

import psycopg
import pytest
from django.db import DataError, InterfaceError, OperationalError, connection

from django_pgoutbox.db import ErrorKind, classify_error


def error_of(sql: str, params: Any = None) -> BaseException:
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
    except Exception as error:
        return error
    raise AssertionError(f"{sql!r} did not fail")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT now() + make_interval(secs => %s)", [1e300]),  # interval out of range
        ("SELECT now() + make_interval(days => %s)", [10**9]),  # timestamp out of range
        ("SELECT repeat('x', 1 << 30)", None),  # 54000: requested length too large
        ("SELECT %s::int", [2**40]),  # integer out of range
        ("SELECT chr(0)", None),  # null character not permitted
    ],
)
def test_errors_of_data_are_data(sql: str, params: Any) -> None:
    error = error_of(sql, params)
    assert classify_error(error) is ErrorKind.DATA, repr(error)


@pytest.mark.django_db
def test_a_program_limit_is_data_though_psycopg_calls_it_operational() -> None:
    error = error_of("SELECT repeat('x', 1 << 30)")
    assert isinstance(error.__cause__, psycopg.OperationalError)
    assert classify_error(error) is ErrorKind.DATA


@pytest.mark.django_db
def test_a_missing_relation_is_other() -> None:
    assert classify_error(error_of("SELECT * FROM no_such_table")) is ErrorKind.OTHER


def test_client_side_errors_before_sending() -> None:
    assert (
        classify_error(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogate")) is ErrorKind.DATA
    )
    assert classify_error(OverflowError("int too big")) is ErrorKind.DATA
    assert classify_error(struct.error("argument out of range")) is ErrorKind.DATA
    assert classify_error(psycopg.DataError("NUL")) is ErrorKind.DATA


def test_connection_errors() -> None:
    assert classify_error(psycopg.OperationalError("server closed the connection")) is (
        ErrorKind.CONNECTION
    )
    assert classify_error(psycopg.InterfaceError("the connection is closed")) is (
        ErrorKind.CONNECTION
    )
    assert classify_error(psycopg.errors.AdminShutdown()) is ErrorKind.CONNECTION
    assert classify_error(InterfaceError("connection already closed")) is ErrorKind.CONNECTION
    wrapped = OperationalError("lost")
    wrapped.__cause__ = psycopg.errors.AdminShutdown()
    assert classify_error(wrapped) is ErrorKind.CONNECTION


def test_conflicts_and_the_rest() -> None:
    assert classify_error(psycopg.errors.SerializationFailure()) is ErrorKind.CONFLICT
    assert classify_error(psycopg.errors.DeadlockDetected()) is ErrorKind.CONFLICT
    assert classify_error(psycopg.errors.QueryCanceled()) is ErrorKind.CONFLICT
    assert classify_error(psycopg.errors.UndefinedTable()) is ErrorKind.OTHER
    assert classify_error(DataError("bad")) is ErrorKind.DATA
    assert classify_error(ValueError("x")) is ErrorKind.OTHER


@pytest.mark.django_db(transaction=True)  # the lane's connection sees the ALTER's commit
def test_a_prepared_statement_a_migration_made_stale_is_unsupported(
    raw_connection_params: dict[str, Any],
) -> None:
    """'cached plan must not change result type' (0A000): it fails at every run until the
    connection goes, so a worker's lane reconnects on it (``db.RECONNECT``)."""
    from django_pgoutbox.db import RECONNECT

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE stale_plan (id int, priority smallint)")
        cursor.execute("INSERT INTO stale_plan VALUES (1, 1)")
    try:
        query = "SELECT id, priority FROM stale_plan WHERE id = %s"
        params = {**raw_connection_params, "prepare_threshold": 5}  # Django's turns them off
        with psycopg.connect(**params, autocommit=True) as lane:
            lane.execute(query, [1], prepare=True).fetchall()
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE stale_plan ALTER COLUMN priority TYPE bigint")
            errors = []
            for _ in range(2):  # at every run
                with pytest.raises(psycopg.Error) as raised:
                    lane.execute(query, [1], prepare=True)
                errors.append(raised.value)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE stale_plan")
    assert [error.sqlstate for error in errors] == ["0A000", "0A000"]
    assert classify_error(errors[0]) is ErrorKind.UNSUPPORTED
    assert ErrorKind.UNSUPPORTED in RECONNECT


@pytest.mark.django_db
def test_a_session_ended_idle_in_a_transaction_is_a_lost_connection() -> None:
    """The server ends a session left idle inside its transaction past
    ``idle_in_transaction_session_timeout`` (25P03): the worker reconnects, as for a lost
    connection (the relay's, the scheduler's and the limited claims' transactions set it)."""
    import time

    from django_pgoutbox.db import raw_connection_params

    with psycopg.connect(**raw_connection_params("default")) as conn:
        conn.execute("SELECT set_config('idle_in_transaction_session_timeout', '100ms', true)")
        time.sleep(1.0)
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT 1")
    assert classify_error(raised.value) is ErrorKind.CONNECTION, raised.value
