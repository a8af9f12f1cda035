"""The SQL sink's grouping of one ``write`` call per downstream table: multi-table transactions become one
statement per (table, kind, columns) instead of one per run of consecutive rows, each table's changes keep
their order (delete-then-insert of one key, key moves, TRUNCATE in between), the final state equals applying
the changes one by one, memory stays bounded and errors still name the table whose statement failed."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.errors import SinkError
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.sink import SQLSink
from sinks.sql.target.pipeline import Pipeline
from tests.sql_sink_fakes import URIS, FakeCursor, assume_tables, fake_connection

pytestmark = pytest.mark.unit


def col(name: str, base: str = "text", *, key: bool = False) -> ColumnSchema:
    return ColumnSchema(name, 0, base, nullable=not key, is_key=key)


def table(name: str, *, has_key: bool = True) -> TableSchema:
    cols = (col("id", "int4", key=has_key), col("name"), col("score", "int4"))
    key = ("id",) if has_key else tuple(c.name for c in cols)
    return TableSchema(TableName("public", name), cols, key, has_key=has_key, replica_identity="d" if has_key else "f")


def ins(s: TableSchema, id: int, name: Any = "x", score: Any = 0) -> RowChange:
    return RowChange(OpType.INSERT, s, 1, values={"id": id, "name": name, "score": score})


def upd(s: TableSchema, id: int, name: Any, score: Any, old_id: int | None = None,
        old: dict[str, Any] | None = None) -> RowChange:
    if old is None and old_id is not None:
        old = {"id": old_id}
    return RowChange(OpType.UPDATE, s, 1, values={"id": id, "name": name, "score": score}, old_values=old)


def dele(s: TableSchema, id: int, **more: Any) -> RowChange:
    return RowChange(OpType.DELETE, s, 1, old_values={"id": id, **more})


def trunc(s: TableSchema) -> RowChange:
    return RowChange(OpType.TRUNCATE, s, 1)


A, B, C = table("a"), table("b"), table("c")
KEYLESS = table("h", has_key=False)


# ---- what reaches the driver (no server: a recording cursor) ---------------------------------------
def send(dialect: str, changes: Any, *, batch_rows: int = 1000, txn_rows: int = 20000,
         cur: FakeCursor | None = None) -> list[tuple[str, str, Any]]:
    """The calls one write of ``changes`` makes; every table is known to exist downstream."""
    sink = SQLSink(URIS[dialect], SinkConfig(batch_rows=batch_rows, txn_rows=txn_rows))
    try:
        assume_tables(sink, dialect, A, B, C, KEYLESS)
        cur = cur or FakeCursor()
        conn = fake_connection(cur)
        sink.writer(conn).run(changes)
        return cur.calls
    finally:
        sink.close()


def target_of(sql: str) -> str:
    """The table a statement writes: the quoted identifier after INSERT INTO/DELETE FROM/UPDATE/TRUNCATE."""
    for mark in ('TRUNCATE "public".', 'INTO "public".', "INTO `", 'INTO "', 'FROM "public".', "FROM `", 'FROM "', 'UPDATE "public".',
                 "UPDATE `", 'UPDATE "'):
        if mark in sql:
            return sql.split(mark, 1)[1].strip('"`').split('"')[0].split("`")[0]
    raise AssertionError(sql)


def pgbench_like(n: int) -> list[RowChange]:
    """``n`` transactions each updating a, b, c by key and inserting into the keyless h."""
    out = []
    for i in range(n):
        out += [upd(A, i % 50, f"a{i}", i), upd(B, i % 7, f"b{i}", i), upd(C, i % 3, f"c{i}", i),
                ins(KEYLESS, i, f"h{i}", i)]
    return out


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_interleaved_tables_make_one_statement_per_table(dialect: str) -> None:
    calls = send(dialect, pgbench_like(100))
    assert sorted(target_of(sql) for _, sql, _ in calls) == ["a", "b", "c", "h"]
    # the order of the final flush is the order of each table's first pending row
    assert [target_of(sql) for _, sql, _ in calls] == ["a", "b", "c", "h"]


@pytest.mark.parametrize("dialect", ["mysql", "postgresql"])
def test_the_upsert_of_a_table_carries_its_last_row_per_key(dialect: str) -> None:
    (_, sql, params), *_ = send(dialect, pgbench_like(100))
    assert target_of(sql) == "a"
    if dialect == "postgresql":  # the window's net effect: the last update per key
        assert len(params) == 50 * 3
        rows = [tuple(params[i:i + 3]) for i in range(0, len(params), 3)]
        assert dict((r[0], r) for r in rows)[49] == (49, "a99", 99)
    else:
        assert sql.count("),(") == 49 and "'a49'" not in sql and "'a99'" in sql


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_a_table_group_is_flushed_at_batch_rows(dialect: str) -> None:
    changes = [ins(A if i % 2 else B, i) for i in range(20)]  # 10 rows each, alternating
    calls = send(dialect, changes, batch_rows=4)
    per_table = [target_of(sql) for _, sql, _ in calls]
    assert per_table.count("a") == 3 and per_table.count("b") == 3  # 4 + 4 + 2 rows each


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_a_window_applies_each_tables_net_effect(dialect: str) -> None:
    changes = [ins(A, 1), ins(B, 1), ins(A, 2), dele(A, 1), ins(B, 2), ins(A, 3), ins(B, 3), dele(B, 9)]
    calls = send(dialect, changes)
    kinds = [(target_of(sql), sql.split()[0]) for _, sql, _ in calls]
    # a: 1 came and went, 2 and 3 in one upsert; b: the delete of 9 before the upsert of 1, 2, 3
    assert kinds == [("b", "DELETE"), ("a", "INSERT"), ("b", "INSERT")]
    assert "1" not in repr(calls[1][2]).replace("'", "") or dialect == "mysql"


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_truncate_drops_its_tables_pending_rows_and_keeps_others_pending(dialect: str) -> None:
    changes = [ins(A, 1), ins(B, 1), trunc(A), ins(B, 2), ins(A, 2)]
    ops = [(target_of(sql), sql.split()[0]) for _, sql, _ in send(dialect, changes)]
    truncate = "TRUNCATE" if dialect == "postgresql" else "DELETE"
    assert ops == [("a", truncate), ("a", "INSERT"), ("b", "INSERT")]


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_pending_changes_are_bounded_and_windows_end_at_transaction_boundaries(dialect: str) -> None:
    tables = [table(f"t{i}") for i in range(3)]
    cur = FakeCursor()
    seen: list[int] = []

    def changes() -> Iterator[RowChange]:
        for i in range(60):
            seen.append(len(cur.calls))
            # transactions of 4 changes; the last 20 are one transaction (cut at twice the bound)
            ts = i // 4 if i < 40 else 100
            yield RowChange(OpType.UPDATE, tables[i % 3], ts, values={"id": i, "name": "x", "score": 0})

    sink = SQLSink(URIS[dialect], SinkConfig(batch_rows=10, txn_rows=10))  # bound: max(batch, txn) changes
    sink.target.pipeline = Pipeline(threaded=False)  # statements run when flushed (the pipeline's bound: its own tests)
    try:
        assume_tables(sink, dialect, *tables)
        conn = fake_connection(cur)
        sink.writer(conn).run(changes())
    finally:
        sink.close()
    # windows end at the first transaction boundary with >= 10 pending: after 12, 24, 36 changes; then the
    # 4 + 20-change tail: 40 (boundary, 4 pending), cut inside at 20 pending (change 56), end
    assert [i for i in range(1, 60) if seen[i] != seen[i - 1]] == [13, 25, 37, 57]
    assert len(cur.calls) == 3 * 5
    if dialect == "mysql":  # literal rows: every row sent exactly once
        assert sum(sql.count("),(") + 1 for _, sql, _ in cur.calls) == 60


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_rows_sent_early_leave_the_windows_pending_count(dialect: str) -> None:
    # a delete waits for the window's end; the inserts after it, one per transaction, go every batch_rows rows and
    # no longer count towards the bound (6): 1 change pending at most, so the window ends with the write
    changes = [RowChange(OpType.DELETE, B, 1, old_values={"id": 9})]
    changes += [RowChange(OpType.INSERT, A, 2 + i, values={"id": i, "name": "x", "score": 0}) for i in range(12)]
    ops = [(target_of(sql), sql.split()[0]) for _, sql, _ in send(dialect, changes, batch_rows=2, txn_rows=6)]
    assert ops == [("a", "INSERT")] * 6 + [("b", "DELETE")]


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_an_error_names_the_table_whose_group_failed(dialect: str) -> None:
    class Failing(FakeCursor):
        def execute(self, sql: str, params: Any = None) -> None:
            if target_of(sql) == "b":
                raise RuntimeError("boom")
            super().execute(sql, params)

        executemany = execute

    sink = SQLSink(URIS[dialect])
    cur = Failing()
    try:
        assume_tables(sink, dialect, A, B)
        conn = fake_connection(cur)
        w = sink.writer(conn)
        with pytest.raises(RuntimeError):
            w.run([ins(B, 1), ins(A, 1), ins(A, 2)])  # b's group is flushed at the end, after a's was started
        assert w.current == "b"
    finally:
        sink.close()


# ---- SQLite: final state against a model ------------------------------------------------------------
def read(path: Path, name: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f'SELECT id, name, score FROM "{name}" ORDER BY id, name, score').fetchall()
    finally:
        conn.close()


def random_history(rng: random.Random, tables: list[TableSchema], n: int) -> tuple[list[RowChange], dict[str, Any]]:
    """Interleaved valid histories of ``tables`` (keyed: inserts, updates with key moves and UNCHANGED,
    deletes, delete-then-insert of one key, truncates; keyless: inserts and deletes) and their final state."""
    model: dict[str, dict[int, tuple[Any, ...]]] = {t.name.table: {} for t in tables}
    out: list[RowChange] = []
    for _ in range(n):
        s = rng.choice(tables)
        m = model[s.name.table]
        r = rng.random()
        free = [k for k in range(30) if k not in m]
        if not s.has_key:
            if r < 0.7 or not m:
                k = rng.randrange(10**6)
                m[k] = (k, f"h{k}", rng.randrange(9))
                out.append(ins(s, *m[k]))
            else:
                k = rng.choice(sorted(m))
                out.append(dele(s, k, name=m[k][1], score=m[k][2]))
                del m[k]
            continue
        if (r < 0.35 or not m) and free:
            k = rng.choice(free)
            m[k] = (k, f"n{rng.randrange(1000)}", rng.randrange(100))
            out.append(ins(s, *m[k]))
        elif r < 0.7:
            k = rng.choice(sorted(m))
            old = m.pop(k)
            new_k = rng.choice(free) if free and rng.random() < 0.25 else k
            name: Any = UNCHANGED if rng.random() < 0.4 else f"u{rng.randrange(1000)}"
            score = rng.randrange(100)
            m[new_k] = (new_k, old[1] if name is UNCHANGED else name, score)
            out.append(upd(s, new_k, name, score, old_id=k if new_k != k else None))
        elif r < 0.85:
            k = rng.choice(sorted(m))
            del m[k]
            out.append(dele(s, k))
            if rng.random() < 0.5:  # delete-then-insert of the same key
                m[k] = (k, f"r{rng.randrange(1000)}", rng.randrange(100))
                out.append(ins(s, *m[k]))
        elif r < 0.97:
            k = rng.choice(sorted(m))
            m[k] = (k, f"v{rng.randrange(1000)}", rng.randrange(100))
            out.append(upd(s, *m[k]))
        else:
            m.clear()
            out.append(trunc(s))
    return out, {name: sorted(rows.values()) for name, rows in model.items()}


@pytest.mark.parametrize("seed", range(8))
def test_interleaved_histories_end_like_sequential_application(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    tables = [table("a"), table("b"), table("c"), KEYLESS]
    changes, model = random_history(rng, tables, 600)
    grouped = tmp_path / "grouped.db"
    one_by_one = tmp_path / "one_by_one.db"
    sink = SQLSink(f"sqlite:///{grouped}", SinkConfig(batch_rows=rng.choice([1, 2, 5, 50, 1000]),
                                                       txn_rows=rng.choice([3, 40, 20000])))
    seq = SQLSink(f"sqlite:///{one_by_one}", SinkConfig(batch_rows=1))
    try:
        i = 0
        while i < len(changes):  # calls of random size, each mixing the tables
            j = i + rng.randrange(1, 120)
            sink.write(changes[i:j])
            i = j
        for ch in changes:
            seq.write([ch])
        for t in tables:
            name = t.name.table
            assert read(grouped, name) == model[name] == read(one_by_one, name)
        start = rng.randrange(len(changes))  # a replay from an earlier checkpoint converges (keyed tables)
        sink.write(changes[start:])
        for t in tables[:3]:
            assert read(grouped, t.name.table) == model[t.name.table]
    finally:
        sink.close()
        seq.close()


def test_a_key_move_between_other_tables_changes_keeps_the_unsent_column(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{db}")
    try:
        sink.write([ins(A, 1, "keep", 1), ins(B, 1)])
        sink.write([ins(B, 2), upd(A, 1, UNCHANGED, 2), ins(B, 3), upd(A, 5, UNCHANGED, 3, old_id=1), ins(A, 1, "new", 4),
                    dele(B, 1)])
        assert read(db, "a") == [(1, "new", 4), (5, "keep", 3)]
        assert read(db, "b") == [(2, "x", 0), (3, "x", 0)]
    finally:
        sink.close()


def test_a_failed_multi_table_write_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{db}")
    try:
        sink.write([ins(A, 1), ins(B, 1)])
        bad = RowChange(OpType.INSERT, B, 1, values={"id": None, "name": "n", "score": 1})
        with pytest.raises(SinkError, match="table b"):
            sink.write([ins(A, 2), bad, ins(A, 3), ins(C, 1)])
        assert read(db, "a") == [(1, "x", 0)] and read(db, "b") == [(1, "x", 0)]
    finally:
        sink.close()


# ---- connections ------------------------------------------------------------------------------------
def test_pymysql_connections_share_one_default_tls_context() -> None:
    from sinks.sql.target.connection import pymysql_connection_class

    cls = pymysql_connection_class()
    a = cls(host="127.0.0.1", port=1, defer_connect=True)
    b = cls(host="127.0.0.1", port=1, defer_connect=True)
    assert a.ssl and not a._ssl_required  # still opportunistic TLS, as PyMySQL's default
    assert a.ctx is b.ctx
    explicit = cls(host="127.0.0.1", port=1, defer_connect=True, ssl_verify_cert=True)
    assert explicit._ssl_required and explicit.ctx is not a.ctx


@pytest.mark.parametrize("dialect", ["sqlite", "mysql", "postgresql"])
def test_a_truncate_of_several_tables_stays_one_statement_across_a_new_schema_version(dialect: str) -> None:
    """pgoutput sends the Relation messages again before a TRUNCATE: the tables' new schema versions (same
    columns) must not end the window between the TRUNCATEs of one statement, nor apply the pending rows
    the TRUNCATE drops."""
    from dataclasses import replace

    a2, b2 = replace(A, version=2), replace(B, version=2)
    changes = [ins(B, 7), RowChange(OpType.TRUNCATE, a2, 1), RowChange(OpType.TRUNCATE, b2, 1), ins(A, 1)]
    ops = [(target_of(sql), sql.split()[0]) for _, sql, _ in send(dialect, changes)]
    if dialect == "postgresql":
        assert ops == [("a", "TRUNCATE"), ("a", "INSERT")]
        (_, sql, _), _ = send(dialect, changes)
        assert sql == 'TRUNCATE "public"."a", "public"."b"'
    else:
        assert sorted(ops[:2]) == [("a", "DELETE"), ("b", "DELETE")] and ops[2:] == [("a", "INSERT")]
