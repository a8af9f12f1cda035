"""Readers that must see every record start at offset 0 themselves (sinks/kafka/logstart.py): the test broker answers
ListOffsets EARLIEST with the batch it stored first, which after two concurrent first writes of a partition is not the
lowest offset; the consumer library then skipped the initial copy's rows of one partition (issue 20)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import OffsetOutOfRangeError

from cdc.errors import SinkError
from sinks.kafka.consumer import KafkaReader
from sinks.kafka.metaread import MetaReader
from sinks.kafka.options import parse_kafka_uri

pytestmark = pytest.mark.unit


class FakeConsumer:
    """Records how positions are set; ``earliest`` is what a broker would answer to EARLIEST (never asked)."""

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.seeks: dict[TopicPartition, int] = {}
        self.beginning_asked = False
        self.fail: Exception | None = None

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = list(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.beginning_asked = True

    def poll(self, **_: Any) -> dict[Any, Any]:
        if self.fail is not None:
            raise self.fail
        return {}

    def close(self) -> None:
        pass


def test_the_consumer_library_reads_every_partition_from_offset_0_not_the_brokers_earliest() -> None:
    made: list[FakeConsumer] = []
    reader = KafkaReader(["b:9092"], ["cdc"], consumer_factory=lambda **c: made.append(FakeConsumer(**c)) or made[-1])
    assert reader.assign() == [("cdc", 0), ("cdc", 1), ("cdc", 2)]
    consumer = made[0]
    assert consumer.seeks == {TopicPartition("cdc", p): 0 for p in range(3)}
    assert not consumer.beginning_asked
    assert consumer.config["auto_offset_reset"] == "none"  # an offset 0 that is gone raises, never jumps


def test_a_partition_that_no_longer_starts_at_0_stops_the_consumer_naming_it() -> None:
    made: list[FakeConsumer] = []
    reader = KafkaReader(["b:9092"], ["cdc"], consumer_factory=lambda **c: made.append(FakeConsumer(**c)) or made[-1])
    reader.assign()
    made[0].fail = OffsetOutOfRangeError({TopicPartition("cdc", 2): 0})
    with pytest.raises(SinkError, match="cdc partition 2 no longer starts at offset 0"):
        reader.poll(0.1)


def test_the_metadata_reader_starts_at_offset_0_too() -> None:
    made: list[FakeConsumer] = []
    reader = MetaReader(parse_kafka_uri("kafka://b:9092/cdc?protocol=canal-json"),
                        consumer_factory=lambda **c: made.append(FakeConsumer(**c)) or made[-1])
    assert reader.poll() == {}  # opens the consumer it reads with
    assert made[0].seeks == {TopicPartition("_tidewater.cdc", 0): 0} and not made[0].beginning_asked
