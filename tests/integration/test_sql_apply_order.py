"""Apply order against real MariaDB and PostgreSQL targets: key swaps and rotations, key changes mixed with
inserts and deletes of the same keys, tables without a key (tests/sql_apply_scenarios.py), foreign keys
between target tables, multi-table TRUNCATE, ON UPDATE CASCADE, and rows missing downstream. Every test
ends comparing the target's rows with the expected rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import OpType, RowChange
from sinks.factory import open_sink
from sinks.sql.sink import SQLSink
from tests.sql_apply_scenarios import SCENARIOS, Scenario
from tests.sql_targets import SqlTarget, make_target

pytestmark = pytest.mark.integration


class Target(SqlTarget):
    def sink(self, batch_rows: int = 1000, txn_rows: int = 20000) -> SQLSink:
        s = open_sink(self.uri, SinkConfig(batch_rows=batch_rows, txn_rows=txn_rows))
        assert isinstance(s, SQLSink)
        return s

    def rows(self, name: str, cols: str = "*") -> list[tuple[Any, ...]]:
        return sorted(self.execute(f"SELECT {cols} FROM {self.qualified(name)}"))


@pytest.fixture(params=["mariadb", "postgresql", "sqlite"])
def target(request: pytest.FixtureRequest, tmp_path: Any) -> Target:
    return make_target(Target, request, tmp_path)


@pytest.fixture
def sink(target: Target) -> Iterator[SQLSink]:
    s = target.sink()
    s.check()
    yield s
    s.close()


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_scenario_in_one_write(target: Target, sink: SQLSink, sc: Scenario) -> None:
    sink.write([RowChange(OpType.INSERT, sc.table, 1, values=dict(r)) for r in sc.before])
    sink.write(sc.changes)
    assert target.rows(sc.table.name.table, "id, v, big") == sc.after
    assert sink.take_warnings() == []


# ---- foreign keys between target tables (immediate) ------------------------------------------------
def _schema(name: str, *cols: str) -> Any:
    from cdc.events import ColumnSchema, TableName, TableSchema

    columns = tuple(ColumnSchema(c, 0, "int4" if c in ("id", "pid") else "text", nullable=c != "id",
                                 is_key=c == "id") for c in cols)
    return TableSchema(TableName("public", name), columns, ("id",))


P = _schema("fk_parent", "id", "v")
C = _schema("fk_child", "id", "pid", "v")


def rc(op: OpType, s: Any, ts: int = 5, values: dict[str, Any] | None = None,
       old: dict[str, Any] | None = None, **extra: Any) -> RowChange:
    return RowChange(op, s, ts, values=values, old_values=old, extra=extra)


@pytest.fixture
def fk_target(target: Target) -> Target:
    target.execute("CREATE TABLE fk_parent (id int PRIMARY KEY, v varchar(40))")
    target.execute("CREATE TABLE fk_child (id int PRIMARY KEY, pid int, v varchar(40), "
                   "FOREIGN KEY (pid) REFERENCES fk_parent (id) ON UPDATE CASCADE)")
    target.execute("INSERT INTO fk_parent VALUES (1, 'p1'), (5, 'p5')")
    target.execute("INSERT INTO fk_child VALUES (1, 1, 'c1'), (9, 5, 'c9')")
    return target


def test_parent_and_child_inserts_and_deletes_in_one_transaction(fk_target: Target, sink: SQLSink) -> None:
    # upstream order: a new parent and its child, the old child and then its parent go
    sink.write([rc(OpType.INSERT, P, values={"id": 2, "v": "p2"}),
                rc(OpType.INSERT, C, values={"id": 2, "pid": 2, "v": "c2"}),
                rc(OpType.DELETE, C, old={"id": 1}),
                rc(OpType.DELETE, P, old={"id": 1}),
                rc(OpType.INSERT, C, values={"id": 3, "pid": 2, "v": "c3"}),
                rc(OpType.UPDATE, C, values={"id": 9, "pid": 2, "v": "c9b"})])
    assert fk_target.rows("fk_parent") == [(2, "p2"), (5, "p5")]
    assert fk_target.rows("fk_child") == [(2, 2, "c2"), (3, 2, "c3"), (9, 2, "c9b")]


def test_a_child_moved_to_another_parent_before_its_parent_is_deleted(fk_target: Target, sink: SQLSink) -> None:
    sink.write([rc(OpType.UPDATE, C, values={"id": 9, "pid": 1, "v": "c9"}),
                rc(OpType.DELETE, P, old={"id": 5})])
    assert fk_target.rows("fk_parent") == [(1, "p1")]
    assert fk_target.rows("fk_child") == [(1, 1, "c1"), (9, 1, "c9")]


def test_a_truncate_of_related_tables_is_one_statement(fk_target: Target, sink: SQLSink) -> None:
    sink.write([rc(OpType.TRUNCATE, P, truncate_options=0), rc(OpType.TRUNCATE, C, truncate_options=0),
                rc(OpType.INSERT, P, values={"id": 7, "v": "p7"}),
                rc(OpType.INSERT, C, values={"id": 7, "pid": 7, "v": "c7"})])
    assert fk_target.rows("fk_parent") == [(7, "p7")]
    assert fk_target.rows("fk_child") == [(7, 7, "c7")]


def test_a_parent_key_change_is_an_update_so_on_update_cascade_acts(fk_target: Target, sink: SQLSink) -> None:
    # UPDATE fk_parent SET id = 10 WHERE id = 1: upstream's cascade sends the child's update after it.
    # Delete + insert of the parent would fail here: the child's foreign key has no ON DELETE action.
    sink.write([rc(OpType.UPDATE, P, values={"id": 10, "v": "p1"}, old={"id": 1}),
                rc(OpType.UPDATE, C, values={"id": 1, "pid": 10, "v": "c1"})])
    assert fk_target.rows("fk_parent") == [(5, "p5"), (10, "p1")]
    assert fk_target.rows("fk_child") == [(1, 10, "c1"), (9, 5, "c9")]


def test_a_missing_row_is_reread_through_the_row_source(target: Target, sink: SQLSink) -> None:
    from cdc.events import UNCHANGED

    sink.set_row_source(lambda schema, keys: [{"id": k[0], "v": "from-upstream"} if k[0] == 3 else None
                                              for k in keys])
    sink.write([rc(OpType.INSERT, P, values={"id": 1, "v": "a"})])
    sink.write([rc(OpType.UPDATE, P, values={"id": 3, "v": UNCHANGED}),
                rc(OpType.UPDATE, P, values={"id": 4, "v": UNCHANGED})])
    assert target.rows("fk_parent") == [(1, "a"), (3, "from-upstream")]
    (w,) = sink.take_warnings()
    assert (w.code, w.severity, w.count, w.keys) == ("CDC:WarnMissingRow", "notice", 2, ("3", "4"))
    sink.set_row_source(None)
    sink.write([rc(OpType.UPDATE, P, values={"id": 8, "v": UNCHANGED})])
    assert target.rows("fk_parent") == [(1, "a"), (3, "from-upstream")]
    (w,) = sink.take_warnings()
    assert (w.severity, w.keys) == ("divergence", ("8",))


def test_child_references_moved_to_new_and_away_from_deleted_parents_in_one_window(
        fk_target: Target, sink: SQLSink) -> None:
    # one child moves to a parent inserted in the window (after that insert), another moves away from a
    # parent deleted in the window (before that delete); the foreign key has no ON DELETE action
    sink.write([rc(OpType.INSERT, P, 4, values={"id": 2, "v": "p2"}),
                rc(OpType.UPDATE, C, 5, values={"id": 9, "pid": 1, "v": "c9"}),
                rc(OpType.DELETE, P, 5, old={"id": 5}),
                rc(OpType.UPDATE, C, 6, values={"id": 1, "pid": 2, "v": "c1"}),
                rc(OpType.INSERT, C, 6, values={"id": 3, "pid": 2, "v": "c3"})])
    assert fk_target.rows("fk_parent") == [(1, "p1"), (2, "p2")]
    assert fk_target.rows("fk_child") == [(1, 2, "c1"), (3, 2, "c3"), (9, 1, "c9")]
