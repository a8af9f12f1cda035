"""The Kafka sink's logic over an in-memory transport (tests/kafka_sink_fakes.py) and the consumer library's core
over the records it produced: dispatch, order, key-change split, DDL placement, watermarks, large messages,
transactional positions, duplicate removal. The real broker: tests/integration/test_kafka_sink.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cdc.config import DispatcherRule, SinkConfig
from cdc.errors import InvalidArgument, InvalidURI, SinkUnavailable
from cdc.events import DdlChange, DdlEvent, DdlKind, OpType, RowChange
from cdc.ts import Watermark
from sinks.codec import MessageKind, MessageTooLarge, decoder_for
from sinks.kafka.consumer import Rebuilder, WatermarkTracker
from sinks.kafka.headers import HEADER, parse
from sinks.kafka.meta import meta_topic_name
from sinks.kafka.sink import KafkaSink
from tests.kafka_sink_fakes import (
    FakeBroker,
    FakeMetaReader,
    FakeTransport,
    MemoryApplier,
    col,
    factory,
    ins,
    table,
    unavailable,
    upd,
)

pytestmark = pytest.mark.unit

PROTOCOLS = ("canal-json", "open-protocol", "debezium")


def make(broker: FakeBroker, protocol: str = "canal-json", query: str = "", dispatchers: tuple = (),
         span: tuple[str, int, int] | None = ("cf", 0, 1)) -> KafkaSink:
    sink = KafkaSink(f"kafka://127.0.0.1:9092/cdc?protocol={protocol}{query}",
                     SinkConfig(dispatchers=dispatchers), transport_factory=factory(broker),
                     meta_reader=lambda opts: FakeMetaReader(broker, opts))  # type: ignore[arg-type,return-value]
    if span is not None:
        sink.bind_span(*span)
        sink.open_position(span[0], span[1], 0)
    return sink


def decoded(broker: FakeBroker, protocol: str, topic: str = "cdc") -> list[list[Any]]:
    dec = decoder_for(protocol)
    return [[(e, r.headers) for r in part for e in dec.decode(r.key, r.value)] for part in broker.topics[topic]]


def rebuild(broker: FakeBroker, protocol: str, topics: tuple[str, ...] = ("cdc",), applier: MemoryApplier | None = None
            ) -> tuple[Rebuilder, MemoryApplier]:
    applier = applier or MemoryApplier()
    parts = [(t, p) for t in topics for p in range(len(broker.topics[t]))]
    core = Rebuilder(decoder_for(protocol), applier, parts)
    core.open()
    for t, p in parts:
        for r in broker.topics[t][p]:
            core.feed(r)
    core.advance()
    return core, applier


index_value = (DispatcherRule(("public.*",), "", "index-value"),)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_rows_go_to_their_key_partition_in_order_with_span_and_seq_headers(protocol: str) -> None:
    broker = FakeBroker(partitions=3)
    sink = make(broker, protocol, dispatchers=index_value)
    s = table()
    changes = [ins(s, 100, i, f"v{i}") for i in range(12)] + [upd(s, 200, i, f"w{i}") for i in range(12)]
    assert sink.write(changes) == 24
    parts = decoded(broker, protocol)
    assert sum(1 for p in parts for e, _ in p if e.kind is MessageKind.ROW) == 24
    for p in parts:
        seen: dict[int, list[str]] = {}
        for e, headers in p:
            if e.kind is not MessageKind.ROW:
                continue
            seen.setdefault(e.values["id"], []).append(e.values["v"])
            span, seqs = parse(dict(headers)[HEADER])
            assert span == "0/1" and len(seqs) >= 1
        for i, vs in seen.items():
            assert vs == [f"v{i}", f"w{i}"]  # one key: one partition, in order
    assert len([p for p in parts if p]) == 3


def test_a_key_change_becomes_a_delete_and_an_insert_on_their_own_partitions() -> None:
    broker = FakeBroker(partitions=4)
    sink = make(broker, "canal-json", dispatchers=index_value)
    s = table()
    sink.write([ins(s, 10, 1), ins(s, 10, 2)])
    sink.write([upd(s, 20, 9, "moved", old_id=1)])
    events = [(pi, e) for pi, p in enumerate(decoded(broker, "canal-json")) for e, _ in p if e.commit_ts == 20]
    ops = {e.op: pi for pi, e in events}
    assert set(ops) == {OpType.DELETE, OpType.INSERT}
    key_part = {e.values["id"]: pi for pi, p in enumerate(decoded(broker, "canal-json")) for e, _ in p
                if e.commit_ts == 10}
    assert ops[OpType.DELETE] == key_part[1]
    core, applier = rebuild(broker, "canal-json")  # no watermark yet: nothing applied
    assert applier.log == []
    sink.publish_resolved(Watermark(20, 0.02))
    core, applier = rebuild(broker, "canal-json")
    rows = applier.tables[s.name]
    assert sorted(v["id"] for v in rows.values()) == [2, 9]


@pytest.mark.parametrize(("protocol", "partitions"), [("canal-json", [0]), ("open-protocol", [0, 1, 2]),
                                                      ("debezium", [0, 1, 2])])
def test_ddl_goes_after_the_rows_before_it_to_partition_zero_or_every_partition(protocol: str,
                                                                                partitions: list[int]) -> None:
    broker = FakeBroker(partitions=3)
    sink = make(broker, protocol, dispatchers=index_value)
    s = table()
    s2 = table(version=1, extra=(col("n"),))
    sink.write([ins(s, 10, i) for i in range(6)])
    ddl = DdlEvent(20, 0.02, s.name, (DdlChange(DdlKind.ADD_COLUMN, "n"),), s, s2, "ALTER TABLE t ADD n int8")
    assert sink.apply_ddl(ddl) is True
    sink.write([ins(s2, 30, 100 + i, n=i) for i in range(6)])
    for pi, p in enumerate(decoded(broker, protocol)):
        kinds = [(e.kind, e.commit_ts) for e, _ in p]
        ddl_at = [i for i, (k, _) in enumerate(kinds) if k is MessageKind.DDL]
        if pi in partitions:
            assert len(ddl_at) == 1
            assert all(ts < 20 for _, ts in kinds[:ddl_at[0]]) and all(ts > 20 for _, ts in kinds[ddl_at[0] + 1:])
        else:
            assert ddl_at == []


def test_a_truncate_is_placed_like_a_ddl() -> None:
    broker = FakeBroker(partitions=3)
    sink = make(broker, "open-protocol", dispatchers=index_value)
    s = table()
    sink.write([ins(s, 10, i) for i in range(6)] + [RowChange(OpType.TRUNCATE, s, 11, 0.011)]
               + [ins(s, 12, 50)])
    for p in decoded(broker, "open-protocol"):
        assert [e.op for e, _ in p if e.commit_ts == 11] == [OpType.TRUNCATE]
    sink.publish_resolved(Watermark(12, 0.0))
    _, applier = rebuild(broker, "open-protocol")
    assert [v["id"] for v in applier.tables[s.name].values()] == [50]
    assert sum(1 for e in applier.log if e.ev.op is OpType.TRUNCATE) == 1  # three copies, applied once


def test_watermarks_reach_every_partition_of_every_topic_in_use() -> None:
    broker = FakeBroker(partitions=2)
    rules = (DispatcherRule(("public.a*",), "cdc_{schema}_{table}", "table"),)
    sink = make(broker, "canal-json", dispatchers=rules)
    sink.write([ins(table("abc"), 10, 1), ins(table("x"), 10, 2)])
    sink.publish_resolved(Watermark(15, 0.015))
    for topic in ("cdc", "cdc_public_abc"):
        for p in decoded(broker, "canal-json", topic):
            marks = [(e.commit_ts, dict(h).get(HEADER)) for e, h in p if e.kind is MessageKind.WATERMARK]
            assert marks == [(15, b"0/1")]
    # the per-table topic is recorded, so the owner (a fresh sink) also reaches it
    meta = [r.key for r in broker.records(meta_topic_name("cdc"))]
    assert b"topic/cdc_public_abc" in meta
    owner = make(broker, "canal-json", dispatchers=rules, span=None)
    owner.publish_checkpoint(16, 0.016)
    for topic in ("cdc", "cdc_public_abc"):
        for p in decoded(broker, "canal-json", topic):
            assert [(e.commit_ts, dict(h).get(HEADER)) for e, h in p if e.kind is MessageKind.WATERMARK][-1] \
                == (16, None)


def test_with_partition_num_below_the_topics_count_rows_use_the_first_and_watermarks_reach_all() -> None:
    """A consumer reads every partition of the topic and cuts at the minimum: a partition without watermarks would
    hold it back forever."""
    broker = FakeBroker(partitions=5)
    sink = make(broker, "canal-json", "&partition-num=2", dispatchers=index_value)
    s = table()
    sink.write([ins(s, 10, i) for i in range(30)])
    sink.publish_resolved(Watermark(10, 0.01))
    assert [sum(1 for e, _ in p if e.kind is MessageKind.ROW) for p in decoded(broker, "canal-json")][2:] == [0, 0, 0]
    assert all(any(e.kind is MessageKind.WATERMARK for e, _ in p) for p in decoded(broker, "canal-json"))
    core, applier = rebuild(broker, "canal-json")
    assert core.applied == 10 and len(applier.tables[s.name]) == 30


def test_span_watermarks_default_on_for_one_span_off_for_several() -> None:
    broker = FakeBroker()
    assert make(broker, span=("cf", 0, 1)).watermark_interval > 0
    assert make(broker, span=("cf", 1, 3)).watermark_interval == 0
    assert make(broker, "canal-json", "&span-watermarks=true", span=("cf", 1, 3)).watermark_interval > 0
    assert make(broker, "canal-json", "&span-watermarks=false", span=("cf", 0, 1)).watermark_interval == 0


def test_tracker_needs_every_span_and_trusts_header_less_watermarks() -> None:
    t = WatermarkTracker()
    tp = ("cdc", 0)
    t.observe(tp, 50, "0/2")
    assert t.partition(tp) == 0  # span 1 unheard of: nothing is safe
    t.observe(tp, 40, "1/2")
    assert t.partition(tp) == 40
    t.observe(tp, 45, None)  # the changefeed checkpoint
    assert t.partition(tp) == 45
    t.observe(tp, 30, "1/2")  # never backwards
    assert t.partition(tp) == 45
    assert t.global_watermark([tp, ("cdc", 1)]) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_replayed_write_is_consumed_once(protocol: str) -> None:
    """A span restarts from an older checkpoint: the new sink instance sends the same transactions again, before
    and after the first run's watermark. The consumer applies each event once."""
    broker = FakeBroker(partitions=3)
    s = table()
    k = table("k", keyed=False)
    txns = [[ins(s, ts, ts), ins(k, ts, ts, "dup?"), upd(s, ts, ts, "again")] for ts in range(10, 20)]
    first = make(broker, protocol, dispatchers=index_value)
    for t in txns[:6]:
        first.write(t)
    first.publish_resolved(Watermark(13, 0.0))
    first_run = [len(p) for p in broker.topics["cdc"]]
    second = make(broker, protocol, dispatchers=index_value)  # restarted from checkpoint 11
    for t in txns[2:]:
        second.write(t)
    second.publish_resolved(Watermark(19, 0.0))
    applier = MemoryApplier()
    core = Rebuilder(decoder_for(protocol), applier, [("cdc", p) for p in range(3)])
    core.open()
    for part, n in zip(broker.topics["cdc"], first_run, strict=True):  # the consumer reads the first run ...
        for r in part[:n]:
            core.feed(r)
    assert core.advance() == 13
    for part, n in zip(broker.topics["cdc"], first_run, strict=True):  # ... then the replay and the rest
        for r in part[n:]:
            core.feed(r)
    assert core.advance() == 19
    ids = Counter((str(e.ev.table), e.commit_ts, e.ev.op) for e in applier.log)
    assert set(ids.values()) == {1} and len(ids) == 30
    assert core.stats.duplicates > 0  # the replay of 14 and 15 (above the first watermark), by identity
    assert core.stats.replayed > 0  # the replay of 12 and 13 (at or below it), by commit Ts
    assert sorted(v["v"] for v in applier.tables[s.name].values()) == ["again"] * 10


