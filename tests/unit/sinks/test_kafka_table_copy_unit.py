"""A table copy into Kafka (docs/snapshot.md, "Table copies"; docs/sinks.md, "Table copies and resyncs"): the copied
rows carry the copy's snapshot Ts while the span streams past it, so the consumer must never have cut past them; a
resync's emptying is a TRUNCATE event ordered before the copied rows; a copied row behind a watermark that covers it
stops the consumer instead of being dropped as a replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.errors import SinkError
from cdc.events import SNAPSHOT, OpType, RowChange
from cdc.ts import Watermark
from sinks.codec import MessageKind, decoder_for
from sinks.kafka.consumer import Rebuilder
from sinks.kafka.headers import HEADER
from tests.kafka_sink_fakes import FakeBroker, MemoryApplier, ins, table
from tests.unit.sinks.test_kafka_sink_unit import PROTOCOLS, decoded, index_value, make, rebuild

pytestmark = pytest.mark.unit


def copied(schema, ts: int, id_: int, v: str = "copy") -> RowChange:  # type: ignore[no-untyped-def]
    change = ins(schema, ts, id_, v)
    change.extra[SNAPSHOT] = True
    return change


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_resync_truncate_goes_before_the_copied_rows_and_removes_what_consumers_hold(protocol: str) -> None:
    broker = FakeBroker(partitions=3)
    s, u = table(), table("u")
    span = make(broker, protocol, dispatchers=index_value)
    span.write([ins(s, 10, 1, "old"), ins(s, 10, 2, "stale"), ins(u, 10, 7)])
    span.publish_resolved(Watermark(10, 0.01))
    # the resync of s and u at snapshot 50: the copy's sink (bound to no span) empties them, then copies s's rows
    make(broker, protocol, dispatchers=index_value, span=None).truncate_targets(
        [s.name, u.name], schemas=[s, u], at=Watermark(50, 0.05))
    make(broker, protocol, dispatchers=index_value, span=None).write([copied(s, 50, 1), copied(s, 50, 3)])
    span.write([ins(s, 60, 4, "after")])
    span.publish_resolved(Watermark(60, 0.06))
    core, applier = rebuild(broker, protocol)
    assert sorted((k, r["v"]) for k, r in ((r["id"], r) for r in applier.tables[s.name].values())) == [
        (1, "copy"), (3, "copy"), (4, "after")]
    assert applier.tables[u.name] == {}
    truncates = [e for e in applier.log if e.ev.op is OpType.TRUNCATE]
    assert {str(e.ev.table) for e in truncates} == {"public.t", "public.u"}  # both, though both are at position 0
    first_copy = next(i for i, e in enumerate(applier.log) if e.commit_ts == 50 and e.ev.op is OpType.INSERT)
    assert all(applier.log.index(e) < first_copy for e in truncates)
    for part in decoded(broker, protocol):  # the copy writers' header, position 0
        assert {dict(h)[HEADER] for e, h in part if e.op is OpType.TRUNCATE} <= {b"-:0"}


def test_truncate_targets_is_refused_without_the_schemas_or_the_snapshot() -> None:
    sink = make(FakeBroker(), "canal-json", span=None)
    s = table()
    with pytest.raises(SinkError, match="needs the table's schema and the copy's snapshot Ts"):
        sink.truncate_targets([s.name])
    with pytest.raises(SinkError, match="public.t"):
        sink.truncate_targets([s.name], schemas=[table("u")], at=Watermark(5, 0.0))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_copied_row_behind_a_watermark_that_covers_it_stops_the_consumer(protocol: str) -> None:
    """What the table hold prevents: the span's (or the owner's) watermark passed the copy's snapshot Ts before the
    copy wrote its rows. A consumer would drop them as replays: ours refuses, naming the row."""
    broker = FakeBroker(partitions=2)
    s = table()
    span = make(broker, protocol, dispatchers=index_value)
    span.write([ins(s, 10, 1)])
    make(broker, protocol, dispatchers=index_value, span=None).publish_checkpoint(70, 0.07)
    make(broker, protocol, dispatchers=index_value, span=None).write([copied(s, 50, 2)])
    with pytest.raises(SinkError, match=r"copied at commit Ts 50 comes after watermark 70"):
        rebuild(broker, protocol)


def test_a_copied_row_after_another_spans_watermark_is_not_late() -> None:
    """With several spans a span's watermark speaks for that span only: a copy of another span's table may follow."""
    broker = FakeBroker(partitions=1)
    s = table()
    other = make(broker, "canal-json", "&span-watermarks=true", span=("cf", 1, 2))
    other.write([ins(table("u"), 10, 1)])
    other.publish_resolved(Watermark(70, 0.07))
    make(broker, "canal-json", span=None).write([copied(s, 50, 2)])
    mine = make(broker, "canal-json", "&span-watermarks=true", span=("cf", 0, 2))
    mine.publish_resolved(Watermark(70, 0.07))
    core, applier = rebuild(broker, "canal-json")
    assert core.applied == 70 and [r["id"] for r in applier.tables[s.name].values()] == [2]


def test_copied_rows_before_the_cut_are_applied_in_commit_order_with_the_stream() -> None:
    """A restarted consumer reads a topic where the copy came before the watermark: nothing late, nothing lost."""
    broker = FakeBroker(partitions=1)
    s = table()
    span = make(broker, "canal-json")
    span.write([ins(s, 40, 1, "streamed")])
    make(broker, "canal-json", span=None).write([copied(s, 50, 1, "copied"), copied(s, 50, 2)])
    span.write([ins(s, 55, 3)])
    span.publish_resolved(Watermark(60, 0.06))
    applier = MemoryApplier()
    core = Rebuilder(decoder_for("canal-json"), applier, [("cdc", 0)])
    core.open()
    for r in broker.topics["cdc"][0]:
        core.feed(r)
    assert core.advance() == 60
    assert [(e.commit_ts, e.ev.values["id"]) for e in applier.log if e.ev.kind is MessageKind.ROW] == [
        (40, 1), (50, 1), (50, 2), (55, 3)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_copied_rows_over_rows_the_target_holds_are_upserts_not_netted_with_later_deletes(
        protocol: str, tmp_path: Path) -> None:
    """A chunk copied again (or a resync without its TRUNCATE) inserts keys the consumer's target already holds; a
    delete of such a key after the copy, in the same cut, must remove the row: the copy's rows are written on their
    own, never netted with the stream's changes (an INSERT netted with a later DELETE would cancel out and leave the
    row the target held)."""
    import sqlite3

    from sinks.kafka.applier import SinkApplier

    broker = FakeBroker(partitions=1)
    s = table()
    span = make(broker, protocol)
    span.write([ins(s, 10, 1, "old"), ins(s, 10, 2, "old")])
    span.publish_resolved(Watermark(10, 0.01))
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}", schemas=lambda t: s if t == s.name else None)
    try:
        core = Rebuilder(decoder_for(protocol), applier, [("cdc", 0)])
        core.open()
        first = len(broker.topics["cdc"][0])
        for r in broker.topics["cdc"][0]:
            core.feed(r)
        assert core.advance() == 10
        make(broker, protocol, span=None).write([copied(s, 50, 1), copied(s, 50, 2)])
        span.write([RowChange(OpType.DELETE, s, 60, 0.06, None, {"id": 1})])
        span.publish_resolved(Watermark(60, 0.06))
        for r in broker.topics["cdc"][0][first:]:
            core.feed(r)
        assert core.advance() == 60
    finally:
        applier.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id, v FROM t ORDER BY id").fetchall() == [(2, "copy")]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_copy_started_over_truncates_before_its_rows_like_a_resync(protocol: str) -> None:
    """A table whose definition changed between two runs of its copy (CopyTargets.restart_copy_target): the TRUNCATE
    comes with the new run's snapshot Ts under the copy writers' header, before the rows copied again."""
    broker = FakeBroker(partitions=2)
    s = table()
    job = make(broker, protocol, dispatchers=index_value, span=None)
    job.write([copied(s, 40, 1, "first run"), copied(s, 40, 2, "first run")])
    again = make(broker, protocol, dispatchers=index_value, span=None)
    again.restart_copy_target(s, "cf", 0, 50, 0.05)
    again.write([copied(s, 50, 2, "second run")])
    make(broker, protocol, dispatchers=index_value, span=None).publish_checkpoint(50, 0.05)
    _core, applier = rebuild(broker, protocol)
    assert [(r["id"], r["v"]) for r in applier.tables[s.name].values()] == [(2, "second run")]
    for part in decoded(broker, protocol):
        assert {dict(h)[HEADER] for e, h in part if e.op is OpType.TRUNCATE} <= {b"-:0"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_two_chunks_of_one_table_written_in_the_same_nanosecond_both_reach_the_consumer(
        protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy writers number their rows from the write's start in nanoseconds: two chunks of one table written in
    parallel can share positions. The consumer tells copied rows of a keyed table apart by key, so neither chunk's
    rows are dropped as duplicates (they were, when the identity was the position)."""
    import sinks.kafka.sink as kafka_sink

    monkeypatch.setattr(kafka_sink.time, "time_ns", lambda: 1_000_000)
    broker = FakeBroker(partitions=1)
    s = table()
    make(broker, protocol, span=None).write([copied(s, 50, 1), copied(s, 50, 2)])  # chunk 0
    make(broker, protocol, span=None).write([copied(s, 50, 3), copied(s, 50, 4)])  # chunk 1, the same positions
    make(broker, protocol, span=None).write([copied(s, 50, 3)])  # chunk 1 again (a retried task): one row
    span = make(broker, protocol)
    span.publish_resolved(Watermark(60, 0.06))
    applier = MemoryApplier()
    core = Rebuilder(decoder_for(protocol), applier, [("cdc", 0)])
    core.open()
    for r in broker.topics["cdc"][0]:
        core.feed(r)
    assert core.advance() == 60
    assert sorted(e.ev.values["id"] for e in applier.log if e.ev.kind is MessageKind.ROW) == [1, 2, 3, 4]
    assert core.stats.duplicates == 1
