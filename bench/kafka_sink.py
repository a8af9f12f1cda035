"""Rows/s through the Kafka sink (``sinks.kafka.sink.KafkaSink.write``) per protocol, next to the producer ceilings
on the same broker: kafka-python with the transport's settings and, when installed, confluent-kafka (librdkafka).

    python -m bench.kafka_sink [--bootstrap host:port] [--rows 100000] [--txn-rows 100] [--write-rows 20000]
                               [--partitions 3] [--protocols canal-json,open-protocol,debezium] [--runs 3]

The rows are the codec benchmark's (docs/sinks.md, "Tests and performance"): inserts of a 6-column table (bigint
key, text, int, numeric, timestamptz, float8) as the mounter hands them over (positional rows), in transactions of
``--txn-rows``, given to ``write`` ``--write-rows`` at a time (the span's batching: whole transactions, one call,
acknowledged before it returns), dispatched by key over ``--partitions`` partitions. Each sink figure counts from
the first write to the last acknowledgement. Besides it:

- the same with ``kafka-producer=confluent-kafka`` (librdkafka behind the same sink) when it is installed;
- "encode only": the same writes into a transport that drops every message (the sink's own Python cost: dispatch,
  encoding, headers, size checks);
- the producer ceilings: as many messages as the sink sent, of the protocol's average message size, with the
  transport's producer settings (kafka-python) and with librdkafka's defaults plus acks=all and idempotence.

Prints the median and spread of ``--runs`` runs per line (a shared host: compare ratios within one run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.kafka_producer import timed_sends
from cdc.config import DispatcherRule, SinkConfig
from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from playground.servers import KafkaServer
from sinks.kafka.options import KafkaOptions
from sinks.kafka.sink import KafkaSink
from sinks.kafka.topics import TopicInfo

SCHEMA = TableSchema(TableName("public", "bench"), (
    ColumnSchema("id", 20, "int8", False, "bigint", nullable=False, is_key=True),
    ColumnSchema("name", 25, "text", False, "text"),
    ColumnSchema("qty", 23, "int4", False, "integer"),
    ColumnSchema("price", 1700, "numeric", False, "numeric(12,2)", 12 << 16 | 2 + 4),
    ColumnSchema("at", 1184, "timestamptz", False, "timestamp with time zone"),
    ColumnSchema("score", 701, "float8", False, "double precision"),
), ("id",), "d", 7001)
DISPATCH = (DispatcherRule(("public.*",), "", "index-value"),)
AT = dt.datetime(2026, 11, 21, 12, 0, 0, 123456, tzinfo=dt.UTC)


def make_rows(n: int, txn_rows: int) -> list[RowChange]:
    out = []
    for i in range(n):
        ts = 1_000_000 + (i // txn_rows) * 16
        out.append(RowChange(OpType.INSERT, SCHEMA, ts, ts / 1e6,
                             row=(i, f"customer name {i}", i % 1000, Decimal(i % 100000) / 100, AT, i / 7)))
    return out


class NullTransport:
    """Drops every message (the sink's own cost); counts them and their bytes."""

    def __init__(self, options: KafkaOptions, transactional_id: str | None, partitions: int) -> None:
        self.options = options
        self.transactional_id = transactional_id
        self.n = partitions
        self.messages = 0
        self.bytes = 0

    def topic(self, topic: str, partitions: int | None = None) -> TopicInfo:
        return TopicInfo(topic, partitions or self.n, self.options.max_message_bytes)

    def partitions(self, topic: str) -> int:
        return self.n

    def all_partitions(self, topic: str) -> int:
        return self.n

    def check(self) -> None:
        pass

    def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        self.messages += 1
        self.bytes += (len(key) if key else 0) + (len(value) if value else 0)

    def flush(self) -> int:
        return 0

    def close(self) -> None:
        pass


def run_sink(uri: str, rows: list[RowChange], write_rows: int, factory: Any = None) -> tuple[float, KafkaSink]:
    sink = KafkaSink(uri, SinkConfig(dispatchers=DISPATCH), transport_factory=factory)
    sink.check()
    sink.bind_span("bench", 0, 1)
    sink.open_position("bench", 0, 0)
    t0 = time.perf_counter()
    for i in range(0, len(rows), write_rows):
        sink.write(rows[i:i + write_rows])
    elapsed = time.perf_counter() - t0
    sink.close()
    return len(rows) / elapsed, sink


def raw_kafka_python(bootstrap: str, topic: str, messages: int, value: bytes, partitions: int) -> float:
    from kafka import KafkaProducer

    from sinks.kafka.options import parse_kafka_uri
    from sinks.kafka.transport import producer_config

    config = producer_config(parse_kafka_uri(f"kafka://{bootstrap}/{topic}?protocol=canal-json"), None)
    return timed_sends(KafkaProducer(**config), topic, messages, value, partitions)


def raw_confluent(bootstrap: str, topic: str, messages: int, value: bytes, partitions: int) -> float | None:
    try:
        from confluent_kafka import Producer
    except ImportError:
        return None
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "batch.size": 262144})
    producer.produce(topic, value=value, partition=0)
    producer.flush(30)
    t0 = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for i in range(messages):
        while True:
            try:
                produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                poll(0.01)
    producer.flush(60)
    return messages / (time.perf_counter() - t0)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}})
    finally:
        admin.close()


