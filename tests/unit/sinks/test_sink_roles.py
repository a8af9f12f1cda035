"""The sink contract by role (``sinks.base``, ``sinks.copy_roles``): which sink class takes which role, what the
factory says a scheme supports without opening a sink, and the in-memory twins (``sinks.testing``) keeping their
roles' guarantees."""

from __future__ import annotations

import pytest

from cdc.errors import DdlRejected, SinkError, SinkUnavailable
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from cdc.ts import Watermark
from sinks import base, copy_roles
from sinks.blackhole import BlackholeSink
from sinks.factory import SinkFactory, supports
from sinks.kafka.sink import KafkaSink
from sinks.sql.sink import SQLSink
from sinks.storage.sink import StorageSink
from sinks.testing import (
    MemoryBufferedSink,
    MemoryCheckpointSink,
    MemoryDdlSink,
    MemorySink,
    MemorySinks,
    MemoryWatermarkSink,
)

pytestmark = pytest.mark.unit

ROLES = [base.TxnSink, base.AtomicTxnSink, base.BufferedSink, base.PositionStore, base.DdlSink, base.DdlSettings,
         base.RowSourceUser, base.TableShapes, base.CheckpointSink, base.WatermarkSink, copy_roles.BulkLoad, copy_roles.TextCopy,
         copy_roles.CopyAnnouncer, copy_roles.DeferredKeyCopy, copy_roles.CopyTargets, copy_roles.ExistingRows,
         copy_roles.RowCounts, copy_roles.ResyncRefusal, copy_roles.TablesHad]

EXPECTED = {
    SQLSink: {"TxnSink", "AtomicTxnSink", "PositionStore", "DdlSink", "DdlSettings", "RowSourceUser", "TableShapes",
              "BulkLoad", "TextCopy", "DeferredKeyCopy", "CopyTargets", "ExistingRows", "RowCounts", "TablesHad"},
    KafkaSink: {"TxnSink", "DdlSink", "CheckpointSink", "WatermarkSink", "CopyAnnouncer", "CopyTargets",
                "ResyncRefusal"},
    StorageSink: {"TxnSink", "BufferedSink", "PositionStore", "DdlSink", "CheckpointSink", "BulkLoad", "CopyTargets",
                  "ExistingRows"},
    BlackholeSink: {"TxnSink", "DdlSink"},
}

T = TableName("public", "t")
SCHEMA = TableSchema(T, (ColumnSchema("id", 23, "int4", is_key=True),), ("id",))


def _row(ts: int) -> RowChange:
    return RowChange(OpType.INSERT, SCHEMA, ts, float(ts), values={"id": ts})


def _ddl(ts: int) -> DdlEvent:
    return DdlEvent(ts, float(ts), T, (DdlChange(DdlKind.ADD_COLUMN, "c"),), SCHEMA, SCHEMA, "ALTER TABLE t ADD c int")


@pytest.mark.parametrize("cls", list(EXPECTED))
def test_each_sink_takes_exactly_the_roles_its_target_supports(cls: type) -> None:
    assert {r.__name__ for r in ROLES if issubclass(cls, r)} == EXPECTED[cls]


def test_the_factory_says_what_a_scheme_supports_without_opening_a_sink() -> None:
    assert supports("file:///tmp/lake?protocol=csv", base.CheckpointSink)
    assert supports("kafka://h:9092/t?protocol=canal-json", base.WatermarkSink)
    assert not supports("blackhole://", base.CheckpointSink) and not supports("sqlite:///t.db", base.BufferedSink)
    assert supports("sqlite:///t.db", base.AtomicTxnSink) and SinkFactory().supports("mysql://h/db", base.DdlSettings)


def test_a_sink_without_the_ddl_role_rejects_every_ddl_and_skips_none() -> None:
    with pytest.raises(DdlRejected, match="MemorySink does not apply schema changes"):
        base.apply_ddl(MemorySink(), _ddl(5))
    assert base.apply_ddl(MemorySink(), _ddl(5), skip=True) is False
    ddl = MemoryDdlSink()
    assert base.apply_ddl(ddl, _ddl(5)) is True and base.apply_ddl(ddl, _ddl(5)) is False  # at most once


def test_the_write_twin_keeps_exactly_once_positions_and_refuses_after_close() -> None:
    sink = MemorySink()
    assert sink.open_position("cf", 0, origin=1) == 0
    assert sink.write([_row(10), _row(20)]) == 2
    again = MemorySink()
    again.positions = sink.positions
    assert again.open_position("cf", 0, origin=1) == 20
    assert again.write([_row(20), _row(30)]) == 1 and again.rows == [_row(30)]  # the replay of 20 is dropped
    assert again.open_position("cf", 0, origin=2) == 0  # another changefeed of the same id
    assert sink.forget("cf") == 1 and sink.positions == {}

    def refuse() -> None:
        raise SinkError("lease lost")

    with pytest.raises(SinkError):
        sink.write([_row(40)], refuse)
    assert sink.rows == [_row(10), _row(20)]  # nothing of a fenced-off write
    sink.unavailable = "down"
    with pytest.raises(SinkUnavailable):
        sink.probe()
    sink.close()
    with pytest.raises(SinkError, match="closed"):
        sink.write([_row(50)])


def test_the_buffered_and_watermark_twins_refuse_what_their_contracts_forbid() -> None:
    sink = MemoryBufferedSink(flush_interval=1.0)
    sink.write([_row(10)])
    assert sink.rows == [] and sink.pending == [_row(10)]
    with pytest.raises(SinkError, match="unflushed"):
        sink.apply_ddl(_ddl(20))
    sink.flush()
    assert sink.rows == [_row(10)] and sink.apply_ddl(_ddl(20))

    marks = MemoryWatermarkSink(interval=1.0, flush_interval=1.0)
    marks.bind_span("cf", 0, 1)
    assert marks.watermark_interval == 1.0
    marks.write([_row(10)])
    with pytest.raises(SinkError, match="not yet durable"):
        marks.publish_resolved(Watermark(10, 10.0))
    marks.flush()
    marks.publish_resolved(Watermark(10, 10.0))
    with pytest.raises(SinkError, match="backwards"):
        marks.publish_resolved(Watermark(9, 9.0))


def test_the_opener_twin_hands_out_twins_of_its_kind() -> None:
    sinks = MemorySinks(MemoryCheckpointSink)
    assert sinks.supports("anything://", base.CheckpointSink) and not sinks.supports("x://", base.WatermarkSink)
    s = sinks.open("file:///lake")
    assert isinstance(s, MemoryCheckpointSink) and sinks.opened == [s]
    s.publish_checkpoint(5)
    assert s.checkpoints == [5]
