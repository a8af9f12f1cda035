"""The initial copy into MariaDB through literal rows rendered in C (sinks/sql/ops/literal_copy.py) stores exactly what
the parsed path stores, and whatever C does not render goes through the parsed path, which stores it or fails loudly.

Real PostgreSQL and MariaDB. The same chunk of edge rows (every type C renders: escapes, quotes, backslashes, ^Z,
emoji, numerics of every scale, float extremes and -0, fractions of seconds, NULLs) plus enough rows for several
1 MiB blocks and statements is copied with the copy task's code into two MariaDB databases, through C and with the C
renderer switched off (``TIDEWATER_COPY_LITERALS=python``, the pure-Python fallback): both must hold byte-identical
rows (every column as stored, HEX of the texts) and equal the upstream row by row (playground/compare.py). Then: a
NaN or an infinite float in a chunk is refused loudly, never stored as something else, and nothing of the chunk is
committed; a target column of a narrower scale refuses a value with digits beyond it and stores one with zeros there;
a chunk copied twice is upserted, not duplicated; a table with a column C does not render takes the parsed path."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.errors import DataRejected
from cdc.events import TableName
from playground.compare import compare_tables
from sinks.factory import open_sink
from sinks.sql.dialect import copy_literals
from spark_jobs.copy import ChunkTask, copy_chunk
from spark_jobs.plan import SnapshotJob
from tests.snapshot_helpers import execute
from upstream.postgres.snapshot_read import PgSnapshotReader

pytestmark = pytest.mark.integration

EDGE = r"""CREATE TABLE lit (id int PRIMARY KEY, i2 smallint, i8 bigint, b boolean, t text, vc varchar(40),
                   bp char(5), nm name, n numeric, n7 numeric(12,7), f4 real, f8 double precision, d date, tm time,
                   ts timestamp, tstz timestamptz, u uuid);
