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
