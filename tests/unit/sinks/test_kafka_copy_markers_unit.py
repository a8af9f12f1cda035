"""Copy markers (sinks.kafka.copy_markers, docs/sinks.md "Copy markers"): the Kafka sink's copy writers record per
chunk how many rows went to each partition, the span announces each table's complete copy, and the consumer library
stops naming table, chunk, partition and counts when a chunk arrived short or not at all - and never on a replayed
chunk or a run that was superseded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cdc.errors import SinkError
from cdc.events import SNAPSHOT, OpType, RowChange, TableSchema
from cdc.snapshot import CopiedChunk
from sinks.codec import decoder_for
from sinks.kafka.consumer import Rebuilder, Record
from sinks.kafka.copy_markers import CopyCheck
from sinks.kafka.headers import HEADER, copy_chunk
from tests.kafka_sink_fakes import FakeBroker, MemoryApplier, table
from tests.unit.sinks.test_kafka_sink_unit import PROTOCOLS, index_value, make

pytestmark = pytest.mark.unit

META = "_tidewater.cdc"


def copied(schema: TableSchema, ts: int, ids: range, v: str = "copy") -> list[RowChange]:
    out = []
    for i in ids:
        change = RowChange(OpType.INSERT, schema, ts, ts / 1000, {"id": i, "v": v})
        change.extra[SNAPSHOT] = True
        out.append(change)
    return out


def copy_chunks(broker: FakeBroker, protocol: str, schema: TableSchema, ts: int, chunks: dict[int, range]
                ) -> list[CopiedChunk]:
    """What the copy job does per chunk (``spark_jobs.copy``): one writer bound to no span, ``write_copy_chunk``."""
    writer = make(broker, protocol, dispatchers=index_value, span=None)
    done = []
    for index, ids in chunks.items():
        rows = writer.write_copy_chunk(copied(schema, ts, ids), CopiedChunk(schema.name, index, ts))
        done.append(CopiedChunk(schema.name, index, ts, rows))
    return done


def announce(broker: FakeBroker, protocol: str, chunks: list[CopiedChunk], checkpoint: int) -> None:
    """What the span does once the copy is complete, then the owner's checkpoint above it."""
    make(broker, protocol, span=None).announce_copy(chunks)
    make(broker, protocol, span=None).publish_checkpoint(checkpoint, checkpoint / 1000)


def consume(broker: FakeBroker, protocol: str, *, leave_out: Callable[[Record], bool] = lambda r: False,
            meta_first: bool = True, copies: CopyCheck | None = None) -> tuple[Rebuilder, MemoryApplier]:
    applier = MemoryApplier()
    parts = [("cdc", p) for p in range(len(broker.topics["cdc"]))]
    core = Rebuilder(decoder_for(protocol), applier, parts, meta_topics=[META], copies=copies)
    core.open()
    meta = broker.records(META)
    data = [r for t, p in parts for r in broker.topics[t][p] if not leave_out(r)]
    for r in [*meta, *data] if meta_first else [*data, *meta]:
        core.feed(r)
    core.advance()
    return core, applier


def chunk_of(r: Record) -> int | None:
    value = dict(r.headers).get(HEADER)
    return copy_chunk(value) if value else None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_complete_copy_is_verified_chunk_by_chunk_and_applied(protocol: str) -> None:
    broker = FakeBroker(partitions=3)
    s = table()
    done = copy_chunks(broker, protocol, s, 50, {0: range(0, 10), 1: range(10, 25)})
    announce(broker, protocol, done, 60)
    assert {chunk_of(r) for r in broker.records("cdc")} == {0, 1, None}  # (None: the checkpoint's watermarks)
    core, applier = consume(broker, protocol)
    assert len(applier.tables[s.name]) == 25
    assert core.stats.chunks_verified == 2 and core.stats.copied_rows == 25
    assert core.applied == 60


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_chunk_that_never_arrived_stops_the_consumer_naming_it(protocol: str) -> None:
    broker = FakeBroker(partitions=3)
    s = table()
    done = copy_chunks(broker, protocol, s, 50, {0: range(0, 10), 1: range(10, 25), 2: range(25, 30)})
    announce(broker, protocol, done, 60)
    with pytest.raises(SinkError, match=r"table public\.t: chunk 1 of its copy at commit Ts 50 is missing: none of "
                                        r"its rows arrived in topic cdc partition \d: expected \d+ rows, seen 0") as e:
        consume(broker, protocol, leave_out=lambda r: chunk_of(r) == 1)
    assert "resync" in e.value.message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_short_chunk_stops_the_consumer_with_both_counts(protocol: str) -> None:
    broker = FakeBroker(partitions=2)
    s = table()
    done = copy_chunks(broker, protocol, s, 50, {0: range(0, 40), 1: range(40, 80)})
    announce(broker, protocol, done, 60)
    victim = next(r for r in broker.topics["cdc"][1] if chunk_of(r) == 0)
    lost = len(decoder_for(protocol).decode(victim.key, victim.value))  # (open-protocol batches rows)
    expected = sum(1 for r in broker.topics["cdc"][1] if chunk_of(r) == 0
                   for _ in decoder_for(protocol).decode(r.key, r.value))
    with pytest.raises(SinkError, match=rf"chunk 0 of its copy at commit Ts 50 is short in topic cdc partition 1: "
                                        rf"expected {expected} rows, seen {expected - lost}"):
        consume(broker, protocol, leave_out=lambda r: r is victim)


