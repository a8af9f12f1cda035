"""The initial copy into MariaDB through ``LOAD DATA LOCAL INFILE`` (sinks/sql/ops/load_copy.py) stores exactly what
the statement path stores, and whatever the load would not store exactly is rolled back to the statements.

Real PostgreSQL and MariaDB, the copy task's code (``spark_jobs.copy.copy_chunk``). The edge rows of
tests/integration/test_snapshot_literal_copy.py (every type C renders) go through the load (several loads per chunk)
and through the statements (``TIDEWATER_COPY_LOAD=off``): stored byte-identically, equal to the upstream row by row.
Then: a chunk meeting one existing key in a later load is rolled back whole and upserted; a value the target refuses
(which LOAD DATA LOCAL would truncate with a warning) fails loudly with nothing stored; a server with
``local_infile = 0`` gets the statements with one log line for all its chunks; a target column type outside the
load's list takes the statements; the sink's connection never sends a file the server asks for."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors
import pytest

from cdc.errors import DataRejected
from cdc.events import TableName
from playground.compare import compare_tables
from sinks.factory import open_sink
from sinks.sql.dialect import copy_literals
from sinks.sql.dialect.statements import LOCAL_INFILE_NAME
from sinks.sql.ops import load_copy
from sinks.sql.target.connection import pymysql_connection_class
from spark_jobs.copy import ChunkTask, copy_chunk
from spark_jobs.plan import SnapshotJob
from tests.integration.test_snapshot_literal_copy import EDGE, ROWS
from tests.snapshot_helpers import execute
from upstream.postgres.snapshot_read import PgSnapshotReader

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _native() -> None:
    if copy_literals.native() is None:
        pytest.skip("the C renderer cannot be built here")


@pytest.fixture
def dbs(mariadb_server: Any) -> Iterator[list[str]]:
    names = [f"load_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for n in names:
        mariadb_server.create_database(n)
    yield names
    for n in names:
        mariadb_server.drop_database(n)


def copy_table(pg_server: Any, pg_database: str, mariadb_server: Any, db: str, table: str = "lit",
               chunk_rows: int = 1_000_000, after_first: Callable[[], None] | None = None) -> list[tuple[int, bool]]:
    """Copy ``table`` in chunks of ``chunk_rows`` into MariaDB database ``db`` with the copy task's code and one
    sink: per chunk (rows, went as text). ``after_first`` runs after the first chunk."""
    job = SnapshotJob(changefeed="cf-load", upstream=pg_server.uri(pg_database), sink=mariadb_server.uri(db),
                      tables=(f"public.{table}",), etcd=("http://127.0.0.1:1",))  # copy_chunk never talks to etcd
    reader = PgSnapshotReader(pg_server.uri(pg_database))
    sink = open_sink(job.sink, job.sink_settings)
    try:
        sink.set_bulk_load()
        schema = reader.table_schema(TableName("public", table))
        chunks = reader.plan(schema, chunk_rows).chunks
        reader.release()
        got = []
        for i, c in enumerate(chunks):
            got.append(copy_chunk(reader, sink, ChunkTask(job, schema, c)))
            if i == 0 and after_first is not None:
                after_first()
        return got
    finally:
        sink.close()
        reader.close()


def stored(mariadb_server: Any, db: str, table: str = "lit") -> list[tuple[Any, ...]]:
    """Every row as stored, with the texts' bytes."""
    sql = (f"SELECT *, HEX(t), HEX(vc), HEX(bp) FROM `{table}` ORDER BY id" if table == "lit" else
           f"SELECT * FROM `{table}` ORDER BY 1")
    return [tuple(r) for r in mariadb_server.execute(sql, db=db) or []]


def loads(mariadb_server: Any) -> int:
    """LOAD DATA statements the server ran so far (only these tests load on the session's server)."""
    rows = mariadb_server.execute("SHOW GLOBAL STATUS LIKE 'Com_load'") or []
    return int(rows[0][1])


def same_as_upstream(pg_server: Any, pg_database: str, mariadb_server: Any, db: str, table: str, n: int) -> None:
    conn = pg_server.connect(pg_database)
    try:
        (diff,) = compare_tables(conn, [f"public.{table}"], mariadb_server.uri(db))
    finally:
        conn.close()
    assert diff.equal and diff.source_rows == diff.target_rows == n, diff


