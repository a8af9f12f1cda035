"""The SQL sink against SQLite files: operations, idempotent replay, UNCHANGED, key changes, identifiers,
value types, chunked atomic transactions, tables without a key, existing tables and error mapping."""

from __future__ import annotations

import datetime as dt
import logging
import random
import sqlite3
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import InvalidURI, SinkError, SinkUnavailable
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.sink import SQLSink

pytestmark = pytest.mark.unit


# ---- helpers ---------------------------------------------------------------------------------------
def col(name: str, base: str = "text", *, key: bool = False, type_name: str = "", typmod: int = -1,
        array: bool = False) -> ColumnSchema:
    return ColumnSchema(name, 0, base, is_array=array, type_name=type_name, type_modifier=typmod,
                        nullable=not key, is_key=key)


def table(name: str, *cols: ColumnSchema, has_key: bool = True, schema: str = "public") -> TableSchema:
    key = tuple(c.name for c in cols if c.is_key) if has_key else tuple(c.name for c in cols)
    return TableSchema(TableName(schema, name), tuple(cols), key, has_key=has_key,
                       replica_identity="d" if has_key else "f")


def ins(s: TableSchema, **values: Any) -> RowChange:
    return RowChange(OpType.INSERT, s, 1, values=values)


def upd(s: TableSchema, values: dict[str, Any], old: dict[str, Any] | None = None) -> RowChange:
    return RowChange(OpType.UPDATE, s, 1, values=values, old_values=old)


def dele(s: TableSchema, **old: Any) -> RowChange:
    return RowChange(OpType.DELETE, s, 1, old_values=old)


def trunc(s: TableSchema) -> RowChange:
    return RowChange(OpType.TRUNCATE, s, 1)


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read(path: Path, name: str, order: str | None = None) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        sql = f"SELECT * FROM {q(name)}"
        if order:
            sql += f" ORDER BY {q(order)}"
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def declared_types(path: Path, name: str) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return {r[1]: r[2] for r in conn.execute(f"PRAGMA table_info({q(name)})")}
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "target.db"


def open_sink(db: Path, batch_rows: int = 1000, params: str = "") -> SQLSink:
    return SQLSink(f"sqlite:///{db}{params}", SinkConfig(batch_rows=batch_rows))


@pytest.fixture
def sink(db: Path) -> Iterator[SQLSink]:
    s = open_sink(db)
    yield s
    s.close()


USERS = table("users", col("id", "int4", key=True), col("name"), col("score", "int4"))


# ---- basic operations ------------------------------------------------------------------------------
def test_insert_update_delete_truncate(sink: SQLSink, db: Path) -> None:
    assert sink.write([ins(USERS, id=1, name="a", score=1), ins(USERS, id=2, name="b", score=2),
                       ins(USERS, id=3, name="c", score=3)]) == 3
    assert read(db, "users", "id") == [(1, "a", 1), (2, "b", 2), (3, "c", 3)]
    assert sink.write([upd(USERS, {"id": 2, "name": "B", "score": 20}), dele(USERS, id=3)]) == 2
    assert read(db, "users", "id") == [(1, "a", 1), (2, "B", 20)]
    assert sink.write([trunc(USERS), ins(USERS, id=9, name="z", score=None)]) == 2
    assert read(db, "users", "id") == [(9, "z", None)]


def test_target_name_drops_the_upstream_schema(sink: SQLSink) -> None:
    assert sink.target_name(TableName("shop", "orders")) == "orders"


def test_created_table_has_key_and_nullable_columns(sink: SQLSink, db: Path) -> None:
    sink.write([ins(USERS, id=1, name="a", score=1)])
    conn = sqlite3.connect(db)
    info = {r[1]: (r[3], r[5]) for r in conn.execute("PRAGMA table_info(users)")}  # notnull, pk
    assert info == {"id": (1, 1), "name": (0, 0), "score": (0, 0)}
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_changes_to_one_key_stay_in_order_within_a_call(sink: SQLSink, db: Path) -> None:
    sink.write([
        ins(USERS, id=1, name="v1", score=1),
        upd(USERS, {"id": 1, "name": "v2", "score": 2}),
        upd(USERS, {"id": 1, "name": "v3", "score": 3}),  # same group as the previous update: last wins
        dele(USERS, id=1),
        ins(USERS, id=1, name="v4", score=4),
        ins(USERS, id=2, name="x", score=0),
        dele(USERS, id=2),
    ])
    assert read(db, "users", "id") == [(1, "v4", 4)]


