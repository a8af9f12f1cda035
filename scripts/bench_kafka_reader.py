"""The consumer library's reader (``sinks.kafka.consumer.KafkaReader``): CPU per record read from a topic on the test
broker, the reading thread's own CPU time (``time.thread_time``) over the polls that return the records.

Usage (from a checkout, so that its ``sinks`` is the one measured)::

    PYTHONPATH=. .venv/bin/python scripts/bench_kafka_reader.py --records 200000 --partitions 3

It starts its own broker (``playground.servers.KafkaServer``) in a temporary directory, writes ``--records`` messages
of ``--bytes`` bytes spread over ``--partitions`` partitions with one kafka-python producer (batched), then reads
them all with a ``KafkaReader`` from offset 0 and prints records, seconds, thread CPU seconds and CPU us/record
(also ``--repeat`` reads of the same topic, each by a new reader). ``--batch-bytes 300`` writes one record per
batch (the reader's per-batch work, :mod:`sinks.kafka.holes`, at its dearest)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from playground.servers import KafkaServer
from sinks.kafka.consumer import KafkaReader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--bytes", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch-bytes", type=int, default=256 * 1024,
                    help="the producer's batch size: 300 gives one 200-byte record per batch, as a span's small writes")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = KafkaServer(Path(tmp)).start()
        try:
            topic = "bench_reader"
            admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
            admin.create_topics([NewTopic(topic, args.partitions, 1)])
            admin.close()
            producer = KafkaProducer(bootstrap_servers=server.bootstrap, linger_ms=5, batch_size=args.batch_bytes)
            value = b"x" * args.bytes
            for n in range(args.records):
                producer.send(topic, value, key=str(n).encode(), partition=n % args.partitions)
            producer.flush()
            producer.close()
            for _ in range(args.repeat):
                reader = KafkaReader([server.bootstrap], [topic])
                reader.assign(30)
                got = 0
                cpu = 0.0
                t0 = time.monotonic()
                while got < args.records:
                    c0 = time.thread_time()
                    got += len(reader.poll(1.0))
                    cpu += time.thread_time() - c0
                    if time.monotonic() - t0 > 300:
                        raise SystemExit(f"read {got} of {args.records} records in 300 s")
                wall = time.monotonic() - t0
                reader.close()
                print(f"records={got} wall_s={wall:.2f} cpu_s={cpu:.2f} cpu_us_per_record={cpu / got * 1e6:.2f}",
                      flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