def test_oversized_row_fails_naming_table_and_key_by_default() -> None:
    broker = FakeBroker()
    sink = make(broker, "canal-json", "&max-message-bytes=2048")
    s = table()
    with pytest.raises(MessageTooLarge, match=r"table public\.t: the INSERT of key \(id=7\) at commit Ts 10 .* "
                                              r"above the limit of 2048.*large-message-handle-option"):
        sink.write([ins(s, 10, 7, "x" * 5000)])
    assert broker.records("cdc") == []


@pytest.mark.parametrize("protocol", ["canal-json", "open-protocol"])
def test_oversized_row_goes_key_only(protocol: str) -> None:
    broker = FakeBroker()
    sink = make(broker, protocol, "&max-message-bytes=2048&large-message-handle-option=handle-key-only")
    s = table()
    sink.write([ins(s, 10, 7, "x" * 5000), ins(s, 10, 8, "small")])
    events = [e for p in decoded(broker, protocol) for e, _ in p]
    big = [e for e in events if e.key == {"id": 7}]
    assert len(big) == 1 and big[0].extra.get("onlyHandleKey") is True
    assert [e.values["v"] for e in events if e.key == {"id": 8}] == ["small"]


@pytest.mark.parametrize("protocol", ["canal-json", "open-protocol"])
def test_oversized_row_goes_to_a_claim_check_the_consumer_reads(protocol: str, tmp_path: Path) -> None:
    broker = FakeBroker()
    sink = make(broker, protocol, f"&max-message-bytes=2048&large-message-handle-option=claim-check"
                f"&claim-check-storage-uri=file://{tmp_path}")
    s = table()
    sink.write([ins(s, 10, 7, "x" * 5000)])
    sink.publish_resolved(Watermark(10, 0.0))
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["commit_ts"] == 10
    _, applier = rebuild(broker, protocol)
    assert [v["v"] for v in applier.tables[s.name].values()] == ["x" * 5000]


