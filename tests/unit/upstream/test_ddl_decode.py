"""ddl_decode.diff / decode: the change list of a DDL from the table's schema before and after it."""

from __future__ import annotations

import json

import pytest

from cdc.events import ColumnSchema, DdlKind, TableName, TableSchema
from upstream.postgres import ddl_decode

pytestmark = pytest.mark.unit

T = TableName("public", "t")
ID = ColumnSchema("id", 23, "int4", nullable=False, is_key=True)
A = ColumnSchema("a", 25, "text")
B = ColumnSchema("b", 23, "int4")


def schema(*cols: ColumnSchema, name: TableName = T, key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(name, cols, key, relation_id=5, has_key=bool(key))


def kinds(before: TableSchema, after: TableSchema, column_command: bool = False) -> list[tuple[str, str | None]]:
    return [(c.kind.value, c.column or c.new_name) for c in ddl_decode.diff(before, after, column_command=column_command)]


def test_add_drop_rename_retype_and_key() -> None:
    assert kinds(schema(ID, A), schema(ID, A, B)) == [("add column", "b")]
    assert kinds(schema(ID, A, B), schema(ID, B)) == [("drop column", "a")]
    renamed = ColumnSchema("a2", 25, "text")
    assert kinds(schema(ID, A), schema(ID, renamed), column_command=True) == [("rename column", "a")]
    assert kinds(schema(ID, A), schema(ID, renamed)) == [("drop column", "a"), ("add column", "a2")]
    wider = ColumnSchema("b", 20, "int8")
    assert kinds(schema(ID, B), schema(ID, wider)) == [("alter column type", "b")]
    not_null = ColumnSchema("b", 23, "int4", nullable=False)
    assert kinds(schema(ID, B), schema(ID, not_null)) == [("set not null", "b")]
    assert kinds(schema(ID, B), schema(ID, B, key=())) == [("drop primary key", None)]
    assert kinds(schema(ID, B), schema(ID, B, name=TableName("s", "t2"))) == [("rename table", "s.t2")]
    assert kinds(schema(ID, B), schema(ID, B)) == []


def test_decode_needs_the_schema_before_except_for_create() -> None:
    doc = {"v": 1, "tag": "ALTER TABLE", "query": "ALTER TABLE t ADD b int", "table": {
        "oid": "5", "schema": "public", "table": "t", "relkind": "r", "persistence": "p", "is_partition": False,
        "replident": "d", "columns": [["id", "23", -1, True, "integer", None], ["b", "23", -1, False, "integer", "7"]],
        "types": [["23", "int4", "b", "N", "0", "0", -1, "11", None]], "pk": ["id"], "pk_immediate": True,
        "ident": []}}
    content = json.dumps(doc).encode()
    with pytest.raises(ddl_decode.UnknownBefore):
        ddl_decode.decode(content, None, commit_ts=10, commit_time=1.0, seq=0)
    (ev,) = ddl_decode.decode(content, schema(ID), commit_ts=10, commit_time=1.0, seq=2)
    assert (ev.commit_ts, ev.seq, ev.kinds) == (10, 2, (DdlKind.ADD_COLUMN,))
    assert ev.after is not None and ev.after.column("b").default == "7" and ev.after.key == ("id",)
    doc["tag"] = "CREATE TABLE"
    (ev,) = ddl_decode.decode(json.dumps(doc).encode(), None, commit_ts=10, commit_time=1.0, seq=0)
    assert ev.kinds == (DdlKind.CREATE_TABLE,) and ev.before is None
    dropped = {"v": 1, "tag": "DROP TABLE", "query": "DROP TABLE t", "dropped": {"oid": 5, "schema": "public", "table": "t"}}
    (ev,) = ddl_decode.decode(json.dumps(dropped).encode(), schema(ID), commit_ts=11, commit_time=1.0, seq=0)
    assert ev.kinds == (DdlKind.DROP_TABLE,) and ev.after is None
    with pytest.raises(ddl_decode.DecodeError):
        ddl_decode.decode(b"{not json", schema(ID), commit_ts=1, commit_time=0.0, seq=0)


def test_index_messages_become_index_changes_only_when_a_sink_can_replay_them() -> None:
    from cdc.events import DdlKind, IndexSpec

    plain = {"name": "ix", "unique": True, "primary": False, "partial": False, "columns": ["a", "b"]}
    assert ddl_decode.index_change({"index": plain}) == ddl_decode.DdlChange(
        DdlKind.CREATE_INDEX, index=IndexSpec("ix", ("a", "b"), True))
    dropped = ddl_decode.index_change({"index": plain, "index_dropped": True})
    assert dropped is not None and dropped.kind is DdlKind.DROP_INDEX
    for odd in ({"partial": True}, {"primary": True}, {"columns": None}):
        assert ddl_decode.index_change({"index": {**plain, **odd}}) is None, odd
    assert ddl_decode.index_change({}) is None


def _added(columns: list[list[object]], types: list[list[object]] | None = None) -> bytes:
    return json.dumps({"v": 1, "tag": "ALTER TABLE", "query": "ALTER TABLE t ADD ...", "table": {
        "oid": "5", "schema": "public", "table": "t", "relkind": "r", "persistence": "p", "is_partition": False,
        "replident": "d", "columns": [["id", "23", -1, True, "integer", None, None], *columns],
        "types": [["23", "int4", "b", "N", "0", "0", -1, "11", None], ["1184", "timestamptz", "b", "D", "0", "0", -1,
                                                                         "11", None], *(types or [])],
        "pk": ["id"], "pk_immediate": True, "ident": []}}).encode()


def test_an_added_column_carries_what_the_existing_rows_hold_upstream() -> None:
    import datetime

    from cdc.events import ColumnFill

    content = _added([
        ["at", "1184", -1, True, "timestamp with time zone", "now()", "2026-11-28 08:06:35.839083+00"],  # STABLE
        ["v", "1184", -1, False, "timestamp with time zone", "clock_timestamp()", None],  # VOLATILE: rewritten
        ["n", "23", -1, False, "integer", None, None],  # no default: NULL
        ["d", "900", -1, False, "dom", None, None],  # a domain's default may apply: read back
        ["i", "23", -1, True, "integer", None, None, True]],  # an identity column: a sequence's values, read back
        [["900", "dom", "d", "N", "0", "23", -1, "11", "integer"]])
    (ev,) = ddl_decode.decode(content, schema(ID), commit_ts=10, commit_time=1.0, seq=0)
    at = datetime.datetime(2026, 11, 28, 8, 6, 35, 839083, tzinfo=datetime.UTC)
    assert ev.fills == (ColumnFill("at", at), ColumnFill("v", per_row=True), ColumnFill("n", None),
                        ColumnFill("d", per_row=True), ColumnFill("i", per_row=True))
    assert ev.fill("at") == ColumnFill("at", at) and ev.fill("id") is None
    # a message of a trigger installed before the missing value was sent: a default means "read it back"
    (old,) = ddl_decode.decode(_added([["b", "23", -1, False, "integer", "7"]]), schema(ID), commit_ts=10,
                               commit_time=1.0, seq=0)
    assert old.fills == (ColumnFill("b", per_row=True),)
    # only added columns get a fill; a missing value that is not of the column's type is a malformed message
    (same,) = ddl_decode.decode(_added([["b", "23", -1, True, "integer", "7", "7"]]),
                                schema(ID, ColumnSchema("b", 23, "int4")), commit_ts=10, commit_time=1.0, seq=0)
    assert same.kinds == (DdlKind.SET_NOT_NULL,) and same.fills == ()
    with pytest.raises(ddl_decode.DecodeError, match="not a valid integer"):
        ddl_decode.decode(_added([["b", "23", -1, False, "integer", "7", "x"]]), schema(ID), commit_ts=10,
                          commit_time=1.0, seq=0)


def test_a_column_seen_only_in_the_stream_is_read_back_from_the_upstream() -> None:
    from cdc.events import ColumnFill

    (ev,) = ddl_decode.from_relations(schema(ID, A), schema(ID, A, B), commit_ts=10, commit_time=1.0, seq=0)
    assert ev.kinds == (DdlKind.ADD_COLUMN,) and ev.fills == (ColumnFill("b", per_row=True),)
    (dropped,) = ddl_decode.from_relations(schema(ID, A, B), schema(ID, A), commit_ts=10, commit_time=1.0, seq=0)
    assert dropped.fills == ()
