"""The Kafka sink and the consumer library against a real broker (tansu; docs/sinks.md "Test broker"): each protocol
rebuilt into SQLite through an SQL sink (DDL and TRUNCATE applied in order, the consumer resuming where it
stopped), a claim-checked row, transactions (commit visible, the span's position read back from the metadata topic,
a restart resuming after it, a fenced producer refused); a table created empty rebuilt into SQLite and PostgreSQL at
its CREATE TABLE, its replay a no-op, a target table of another shape refused."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from kafka_records import records

from cdc.config import DispatcherRule, SinkConfig
from cdc.errors import SinkError, SinkFenced
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from cdc.ts import Watermark
from playground.compare import sqlalchemy_url
from playground.servers import KafkaServer
from sinks.base import CheckpointSink
from sinks.kafka.applier import SinkApplier
from sinks.kafka.consumer import rebuild
from sinks.kafka.sink import KafkaSink, default_transport

pytestmark = pytest.mark.integration

T = TableName("public", "orders")


def schema(extra: bool = False) -> TableSchema:
    cols = [ColumnSchema("id", 20, "int8", False, "bigint", nullable=False, is_key=True),
            ColumnSchema("name", 25, "text", False, "text"),
            ColumnSchema("amount", 1700, "numeric", False, "numeric"),
            ColumnSchema("at", 1184, "timestamptz", False, "timestamp with time zone")]
    if extra:
        cols.append(ColumnSchema("note", 25, "text", False, "text"))
    return TableSchema(T, tuple(cols), ("id",), "d", 4242, 1 if extra else 0)


AT = dt.datetime(2026, 1, 2, 3, 4, 5, 678900, tzinfo=dt.UTC)


def row(i: int, extra: bool = False, **over: Any) -> dict[str, Any]:
    values = {"id": i, "name": f"n{i}", "amount": Decimal(i) / 4, "at": AT}
    if extra:
        values["note"] = f"note {i}"
    values.update(over)
    return values


@pytest.fixture
def sinks() -> Iterator[list[KafkaSink]]:
    opened: list[KafkaSink] = []
    yield opened
    for s in opened:
        s.close()


def open_sink(opened: list[KafkaSink], uri: str, span: tuple[str, int, int] = ("cf", 0, 1),
              dispatchers: tuple[DispatcherRule, ...] = (), transport_factory: Any = None) -> KafkaSink:
    sink = KafkaSink(uri, SinkConfig(dispatchers=dispatchers), transport_factory=transport_factory)
    opened.append(sink)
    sink.check()
    sink.bind_span(*span)
    sink.open_position(span[0], span[1], 1)
    return sink


def target_rows(db: Path, columns: str = "id, name, amount, at") -> list[tuple[Any, ...]]:
    """The target table's rows by key (the columns named: open-protocol orders them by name)."""
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT {columns} FROM orders ORDER BY id").fetchall()


@pytest.mark.parametrize(("protocol", "producer"), [("canal-json", "kafka-python"), ("open-protocol", "kafka-python"),
                                                    ("debezium", "kafka-python"), ("canal-json", "confluent-kafka")])
