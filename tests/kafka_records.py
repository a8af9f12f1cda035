"""Reading a topic the way a plain kafka-python consumer does, optionally filtered by the log's transaction markers
(:class:`sinks.kafka.txnread.CommittedRecords`): for tests of what the broker and Tidewater's readers show."""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from playground.servers import KafkaServer
from sinks.kafka.txnread import CommittedRecords


def values(server: KafkaServer, topic: str, isolation: str, quiet: float = 1.5, *, markers: bool = False
           ) -> list[bytes]:
    """Every record's value, as a plain consumer reads it (``markers``: filtered by the log's transaction markers,
    :class:`sinks.kafka.txnread.CommittedRecords`)."""
    return [r.value for r in records(server, topic, isolation, quiet, markers=markers)]


def records(server: KafkaServer, topic: str, isolation: str = "read_committed", quiet: float = 1.5, *,
            markers: bool = False, partitions: int = 1) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, isolation_level=isolation, enable_auto_commit=False)
    try:
        committed = CommittedRecords(consumer) if markers else None
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:  # from offset 0, not the broker's EARLIEST (tansu: sinks/kafka/logstart.py)
            consumer.seek(tp, 0)
        out: list[Any] = []
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            polled = [r for part in consumer.poll(timeout_ms=200).values() for r in part]
            if polled:
                last = time.monotonic()
            out.extend(committed.take(polled) if committed is not None else polled)
        if committed is not None:
            assert committed.batches > 0, "the fetcher hook saw no record batch (kafka-python changed?)"
        return out
    finally:
        consumer.close()