def test_replay_of_the_same_batch_is_idempotent(sink: SQLSink, db: Path) -> None:
    batch = [
        ins(USERS, id=1, name="a", score=1),
        ins(USERS, id=2, name="b", score=2),
        upd(USERS, {"id": 1, "name": "a2", "score": UNCHANGED}),
        upd(USERS, {"id": 20, "name": "b2", "score": 22}, old={"id": 2}),  # key change
        dele(USERS, id=1),
        ins(USERS, id=3, name="c", score=3),
    ]
    sink.write(batch)
    once = read(db, "users", "id")
    assert once == [(3, "c", 3), (20, "b2", 22)]
    sink.write(batch)
    assert read(db, "users", "id") == once


# ---- UNCHANGED and key changes ---------------------------------------------------------------------
def test_unchanged_columns_keep_their_downstream_value(sink: SQLSink, db: Path) -> None:
    sink.write([ins(USERS, id=1, name="big text", score=1), ins(USERS, id=2, name="other", score=2)])
    sink.write([upd(USERS, {"id": 1, "name": UNCHANGED, "score": 10}),
                upd(USERS, {"id": 2, "name": UNCHANGED, "score": 20})])
    assert read(db, "users", "id") == [(1, "big text", 10), (2, "other", 20)]


def test_unchanged_on_a_missing_row_is_not_filled_with_nulls_and_warns(sink: SQLSink, db: Path) -> None:
    sink.write([upd(USERS, {"id": 5, "name": UNCHANGED, "score": 50})])
    sink.write([upd(USERS, {"id": 6, "name": UNCHANGED, "score": 60})])
    assert read(db, "users", "id") == []  # never a row with NULL in place of the unsent name
    (w,) = sink.take_warnings()
    assert (w.code, w.table, w.severity, w.count, w.keys) == ("CDC:WarnMissingRow", "public.users", "divergence", 2,
                                                              ("5", "6"))
    assert sink.take_warnings() == []


def test_unchanged_on_a_missing_row_is_reread_through_the_row_source(sink: SQLSink, db: Path) -> None:
    asked: list[Any] = []

    def fetch(schema: TableSchema, keys: Any) -> list[dict[str, Any] | None]:
        asked.append(list(keys))
        return [{"id": k[0], "name": f"upstream{k[0]}", "score": 99} if k[0] == 5 else None for k in keys]

    sink.set_row_source(fetch)
    sink.write([ins(USERS, id=1, name="a", score=1)])
    sink.write([upd(USERS, {"id": 5, "name": UNCHANGED, "score": 50}),
                upd(USERS, {"id": 6, "name": UNCHANGED, "score": 60}),
                upd(USERS, {"id": 1, "name": UNCHANGED, "score": 2})])
    assert asked == [[(5,), (6,)]]
    assert read(db, "users", "id") == [(1, "a", 2), (5, "upstream5", 99)]  # 6 is gone upstream: not written
    (w,) = sink.take_warnings()
    assert (w.code, w.severity, w.count, w.keys) == ("CDC:WarnMissingRow", "notice", 2, ("5", "6"))


def test_unchanged_on_existing_rows_does_not_warn(sink: SQLSink, caplog: pytest.LogCaptureFixture) -> None:
    sink.write([ins(USERS, id=1, name="a", score=1)])
    with caplog.at_level(logging.WARNING, logger="sinks.sql.sink"):
        sink.write([upd(USERS, {"id": 1, "name": UNCHANGED, "score": 2})])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_key_change_deletes_the_old_key(sink: SQLSink, db: Path) -> None:
    sink.write([ins(USERS, id=1, name="a", score=1), ins(USERS, id=2, name="b", score=2)])
    sink.write([upd(USERS, {"id": 10, "name": "a", "score": 1}, old={"id": 1})])
    assert read(db, "users", "id") == [(2, "b", 2), (10, "a", 1)]
    # full old row (REPLICA IDENTITY FULL on a keyed table) with an unchanged key: a plain update
    sink.write([upd(USERS, {"id": 2, "name": "bb", "score": 3}, old={"id": 2, "name": "b", "score": 2})])
    assert read(db, "users", "id") == [(2, "bb", 3), (10, "a", 1)]


