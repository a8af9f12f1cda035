"""``CopyTargets.restart_copy_target``: a table whose copy starts over under a new definition loses what the earlier runs
wrote of it. SQL: the target table is dropped (SQLite file here; the PostgreSQL path with its chunk markers is in
tests/integration/test_snapshot_schema_change.py), so the next write creates it from the new schema; sinks without
tables write a TRUNCATE of it and flush."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from cdc.errors import SinkError
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.ts import Watermark
from sinks.base import BufferedSink
from sinks.copy_roles import CopyTargets
from sinks.sql.sink import SQLSink
from sinks.testing import MemorySink

pytestmark = pytest.mark.unit

T = TableName("public", "t")
OLD = TableSchema(T, (ColumnSchema("id", 23, "int4", type_name="integer", nullable=False, is_key=True),
                      ColumnSchema("v", 25, "text", type_name="text")), ("id",))
NEW = TableSchema(T, (*OLD.columns, ColumnSchema("c", 23, "int4", type_name="integer")), ("id",))


def test_the_sql_target_is_dropped_and_created_again_from_the_new_definition(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    sink = SQLSink(f"sqlite:///{path}")
    try:
        sink.write([RowChange(OpType.INSERT, OLD, 1, values={"id": 1, "v": "a"})])
        sink.restart_copy_target(NEW, "cf", 0, 200, 2.0)
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone() == (0,)
        sink.restart_copy_target(NEW, "cf", 0, 200, 2.0)  # idempotent: a run that died after it does it again
        sink.write([RowChange(OpType.INSERT, NEW, 3, values={"id": 2, "v": "b", "c": 5})])  # same sink: no stale cache
    finally:
        sink.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, v, c FROM t").fetchall() == [(2, "b", 5)]


class _LogSink(MemorySink, BufferedSink, CopyTargets):
    """A buffering sink without tables (Kafka, files) on the write twin (``sinks.testing``): one log of what it got."""

    def __init__(self) -> None:
        super().__init__()
        self.flush_interval = 0.0
        self.log: list[str] = []

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        got = list(changes)
        self.log += [f"{c.op.name} {c.schema.name} at {c.commit_ts}" for c in got]
        return len(got)

    def flush(self, fence: Callable[[], None] | None = None) -> None:
        self.log.append("flush")

    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        assert at is not None and [s.name for s in schemas] == list(tables)
        self.log += [f"TRUNCATE {t} at {at.ts}" for t in tables]


def test_a_sink_without_tables_writes_the_resyncs_truncate_at_the_new_snapshot_and_flushes() -> None:
    sink = _LogSink()
    sink.restart_copy_target(NEW, "cf", 0, 200, 2.0)
    assert sink.log == ["TRUNCATE public.t at 200", "flush"]


def test_a_sink_that_knew_the_old_table_reads_it_again_when_a_copy_created_it_anew(tmp_path: Path) -> None:
    """The span's sink wrote the table before a table copy dropped it and the job created it with the new
    definition: its next write of the new definition reads the table again instead of failing on a stale picture;
    a table that really lacks the column still fails, naming it."""
    path = tmp_path / "t.db"
    span_sink, job_sink = SQLSink(f"sqlite:///{path}"), SQLSink(f"sqlite:///{path}")
    try:
        span_sink.write([RowChange(OpType.INSERT, OLD, 1, values={"id": 1, "v": "a"})])
        job_sink.restart_copy_target(NEW, "cf", 0, 200, 2.0)
        job_sink.write([RowChange(OpType.INSERT, NEW, 200, values={"id": 1, "v": "a", "c": 7})])
        span_sink.write([RowChange(OpType.INSERT, NEW, 300, values={"id": 2, "v": "b", "c": 8})])
        other = TableSchema(TableName("public", "t"), (*NEW.columns, ColumnSchema("d", 23, "int4")), ("id",))
        with pytest.raises(SinkError, match="'d'"):
            span_sink.write([RowChange(OpType.INSERT, other, 400, values={"id": 3, "v": "c", "c": 9, "d": 1})])
    finally:
        span_sink.close()
        job_sink.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT id, v, c FROM t ORDER BY id").fetchall() == [(1, "a", 7), (2, "b", 8)]
