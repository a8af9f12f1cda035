"""CommittedRecords decides transactions from the log's markers (sinks/kafka/txnread.py), with the batches the fetcher
would have unpacked given directly: what a broker that shows aborted records (tansu) makes the sink's readers see."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sinks.kafka.txnread import Batch, CommittedRecords

pytestmark = pytest.mark.unit

P = ("meta", 0)


class _Fetcher:
    class PartitionRecords:  # kafka-python's, as far as CommittedRecords subclasses it
        def _unpack_records(self, tp: Any, records: Any, kd: Any, vd: Any) -> Any:
            return iter(())


@dataclass
class _Consumer:
    _fetcher: Any


@dataclass
class R:
    offset: int
    value: str
    topic: str = P[0]
    partition: int = P[1]


def reader() -> CommittedRecords:
    return CommittedRecords(_Consumer(_Fetcher()))


def data(base: int, last: int, pid: int, txn: bool = True) -> Batch:
    return Batch(P, base, last, pid, txn, False)


def marker(offset: int, pid: int, abort: bool) -> Batch:
    return Batch(P, offset, offset, pid, True, True, abort)


def feed(c: CommittedRecords, batches: list[Batch], records: list[R]) -> list[str]:
    c.saw(batches)  # what the fetcher hook reports
    return [r.value for r in c.take(records)]


def test_an_aborted_position_is_dropped_and_a_committed_one_released() -> None:
    c = reader()
    got = feed(c, [data(0, 0, 7), marker(1, 7, False), data(2, 2, 7), marker(3, 7, True), data(4, 4, 7),
                   marker(5, 7, False)], [R(0, "ts=109"), R(2, "ts=114"), R(4, "marker")])
    assert got == ["ts=109", "marker"]
    assert c.aborted == 1 and c.held == 0


def test_an_open_transaction_is_held_until_its_marker_arrives_in_a_later_poll() -> None:
    c = reader()
    assert feed(c, [data(0, 1, 7), data(2, 2, -1, txn=False)], [R(0, "a"), R(1, "b"), R(2, "plain")]) == ["plain"]
    assert c.held == 2
    assert feed(c, [marker(3, 7, False)], []) == ["a", "b"]
    assert c.held == 0


def test_a_marker_decides_only_its_own_producer() -> None:
    c = reader()
    got = feed(c, [data(0, 0, 7), data(1, 1, 8), marker(2, 8, True)], [R(0, "seven"), R(1, "eight")])
    assert got == [] and c.held == 1 and c.aborted == 1
    assert feed(c, [marker(3, 7, False)], []) == ["seven"]


def test_a_producer_reused_across_epochs_is_decided_marker_by_marker() -> None:
    """tansu keeps one producer id per transactional id: the successor's transaction follows the abort marker the
    broker wrote for its predecessor's."""
    c = reader()
    got = feed(c, [data(0, 0, 7), marker(1, 7, True), data(2, 2, 7)], [R(0, "dead"), R(2, "successor")])
    assert got == [] and c.held == 1
    assert feed(c, [marker(3, 7, False)], []) == ["successor"]