def _line(label: str, rates: list[float], unit: str) -> None:
    print(f"{label:52s} {statistics.median(rates):>9,.0f} {unit}  (runs: {', '.join(f'{r:,.0f}' for r in rates)})",
          flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_sink", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", help="host:port of a running broker (default: start tansu here)")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--txn-rows", type=int, default=100)
    ap.add_argument("--write-rows", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--protocols", default="canal-json,open-protocol,debezium")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    rows = make_rows(args.rows, args.txn_rows)
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-kafka-sink-") as tmp:
        server = None if args.bootstrap else KafkaServer(Path(tmp)).start()
        bootstrap = args.bootstrap or server.bootstrap  # type: ignore[union-attr]
        try:
            print(f"broker {bootstrap}; {args.rows} inserts of a 6-column row, {args.txn_rows}-row transactions, "
                  f"{args.write_rows} rows per write, index-value over {args.partitions} partitions; best of "
                  f"{args.runs} as median", flush=True)
            for protocol in protocols:
                uri = lambda topic, p=protocol: (  # noqa: E731
                    f"kafka://{bootstrap}/{topic}?protocol={p}&partition-num={args.partitions}")
                null: list[NullTransport] = []

                def factory(options: KafkaOptions, tid: str | None, keep: list[NullTransport] = null
                            ) -> NullTransport:
                    keep.append(NullTransport(options, tid, args.partitions))
                    return keep[-1]

                encode = [run_sink(uri("null"), rows, args.write_rows, factory)[0] for _ in range(args.runs)]
                messages, nbytes = null[-1].messages, null[-1].bytes
                avg = max(1, nbytes // max(1, messages))
                _line(f"{protocol}: encode only ({messages} msgs, {avg} B avg)", encode, "rows/s")
                sink_rates = [run_sink(uri(f"bench-{uuid.uuid4().hex[:10]}"), rows, args.write_rows)[0]
                              for _ in range(args.runs)]
                _line(f"{protocol}: KafkaSink.write, acked", sink_rates, "rows/s")
                if importlib.util.find_spec("confluent_kafka") is not None:
                    fast = [run_sink(uri(f"bench-{uuid.uuid4().hex[:10]}") + "&kafka-producer=confluent-kafka", rows,
                                     args.write_rows)[0] for _ in range(args.runs)]
                    _line(f"{protocol}: KafkaSink.write, acked, kafka-producer=confluent-kafka", fast, "rows/s")
                value = b"x" * avg
                ceilings: list[tuple[str, Callable[..., float | None]]] = [
                    ("kafka-python producer (transport settings)", raw_kafka_python),
                    ("confluent-kafka producer", raw_confluent)]
                for label, fn in ceilings:
                    rates = []
                    for _ in range(args.runs):
                        topic = f"bench-{uuid.uuid4().hex[:10]}"
                        create_topic(bootstrap, topic, args.partitions)
                        r = fn(bootstrap, topic, messages, value, args.partitions)
                        if r is None:
                            break
                        rates.append(r)
                    if rates:
                        _line(f"{protocol}: {label}, {avg} B", rates, "msg/s")
                    else:
                        print(f"{protocol}: {label}: not installed (pip install confluent-kafka)")
        finally:
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
