"""ContiguousRecords (sinks/kafka/holes.py): a poll whose batches skip offsets is read again from where it skipped, as
the consumer library's reader must when a broker stores a partition's batches in another order than it numbered
them (tansu 0.6 under two producers: the torn reads of tests/e2e/test_kafka_consistency.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from sinks.kafka.consumer import KafkaReader
from sinks.kafka.holes import ContiguousRecords
from sinks.kafka.metaread import MetaReader
from sinks.kafka.options import parse_kafka_uri
from sinks.kafka.txnread import Batch

pytestmark = pytest.mark.unit

P = ("cdc", 1)


class TP(NamedTuple):
    topic: str
    partition: int


T = TP(*P)


class _Fetcher:
    class PartitionRecords:  # kafka-python's, as far as the batch hook subclasses it: it reads every batch
        def _unpack_records(self, tp: Any, records: Any, kd: Any, vd: Any) -> Any:
            while records.next_batch() is not None:
                pass
            return iter(())


@dataclass
class _KafkaBatch:
    """A data record batch as kafka-python's DefaultRecordBatch shows it to the hook."""

    base_offset: int
    last_offset: int
    magic: int = 2
    is_control_batch: bool = False
    is_transactional: bool = False
    producer_id: int = -1

    def has_producer_id(self) -> bool:
        return False


@dataclass
class _RecordSet:
    batches: list[_KafkaBatch]

    def next_batch(self) -> _KafkaBatch | None:
        return self.batches.pop(0) if self.batches else None


@dataclass
class R:
    offset: int
    topic: str = P[0]
    partition: int = P[1]
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class _Consumer:
    """What the reader and the hook use of a kafka-python consumer; ``polls`` are (batches seen, records) pairs."""

    polls: list[tuple[list[Batch], list[R]]] = field(default_factory=list)
    seeks: list[tuple[Any, int]] = field(default_factory=list)
    _fetcher: Any = field(default_factory=_Fetcher)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {P[1]}

    def assign(self, tps: list[Any]) -> None:
        pass

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append(((tp.topic, tp.partition), offset))

    def poll(self, timeout_ms: int, max_records: int) -> dict[Any, list[R]]:
        batches, records = self.polls.pop(0)
        tp = TP(*batches[0].partition) if batches else T
        unpacked = _RecordSet([_KafkaBatch(b.base, b.last) for b in batches])  # through the fetcher's (watched) class
        list(self._fetcher.PartitionRecords()._unpack_records(tp, unpacked, None, None))
        return {tp: records} if records else {}

    def close(self) -> None:
        pass


def data(base: int, last: int | None = None) -> Batch:
    return Batch(P, base, base if last is None else last, -1, False, False)


def offsets(polled: dict[Any, Any]) -> list[int]:
    return [r.offset for rs in polled.values() for r in rs]


def contiguous(clock: list[float] | None = None) -> tuple[ContiguousRecords, list[tuple[tuple[str, int], int]]]:
    seeks: list[tuple[tuple[str, int], int]] = []
    now = clock if clock is not None else [0.0]
    c = ContiguousRecords(_Consumer(), wait=10.0, clock=lambda: now[0],
                          seek=lambda part, offset: seeks.append((part, offset)))
    c.start(P, 0)
    return c, seeks


def test_a_batch_stored_late_is_read_again_not_skipped() -> None:
    c, seeks = contiguous()
    c.saw([data(0, 1), data(3)])  # offset 2 numbered but not stored yet: the broker answered with 3
    assert offsets(c.take({T: [R(0), R(1), R(3)]})) == [0, 1]
    assert seeks == [(P, 2)] and c.reread == 1
    c.saw([data(2), data(3)])  # read again from 2: stored by now
    assert offsets(c.take({T: [R(2), R(3)]})) == [2, 3]
    assert seeks == [(P, 2)] and c.reread == 1


