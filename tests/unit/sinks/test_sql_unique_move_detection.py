"""sinks.sql.dialect.unique_moves: when a window may move a second unique key's value between rows (exact under
REPLICA IDENTITY FULL, conservative under DEFAULT), and a deferred key swap inside one transaction."""

from __future__ import annotations

from typing import Any

from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.dialect.unique_moves import deferred_key_swap, moves_unique_value

COLS = (ColumnSchema("id", 0, "int4", nullable=False, is_key=True), ColumnSchema("code", 0, "text"))
FULL = TableSchema(TableName("public", "u"), COLS, ("id",), replica_identity="f")
DEF = TableSchema(TableName("public", "u"), COLS, ("id",))


def upd(s: TableSchema, k: int, code: str, old: tuple[int, str] | None = None) -> RowChange:
    o = {"id": old[0], "code": old[1]} if old is not None else None
    return RowChange(OpType.UPDATE, s, 1, values={"id": k, "code": code}, old_values=o)


def dele(s: TableSchema, k: int, code: str) -> RowChange:
    return RowChange(OpType.DELETE, s, 1, old_values={"id": k, "code": code} if s is FULL else {"id": k})


def ins(s: TableSchema, k: int, code: str) -> RowChange:
    return RowChange(OpType.INSERT, s, 1, values={"id": k, "code": code})


def full(*events: RowChange, fold: bool = False, rows: list[tuple[Any, ...]] | None = None) -> bool:
    return moves_unique_value(("id",), (("code",),), True, ("id", "code") if rows else None, rows or [], (),
                              list(events), 2, fold, False)


def default(*events: RowChange, rows: list[tuple[Any, ...]] | None = None, updates: tuple[int, ...] = ()) -> bool:
    return moves_unique_value(("id",), (("code",),), False, ("id", "code") if rows else None, rows or [], updates,
                              list(events), 2, False, False)


def test_full_identity_is_exact() -> None:
    assert full(upd(FULL, 1, "c9", (1, "c1")), ins(FULL, 2, "c1"))  # freed by an update, taken by an insert
    assert full(upd(FULL, 1, "t", (1, "c1")), upd(FULL, 2, "c1", (2, "c2")), upd(FULL, 1, "c2", (1, "t")))  # swap
    assert full(upd(FULL, 1, "c9", (1, "c1")), rows=[(2, "c1")])  # (rows before the events)
    assert not full(upd(FULL, 1, "c9", (1, "c1")), ins(FULL, 2, "c5"))  # nothing freed is taken
    assert not full(dele(FULL, 1, "c1"), ins(FULL, 2, "c1"))  # freed by a delete: deletes run first
    assert not full(upd(FULL, 1, "c9", (1, "c1")), upd(FULL, 1, "c1", (1, "c9")))  # one row only
    assert full(upd(FULL, 1, "X", (1, "a")), ins(FULL, 2, "a"), fold=True)
    assert full(upd(FULL, 1, "c9", (1, "A")), ins(FULL, 2, "a"), fold=True)  # one value for a folding collation
    assert not full(upd(FULL, 1, "c9", (1, "A")), ins(FULL, 2, "a"))


def test_default_identity_is_conservative() -> None:
    assert default(upd(DEF, 1, "c9"), ins(DEF, 2, "c1"))
    assert default(dele(DEF, 3, ""), rows=[(1, "c9"), (2, "c1")], updates=(0,))
    assert not default(dele(DEF, 1, ""), ins(DEF, 2, "c1"))  # no update: only deletes free values
    assert not default(upd(DEF, 1, "c9"), upd(DEF, 1, "c1"), dele(DEF, 2, ""))  # one row with a new image
    assert not default(ins(DEF, 1, "a"), ins(DEF, 2, "b"))


def test_a_key_change_frees_its_values_first_unless_the_table_is_a_parent() -> None:
    # UPDATE u SET id = 3 - id (deferred key): codes stay with their rows; deletes of the old keys run first
    swap = (upd(FULL, 2, "c1", (1, "c1")), upd(FULL, 1, "c2", (2, "c2")))
    assert not full(*swap)
    assert moves_unique_value(("id",), (("code",),), True, None, [], (), list(swap), 2, False, True)
    assert not default(upd(DEF, 3, "c1", (1, "x")), ins(DEF, 1, "c9"))
    assert default(upd(DEF, 3, "c1", (3, "x")), ins(DEF, 1, "c9"))


def test_deferred_key_swap_in_one_transaction() -> None:
    # UPDATE u SET id = 3 - id (deferred key): (1->2), (2->1)
    assert deferred_key_swap(("id",), 2, [upd(FULL, 2, "a", (1, "a")), upd(FULL, 1, "b", (2, "b"))])
    # through a temporary key (immediate): (1->9), (2->1), (9->2)
    assert not deferred_key_swap(("id",), 2, [upd(FULL, 9, "a", (1, "a")), upd(FULL, 1, "b", (2, "b")),
                                              upd(FULL, 2, "a", (9, "a"))])
