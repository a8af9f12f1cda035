"""End to end: SIGKILL of the capture right after a DDL commits upstream, deterministically *before* the target
applied it (the span is held on a lock downstream while writing the rows before the DDL) and *after* it applied
and recorded it (held on another table's lock while writing the rows after the DDL in the same transaction).
Either way the restarted span applies the DDL exactly once in effect (one record in ``tidewater_ddl``, no error
for a column that already exists) and every row exactly once. PostgreSQL -> MariaDB / PostgreSQL / SQLite (SQLite
locks the whole file, so it has only the "before" case; its DDL and record are one transaction anyway)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from e2e_workload import assert_converged, run_sql, wait_for

from playground.cluster import CdcServer
from playground.compare import sqlalchemy_url
from playground.servers import PostgresServer

pytestmark = [pytest.mark.e2e, pytest.mark.kills]

TABLES = ["public.t", "public.u"]


@pytest.fixture
def source_schema() -> str:
    return "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE u (id int PRIMARY KEY, v text);"


@contextmanager
def held(sink: str, table: str) -> Iterator[None]:
    """Hold a lock downstream that makes the sink wait on ``table`` (SQLite: on the whole file)."""
    if sink.startswith("sqlite"):
        conn = sqlite3.connect(sink.split(":///", 1)[1], isolation_level=None, timeout=30)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()
        return
    engine = sa.create_engine(sqlalchemy_url(sink))
    try:
        with engine.connect() as conn, conn.begin():
            if sink.startswith("postgresql"):
                conn.exec_driver_sql(f"LOCK TABLE public.{table} IN ACCESS EXCLUSIVE MODE")
            else:  # InnoDB: next-key locks on every row and gap, and the table's metadata lock until the end
                conn.exec_driver_sql(f"SELECT * FROM {table} FOR UPDATE")
            yield
    finally:
        engine.dispose()


def ddl_records(sink: str, like: str) -> list[tuple[Any, ...]]:
    table = "tidewater.tidewater_ddl" if sink.startswith("postgresql") else "tidewater_ddl"
    engine = sa.create_engine(sqlalchemy_url(sink))
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("tidewater_ddl", schema="tidewater" if "." in table else None):
                return []
            return [tuple(r) for r in conn.execute(
                sa.text(f"SELECT commit_ts, seq, rows_done FROM {table} WHERE query LIKE :q"), {"q": like})]
    finally:
        engine.dispose()


def _wait(pred: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def test_a_kill_before_the_target_applied_the_ddl(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    cdc = cdc_server
    cdc.create_changefeed("kb", pg_server.uri(pg_database), sink_uri, snapshot="none")
    run_sql(source, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g", "INSERT INTO u VALUES (1, 'u')")
    assert_converged(cdc, "kb", source, sink_uri, tables=TABLES, schemas=True)

    with held(sink_uri, "t"):
        run_sql(source, "BEGIN", "INSERT INTO t VALUES (21, 'before')", "ALTER TABLE t ADD COLUMN c int DEFAULT 5",
                "INSERT INTO t VALUES (22, 'after', 6)", "UPDATE t SET c = 7 WHERE id = 1", "COMMIT")
        time.sleep(2.0)  # the span is waiting on the lock with the rows before the DDL
        assert ddl_records(sink_uri, "%ADD COLUMN c%") == []
        cdc.kill()
    run_sql(source, "INSERT INTO u VALUES (2, 'while down')")
    cdc.start()
    assert_converged(cdc, "kb", source, sink_uri, tables=TABLES, schemas=True)
    (record,) = ddl_records(sink_uri, "%ADD COLUMN c%")
    assert record[2], record  # the rows after it in its transaction were written (rows_done)
    q = wait_for(cdc, "kb", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q


def test_a_kill_after_the_target_applied_the_ddl(
        cdc_server: CdcServer, pg_server: PostgresServer, pg_database: str, source: Any, sink_uri: str) -> None:
    if sink_uri.startswith("sqlite"):
        pytest.skip("SQLite locks the whole file: no lock holds the rows after a DDL without holding the DDL")
    cdc = cdc_server
    cdc.create_changefeed("ka", pg_server.uri(pg_database), sink_uri, snapshot="none")
    run_sql(source, "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g", "INSERT INTO u VALUES (1, 'u')")
    assert_converged(cdc, "ka", source, sink_uri, tables=TABLES, schemas=True)

    with held(sink_uri, "u"):
        run_sql(source, "BEGIN", "INSERT INTO t VALUES (21, 'before')", "ALTER TABLE t ADD COLUMN d int DEFAULT 7",
                "INSERT INTO u VALUES (2, 'after the ddl')", "INSERT INTO t VALUES (22, 'after', 8)", "COMMIT")
        _wait(lambda: ddl_records(sink_uri, "%ADD COLUMN d%") != [], "the DDL applied downstream")
        (record,) = ddl_records(sink_uri, "%ADD COLUMN d%")
        assert not record[2], record  # the rows after it are still held
        cdc.kill()
    cdc.start()
    assert_converged(cdc, "ka", source, sink_uri, tables=TABLES, schemas=True)
    (record,) = ddl_records(sink_uri, "%ADD COLUMN d%")
    assert record[2], record
    q = wait_for(cdc, "ka", lambda q: True, "query")
    assert q["state"] == "normal" and not q["warnings"], q
