"""The SQL sink with rows mounted as a span mounts them for it (``sinks.base.TextRows``: an insert's typed values
deferred, ``cdc.events.RowChange.row``), against real targets: fresh rows that go by their text (PostgreSQL's direct
COPY, MariaDB's ``LOAD DATA``) are written without their typed values ever being parsed; every other path (the
statements, a key the target holds already, SQLite) parses them where it needs them. Each target ends with exactly the
rows sent."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, RowChange, TableName, TableSchema, stored_row
from processor.mounter import Mounter
from sinks.factory import open_sink
from sinks.sql.ops import fresh_load
from tests import rowcodecs
from tests.pgoutput_wire import enc_tuple
from upstream.base import encode_payload
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


def mounted(ids: range) -> list[RowChange]:
    """Inserts of ``ids`` as the C mounter makes them for a text-row sink (the first payload plans the version in
    Python: it is mounted once before)."""
    m = Mounter(PgChangeDecoder({1: SCHEMA}.__getitem__, rowcodecs.codec_named("c")), defer=True)
    payloads = [encode_payload(1, b"I" + struct.pack(">I", RELID) + b"N" + enc_tuple(text_of(i))) for i in ids]
    m.mount(payloads[0], 1, 0.0)
    return [m.mount(p, 1, 0.0) for p in payloads]


@pytest.fixture(params=["postgresql", "mariadb", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, Any]]:
    kind = request.param
    monkeypatch.setattr(fresh_load, "MIN_ROWS", 32)  # (the test's groups: 50 rows)
    if kind == "sqlite":
        yield kind, f"sqlite:///{tmp_path / 'target.db'}", None
    elif kind == "mariadb":
        server = request.getfixturevalue("mariadb_server")
        yield kind, server.uri(request.getfixturevalue("mariadb_database")), server
    else:
        server = request.getfixturevalue("pg_server")
        name = f"tgt_{uuid.uuid4().hex[:12]}"
        server.create_database(name)
        yield kind, server.uri(name), server
        server.drop_database(name)


def rows_of(kind: str, uri: str, server: Any) -> list[tuple[Any, ...]]:
    sql = "SELECT id, k, c, ts FROM items ORDER BY id"
    if kind == "sqlite":
        import sqlite3

        with sqlite3.connect(uri.removeprefix("sqlite:///")) as c:
            got = c.execute(sql).fetchall()
        return [(i, k, c, datetime.fromisoformat(ts)) for i, k, c, ts in got]
    got = server.execute(sql, db=uri.rsplit("/", 1)[1]) or []
    return [(int(i), int(k), c, ts) for i, k, c, ts in got]


def test_fresh_rows_go_by_their_text_unparsed_and_every_other_path_parses(target: tuple[str, str, Any]) -> None:
    """Two writes: 100 fresh rows in groups of 50 (PostgreSQL: direct COPYs; MariaDB: loads; SQLite: statements),
    then 100 rows of which half exist (PostgreSQL: the direct COPY meets a key and merges through its staging
    table; MariaDB: the load is rolled back and the statements upsert; both need the keys' values). The target holds
    exactly the rows sent; the first write's rows were never parsed where they went by their text."""
    kind, uri, server = target
    sink = open_sink(uri, SinkConfig(batch_rows=50))
    try:
        first = mounted(range(100))
        assert all(not isinstance(stored_row(ch), tuple) for ch in first)  # (all deferrable: deferred)
        sink.write(first)
        parsed = sum(stored_row(ch).parsed for ch in first)
        assert parsed == (100 if kind == "sqlite" else 0)
        second = mounted(range(50, 150))
        sink.write(second)
    finally:
        sink.close()
    assert rows_of(kind, uri, server) == [value_of(i) for i in range(150)]
