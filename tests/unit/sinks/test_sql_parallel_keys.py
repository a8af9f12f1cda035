"""The keys of a transaction for parallel apply (sinks.sql.ops.parallel.keys_of): primary and unique key values of
old and new images, and the table-wide keys where rows cannot be told apart safely. No server: the tables are
assumed known."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.dialect.typemap import plan_table
from sinks.sql.ops.parallel import KeyPlan, Txn, keys_of
from sinks.sql.sink import SQLSink
from sinks.sql.target.binding import KnownTable
from tests.sql_sink_fakes import URIS


def _schema(name: str, cols: tuple[str, ...], key: tuple[str, ...], identity: str = "d",
            has_key: bool = True) -> TableSchema:
    columns = tuple(ColumnSchema(c, 0, "int4" if c in ("id", "pid") else "text", nullable=c not in key,
                                 is_key=c in key) for c in cols)
    return TableSchema(TableName("public", name), columns, key, replica_identity=identity, has_key=has_key)


T = _schema("t", ("id", "v"), ("id",))
U_FULL = _schema("u", ("id", "code", "v"), ("id",), "f")
U_DEFAULT = _schema("ud", ("id", "code", "v"), ("id",))
LOG = _schema("log", ("a", "b"), ("a", "b"), "f", has_key=False)
P = _schema("p", ("id", "v"), ("id",))
C = _schema("c", ("id", "pid"), ("id",))


def _sink(dialect: str) -> SQLSink:
    sink = SQLSink(URIS[dialect], SinkConfig(worker_count=4))
    tschema = "public" if dialect == "postgresql" else None
    for s in (T, U_FULL, U_DEFAULT, LOG, P, C):
        planned = plan_table(s, dialect, target_schema=tschema, target_name=s.name.table)
        uniques = [frozenset(planned.key)] if planned.key else []
        if "code" in s.column_names:
            uniques.append(frozenset({"code"}))
        label = f"public.{s.name.table}" if dialect == "postgresql" else s.name.table
        sink.catalog.assume(KnownTable(label, planned.schema, planned.name, planned.columns, uniques,
                                       created=True))
    prefix = "public." if dialect == "postgresql" else ""
    sink.catalog.fk.add(f"{prefix}c", f"{prefix}p", ("pid",), ("id",))
    return sink


def _keys(sink: SQLSink, *changes: RowChange) -> tuple[set[Any], set[str], set[str]]:
    txn = Txn(changes[0].commit_ts, 0.0)
    txn.changes.extend(changes)
    plans = {id(ch.schema): KeyPlan(sink.catalog.bind(ch.schema, None), sink.catalog)  # type: ignore[arg-type]
             for ch in changes}
    truncated: set[str] = set()
    keys, tables = keys_of(txn, plans, sink.dialect == "mysql", truncated)
    return keys, tables, truncated


@pytest.fixture
def pg() -> SQLSink:
    return _sink("postgresql")


def test_primary_key_of_old_and_new_images(pg: SQLSink) -> None:
    ins = RowChange(OpType.INSERT, T, 1, values={"id": 1, "v": "a"})
    ins.row = (1, "a")
    keys, tables, _ = _keys(pg, ins)
    assert keys == {(("public.t", ("id",)), (1,))} and tables == {"public.t"}
    moved = RowChange(OpType.UPDATE, T, 1, values={"id": 2, "v": "b"}, old_values={"id": 3})
    deleted = RowChange(OpType.DELETE, T, 1, old_values={"id": 4})
    keys, _, _ = _keys(pg, moved, deleted)
    assert keys == {(("public.t", ("id",)), (2,)), (("public.t", ("id",)), (3,)), (("public.t", ("id",)), (4,))}


def test_second_unique_key_under_full_identity_is_keyed_by_row(pg: SQLSink) -> None:
    ch = RowChange(OpType.UPDATE, U_FULL, 1, values={"id": 1, "code": "new", "v": "x"},
                   old_values={"id": 1, "code": "old", "v": "y"})
    keys, _, _ = _keys(pg, ch)
    assert keys == {(("public.u", ("id",)), (1,)), (("public.u", ("code",)), ("new",)),
                    (("public.u", ("code",)), ("old",))}


def test_table_wide_keys(pg: SQLSink) -> None:
    # a second unique key while old rows carry only the key: the old code is unknown
    keys, _, _ = _keys(pg, RowChange(OpType.DELETE, U_DEFAULT, 1, old_values={"id": 1}))
    assert keys == {("table", "public.ud")}
    keys, _, _ = _keys(pg, RowChange(OpType.INSERT, LOG, 1, values={"a": 1, "b": "x"}))
    assert keys == {("table", "public.log")}
    # tables linked by a foreign key share one key (one worker)
    kp, _, _ = _keys(pg, RowChange(OpType.INSERT, P, 1, values={"id": 1, "v": "a"}))
    kc, _, _ = _keys(pg, RowChange(OpType.DELETE, C, 1, old_values={"id": 9}))
    assert kp == kc == {("fk", "public.c")}
    # an unsent (TOAST) value in a unique key
    ch = RowChange(OpType.UPDATE, U_FULL, 1, values={"id": 1, "code": UNCHANGED, "v": "x"})
    assert ("table", "public.u") in _keys(pg, ch)[0]
    keys, _, truncated = _keys(pg, RowChange(OpType.TRUNCATE, T, 1))
    assert keys == {("table", "public.t")} and truncated == {"public.t"}


def test_mysql_text_keys_fold_case_and_accents() -> None:
    sink = _sink("mysql")
    a, _, _ = _keys(sink, RowChange(OpType.DELETE, U_FULL, 1, old_values={"id": 1, "code": "Abc ", "v": "x"}))
    b, _, _ = _keys(sink, RowChange(OpType.INSERT, U_FULL, 2, values={"id": 2, "code": "ábc", "v": "y"}))
    assert a & b == {(("u", ("code",)), ("abc",))}
    pg = _sink("postgresql")
    a, _, _ = _keys(pg, RowChange(OpType.DELETE, U_FULL, 1, old_values={"id": 1, "code": "Abc", "v": "x"}))
    b, _, _ = _keys(pg, RowChange(OpType.INSERT, U_FULL, 2, values={"id": 2, "code": "abc", "v": "y"}))
    assert not a & b