def test_key_change_with_unchanged_column_moves_the_row(sink: SQLSink, db: Path) -> None:
    sink.write([ins(USERS, id=1, name="toasted", score=1)])
    batch = [upd(USERS, {"id": 7, "name": UNCHANGED, "score": 70}, old={"id": 1})]
    sink.write(batch)
    assert read(db, "users", "id") == [(7, "toasted", 70)]
    sink.write(batch)  # replay: the new key exists, the old one is gone
    assert read(db, "users", "id") == [(7, "toasted", 70)]


def test_key_change_with_unchanged_column_when_new_key_exists(sink: SQLSink, db: Path) -> None:
    # replay onto a future state in which the old key was reused: keep the new row, delete the old key
    sink.write([ins(USERS, id=1, name="reused", score=1), ins(USERS, id=7, name="moved", score=70)])
    sink.write([upd(USERS, {"id": 7, "name": UNCHANGED, "score": 71}, old={"id": 1})])
    assert read(db, "users", "id") == [(7, "moved", 71)]


def test_composite_key(sink: SQLSink, db: Path) -> None:
    s = table("lines", col("order", "int8", key=True), col("line no", "int4", key=True), col("qty", "int4"))
    sink.write([ins(s, **{"order": 1, "line no": 1, "qty": 5}), ins(s, **{"order": 1, "line no": 2, "qty": 6}),
                ins(s, **{"order": 2, "line no": 1, "qty": 7})])
    sink.write([dele(s, **{"order": 1, "line no": 2}),
                upd(s, {"order": 2, "line no": 9, "qty": 8}, old={"order": 2, "line no": 1})])
    assert sorted(read(db, "lines")) == [(1, 1, 5), (2, 9, 8)]


# ---- random sequences against a model ----------------------------------------------------------------
def random_changes(rng: random.Random, s: TableSchema, n: int) -> tuple[list[RowChange], dict[int, tuple[Any, ...]]]:
    """A valid upstream history of ``n`` changes on (id, name, score) and the final table it leaves."""
    model: dict[int, tuple[Any, ...]] = {}
    out: list[RowChange] = []
    for _ in range(n):
        r = rng.random()
        free = [k for k in range(40) if k not in model]
        if (r < 0.35 or not model) and free:
            k = rng.choice(free)
            row = (k, f"n{rng.randrange(1000)}", rng.randrange(100))
            model[k] = row
            out.append(ins(s, id=k, name=row[1], score=row[2]))
        elif r < 0.75:
            k = rng.choice(sorted(model))
            old = model.pop(k)
            new_k = rng.choice(free) if free and rng.random() < 0.2 else k
            name: Any = UNCHANGED if rng.random() < 0.4 else f"u{rng.randrange(1000)}"
            score = rng.randrange(100)
            model[new_k] = (new_k, old[1] if name is UNCHANGED else name, score)
            out.append(upd(s, {"id": new_k, "name": name, "score": score}, old={"id": k} if new_k != k else None))
        elif r < 0.98:
            k = rng.choice(sorted(model))
            del model[k]
            out.append(dele(s, id=k))
        else:
            model.clear()
            out.append(trunc(s))
    return out, model


@pytest.mark.parametrize("seed", range(6))
def test_random_histories_match_the_model_and_replay_converges(db: Path, seed: int) -> None:
    rng = random.Random(seed)
    changes, model = random_changes(rng, USERS, 400)
    sink = open_sink(db, batch_rows=rng.choice([1, 3, 7, 50]))
    try:
        i = 0
        while i < len(changes):  # several calls of random size
            j = i + rng.randrange(1, 60)
            sink.write(changes[i:j])
            i = j
        expected = sorted(model.values())
        assert read(db, "users", "id") == expected
        start = rng.randrange(len(changes))  # replay from an earlier "checkpoint"
        sink.write(changes[start:])
        assert read(db, "users", "id") == expected
    finally:
        sink.close()


