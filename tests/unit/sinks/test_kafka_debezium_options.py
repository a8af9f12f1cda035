"""Debezium for stock consumers (sinks.kafka.skipped; docs/sinks.md, "Debezium for stock consumers"): Debezium's
``skipped.operations`` and ``include.schema.changes`` mirrored as ``skipped-operations`` (default none, Debezium's is
t) and ``include-schema-changes``; what is left out is shown as a notice per table, never silently; a resync is
refused while truncates are skipped."""

from __future__ import annotations

import json

import pytest

from cdc.errors import InvalidConfig, InvalidURI
from cdc.events import SNAPSHOT, DdlChange, DdlEvent, DdlKind, OpType, RowChange
from cdc.model import WarningSeverity
from cdc.ts import Watermark
from sinks.codec import EncoderConfig, MessageKind
from sinks.kafka.sink import KafkaSink
from tests.kafka_sink_fakes import FakeBroker, dele, ins, table, upd
from tests.unit.sinks.test_kafka_sink_unit import decoded, make

pytestmark = pytest.mark.unit


def ops(broker: FakeBroker) -> list[str]:
    """Every record of the topic as Debezium's op (``ddl``, ``heartbeat``, ``tombstone``), partition by partition."""
    out = []
    for part in broker.topics["cdc"]:
        for r in part:
            if r.value is None:
                out.append("tombstone")
                continue
            payload = json.loads(r.value)["payload"]
            out.append(payload.get("op") or ("ddl" if "ddl" in payload else "heartbeat"))
    return out


def workload(sink: KafkaSink) -> None:
    s = table()
    copied = ins(s, 5, 9, "copied")
    copied.extra[SNAPSHOT] = True
    sink.write([copied])
    sink.write([ins(s, 10, 1), upd(s, 11, 1, "u"), dele(s, 12, 1), RowChange(OpType.TRUNCATE, s, 13, 0.013)])
    sink.apply_ddl(DdlEvent(14, 0.014, s.name, (DdlChange(DdlKind.ADD_COLUMN, "z"),), s, s, "ALTER TABLE t ADD z", 0))
    sink.publish_resolved(Watermark(14, 0.014))


def test_by_default_nothing_is_skipped_and_truncates_ddl_and_watermarks_are_written() -> None:
    broker = FakeBroker(partitions=1)
    sink = make(broker, "debezium")
    workload(sink)
    assert ops(broker) == ["r", "c", "u", "d", "tombstone", "t", "ddl", "heartbeat"]
    assert sink.take_warnings() == []
    assert EncoderConfig().skipped == frozenset()


def test_debeziums_own_defaults_for_stock_consumers_leave_out_what_is_asked_and_say_so() -> None:
    broker = FakeBroker(partitions=1)
    sink = make(broker, "debezium", "&skipped-operations=t&include-schema-changes=false&debezium-watermarks=false")
    workload(sink)
    assert ops(broker) == ["r", "c", "u", "d", "tombstone"]  # what Debezium's PostgreSQL connector writes
    warnings = {w.code: w for w in sink.take_warnings()}
    assert set(warnings) == {"CDC:NoticeOperationSkipped", "CDC:NoticeDdlNotWritten"}
    assert all(w.table == "public.t" and w.severity is WarningSeverity.NOTICE and w.count == 1
               for w in warnings.values())
    assert "skipped-operations=t" in warnings["CDC:NoticeOperationSkipped"].message
    assert sink.take_warnings() == []  # taken


def test_skipping_creates_and_deletes_never_skips_copied_rows_and_keeps_positions() -> None:
    broker = FakeBroker(partitions=1)
    sink = make(broker, "debezium", "&skipped-operations=c,d&tombstones-on-delete=false")
    workload(sink)
    assert ops(broker) == ["r", "u", "t", "ddl", "heartbeat"]
    (w,) = sink.take_warnings()
    assert w.count == 2 and w.table == "public.t"
    # the update keeps its event position in its transaction: a replay numbers it the same
    rows = [(e.op, dict(h)["tidewater"]) for p in decoded(broker, "debezium") for e, h in p
            if e.kind is MessageKind.ROW and e.op is OpType.UPDATE]
    assert rows == [(OpType.UPDATE, b"0/1:0")]


@pytest.mark.parametrize("query,error", [
    ("&skipped-operations=x", InvalidConfig), ("&skipped-operations=c,none", InvalidConfig)])
def test_bad_skipped_operations_are_refused_naming_the_choices(query: str, error: type) -> None:
    with pytest.raises(error, match="c create, u update, d delete, t truncate"):
        make(FakeBroker(), "debezium", query)


@pytest.mark.parametrize("protocol", ["canal-json", "open-protocol"])
def test_the_options_are_debeziums_only(protocol: str) -> None:
    for query in ("&skipped-operations=t", "&include-schema-changes=false"):
        with pytest.raises(InvalidURI, match="is a Debezium option"):
            make(FakeBroker(), protocol, query)


def test_a_resync_is_refused_while_truncates_are_skipped() -> None:
    assert KafkaSink.resync_refusal("kafka://h:9092/cdc?protocol=debezium") is None
    why = KafkaSink.resync_refusal("kafka://h:9092/cdc?protocol=debezium&skipped-operations=u,t")
    assert why is not None and "skipped-operations" in why
    # a table joining with rows (no resync) still copies: its emptying is left out and shown
    broker = FakeBroker(partitions=1)
    sink = make(broker, "debezium", "&skipped-operations=t", span=None)
    s = table()
    sink.truncate_targets([s.name], schemas=[s], at=Watermark(50, 0.05))
    assert broker.records("cdc") == []
    assert [w.code for w in sink.take_warnings()] == ["CDC:NoticeOperationSkipped"]
