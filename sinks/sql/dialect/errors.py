"""The SQL sink's error mapping: driver exceptions -> retryable ``SinkUnavailable`` or fatal ``SinkError``
with the fix named where it is known (missing database, access denied, missing privilege)."""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa

from cdc.errors import DataRejected, SinkError, SinkUnavailable, TidewaterError
from cdc.uri import ParsedURI

# MySQL error codes that a retry can fix (server gone, lost connection, deadlock, lock wait timeout...).
_MYSQL_RETRY = frozenset({1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2014, 2045, 2055, 4031})
_MYSQL_DISCONNECT = frozenset({1053, 1927, 2002, 2003, 2006, 2013, 2014, 2045, 2055, 4031})
# PostgreSQL SQLSTATEs a retry can fix: serialization failure, deadlock, shutdown, too many connections...
_PG_RETRY = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "53300", "53400", "55P03"})
# MySQL/MariaDB errors of a value or row the target refuses: NULL into NOT NULL, duplicate entry, out of range, data
# truncated or too long, an incorrect value (strict mode), a foreign key, a CHECK constraint (MySQL 3819, MariaDB 4025)
_MYSQL_DATA = frozenset({1048, 1062, 1263, 1264, 1265, 1292, 1366, 1367, 1406, 1451, 1452, 1690, 3140, 3819, 4025})
_PG_FATAL_CONNECT = ("does not exist", "authentication failed", "no pg_hba.conf entry", "permission denied",
                     "password is required", "too many connections for role")