def test_large_message_options_are_validated() -> None:
    broker = FakeBroker()
    with pytest.raises(InvalidURI, match="large-message-handle-option='huge' is not supported"):
        make(broker, "canal-json", "&large-message-handle-option=huge")
    with pytest.raises(InvalidURI, match="needs claim-check-storage-uri=file:///"):
        make(broker, "canal-json", "&large-message-handle-option=claim-check")
    with pytest.raises(InvalidURI, match="must be a local directory"):
        make(broker, "canal-json", "&large-message-handle-option=claim-check&claim-check-storage-uri=s3://b/p")
    with pytest.raises(InvalidURI, match="Debezium has none"):
        make(broker, "debezium", "&large-message-handle-option=handle-key-only")
    with pytest.raises(InvalidURI, match="protocol 'avro' is not supported"):
        make(broker, "avro")


def test_missing_kafka_python_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sinks.kafka.sink as mod

    monkeypatch.setattr(mod, "_kafka_missing", lambda: True)
    with pytest.raises(InvalidArgument, match=r"kafka-python, which is not installed: pip install 'tidewater\[kafka\]'"):
        KafkaSink("kafka://127.0.0.1:9092/cdc?protocol=canal-json")


def test_a_failed_flush_fails_the_write() -> None:
    broker = FakeBroker()
    sink = make(broker)
    broker.fail_next_flush = unavailable()
    with pytest.raises(SinkUnavailable):
        sink.write([ins(table(), 10, 1)])