def test_loaded_rows_are_stored_as_the_statements_store_them_and_equal_the_upstream(
        pg_server: Any, pg_database: str, mariadb_server: Any, dbs: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    execute(pg_server, pg_database, EDGE)
    monkeypatch.setattr(load_copy, "LOAD_ROWS", 700)  # several loads in the chunk, one pipelined after the other
    fast, statements = dbs
    before = loads(mariadb_server)
    assert copy_table(pg_server, pg_database, mariadb_server, fast) == [(ROWS, True)]
    assert loads(mariadb_server) - before >= ROWS // 1400  # (a load takes 700 to 1,399 rows)
    monkeypatch.setenv("TIDEWATER_COPY_LOAD", "off")
    before = loads(mariadb_server)
    assert copy_table(pg_server, pg_database, mariadb_server, statements) == [(ROWS, True)]
    assert loads(mariadb_server) == before
    assert stored(mariadb_server, fast) == stored(mariadb_server, statements)
    same_as_upstream(pg_server, pg_database, mariadb_server, fast, "lit", ROWS)


def test_a_chunk_meeting_an_existing_key_in_a_later_load_is_rolled_back_whole_and_upserted(
        pg_server: Any, pg_database: str, mariadb_server: Any, dbs: list[str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    execute(pg_server, pg_database, EDGE)
    monkeypatch.setattr(load_copy, "LOAD_ROWS", 700)
    db = dbs[0]
    assert copy_table(pg_server, pg_database, mariadb_server, db) == [(ROWS, True)]
    # a resumed chunk: the target holds one row of it, with other values, in the chunk's 5th load
    mariadb_server.execute("DELETE FROM lit WHERE id <> 3000", db=db)
    mariadb_server.execute("UPDATE lit SET t = 'stale', n = 1, d = '2000-01-01' WHERE id = 3000", db=db)
    before = loads(mariadb_server)
    with caplog.at_level(logging.INFO, logger=load_copy.__name__):
        assert copy_table(pg_server, pg_database, mariadb_server, db) == [(ROWS, True)]
    assert loads(mariadb_server) - before >= 3  # clean loads, then the one that skipped the row: all rolled back
    assert re.search(r"rolled back, the statements write it: 1 of \d+ rows skipped", caplog.text)
    same_as_upstream(pg_server, pg_database, mariadb_server, db, "lit", ROWS)


@pytest.mark.parametrize(("column", "value", "message"), [
    ("v", "'toolong'", "Data too long"),  # LOAD DATA LOCAL would store 'toolo' with a warning
    ("n", "70000", "Out of range"),  # ... 32767
])
def test_a_value_the_target_refuses_fails_loudly_and_nothing_of_the_chunk_stays(
        pg_server: Any, pg_database: str, mariadb_server: Any, dbs: list[str], monkeypatch: pytest.MonkeyPatch,
        column: str, value: str, message: str) -> None:
    execute(pg_server, pg_database, "CREATE TABLE sc (id int PRIMARY KEY, v text, n int)",
            "INSERT INTO sc SELECT g, 'r' || (g % 100), g % 30000 FROM generate_series(1, 3000) g",
            f"UPDATE sc SET {column} = {value} WHERE id = 2500")
    monkeypatch.setattr(load_copy, "LOAD_ROWS", 1000)
    db = dbs[0]
    mariadb_server.execute("CREATE TABLE sc (id int PRIMARY KEY, v varchar(5), n smallint)", db=db)
    before = loads(mariadb_server)
    with pytest.raises(DataRejected, match=message):
        copy_table(pg_server, pg_database, mariadb_server, db, "sc")
    assert loads(mariadb_server) - before == 3  # two clean loads, the third warned: all rolled back, the statements
    # refused the value
    assert stored(mariadb_server, db, "sc") == []


def test_a_server_with_local_infile_off_gets_the_statements_and_one_log_line(
        pg_server: Any, pg_database: str, mariadb_server: Any, dbs: list[str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    execute(pg_server, pg_database, EDGE)
    monkeypatch.setattr(load_copy, "REFUSALS_SAID", set())
    db = dbs[0]
    before = loads(mariadb_server)
    mariadb_server.execute("SET GLOBAL local_infile = 0")
    try:
        with caplog.at_level(logging.INFO, logger=load_copy.__name__):
            got = copy_table(pg_server, pg_database, mariadb_server, db, chunk_rows=1000)
            got += copy_table(pg_server, pg_database, mariadb_server, db, chunk_rows=1000)  # another sink
    finally:
        mariadb_server.execute("SET GLOBAL local_infile = 1")
    assert got == [(1000, True)] * 4 + [(5, True)] + [(1000, True)] * 4 + [(5, True)]
    assert loads(mariadb_server) == before
    refusals = [r for r in caplog.records if "refuses LOAD DATA LOCAL INFILE" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING
    same_as_upstream(pg_server, pg_database, mariadb_server, db, "lit", ROWS)


def test_a_refusal_met_at_a_load_sends_the_chunk_and_the_next_ones_to_the_statements(
        pg_server: Any, pg_database: str, mariadb_server: Any, dbs: list[str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """``local_infile`` switched off after the sink read it: the next load is refused (MariaDB's 4166), that chunk
    is written by the statements, and so are the later ones, without trying again; one log line."""
    execute(pg_server, pg_database, EDGE)
    monkeypatch.setattr(load_copy, "REFUSALS_SAID", set())
    db = dbs[0]
    before = loads(mariadb_server)
    try:
        with caplog.at_level(logging.INFO, logger=load_copy.__name__):
            got = copy_table(pg_server, pg_database, mariadb_server, db, chunk_rows=1000,
                             after_first=lambda: mariadb_server.execute("SET GLOBAL local_infile = 0"))
    finally:
        mariadb_server.execute("SET GLOBAL local_infile = 1")
    assert got == [(1000, True)] * 4 + [(5, True)]
    assert loads(mariadb_server) - before == 2  # the first chunk's load, the refused one
    refusals = [r for r in caplog.records if "refuses LOAD DATA LOCAL INFILE" in r.getMessage()]
    assert len(refusals) == 1 and "4166" in refusals[0].getMessage()
    same_as_upstream(pg_server, pg_database, mariadb_server, db, "lit", ROWS)


def test_a_target_column_type_outside_the_loads_list_takes_the_statements(
        pg_server: Any, pg_database: str, mariadb_server: Any, dbs: list[str]) -> None:
    """LOAD DATA reads a BIT column's text as bytes (``1`` -> 0x31) where the INSERT's integer literal is the number:
    such a table never loads."""
    execute(pg_server, pg_database, "CREATE TABLE bits (id int PRIMARY KEY, b boolean)",
            "INSERT INTO bits SELECT g, g % 2 = 0 FROM generate_series(1, 100) g")
    db = dbs[0]
    mariadb_server.execute("CREATE TABLE bits (id int PRIMARY KEY, b bit(1))", db=db)
    before = loads(mariadb_server)
    assert copy_table(pg_server, pg_database, mariadb_server, db, "bits") == [(100, True)]
    assert loads(mariadb_server) == before
    assert mariadb_server.execute("SELECT id, b + 0 FROM bits ORDER BY id", db=db) == [
        (g, int(g % 2 == 0)) for g in range(1, 101)]


def test_the_sinks_connection_never_sends_a_file_the_server_asks_for(
        mariadb_server: Any, mariadb_database: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("1\tsecret\n")
    conn = pymysql_connection_class()(host="127.0.0.1", port=mariadb_server.port, user="root",
                                       database=mariadb_database, local_infile=True)
    try:
        cur = conn.cursor()
        cur.execute("CREATE TABLE x (id INT PRIMARY KEY, s TEXT)")
        # asked for another file while a load of the sink's own data runs: refused, its data not sent either
        with pytest.raises(pymysql.err.OperationalError, match="refused to send LOCAL INFILE"):
            conn.load_local(cur, f"LOAD DATA LOCAL INFILE '{secret}' INTO TABLE x", b"2\tmine\n")
        # asked for a file outside a load (the sink's own name included), buffered and unbuffered: refused
        for name in (str(secret), LOCAL_INFILE_NAME):
            with pytest.raises(pymysql.err.OperationalError, match="refused to send LOCAL INFILE"):
                cur.execute(f"LOAD DATA LOCAL INFILE '{name}' INTO TABLE x")
            with conn.cursor(pymysql.cursors.SSCursor) as unbuffered, \
                    pytest.raises(pymysql.err.OperationalError, match="refused to send LOCAL INFILE"):
                unbuffered.execute(f"LOAD DATA LOCAL INFILE '{name}' INTO TABLE x")
        cur.execute("SELECT COUNT(*) FROM x")
        assert cur.fetchone()[0] == 0
        # its own name during a load: the data in memory, nothing else
        assert conn.load_local(cur, f"LOAD DATA LOCAL INFILE '{LOCAL_INFILE_NAME}' INTO TABLE x", b"3\tmine\n") == 1
        cur.execute("SELECT id, s FROM x")
        assert cur.fetchall() == ((3, "mine"),)
    finally:
        conn.close()
