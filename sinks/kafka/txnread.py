"""Transaction markers read by the client: ``read_committed`` that does not depend on the broker's abort list.

Apache Kafka keeps aborted transactional records from ``read_committed`` consumers by listing the aborted
transactions in each fetch answer; kafka-python (and librdkafka) filter by that list only. A broker that writes the
commit/abort markers into the log but does not list aborted transactions (tansu 0.6: ``../shared/ENVIRONMENT.md``,
``tests/integration/test_kafka_broker_isolation.py``) lets every aborted record through. For the sink's metadata
topic that broke exactly-once: a capture SIGKILLed between sending its position and committing the transaction left
a position record that the broker then aborted, the next capture read it back as committed, and skipped the
transactions it claimed (found by ``test_capture_kills_under_writes_then_the_consumer_rebuilds_the_tables``
under load: 342 changes missing for a plain ``read_committed`` consumer).

:class:`CommittedRecords` decides from the log itself, as a broker does: it watches each record batch the consumer
unpacks (producer id, transactional flag, control marker), holds the records of a transaction until its marker is
read, then releases them (commit) or drops them (abort); records of non-transactional batches pass at once. A
transaction whose marker has not been read yet stays held (what the last stable offset does on Kafka), so nothing
undecided is ever taken as committed. On Apache Kafka it changes nothing: aborted batches never reach it.

It observes kafka-python's fetcher (``Fetcher.PartitionRecords._unpack_records``, kafka-python 3.0, pinned in
pyproject.toml) on one consumer instance only; ``tests/integration/test_kafka_txnread.py`` fails if that hook stops
seeing batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(slots=True)
class Batch:
    """What the fetcher saw of one record batch."""

    partition: tuple[str, int]
    base: int
    last: int
    producer_id: int
    transactional: bool
    control: bool
    abort: bool | None = None  # a control batch's marker: True abort, False commit


class _Spy:
    """Wraps the record set the fetcher unpacks: notes every batch, changes nothing of what it returns."""

    __slots__ = ("_records", "_tp", "_out")

    def __init__(self, records: Any, tp: Any, out: list[Batch]) -> None:
        self._records, self._tp, self._out = records, tp, out

    def next_batch(self) -> Any:
        b = self._records.next_batch()
        if b is not None and getattr(b, "magic", 0) == 2:
            control = bool(b.is_control_batch)
            abort = None
            if control:  # the marker's record, read from a copy (the fetcher reads the batch itself)
                marker = next(iter(type(b)(b._buffer)), None)  # noqa: SLF001 - kafka-python's batch buffer
                abort = bool(marker.abort) if marker is not None else None
            pid = b.producer_id if b.has_producer_id() else -1
            self._out.append(Batch((self._tp.topic, self._tp.partition), b.base_offset, b.last_offset, pid,
                                   bool(b.is_transactional), control, abort))
        return b

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)


def watch_batches(consumer: Any, out: list[Batch]) -> None:
    """Append every record batch ``consumer`` (kafka-python) unpacks to ``out`` as it reaches it, before its records
    are returned: the fetcher's ``PartitionRecords`` replaced by a subclass that watches (several watchers chain)."""
    fetcher = consumer._fetcher  # noqa: SLF001 - the one hook kafka-python has (see the module docstring)
    base = fetcher.PartitionRecords

    class Watched(base):  # type: ignore[misc, valid-type]
        def _unpack_records(self, tp: Any, records: Any, key_deserializer: Any, value_deserializer: Any) -> Any:
            return super()._unpack_records(tp, _Spy(records, tp, out), key_deserializer, value_deserializer)

    fetcher.PartitionRecords = Watched


class CommittedRecords:
    """Filters what one kafka-python consumer returns down to committed records (see the module docstring).

    Use: ``f = CommittedRecords(consumer)`` right after creating the consumer, then ``f.take(records)`` with the
    records of each ``poll``. Records are returned as they are decided: a non-transactional record at once, a
    transaction's records when its commit marker has been read (in offset order within the transaction). Thread: the
    consumer's."""

    def __init__(self, consumer: Any) -> None:
        self._seen: list[Batch] = []
        watch_batches(consumer, self._seen)
        self._data: dict[tuple[str, int], list[Batch]] = {}  # per partition: data batches whose records may come
        self._markers: list[Batch] = []  # control batches not applied yet, in the order read
        self._held: dict[tuple[tuple[str, int], int], list[Any]] = {}  # (partition, producer id) -> open txn records
        self.aborted = 0  # records dropped: their transaction's marker says abort
        self.batches = 0  # batches seen (a test's proof that the hook works)

    def saw(self, batches: Iterable[Batch]) -> None:
        """Record batches as read from the log (what the fetcher hook reports; a test without a fetcher gives them
        here), to be decided at the next :meth:`take`."""
        self._seen.extend(batches)

    def take(self, records: Iterable[Any]) -> list[Any]:
        """The records among ``records`` (and held from earlier calls) that are known committed now."""
        for b in self._seen:
            self.batches += 1
            (self._markers if b.control else self._data.setdefault(b.partition, [])).append(b)
        self._seen.clear()
        out: list[Any] = []
        for r in records:
            part = (r.topic, r.partition)
            b = self._batch_of(part, r.offset)
            if b is not None and b.transactional:
                self._held.setdefault((part, b.producer_id), []).append(r)
            else:
                out.append(r)
        for m in self._markers:
            key = (m.partition, m.producer_id)
            held = self._held.get(key)
            if held is None or held[0].offset > m.base:
                # no record of it held yet: a marker read ahead of its records cannot happen (the log has them
                # first); an abort marker of a transaction whose records this reader never saw is nothing to do
                continue
            decided = [r for r in held if r.offset < m.base]
            rest = held[len(decided):]
            if rest:
                self._held[key] = rest
            else:
                del self._held[key]
            if m.abort:
                self.aborted += len(decided)
            else:
                out.extend(decided)
        self._markers.clear()
        return out

    def _batch_of(self, part: tuple[str, int], offset: int) -> Batch | None:
        batches = self._data.get(part)
        if not batches:
            return None
        while len(batches) > 1 and batches[0].last < offset:  # records come in offset order per partition
            batches.pop(0)
        for b in batches:
            if b.base <= offset <= b.last:
                return b
        return None

    @property
    def held(self) -> int:
        """Records of transactions whose marker has not been read yet."""
        return sum(len(rs) for rs in self._held.values())