# ---- identifiers -----------------------------------------------------------------------------------
WEIRD = ["MixedCase", "with space", 'quo"te', "apo'strophe", "dot.ted", "ünï código 表", "per%cent",
         "back`tick", "select"]


@pytest.mark.parametrize("name", WEIRD)
def test_weird_identifiers(db: Path, name: str) -> None:
    s = table(name, col(name + " id", "int4", key=True), col(name, "text"), col("Other " + name, "int4"),
              schema="Some.Schema")
    sink = open_sink(db)
    try:
        assert sink.target_name(s.name) == name
        sink.write([ins(s, **{name + " id": 1, name: "x", "Other " + name: 1}),
                    ins(s, **{name + " id": 2, name: "y", "Other " + name: 2})])
        sink.write([upd(s, {name + " id": 1, name: UNCHANGED, "Other " + name: 10}),
                    upd(s, {name + " id": 3, name: "z", "Other " + name: 3}, old={name + " id": 2}),
                    dele(s, **{name + " id": 1})])
        assert read(db, name) == [(3, "z", 3)]
        assert list(declared_types(db, name)) == [name + " id", name, "Other " + name]
        sink.write([trunc(s)])
        assert read(db, name) == []
    finally:
        sink.close()


def test_tables_differing_only_in_upstream_schema_land_on_the_same_target(sink: SQLSink) -> None:
    assert sink.target_name(TableName("a", "t")) == sink.target_name(TableName("b", "t"))


# ---- value types -----------------------------------------------------------------------------------
TS = dt.datetime(2024, 2, 29, 12, 34, 56, 123456)
TSTZ = dt.datetime(2024, 2, 29, 10, 0, 0, 5, tzinfo=dt.UTC)
U = uuid.UUID("12345678-1234-5678-1234-567812345678")

