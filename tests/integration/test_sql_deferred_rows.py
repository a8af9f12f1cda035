"""The SQL sink with rows mounted as a span mounts them for it (``sinks.base.TextRows``: an insert's typed values
deferred, ``cdc.events.RowChange.row``), against real targets: fresh rows that go by their text (PostgreSQL's direct
COPY, MariaDB's ``LOAD DATA``) are written without their typed values ever being parsed; every other path (the
statements, a key the target holds already, SQLite) parses them where it needs them. Each target ends with exactly the
rows sent."""

from __future__ import annotations

import struct
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, RowChange, TableName, TableSchema
from processor.mounter import Mounter
from sinks.factory import open_sink
from sinks.sql.ops import fresh_load
from tests import rowcodecs
from tests.pgoutput_wire import enc_tuple
from tests.sql_targets import KINDS, SqlTarget, make_target
from upstream.base import encode_payload
from upstream.mysql import payload as mysql_payload
from upstream.mysql import rowcodec as mysql_rowcodec
from upstream.mysql.source import MySqlChangeDecoder
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.integration

RELID = 16500
SCHEMA = TableSchema(TableName("public", "items"), (
    ColumnSchema("id", 20, "int8", is_key=True, nullable=False), ColumnSchema("k", 23, "int4"),
    ColumnSchema("c", 1043, "varchar"), ColumnSchema("ts", 1114, "timestamp")), ("id",), "d", RELID, 1)


def text_of(i: int) -> list[str | None]:
    return [str(i), str(i * 7 % 1000), f"row\t{i}\\", f"2026-01-{1 + i % 28:02d} 00:00:{i % 60:02d}.5"]


def value_of(i: int) -> tuple[Any, ...]:
    return (i, i * 7 % 1000, f"row\t{i}\\", datetime(2026, 1, 1 + i % 28, 0, 0, i % 60, 500000))


def mounted(ids: range, upstream: str = "postgresql") -> list[RowChange]:
    """Inserts of ``ids`` as the C mounter of ``upstream``'s stored changes makes them for a text-row sink (the first
    payload plans the version in Python: it is mounted once before)."""
    if upstream == "postgresql":
        m = Mounter(PgChangeDecoder({1: SCHEMA}.__getitem__, rowcodecs.codec_named("c")), defer=True)
        payloads = [encode_payload(1, b"I" + struct.pack(">I", RELID) + b"N" + enc_tuple(text_of(i))) for i in ids]
    else:
        native = mysql_rowcodec.native_decoding()
        assert native is not None, "the MySQL C row codec does not build here"
        m = Mounter(MySqlChangeDecoder({1: SCHEMA}.__getitem__, native), defer=True)
        payloads = [encode_payload(1, mysql_payload.encode(b"I", RELID, text_of(i), None)) for i in ids]
    m.mount(payloads[0], 1, 0.0)
    return [m.mount(p, 1, 0.0) for p in payloads]


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SqlTarget:
    monkeypatch.setattr(fresh_load, "MIN_ROWS", 32)  # (the test's groups: 50 rows)
    return make_target(SqlTarget, request, tmp_path)  # type: ignore[no-any-return]


def rows_of(target: SqlTarget) -> list[tuple[Any, ...]]:
    got = target.execute("SELECT id, k, c, ts FROM items ORDER BY id")
    if target.kind == "sqlite":
        return [(i, k, c, datetime.fromisoformat(ts)) for i, k, c, ts in got]
    return [(int(i), int(k), c, ts) for i, k, c, ts in got]


def test_fresh_rows_go_by_their_text_unparsed_and_every_other_path_parses(target: SqlTarget) -> None:
    """Two writes: 100 fresh rows in groups of 50 (PostgreSQL: direct COPYs; MariaDB: loads; SQLite: statements),
    then 100 rows of which half exist (PostgreSQL: the direct COPY meets a key and merges through its staging
    table; MariaDB: the load is rolled back and the statements upsert; both need the keys' values). The target holds
    exactly the rows sent; the first write's rows were never parsed where they went by their text."""
    sink = open_sink(target.uri, SinkConfig(batch_rows=50))
    try:
        first = mounted(range(100))
        assert all(not isinstance(ch.row, tuple) for ch in first)  # (all deferrable: deferred)
        sink.write(first)
        parsed = sum(ch.row.parsed for ch in first)
        assert parsed == (100 if target.kind == "sqlite" else 0)
        second = mounted(range(50, 150))
        sink.write(second)
    finally:
        sink.close()
    assert rows_of(target) == [value_of(i) for i in range(150)]


def test_mysql_upstream_inserts_are_loaded_unparsed(mariadb_server: Any, mariadb_database: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A MySQL/MariaDB upstream's inserts carry their stored text too: mounted for a text-row sink they are deferred,
    and a fresh group of them goes into MariaDB by ``LOAD DATA`` (the server's ``Com_load`` counts it) without being
    parsed; the table holds exactly the rows sent."""
    monkeypatch.setattr(fresh_load, "MIN_ROWS", 32)

    def loads() -> int:
        [(_, n)] = mariadb_server.execute("SHOW GLOBAL STATUS LIKE 'Com_load'")
        return int(n)

    target = SqlTarget("mariadb", mariadb_server, mariadb_database)
    sink = open_sink(target.uri, SinkConfig(batch_rows=50))
    try:
        changes = mounted(range(100), upstream="mysql")
        assert all(not isinstance(ch.row, tuple) for ch in changes)
        before = loads()
        sink.write(changes)
        assert loads() - before == 2
        assert not any(ch.row.parsed for ch in changes)
    finally:
        sink.close()
    assert rows_of(target) == [value_of(i) for i in range(100)]


def test_a_staged_deferred_row_is_stored_as_its_tuple() -> None:
    """The snapshot mode's staging (``stage_codec``) stores a deferred row as its tuple: read back, the change has the
    tuple, the text and the values of the mounted one (a deferred row itself is not a plain value to stage)."""
    from sinks.sql.target import stage_codec

    changes = mounted(range(3))
    back = stage_codec.decode(stage_codec.encode(changes))
    assert [type(c.row) for c in back] == [tuple] * 3
    assert [c.row for c in back] == [value_of(i) for i in range(3)]
    assert [list(c.row_text or ()) for c in back] == [text_of(i) for i in range(3)]
    assert [c.values for c in back] == [c.values for c in changes]