INSERT INTO lit VALUES
 (1, -32768, 9223372036854775807, true, E'tab\there\nnew\rcr \\ back \\N \\. "q" ''s'' \x1a^Z \b\f\v end\\',
  'é😀 x', 'ab', 'a name', 0.0000001, 0.0000001, '-0', '-0', '2024-02-29', '23:59:59.999999',
  '1999-12-31 23:59:59.999999', '1999-12-31 23:59:59.999999+00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'),
 (2, 32767, '-9223372036854775808', false, '', '', '', '', 0, -99999.9999999, 3.4028235e38, 1.7976931348623157e308,
  '0001-01-01', '00:00:00', '0001-01-01 00:00:00', '2026-03-29 01:30:00.123456+00',
  '00000000-0000-0000-0000-000000000000'),
 (3, 0, 0, NULL, 'x''y"z\\', 'trailing  ', 'abcde', 'n', 123456789012345678901234567890.123456789, 12345.6789012,
  1.4e-45, 5e-324, '9999-12-31', '12:00:00.5', '2026-01-01 00:00:00.5', '2026-06-30 23:00:00.000001+00',
  'ffffffff-ffff-ffff-ffff-ffffffffffff'),
 (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (5, 1, 1, true, '\', '\\', '''', 'q', 1.50, 1.5000000, 0.1, 0.1, '2000-01-01', '01:02:03', '2000-01-01 00:00:00',
  '2000-01-01 00:00:00+00', '01234567-89ab-cdef-0123-456789abcdef');
INSERT INTO lit (id, i8, t, n, n7, f4, f8, ts, tstz, u)
 SELECT g, g::bigint * 1000003, 'row ' || g || E'\t' || repeat('é''\\', g % 5) || repeat('x', 600), g * 0.01, g / 7.0,
        g / 3.0, g / 7.0, timestamp '2026-01-01' + g * interval '1.000001 second',
        timestamptz '2026-01-01 00:00:00+00' + g * interval '1 hour', md5(g::text)::uuid
 FROM generate_series(10, 4009) g"""
ROWS = 4005  # ~2.6 MB of COPY text: three blocks, several statements


def _job(pg_server: Any, pg_database: str, mariadb_server: Any, db: str, table: str) -> SnapshotJob:
    return SnapshotJob(changefeed="cf-literal", upstream=pg_server.uri(pg_database), sink=mariadb_server.uri(db),
                       tables=(f"public.{table}",), etcd=("http://127.0.0.1:1",))  # copy_chunk never talks to etcd


def _copy(pg_server: Any, pg_database: str, mariadb_server: Any, db: str, table: str = "lit") -> tuple[int, bool]:
    """Copy ``table`` (one chunk) into MariaDB database ``db`` with the copy task's code: (rows, went as text)."""
    job = _job(pg_server, pg_database, mariadb_server, db, table)
    reader = PgSnapshotReader(pg_server.uri(pg_database))
    sink = open_sink(job.sink, job.sink_settings)
    try:
        sink.set_bulk_load()
        schema = reader.table_schema(TableName("public", table))
        (chunk,) = reader.plan(schema, 1_000_000).chunks
        reader.release()
        return copy_chunk(reader, sink, ChunkTask(job, schema, chunk))
    finally:
        sink.close()
        reader.close()


def _stored(mariadb_server: Any, db: str, table: str = "lit") -> list[tuple[Any, ...]]:
    """Every row as stored, with the texts' bytes."""
    conn = mariadb_server.connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT *, HEX(t), HEX(vc), HEX(bp) FROM `{table}` ORDER BY id" if table == "lit" else
                        f"SELECT * FROM `{table}` ORDER BY 1")
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture
def two_dbs(mariadb_server: Any) -> Any:
    import uuid

    names = [f"lit_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for n in names:
        mariadb_server.create_database(n)
    yield names
    for n in names:
        mariadb_server.drop_database(n)


def test_the_c_literal_rows_store_exactly_what_the_parsed_path_stores_and_equal_the_upstream(
        pg_server: Any, pg_database: str, mariadb_server: Any, two_dbs: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    if copy_literals.native() is None:
        pytest.skip("the C literal renderer cannot be built here")
    execute(pg_server, pg_database, EDGE)
    fast, parsed = two_dbs
    assert _copy(pg_server, pg_database, mariadb_server, fast) == (ROWS, True)
    monkeypatch.setenv("TIDEWATER_COPY_LITERALS", "python")
    assert _copy(pg_server, pg_database, mariadb_server, parsed) == (ROWS, False)
    monkeypatch.delenv("TIDEWATER_COPY_LITERALS")
    assert _stored(mariadb_server, fast) == _stored(mariadb_server, parsed)
    conn = pg_server.connect(pg_database)
    try:
        (diff,) = compare_tables(conn, ["public.lit"], mariadb_server.uri(fast))
    finally:
        conn.close()
    assert diff.equal and diff.source_rows == diff.target_rows == ROWS, diff
    # copied again (a chunk committed but not recorded): upserted by key, never duplicated
    assert _copy(pg_server, pg_database, mariadb_server, fast) == (ROWS, True)
    assert _stored(mariadb_server, fast) == _stored(mariadb_server, parsed)


@pytest.mark.parametrize(("column", "value"), [("n", "'NaN'"), ("f8", "'Infinity'"), ("f4", "'-Infinity'"),
                                               ("f8", "'NaN'")])
def test_a_value_mariadb_cannot_store_is_refused_loudly_and_nothing_of_the_chunk_stays(
        pg_server: Any, pg_database: str, mariadb_server: Any, two_dbs: list[str], column: str, value: str) -> None:
    execute(pg_server, pg_database, EDGE, f"UPDATE lit SET {column} = {value} WHERE id = 3000")
    db = two_dbs[0]
    with pytest.raises(DataRejected, match=column):
        _copy(pg_server, pg_database, mariadb_server, db)
    assert _stored(mariadb_server, db) == []  # (the table is created; no row of the chunk committed)


def test_a_narrower_target_scale_refuses_digits_beyond_it_and_keeps_zeros_there(
        pg_server: Any, pg_database: str, mariadb_server: Any, two_dbs: list[str]) -> None:
    execute(pg_server, pg_database, "CREATE TABLE sc (id int PRIMARY KEY, v numeric(12,5), w text)",
            "INSERT INTO sc SELECT g, g / 4.0, 'r' || g FROM generate_series(1, 3000) g")  # .25, .5, .75: 2 digits
    zeros, digits = two_dbs
    for db in two_dbs:
        conn = mariadb_server.connect(db)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE sc (id int PRIMARY KEY, v decimal(12,2), w text)")
        conn.close()
    assert _copy(pg_server, pg_database, mariadb_server, zeros, "sc") == (3000, True)
    assert [(r[0], str(r[1])) for r in _stored(mariadb_server, zeros, "sc")[:4]] == [
        (1, "0.25"), (2, "0.50"), (3, "0.75"), (4, "1.00")]
    execute(pg_server, pg_database, "UPDATE sc SET v = 7.125 WHERE id = 2999")  # a third digit: would be rounded
    with pytest.raises(DataRejected, match="more than 2 fractional digits"):
        _copy(pg_server, pg_database, mariadb_server, digits, "sc")
    assert _stored(mariadb_server, digits, "sc") == []


def test_a_table_with_a_column_c_does_not_render_takes_the_parsed_path(
        pg_server: Any, pg_database: str, mariadb_server: Any, two_dbs: list[str]) -> None:
    execute(pg_server, pg_database, "CREATE TABLE other (id int PRIMARY KEY, by bytea, js jsonb, ia int[])",
            "INSERT INTO other SELECT g, '\\x00ff'::bytea, '{\"a\": 1}', ARRAY[g] FROM generate_series(1, 100) g")
    assert _copy(pg_server, pg_database, mariadb_server, two_dbs[0], "other") == (100, False)
    conn = pg_server.connect(pg_database)
    try:
        (diff,) = compare_tables(conn, ["public.other"], mariadb_server.uri(two_dbs[0]))
    finally:
        conn.close()
    assert diff.equal and diff.target_rows == 100, diff