def test_markers_and_filtered_batches_are_no_hole() -> None:
    """A transaction's marker and an aborted batch the client drops take offsets but are batches: nothing is held."""
    c, seeks = contiguous()
    marker = Batch(P, 2, 2, 7, True, True, False)
    aborted = Batch(P, 3, 5, 8, True, False)
    c.saw([data(0, 1), marker, aborted, data(6)])
    assert offsets(c.take({T: [R(0), R(1), R(6)]})) == [0, 1, 6]
    assert seeks == []


def test_a_hole_at_the_start_of_the_log_is_read_again() -> None:
    c, seeks = contiguous()
    c.saw([data(4, 6)])
    assert offsets(c.take({T: [R(4), R(5), R(6)]})) == []
    assert seeks == [(P, 0)]


def test_records_not_returned_yet_before_the_hole_are_read_again_too() -> None:
    """The hole's batch was unpacked in this poll but the poll returned only the first records before it (max_records):
    the consumer goes back to just after the last record returned, not to the hole."""
    c, seeks = contiguous()
    c.saw([data(0, 9), data(11)])
    assert offsets(c.take({T: [R(0), R(1), R(2)]})) == [0, 1, 2]
    assert seeks == [(P, 3)]


def test_a_hole_still_there_after_the_wait_is_passed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    clock = [100.0]
    c, seeks = contiguous(clock)
    c.saw([data(0), data(2)])
    assert offsets(c.take({T: [R(0), R(2)]})) == [0]
    clock[0] = 105.0
    c.saw([data(2)])  # (read again from 1: the broker still has no offset 1)
    assert offsets(c.take({T: [R(2)]})) == []
    clock[0] = 110.0
    c.saw([data(2)])
    with caplog.at_level(logging.WARNING, logger="sinks.kafka.holes"):
        assert offsets(c.take({T: [R(2)]})) == [2]
    assert seeks == [(P, 1), (P, 1)] and c.passed == 1
    assert "offsets 1..1 are not in the broker's log" in caplog.text


def test_the_consumer_librarys_reader_returns_the_skipped_record_once_the_broker_has_it() -> None:
    """KafkaReader.poll with the batches seen through the fetcher hook: without ContiguousRecords the reader returns
    offsets 0 and 2 and never 1."""
    consumer = _Consumer()

    def factory(**kwargs: Any) -> _Consumer:
        return consumer

    reader = KafkaReader(["127.0.0.1:1"], [P[0]], consumer_factory=factory)
    reader.assign(timeout=1)
    assert consumer.seeks == [(P, 0)]
    consumer.polls = [([data(0), data(2)], [R(0), R(2)]), ([data(1), data(2)], [R(1), R(2)])]
    assert [r.offset for r in reader.poll(0)] == [0]
    assert consumer.seeks[-1] == (P, 1)
    assert [r.offset for r in reader.poll(0)] == [1, 2]


def test_the_sinks_metadata_reader_does_not_take_an_older_position_for_the_latest() -> None:
    """The metadata topic's one partition is written by every span's producer: a span's later position stored before
    another's earlier record must not hide that record (MetaReader reads the hole again)."""
    consumer = _Consumer()
    reader = MetaReader(parse_kafka_uri("kafka://b:9092/cdc?protocol=canal-json"), consumer_factory=lambda **c: consumer)
    M = ("_tidewater.cdc", 0)  # noqa: N806

    def rec(offset: int, key: str, ts: int) -> R:
        return R(offset, *M, key=key.encode(), value=f'{{"ts": {ts}}}'.encode())

    def batch(offset: int) -> Batch:
        return Batch(M, offset, offset, -1, False, False)

    consumer.polls = [([batch(0), batch(2)], [rec(0, "pos/a", 1), rec(2, "pos/b", 9)]),
                      ([batch(1), batch(2)], [rec(1, "pos/a", 5), rec(2, "pos/b", 9)])]
    assert reader.poll() == {"pos/a": {"ts": 1}}
    assert consumer.seeks[-1] == (M, 1)
    assert reader.poll() == {"pos/a": {"ts": 5}, "pos/b": {"ts": 9}}