def test_transactional_position_is_read_back_and_replays_are_skipped() -> None:
    broker = FakeBroker(partitions=2)
    q = "&kafka-transactional=true"
    s = table()
    s2 = table(version=1, extra=(col("n"),))
    a = make(broker, "canal-json", q)
    assert a.open_position("cf", 0, 5) == 0
    a.write([ins(s, 10, 1), ins(s, 11, 2)])
    # a transaction split around its DDL: rows before it, the DDL, rows after it
    a.write([ins(s, 20, 3)])
    ddl = DdlEvent(20, 0.02, s.name, (DdlChange(DdlKind.ADD_COLUMN, "n"),), s, s2, "ALTER TABLE t ADD n int8")
    assert a.apply_ddl(ddl)
    meta = {r.key.decode(): json.loads(r.value) for r in broker.records(meta_topic_name("cdc"))}
    assert meta["checkpoint/cf/0"] == {"ts": 20, "step": 1, "origin": 5, "time": meta["checkpoint/cf/0"]["time"]}
    before = len(broker.records("cdc"))
    # the capture died before the etcd checkpoint moved: a new sink replays from 0
    b = make(broker, "canal-json", q)
    assert b.open_position("cf", 0, 5) == 20
    assert b.write([ins(s, 10, 1), ins(s, 11, 2)]) == 0
    assert b.write([ins(s, 20, 3)]) == 0
    assert b.apply_ddl(ddl) is False
    assert b.write([ins(s2, 20, 4, n=1)]) == 1  # the part after the DDL was never committed
    rows = [e for p in decoded(broker, "canal-json") for e, _ in p if e.kind is MessageKind.ROW]
    assert len(broker.records("cdc")) == before + 1 and [e.values["id"] for e in rows].count(4) == 1
    # a position of an earlier changefeed with the same id (another origin) is not trusted
    c = make(broker, "canal-json", q)
    assert c.open_position("cf", 0, 6) == 0


