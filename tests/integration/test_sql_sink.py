"""The SQL sink against real MariaDB and PostgreSQL servers: the same scenarios as the SQLite unit tests
(operations, replay, UNCHANGED, key changes, identifiers, value types, atomic chunked transactions, tables
without a key, existing tables) plus what only a server can show: created types, collations, connection
loss mid-transaction and unreachable or misconfigured targets."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import SinkError, SinkUnavailable
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from playground.servers import free_port
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from sinks.sql.target import connection as connection_module

pytestmark = pytest.mark.integration


# ---- helpers ---------------------------------------------------------------------------------------
def col(name: str, base: str = "text", *, key: bool = False, type_name: str = "", typmod: int = -1,
        array: bool = False) -> ColumnSchema:
    return ColumnSchema(name, 0, base, is_array=array, type_name=type_name, type_modifier=typmod,
                        nullable=not key, is_key=key)


def table(name: str, *cols: ColumnSchema, has_key: bool = True, schema: str = "public") -> TableSchema:
    key = tuple(c.name for c in cols if c.is_key) if has_key else tuple(c.name for c in cols)
    return TableSchema(TableName(schema, name), tuple(cols), key, has_key=has_key)


def ins(s: TableSchema, **values: Any) -> RowChange:
    return RowChange(OpType.INSERT, s, 1, values=values)


def upd(s: TableSchema, values: dict[str, Any], old: dict[str, Any] | None = None) -> RowChange:
    return RowChange(OpType.UPDATE, s, 1, values=values, old_values=old)


def dele(s: TableSchema, **old: Any) -> RowChange:
    return RowChange(OpType.DELETE, s, 1, old_values=old)


def trunc(s: TableSchema) -> RowChange:
    return RowChange(OpType.TRUNCATE, s, 1)


@dataclass
class Target:
    kind: str  # "mariadb" or "postgresql"
    server: Any
    db: str

    @property
    def uri(self) -> str:
        return self.server.uri(self.db)

    def sink(self, batch_rows: int = 1000) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(batch_rows=batch_rows))
        assert isinstance(s, SQLSink)
        return s

    def ident(self, name: str) -> str:
        if self.kind == "mariadb":
            return "`" + name.replace("`", "``") + "`"
        return '"' + name.replace('"', '""') + '"'

    def qualified(self, name: str, schema: str = "public") -> str:
        if self.kind == "mariadb":
            return self.ident(name)
        return f"{self.ident(schema)}.{self.ident(name)}"

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]] | None:
        return self.server.execute(sql, db=self.db, params=params)

    def rows(self, name: str, order: str | None = None, schema: str = "public", cols: str = "*") -> list[tuple[Any, ...]]:
        sql = f"SELECT {cols} FROM {self.qualified(name, schema)}"
        if order:
            sql += f" ORDER BY {self.ident(order)}"
        return [tuple(r) for r in self.execute(sql) or []]

    def sink_connections(self) -> int:
        """Terminate the sink's server connections; return how many there were."""
        if self.kind == "postgresql":
            res = self.server.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND application_name LIKE 'tidewater-sink-%%'", params=(self.db,))
            return len(res or [])
        ids = self.server.execute(
            "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> CONNECTION_ID()",
            params=(self.db,)) or []
        for (cid,) in ids:
            self.server.execute(f"KILL CONNECTION {int(cid)}")
        return len(ids)