def classify(dialect: str, exc: BaseException) -> tuple[bool, bool, Any]:
    """(retryable, connection lost, driver exception)."""
    orig: Any = exc
    if isinstance(exc, sa.exc.DBAPIError):
        orig = exc.orig if exc.orig is not None else exc
        if exc.connection_invalidated:
            return True, True, orig
    if isinstance(exc, sa.exc.TimeoutError):  # pool exhausted
        return True, False, orig
    if dialect == "mysql":
        import pymysql

        if isinstance(orig, pymysql.err.InterfaceError):
            return True, True, orig
        code = orig.args[0] if isinstance(orig, pymysql.err.MySQLError) and orig.args else None
        if isinstance(code, int) and code in _MYSQL_RETRY:
            return True, code in _MYSQL_DISCONNECT, orig
        return False, False, orig
    if dialect == "postgresql":
        import psycopg2

        if isinstance(orig, psycopg2.InterfaceError):
            return True, True, orig
        if isinstance(orig, psycopg2.Error):
            code = orig.pgcode
            if code is None and isinstance(orig, psycopg2.OperationalError):
                text = str(orig)
                fatal = any(s in text for s in _PG_FATAL_CONNECT)
                return not fatal, not fatal, orig
            if code is not None and (code.startswith("08") or code in _PG_RETRY):
                return True, code.startswith("08") or code.startswith("57P"), orig
        return False, False, orig
    if isinstance(orig, sqlite3.OperationalError):
        text = str(orig).lower()
        if "locked" in text or "busy" in text or "disk is full" in text:
            return True, False, orig
    return False, False, orig


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` (a driver error, a SQLAlchemy wrapper of one, or our error caused by one) is the server's
    deadlock verdict: MySQL/MariaDB 1213, PostgreSQL SQLSTATE 40P01. The server rolled the whole transaction back, so
    running it again from its start is safe."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 4:
        orig = cur.orig if isinstance(cur, sa.exc.DBAPIError) and cur.orig is not None else cur
        if getattr(orig, "pgcode", None) == "40P01":
            return True
        args = getattr(orig, "args", None)
        if type(orig).__module__.startswith("pymysql") and args and args[0] == 1213:
            return True
        cur, seen = cur.__cause__, seen + 1
    return False


def is_connection_lost(dialect: str, exc: BaseException) -> bool:
    """Whether ``exc`` (a driver error, a SQLAlchemy wrapper of one, or our error caused by one) says the connection
    is gone (:func:`classify`'s second answer): the server ended the session, the socket closed, a write to it
    failed. Whatever the session had not committed is rolled back by its server."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 4:
        if not isinstance(cur, TidewaterError) and classify(dialect, cur)[1]:
            return True
        cur, seen = cur.__cause__, seen + 1
    return False


def is_data_error(dialect: str, orig: Any) -> bool:
    """Whether the driver error ``orig`` says the target refused a value or a row (not the connection, a privilege,
    a missing table): PostgreSQL SQLSTATE classes 22 (data exception) and 23 (integrity constraint), MySQL's
    :data:`_MYSQL_DATA`, SQLite's ``IntegrityError``."""
    if dialect == "postgresql":
        code = getattr(orig, "pgcode", None) or ""
        return code[:2] in ("22", "23")
    if dialect == "mysql":
        code = orig.args[0] if getattr(orig, "args", None) else None
        return isinstance(code, int) and code in _MYSQL_DATA
    return isinstance(orig, sqlite3.IntegrityError)


def wrap(dialect: str, u: ParsedURI, where: str, exc: BaseException, table: str | None) -> TidewaterError:
    """``exc`` as our error: SinkUnavailable when a retry can fix it, ``DataRejected`` when the target refused a
    value or row (:func:`is_data_error`), else SinkError naming ``table`` (or the fix, :func:`hint`). ``where`` names
    the target for the message (never its password)."""
    retryable, _lost, orig = classify(dialect, exc)
    msg = " ".join(str(orig).split())
    if retryable:
        return SinkUnavailable(f"{where} is unavailable: {msg}", cause=exc)
    text = hint(dialect, u, orig, msg)
    if text:
        return SinkError(f"{where}: {text} ({msg})", cause=exc)
    subject = f"writing table {table}" if table else "sink"
    if is_data_error(dialect, orig):
        return DataRejected(f"{where}, {subject}: {msg}", reason=msg, cause=exc)
    return SinkError(f"{where}, {subject}: {msg}", cause=exc)


def hint(dialect: str, u: ParsedURI, orig: Any, msg: str) -> str | None:
    """The fix for a fatal error, when the driver's error says what it is (None otherwise)."""
    if dialect == "mysql":
        code = orig.args[0] if getattr(orig, "args", None) else None
        if code == 1049:
            return (f"database {u.path!r} does not exist: create it (CREATE DATABASE `{u.path}` "
                    "CHARACTER SET utf8mb4) or fix the sink URI")
        if code in (1044, 1045):
            return (f"access denied for user {u.user!r}: check the user and password in the sink URI and "
                    f"grant it privileges (GRANT ALL ON `{u.path}`.* TO ...)")
        if code in (1142, 1143):
            return f"user {u.user!r} lacks a privilege: GRANT ALL ON `{u.path}`.* TO it"
        return None
    if dialect == "postgresql":
        code = getattr(orig, "pgcode", None)
        if code == "3D000" or ("database" in msg and "does not exist" in msg):
            return f"database {u.path!r} does not exist: create it (CREATE DATABASE ...) or fix the sink URI"
        if code in ("28P01", "28000") or "authentication failed" in msg or "pg_hba.conf" in msg \
                or ("role" in msg and "does not exist" in msg):
            return (f"access denied for user {u.user!r}: check the user and password in the sink URI and "
                    "the server's pg_hba.conf")
        if code == "42501":
            return (f"user {u.user!r} lacks a privilege: grant it CREATE on the database and its schemas, "
                    "and INSERT/UPDATE/DELETE/TRUNCATE on the target tables")
        return None
    if "unable to open database file" in msg:
        return f"cannot open {u.path!r}: create its directory and make it writable"
    if "readonly database" in msg:
        return f"{u.path!r} is read-only: make the file and its directory writable"
    return None

def is_db_error(exc: BaseException) -> bool:
    if isinstance(exc, (sa.exc.SQLAlchemyError, sqlite3.Error)):
        return True
    mod = type(exc).__module__
    return mod.startswith("pymysql") or mod.startswith("psycopg2")
