"""The consumer library applies column-set DDL exactly (sinks.kafka.applier): a RENAME COLUMN keeps the column's
values, an ADD COLUMN with a constant default fills the rows that existed, from the Kafka sink's ``tidewater-ddl``
header, or from a lone ``ALTER TABLE ... RENAME COLUMN`` statement of another producer; without either, the column
set of the next row decides (drop and add)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cdc.events import DdlChange, DdlEvent, DdlKind, TableName
from cdc.ts import Watermark
from sinks.kafka.applier import SinkApplier, renames_in
from sinks.kafka.headers import DDL_HEADER, ddl_header, parse_ddl
from tests.kafka_sink_fakes import FakeBroker, col, dele, ins, table
from tests.unit.sinks.test_kafka_sink_unit import PROTOCOLS, make, rebuild

pytestmark = pytest.mark.unit

T = TableName("public", "t")


def rows(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def columns(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[1] for r in conn.execute('PRAGMA table_info("t")')]


def ddl(before, after, changes, ts: int, query: str) -> DdlEvent:  # type: ignore[no-untyped-def]
    return DdlEvent(ts, ts / 1000, before.name, tuple(changes), before, after, query, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rename_add_with_default_and_drop_are_applied_at_their_place(protocol: str, tmp_path: Path) -> None:
    broker = FakeBroker(partitions=2)
    sink = make(broker, protocol)
    v1 = table(extra=(col("n", "int4", 23),))
    sink.write([ins(v1, 10, 1, "a", n=1), ins(v1, 10, 2, "b", n=2)])
    # RENAME COLUMN v TO w: the values stay
    v2 = table(version=1, extra=(col("n", "int4", 23),))
    v2 = v2.__class__(v2.name, (v2.columns[0], col("w", "text", 25), v2.columns[2]), v2.key, v2.replica_identity,
                      v2.relation_id, 1)
    sink.apply_ddl(ddl(v1, v2, [DdlChange(DdlKind.RENAME_COLUMN, "v", "w")], 20, 'ALTER TABLE t RENAME v TO w'))
    # ADD COLUMN d int DEFAULT 5: the rows that existed get 5
    d = col("d", "int4", 23)
    d = d.__class__(d.name, d.type_oid, d.base_type, d.is_array, "integer", d.type_modifier, True, False, "5")
    v3 = v2.__class__(v2.name, (*v2.columns, d), v2.key, v2.replica_identity, v2.relation_id, 2)
    sink.apply_ddl(ddl(v2, v3, [DdlChange(DdlKind.ADD_COLUMN, "d")], 30, "ALTER TABLE t ADD COLUMN d int DEFAULT 5"))
    sink.write([ins(v3, 40, 3, w="c", n=3, d=9)])
    # DROP COLUMN n
    v4 = v3.__class__(v3.name, tuple(c for c in v3.columns if c.name != "n"), v3.key, v3.replica_identity,
                      v3.relation_id, 3)
    sink.apply_ddl(ddl(v3, v4, [DdlChange(DdlKind.DROP_COLUMN, "n")], 50, "ALTER TABLE t DROP COLUMN n"))
    sink.write([ins(v4, 60, 4, w="e", d=None)])
    sink.publish_resolved(Watermark(60, 0.06))
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}", schemas=lambda t: None)
    try:
        rebuild(broker, protocol, applier=applier)  # type: ignore[arg-type]
    finally:
        applier.close()
    assert columns(db) == ["id", "w", "d"]
    assert rows(db, "SELECT id, w, d FROM t ORDER BY id") == [(1, "a", 5), (2, "b", 5), (3, "c", 9), (4, "e", None)]


def test_without_the_header_a_lone_rename_statement_is_enough(tmp_path: Path) -> None:
    broker = FakeBroker(partitions=1)
    sink = make(broker, "canal-json")
    v1 = table()
    sink.write([ins(v1, 10, 1, "kept")])
    v2 = v1.__class__(v1.name, (v1.columns[0], col("w", "text", 25)), v1.key, v1.replica_identity,
                      v1.relation_id, 1)
    sink.apply_ddl(ddl(v1, v2, [DdlChange(DdlKind.RENAME_COLUMN, "v", "w")], 20,
                       'ALTER TABLE ONLY public.t RENAME COLUMN v TO "w";'))
    sink.write([ins(v2, 30, 2, w="new")])
    sink.publish_resolved(Watermark(30, 0.03))
    for r in broker.topics["cdc"][0]:  # another producer: no tidewater-ddl header
        r.headers = [(k, v) for k, v in r.headers if k != DDL_HEADER]
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        rebuild(broker, "canal-json", applier=applier)  # type: ignore[arg-type]
    finally:
        applier.close()
    assert rows(db, "SELECT id, w FROM t ORDER BY id") == [(1, "kept"), (2, "new")]


def test_renames_in_reads_one_rename_statement_of_the_table_only() -> None:
    rename = (DdlChange(DdlKind.RENAME_COLUMN, "a", "B c"),)
    assert renames_in('ALTER TABLE IF EXISTS ONLY "public".t * RENAME COLUMN A TO "B c"', T) == rename
    assert renames_in("alter table t rename a to \"B c\" ;", T) == rename
    assert renames_in("ALTER TABLE other RENAME a TO b", T) == ()
    assert renames_in("ALTER TABLE s.t RENAME a TO b", T) == ()
    assert renames_in("ALTER TABLE t RENAME a TO b; ALTER TABLE t RENAME b TO c", T) == ()  # several: not guessed
    assert renames_in("ALTER TABLE t RENAME TO u", T) == ()
    assert renames_in("ALTER TABLE t RENAME CONSTRAINT a TO b", T) == ()


def test_the_ddl_header_round_trips_and_is_absent_for_other_ddl() -> None:
    v1 = table()
    d = col("d", "numeric", 1700)
    v2 = v1.__class__(v1.name, (*v1.columns, d), v1.key, v1.replica_identity, v1.relation_id, 1)
    name, value = ddl_header(ddl(v1, v2, [DdlChange(DdlKind.ADD_COLUMN, "d")], 5, "x"))  # type: ignore[misc]
    assert name == DDL_HEADER
    assert parse_ddl(value) == ((DdlChange(DdlKind.ADD_COLUMN, "d"),), {"d": d}, (), None)
    assert ddl_header(ddl(v1, v1, [DdlChange(DdlKind.SET_NOT_NULL, "v")], 5, "x")) is None
    assert parse_ddl(b"not json") is None and parse_ddl(None) is None


def test_the_ddl_header_carries_what_the_existing_rows_hold_in_added_columns() -> None:
    import dataclasses
    import datetime
    import uuid
    from decimal import Decimal

    from cdc.events import ColumnFill

    v1 = table()
    added = (col("at", "timestamptz", 1184), col("n", "numeric", 1700), col("u", "uuid", 2950),
             col("tags", "int4", 1007), col("w", "timestamptz", 1184), col("e", "text", 25))
    added = (*added[:3], dataclasses.replace(added[3], is_array=True), *added[4:])
    v2 = v1.__class__(v1.name, (*v1.columns, *added), v1.key, v1.replica_identity, v1.relation_id, 1)
    at = datetime.datetime(2026, 11, 28, 8, 6, 35, 839083, tzinfo=datetime.UTC)
    fills = (ColumnFill("at", at), ColumnFill("n", Decimal("1.50")), ColumnFill("u", uuid.UUID(int=7)),
             ColumnFill("tags", [1, 2]), ColumnFill("w", per_row=True), ColumnFill("e", None))
    event = dataclasses.replace(ddl(v1, v2, [DdlChange(DdlKind.ADD_COLUMN, c.name) for c in added], 5, "x"),
                                fills=fills)
    _, value = ddl_header(event)  # type: ignore[misc]
    parsed = parse_ddl(value)
    assert parsed is not None and parsed.fills == fills


def test_a_consumer_restarted_after_a_rename_knows_the_new_shape(tmp_path: Path) -> None:
    """The rename was applied before the restart and no row followed it yet: the restarted consumer re-reads the
    topic (observing what the target holds) and applies the next rows under the new name."""
    broker = FakeBroker(partitions=1)
    sink = make(broker, "canal-json")
    v1 = table()
    v2 = v1.__class__(v1.name, (v1.columns[0], col("w", "text", 25)), v1.key, v1.replica_identity,
                      v1.relation_id, 1)
    sink.write([ins(v1, 10, 1, "kept"), ins(v1, 10, 3, "gone")])
    sink.apply_ddl(ddl(v1, v2, [DdlChange(DdlKind.RENAME_COLUMN, "v", "w")], 20, "ALTER TABLE t RENAME v TO w"))
    sink.write([dele(v2, 25, 3)])  # the target's position moves past the rename; no row shows the new shape
    sink.publish_resolved(Watermark(25, 0.025))
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        rebuild(broker, "canal-json", applier=applier)  # type: ignore[arg-type]
    finally:
        applier.close()
    sink.write([ins(v2, 30, 2, w="new")])
    sink.publish_resolved(Watermark(30, 0.03))
    applier = SinkApplier(f"sqlite:///{db}")  # restarted: resumes after 25
    try:
        core, _ = rebuild(broker, "canal-json", applier=applier)  # type: ignore[arg-type]
        assert core.stats.replayed > 0
    finally:
        applier.close()
    assert rows(db, "SELECT id, w FROM t ORDER BY id") == [(1, "kept"), (2, "new")]