def test_each_protocol_rebuilds_the_table_with_ddl_in_order(kafka_server: KafkaServer, kafka_topic: str,
                                                            tmp_path: Path, protocol: str, producer: str,
                                                            sinks: list[KafkaSink]) -> None:
    uri = kafka_server.uri(kafka_topic, protocol=protocol, partition_num="3", kafka_producer=producer)
    sink = open_sink(sinks, uri, dispatchers=(DispatcherRule(("public.*",), "", "index-value"),))
    s0, s1 = schema(), schema(True)
    sink.write([RowChange(OpType.INSERT, s0, 100, 1.0, row(i)) for i in range(1, 31)])
    sink.write([RowChange(OpType.UPDATE, s0, 110, 1.1, row(i, name=f"u{i}")) for i in range(1, 11)]
               + [RowChange(OpType.DELETE, s0, 110, 1.1, None, {"id": i}) for i in range(11, 16)])
    sink.write([RowChange(OpType.UPDATE, s0, 115, 1.15, row(99), {"id": 30})])  # a key change: 30 -> 99
    # one transaction split around its DDL: a row before it, the DDL, a row after it
    sink.write([RowChange(OpType.INSERT, s0, 120, 1.2, row(45))])
    sink.apply_ddl(DdlEvent(120, 1.2, T, (DdlChange(DdlKind.ADD_COLUMN, "note"),), s0, s1,
                            "ALTER TABLE orders ADD note text"))
    sink.write([RowChange(OpType.INSERT, s1, 120, 1.2, row(46, True))])
    sink.write([RowChange(OpType.INSERT, s1, 130, 1.3, row(i, True)) for i in range(40, 45)])
    sink.publish_resolved(Watermark(130, 1.3))
    db = tmp_path / "target.db"
    applier = SinkApplier(f"sqlite:///{db}", position=f"kafka:{kafka_topic}")
    try:
        core = rebuild([kafka_server.bootstrap], [kafka_topic], protocol, applier, until=130, timeout=30)
    finally:
        applier.close()
    assert core.stats.duplicates == 0
    got = target_rows(db, "id, name, amount, at, note")
    expected = sorted([(i, f"u{i}", str(Decimal(i) / 4), None) for i in range(1, 11)]
                      + [(i, f"n{i}", str(Decimal(i) / 4), None) for i in range(16, 30)]
                      + [(99, "n99", str(Decimal(99) / 4), None)]
                      + [(i, f"n{i}", str(Decimal(i) / 4), f"note {i}") for i in range(40, 45)]
                      + [(45, "n45", str(Decimal(45) / 4), None), (46, "n46", str(Decimal(46) / 4), "note 46")])
    assert [(r[0], r[1], str(Decimal(str(r[2]))), r[4]) for r in got] == \
        [(i, n, str(Decimal(a)), note) for i, n, a, note in expected]

    # a TRUNCATE and more rows; the consumer, restarted, resumes after what the target holds
    sink.write([RowChange(OpType.TRUNCATE, s1, 140, 1.4), RowChange(OpType.INSERT, s1, 140, 1.4, row(7, True))])
    sink.publish_resolved(Watermark(140, 1.4))
    applier = SinkApplier(f"sqlite:///{db}", position=f"kafka:{kafka_topic}")
    try:
        core = rebuild([kafka_server.bootstrap], [kafka_topic], protocol, applier, until=140, timeout=30)
    finally:
        applier.close()
    assert [r[0] for r in target_rows(db)] == [7]
    assert core.stats.replayed > 0  # everything up to 130 was read again and skipped


def test_claim_checked_row_is_rebuilt_in_full(kafka_server: KafkaServer, kafka_topic: str, tmp_path: Path,
                                              sinks: list[KafkaSink]) -> None:
    store = tmp_path / "claims"
    uri = kafka_server.uri(kafka_topic, protocol="canal-json", max_message_bytes="4096",
                           large_message_handle_option="claim-check", claim_check_storage_uri=f"file://{store}")
    sink = open_sink(sinks, uri)
    s0 = schema()
    sink.write([RowChange(OpType.INSERT, s0, 100, 1.0, row(1, name="x" * 20_000)),
                RowChange(OpType.INSERT, s0, 100, 1.0, row(2))])
    sink.publish_resolved(Watermark(100, 1.0))
    assert len(list(store.rglob("*.json"))) == 1
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        rebuild([kafka_server.bootstrap], [kafka_topic], "canal-json", applier, until=100, timeout=30)
    finally:
        applier.close()
    assert [(r[0], len(r[1])) for r in target_rows(db)] == [(1, 20_000), (2, 2)]


@pytest.mark.parametrize("producer", ["kafka-python", "confluent-kafka"])
def test_transactional_position_survives_a_restart_and_a_zombie_is_fenced(
        kafka_server: KafkaServer, kafka_topic: str, tmp_path: Path, sinks: list[KafkaSink], producer: str) -> None:
    """What tansu can show of exactly-once (docs/sinks.md): commits are visible to read_committed consumers, the
    span's position is read back from the metadata topic, a restart resumes after it, the old producer is
    fenced. (That aborted transactions stay invisible cannot be shown: tansu shows them.)"""
    uri = kafka_server.uri(kafka_topic, protocol="open-protocol", partition_num="2", kafka_transactional="true",
                           kafka_producer=producer)
    s0 = schema()
    old = open_sink(sinks, uri)
    assert old.write([RowChange(OpType.INSERT, s0, 100 + i, 1.0, row(i)) for i in range(10)]) == 10
    new = open_sink(sinks, uri)  # the span moved: the new holder reads the position and fences the old one
    assert new.applied == (109, 0)  # the position read back
    with pytest.raises(SinkFenced):
        old.write([RowChange(OpType.INSERT, s0, 110, 1.0, row(50))])
    assert new.write([RowChange(OpType.INSERT, s0, 100 + i, 1.0, row(i)) for i in range(12)]) == 2  # replay
    new.publish_resolved(Watermark(111, 1.1))
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        core = rebuild([kafka_server.bootstrap], [kafka_topic], "open-protocol", applier, until=111, timeout=30)
    finally:
        applier.close()
    assert [r[0] for r in target_rows(db)] == list(range(12))
    assert core.stats.duplicates == 0