# (column, value, what SQLite holds afterwards, declared type)
TYPE_CASES: list[tuple[ColumnSchema, Any, Any, str]] = [
    (col("i2", "int2"), -32768, -32768, "INTEGER"),
    (col("i4", "int4"), 2**31 - 1, 2**31 - 1, "INTEGER"),
    (col("i8", "int8"), -(2**63), -(2**63), "INTEGER"),
    (col("oid", "oid"), 4294967295, 4294967295, "INTEGER"),
    # numeric is always the exact decimal text (TEXT affinity): trailing zeros kept, never 1E-7 or a REAL
    (col("money", "numeric", type_name="numeric(12,2)", typmod=(12 << 16 | 2) + 4), Decimal("1234.50"), "1234.50",
     "TEXT"),
    (col("tiny", "numeric", type_name="numeric(12,7)", typmod=(12 << 16 | 7) + 4), Decimal("0.0000001"),
     "0.0000001", "TEXT"),
    (col("zeros", "numeric", type_name="numeric(10,8)", typmod=(10 << 16 | 8) + 4), Decimal("0.00000000"),
     "0.00000000", "TEXT"),
    (col("int_num", "numeric", type_name="numeric(5,0)", typmod=(5 << 16) + 4), Decimal("12345"), "12345", "TEXT"),
    (col("big", "numeric", type_name="numeric"), Decimal("12345678901234567890.123456789012"),
     "12345678901234567890.123456789012", "TEXT"),
    (col("wide", "numeric", type_name="numeric(30,10)"), Decimal("-1.0000000001"), "-1.0000000001", "TEXT"),
    (col("nan", "numeric"), Decimal("NaN"), "NaN", "TEXT"),
    (col("inf", "numeric"), Decimal("-Infinity"), "-Infinity", "TEXT"),
    (col("f4", "float4"), 1.5, 1.5, "REAL"),
    (col("f8", "float8"), 0.1, 0.1, "REAL"),
    (col("f8inf", "float8"), float("inf"), float("inf"), "REAL"),
    (col("f8nan", "float8"), float("nan"), "NaN", "REAL"),
    (col("flag", "bool"), True, 1, "BOOLEAN"),
    (col("t", "text"), "tëxt ☃ 🎉 'q' \"d\"", "tëxt ☃ 🎉 'q' \"d\"", "TEXT"),
    (col("vc", "varchar", type_name="character varying(20)"), "abc", "abc", "TEXT"),
    (col("bp", "bpchar", type_name="character(5)"), "ab   ", "ab   ", "TEXT"),
    (col("ch", "char", type_name='"char"'), "x", "x", "TEXT"),
    (col("nm", "name"), "pg_class", "pg_class", "TEXT"),
    (col("bin", "bytea"), b"\x00\xff\x10", b"\x00\xff\x10", "BLOB"),
    (col("d", "date"), dt.date(2024, 2, 29), "2024-02-29", "DATE"),
    (col("d_inf", "date"), "infinity", "infinity", "DATE"),
    (col("tm", "time"), dt.time(23, 59, 59, 1), "23:59:59.000001", "TIME"),
    (col("tmtz", "timetz"), "12:00:00+02", "12:00:00+02", "TEXT"),
    (col("ts", "timestamp"), TS, "2024-02-29 12:34:56.123456", "DATETIME"),
    (col("tstz", "timestamptz"), TSTZ, "2024-02-29 10:00:00.000005+00:00", "DATETIME"),
    (col("iv", "interval"), "1 year 2 mons 3 days 04:05:06", "1 year 2 mons 3 days 04:05:06", "TEXT"),
    (col("u", "uuid"), U, str(U), "TEXT"),
    (col("j", "json"), '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}', "TEXT"),
    (col("jb", "jsonb"), '{"a": [1, 2], "b": 1}', '{"a": [1, 2], "b": 1}', "TEXT"),
    (col("mood", "mood"), "happy", "happy", "TEXT"),
    (col("ia", "int4", array=True), [1, None, 3], "[1, null, 3]", "TEXT"),
    (col("ta", "text", array=True), ['a "q"', "NULL", None, "é"], '["a \\"q\\"", "NULL", null, "é"]', "TEXT"),
    (col("na", "numeric", array=True), [Decimal("1.50"), Decimal("NaN"), Decimal("0.0000001")],
     '["1.50", "NaN", "0.0000001"]', "TEXT"),
    (col("tsa", "timestamptz", array=True), [TSTZ], '["2024-02-29 10:00:00.000005+00:00"]', "TEXT"),
    (col("ba", "bytea", array=True), [b"\x01"], '["\\\\x01"]', "TEXT"),
    (col("ua", "uuid", array=True), [U], f'["{U}"]', "TEXT"),
    (col("empty", "int4", array=True), [], "[]", "TEXT"),
    (col("nested", "int4", array=True), [[1, 2], [3, 4]], "[[1, 2], [3, 4]]", "TEXT"),
]


def test_every_value_type_round_trips(sink: SQLSink, db: Path) -> None:
    s = table("types", col("id", "int4", key=True), *[c for c, *_ in TYPE_CASES])
    full = {"id": 1, **{c.name: v for c, v, *_ in TYPE_CASES}}
    nulls = {"id": 2, **{c.name: None for c, *_ in TYPE_CASES}}
    sink.write([ins(s, **full), ins(s, **nulls)])
    rows = read(db, "types", "id")
    assert rows[1] == (2,) + (None,) * len(TYPE_CASES)
    got = dict(zip(["id"] + [c.name for c, *_ in TYPE_CASES], rows[0], strict=True))
    for c, _value, stored, _ in TYPE_CASES:
        assert got[c.name] == stored, c.name
    assert declared_types(db, "types") == {"id": "INTEGER", **{c.name: t for c, _, _, t in TYPE_CASES}}
    # the same values as keys of deletes and updates find their rows again
    sink.write([upd(s, full), dele(s, id=2)])
    assert len(read(db, "types")) == 1


