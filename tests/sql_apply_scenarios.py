"""Apply-order scenarios shared by the SQLite unit tests and the MariaDB/PostgreSQL integration tests: each
is a table state before, one write of row changes forming one upstream transaction, and the rows after.

The changes are what pgoutput sends for the upstream statements named in each scenario (REPLICA IDENTITY
FULL tables carry whole old rows; DEFAULT ones the old key only when it changed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema


def _cols(has_key: bool) -> tuple[ColumnSchema, ...]:
    return (ColumnSchema("id", 0, "int4", nullable=not has_key, is_key=has_key),
            ColumnSchema("v", 0, "text"), ColumnSchema("big", 0, "text"))


def schema(name: str, identity: str = "d", has_key: bool = True) -> TableSchema:
    cols = _cols(has_key)
    key = ("id",) if has_key else tuple(c.name for c in cols)
    return TableSchema(TableName("public", name), cols, key, replica_identity=identity, has_key=has_key)


FULL = schema("ap_full", "f")  # DEFERRABLE key upstream: statement-level swaps
DEF = schema("ap_def")  # immediate key, replica identity DEFAULT
NOKEY = schema("ap_nokey", "f", has_key=False)


def row(i: int, v: str, big: str = "B") -> dict[str, Any]:
    return {"id": i, "v": v, "big": big}


def ins(s: TableSchema, r: dict[str, Any]) -> RowChange:
    return RowChange(OpType.INSERT, s, 7, values=dict(r))


def upd(s: TableSchema, new: dict[str, Any], old: dict[str, Any] | None = None) -> RowChange:
    if s.replica_identity == "d" and old is not None:
        old = {"id": old["id"]} if old["id"] != new["id"] else None
    return RowChange(OpType.UPDATE, s, 7, values=dict(new), old_values=dict(old) if old else None)


def dele(s: TableSchema, old: dict[str, Any]) -> RowChange:
    if s.replica_identity == "d":
        old = {"id": old["id"]}
    return RowChange(OpType.DELETE, s, 7, old_values=dict(old))


@dataclass
class Scenario:
    name: str
    table: TableSchema
    before: list[dict[str, Any]]
    changes: list[RowChange]
    after: list[tuple[Any, ...]]


def _swap() -> Scenario:  # UPDATE ap_full SET id = 3 - id (deferred key): (1->2), (2->1)
    a, b = row(1, "a"), row(2, "b")
    return Scenario("deferred swap", FULL, [a, b],
                    [upd(FULL, row(2, "a"), a), upd(FULL, row(1, "b"), b)],
                    [(1, "b", "B"), (2, "a", "B")])


def _rotation() -> Scenario:  # UPDATE ap_full SET id = id % 3 + 1: (1->2), (2->3), (3->1)
    a, b, c = row(1, "a"), row(2, "b"), row(3, "c")
    return Scenario("deferred 3-key rotation", FULL, [a, b, c],
                    [upd(FULL, row(2, "a"), a), upd(FULL, row(3, "b"), b), upd(FULL, row(1, "c"), c)],
                    [(1, "c", "B"), (2, "a", "B"), (3, "b", "B")])


def _rotation_via_temp() -> Scenario:  # four statements through a temporary key 9, immediate key
    a, b, c = row(1, "a"), row(2, "b"), row(3, "c")
    return Scenario("3-key rotation through a temporary key", DEF, [a, b, c],
                    [upd(DEF, row(9, "a"), a), upd(DEF, row(1, "c"), c), upd(DEF, row(3, "b"), b),
                     upd(DEF, row(2, "a"), row(9, "a"))],
                    [(1, "c", "B"), (2, "a", "B"), (3, "b", "B")])


def _swap_with_unchanged() -> Scenario:  # as above with an unchanged TOAST column (DEFAULT identity)
    a, b = row(1, "a", "BIG-A"), row(2, "b", "BIG-B")
    return Scenario("swap through a temporary key with unchanged columns", DEF, [a, b],
                    [upd(DEF, {"id": 9, "v": "a", "big": UNCHANGED}, a),
                     upd(DEF, {"id": 1, "v": "b", "big": UNCHANGED}, b),
                     upd(DEF, {"id": 2, "v": "a2", "big": UNCHANGED}, row(9, "a"))],
                    [(1, "b", "BIG-B"), (2, "a2", "BIG-A")])


def _mixed() -> Scenario:  # delete 2; move 1 -> 2; insert 1; insert 3; move 3 -> 4; delete 5; insert 5
    r1, r2, r5 = row(1, "one"), row(2, "two"), row(5, "five")
    return Scenario("key changes with inserts and deletes of the same keys", DEF, [r1, r2, r5],
                    [dele(DEF, r2), upd(DEF, row(2, "one-moved"), r1), ins(DEF, row(1, "new-one")),
                     ins(DEF, row(3, "three")), upd(DEF, row(4, "three-moved"), row(3, "three")),
                     dele(DEF, r5), ins(DEF, row(5, "five-again"))],
                    [(1, "new-one", "B"), (2, "one-moved", "B"), (4, "three-moved", "B"), (5, "five-again", "B")])


def _mixed_full() -> Scenario:  # the same with FULL identity, plus an insert that reuses a moved-away key
    r1, r2 = row(1, "one"), row(2, "two")
    return Scenario("FULL identity: swap then delete and re-insert", FULL, [r1, r2],
                    [upd(FULL, row(2, "one"), r1), upd(FULL, row(1, "two"), r2), dele(FULL, row(2, "one")),
                     ins(FULL, row(2, "new-two")), upd(FULL, row(1, "two-b"), row(1, "two"))],
                    [(1, "two-b", "B"), (2, "new-two", "B")])


def _keyless() -> Scenario:  # duplicates; update of one of two equal rows; insert + delete; delete + insert
    x, y = {"id": 1, "v": "x", "big": "B"}, {"id": 2, "v": "y", "big": "B"}
    z = {"id": 3, "v": "z", "big": "B"}
    return Scenario("table without a key", NOKEY, [x, x, y],
                    [upd(NOKEY, {"id": 1, "v": "x2", "big": UNCHANGED}, x), ins(NOKEY, z), dele(NOKEY, z),
                     dele(NOKEY, y), ins(NOKEY, y), ins(NOKEY, x), dele(NOKEY, x)],
                    [(1, "x", "B"), (1, "x2", "B"), (2, "y", "B")])


SCENARIOS = [_swap(), _rotation(), _rotation_via_temp(), _swap_with_unchanged(), _mixed(), _mixed_full(),
             _keyless()]
