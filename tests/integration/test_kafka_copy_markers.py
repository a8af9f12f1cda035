"""Copy markers on a real broker (tansu; docs/sinks.md "Copy markers"): chunks written by the Kafka sink's copy path
into a 3-partition topic, their markers and the table's announcement in the metadata topic; the consumer library
rebuilds the table and says every chunk was verified, and, fed every record of the real topic except those of one
chunk (or one record of it), stops naming the table, the chunk, the partition and the counts."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdc.config import DispatcherRule, SinkConfig
from cdc.errors import SinkError
from cdc.events import SNAPSHOT, ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.snapshot import CopiedChunk
from playground.servers import KafkaServer
from sinks.codec import decoder_for
from sinks.kafka.applier import SinkApplier
from sinks.kafka.consumer import KafkaReader, Rebuilder, Record, rebuild
from sinks.kafka.headers import HEADER, copy_chunk
from sinks.kafka.meta import meta_topic_name
from sinks.kafka.sink import KafkaSink

pytestmark = pytest.mark.integration

T = TableName("public", "items")
SCHEMA = TableSchema(T, (ColumnSchema("id", 20, "int8", False, "bigint", nullable=False, is_key=True),
                         ColumnSchema("v", 25, "text", False, "text")), ("id",), "d", 5151, 0, True)
CHUNKS = {0: range(0, 40), 1: range(40, 80), 2: range(80, 100)}
TS, CHECKPOINT = 500, 600


@pytest.fixture
def copied_topic(kafka_server: KafkaServer, kafka_topic: str) -> Iterator[str]:
    """The topic after a copy of ``CHUNKS`` at ``TS`` (one writer per chunk, as the copy's tasks), its announcement
    and the changefeed checkpoint ``CHECKPOINT``."""
    uri = kafka_server.uri(kafka_topic, protocol="canal-json", partition_num="3")
    config = SinkConfig(dispatchers=(DispatcherRule(("public.*",), "", "index-value"),))
    done = []
    for index, ids in CHUNKS.items():
        writer = KafkaSink(uri, config)
        try:
            rows = []
            for i in ids:
                change = RowChange(OpType.INSERT, SCHEMA, TS, 5.0, {"id": i, "v": f"v{i}"})
                change.extra[SNAPSHOT] = True
                rows.append(change)
            n = writer.write_copy_chunk(rows, CopiedChunk(T, index, TS))
        finally:
            writer.close()
        done.append(CopiedChunk(T, index, TS, n))
    span = KafkaSink(uri, config)
    try:
        span.announce_copy(done)
        span.publish_checkpoint(CHECKPOINT, 6.0)
    finally:
        span.close()
    yield kafka_topic


def read_all(kafka_server: KafkaServer, topic: str) -> list[Record]:
    """Every record of the topic (100 rows and 3 watermarks) and of its metadata topic (3 markers, 1 announcement),
    read by count (tansu's end offsets cannot be trusted)."""
    reader = KafkaReader([kafka_server.bootstrap], [topic])
    try:
        reader.assign(30)
        assert reader.add_topic(meta_topic_name(topic))
        got: list[Record] = []
        deadline = time.monotonic() + 30
        while len(got) < 107 and time.monotonic() < deadline:
            got.extend(reader.poll(0.5))
        assert len(got) == 107
        return got
    finally:
        reader.close()


def feed_all_but(records: list[Record], topic: str, db: Path, leave_out: Callable[[Record], bool]) -> Rebuilder:
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        core = Rebuilder(decoder_for("canal-json"), applier, [(topic, p) for p in range(3)],
                         meta_topics=[meta_topic_name(topic)])
        core.open()
        for r in records:
            if not leave_out(r):
                core.feed(r)
        core.advance()
        return core
    finally:
        applier.close()


def chunk_of(r: Record) -> int | None:
    value = dict(r.headers).get(HEADER)
    return copy_chunk(value) if value else None


def test_the_consumer_verifies_every_chunk_of_a_copy_it_rebuilds(kafka_server: KafkaServer, copied_topic: str,
                                                                 tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    applier = SinkApplier(f"sqlite:///{db}")
    try:
        core = rebuild([kafka_server.bootstrap], [copied_topic], "canal-json", applier, until=CHECKPOINT, timeout=30)
    finally:
        applier.close()
    assert core.stats.chunks_verified == 3 and core.stats.copied_rows == 100
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*), min(id), max(id) FROM items").fetchone() == (100, 0, 99)


def test_a_chunk_withheld_from_the_real_topic_stops_the_consumer(kafka_server: KafkaServer, copied_topic: str,
                                                                 tmp_path: Path) -> None:
    records = read_all(kafka_server, copied_topic)
    parts_of_1 = {r.partition for r in records if chunk_of(r) == 1}
    assert len(parts_of_1) > 1  # the chunk's rows spread over partitions (index-value)
    with pytest.raises(SinkError, match=rf"table public\.items: chunk 1 of its copy at commit Ts {TS} is missing: "
                                        rf"none of its rows arrived in topic {copied_topic} partition \d: expected "
                                        r"\d+ rows, seen 0"):
        feed_all_but(records, copied_topic, tmp_path / "a.db", lambda r: chunk_of(r) == 1)
    one = next(r for r in records if chunk_of(r) == 2)
    with pytest.raises(SinkError, match=rf"chunk 2 of its copy at commit Ts {TS} is short in topic {copied_topic} "
                                        rf"partition {one.partition}: expected \d+ rows, seen \d+"):
        feed_all_but(records, copied_topic, tmp_path / "b.db", lambda r: r is one)
    with sqlite3.connect(tmp_path / "b.db") as conn:  # nothing of the cut was applied
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'items'").fetchone() == (0,)
    core = feed_all_but(records, copied_topic, tmp_path / "c.db", lambda r: False)  # the same records, all of them
    assert core.applied == CHECKPOINT and core.stats.chunks_verified == 3
    assert core.stats.offset_gaps == 0
