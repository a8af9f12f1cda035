"""Schema changes applied by the SQL sink (``DdlSink.apply_ddl``) on real MariaDB, PostgreSQL and SQLite targets.

Each test runs the same statements on a real PostgreSQL *source*: its DML (rows read back with RETURNING, as
stored upstream) goes to the sink through ``TxnSink.write``, its DDL is run upstream and handed to the sink as
a hand-built ``DdlEvent`` whose ``before``/``after`` schemas are read from the source's catalog. Every test
ends with the row-by-row compare of playground/compare.py, and the tests that change a table's shape check
that the altered downstream table is indistinguishable from a table the sink creates fresh from the new
schema (column names, types, nullability, defaults, key: playground/compare_schema.py)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg2
import pytest

from cdc.config import DdlConfig, SinkConfig
from cdc.errors import DdlRejected, SinkError, SinkUnavailable
from cdc.events import (
    ColumnFill,
    ColumnSchema,
    DdlChange,
    DdlEvent,
    DdlKind,
    IndexSpec,
    OpType,
    RowChange,
    TableName,
    TableSchema,
)
from playground.compare import compare_tables
from playground.compare_schema import assert_schemas_equal, downstream_shape, target_columns
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.sql_targets import SqlTarget, make_target

pytestmark = pytest.mark.integration
K = DdlKind


class Target(SqlTarget):
    def sink(self, delivery: str = "exactly-once", **ddl: Any) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(delivery=delivery), DdlConfig(**ddl))
        assert isinstance(s, SQLSink)
        s.check()
        return s

    def indexes(self, table: str) -> set[str]:
        if self.kind == "sqlite":
            return {r[1] for r in self.execute(f"PRAGMA index_list(\"{table}\")") if not r[1].startswith("sqlite_")}
        if self.kind == "mariadb":
            return {r[0] for r in self.execute(
                "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() "
                f"AND table_name = '{table}' AND index_name <> 'PRIMARY'")}
        return {r[0] for r in self.execute(
            f"SELECT indexname FROM pg_indexes WHERE schemaname = 'public' AND tablename = '{table}' "
            "AND indexname NOT LIKE '%%pkey'")}


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Target:
    return make_target(Target, request, tmp_path)


@pytest.fixture
def source(pg_server: Any) -> Iterator[Any]:
    name = f"src_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(name)
    conn = psycopg2.connect(pg_server.dsn(name))
    conn.autocommit = True
    yield conn
    conn.close()
    pg_server.drop_database(name)


@dataclass
class Repl:
    """The source and the sink side by side; ``ts`` is the commit Ts of the next upstream transaction."""

    src: Any
    target: Target
    sink: SQLSink
    ts: int = 100
    versions: dict[str, int] = field(default_factory=dict)
    crash_replay: bool = False

    def up(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.src.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description is not None else []

    def schema(self, table: str) -> TableSchema | None:
        """The source table's schema as the upstream reads it (name, types, nullability, key, defaults)."""
        tn = TableName.parse(table)
        rows = self.up(
            "SELECT a.attname, a.atttypid::int, coalesce(e.typname, t.typname), t.typelem <> 0 AND t.typlen = -1, "
            "format_type(a.atttypid, a.atttypmod), a.atttypmod, NOT a.attnotnull, pg_get_expr(d.adbin, d.adrelid), "
            "coalesce(a.attnum = ANY(i.indkey), false) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typlen = -1 AND t.typelem <> 0 "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary "
            "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (f'"{tn.schema}"."{tn.table}"',))
        if not rows:
            return None
        cols = tuple(ColumnSchema(n, oid, base, bool(arr), tn, mod, bool(null), bool(key), dflt)
                     for n, oid, base, arr, tn, mod, null, dflt, key in rows)
        key = tuple(r[0] for r in self.up(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
            (f'"{tn.schema}"."{tn.table}"',)))
        self.versions[table] = self.versions.get(table, 0) + 1
        if key:
            return TableSchema(tn, cols, key, "d", 0, self.versions[table])
        return TableSchema(tn, cols, tuple(c.name for c in cols), "f", 0,
                           self.versions[table], has_key=False)

    def dml(self, table: str, sql: str, params: Any = None, op: OpType = OpType.INSERT) -> None:
        """One upstream transaction: ``sql`` ends with RETURNING * (DELETE: the old rows); written to the sink."""
        schema = self.schema(table)
        assert schema is not None
        rows = self.up(sql, params)
        self.ts += 10
        changes = []
        for r in rows:
            values = dict(zip(schema.column_names, r, strict=True))
            if op == OpType.DELETE:
                changes.append(RowChange(op, schema, self.ts, values=None, old_values=values))
            elif op == OpType.UPDATE and not schema.has_key:
                raise AssertionError("updates of tables without a key need the old row; not used here")
            else:
                changes.append(RowChange(op, schema, self.ts, values=values))
        self.sink.write(changes)

    def ddl(self, table: str, sql: str, *changes: DdlChange, new_table: str | None = None,
            expect: bool = True, fills: tuple[ColumnFill, ...] = ()) -> DdlEvent:
        before = self.schema(table)
        self.up(sql)
        after = self.schema(new_table or table)
        self.ts += 10
        ev = DdlEvent(self.ts, 0.0, TableName.parse(table), tuple(changes), before, after, sql,
                      new_table=TableName.parse(new_table) if new_table else None, fills=fills)
        assert self.sink.apply_ddl(ev) is expect
        if self.crash_replay:  # the steps ran, the record did not (MariaDB's crash window): replay converges
            rec = "tidewater.tidewater_ddl" if self.target.kind == "postgresql" else "tidewater_ddl"
            self.target.execute(f"DELETE FROM {rec} WHERE commit_ts = {ev.commit_ts}")
            assert self.sink.apply_ddl(ev) is True
            assert self.sink.apply_ddl(ev) is False
        return ev

    def compare(self, *tables: str) -> None:
        for d in compare_tables(self.src, [str(TableName.parse(t)) for t in tables], self.target.uri):
            assert d.equal, d
            assert d.source_rows == d.target_rows

    def same_as_fresh(self, table: str) -> None:
        """The altered downstream table has the shape the sink gives a table created from the new schema:
        column names, types, nullability, no defaults, key (playground/compare_schema.py)."""
        assert_schemas_equal(self.src, [str(TableName.parse(table))], self.target.uri)


@pytest.fixture
def repl(source: Any, target: Target) -> Iterator[Repl]:
    sink = target.sink(replicate_indexes=True)
    r = Repl(source, target, sink)
    r.up("CREATE TABLE t (id int PRIMARY KEY, a varchar(10), n numeric(6,2))")
    r.dml("t", "INSERT INTO t VALUES (1, 'one', 1.5), (2, 'two', NULL), (3, NULL, 3.25) RETURNING *")
    yield r
    sink.close()


def test_add_column_with_defaults_fills_existing_rows(repl: Repl) -> None:
    repl.ddl("t", "ALTER TABLE t ADD COLUMN c int NOT NULL DEFAULT 7, ADD COLUMN s text DEFAULT 'it''s', "
             "ADD COLUMN z numeric(8,3) DEFAULT 1.5, ADD COLUMN b boolean DEFAULT true, ADD COLUMN e date",
             DdlChange(K.ADD_COLUMN, "c"), DdlChange(K.ADD_COLUMN, "s"), DdlChange(K.ADD_COLUMN, "z"),
             DdlChange(K.ADD_COLUMN, "b"), DdlChange(K.ADD_COLUMN, "e"))
    repl.dml("t", "INSERT INTO t VALUES (4, 'four', 4, 8, 'x', 2.25, false, '2024-02-29') RETURNING *")
    repl.dml("t", "UPDATE t SET c = 9 WHERE id = 1 RETURNING *", op=OpType.UPDATE)
    assert repl.sink.take_warnings() == []
    repl.compare("t")
    repl.same_as_fresh("t")


def test_added_columns_get_the_value_or_the_per_row_values_the_event_says_upstream_gave_them(
        repl: Repl, pg_server: Any) -> None:
    from upstream.postgres.rowfetch import RowFetcher

    (db,), = repl.up("SELECT current_database()")
    with RowFetcher(pg_server.uri(db)) as fetch:
        repl.sink.set_row_source(fetch)
        (at,), = repl.up("SELECT now()")
        repl.ddl("t", "ALTER TABLE t ADD COLUMN at timestamptz NOT NULL DEFAULT now()", DdlChange(K.ADD_COLUMN, "at"),
                 fills=(ColumnFill("at", at),))
        repl.up("UPDATE t SET at = %s", (at,))  # (the value the trigger would have read from attmissingval)
        repl.ddl("t", "ALTER TABLE t ADD COLUMN u uuid DEFAULT gen_random_uuid(), ADD COLUMN k int DEFAULT 5",
                 DdlChange(K.ADD_COLUMN, "u"), DdlChange(K.ADD_COLUMN, "k"),
                 fills=(ColumnFill("u", per_row=True), ColumnFill("k", per_row=True)))
        # a rebuild on SQLite (a column dropped in the same event), then the values read back
        repl.ddl("t", "ALTER TABLE t DROP COLUMN a, ADD COLUMN v timestamptz DEFAULT clock_timestamp()",
                 DdlChange(K.DROP_COLUMN, "a"), DdlChange(K.ADD_COLUMN, "v"), fills=(ColumnFill("v", per_row=True),))
        assert repl.sink.take_warnings() == []
        repl.compare("t")
        repl.same_as_fresh("t")
        assert fetch.queries == 3  # u, k and v: one batch of keys each

    # a table without a key cannot be read back by key; without a row source nothing can be read back
    repl.up("CREATE TABLE nk (n int, m text)")
    repl.up("ALTER TABLE nk REPLICA IDENTITY FULL")
    repl.dml("nk", "INSERT INTO nk VALUES (1, 'x'), (1, 'x') RETURNING *")
    repl.ddl("nk", "ALTER TABLE nk ADD COLUMN v float8 DEFAULT random()", DdlChange(K.ADD_COLUMN, "v"),
             fills=(ColumnFill("v", per_row=True),))
    repl.sink.set_row_source(None)
    repl.ddl("t", "ALTER TABLE t ADD COLUMN w float8 DEFAULT random()", DdlChange(K.ADD_COLUMN, "w"),
             fills=(ColumnFill("w", per_row=True),))
    nk, t = sorted(repl.sink.take_warnings(), key=lambda w: w.table)
    assert (nk.code, nk.table) == ("CDC:WarnDdlDefault", "public.nk") and "no key" in nk.message, nk
    assert (t.code, t.table) == ("CDC:WarnDdlDefault", "public.t") and "no upstream" in t.message, t


def test_add_column_with_a_volatile_default_is_a_divergence_warning(repl: Repl) -> None:
    repl.ddl("t", "ALTER TABLE t ADD COLUMN at timestamptz NOT NULL DEFAULT now()", DdlChange(K.ADD_COLUMN, "at"))
    (w,) = repl.sink.take_warnings()
    assert w.code == "CDC:WarnDdlDefault" and w.table == "public.t" and "now()" in w.message
    (d,) = compare_tables(repl.src, ["public.t"], repl.target.uri)
    assert sorted(d.different) == [(1,), (2,), (3,)] or sorted(d.different) == [1, 2, 3]  # the rows before it
    repl.same_as_fresh("t")


def test_drop_rename_and_retype_columns(repl: Repl) -> None:
    repl.ddl("t", "ALTER TABLE t DROP COLUMN a", DdlChange(K.DROP_COLUMN, "a"))
    repl.dml("t", "INSERT INTO t VALUES (4, 4.5) RETURNING *")
    repl.compare("t")
    repl.same_as_fresh("t")
    repl.ddl("t", "ALTER TABLE t RENAME COLUMN n TO amount", DdlChange(K.RENAME_COLUMN, "n", "amount"))
    repl.dml("t", "INSERT INTO t VALUES (5, 5.75) RETURNING *")
    repl.compare("t")
    repl.same_as_fresh("t")
    repl.ddl("t", "ALTER TABLE t ADD COLUMN a varchar(10)", DdlChange(K.ADD_COLUMN, "a"))
    repl.dml("t", "UPDATE t SET a = 'abcdefghij' WHERE id = 5 RETURNING *", op=OpType.UPDATE)
    repl.ddl("t", "ALTER TABLE t ALTER COLUMN id TYPE bigint, ALTER COLUMN a TYPE varchar(300), "
             "ALTER COLUMN amount TYPE numeric(12,4)", DdlChange(K.ALTER_COLUMN_TYPE, "id"),
             DdlChange(K.ALTER_COLUMN_TYPE, "a"), DdlChange(K.ALTER_COLUMN_TYPE, "amount"))
    repl.dml("t", "INSERT INTO t VALUES (9000000000, 1.2345, %s) RETURNING *", ("y" * 300,))
    repl.compare("t")
    repl.same_as_fresh("t")
    repl.ddl("t", "ALTER TABLE t ALTER COLUMN a TYPE text", DdlChange(K.ALTER_COLUMN_TYPE, "a"))
    repl.dml("t", "INSERT INTO t VALUES (6, 6, %s) RETURNING *", ("z" * 1000,))
    repl.compare("t")
    repl.same_as_fresh("t")


def test_defaults_and_not_null_change_nothing_downstream(repl: Repl) -> None:
    repl.up("UPDATE t SET n = 0 WHERE n IS NULL")
    repl.dml("t", "UPDATE t SET n = n WHERE id = 2 RETURNING *", op=OpType.UPDATE)
    repl.ddl("t", "ALTER TABLE t ALTER COLUMN a SET DEFAULT 'd', ALTER COLUMN n SET NOT NULL",
             DdlChange(K.SET_DEFAULT, "a"), DdlChange(K.SET_NOT_NULL, "n"))
    repl.dml("t", "INSERT INTO t (id, n) VALUES (4, 1) RETURNING *")
    repl.ddl("t", "ALTER TABLE t ALTER COLUMN a DROP DEFAULT, ALTER COLUMN n DROP NOT NULL",
             DdlChange(K.DROP_DEFAULT, "a"), DdlChange(K.DROP_NOT_NULL, "n"))
    repl.dml("t", "INSERT INTO t (id) VALUES (5) RETURNING *")
    repl.compare("t")
    repl.same_as_fresh("t")


def test_create_drop_and_create_again_starts_empty(repl: Repl) -> None:
    repl.ddl("u", "CREATE TABLE u (k text PRIMARY KEY, v int)", DdlChange(K.CREATE_TABLE))
    assert "u" in repl.target.tables()
    repl.dml("u", "INSERT INTO u VALUES ('a', 1), ('b', 2) RETURNING *")
    repl.compare("u")
    repl.same_as_fresh("u")
    repl.ddl("u", "DROP TABLE u", DdlChange(K.DROP_TABLE))
    assert "u" not in repl.target.tables()
    repl.ddl("u", "CREATE TABLE u (k text PRIMARY KEY, w numeric)", DdlChange(K.CREATE_TABLE))
    repl.dml("u", "INSERT INTO u VALUES ('c', 3.5) RETURNING *")
    repl.compare("u")  # only the new incarnation's row
    repl.same_as_fresh("u")


def test_rename_table_keeps_rows_and_truncate(repl: Repl) -> None:
    repl.ddl("t", "ALTER TABLE t RENAME TO t2", DdlChange(K.RENAME_TABLE, new_name="public.t2"), new_table="t2")
    assert "t" not in repl.target.tables() and "t2" in repl.target.tables()
    repl.dml("t2", "INSERT INTO t2 VALUES (4, 'four', 4) RETURNING *")
    repl.compare("t2")
    repl.same_as_fresh("t2")
    repl.ddl("t2", "TRUNCATE t2", DdlChange(K.TRUNCATE_TABLE))
    repl.dml("t2", "INSERT INTO t2 VALUES (5, 'five', 5) RETURNING *")
    repl.compare("t2")


def _key(repl: Repl, table: str) -> tuple[str, ...]:
    shape = downstream_shape(repl.target.uri, f"public.{table}")
    assert shape is not None
    return shape.key


def test_add_and_drop_primary_key_change_the_upsert_key(repl: Repl) -> None:
    repl.up("CREATE TABLE k (id int NOT NULL, v text)")
    repl.up("ALTER TABLE k REPLICA IDENTITY FULL")
    repl.dml("k", "INSERT INTO k VALUES (1, 'a'), (2, 'b') RETURNING *")
    repl.ddl("k", "ALTER TABLE k ADD PRIMARY KEY (id)", DdlChange(K.ADD_PRIMARY_KEY))
    assert _key(repl, "k") == ("id",)
    repl.dml("k", "UPDATE k SET v = 'a2' WHERE id = 1 RETURNING *", op=OpType.UPDATE)  # an upsert by the new key
    repl.dml("k", "INSERT INTO k VALUES (3, 'c') RETURNING *")
    repl.compare("k")
    repl.same_as_fresh("k")
    repl.ddl("k", "ALTER TABLE k DROP CONSTRAINT k_pkey", DdlChange(K.DROP_PRIMARY_KEY))
    assert _key(repl, "k") == ()
    repl.dml("k", "INSERT INTO k VALUES (3, 'c') RETURNING *")  # a duplicate is fine without a key
    repl.dml("k", "DELETE FROM k WHERE id = 2 RETURNING *", op=OpType.DELETE)
    repl.compare("k")
    repl.same_as_fresh("k")


def test_indexes_follow_when_replicate_indexes_is_on(repl: Repl) -> None:
    repl.ddl("t", "CREATE INDEX t_a_idx ON t (a)", DdlChange(K.CREATE_INDEX, index=IndexSpec("t_a_idx", ("a",))))
    repl.ddl("t", "CREATE UNIQUE INDEX t_na_idx ON t (n, a)",
             DdlChange(K.CREATE_INDEX, index=IndexSpec("t_na_idx", ("n", "a"), unique=True)))
    assert repl.target.indexes("t") == {"t_a_idx", "t_na_idx"}
    repl.ddl("t", "DROP INDEX t_a_idx", DdlChange(K.DROP_INDEX, index=IndexSpec("t_a_idx", ("a",))))
    assert repl.target.indexes("t") == {"t_na_idx"}
    repl.dml("t", "INSERT INTO t VALUES (4, 'four', 4) RETURNING *")
    repl.compare("t")


def test_indexes_are_ignored_when_replicate_indexes_is_off(repl: Repl) -> None:
    repl.sink.set_ddl_config(DdlConfig(replicate_indexes=False))
    repl.ddl("t", "CREATE INDEX t_a_idx ON t (a)", DdlChange(K.CREATE_INDEX, index=IndexSpec("t_a_idx", ("a",))))
    assert repl.target.indexes("t") == set()


def test_replay_applies_once_and_a_split_transaction_keeps_its_rows(repl: Repl, target: Target) -> None:
    sink = repl.sink
    sink.open_position("cf", 0)
    schema = repl.schema("t")
    assert schema is not None
    # one upstream transaction T: a row, the DDL, a row with the new column
    repl.up("BEGIN")
    repl.up("INSERT INTO t VALUES (4, 'four', 4)")
    before = repl.schema("t")
    repl.up("ALTER TABLE t ADD COLUMN c int DEFAULT 5")
    after = repl.schema("t")
    repl.up("INSERT INTO t VALUES (5, 'five', 5, 6)")
    repl.up("COMMIT")
    T = repl.ts = repl.ts + 10
    assert before is not None and after is not None
    pre = [RowChange(OpType.INSERT, before, T, values={"id": 4, "a": "four", "n": repl.up("SELECT n FROM t WHERE id = 4")[0][0]})]
    ev = DdlEvent(T, 0.0, TableName("public", "t"), (DdlChange(K.ADD_COLUMN, "c"),), before, after,
                  "ALTER TABLE t ADD COLUMN c int DEFAULT 5")
    post = [RowChange(OpType.INSERT, after, T, values=dict(zip(after.column_names, repl.up("SELECT * FROM t WHERE id = 5")[0],
                                                              strict=True)))]
    assert sink.write(pre) == 1
    assert sink.apply_ddl(ev) is True
    assert sink.write(post) == 1  # not skipped although the position is T already
    repl.compare("t")
    # a crash and a replay from before T: nothing is applied twice, nothing lost
    sink.close()
    again = target.sink()
    assert again.open_position("cf", 0) == T
    assert again.write(pre) == 0
    assert again.apply_ddl(ev) is False
    assert again.write(post) == 0
    repl.sink = again
    repl.compare("t")
    repl.same_as_fresh("t")


def test_two_writers_of_the_rows_after_a_split_transactions_ddl_apply_them_once(repl: Repl, target: Target) -> None:
    """A zombie writer Z and its successor S both reopen the position at T after T's DDL and both write T's rows
    that follow it: the position's compare-and-set stays at T, so only the DDL record's ``rows_done`` can tell;
    the second writer must fail instead of applying the rows again (a key-less table would hold them twice)."""
    repl.up("CREATE TABLE k (a int, b text)")
    k0 = repl.schema("k")
    assert k0 is not None
    zombie = repl.sink
    zombie.open_position("cf", 0)
    repl.up("BEGIN")
    repl.up("INSERT INTO k VALUES (1, 'before')")
    repl.up("ALTER TABLE k ADD COLUMN c int")
    after = repl.schema("k")
    repl.up("INSERT INTO k VALUES (2, 'after', 7)")
    repl.up("COMMIT")
    T = repl.ts = repl.ts + 10
    assert after is not None
    pre = [RowChange(OpType.INSERT, k0, T, values={"a": 1, "b": "before"})]
    ev = DdlEvent(T, 0.0, TableName("public", "k"), (DdlChange(K.ADD_COLUMN, "c"),), k0, after,
                  "ALTER TABLE k ADD COLUMN c int")
    post = [RowChange(OpType.INSERT, after, T, values={"a": 2, "b": "after", "c": 7})]
    assert zombie.write(pre) == 1
    assert zombie.apply_ddl(ev) is True  # Z reopened T, then froze before writing ``post``
    successor = target.sink()
    try:
        assert successor.open_position("cf", 0) == T
        assert successor.write(pre) == 0
        assert successor.apply_ddl(ev) is False  # recorded without rows_done: S reopens T too
        assert successor.write(post) == 1
        with pytest.raises(SinkUnavailable, match="another writer"):
            zombie.write(post)  # Z wakes up: its compare-and-set at T would pass
    finally:
        successor.close()
    repl.compare("k")


def test_replay_after_a_crash_between_ddl_steps_converges(repl: Repl, target: Target) -> None:
    # MariaDB commits each step: a crash after the ADD COLUMN but before the fill and the record
    q = target.qualified("t")
    typ = "INT" if target.kind == "mariadb" else "integer"
    target.execute(f"ALTER TABLE {q} ADD COLUMN c {typ}")
    repl.ddl("t", "ALTER TABLE t ADD COLUMN c int DEFAULT 5", DdlChange(K.ADD_COLUMN, "c"))
    repl.compare("t")
    repl.same_as_fresh("t")


def test_narrowing_is_rejected_with_the_ddl_table_and_reason(repl: Repl) -> None:
    with pytest.raises(DdlRejected) as info:
        repl.ddl("t", "ALTER TABLE t ALTER COLUMN a TYPE varchar(5)", DdlChange(K.ALTER_COLUMN_TYPE, "a"))
    msg = str(info.value)
    assert info.value.code == "CDC:ErrDdlRejected"
    assert "ALTER TABLE t ALTER COLUMN a TYPE varchar(5)" in msg and "public.t" in msg and "narrowing" in msg
    # the operator skips it knowingly: recorded, the target unchanged, the rows after it written
    ev = info.value
    before, after = repl.schema("t"), repl.schema("t")
    skipped = DdlEvent(repl.ts, 0.0, TableName("public", "t"), (DdlChange(K.ALTER_COLUMN_TYPE, "a"),), before, after,
                       "ALTER TABLE t ALTER COLUMN a TYPE varchar(5)")
    assert skipped.commit_ts == ev.commit_ts
    assert repl.sink.apply_ddl(skipped, skip=True) is True
    assert repl.sink.apply_ddl(skipped, skip=True) is False
    assert repl.sink.apply_ddl(skipped) is False  # a replay does not apply it
    repl.dml("t", "INSERT INTO t VALUES (4, 'four', 4) RETURNING *")
    repl.compare("t")


def test_a_ddl_the_target_refuses_is_rejected_with_its_reason(repl: Repl, target: Target) -> None:
    repl.up("CREATE TABLE k (id int NOT NULL, v text)")
    repl.up("ALTER TABLE k REPLICA IDENTITY FULL")
    repl.dml("k", "INSERT INTO k VALUES (1, 'a') RETURNING *")
    q = target.qualified("k")
    target.execute(f"INSERT INTO {q} VALUES (1, 'diverged')")  # the target differs: a duplicate key
    with pytest.raises(DdlRejected) as info:
        repl.ddl("k", "ALTER TABLE k ADD PRIMARY KEY (id)", DdlChange(K.ADD_PRIMARY_KEY))
    assert "refused it" in str(info.value) and "public.k" in str(info.value)
    assert sorted(target.execute(f"SELECT id, v FROM {q}")) == [(1, "a"), (1, "diverged")]  # left as it was


def test_sqlite_rebuild_keeps_rows_keys_and_foreign_keys(source: Any, tmp_path: Any) -> None:
    target = Target("sqlite", None, str(tmp_path / "fk.db"))
    sink = target.sink()
    r = Repl(source, target, sink)
    r.up("CREATE TABLE p (id int PRIMARY KEY, x int, y text)")
    r.dml("p", "INSERT INTO p VALUES (1, 10, 'a'), (2, 20, 'b') RETURNING *")
    target.execute('CREATE TABLE c (id integer PRIMARY KEY, pid integer REFERENCES "p" (id))')
    target.execute("INSERT INTO c VALUES (1, 1), (2, 2)")
    target.execute('CREATE INDEX p_y ON "p" (y)')
    r.ddl("p", "ALTER TABLE p DROP COLUMN x, ALTER COLUMN id TYPE bigint",
          DdlChange(K.DROP_COLUMN, "x"), DdlChange(K.ALTER_COLUMN_TYPE, "id"))
    r.compare("p")
    r.same_as_fresh("p")
    assert target.indexes("p") == {"p_y"}
    assert target.execute("PRAGMA foreign_key_check") == []
    assert sorted(target.execute("SELECT * FROM c")) == [(1, 1), (2, 2)]
    # foreign keys are on again for the sink's writes: deleting a referenced parent fails
    r.up("DELETE FROM p WHERE id = 3")
    with pytest.raises(Exception, match="FOREIGN KEY"):
        sink.write([RowChange(OpType.DELETE, r.schema("p"), 999, old_values={"id": 1, "y": "a"})])
    sink.close()


def test_non_sql_sinks_refuse_ddl_clearly() -> None:
    from sinks.base import apply_ddl
    from sinks.testing import MemorySink

    class Plain(MemorySink):  # a sink without the DdlSink role
        pass

    ev = DdlEvent(5, 0.0, TableName("public", "t"), (DdlChange(K.DROP_TABLE),), None, None, "DROP TABLE t")
    with pytest.raises(DdlRejected, match="Plain does not apply schema changes"):
        apply_ddl(Plain(), ev)


def test_a_refused_fence_leaves_the_target_unchanged(repl: Repl, target: Target) -> None:
    def fence() -> None:
        raise RuntimeError("lease lost")

    before = repl.schema("t")
    repl.up("ALTER TABLE t ADD COLUMN c int DEFAULT 5")
    after = repl.schema("t")
    ev = DdlEvent(repl.ts + 10, 0.0, TableName("public", "t"), (DdlChange(K.ADD_COLUMN, "c"),), before, after,
                  "ALTER TABLE t ADD COLUMN c int DEFAULT 5")
    with pytest.raises(RuntimeError, match="lease lost"):
        repl.sink.apply_ddl(ev, fence)
    assert target_columns(target.uri, "public.t") == ["id", "a", "n"]  # nothing applied (MariaDB: fenced before)
    assert repl.sink.apply_ddl(ev, lambda: None) is True
    repl.compare("t")
    repl.same_as_fresh("t")


def test_a_ddl_on_a_table_not_yet_downstream_is_recorded_and_the_first_row_creates_it(repl: Repl, target: Target) -> None:
    repl.up("CREATE TABLE late (id int PRIMARY KEY, v text)")
    repl.ddl("late", "ALTER TABLE late ADD COLUMN w int DEFAULT 1", DdlChange(K.ADD_COLUMN, "w"))
    assert "late" not in target.tables()
    repl.dml("late", "INSERT INTO late VALUES (1, 'x', 2) RETURNING *")
    repl.compare("late")
    repl.same_as_fresh("late")


def test_every_kind_replayed_after_a_crash_before_its_record_converges(repl: Repl, target: Target) -> None:
    repl.crash_replay = True
    repl.ddl("t", "ALTER TABLE t ADD COLUMN c int DEFAULT 5, ADD COLUMN d text",
             DdlChange(K.ADD_COLUMN, "c"), DdlChange(K.ADD_COLUMN, "d"))
    repl.ddl("t", "ALTER TABLE t RENAME COLUMN d TO e", DdlChange(K.RENAME_COLUMN, "d", "e"))
    repl.ddl("t", "ALTER TABLE t ALTER COLUMN c TYPE bigint, ALTER COLUMN n TYPE numeric(9,3)",
             DdlChange(K.ALTER_COLUMN_TYPE, "c"), DdlChange(K.ALTER_COLUMN_TYPE, "n"))
    repl.ddl("t", "ALTER TABLE t DROP COLUMN a", DdlChange(K.DROP_COLUMN, "a"))
    repl.ddl("t", "ALTER TABLE t ALTER COLUMN e SET DEFAULT 'x'", DdlChange(K.SET_DEFAULT, "e"))
    repl.ddl("t", "CREATE INDEX t_e ON t (e)", DdlChange(K.CREATE_INDEX, index=IndexSpec("t_e", ("e",))))
    repl.dml("t", "INSERT INTO t (id, n, c, e) VALUES (4, 4.125, 6, 'y') RETURNING *")
    repl.compare("t")
    repl.same_as_fresh("t")
    repl.ddl("t", "DROP INDEX t_e", DdlChange(K.DROP_INDEX, index=IndexSpec("t_e", ("e",))))
    repl.up("CREATE TABLE k (id int NOT NULL, v text)")
    repl.up("ALTER TABLE k REPLICA IDENTITY FULL")
    repl.dml("k", "INSERT INTO k VALUES (1, 'a') RETURNING *")
    repl.ddl("k", "ALTER TABLE k ADD PRIMARY KEY (id)", DdlChange(K.ADD_PRIMARY_KEY))
    repl.dml("k", "UPDATE k SET v = 'b' WHERE id = 1 RETURNING *", op=OpType.UPDATE)
    repl.compare("k")
    repl.same_as_fresh("k")
    repl.ddl("k", "ALTER TABLE k DROP CONSTRAINT k_pkey", DdlChange(K.DROP_PRIMARY_KEY))
    repl.compare("k")
    repl.same_as_fresh("k")
    repl.ddl("t", "ALTER TABLE t RENAME TO t2", DdlChange(K.RENAME_TABLE, new_name="public.t2"), new_table="t2")
    repl.ddl("t2", "TRUNCATE t2", DdlChange(K.TRUNCATE_TABLE))
    repl.dml("t2", "INSERT INTO t2 (id, n) VALUES (5, 5) RETURNING *")
    repl.compare("t2")
    repl.ddl("k", "DROP TABLE k", DdlChange(K.DROP_TABLE))
    repl.ddl("k", "CREATE TABLE k (id int PRIMARY KEY)", DdlChange(K.CREATE_TABLE))
    repl.dml("k", "INSERT INTO k VALUES (7) RETURNING *")
    repl.compare("k", "t2")
    assert "t" not in target.tables()


def test_at_least_once_replay_drops_rows_from_before_an_applied_ddl(source: Any, target: Target) -> None:
    sink = target.sink("at-least-once")
    assert sink.open_position("cf", 0) == 0
    r = Repl(source, target, sink)
    r.up("CREATE TABLE t (id int PRIMARY KEY, a varchar(10), n numeric(6,2))")
    old = r.schema("t")
    assert old is not None
    r.dml("t", "INSERT INTO t VALUES (1, 'one', 1.5) RETURNING *")
    pre = [RowChange(OpType.INSERT, old, r.ts, values={"id": 1, "a": "one", "n": r.up("SELECT n FROM t")[0][0]})]
    ev = r.ddl("t", "ALTER TABLE t DROP COLUMN a", DdlChange(K.DROP_COLUMN, "a"))
    r.dml("t", "INSERT INTO t VALUES (2, 2.5) RETURNING *")
    sink.close()
    # a restart from a checkpoint before the DDL: the old rows come again, with the column the target lost
    again = target.sink("at-least-once")
    assert again.open_position("cf", 0) == 0
    assert again.write(pre) == 0  # dropped: already downstream, and the target no longer has column a
    assert again.apply_ddl(ev) is False
    r.sink = again
    r.dml("t", "UPDATE t SET n = 3 WHERE id = 2 RETURNING *", op=OpType.UPDATE)
    r.compare("t")
    again.close()


def test_a_ddl_blocked_by_a_downstream_lock_fails_retryably(repl: Repl, target: Target,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if target.kind == "sqlite":
        pytest.skip("SQLite waits busy-timeout for its single writer lock, as writes do")
    import sinks.sql.ops.ddl_run as ddl_run

    monkeypatch.setattr(ddl_run, "LOCK_TIMEOUT", 1)
    holder = target.server.connect(target.db)  # another client reading the table in an open transaction
    try:
        if target.kind == "postgresql":
            holder.autocommit = False
        else:
            holder.autocommit(False)
        with holder.cursor() as cur:
            cur.execute(f"SELECT * FROM {target.qualified('t')}")
        before = repl.schema("t")
        repl.up("ALTER TABLE t ADD COLUMN c int")
        ev = DdlEvent(repl.ts + 10, 0.0, TableName("public", "t"), (DdlChange(K.ADD_COLUMN, "c"),), before,
                      repl.schema("t"), "ALTER TABLE t ADD COLUMN c int")
        with pytest.raises(SinkUnavailable):
            repl.sink.apply_ddl(ev)
    finally:
        holder.rollback()
        holder.close()
    assert repl.sink.apply_ddl(ev) is True
    repl.compare("t")


def test_two_ddls_in_one_transaction_with_rows_between_them_replay_exactly(repl: Repl, target: Target) -> None:
    sink = repl.sink
    sink.open_position("cf", 0)
    repl.up("BEGIN")
    s0 = repl.schema("t")
    pre = repl.up("INSERT INTO t VALUES (4, 'four', 4) RETURNING *")
    repl.up("ALTER TABLE t ADD COLUMN c int DEFAULT 1")
    s1 = repl.schema("t")
    mid = repl.up("INSERT INTO t VALUES (5, 'five', 5, 5) RETURNING *")
    repl.up("ALTER TABLE t RENAME COLUMN a TO b")
    s2 = repl.schema("t")
    post = repl.up("UPDATE t SET c = 9 WHERE id IN (1, 5) RETURNING *")
    repl.up("COMMIT")
    assert s0 is not None and s1 is not None and s2 is not None
    T = repl.ts = repl.ts + 10
    t = TableName("public", "t")

    def rows(schema: TableSchema, got: list[tuple[Any, ...]], op: OpType = OpType.INSERT) -> list[RowChange]:
        return [RowChange(op, schema, T, values=dict(zip(schema.column_names, r, strict=True))) for r in got]

    ev0 = DdlEvent(T, 0.0, t, (DdlChange(K.ADD_COLUMN, "c"),), s0, s1, "ALTER TABLE t ADD COLUMN c int DEFAULT 1", 0)
    ev1 = DdlEvent(T, 0.0, t, (DdlChange(K.RENAME_COLUMN, "a", "b"),), s1, s2, "ALTER TABLE t RENAME COLUMN a TO b", 1)
    stream: list[Any] = [rows(s0, pre), ev0, rows(s1, mid), ev1, rows(s2, post, OpType.UPDATE)]
    for item in stream:
        if isinstance(item, DdlEvent):
            assert sink.apply_ddl(item) is True
        else:
            assert sink.write(item) == len(item)
    repl.compare("t")
    # a crash after the second DDL, before its rows: the replay writes exactly those
    target.execute(f"UPDATE {target.qualified('t')} SET c = 1 WHERE id = 1")  # undo the last write's effect ...
    rec = "tidewater.tidewater_ddl" if target.kind == "postgresql" else "tidewater_ddl"
    target.execute(f"UPDATE {rec} SET rows_done = 0 WHERE seq = 1")  # ... and its mark, as if it never committed
    sink.close()
    again = target.sink()
    assert again.open_position("cf", 0) == T
    counts = [again.apply_ddl(i) if isinstance(i, DdlEvent) else again.write(i) for i in stream]
    assert counts == [0, False, 0, False, 2]
    repl.sink = again
    repl.compare("t")
    repl.same_as_fresh("t")


def test_create_table_over_a_downstream_table_with_rows_is_rejected(repl: Repl, target: Target) -> None:
    target.execute(f"CREATE TABLE {target.qualified('u')} (k varchar(10) PRIMARY KEY)")
    target.execute(f"INSERT INTO {target.qualified('u')} VALUES ('old')")
    with pytest.raises(DdlRejected, match="already exists with rows"):
        repl.ddl("u", "CREATE TABLE u (k text PRIMARY KEY)", DdlChange(K.CREATE_TABLE))
    target.execute(f"DELETE FROM {target.qualified('u')}")  # emptied downstream: used as it is
    ev = DdlEvent(repl.ts, 0.0, TableName("public", "u"), (DdlChange(K.CREATE_TABLE),), None, repl.schema("u"),
                  "CREATE TABLE u (k text PRIMARY KEY)")
    assert repl.sink.apply_ddl(ev) is True
    repl.dml("u", "INSERT INTO u VALUES ('new') RETURNING *")
    repl.compare("u")


def test_a_table_moved_to_another_schema_follows_the_routing(repl: Repl, target: Target) -> None:
    repl.up("CREATE SCHEMA other")
    repl.ddl("t", "ALTER TABLE t SET SCHEMA other", DdlChange(K.RENAME_TABLE, new_name="other.t"), new_table="other.t")
    repl.dml("other.t", "INSERT INTO other.t VALUES (4, 'four', 4) RETURNING *")
    repl.compare("other.t")  # PostgreSQL: other.t; MySQL and SQLite: still t (the schema is not in the name)
    if target.kind == "postgresql":
        assert "t" not in target.tables()
    else:
        assert "t" in target.tables()


def test_a_record_of_another_tables_ddl_at_the_same_position_is_never_taken_for_this_one(
        repl: Repl, target: Target) -> None:
    """Two DDLs given one (commit Ts, seq) (two spans that each numbered a transaction's DDLs on their own, before
    DdlEvent.seq counted the whole transaction): the second was taken for a replay of the first and silently not
    applied. Now it fails loudly, naming both tables, and the target is unchanged."""
    repl.up("CREATE TABLE u (id int PRIMARY KEY, b text)")
    repl.dml("u", "INSERT INTO u VALUES (1, 'one') RETURNING *")
    repl.sink.open_position("cf", 0)
    ts = repl.ts + 10
    t_before, u_before = repl.schema("t"), repl.schema("u")
    repl.up("ALTER TABLE t ADD COLUMN c int")
    repl.up("ALTER TABLE u ADD COLUMN d int")
    t_after, u_after = repl.schema("t"), repl.schema("u")
    first = DdlEvent(ts, 0.0, TableName("public", "t"), (DdlChange(K.ADD_COLUMN, "c"),), t_before, t_after,
                     "ALTER TABLE t ADD COLUMN c int", 0)
    clash = DdlEvent(ts, 0.0, TableName("public", "u"), (DdlChange(K.ADD_COLUMN, "d"),), u_before, u_after,
                     "ALTER TABLE u ADD COLUMN d int", 0)
    assert repl.sink.apply_ddl(first) is True
    with pytest.raises(SinkError, match="holds a schema change of table public.t") as e:
        repl.sink.apply_ddl(clash)
    assert "public.u" in str(e.value)
    assert repl.sink.apply_ddl(dataclasses.replace(clash, seq=1)) is True  # its own position: applied
    repl.same_as_fresh("u")