def test_transaction_aborted_on_failure_leaves_nothing() -> None:
    broker = FakeBroker()
    sink = make(broker, "canal-json", "&kafka-transactional=true")

    def fence() -> None:
        raise SinkUnavailable("lease lost")

    with pytest.raises(SinkUnavailable):
        sink.write([ins(table(), 10, 1)], fence)
    (tr,) = [t for t in FakeTransport.instances if t.broker is broker]  # the sink's transactional producer
    assert tr.transactional_id == "tidewater-cf-0"
    assert broker.records("cdc") == [] and tr.aborts == 1


def test_target_names_are_per_table() -> None:
    sink = make(FakeBroker())
    s = table()
    assert sink.target_name(s.name) == "cdc/public.t" != sink.target_name(table("u").name)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_keyless_chunk_copied_twice_is_consumed_as_the_last_copy(protocol: str) -> None:
    """The initial copy of a key-less table is a TRUNCATE and the rows in one write, by a sink bound to no span;
    a failed chunk is copied again. Every attempt sorts after the one before, none is taken for a duplicate."""
    from cdc.events import SNAPSHOT

    broker = FakeBroker(partitions=3)
    k = table("k", keyed=False)

    def copy(rows: int) -> list[RowChange]:
        out = [RowChange(OpType.TRUNCATE, k, 50, 0.05)]
        for i in range(rows):
            change = ins(k, 50, i % 3, "same")
            change.extra[SNAPSHOT] = True
            out.append(change)
        return out

    make(broker, protocol, dispatchers=index_value, span=None).write(copy(4))  # the first attempt ...
    make(broker, protocol, dispatchers=index_value, span=None).write(copy(6))  # ... and the one that counts
    make(broker, protocol, dispatchers=index_value).publish_resolved(Watermark(50, 0.05))
    _, applier = rebuild(broker, protocol)
    rows = [e for e in applier.log if e.ev.kind is MessageKind.ROW and e.ev.op is OpType.INSERT]
    truncates = [i for i, e in enumerate(applier.log) if e.ev.op is OpType.TRUNCATE]
    assert len(rows) == 10 and len(truncates) == 2
    assert [e.ev.op for e in applier.log[truncates[1] + 1:]] == [OpType.INSERT] * 6