def test_nothing_is_applied_from_a_cut_that_covers_a_short_chunk() -> None:
    broker = FakeBroker(partitions=1)
    s = table()
    announce(broker, "canal-json", copy_chunks(broker, "canal-json", s, 50, {0: range(5)}), 60)
    applier = MemoryApplier()
    core = Rebuilder(decoder_for("canal-json"), applier, [("cdc", 0)], meta_topics=[META])
    for r in [*broker.records(META), *broker.records("cdc")[1:]]:
        core.feed(r)
    with pytest.raises(SinkError, match="short"):
        core.advance()
    assert applier.cuts == [] and core.applied == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_chunk_written_again_after_a_kill_and_a_superseded_run_do_not_fire(protocol: str) -> None:
    """Run 1 at Ts 50 writes chunk 0 whole and chunk 1 half (killed before its marker: rows without a marker); run 2
    at Ts 70 writes chunk 1 again. Key-less table u: a run at 50 wrote it short, then the table was copied again whole
    at 70. The announcements name what etcd recorded (t: chunk 0 at 50, chunk 1 at 70; u: chunk 0 at 70); the
    abandoned rows are neither compared nor lost."""
    broker = FakeBroker(partitions=3)
    s, u = table(), table("u", keyed=False)
    first = copy_chunks(broker, protocol, s, 50, {0: range(0, 10)})
    make(broker, protocol, dispatchers=index_value, span=None).write(copied(s, 50, range(10, 14)))  # no marker
    copy_chunks(broker, protocol, u, 50, {0: range(0, 3)})
    keep = broker.records("cdc")
    dec = decoder_for(protocol)
    dropped = next(r for r in keep if chunk_of(r) == 0 and dec.decode(r.key, r.value)[0].table == u.name)
    for part in broker.topics["cdc"]:  # the abandoned run's u chunk is short: one of its records lost
        if dropped in part:
            part.remove(dropped)
    second = copy_chunks(broker, protocol, s, 70, {1: range(10, 20)})
    make(broker, protocol, span=None).truncate_targets([u.name], schemas=[u], at=_wm(70))
    again = copy_chunks(broker, protocol, u, 70, {0: range(0, 6)})
    announce(broker, protocol, [*first, *second, *again], 80)
    core, applier = consume(broker, protocol)
    assert len(applier.tables[s.name]) == 20
    of_u = [e for e in applier.log if e.ev.table == u.name]
    last = max(i for i, e in enumerate(of_u) if e.ev.op is OpType.TRUNCATE)
    assert sorted(e.ev.values["id"] for e in of_u[last + 1:]) == list(range(6))  # (a multiset: key-less)
    assert core.stats.chunks_verified == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_chunk_delivered_twice_under_one_snapshot_is_counted_once(protocol: str) -> None:
    """The producer's replay of a whole chunk (same rows, same Ts): the consumer drops the second copy by identity,
    and does not count it."""
    broker = FakeBroker(partitions=3)
    s = table()
    done = copy_chunks(broker, protocol, s, 50, {0: range(0, 12)})
    copy_chunks(broker, protocol, s, 50, {0: range(0, 12)})
    announce(broker, protocol, done, 60)
    core, applier = consume(broker, protocol)
    assert core.stats.chunks_verified == 1 and len(applier.tables[s.name]) == 12 and core.stats.duplicates == 12


def test_the_cut_waits_for_an_announcement_read_behind_the_data_and_then_fails_naming_the_table() -> None:
    broker = FakeBroker(partitions=2)
    s = table()
    done = copy_chunks(broker, "canal-json", s, 50, {0: range(8)})
    make(broker, "canal-json", span=None).publish_checkpoint(60, 0.06)
    now = [0.0]
    check = CopyCheck(wait=30.0, clock=lambda: now[0])
    core, applier = consume(broker, "canal-json", copies=check)
    assert core.applied == 0 and applier.cuts == []  # held: the metadata topic may be behind
    assert check.waiting_for == (s.name, 50)
    now[0] = 10.0
    assert core.advance() == 0
    make(broker, "canal-json", span=None).announce_copy(done)  # read late: the cut goes ahead
    core.feed(broker.records(META)[-1])
    assert core.advance() == 60 and len(applier.tables[s.name]) == 8

    broker = FakeBroker(partitions=2)
    copy_chunks(broker, "canal-json", s, 50, {0: range(8)})
    make(broker, "canal-json", span=None).publish_checkpoint(60, 0.06)
    now = [0.0]
    core, _ = consume(broker, "canal-json", copies=CopyCheck(wait=30.0, clock=lambda: now[0]))
    now[0] = 31.0
    with pytest.raises(SinkError, match=r"table public\.t: rows of its copy at commit Ts 50 arrived, and no "
                                        r"announcement .* within 30 s"):
        core.advance()