@pytest.mark.parametrize("c,value", [
    (col("k", "uuid", key=True), U),
    (col("k", "timestamptz", key=True), TSTZ),
    (col("k", "timestamp", key=True), TS),
    (col("k", "numeric", key=True), Decimal("1.50")),
    (col("k", "float4", key=True), 1.1),
    (col("k", "bytea", key=True), b"\x00k"),
    (col("k", "date", key=True), dt.date(2020, 1, 1)),
    (col("k", "text", key=True), "Key"),
])
def test_keys_of_every_kind_are_found_again(sink: SQLSink, db: Path, c: ColumnSchema, value: Any) -> None:
    s = table("keys", c, col("v", "int4"))
    sink.write([ins(s, k=value, v=1), ins(s, k=value, v=2)])  # second insert = upsert of the same key
    assert len(read(db, "keys")) == 1
    sink.write([upd(s, {"k": value, "v": 3})])
    assert [r[1] for r in read(db, "keys")] == [3]
    sink.write([dele(s, k=value)])
    assert read(db, "keys") == []


# ---- transactions ----------------------------------------------------------------------------------
def test_a_large_transaction_is_flushed_in_chunks_and_stays_atomic(db: Path) -> None:
    sink = open_sink(db, batch_rows=100)
    try:
        sink.write([ins(USERS, id=0, name="before", score=0)])
        consumed = 0

        def changes() -> Iterator[RowChange]:
            nonlocal consumed
            for i in range(1, 5001):
                consumed += 1
                yield ins(USERS, id=i, name=f"n{i}", score=i)
            consumed += 1
            yield ins(USERS, id=5001, name=object(), score=0)  # the driver cannot bind it: fails at the end

        with pytest.raises(SinkError, match="users"):
            sink.write(changes())
        assert consumed == 5001
        assert read(db, "users") == [(0, "before", 0)]  # nothing of the failed call was committed
        sink.write([ins(USERS, id=1, name="after", score=1)])  # the sink is usable again
        assert len(read(db, "users")) == 2
    finally:
        sink.close()


def test_the_iterable_is_consumed_lazily(db: Path) -> None:
    sink = open_sink(db, batch_rows=100)
    consumed = 0

    def changes() -> Iterator[RowChange]:
        nonlocal consumed
        for i in range(10000):
            consumed += 1
            yield ins(USERS, id=None if i == 150 else i, name="x", score=0)

    try:
        with pytest.raises(SinkError):
            sink.write(changes())
        # the bad row was executed with its chunk (rows 100..199), long before the end of the iterable
        assert consumed <= 300
        assert not read_tables(db)
    finally:
        sink.close()