@pytest.fixture(params=["mariadb", "postgresql"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "mariadb":
        return Target("mariadb", request.getfixturevalue("mariadb_server"), request.getfixturevalue("mariadb_database"))
    return Target("postgresql", request.getfixturevalue("pg_server"), request.getfixturevalue("pg_database"))


@pytest.fixture
def mariadb(request: pytest.FixtureRequest) -> Target:
    return Target("mariadb", request.getfixturevalue("mariadb_server"), request.getfixturevalue("mariadb_database"))


@pytest.fixture
def postgres(request: pytest.FixtureRequest) -> Target:
    return Target("postgresql", request.getfixturevalue("pg_server"), request.getfixturevalue("pg_database"))


@pytest.fixture
def sink(target: Target) -> Iterator[SQLSink]:
    s = target.sink()
    s.check()
    yield s
    s.close()


USERS = table("users", col("id", "int4", key=True), col("name"), col("score", "int4"))


# ---- operations ------------------------------------------------------------------------------------
def test_insert_update_delete_truncate(target: Target, sink: SQLSink) -> None:
    sink.write([ins(USERS, id=i, name=f"n{i}", score=i) for i in range(1, 4)])
    assert target.rows("users", "id") == [(1, "n1", 1), (2, "n2", 2), (3, "n3", 3)]
    sink.write([upd(USERS, {"id": 2, "name": "B", "score": 20}), dele(USERS, id=3)])
    assert target.rows("users", "id") == [(1, "n1", 1), (2, "B", 20)]
    sink.write([trunc(USERS), ins(USERS, id=9, name="z", score=None)])
    assert target.rows("users", "id") == [(9, "z", None)]


def test_replay_and_key_changes(target: Target, sink: SQLSink) -> None:
    batch = [
        ins(USERS, id=1, name="a", score=1),
        ins(USERS, id=2, name="b", score=2),
        upd(USERS, {"id": 1, "name": "a2", "score": UNCHANGED}),
        upd(USERS, {"id": 1, "name": "a3", "score": UNCHANGED}),
        upd(USERS, {"id": 20, "name": "b2", "score": 22}, old={"id": 2}),
        ins(USERS, id=3, name="toasted", score=3),
        upd(USERS, {"id": 30, "name": UNCHANGED, "score": 33}, old={"id": 3}),
        dele(USERS, id=1),
        ins(USERS, id=4, name="d", score=4),
    ]
    sink.write(batch)
    once = target.rows("users", "id")
    assert once == [(4, "d", 4), (20, "b2", 22), (30, "toasted", 33)]
    sink.write(batch)
    assert target.rows("users", "id") == once


def test_unchanged_columns_keep_their_value_and_missing_rows_are_never_filled_with_nulls(
        target: Target, sink: SQLSink) -> None:
    sink.write([ins(USERS, id=1, name="kept", score=1)])
    sink.write([upd(USERS, {"id": 1, "name": UNCHANGED, "score": 10}),
                upd(USERS, {"id": 2, "name": UNCHANGED, "score": 20})])
    assert target.rows("users", "id") == [(1, "kept", 10)]
    (w,) = sink.take_warnings()
    assert (w.code, w.severity, w.keys) == ("CDC:WarnMissingRow", "divergence", ("2",))


def random_changes(rng: random.Random, s: TableSchema, n: int, *, whole_old: bool = False
                   ) -> tuple[list[RowChange], dict[int, tuple[Any, ...]]]:
    """``n`` random changes of ``s`` (USERS' columns) and the table they leave. ``whole_old``: updates and deletes
    carry the whole old row, as MySQL's full row image does (else PostgreSQL's: the old key when it changed)."""
    model: dict[int, tuple[Any, ...]] = {}
    out: list[RowChange] = []
    for _ in range(n):
        r = rng.random()
        free = [k for k in range(40) if k not in model]
        if (r < 0.35 or not model) and free:
            k = rng.choice(free)
            model[k] = (k, f"n{rng.randrange(1000)}", rng.randrange(100))
            out.append(ins(s, id=k, name=model[k][1], score=model[k][2]))
        elif r < 0.75:
            k = rng.choice(sorted(model))
            old = model.pop(k)
            new_k = rng.choice(free) if free and rng.random() < 0.2 else k
            name: Any = UNCHANGED if rng.random() < 0.4 else f"u{rng.randrange(1000)}"
            score = rng.randrange(100)
            model[new_k] = (new_k, old[1] if name is UNCHANGED else name, score)
            old_image = dict(zip(("id", "name", "score"), old, strict=True)) if whole_old else \
                ({"id": k} if new_k != k else None)
            out.append(upd(s, {"id": new_k, "name": name, "score": score}, old=old_image))
        elif r < 0.98:
            k = rng.choice(sorted(model))
            gone = model.pop(k)
            out.append(dele(s, **dict(zip(("id", "name", "score"), gone, strict=True))) if whole_old else dele(s, id=k))
        else:
            model.clear()
            out.append(trunc(s))
    return out, model


@pytest.mark.parametrize("whole_old", [False, True], ids=["old-key", "whole-old-row"])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_histories_match_the_model_and_replay_converges(target: Target, seed: int, whole_old: bool) -> None:
    rng = random.Random(seed)
    changes, model = random_changes(rng, USERS, 300, whole_old=whole_old)
    sink = target.sink(batch_rows=rng.choice([3, 7]))
    try:
        i = 0
        while i < len(changes):
            j = i + rng.randrange(1, 80)
            sink.write(changes[i:j])
            i = j
        expected = sorted(model.values())
        assert target.rows("users", "id") == expected
        sink.write(changes[rng.randrange(len(changes)):])
        assert target.rows("users", "id") == expected
    finally:
        sink.close()


def test_updates_with_a_whole_old_row_and_the_same_key_are_applied_as_whole_rows(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL's full row image (every new value, the whole old row, the key unchanged) takes the whole-row in-place
    path, as an UPDATE without an old row does: no change reaches the event normalisation; the target matches."""
    import sinks.sql.ops.writer as writer_module
    seen: list[int] = []
    real = writer_module.normalize_keyed

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(len(args[6]))  # the events that did not take a whole-row path
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "normalize_keyed", spy)
    sink = target.sink()
    try:
        sink.write([ins(USERS, id=i, name=f"n{i}", score=i) for i in range(20)])
        sink.write([upd(USERS, {"id": i, "name": f"m{i}", "score": i + 100},
                        old={"id": i, "name": f"n{i}", "score": i}) for i in range(20)])
        assert not any(seen), seen
        assert target.rows("users", "id") == [(i, f"m{i}", i + 100) for i in range(20)]
        # a key change and a partial image still take the normalisation, and end right
        sink.write([upd(USERS, {"id": 50, "name": "moved", "score": 1}, old={"id": 0, "name": "m0", "score": 100}),
                    upd(USERS, {"id": 1, "name": UNCHANGED, "score": 7}, old={"id": 1, "name": "m1", "score": 101})])
        assert sum(seen) == 2, seen
        assert target.rows("users", "id")[:2] == [(1, "m1", 7), (2, "m2", 102)]
        assert target.rows("users", "id")[-1] == (50, "moved", 1)
    finally:
        sink.close()


# ---- identifiers -----------------------------------------------------------------------------------
WEIRD = ["MixedCase", "with space", 'quo"te', "apo'strophe", "dot.ted", "ünï código 表", "per%cent", "back`tick",
         "select"]


@pytest.mark.parametrize("name", WEIRD)
def test_weird_identifiers(target: Target, name: str) -> None:
    s = table(name, col(name + " id", "int4", key=True), col(name, "text"), col("Other " + name, "int4"),
              schema="Sch." + name)
    sink = target.sink()
    try:
        sink.write([ins(s, **{name + " id": 1, name: "x", "Other " + name: 1}),
                    ins(s, **{name + " id": 2, name: "y", "Other " + name: 2})])
        sink.write([upd(s, {name + " id": 1, name: UNCHANGED, "Other " + name: 10}),
                    upd(s, {name + " id": 3, name: "z", "Other " + name: 3}, old={name + " id": 2}),
                    dele(s, **{name + " id": 1})])
        assert target.rows(name, schema="Sch." + name) == [(3, "z", 3)]
        sink.write([trunc(s)])
        assert target.rows(name, schema="Sch." + name) == []
    finally:
        sink.close()


# ---- value types -----------------------------------------------------------------------------------
TS = dt.datetime(2024, 2, 29, 12, 34, 56, 123456)
TSTZ = dt.datetime(2024, 2, 29, 10, 0, 0, 5, tzinfo=dt.UTC)
TSTZ_PLUS2 = dt.datetime(2024, 2, 29, 12, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
U = uuid.UUID("12345678-1234-5678-1234-567812345678")
NUM_12_2 = (12 << 16 | 2) + 4

# (column, value, MariaDB's value read by PyMySQL, PostgreSQL's text output, PostgreSQL's column type)
TYPE_CASES: list[tuple[ColumnSchema, Any, Any, str, str]] = [
    (col("i2", "int2", type_name="smallint"), -32768, -32768, "-32768", "smallint"),
    (col("i4", "int4", type_name="integer"), 2**31 - 1, 2**31 - 1, "2147483647", "integer"),
    (col("i8", "int8", type_name="bigint"), -(2**63), -(2**63), "-9223372036854775808", "bigint"),
    (col("oid", "oid", type_name="oid"), 4294967295, 4294967295, "4294967295", "bigint"),
    (col("money", "numeric", type_name="numeric(12,2)", typmod=NUM_12_2), Decimal("1234.50"), Decimal("1234.50"),
     "1234.50", "numeric(12,2)"),
    (col("big", "numeric", type_name="numeric"), Decimal("12345678901234567890.123456789012"),
     Decimal("12345678901234567890.123456789012"), "12345678901234567890.123456789012", "numeric"),
    (col("f4", "float4", type_name="real"), 1.1, 1.1, "1.1", "real"),
    (col("f8", "float8", type_name="double precision"), 0.1, 0.1, "0.1", "double precision"),
    (col("flag", "bool", type_name="boolean"), True, 1, "true", "boolean"),
    (col("t", "text", type_name="text"), "tëxt ☃ 🎉 'q' \"d\" \\", "tëxt ☃ 🎉 'q' \"d\" \\",
     "tëxt ☃ 🎉 'q' \"d\" \\", "text"),
    (col("vc", "varchar", type_name="character varying(20)"), "abc", "abc", "abc", "character varying(20)"),
    (col("bp", "bpchar", type_name="character(5)"), "ab   ", "ab   ", "ab", "character(5)"),  # ::text trims
    (col("ch", "char", type_name='"char"'), "x", "x", "x", '"char"'),
    (col("nm", "name", type_name="name"), "pg_class", "pg_class", "pg_class", "name"),
    (col("bin", "bytea", type_name="bytea"), b"\x00\xff\x10", b"\x00\xff\x10", "\\x00ff10", "bytea"),
    (col("d", "date", type_name="date"), dt.date(2024, 2, 29), dt.date(2024, 2, 29), "2024-02-29", "date"),
    (col("tm", "time", type_name="time without time zone"), dt.time(23, 59, 59, 1),
     dt.timedelta(hours=23, minutes=59, seconds=59, microseconds=1), "23:59:59.000001", "time without time zone"),
    (col("tmtz", "timetz", type_name="time with time zone"), "12:00:00+02", "12:00:00+02", "12:00:00+02",
     "time with time zone"),
    (col("ts", "timestamp", type_name="timestamp(3) without time zone"), dt.datetime(2024, 2, 29, 12, 34, 56, 123000),
     dt.datetime(2024, 2, 29, 12, 34, 56, 123000), "2024-02-29 12:34:56.123", "timestamp(3) without time zone"),
    (col("ts6", "timestamp", type_name="timestamp without time zone"), TS, TS, "2024-02-29 12:34:56.123456",
     "timestamp without time zone"),
    (col("tstz", "timestamptz", type_name="timestamp with time zone"), TSTZ, TSTZ.replace(tzinfo=None),
     "2024-02-29 10:00:00.000005+00", "timestamp with time zone"),
    (col("tstz2", "timestamptz", type_name="timestamp with time zone"), TSTZ_PLUS2, dt.datetime(2024, 2, 29, 10),
     "2024-02-29 10:00:00+00", "timestamp with time zone"),
    (col("iv", "interval", type_name="interval"), "1 year 2 mons 3 days 04:05:06", "1 year 2 mons 3 days 04:05:06",
     "1 year 2 mons 3 days 04:05:06", "interval"),
    (col("u", "uuid", type_name="uuid"), U, str(U), str(U), "uuid"),
    (col("j", "json", type_name="json"), '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}',
     "json"),
    (col("jb", "jsonb", type_name="jsonb"), '{"b": 1, "a": [1, 2]}', '{"b": 1, "a": [1, 2]}',
     '{"a": [1, 2], "b": 1}', "jsonb"),
    (col("mood", "mood", type_name="mood"), "happy", "happy", "happy", "text"),
    (col("ia", "int4", array=True, type_name="integer[]"), [1, None, 3], "[1, null, 3]", "{1,NULL,3}", "integer[]"),
    (col("ta", "text", array=True, type_name="text[]"), ['a "q"', "NULL", None, "é,{}"],
     '["a \\"q\\"", "NULL", null, "é,{}"]', '{"a \\"q\\"","NULL",NULL,"é,{}"}', "text[]"),
    (col("na", "numeric", array=True, type_name="numeric(5,2)[]"), [Decimal("1.50")], '["1.50"]', "{1.50}",
     "numeric(5,2)[]"),
    (col("ua", "uuid", array=True, type_name="uuid[]"), [U], f'["{U}"]', f"{{{U}}}", "uuid[]"),
    (col("ba", "bytea", array=True, type_name="bytea[]"), [b"\x01"], '["\\\\x01"]', '{"\\\\x01"}', "bytea[]"),
    (col("ma", "mood", array=True, type_name="mood[]"), ["sad"], '["sad"]', "{sad}", "text[]"),
    (col("nested", "int4", array=True, type_name="integer[]"), [[1, 2], [3, 4]], "[[1, 2], [3, 4]]",
     "{{1,2},{3,4}}", "integer[]"),
]


def test_every_value_type_round_trips(target: Target, sink: SQLSink) -> None:
    s = table("types", col("id", "int4", key=True, type_name="integer"), *[c for c, *_ in TYPE_CASES])
    full = {"id": 1, **{c.name: v for c, v, *_ in TYPE_CASES}}
    sink.write([ins(s, **full), ins(s, id=2, **{c.name: None for c, *_ in TYPE_CASES})])
    names = [c.name for c, *_ in TYPE_CASES]
    if target.kind == "mariadb":
        rows = target.rows("types", "id")
        assert rows[1] == (2,) + (None,) * len(TYPE_CASES)
        got = dict(zip(["id", *names], rows[0], strict=True))
        for c, _v, mysql_value, _pg, _t in TYPE_CASES:
            assert got[c.name] == mysql_value, c.name
    else:
        conn = target.server.connect(target.db)
        try:
            with conn.cursor() as cur:
                cur.execute("SET TimeZone = 'UTC'")
                cur.execute("SELECT " + ", ".join(f"{target.ident(n)}::text" for n in names)
                            + ' FROM public.types ORDER BY id')
                rows = cur.fetchall()
                cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                            "WHERE attrelid = 'public.types'::regclass AND attnum > 0")
                types = dict(cur.fetchall())
        finally:
            conn.close()
        assert rows[1] == (None,) * len(TYPE_CASES)
        for (c, _v, _m, pg_text, pg_type), got in zip(TYPE_CASES, rows[0], strict=True):
            assert got == pg_text, c.name
            assert types[c.name] == pg_type, c.name
    # the same values find their rows again (full-row update, then delete by key)
    sink.write([upd(s, full), dele(s, id=2)])
    assert len(target.rows("types")) == 1


@pytest.mark.parametrize("c,value", [
    (col("k", "uuid", key=True, type_name="uuid"), U),
    (col("k", "timestamptz", key=True, type_name="timestamp with time zone"), TSTZ),
    (col("k", "numeric", key=True, type_name="numeric"), Decimal("1.50")),
    (col("k", "float4", key=True, type_name="real"), 1.1),
    (col("k", "bytea", key=True, type_name="bytea"), b"\x00k"),
    (col("k", "text", key=True, type_name="text"), "Kéy"),
    (col("k", "date", key=True, type_name="date"), dt.date(2020, 1, 1)),
])
def test_keys_of_every_kind_are_found_again(target: Target, sink: SQLSink, c: ColumnSchema, value: Any) -> None:
    s = table("keys", c, col("v", "int4"))
    sink.write([ins(s, k=value, v=1)])
    sink.write([ins(s, k=value, v=2)])  # upsert of the same key
    assert [r[1] for r in target.rows("keys")] == [2]
    sink.write([upd(s, {"k": value, "v": 3})])
    assert [r[1] for r in target.rows("keys")] == [3]
    sink.write([dele(s, k=value)])
    assert target.rows("keys") == []


# ---- transactions and failures ---------------------------------------------------------------------
def test_a_large_transaction_is_flushed_in_chunks_and_stays_atomic(target: Target) -> None:
    sink = target.sink(batch_rows=100)
    try:
        sink.write([ins(USERS, id=0, name="before", score=0)])
        consumed = 0

        def changes() -> Iterator[RowChange]:
            nonlocal consumed
            for i in range(1, 3001):
                consumed += 1
                yield ins(USERS, id=i, name=f"n{i}", score=i)
            consumed += 1
            yield ins(USERS, id=3001, name="bad", score=2**40)  # int4 out of range: the server refuses it

        with pytest.raises(SinkError, match="users"):
            sink.write(changes())
        assert consumed == 3001
        assert target.rows("users") == [(0, "before", 0)]
        sink.write([ins(USERS, id=1, name="after", score=1)])
        assert len(target.rows("users")) == 2
    finally:
        sink.close()


def test_truncate_and_table_creation_inside_a_failed_transaction_are_rolled_back(target: Target, sink: SQLSink) -> None:
    other = table("other", col("id", "int4", key=True))
    sink.write([ins(USERS, id=1, name="a", score=1)])
    with pytest.raises(SinkError):
        # MySQL's TRUNCATE and CREATE TABLE commit implicitly: neither may happen inside the write
        sink.write([trunc(USERS), ins(USERS, id=2, name="b", score=2), ins(other, id=1),
                    ins(USERS, id=3, name="c", score=2**40)])
    assert target.rows("users") == [(1, "a", 1)]
    sink.write([ins(other, id=5)])
    assert target.rows("other") == [(5,)]


def test_connection_loss_mid_transaction_is_retryable_and_loses_nothing(target: Target) -> None:
    sink = target.sink(batch_rows=100)
    try:
        sink.write([ins(USERS, id=0, name="before", score=0)])

        def changes() -> Iterator[RowChange]:
            for i in range(1, 301):
                if i == 150:
                    assert target.sink_connections() >= 1
                yield ins(USERS, id=i, name=f"n{i}", score=i)

        with pytest.raises(SinkUnavailable):
            sink.write(changes())
        assert target.rows("users") == [(0, "before", 0)]
        assert sink.write([ins(USERS, id=i, name=f"n{i}", score=i) for i in range(1, 301)]) == 300
        assert len(target.rows("users")) == 301
    finally:
        sink.close()


def test_a_lost_idle_connection_is_replaced(target: Target, sink: SQLSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "IDLE_PING_SECONDS", 0.0)  # every pooled connection counts as idle
    sink.write([ins(USERS, id=1, name="a", score=1)])
    assert target.sink_connections() >= 1
    sink.write([ins(USERS, id=2, name="b", score=2)])  # the checkout's ping fails: a new connection
    assert len(target.rows("users")) == 2


def _count_pings(sink: SQLSink, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the dialect's pings of the sink's pool (the real ping still runs)."""
    dialect = sink.target.engine.dialect
    real = dialect.do_ping
    pings = [0]

    def counted(dbapi_conn: Any) -> Any:
        pings[0] += 1
        return real(dbapi_conn)

    monkeypatch.setattr(dialect, "do_ping", counted)
    return pings


def test_writes_in_a_row_do_not_ping_their_connection(target: Target, sink: SQLSink,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection checked in a moment ago is not pinged again (a round trip per write, on PostgreSQL two), while
    one idle longer than IDLE_PING_SECONDS is."""
    monkeypatch.setattr(connection_module, "IDLE_PING_SECONDS", 3600.0)  # (a loaded host: never idle in this test)
    sink.write([ins(USERS, id=0, name="first", score=0)])
    pings = _count_pings(sink, monkeypatch)
    for i in range(1, 6):
        sink.write([ins(USERS, id=i, name=f"n{i}", score=i)])
    assert pings == [0]
    monkeypatch.setattr(connection_module, "IDLE_PING_SECONDS", 0.0)
    sink.write([ins(USERS, id=6, name="n6", score=6)])
    assert pings == [1]
    assert len(target.rows("users")) == 7


def test_a_connection_lost_between_busy_writes_fails_one_write_retryably(target: Target, sink: SQLSink,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Not pinged, a connection that the server ended since the last write fails the next write as unavailable
    (retryable) with nothing of it applied, and is dropped: the write's retry runs on a new connection."""
    monkeypatch.setattr(connection_module, "IDLE_PING_SECONDS", 3600.0)
    sink.write([ins(USERS, id=1, name="a", score=1)])
    assert target.sink_connections() >= 1
    with pytest.raises(SinkUnavailable):
        sink.write([ins(USERS, id=2, name="b", score=2), ins(USERS, id=3, name="c", score=3)])
    assert target.rows("users", order="id") == [(1, "a", 1)]
    assert sink.write([ins(USERS, id=2, name="b", score=2), ins(USERS, id=3, name="c", score=3)]) == 2
    assert len(target.rows("users")) == 3


def test_unreachable_target_is_unavailable(target: Target) -> None:
    scheme = "mysql" if target.kind == "mariadb" else "postgresql"
    port = free_port()
    sink = open_sink(f"{scheme}://root@127.0.0.1:{port}/db?connect-timeout=2")
    try:
        with pytest.raises(SinkUnavailable, match=f"127.0.0.1:{port}"):
            sink.check()
        with pytest.raises(SinkUnavailable):
            sink.write([ins(USERS, id=1, name="a", score=1)])
    finally:
        sink.close()


def test_missing_database_is_a_fatal_error_with_the_fix(target: Target) -> None:
    uri = target.server.uri("no_such_db_here")
    sink = open_sink(uri)
    try:
        with pytest.raises(SinkError, match="no_such_db_here.*does not exist.*CREATE DATABASE"):
            sink.check()
    finally:
        sink.close()


# ---- tables without a key --------------------------------------------------------------------------
def test_keyless_table(target: Target, sink: SQLSink) -> None:
    log = table("log", col("a", "int4"), col("b", "text"), col("j", "json"), has_key=False)
    sink.write([ins(log, a=1, b="x", j='{"k": 1}'), ins(log, a=1, b="x", j='{"k": 1}'),
                ins(log, a=2, b=None, j=None), ins(log, a=2, b=None, j=None)])
    sink.write([dele(log, a=1, b="x", j='{"k": 1}'), dele(log, a=2, b=None, j=None)])
    assert sorted(target.rows("log", cols="a, b"), key=repr) == [(1, "x"), (2, None)]
    sink.write([upd(log, {"a": 3, "b": "y", "j": UNCHANGED}, old={"a": 2, "b": None, "j": None}),
                upd(log, {"a": 4, "b": UNCHANGED, "j": '{"k": 2}'}, old={"a": 1, "b": "x", "j": '{"k": 1}'})])
    assert sorted(target.rows("log", cols="a, b"), key=repr) == [(3, "y"), (4, "x")]


# ---- existing tables -------------------------------------------------------------------------------
def test_existing_table_is_used_as_is(target: Target, sink: SQLSink) -> None:
    target.execute(f"CREATE TABLE {target.qualified('users')} (id INTEGER PRIMARY KEY, name VARCHAR(10), "
                   "score INTEGER, extra VARCHAR(5) DEFAULT 'd')")
    sink.write([ins(USERS, id=1, name="a", score=1), upd(USERS, {"id": 1, "name": UNCHANGED, "score": 2})])
    assert target.rows("users") == [(1, "a", 2, "d")]
    with pytest.raises(SinkError, match="users"):  # too long for VARCHAR(10)
        sink.write([ins(USERS, id=2, name="x" * 50, score=1)])


def test_a_new_schema_version_of_an_existing_table_binds_without_reading_the_catalog(target: Target,
                                                                                  sink: SQLSink) -> None:
    """PostgreSQL's pgoutput sends a table's Relation message again after any cache invalidation upstream (an ANALYZE,
    autovacuum's among them), and each one is a new schema version. A table the schema-wide first look handed out
    stays known: its next version binds without touching the target (it was read again through SQLAlchemy's
    per-table reflection, "using existing table ..." in the log, once per table: the cost the first look saves)."""
    target.execute(f"CREATE TABLE {target.qualified('users')} (id INTEGER PRIMARY KEY, name VARCHAR(10), "
                   "score INTEGER)")
    sink.write([ins(USERS, id=1, name="a", score=1)])  # bound through the schema-wide first look
    again = dataclasses.replace(USERS, version=USERS.version + 1)
    io: list[str] = []
    with sink.target.engine.connect() as conn:
        sink.catalog.bind(again, conn, lambda: io.append("catalog read"))
    assert io == []
    sink.write([ins(again, id=2, name="b", score=2), upd(again, {"id": 1, "name": UNCHANGED, "score": 3})])
    assert target.rows("users", "id") == [(1, "a", 3), (2, "b", 2)]


def test_existing_table_without_a_unique_key_is_an_error(target: Target, sink: SQLSink) -> None:
    target.execute(f"CREATE TABLE {target.qualified('users')} (id INTEGER, name TEXT, score INTEGER)")
    with pytest.raises(SinkError, match="primary key or unique index"):
        sink.write([ins(USERS, id=1, name="a", score=1)])


# ---- MariaDB specifics -----------------------------------------------------------------------------
def test_mariadb_keys_differing_in_case_or_trailing_space_stay_distinct(mariadb: Target) -> None:
    s = table("names", col("k", "text", key=True), col("v", "int4"))
    sink = mariadb.sink()
    try:
        sink.write([ins(s, k="a", v=1), ins(s, k="A", v=2), ins(s, k="a ", v=3), ins(s, k="ä", v=4)])
        sink.write([dele(s, k="a ")])
        assert sorted(mariadb.rows("names")) == [("A", 2), ("a", 1), ("ä", 4)]
        long_key = "x" * 700
        sink.write([ins(s, k=long_key, v=5)])
        sink.write([upd(s, {"k": long_key, "v": 6})])
        assert (long_key, 6) in mariadb.rows("names")
    finally:
        sink.close()


def test_mariadb_created_types(mariadb: Target) -> None:
    s = table("ddl", col("id", "text", key=True), col("k2", "varchar", key=True, type_name="character varying(10)"),
              col("amt", "numeric", type_name="numeric(12,2)", typmod=NUM_12_2), col("any", "numeric"),
              col("doc", "jsonb"), col("ts", "timestamptz"), col("flag", "bool"), col("u", "uuid"),
              col("arr", "int4", array=True), col("bin", "bytea"))
    sink = mariadb.sink()
    try:
        sink.write([ins(s, id="1", k2="a", amt=Decimal("1.00"), any=Decimal("2"), doc="{}", ts=TSTZ, flag=False,
                        u=U, arr=[1], bin=b"")])
    finally:
        sink.close()
    types = dict(mariadb.execute(
        "SELECT column_name, column_type FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'ddl'", (mariadb.db,)) or [])
    assert types["id"] == "varchar(758)"  # 3072 bytes - 10 chars of k2, shared at 4 bytes a character
    assert types["k2"] == "varchar(10)"
    assert types["amt"] == "decimal(12,2)"
    assert types["any"] == "decimal(65,30)"
    assert types["doc"] == "longtext"  # MariaDB's JSON
    assert types["ts"] == "datetime(6)"
    assert types["flag"] == "tinyint(1)"
    assert types["u"] == "char(36)"
    assert types["bin"] == "longblob"
    collation = mariadb.execute("SELECT table_collation FROM information_schema.tables WHERE table_schema = %s "
                                "AND table_name = 'ddl'", (mariadb.db,))
    assert collation == [("utf8mb4_nopad_bin",)]


@pytest.mark.parametrize("c,value,column", [
    (col("n", "numeric"), Decimal("NaN"), "n"),
    (col("f", "float8"), float("inf"), "f"),
    (col("n", "numeric"), Decimal("1." + "0" * 30 + "1"), "n"),  # 31 fractional digits: DECIMAL(65,30) rounds
])
def test_mariadb_refuses_values_it_cannot_store(mariadb: Target, c: ColumnSchema, value: Any, column: str) -> None:
    s = table("special", col("id", "int4", key=True), c)
    sink = mariadb.sink()
    try:
        with pytest.raises(SinkError, match=f"special.*{column}"):
            sink.write([ins(s, id=1, **{c.name: None}), ins(s, id=2, **{c.name: value})])
        assert mariadb.rows("special") == []
    finally:
        sink.close()


def test_mariadb_refuses_an_infinite_date(mariadb: Target) -> None:
    s = table("dates", col("id", "int4", key=True), col("d", "date"))
    sink = mariadb.sink()
    try:
        with pytest.raises(SinkError, match="dates"):
            sink.write([ins(s, id=1, d="infinity")])
    finally:
        sink.close()


# ---- PostgreSQL specifics --------------------------------------------------------------------------
def test_postgres_keeps_schema_and_special_numbers(postgres: Target) -> None:
    s = table("special", col("id", "int4", key=True), col("n", "numeric"), col("f", "float8"),
              col("d", "date"), schema="Other Schema")
    sink = postgres.sink()
    try:
        assert sink.target_name(s.name) == "Other Schema.special"
        sink.write([ins(s, id=1, n=Decimal("Infinity"), f=float("-inf"), d="infinity"),
                    ins(s, id=2, n=Decimal("NaN"), f=float("nan"), d="-infinity")])
        rows = postgres.rows("special", "id", schema="Other Schema", cols="id, n::text, f::text, d::text")
        assert rows == [(1, "Infinity", "-Infinity", "infinity"), (2, "NaN", "NaN", "-infinity")]
    finally:
        sink.close()


def test_postgres_missing_role_is_a_fatal_error(postgres: Target) -> None:
    sink = open_sink(postgres.server.uri(postgres.db, user="nobody_here"))
    try:
        with pytest.raises(SinkError, match="access denied"):
            sink.check()
    finally:
        sink.close()


# ---- multi-table writes: grouped per table ---------------------------------------------------------
def interleaved_history(rng: random.Random, tables: list[TableSchema], n: int
                        ) -> tuple[list[RowChange], dict[str, list[tuple[Any, ...]]]]:
    """Interleaved valid histories of keyed tables (inserts, updates with key moves and UNCHANGED, deletes,
    delete-then-insert of one key, truncates) and their final state."""
    model: dict[str, dict[int, tuple[Any, ...]]] = {t.name.table: {} for t in tables}
    out: list[RowChange] = []
    for _ in range(n):
        s = rng.choice(tables)
        m = model[s.name.table]
        r = rng.random()
        free = [k for k in range(25) if k not in m]
        if (r < 0.35 or not m) and free:
            k = rng.choice(free)
            m[k] = (k, f"n{rng.randrange(1000)}", rng.randrange(100))
            out.append(ins(s, id=k, name=m[k][1], score=m[k][2]))
        elif r < 0.7:
            k = rng.choice(sorted(m))
            old = m.pop(k)
            new_k = rng.choice(free) if free and rng.random() < 0.25 else k
            name: Any = UNCHANGED if rng.random() < 0.4 else f"u{rng.randrange(1000)}"
            score = rng.randrange(100)
            m[new_k] = (new_k, old[1] if name is UNCHANGED else name, score)
            out.append(upd(s, {"id": new_k, "name": name, "score": score}, old={"id": k} if new_k != k else None))
        elif r < 0.95:
            k = rng.choice(sorted(m))
            del m[k]
            out.append(dele(s, id=k))
            if rng.random() < 0.5:  # delete-then-insert of the same key
                m[k] = (k, f"r{rng.randrange(1000)}", rng.randrange(100))
                out.append(ins(s, id=k, name=m[k][1], score=m[k][2]))
        else:
            m.clear()
            out.append(trunc(s))
    return out, {name: sorted(rows.values()) for name, rows in model.items()}


@pytest.mark.parametrize("seed", [3, 4])
def test_interleaved_multi_table_writes_match_the_model(target: Target, seed: int) -> None:
    rng = random.Random(seed)
    tables = [table(f"g{i}", col("id", "int4", key=True), col("name"), col("score", "int4")) for i in range(3)]
    changes, model = interleaved_history(rng, tables, 400)
    sink = target.sink(batch_rows=rng.choice([2, 5, 1000]))
    try:
        i = 0
        while i < len(changes):  # calls of random size, each mixing the tables
            j = i + rng.randrange(1, 120)
            sink.write(changes[i:j])
            i = j
        for t in tables:
            assert target.rows(t.name.table, "id") == model[t.name.table]
        sink.write(changes[rng.randrange(len(changes)):])  # a replay from an earlier checkpoint converges
        for t in tables:
            assert target.rows(t.name.table, "id") == model[t.name.table]
    finally:
        sink.close()


def test_a_failed_multi_table_write_leaves_nothing(target: Target, sink: SQLSink) -> None:
    a = table("fa", col("id", "int4", key=True), col("name"))
    b = table("fb", col("id", "int4", key=True), col("name"))
    sink.write([ins(a, id=1, name="x"), ins(b, id=1, name="x")])
    with pytest.raises(SinkError, match="fb"):  # b's group fails at the end of the call, after a's rows
        sink.write([ins(b, id=None, name="y"), ins(a, id=2, name="y"), ins(a, id=3, name="z")])
    assert target.rows("fa", "id") == [(1, "x")] and target.rows("fb", "id") == [(1, "x")]


def test_existing_tables_read_from_the_catalog_equal_per_table_reflection(target: Target, sink: SQLSink) -> None:
    """The catalog queries that bind every existing table at once see what SQLAlchemy's reflection sees."""
    q = target.qualified
    ddl = [f"CREATE TABLE {q('c1')} (id INTEGER PRIMARY KEY, n NUMERIC(10,2), n2 DECIMAL(5), f FLOAT, "
           "name VARCHAR(10) NOT NULL, j JSON)",
           f"CREATE TABLE {q('c2')} (a INTEGER NOT NULL, b VARCHAR(20) NOT NULL, c INTEGER, PRIMARY KEY (a, b), "
           "UNIQUE (c))",
           f"CREATE TABLE {q('c3')} (a INTEGER, b INTEGER)",
           f"CREATE UNIQUE INDEX c3_ab ON {q('c3')} (b, a)",
           f"CREATE VIEW {q('cv')} AS SELECT id, name FROM {q('c1')}"]
    if target.kind == "postgresql":
        ddl += [f"CREATE TABLE {q('c4')} (id INTEGER NOT NULL, x TEXT, jb JSONB, nn NUMERIC, arr NUMERIC(4,1)[])",
                f"CREATE UNIQUE INDEX c4_expr ON {q('c4')} ((lower(x)))",
                f"CREATE UNIQUE INDEX c4_incl ON {q('c4')} (id) INCLUDE (x)",
                f"ALTER TABLE {q('c4')} DROP COLUMN nn"]
    for sql in ddl:
        target.execute(sql)
    names = ["c1", "c2", "c3"] + (["c4"] if target.kind == "postgresql" else [])
    tschema = "public" if target.kind == "postgresql" else None
    engine = sink.target.engine
    with engine.connect() as conn:
        for name in names:
            fast = sink.catalog.existing_table(conn, tschema, name)
            slow = sink.catalog.reflect(conn, tschema, name, name if tschema is None else f"{tschema}.{name}")
            assert fast is not None
            assert (fast.label, fast.schema, fast.name, fast.columns) == (slow.label, slow.schema, slow.name, slow.columns)
            assert set(fast.uniques) == set(slow.uniques)
        assert sink.catalog.existing_table(conn, tschema, "c1") is None  # handed out once: the next look is per table
        assert sink.catalog.existing_table(conn, tschema, "nope") is None
        assert sink.catalog.existing_table(conn, tschema, "cv") is None  # a view: the per-table path decides


def test_no_connection_is_left_inside_a_transaction(target: Target) -> None:
    """The pool does not roll back on return (a round trip per write saved): every use ends its own."""
    sink = target.sink()
    try:
        sink.check()
        sink.write([ins(USERS, id=1, name="a", score=1)])  # creates the table on a second connection
        with pytest.raises(SinkError):
            sink.write([ins(USERS, id=None, name="a", score=1)])
        sink.write([ins(USERS, id=2, name="b", score=2)])
        if target.kind == "postgresql":
            states = target.server.execute(
                "SELECT state FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'tidewater-sink-%%'",
                params=(target.db,)) or []
            assert states and all(s == "idle" for (s,) in states), states
        else:
            trx = target.server.execute(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p "
                "ON p.ID = t.trx_mysql_thread_id WHERE p.DB = %s", params=(target.db,))
            assert trx == [(0,)]
    finally:
        sink.close()


# ---- PostgreSQL: rows with their upstream text go through COPY -------------------------------------------
NASTY_COLUMNS = (col("id", "int4", key=True), col("t", "text"), col("b", "bytea"), col("n", "numeric"),
                 col("tz", "timestamptz"), col("ts", "timestamp"), col("d", "date"), col("f", "float8"),
                 col("ok", "bool"), col("j", "json"), col("jb", "jsonb"), col("u", "uuid"), col("iv", "interval"),
                 col("ta", "text", array=True), col("ia", "int4", array=True))
NASTY = {  # column -> upstream texts as PostgreSQL's output functions write them (None: NULL)
    "t": ["", None, "plain", "back\\slash \\\\ two", "tab\there", "new\nline", "cr\rlf\r\n", "żółw 🐢 ∑",
          "\\N", "\\.", "a,b;c|d", "'quoted' \"double\"", " lead and trail ", "\\x41", "end\\"],
    "b": ["\\x", "\\x00ff5c090a0d", None, "\\x" + bytes(range(256)).hex()],
    "n": ["0", "-12345.678900", "NaN", "Infinity", "-Infinity", None, "1e-20", "123456789012345678901234567890.5"],
    "tz": ["2026-11-22 01:02:03.5+00", "2026-01-01 10:00:00+05:30", "1999-12-31 23:59:59.999999-08", "infinity",
           "-infinity", None],
    "ts": ["2026-11-22 01:02:03", "0044-03-15 12:00:00 BC", "infinity", "2026-02-28 23:59:59.000001", None],
    "d": ["2026-11-22", "-infinity", "infinity", None],
    "f": ["1.5", "NaN", "-Infinity", "Infinity", "1e+300", "0.1", None, "-0"],
    "ok": ["t", "f", None],
    "j": ['{"a": "b\\n", "c": [1, 2.50, null]}', '"tab\\there"', "[]", None, '{"k":"\\\\"}'],
    "jb": ['{"a": "b\\n", "c": [1, 2.50, null]}', '"x"', "null", None],
    "u": ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", None],
    "iv": ["1 day 02:03:04", "-00:00:01.5", "1 year 2 mons", None],
    "ta": ['{"a b","c\\"d",NULL,"e\\\\f","tab\there",""}', "{}", '{"\\\\N",NULL}', None],
    "ia": ["{1,2,3}", "{NULL,-1}", None],
}


def nasty_rows(n: int, salt: int = 0) -> list[tuple[str | None, ...]]:
    out = []
    for i in range(n):
        row: list[str | None] = [str(i)]
        for c in NASTY_COLUMNS[1:]:
            values = NASTY[c.name]
            row.append(values[(i + salt) % len(values)])
        out.append(tuple(row))
    return out


def positional(s: TableSchema, op: OpType, texts: tuple[str | None, ...], with_text: bool) -> RowChange:
    from upstream.postgres.types import parse_value

    row = tuple(parse_value(c.base_type, c.is_array, t) for c, t in zip(s.columns, texts, strict=True))
    return RowChange(op, s, 1, row=row, row_text=texts if with_text else None)


@pytest.mark.parametrize("has_key", [True, False])
def test_postgres_copy_of_upstream_text_stores_what_the_typed_path_stores(postgres: Target, has_key: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every nasty value (backslashes, tabs, newlines, CR, empty vs NULL, unicode, bytea, numeric, NaN,
    infinities, offsets, BC, json, arrays) written through COPY (upstream text) and through the typed
    multi-row INSERT (parsed values): the two tables hold the same rows, for inserts and then upserts
    whose batch repeats keys (the last row per key wins)."""
    suffix = "k" if has_key else "h"
    copied = table(f"copy_{suffix}", *NASTY_COLUMNS, has_key=has_key)
    typed = table(f"typed_{suffix}", *NASTY_COLUMNS, has_key=has_key)
    rows = nasty_rows(60)
    from sinks.sql.ops.output import Output

    copies: list[str] = []
    real_copy = Output.copy_in
    monkeypatch.setattr(Output, "copy_in",
                        lambda self, sql, data: (copies.append(sql), real_copy(self, sql, data))[1])
    sink = postgres.sink()
    try:
        sink.write([positional(copied, OpType.INSERT, r, True) for r in rows])
        sink.write([positional(typed, OpType.INSERT, r, False) for r in rows])
        if has_key:  # upserts: new values for every key, each key twice in the batch (the second wins)
            again = nasty_rows(60, salt=1) + nasty_rows(60, salt=2)
            sink.write([positional(copied, OpType.UPDATE, r, True) for r in again])
            sink.write([positional(typed, OpType.UPDATE, r, False) for r in again])
    finally:
        sink.close()
    order = ", ".join(c.name for c in NASTY_COLUMNS)
    text_cols = ", ".join(f"{c.name}::text" for c in NASTY_COLUMNS)
    got = postgres.execute(f"SELECT {text_cols} FROM public.copy_{suffix} ORDER BY {order}")
    want = postgres.execute(f"SELECT {text_cols} FROM public.typed_{suffix} ORDER BY {order}")
    assert got == want and len(got or []) == 60
    assert len(copies) == (2 if has_key else 1)  # one per write with texts; parsed-only rows: typed INSERT
    if has_key:
        by_id = {int(r[0]): r for r in got or []}
        assert [by_id[i][1] for i in range(15)] == [NASTY["t"][(i + 2) % len(NASTY["t"])] for i in range(15)]
    else:
        assert got is not None and sorted(r[1] or "" for r in got) == sorted(r[1] or "" for r in rows)


def _fresh(s: TableSchema, i: int, name: str) -> RowChange:
    return RowChange(OpType.INSERT, s, 1, row=(i, name, i), row_text=(str(i), name, str(i)))


def test_postgres_fresh_inserts_copy_straight_into_the_table_and_merge_where_a_key_exists(
        postgres: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """Upstream INSERTs of a keyed table go by COPY straight into the table (no staging merge); where the target
    already holds some of their keys (rows written before the changefeed, a table copied while it streamed), the
    COPY is rolled back to its savepoint and the same rows are merged by key, so the target ends as the upsert
    path leaves it: the new rows win, nothing is duplicated, the rows around them stay."""
    from sinks.sql.ops.output import Output

    copies: list[str] = []
    real_copy = Output.copy_in
    monkeypatch.setattr(Output, "copy_in", lambda self, sql, data: (copies.append(sql), real_copy(self, sql, data))[1])
    sink = postgres.sink(batch_rows=50)
    try:
        sink.write([_fresh(USERS, 1000 + i, f"x{i}") for i in range(100)])
        assert copies == ['SAVEPOINT tidewater_fresh; COPY "public"."users" ("id", "name", "score") FROM STDIN'] * 2
        staged = postgres.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'tidewater_stage%%'")
        assert staged == [(0,)]  # no staging table was made
        postgres.execute("INSERT INTO public.users VALUES (55, 'before', -1), (99, 'before', -1)")
        copies.clear()
        # one transaction in groups of 50: ids 0..49 (new downstream), 50..99 (two exist downstream), then 5 again
        # (a stream that repeats an INSERT: the last one wins, as with the merge). Only the second group's COPY is
        # rolled back (to its own savepoint) and merged; the first group's rows stay.
        sink.write([_fresh(USERS, i, f"n{i}") for i in range(100)] + [_fresh(USERS, 5, "again")])
        assert len(copies) == 3 and all('COPY "public"."users"' in c for c in copies[:2])
        assert "tidewater_stage" in copies[2]  # the conflict: the same rows through the merge
    finally:
        sink.close()
    want = sorted([(i, "again" if i == 5 else f"n{i}", i) for i in range(100)]
                  + [(1000 + i, f"x{i}", 1000 + i) for i in range(100)])
    assert postgres.rows("users", order="id") == want


def test_postgres_fresh_copies_per_transaction_are_capped_then_merge(postgres: Target,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each direct COPY runs under a savepoint, and a savepoint that wrote keeps a subtransaction id until the
    transaction ends; past FRESH_COPIES_PER_TXN groups in one downstream transaction the rest go through the
    staging merge, so a write never overflows the server's 64 cached subtransactions. Rows all arrive either way."""
    from sinks.sql.ops import output
    from sinks.sql.ops.output import Output

    copies: list[str] = []
    real_copy = Output.copy_in
    monkeypatch.setattr(Output, "copy_in", lambda self, sql, data: (copies.append(sql), real_copy(self, sql, data))[1])
    groups = output.FRESH_COPIES_PER_TXN + 5
    sink = postgres.sink(batch_rows=output.COPY_MIN_ROWS)
    try:
        sink.write([_fresh(USERS, i, f"n{i}") for i in range(groups * output.COPY_MIN_ROWS)])
    finally:
        sink.close()
    direct = [c for c in copies if 'COPY "public"."users"' in c]
    assert len(direct) == output.FRESH_COPIES_PER_TXN and len(copies) == groups
    assert postgres.rows("users", order="id") == [(i, f"n{i}", i) for i in range(groups * output.COPY_MIN_ROWS)]


def test_postgres_without_temp_privilege_upserts_through_insert_not_copy(postgres: Target) -> None:
    """COPY upserts need a TEMP staging table; a role that may not create one gets the multi-row INSERT
    path (asked once per sink), and the rows arrive all the same."""
    role = "tw_notemp"
    postgres.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN "
                     f"CREATE ROLE {role} LOGIN; END IF; END $$")
    postgres.execute(f'REVOKE TEMP ON DATABASE "{postgres.db}" FROM PUBLIC')
    postgres.execute(f"GRANT ALL ON SCHEMA public TO {role}")
    postgres.execute(f'GRANT CONNECT, CREATE ON DATABASE "{postgres.db}" TO {role}')
    uri = postgres.uri.replace("://postgres@", f"://{role}@")
    assert role in uri
    s = open_sink(uri, SinkConfig())
    assert isinstance(s, SQLSink)
    users = USERS
    try:
        s.check()
        s.write([RowChange(OpType.INSERT, users, 1, row=(i, f"n{i}", i), row_text=(str(i), f"n{i}", str(i)))
                 for i in range(100)])
        s.write([RowChange(OpType.UPDATE, users, 2, row=(i, f"m{i}", -i), row_text=(str(i), f"m{i}", str(-i)))
                 for i in range(100)])
        assert s.target.pg_temp_ok is False
    finally:
        s.close()
    got = postgres.rows("users", order="id")
    assert got == [(i, f"m{i}", -i) for i in range(100)]


def test_postgres_copy_text_reaches_a_connection_of_another_client_encoding_as_text(
        postgres: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """The COPY data is rendered as UTF-8 bytes and sent as they are on a UTF-8 connection; on a connection of another
    client encoding (here LATIN1, libpq's ``PGCLIENTENCODING``) it goes as text that psycopg2 encodes, so the values
    stored are the same characters (sent as UTF-8 bytes, the server would read each as two LATIN1 ones)."""
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    sink = postgres.sink(batch_rows=50)
    try:
        sink.write([_fresh(USERS, i, f"é{i}") for i in range(100)])  # two direct COPYs
        sink.write([_fresh(USERS, i, f"ü{i}") for i in range(50, 150)])  # a key exists: the staging COPY
    finally:
        sink.close()
    got = postgres.execute("SELECT id, name FROM public.users ORDER BY id")
    assert got == [(i, f"é{i}") for i in range(50)] + [(i, f"ü{i}") for i in range(50, 150)]
