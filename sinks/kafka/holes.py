"""Reading a partition's log without holes: a fetch answer that skips offsets is read again from where it skipped.

The test broker hands out a batch's offsets before it stores the batch (tansu 0.6, ``dynostore.rs`` ``produce``: the
partition's high watermark moves first, the batch object is put after), and its ``fetch`` returns the batches stored
below the high watermark from the asked offset on. While two producers write one partition (two spans, a span and the
owner's watermarks, a copy writer), a reader at the end of the log can be answered with the later batch while the
earlier one is not stored yet: kafka-python moves its position past both and never reads the earlier one. For the
consumer library that is a row lost for good (canal-json carries whole rows, so the next change of the same row
hides it again) and, until then, a cut that holds one half of an upstream transaction: a reader of the rebuilt
tables sees a total that never existed (the likely cause of ``tests/e2e/test_kafka_consistency.py``'s 27 torn reads in
one run of the suite, 2026-11-29: docs/benchmarks.md). The same broker's log start has the same cause
(:mod:`sinks.kafka.logstart`).

:class:`ContiguousRecords` watches the record batches the consumer unpacks (:func:`sinks.kafka.txnread.watch_batches`)
and keeps, per partition, the offset the next batch must start at: a log without compaction has no gaps between
batches (control batches, aborted transactions' batches and batches a client filters are batches too). A batch that
starts above it is a hole: the records of that partition from the hole on are held back, not returned, and the
consumer is sought back to just after the last record returned, so the next poll reads the hole again, which the
broker has stored by then. A hole still there after ``wait`` seconds (a broker that really removed records, as
compaction does) is passed and logged as a warning naming the partition and the offsets; the caller's own gap count
(``sinks.kafka.consumer.Stats.offset_gaps``) shows it too.

Cost: one look per batch and per partition of a poll; nothing per record unless a poll holds a hole. Threading: the
consumer's thread. Only a kafka-python consumer has batches to watch; without a fetcher (a test's fake consumer)
records pass as they come.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sinks.kafka.txnread import Batch, watch_batches

log = logging.getLogger(__name__)

HOLE_WAIT = 10.0  # seconds a hole is read again before it is passed (a broker stores a batch within milliseconds)


class ContiguousRecords:
    """The records of one kafka-python consumer's polls, each partition without holes (see the module docstring).

    Use: ``c = ContiguousRecords(consumer)`` right after creating the consumer, ``c.start(partition, offset)`` for
    every partition sought to ``offset``, then ``c.take(polled)`` with each ``poll``'s answer (partition -> records
    in offset order); it returns the records to use, in the same form."""

    def __init__(self, consumer: Any, *, wait: float = HOLE_WAIT, clock: Callable[[], float] = time.monotonic,
                 seek: Callable[[tuple[str, int], int], None] | None = None) -> None:
        self._seen: list[Batch] = []
        watch_batches(consumer, self._seen)
        self._consumer = consumer
        self._seek = seek or self._seek_consumer
        self._wait, self._clock = wait, clock
        self._expected: dict[tuple[str, int], int] = {}  # per partition: where the next batch must start
        self._next: dict[tuple[str, int], int] = {}  # per partition: the offset after the last record returned
        self._holes: dict[tuple[tuple[str, int], int], float] = {}  # (partition, offset) -> first seen (clock)
        self.reread = 0  # polls whose answer held a hole and were read again
        self.passed = 0  # holes passed after ``wait``

    def saw(self, batches: Iterable[Batch]) -> None:
        """Record batches as the fetcher unpacked them (the hook does this; a test without a fetcher calls it)."""
        self._seen.extend(batches)

    def start(self, partition: tuple[str, int], offset: int) -> None:
        """``partition`` is read from ``offset`` on (the consumer was sought there)."""
        self._expected[partition] = self._next[partition] = offset

    def take(self, polled: Mapping[Any, Sequence[Any]]) -> dict[Any, Sequence[Any]]:
        """``polled`` without the records at and after a hole of their partition (which are read again)."""
        holes = self._find_holes()
        out: dict[Any, Sequence[Any]] = {}
        for tp, records in polled.items():
            part = (tp.topic, tp.partition)
            hole = holes.get(part)
            if hole is not None:
                records = records[:bisect.bisect_left([r.offset for r in records], hole)]
            if records:
                out[tp] = records
                self._next[part] = records[-1].offset + 1
        for part in holes:
            self.reread += 1
            self._seek(part, self._next.get(part, 0))
        return out

    def _find_holes(self) -> dict[tuple[str, int], int]:
        """The first hole of each partition among the batches seen since the last call."""
        holes: dict[tuple[str, int], int] = {}
        expected = self._expected
        for b in self._seen:
            part = b.partition
            if part in holes:
                continue  # read again from before the hole: what follows it is seen again
            at = expected.get(part)
            if at is not None and b.base > at and not self._passed(part, at, b.base):
                holes[part] = at
                continue
            if at is None or b.last + 1 > at:
                expected[part] = b.last + 1
        self._seen.clear()
        if self._holes:  # (holes filled since: forgotten)
            self._holes = {k: t for k, t in self._holes.items() if holes.get(k[0]) == k[1]}
        return holes

    def _passed(self, part: tuple[str, int], at: int, base: int) -> bool:
        """Whether the hole at ``at`` (the next batch at ``base``) has been read again for ``wait`` seconds: then it
        is passed, logged."""
        now = self._clock()
        first = self._holes.setdefault((part, at), now)
        if now - first < self._wait:
            return False
        del self._holes[(part, at)]
        self.passed += 1
        log.warning("topic %s partition %d: offsets %d..%d are not in the broker's log %.0f s after a batch above "
                    "them was (deleted records, or a broker that lost them): passed; their records, if any, are "
                    "not read", part[0], part[1], at, base - 1, now - first)
        return True

    def _seek_consumer(self, part: tuple[str, int], offset: int) -> None:
        from kafka import TopicPartition

        self._consumer.seek(TopicPartition(*part), offset)