def read_tables(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    finally:
        conn.close()


def test_a_failed_write_rolls_back_tables_it_created(db: Path) -> None:
    sink = open_sink(db)
    try:
        with pytest.raises(SinkError):
            sink.write([ins(USERS, id=1, name="a", score=1), ins(USERS, id=None, name="b", score=2)])
        assert read_tables(db) == []
        sink.write([ins(USERS, id=1, name="a", score=1)])  # recreated after the rollback
        assert read(db, "users") == [(1, "a", 1)]
    finally:
        sink.close()


def test_a_busy_database_is_unavailable_not_fatal(db: Path) -> None:
    sink = open_sink(db, params="?busy-timeout=0.2")
    try:
        sink.write([ins(USERS, id=1, name="a", score=1)])
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(SinkUnavailable):
                sink.write([ins(USERS, id=2, name="b", score=2)])
        finally:
            other.execute("ROLLBACK")
            other.close()
        sink.write([ins(USERS, id=2, name="b", score=2)])
        assert len(read(db, "users")) == 2
    finally:
        sink.close()


# ---- tables without a key --------------------------------------------------------------------------
LOG = table("log", col("a", "int4"), col("b", "text"), has_key=False)


def test_keyless_table_inserts_and_matches_one_row_by_all_old_values(sink: SQLSink, db: Path) -> None:
    sink.write([ins(LOG, a=1, b="x"), ins(LOG, a=1, b="x"), ins(LOG, a=2, b=None), ins(LOG, a=2, b=None)])
    assert len(read(db, "log")) == 4
    sink.write([dele(LOG, a=1, b="x"), dele(LOG, a=2, b=None)])  # one of each pair, NULL matched
    assert sorted(read(db, "log"), key=repr) == [(1, "x"), (2, None)]
    sink.write([upd(LOG, {"a": 3, "b": "y"}, old={"a": 2, "b": None})])
    assert sorted(read(db, "log"), key=repr) == [(1, "x"), (3, "y")]
    sink.write([upd(LOG, {"a": 4, "b": UNCHANGED}, old={"a": 3, "b": UNCHANGED})])
    assert sorted(read(db, "log"), key=repr) == [(1, "x"), (4, "y")]
    conn = sqlite3.connect(db)
    assert [r[5] for r in conn.execute("PRAGMA table_info(log)")] == [0, 0]  # no primary key
    conn.close()


def test_keyless_update_without_old_row_is_an_error(sink: SQLSink) -> None:
    with pytest.raises(SinkError, match="REPLICA IDENTITY FULL"):
        sink.write([upd(LOG, {"a": 1, "b": "x"})])


# ---- existing tables -------------------------------------------------------------------------------
def test_existing_table_is_used_as_is(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute('CREATE TABLE users ("ID" INTEGER PRIMARY KEY, "Name" VARCHAR(10), score INTEGER, '
                 "extra TEXT DEFAULT 'd')")
    conn.close()
    sink = open_sink(db)
    try:
        sink.write([ins(USERS, id=1, name="a", score=1), upd(USERS, {"id": 1, "name": UNCHANGED, "score": 2})])
        assert read(db, "users") == [(1, "a", 2, "d")]
    finally:
        sink.close()


def test_existing_table_without_a_column_is_an_error(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    sink = open_sink(db)
    try:
        with pytest.raises(SinkError, match="score"):
            sink.write([ins(USERS, id=1, name="a", score=1)])
    finally:
        sink.close()


def test_existing_table_without_a_unique_key_is_an_error(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (id INTEGER, name TEXT, score INTEGER)")
    conn.close()
    sink = open_sink(db)
    try:
        with pytest.raises(SinkError, match="primary key or unique index"):
            sink.write([ins(USERS, id=1, name="a", score=1)])
    finally:
        sink.close()


def test_existing_table_with_a_unique_index_on_the_key_works(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users (rid INTEGER PRIMARY KEY, id INTEGER, name TEXT, score INTEGER)")
    conn.execute("CREATE UNIQUE INDEX users_id ON users (id)")
    conn.close()
    sink = open_sink(db)
    try:
        sink.write([ins(USERS, id=1, name="a", score=1), ins(USERS, id=1, name="b", score=2)])
        assert [r[1:] for r in read(db, "users")] == [(1, "b", 2)]
    finally:
        sink.close()


def test_a_new_schema_version_with_a_new_column_needs_the_column_downstream(sink: SQLSink) -> None:
    sink.write([ins(USERS, id=1, name="a", score=1)])
    v2 = TableSchema(USERS.name, USERS.columns + (col("added", "int4"),), USERS.key, version=2)
    with pytest.raises(SinkError, match="added"):
        sink.write([ins(v2, id=2, name="b", score=2, added=1)])


# ---- errors ----------------------------------------------------------------------------------------
def test_check_names_a_missing_directory(tmp_path: Path) -> None:
    sink = SQLSink(f"sqlite:///{tmp_path}/missing/dir/x.db")
    try:
        with pytest.raises(SinkError, match="create its directory"):
            sink.check()
    finally:
        sink.close()


def test_check_succeeds_and_creates_the_file(db: Path, sink: SQLSink) -> None:
    sink.check()
    assert db.exists()


def test_unknown_uri_parameter_is_rejected(db: Path) -> None:
    with pytest.raises(InvalidURI, match="frobnicate"):
        SQLSink(f"sqlite:///{db}?frobnicate=1")


def test_a_value_the_driver_cannot_bind_names_the_table(sink: SQLSink) -> None:
    s = table("odd", col("id", "int4", key=True), col("v", "mood"))
    with pytest.raises(SinkError, match="odd"):
        sink.write([ins(s, id=1, v=object())])


def test_write_after_close_is_refused(db: Path) -> None:
    sink = open_sink(db)
    sink.close()
    with pytest.raises(SinkError, match="closed"):
        sink.write([ins(USERS, id=1, name="a", score=1)])