def test_a_position_whose_transaction_was_aborted_is_not_read_back(
        kafka_server: KafkaServer, kafka_topic: str, tmp_path: Path, sinks: list[KafkaSink]) -> None:
    """A capture that dies after its position reached the metadata topic and before its commit: the broker aborts
    that transaction when the span's next holder opens its producer. tansu shows the aborted record to read_committed
    consumers, and the next holder used to take it as its position and skip a transaction never committed (the kill
    test lost 342 changes for a plain read_committed consumer). The position must be the last committed one."""
    uri = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="2", kafka_transactional="true",
                           dial_timeout="2s", read_timeout="2s", write_timeout="2s", delivery_timeout="3s")
    s0 = schema()
    producers: list[tuple[str | None, Any]] = []  # (transactional id, transport) of the old sink

    def keep(options: Any, tid: str | None) -> Any:
        producers.append((tid, default_transport(options, tid)))
        return producers[-1][1]

    old = open_sink(sinks, uri, transport_factory=keep)
    assert old.write([RowChange(OpType.INSERT, s0, 100 + i, 1.0, row(i)) for i in range(10)]) == 10
    taken: list[KafkaSink] = []
    calls: list[int] = []

    def die_before_commit() -> None:  # the sink's fence: once after the rows, once after the position
        calls.append(1)
        if len(calls) < 2:
            return
        (producer,) = [t for tid, t in producers if tid]  # the span's transactional producer
        producer.flush()  # the rows and the position are on the broker, not committed
        taken.append(open_sink(sinks, uri))  # the next holder: its producer aborts the open transaction
        raise RuntimeError("killed before the commit")

    with pytest.raises((RuntimeError, SinkFenced)):
        old.write([RowChange(OpType.INSERT, s0, 110 + i, 1.0, row(10 + i)) for i in range(5)], die_before_commit)
    new = taken[0]
    assert new.applied == (109, 0), new.applied  # not (114, 0): that transaction was aborted
    assert new.write([RowChange(OpType.INSERT, s0, 100 + i, 1.0, row(i)) for i in range(15)]) == 5  # sent again
    new.publish_resolved(Watermark(115, 1.2))
    ids = Counter(row["id"] for r in records(kafka_server, kafka_topic, markers=True, partitions=2)
                  if r.value and (m := json.loads(r.value)).get("type") == "INSERT" for row in m["data"])
    assert ids == Counter({str(i): 1 for i in range(15)}), ids  # each row once for a read_committed consumer


def test_the_owner_checkpoint_alone_lets_the_consumer_cut(kafka_server: KafkaServer, kafka_topic: str,
                                                          tmp_path: Path, sinks: list[KafkaSink]) -> None:
    """Two spans without span watermarks (span-watermarks=auto, span-count 2): only the changefeed checkpoint, which
    the owner publishes through its own sink instance (publish_checkpoint, no header), gives the cut points."""
    uri = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="2")
    s0 = schema()
    a = open_sink(sinks, uri, span=("cf", 0, 2))
    b = open_sink(sinks, uri, span=("cf", 1, 2))
    assert a.watermark_interval == b.watermark_interval == 0
    a.write([RowChange(OpType.INSERT, s0, 100, 1.0, row(1))])
    b.write([RowChange(OpType.INSERT, s0, 105, 1.05, row(2))])
    a.write([RowChange(OpType.INSERT, s0, 110, 1.1, row(3))])
    owner = KafkaSink(uri)
    sinks.append(owner)
    assert isinstance(owner, CheckpointSink)
    owner.publish_checkpoint(105, 1.05)  # 110 is written but not yet the changefeed's checkpoint
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        core = rebuild([kafka_server.bootstrap], [kafka_topic], "canal-json", applier, until=105, timeout=30)
    finally:
        applier.close()
    assert core.applied == 105 and [r[0] for r in target_rows(db)] == [1, 2]


