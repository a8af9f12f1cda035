"""What the test broker (tansu) does with aborted transactions, measured with plain kafka-python clients (no Tidewater
code): a transaction whose records reached the broker and was then aborted, and one left open by a producer that
was SIGKILLed, read with ``read_uncommitted`` and ``read_committed``. Apache Kafka hides both from
``read_committed`` consumers; tansu 0.6 shows both (docs/sinks.md, "Test broker" and "Exactly-once": what the
exactly-once kill run can and cannot prove on it)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_records import values

from playground.servers import KafkaServer
from sinks.kafka.txnread import CommittedRecords

pytestmark = pytest.mark.integration


def producer(server: KafkaServer, tid: str) -> Any:
    p = KafkaProducer(bootstrap_servers=server.bootstrap, transactional_id=tid, enable_idempotence=True)
    p.init_transactions()
    return p


def test_an_aborted_transaction_that_reached_the_broker(kafka_server: KafkaServer, kafka_topic: str) -> None:
    p = producer(kafka_server, f"abort-{kafka_topic}")
    try:
        p.begin_transaction()
        p.send(kafka_topic, b"first", partition=0)
        p.commit_transaction()
        p.begin_transaction()
        p.send(kafka_topic, b"aborted", partition=0)
        p.flush()  # the records are on the broker before the abort
        p.abort_transaction()
        p.begin_transaction()
        p.send(kafka_topic, b"second", partition=0)
        p.commit_transaction()
    finally:
        p.close()
    assert values(kafka_server, kafka_topic, "read_uncommitted") == [b"first", b"aborted", b"second"]
    # measured on tansu 0.6: the aborted record stays VISIBLE to read_committed (Apache Kafka hides it: its fetch
    # answer lists the aborted transaction, tansu's does not). Only records still in the producer at the abort are
    # never seen (they never reach the broker). If this fails, tansu learned Kafka's semantics: update docs/sinks.md
    assert values(kafka_server, kafka_topic, "read_committed") == [b"first", b"aborted", b"second"]
    # the log's own markers say which were aborted: what Tidewater's readers take (sinks.kafka.txnread)
    assert values(kafka_server, kafka_topic, "read_committed", markers=True) == [b"first", b"second"]


DEAD = """
import sys, time
from kafka import KafkaProducer
p = KafkaProducer(bootstrap_servers=sys.argv[1], transactional_id=sys.argv[2], enable_idempotence=True)
p.init_transactions()
p.begin_transaction()
p.send(sys.argv[3], b"left open", partition=0)
p.flush()
print("sent", flush=True)
time.sleep(600)
"""


def test_a_transaction_left_open_by_a_producer_killed_mid_transaction(kafka_server: KafkaServer,
                                                                        kafka_topic: str) -> None:
    tid = f"dead-{kafka_topic}"
    proc = subprocess.Popen([sys.executable, "-c", DEAD, kafka_server.bootstrap, tid, kafka_topic],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "sent"
    finally:
        proc.kill()  # SIGKILL: no commit, no abort
        proc.wait()
    successor = producer(kafka_server, tid)  # fences the dead one; Apache Kafka aborts its open transaction
    try:
        successor.begin_transaction()
        successor.send(kafka_topic, b"after", partition=0)
        successor.commit_transaction()
    finally:
        successor.close()
    assert values(kafka_server, kafka_topic, "read_uncommitted") == [b"left open", b"after"]
    # measured on tansu 0.6: the dead producer's open transaction becomes VISIBLE to read_committed once its
    # successor initializes the transactional id (Apache Kafka aborts it and hides its records)
    assert values(kafka_server, kafka_topic, "read_committed") == [b"left open", b"after"]
    assert values(kafka_server, kafka_topic, "read_committed", markers=True) == [b"after"]


def test_records_of_an_open_transaction_are_held_until_its_marker(kafka_server: KafkaServer,
                                                                   kafka_topic: str) -> None:
    """Markers decide per producer: a plain record written while another producer's transaction is open passes at
    once; the transaction's records wait for their commit, an aborted one's never come."""
    plain = KafkaProducer(bootstrap_servers=kafka_server.bootstrap, enable_idempotence=True)
    a, b = producer(kafka_server, f"a-{kafka_topic}"), producer(kafka_server, f"b-{kafka_topic}")
    consumer = KafkaConsumer(bootstrap_servers=kafka_server.bootstrap, isolation_level="read_uncommitted",
                             enable_auto_commit=False)
    committed = CommittedRecords(consumer)
    tp = TopicPartition(kafka_topic, 0)

    def read(quiet: float = 1.0) -> list[bytes]:
        out: list[bytes] = []
        last = time.monotonic()
        while time.monotonic() - last < quiet:
            polled = [r for part in consumer.poll(timeout_ms=200).values() for r in part]
            if polled:
                last = time.monotonic()
            out.extend(r.value for r in committed.take(polled))
        return out

    try:
        a.begin_transaction()
        a.send(kafka_topic, b"a1", partition=0)
        a.flush()
        b.begin_transaction()
        b.send(kafka_topic, b"b1", partition=0)
        b.flush()
        plain.send(kafka_topic, b"plain", partition=0)
        plain.flush()
        a.send(kafka_topic, b"a2", partition=0)
        a.flush()
        consumer.assign([tp])
        consumer.seek(tp, 0)  # not the broker's EARLIEST (sinks/kafka/logstart.py)
        assert read() == [b"plain"]
        assert committed.held == 3
        b.abort_transaction()
        a.commit_transaction()
        assert read() == [b"a1", b"a2"]
        assert committed.held == 0 and committed.aborted == 1
    finally:
        consumer.close()
        for p in (plain, a, b):
            p.close()
