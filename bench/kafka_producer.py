"""The raw Kafka producer ceiling on this machine: messages/s of kafka-python's producer (and of our transport,
which adds the size check and bookkeeping) for small messages, against tansu started here or any broker.

    python -m bench.kafka_producer [--bootstrap host:port] [--messages 200000] [--size 200] [--partitions 3]
                                   [--linger 0,5,20] [--batch 16384,262144] [--runs 3]

Every run sends ``--messages`` messages round-robin over ``--partitions`` partitions of a fresh topic with
acks=all and the idempotent producer (the transport's settings), then flushes; the rate counts until the last
acknowledgement. Prints one line per configuration with the median and the spread of ``--runs`` runs (the host is
shared: compare ratios measured in one run). Later sink benchmarks compare their rows/s with these figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from playground.servers import KafkaServer
from sinks.kafka.options import parse_kafka_uri
from sinks.kafka.transport import KafkaTransport


def _raw(bootstrap: str, topic: str, messages: int, value: bytes, partitions: int, linger: int, batch: int) -> float:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=linger,
                             batch_size=batch, max_in_flight_requests_per_connection=5)
    return timed_sends(producer, topic, messages, value, partitions)


def timed_sends(producer: Any, topic: str, messages: int, value: bytes, partitions: int) -> float:
    """Messages/s of ``messages`` sends of ``value`` round-robin over ``partitions`` through a kafka-python
    ``producer``, flushed (one send first, untimed: metadata and connection before the clock); closes it."""
    try:
        producer.send(topic, value=value, partition=0).get(30)
        t0 = time.perf_counter()
        send = producer.send
        for i in range(messages):
            send(topic, value=value, partition=i % partitions)
        producer.flush()
        return messages / (time.perf_counter() - t0)
    finally:
        producer.close()


def _transport(bootstrap: str, topic: str, messages: int, value: bytes, partitions: int) -> float:
    transport = KafkaTransport(parse_kafka_uri(f"kafka://{bootstrap}/{topic}?protocol=canal-json"
                                               f"&partition-num={partitions}"))
    try:
        transport.send(topic, 0, None, value)
        transport.flush()
        t0 = time.perf_counter()
        send = transport.send
        for i in range(messages):
            send(topic, i % partitions, None, value)
        transport.flush()
        return messages / (time.perf_counter() - t0)
    finally:
        transport.close()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_producer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="host:port of a running broker (default: start tansu here)")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200, help="value bytes per message")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--linger", type=_ints, default=[0, 5, 20], help="linger_ms values (raw producer)")
    parser.add_argument("--batch", type=_ints, default=[16384, 262144], help="batch_size values (raw producer)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    value = b"x" * args.size
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        server = None if args.bootstrap else KafkaServer(Path(tmp)).start()
        bootstrap = args.bootstrap or server.bootstrap  # type: ignore[union-attr]
        try:
            import crc32c  # noqa: F401 - kafka-python checksums record batches 2x faster with it

            crc = "crc32c package present"
        except ImportError:
            crc = "no crc32c package: install kafka-python[crc32c]"
        print(f"broker {bootstrap}; {args.messages} messages of {args.size} bytes over {args.partitions} "
              f"partition(s), acks=all, idempotent; {crc}")
        cases: list[tuple[str, object]] = [
            (f"kafka-python linger_ms={linger} batch_size={batch}", (linger, batch))
            for linger in args.linger for batch in args.batch]
        cases.append(("sinks.kafka.transport (its own settings)", None))
        for label, params in cases:
            rates = []
            for _ in range(args.runs):
                topic = f"bench-{uuid.uuid4().hex[:12]}"
                if params is None:
                    rates.append(_transport(bootstrap, topic, args.messages, value, args.partitions))
                else:
                    linger, batch = params  # type: ignore[misc]
                    _create(bootstrap, topic, args.partitions)
                    rates.append(_raw(bootstrap, topic, args.messages, value, args.partitions, linger, batch))
            print(f"{label:55s} {statistics.median(rates):>9,.0f} msg/s  (runs: "
                  f"{', '.join(f'{r:,.0f}' for r in rates)})", flush=True)
        if server is not None:
            server.stop()
    return 0


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": partitions, "replication_factor": 1}})
    finally:
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
