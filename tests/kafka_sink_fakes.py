"""An in-memory twin of ``sinks.kafka.transport.KafkaTransport`` for unit tests of the Kafka sink and the consumer
library: topics with partitions, records with headers, transactions (committed records become visible; aborted ones
are dropped, as Apache Kafka's read_committed consumers see them), injectable failures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdc.errors import SinkError, SinkUnavailable
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.kafka.consumer import Record
from sinks.kafka.options import KafkaOptions
from sinks.kafka.topics import TopicInfo
from sinks.kafka.transport import message_size


@dataclass
class FakeBroker:
    """Topics -> partitions -> records (committed view); ``limits`` per topic."""

    partitions: int = 3
    topics: dict[str, list[list[Record]]] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    fail_next_flush: BaseException | None = None

    def create(self, topic: str, n: int | None = None) -> None:
        if topic not in self.topics:
            self.topics[topic] = [[] for _ in range(n or self.partitions)]

    def records(self, topic: str) -> list[Record]:
        """Every record of ``topic`` (partition by partition)."""
        return [r for part in self.topics.get(topic, []) for r in part]


class FakeTransport:
    instances: list[FakeTransport] = []

    def __init__(self, broker: FakeBroker, options: KafkaOptions, transactional_id: str | None) -> None:
        self.broker = broker
        self.options = options
        self.transactional_id = transactional_id
        self._pending: list[tuple[str, int, Record]] = []
        self.in_txn = False
        self.commits = 0
        self.aborts = 0
        self.flushes = 0
        self.closed = False
        FakeTransport.instances.append(self)

    def topic(self, topic: str, partitions: int | None = None) -> TopicInfo:
        self.broker.create(topic, partitions)
        limit = min(self.broker.limits.get(topic, self.options.max_message_bytes), self.options.max_message_bytes)
        return TopicInfo(topic, len(self.broker.topics[topic]), limit)

    def partitions(self, topic: str) -> int:
        return min(self.topic(topic).partitions, self.options.partition_num or 1 << 30)

    def all_partitions(self, topic: str) -> int:
        return self.topic(topic).partitions

    def check(self) -> None:
        self.topic(self.options.topic)

    def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        if self.transactional_id is not None and not self.in_txn:
            raise SinkError("send outside a transaction")
        info = self.topic(topic)
        if message_size(key, value, headers) > info.max_message_bytes:
            raise SinkError(f"fake: message too large for {topic}")
        assert 0 <= partition < info.partitions
        self._pending.append((topic, partition, Record(topic, partition, -1, key, value, list(headers or ()))))

    def _deliver(self) -> int:
        n = len(self._pending)
        for topic, partition, r in self._pending:
            part = self.broker.topics[topic][partition]
            r.offset = len(part)
            part.append(r)
        self._pending = []
        return n

    def flush(self) -> int:
        self.flushes += 1
        if self.broker.fail_next_flush is not None:
            exc, self.broker.fail_next_flush = self.broker.fail_next_flush, None
            self._pending = []
            raise exc
        if self.transactional_id is not None:
            return len(self._pending)
        return self._deliver()

    def begin(self) -> None:
        assert self.transactional_id is not None and not self.in_txn
        self.in_txn = True

    def commit(self) -> int:
        assert self.in_txn
        self.flush()
        self.in_txn = False
        self.commits += 1
        return self._deliver()

    def abort(self) -> None:
        self.in_txn = False
        self.aborts += 1
        self._pending = []

    def close(self) -> None:
        self.closed = True


def factory(broker: FakeBroker) -> Any:
    return lambda options, tid: FakeTransport(broker, options, tid)


def unavailable() -> SinkUnavailable:
    return SinkUnavailable("fake broker down")


def col(name: str, base: str = "int8", oid: int = 20, *, key: bool = False) -> ColumnSchema:
    return ColumnSchema(name, oid, base, False, base, nullable=not key, is_key=key)


def table(name: str = "t", *, keyed: bool = True, version: int = 0, extra: tuple[ColumnSchema, ...] = ()
          ) -> TableSchema:
    cols = (col("id", key=keyed), col("v", "text", 25), *extra)
    return TableSchema(TableName("public", name), cols, ("id",) if keyed else ("id", "v"), "d" if keyed else "f",
                       1000 + len(name), version, keyed)


def ins(schema: TableSchema, ts: int, id_: int, v: str = "x", **more: Any) -> RowChange:
    return RowChange(OpType.INSERT, schema, ts, ts / 1000, {"id": id_, "v": v, **more})


def upd(schema: TableSchema, ts: int, id_: int, v: str, old_id: int | None = None) -> RowChange:
    old = {"id": old_id} if old_id is not None else None
    return RowChange(OpType.UPDATE, schema, ts, ts / 1000, {"id": id_, "v": v}, old)


def dele(schema: TableSchema, ts: int, id_: int) -> RowChange:
    return RowChange(OpType.DELETE, schema, ts, ts / 1000, None, {"id": id_})


class FakeMetaReader:
    """``sinks.kafka.metaread.MetaReader`` over a :class:`FakeBroker` (committed records only)."""

    def __init__(self, broker: FakeBroker, options: KafkaOptions) -> None:
        from sinks.kafka.meta import meta_topic_name

        self.broker = broker
        self.topic = meta_topic_name(options.topic)
        self.records: dict[str, dict[str, Any]] = {}
        self._offset = 0

    def read_all(self, transport: Any) -> dict[str, dict[str, Any]]:
        return self.poll()

    def poll(self) -> dict[str, dict[str, Any]]:
        import json

        self.broker.create(self.topic, 1)
        part = self.broker.topics[self.topic][0]
        for r in part[self._offset:]:
            self.records[r.key.decode()] = json.loads(r.value)
        self._offset = len(part)
        return self.records

    def close(self) -> None:
        pass


class MemoryApplier:
    """A consumer target in memory: tables by key (keyless: lists), and every applied event in order."""

    def __init__(self, start: int = 0) -> None:
        self.tables: dict[TableName, dict[Any, dict[str, Any]]] = {}
        self.log: list[Any] = []
        self.cuts: list[int] = []
        self.observed: list[Any] = []
        self.start = start

    def open(self) -> int:
        return self.start

    def apply(self, events: list[Any], watermark: int, watermark_time: float) -> None:
        from sinks.codec import MessageKind

        for e in events:
            ev = e.ev
            self.log.append(e)
            rows = self.tables.setdefault(ev.table, {})
            if ev.op is OpType.TRUNCATE:
                rows.clear()
            elif ev.kind is MessageKind.DDL:
                continue
            elif ev.op is OpType.DELETE:
                rows.pop(tuple(sorted((ev.key or {}).items())), None)
            else:
                names = sorted(ev.key or {})
                if ev.op is OpType.UPDATE:
                    rows.pop(tuple(sorted((ev.key or {}).items())), None)
                rows[tuple((k, (ev.values or {})[k]) for k in names)] = dict(ev.values or {})
        self.cuts.append(watermark)

    def observe(self, event: Any) -> None:
        self.observed.append(event)

    def close(self) -> None:
        pass
