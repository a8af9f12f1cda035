"""End to end: MariaDB (row binlog) -> `cdc server` -> Kafka (tansu; canal-json and debezium) and the storage sink
(``file://``), with MySQL-sourced schemas and every replicated MySQL type; the consumer rebuilds the table from the
topic (``cdc cli kafka-consumer``, into SQLite) or from the files (``sinks.storage.reader``), and it equals the
upstream row by row; a table created empty reaches the consumer's target too (created at its CREATE TABLE)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from e2e_workload import kafka_consumer
from test_mysql_upstream_e2e import binlog_end

from cdc.events import TableName
from playground.cluster import CdcServer
from playground.compare import compare_mysql_rows, compare_mysql_tables
from playground.servers import KafkaServer, MariaDBServer
from sinks.storage.reader import StorageReader, rebuild

pytestmark = pytest.mark.e2e

TABLE = """CREATE TABLE mix (
  id BIGINT UNSIGNED PRIMARY KEY, ti TINYINT, iu INT UNSIGNED, bi BIGINT, d DECIMAL(65,30), d2 DECIMAL(10,2),
  fl FLOAT, db DOUBLE, c CHAR(5), v VARCHAR(20), t TEXT, tl VARCHAR(10) CHARACTER SET latin1, b BLOB,
  bn BINARY(4), dd DATE, dt DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME(2), y YEAR, j JSON, bt BIT(10),
  e ENUM('small', 'it''s') NULL, s SET('r', 'g', 'b') NULL, gs BIGINT UNSIGNED AS (id DIV 2) STORED,
  gv VARCHAR(40) AS (CONCAT(v, '!')) VIRTUAL) DEFAULT CHARSET utf8mb4"""
COLUMNS = "id, ti, iu, bi, d, d2, fl, db, c, v, t, tl, b, bn, dd, dt, ts, tm, y, j, bt, e, s"
ROWS = [
    (2**64 - 1, -128, 4294967295, -2**63, "-12345678901234567890123456789012345.123456789012345678901234567890",
     "1.50", 1.1, 0.1, "ab", "héllo 😀", "long\ntext", "café", b"\x00\xff\x00", b"a", "2024-02-29",
     "2024-01-02 03:04:05.123456", "2038-01-19 03:14:07.999", "23:59:59.99", 2155, '{"a": [1, 2], "b": null}',
     b"\x02\x01", "it's", "b,r"),
    (2**63, 0, 0, 0, "0", "0", 0.0, -2.5e-300, "", "", "", "", b"", b"\x00\x00\x00\x00", "1000-01-01",
     "1000-01-01 00:00:00", "1970-01-01 00:00:01", "00:00:00", 1901, "[]", b"\x00\x00", "small", ""),
    (7,) + (None,) * 22,
]


def write(server: MariaDBServer, db: str) -> None:
    conn = server.connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.executemany(f"INSERT INTO mix ({COLUMNS}) VALUES ({', '.join(['%s'] * 23)})", ROWS)
            cur.execute("UPDATE mix SET v = 'changed', s = 'g', bt = b'1111111111', d2 = 99999999.99 WHERE id = 7")
            cur.execute("UPDATE mix SET e = NULL, j = %s WHERE id = %s", ('{"x": 1}', 2**63))
            cur.executemany(f"INSERT INTO mix ({COLUMNS}) VALUES ({', '.join(['%s'] * 23)})",
                            [(100 + i,) + ROWS[0][1:] for i in range(5)])
            cur.execute("DELETE FROM mix WHERE id IN (101, 103)")
    finally:
        conn.close()


@pytest.mark.parametrize("protocol", ["canal-json", "debezium"])
def test_kafka_codecs_carry_mysql_schemas_and_types_exactly(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, kafka_server: KafkaServer,
        kafka_topic: str, tmp_path: Path, protocol: str) -> None:
    db = mariadb_database
    mariadb_server.execute(TABLE, db=db)
    sink = f"kafka://{kafka_server.bootstrap}/{kafka_topic}?protocol={protocol}"
    cdc_server.create_changefeed("mk", mariadb_server.uri(db), sink, snapshot="none")
    write(mariadb_server, db)
    # a table created empty: the consumer creates it at its CREATE TABLE (it used to wait for a first row)
    mariadb_server.execute("CREATE TABLE later (id INT PRIMARY KEY, note VARCHAR(20), amount DECIMAL(9,2))", db=db)
    end = binlog_end(mariadb_server)
    info = cdc_server.wait_checkpoint("mk", end, timeout=120)
    assert info["state"] == "normal" and not info.get("error"), info
    target = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    kafka_consumer(sink, target, mariadb_server.uri(db), end)
    conn = mariadb_server.connect(db)
    try:
        diff, later = compare_mysql_tables(conn, [f"{db}.mix", f"{db}.later"], target)
    finally:
        conn.close()
    assert diff.equal and diff.source_rows == 6, diff
    assert later.equal and later.source_rows == 0, later
    with sqlite3.connect(tmp_path / "rebuilt.db") as tconn:  # (a missing empty table compares equal: no rows)
        columns = [(r[1], r[5]) for r in tconn.execute('PRAGMA table_info("later")')]
    assert columns == [("id", 1), ("note", 0), ("amount", 0)], columns


def test_storage_sink_carries_mysql_schemas_and_types_exactly(
        cdc_server: CdcServer, mariadb_server: MariaDBServer, mariadb_database: str, tmp_path: Path) -> None:
    db = mariadb_database
    mariadb_server.execute(TABLE, db=db)
    sink = f"file://{tmp_path / 'lake'}?protocol=canal-json&flush-interval=300ms"
    cdc_server.create_changefeed("ms", mariadb_server.uri(db), sink, snapshot="none")
    write(mariadb_server, db)
    # a table created empty: its CREATE TABLE is a DDL event, which the storage sink writes as the table's schema file
    mariadb_server.execute("CREATE TABLE later (id INT PRIMARY KEY, note VARCHAR(20), amount DECIMAL(9,2))", db=db)
    end = binlog_end(mariadb_server)
    info = cdc_server.wait_checkpoint("ms", end, timeout=120)
    assert info["state"] == "normal" and not info.get("error"), info
    reader = StorageReader(sink)
    deadline = time.monotonic() + 60
    while (reader.checkpoint() or 0) < end:
        assert time.monotonic() < deadline, f"metadata checkpoint {reader.checkpoint()} < {end}"
        time.sleep(0.2)
    [created] = reader.schema_files(TableName(db, "later")).values()
    assert created.ddl and created.query.startswith("CREATE TABLE later"), created
    assert created.schema.column_names == ("id", "note", "amount") and created.schema.key == ("id",), created
    _, states = rebuild(sink)
    state = states[TableName(db, "mix")]
    assert not state.problems, state.problems[:5]
    conn = mariadb_server.connect(db)
    try:
        diff = compare_mysql_rows(conn, f"{db}.mix", state.rows())
    finally:
        conn.close()
    assert diff.equal and diff.source_rows == 6, diff