def test_an_announced_chunk_without_its_marker_stops_the_consumer() -> None:
    broker = FakeBroker(partitions=1)
    s = table()
    make(broker, "canal-json", dispatchers=index_value, span=None).write(copied(s, 50, range(4)))  # (no marker)
    announce(broker, "canal-json", [CopiedChunk(s.name, 0, 50, 4)], 60)
    with pytest.raises(SinkError, match=r"chunk 0 of its copy at commit Ts 50 \(4 rows\) has no chunk marker"):
        consume(broker, "canal-json")


def test_an_announcement_that_lacks_a_planned_chunk_stops_the_consumer() -> None:
    """Chunk 1 of 3 was never copied (nor recorded): the announcement says the plan has 3."""
    broker = FakeBroker(partitions=2)
    s = table()
    done = copy_chunks(broker, "canal-json", s, 50, {0: range(5), 2: range(10, 15)})
    announce(broker, "canal-json", [CopiedChunk(c.table, c.index, c.commit_ts, c.rows, 3) for c in done], 60)
    with pytest.raises(SinkError, match=r"table public\.t: its copy at commit Ts 50 was announced with 2 of its 3 "
                                        r"chunks: chunk 1 never copied"):
        consume(broker, "canal-json")


def test_a_chunk_recorded_empty_needs_no_marker() -> None:
    broker = FakeBroker(partitions=1)
    s = table()
    announce(broker, "canal-json", [CopiedChunk(s.name, 0, 50, 0)], 60)
    core, _ = consume(broker, "canal-json")
    assert core.applied == 60


def test_copies_without_chunk_numbers_are_not_checked() -> None:
    """Rows of a writer before copy markers (header ``-:``): nothing to compare, nothing held."""
    broker = FakeBroker(partitions=1)
    s = table()
    make(broker, "canal-json", span=None).write(copied(s, 50, range(4)))
    make(broker, "canal-json", span=None).publish_checkpoint(60, 0.06)
    core, applier = consume(broker, "canal-json")
    assert core.applied == 60 and len(applier.tables[s.name]) == 4 and core.stats.copied_rows == 0


def test_offset_gaps_are_counted_and_one_offset_jumps_apart() -> None:
    broker = FakeBroker(partitions=1)
    s = table()
    make(broker, "canal-json", span=None).write(copied(s, 50, range(6)))
    records = broker.records("cdc")
    for r, off in zip(records, (0, 1, 3, 4, 9, 10), strict=True):  # a jump of one (a transaction marker) and of four
        r.offset = off
    core = Rebuilder(decoder_for("canal-json"), MemoryApplier(), [("cdc", 0)])
    for r in records:
        core.feed(r)
    assert (core.stats.txn_marker_gaps, core.stats.offset_gaps, core.stats.offsets_skipped) == (1, 1, 4)
    late = Rebuilder(decoder_for("canal-json"), MemoryApplier(), [("cdc", 0)])
    records[0].offset = 7  # a partition that does not start at 0: records deleted before it
    late.feed(records[0])
    assert (late.stats.offset_gaps, late.stats.offsets_skipped) == (1, 7)


def test_the_marker_counts_what_each_partition_got() -> None:
    broker = FakeBroker(partitions=3)
    s = table()
    copy_chunks(broker, "canal-json", s, 50, {4: range(30)})
    import json

    (marker,) = broker.records(META)
    doc: dict[str, Any] = json.loads(marker.value or b"")
    assert marker.key == b"chunk/public.t/50/4"
    per = {p: sum(1 for r in broker.topics["cdc"][p] if chunk_of(r) == 4) for p in range(3)}
    assert {(t, p): n for t, p, n in doc["rows"]} == {("cdc", p): n for p, n in per.items() if n}
    assert sum(per.values()) == 30


def _wm(ts: int) -> Any:
    from cdc.ts import Watermark

    return Watermark(ts, ts / 1000)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_table_dropped_during_its_copy_does_not_hold_the_cut(protocol: str) -> None:
    """A table dropped upstream while it was copied is never announced (the span no longer has it); its DROP TABLE in
    the stream ends the wait for it."""
    from cdc.events import DdlChange, DdlEvent, DdlKind

    broker = FakeBroker(partitions=2)
    s = table()
    copy_chunks(broker, protocol, s, 50, {0: range(6)})
    span = make(broker, protocol, dispatchers=index_value)
    span.apply_ddl(DdlEvent(70, 0.07, s.name, (DdlChange(DdlKind.DROP_TABLE),), s, None, "DROP TABLE public.t"))
    make(broker, protocol, span=None).publish_checkpoint(80, 0.08)
    core, _ = consume(broker, protocol, copies=CopyCheck(wait=0.0, clock=lambda: 0.0))
    assert core.applied == 80 and core.stats.chunks_verified == 0
