"""The consumer library creates a table at its CREATE TABLE message (sinks.kafka.applier), from the schema in the
Kafka sink's ``tidewater-ddl`` header: a table that stays empty upstream is there downstream, with its exact
column types; a replay of the CREATE where the target has the table in that shape is a no-op, and a target table of
another shape stops the consumer naming the table and both shapes. Without the header (another producer) the
first row still creates the table, as before."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cdc.errors import SinkError
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, TableName, TableSchema
from cdc.ts import Watermark
from sinks.kafka.applier import SinkApplier
from sinks.kafka.headers import DDL_HEADER, DdlHeader, ddl_header, parse_ddl
from tests.kafka_sink_fakes import FakeBroker, ins, table
from tests.unit.sinks.test_kafka_sink_unit import PROTOCOLS, make, rebuild

pytestmark = pytest.mark.unit

E = TableName("public", "e")
EMPTY = TableSchema(E, (ColumnSchema("id", 23, "int4", False, "integer", nullable=False, is_key=True),
                        ColumnSchema("price", 1700, "numeric", False, "numeric(10,2)", 655366),
                        ColumnSchema("label", 1043, "varchar", False, "character varying(20)", 24)),
                    ("id",), "d", 77, 0, True)


def create(schema: TableSchema, ts: int) -> DdlEvent:
    return DdlEvent(ts, ts / 1000, schema.name, (DdlChange(DdlKind.CREATE_TABLE),), None, schema,
                    f"CREATE TABLE {schema.name.table} (...)", 0)


def sqlite_columns(db: Path, name: str) -> list[tuple[str, str, int]]:
    """(name, declared type, primary-key position) of each column, in order."""
    with sqlite3.connect(db) as conn:
        return [(r[1], r[2], r[5]) for r in conn.execute(f'PRAGMA table_info("{name}")')]


def sqlite_rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def apply_all(broker: FakeBroker, protocol: str, db: Path, position: str = "kafka-consumer") -> None:
    applier = SinkApplier(f"sqlite:///{db}", position=position)
    try:
        rebuild(broker, protocol, applier=applier)  # type: ignore[arg-type]
    finally:
        applier.close()


def feed(protocol: str) -> FakeBroker:
    """CREATE TABLE e (stays empty) at 10, CREATE TABLE t at 20, rows of t at 20 and 30."""
    broker = FakeBroker(partitions=2)
    sink = make(broker, protocol)
    t = table()
    sink.apply_ddl(create(EMPTY, 10))
    sink.apply_ddl(create(t, 20))
    sink.write([ins(t, 20, 1, "a"), ins(t, 20, 2, "b")])
    sink.write([ins(t, 30, 3, "c")])
    sink.publish_resolved(Watermark(30, 0.03))
    return broker


def test_the_create_header_round_trips_the_table_schema() -> None:
    name, value = ddl_header(create(EMPTY, 10))  # type: ignore[misc]
    assert name == DDL_HEADER
    assert parse_ddl(value) == DdlHeader((DdlChange(DdlKind.CREATE_TABLE),), {}, (), EMPTY)
    assert b'"is_array"' not in value and b'"default"' not in value  # fields at their defaults are left out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_empty_created_table_is_created_with_its_types_and_a_replay_is_a_no_op(protocol: str,
                                                                                  tmp_path: Path) -> None:
    broker = feed(protocol)
    db = tmp_path / "t.db"
    apply_all(broker, protocol, db)
    expected = sqlite_columns(db, "e")
    # the SQL sink's create translation for SQLite (numeric as its exact text), not what a first row would infer
    assert expected == [("id", "INTEGER", 1), ("price", "TEXT", 0), ("label", "TEXT", 0)]
    assert sqlite_rows(db, "SELECT count(*) FROM e") == [(0,)]
    assert sqlite_rows(db, "SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]
    # a consumer from an earlier watermark (a position that holds nothing yet): every CREATE again, no-ops
    apply_all(broker, protocol, db, position="kafka-consumer-again")
    assert sqlite_columns(db, "e") == expected
    assert sqlite_rows(db, "SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]


def test_a_target_table_of_another_shape_stops_the_consumer_naming_both(tmp_path: Path) -> None:
    broker = feed("canal-json")
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE e (id integer PRIMARY KEY, price numeric)")
    with pytest.raises(SinkError) as err:
        apply_all(broker, "canal-json", db)
    text = str(err.value)
    assert "public.e" in text and "price numeric(10,2), label character varying(20)" in text and "(id, price;" in text
    assert sqlite_columns(db, "e") == [("id", "INTEGER", 1), ("price", "numeric", 0)]  # left as it was


def test_from_another_producer_the_first_row_creates_the_table(tmp_path: Path) -> None:
    broker = feed("canal-json")
    for part in broker.topics["cdc"]:  # another producer: no Tidewater header
        for r in part:
            r.headers = []
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}", schemas=lambda t: EMPTY if t == E else None)
    try:
        rebuild(broker, "canal-json", applier=applier)  # type: ignore[arg-type]
    finally:
        applier.close()
    assert sqlite_columns(db, "e") == []  # documented: an empty table of another producer is not created
    assert sqlite_rows(db, "SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]


def strip_ddl_headers(broker: FakeBroker) -> None:
    for part in broker.topics["cdc"]:
        for r in part:
            r.headers = [(k, v) for k, v in r.headers if k != DDL_HEADER]


@pytest.mark.parametrize("protocol", ("canal-json", "open-protocol"))
def test_a_tidewater_create_without_the_schema_takes_the_upstream_lookups(protocol: str, tmp_path: Path) -> None:
    """A topic of an older sink (its CREATE messages carry the tidewater header, not the schema): with the schema
    lookup (``--upstream``) the empty table is created from it; without, the first row still decides."""
    broker = feed(protocol)
    strip_ddl_headers(broker)
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}", schemas=lambda t: EMPTY if t == E else None)
    try:
        rebuild(broker, protocol, applier=applier)  # type: ignore[arg-type]
    finally:
        applier.close()
    assert sqlite_columns(db, "e") == [("id", "INTEGER", 1), ("price", "TEXT", 0), ("label", "TEXT", 0)]
    assert sqlite_rows(db, "SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c")]
