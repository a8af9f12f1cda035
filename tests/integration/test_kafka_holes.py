"""The consumer library's reader at the end of a partition that several producers write at once (what a changefeed's
spans, its owner's watermarks and copy writers do to every partition): every record is read, once, in offset order.

The test broker numbers a batch before it stores it (tansu 0.6, ``dynostore.rs``: the high watermark moves, then the
batch is put), so a fetch at the end of the log can be answered with a later producer's batch while an earlier one is
still being stored, and kafka-python's position moves past the earlier one for good (``sinks/kafka/holes.py``). The
plain kafka-python consumer beside the reader shows whether the broker did that in this run (``skipped``); the
reader must never miss a record either way."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from playground.servers import KafkaServer
from sinks.kafka.consumer import KafkaReader

pytestmark = pytest.mark.integration

PRODUCERS = 4
MESSAGES = 300  # per producer, each flushed alone: one single-record batch per produce request, as a span's write


def _produce(server: KafkaServer, topic: str, index: int, errors: list[BaseException]) -> None:
    try:
        p = KafkaProducer(bootstrap_servers=server.bootstrap, enable_idempotence=True, linger_ms=0)
        try:
            for n in range(MESSAGES):
                p.send(topic, f"{index}/{n}".encode(), partition=0)
                p.flush()
        finally:
            p.close()
    except BaseException as exc:  # noqa: BLE001 - re-raised by the test
        errors.append(exc)


class _Tail:
    """A plain kafka-python consumer at the end of partition 0 (no Tidewater code): the offsets it was given."""

    def __init__(self, server: KafkaServer, topic: str) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, isolation_level="read_committed",
                                      enable_auto_commit=False, group_id=None, auto_offset_reset="none")
        tp = TopicPartition(topic, 0)
        self.consumer.assign([tp])
        self.consumer.seek(tp, 0)
        self.offsets: list[int] = []

    def poll(self) -> None:
        for records in self.consumer.poll(timeout_ms=50, max_records=20_000).values():
            self.offsets.extend(r.offset for r in records)


def test_the_reader_misses_no_record_of_a_partition_written_by_several_producers_at_once(
        kafka_server: KafkaServer, kafka_topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap)
    try:
        admin.create_topics([NewTopic(kafka_topic, 1, 1)])
    finally:
        admin.close()
    reader = KafkaReader([kafka_server.bootstrap], [kafka_topic])
    tail = _Tail(kafka_server, kafka_topic)
    got: list[Any] = []
    errors: list[BaseException] = []
    producers = [threading.Thread(target=_produce, args=(kafka_server, kafka_topic, i, errors))
                 for i in range(PRODUCERS)]
    try:
        reader.assign(10)
        for t in producers:
            t.start()
        while any(t.is_alive() for t in producers):
            got.extend(reader.poll(0.05))  # at the end of the log while the producers write
            tail.poll()
        for t in producers:
            t.join()
        empty = 0
        while len(got) < PRODUCERS * MESSAGES and empty < 5:  # every message is acknowledged (stored): read on
            more = reader.poll(1.0)  # until all are read or polls find nothing more (a poll that read a hole
            tail.poll()  # again returns nothing: not the end)
            empty = 0 if more else empty + 1
            got.extend(more)
        tail.poll()
    finally:
        for t in producers:
            t.join(60)
        reader.close()
        tail.consumer.close()
    assert not errors, errors
    skipped = sorted(set(range(max(tail.offsets, default=-1) + 1)) - set(tail.offsets))  # (below its last one)
    print(f"\nthe broker's answers skipped {len(skipped)} offset(s) for a plain consumer: {skipped[:10]}")
    assert [r.offset for r in got] == list(range(PRODUCERS * MESSAGES))
    values = sorted(r.value for r in got)
    assert values == sorted(f"{i}/{n}".encode() for i in range(PRODUCERS) for n in range(MESSAGES))