E = TableName("public", "empty_one")
EMPTY = TableSchema(E, (ColumnSchema("id", 20, "int8", False, "bigint", nullable=False, is_key=True),
                        ColumnSchema("price", 1700, "numeric", False, "numeric(10,2)", 655366),
                        ColumnSchema("label", 1043, "varchar", False, "character varying(20)", 24, nullable=False)),
                    ("id",), "d", 4343, 0)


def create(s: TableSchema, ts: int) -> DdlEvent:
    return DdlEvent(ts, ts / 1000, s.name, (DdlChange(DdlKind.CREATE_TABLE),), None, s, f"CREATE TABLE {s.name}")


def target_columns(uri: str, table: str) -> list[tuple[str, str]]:
    """(column, type as the target's catalog names it) of ``public.<table>`` (SQLite: ``<table>``), in order."""
    engine = sa.create_engine(sqlalchemy_url(uri))
    try:
        schema = None if uri.startswith("sqlite") else "public"
        cols = sa.inspect(engine).get_columns(table, schema=schema)
        return [(c["name"], str(c["type"])) for c in cols]
    finally:
        engine.dispose()


def test_an_empty_created_table_is_rebuilt_into_sqlite_and_postgresql_and_its_replay_is_a_no_op(
        kafka_server: KafkaServer, kafka_topic: str, tmp_path: Path, pg_server: Any, pg_database: str,
        sinks: list[KafkaSink]) -> None:
    """CREATE TABLE of a table that stays empty, then of one with rows in the same transaction: the consumer creates
    both at their CREATE messages (the schema from the tidewater-ddl header), in SQLite and PostgreSQL; started again
    under a new position (from the start), each CREATE finds its table in that shape and is a no-op; a target table
    of another shape stops it naming both."""
    uri = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="2")
    sink = open_sink(sinks, uri)
    s0 = schema()
    sink.apply_ddl(create(EMPTY, 100))
    sink.apply_ddl(DdlEvent(110, 1.1, T, (DdlChange(DdlKind.CREATE_TABLE),), None, s0, "CREATE TABLE orders", 0))
    sink.write([RowChange(OpType.INSERT, s0, 110, 1.1, row(i)) for i in range(1, 6)])
    sink.write([RowChange(OpType.DELETE, s0, 120, 1.2, None, {"id": 2})])
    sink.publish_resolved(Watermark(120, 1.2))
    db = pg_database  # the PostgreSQL target
    expected_rows = [(i, f"n{i}", Decimal(i) / 4) for i in (1, 3, 4, 5)]
    for target in (f"sqlite:///{tmp_path / 't.db'}", pg_server.uri(db)):
        for position in ("kafka:first", "kafka:again"):
            applier = SinkApplier(target, position=position)
            try:
                rebuild([kafka_server.bootstrap], [kafka_topic], "canal-json", applier, until=120, timeout=30)
            finally:
                applier.close()
            columns = target_columns(target, "empty_one")
            assert [c for c, _ in columns] == ["id", "price", "label"], (target, columns)
            if target.startswith("postgresql"):
                assert [t for _, t in columns] == ["BIGINT", "NUMERIC(10, 2)", "VARCHAR(20)"], columns
            engine = sa.create_engine(sqlalchemy_url(target))
            try:
                with engine.connect() as conn:
                    assert conn.execute(sa.text("SELECT count(*) FROM empty_one")).scalar() == 0
                    got = conn.execute(sa.text("SELECT id, name, amount FROM orders ORDER BY id")).fetchall()
            finally:
                engine.dispose()
            assert [(r[0], r[1], Decimal(str(r[2]))) for r in got] == expected_rows, (target, position)
    # the target table of another shape: the consumer stops, naming the table and both shapes
    engine = sa.create_engine(sqlalchemy_url(pg_server.uri(db)))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE empty_one"))
            conn.execute(sa.text("CREATE TABLE empty_one (id bigint PRIMARY KEY, price numeric(10,2))"))
    finally:
        engine.dispose()
    applier = SinkApplier(pg_server.uri(db), position="kafka:third")
    try:
        with pytest.raises(SinkError, match=r"public\.empty_one.*label character varying\(20\).*"
                                            r"public\.empty_one \(id, price; unique \(id\)\)"):
            rebuild([kafka_server.bootstrap], [kafka_topic], "canal-json", applier, until=120, timeout=30)
    finally:
        applier.close()
