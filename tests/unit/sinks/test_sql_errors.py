"""The SQL sink's error mapping: a value or row the target refuses is ``DataRejected`` (fatal, the database's reason
kept), an outage stays retryable, a missing database or privilege keeps its fix (sinks.sql.dialect.errors)."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import pymysql
import pytest

from cdc.errors import DataRejected, SinkError, SinkUnavailable
from cdc.uri import parse_sink_uri
from sinks.sql.dialect.errors import is_data_error, wrap

pytestmark = pytest.mark.unit

MY = parse_sink_uri("mysql://app:pw@127.0.0.1:3306/shop")
PG = parse_sink_uri("postgresql://app:pw@127.0.0.1:5432/shop")


@pytest.mark.parametrize(("code", "text"), [
    (1406, "Data too long for column 'v' at row 3"), (1048, "Column 'v' cannot be null"),
    (1264, "Out of range value for column 'n' at row 1"), (4025, "CONSTRAINT `chk` failed for `shop`.`t`"),
    (3819, "Check constraint 'chk' is violated."), (1366, "Incorrect integer value: 'x' for column 'n' at row 1")])
def test_mysql_data_errors_are_data_rejected(code: int, text: str) -> None:
    err = wrap("mysql", MY, "MySQL target shop", pymysql.err.DataError(code, text), "t")
    assert isinstance(err, DataRejected) and not err.retryable and err.code == "CDC:ErrSinkDataRejected"
    assert text in err.reason and "writing table t" in err.message and "pw" not in err.message


def test_other_mysql_errors_keep_their_kind() -> None:
    assert type(wrap("mysql", MY, "w", pymysql.err.OperationalError(1049, "Unknown database"), "t")) is SinkError
    assert isinstance(wrap("mysql", MY, "w", pymysql.err.OperationalError(2003, "Can't connect"), "t"), SinkUnavailable)
    assert type(wrap("mysql", MY, "w", pymysql.err.ProgrammingError(1146, "Table doesn't exist"), "t")) is SinkError


@pytest.mark.parametrize(("pgcode", "data"), [("23514", True), ("23502", True), ("22001", True), ("22003", True),
                                              ("23505", True), ("42P01", False), ("42501", False)])
def test_postgresql_sqlstate_classes_22_and_23_are_data(pgcode: str, data: bool) -> None:
    assert is_data_error("postgresql", SimpleNamespace(pgcode=pgcode)) is data


def test_sqlite_integrity_errors_are_data() -> None:
    err = wrap("sqlite", parse_sink_uri("sqlite:///t.db"), "SQLite target", sqlite3.IntegrityError(
        "CHECK constraint failed: n >= 0"), "t")
    assert isinstance(err, DataRejected) and err.reason == "CHECK constraint failed: n >= 0"
    assert type(wrap("sqlite", parse_sink_uri("sqlite:///t.db"), "w", sqlite3.OperationalError("no such table"),
                     "t")) is SinkError
    assert not is_data_error("postgresql", SimpleNamespace(pgcode=None)) and PG.path == "shop"
