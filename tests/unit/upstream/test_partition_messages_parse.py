"""partition_messages.parse: repair messages become the exact pgoutput changes pgoutput would send."""

from __future__ import annotations

import json

import pytest

from cdc.errors import DecodeError
from cdc.events import ColumnSchema, TableName, TableSchema
from upstream.postgres import partition_messages, pgoutput

pytestmark = pytest.mark.unit

COLS = [["id", "23", -1, True], ["k", "1082", -1, True], ["v", "25", -1, False]]


def message(op: str, rows: list[list[str | None]], replident: str = "d", cols: list = COLS) -> bytes:
    return json.dumps({"v": 1, "op": op, "reason": "truncate", "root_oid": "16397", "root": ["public", "m"],
                       "replident": replident, "leaf": "public.m1", "columns": cols, "rows": rows}).encode()


def test_upsert_rows_are_inserts_of_the_root_with_every_column() -> None:
    msg = partition_messages.parse(message("upsert", [["1", "2024-01-05", "a"], ["2", "2024-01-06", None]]))
    assert (msg.op, msg.root, msg.root_oid, msg.leaf) == ("upsert", TableName("public", "m"), 16397, "public.m1")
    assert msg.relation is not None and msg.relation.relid == 16397
    assert [(c.name, c.type_oid, c.is_key) for c in msg.relation.columns] == [
        ("id", 23, True), ("k", 1082, True), ("v", 25, False)]
    parsed = [pgoutput.parse_change(c) for c in msg.changes]
    assert [(p.kind, p.relid, p.new) for p in parsed] == [
        ("I", 16397, ["1", "2024-01-05", "a"]), ("I", 16397, ["2", "2024-01-06", None])]
    # exactly the bytes the puller's fast path accepts
    assert pgoutput.plain_change_relid(msg.changes[0]) == 16397
    assert pgoutput.insert_values(msg.changes[0], 0) == (16397, ["1", "2024-01-05", "a"])


def test_delete_rows_carry_the_key_in_a_K_tuple_and_the_whole_row_for_full_identity() -> None:
    msg = partition_messages.parse(message("delete", [["1", "2024-01-05"]]))
    p = pgoutput.parse_change(msg.changes[0])
    assert (p.kind, p.old_kind, p.old, p.new) == ("D", "K", ["1", "2024-01-05", None], None)
    full = [["k", "23", -1, True], ["v", "25", -1, True]]
    msg = partition_messages.parse(message("delete", [["1", None], ["1", "é"]], replident="f", cols=full))
    assert [(p.old_kind, p.old) for p in map(pgoutput.parse_change, msg.changes)] == [
        ("O", ["1", None]), ("O", ["1", "é"])]


def test_lost_is_a_divergence_warning_naming_root_and_partition() -> None:
    msg = partition_messages.parse(json.dumps({"v": 1, "op": "lost", "root_oid": "5", "root": ["s", "r"],
                                               "leaf": "s.p", "reason": "dropped without being named"}).encode())
    assert msg.changes == () and msg.relation is None
    w = msg.warning(12.0)
    assert (w.code, w.table, w.severity, w.first_time) == ("CDC:WarnPartitionRowsLost", "s.r", "divergence", 12.0)
    assert "s.p" in w.message and "dropped without being named" in w.message


def test_same_columns_compares_names_types_and_order() -> None:
    rel = partition_messages.parse(message("upsert", [])).relation
    assert rel is not None
    cols = (ColumnSchema("id", 23, "int4", is_key=True), ColumnSchema("k", 1082, "date", is_key=True),
            ColumnSchema("v", 25, "text"))
    schema = TableSchema(TableName("public", "m"), cols, ("id", "k"))
    assert partition_messages.same_columns(rel, schema)
    assert not partition_messages.same_columns(rel, TableSchema(schema.name, cols[:2], ("id", "k")))
    retyped = (cols[0], cols[1], ColumnSchema("v", 1043, "varchar"))
    assert not partition_messages.same_columns(rel, TableSchema(schema.name, retyped, ("id", "k")))


@pytest.mark.parametrize("bad", [
    b"not json", b"{}", b'{"v": 1, "op": "nope"}',
    message("upsert", [["1", "2024-01-05"]]),  # too few values
    message("delete", [["1", "2024-01-05", "extra"]]),  # deletes carry the key only
    message("upsert", [[1, "2024-01-05", "a"]]),  # values are text
])
def test_malformed_messages_raise_decode_error(bad: bytes) -> None:
    with pytest.raises(DecodeError):
        partition_messages.parse(bad)
