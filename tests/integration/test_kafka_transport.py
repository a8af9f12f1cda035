"""The Kafka transport against a real Kafka-compatible broker (tansu, memory storage; docs/sinks.md "Test broker").

Order per partition read back by a consumer, topic auto-creation, a missing topic with auto-create off, an
oversized message, the broker stopped mid-run (bounded failure, then recovery), transactions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from cdc.errors import SinkError, SinkFenced, SinkUnavailable
from playground.servers import KafkaServer
from sinks.codec import MessageTooLarge
from sinks.kafka.options import parse_kafka_uri
from sinks.kafka.transport import KafkaTransport

pytestmark = pytest.mark.integration


@pytest.fixture(params=["kafka-python", "confluent-kafka"])
def open_transport(kafka_server: KafkaServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Transports of either producer library (``kafka-producer``): the contract is the same."""
    opened: list[KafkaTransport] = []
    cls: type[KafkaTransport] = KafkaTransport
    if request.param == "confluent-kafka":
        from sinks.kafka.confluent import ConfluentTransport

        cls = ConfluentTransport

    def make(topic: str, transactional_id: str | None = None, **params: str) -> KafkaTransport:
        params.setdefault("protocol", "canal-json")
        params["kafka_producer"] = request.param
        t = cls(parse_kafka_uri(kafka_server.uri(topic, **params)), transactional_id=transactional_id)
        opened.append(t)
        return t

    yield make
    for t in opened:
        t.close()


def read_back(server: KafkaServer, topic: str, partitions: int, expect: int, *, committed: bool = False,
              timeout: float = 20.0) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    """Every message of ``topic`` by partition, read from the beginning until ``expect`` arrived or ``timeout``.
    (tansu's end offsets undercount batches of several records: read by count, not up to end_offsets.)"""
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, enable_auto_commit=False,
                             isolation_level="read_committed" if committed else "read_uncommitted")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:  # from offset 0, not the broker's EARLIEST (tansu: sinks/kafka/logstart.py)
            consumer.seek(tp, 0)
        out: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in range(partitions)}
        got, deadline = 0, time.monotonic() + timeout
        while got < expect and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                out[tp.partition].extend((r.key, r.value) for r in records)
                got += len(records)
        return out
    finally:
        consumer.close()


def topic_partitions(server: KafkaServer, topic: str) -> int | None:
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        (meta,) = admin.describe_topics([topic])
        return None if meta["error_code"] else len(meta["partitions"])
    finally:
        admin.close()


def test_messages_arrive_in_order_per_partition(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any
                                                ) -> None:
    t = open_transport(kafka_topic, partition_num="3")
    t.check()
    assert t.partitions(kafka_topic) == 3
    sent: dict[int, list[tuple[bytes, bytes]]] = {0: [], 1: [], 2: []}
    for i in range(3000):
        p, key, value = i % 3, b"key-%d" % (i % 17), b"value-%06d" % i
        t.send(kafka_topic, p, key, value)
        sent[p].append((key, value))
        if i % 1000 == 999:
            assert t.flush() == 1000
    assert read_back(kafka_server, kafka_topic, 3, 3000) == sent


def test_topic_auto_created_with_partition_num(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any
                                               ) -> None:
    assert topic_partitions(kafka_server, kafka_topic) is None
    t = open_transport(kafka_topic, partition_num="5", replication_factor="1", max_message_bytes="2097152")
    t.check()
    assert topic_partitions(kafka_server, kafka_topic) == 5
    assert t.partitions(kafka_topic) == 5
    # (the topic's max.message.bytes = max-message-bytes: tansu accepts it at creation but reports no config back,
    # docs/sinks.md "Test broker"; tests/unit/sinks/test_kafka_transport_unit.py checks the request)
    other = f"{kafka_topic}-second"
    t.send(other, 4, None, b"to a topic first used by send")  # another topic, created on first use
    assert t.flush() == 1
    assert topic_partitions(kafka_server, other) == 5
    assert read_back(kafka_server, other, 5, 1)[4] == [(None, b"to a topic first used by send")]


def test_missing_topic_with_auto_create_off_is_a_clear_error(kafka_server: KafkaServer, kafka_topic: str,
                                                            open_transport: Any) -> None:
    t = open_transport(kafka_topic, auto_create_topic="false")
    with pytest.raises(SinkError, match=f"topic '{kafka_topic}' does not exist on Kafka at {kafka_server.bootstrap} "
                                        "and auto-create-topic=false"):
        t.check()
    with pytest.raises(SinkError, match="does not exist"):
        t.send(kafka_topic, 0, None, b"v")
    assert topic_partitions(kafka_server, kafka_topic) is None  # the broker would have created it on a producer's ask


def test_existing_topic_with_auto_create_off(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any
                                             ) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka_server.bootstrap)
    admin.create_topics({kafka_topic: {"num_partitions": 2, "replication_factor": 1}})
    admin.close()
    t = open_transport(kafka_topic, auto_create_topic="false")
    t.check()
    assert t.partitions(kafka_topic) == 2
    with pytest.raises(SinkError, match="has 2 partition\\(s\\), fewer than partition-num=4"):
        open_transport(kafka_topic, auto_create_topic="false", partition_num="4").check()


def test_oversized_message_names_size_and_limit_and_sends_nothing(kafka_server: KafkaServer, kafka_topic: str,
                                                                  open_transport: Any) -> None:
    t = open_transport(kafka_topic, partition_num="1", max_message_bytes="4096")
    t.check()
    with pytest.raises(MessageTooLarge, match=f"a message for topic {kafka_topic} partition 0 is 5[0-9]{{3}} bytes, above "
                                        "the limit of 4096 \\(max-message-bytes=4096\\).*not sent"):
        t.send(kafka_topic, 0, b"id=1", b"x" * 5000)
    t.send(kafka_topic, 0, b"id=2", b"y" * 3000)  # under the limit, with its overhead
    assert t.flush() == 1
    assert read_back(kafka_server, kafka_topic, 1, 2, timeout=2) == {0: [(b"id=2", b"y" * 3000)]}


def test_broker_killed_mid_run_fails_within_the_delivery_timeout_then_recovers(
        kafka_server: KafkaServer, kafka_topic: str, open_transport: Any) -> None:
    t = open_transport(kafka_topic, partition_num="2", delivery_timeout="4s", write_timeout="2s", read_timeout="2s",
                       dial_timeout="2s")
    t.send(kafka_topic, 0, None, b"before")
    assert t.flush() == 1
    try:
        killer = threading.Timer(0.3, kafka_server.kill)  # while messages are being sent
        killer.start()
        t0 = time.monotonic()
        sent_by = t0
        with pytest.raises(SinkUnavailable, match=f"Kafka at {kafka_server.bootstrap}"):
            i = 0
            while i < 100_000 or time.monotonic() - t0 < 1.0:  # until well after the kill (librdkafka is fast)
                t.send(kafka_topic, i % 2, None, b"during %d" % i)
                i += 1
            sent_by = time.monotonic()
            t.flush()
        failed_by = time.monotonic()
        killer.join()
        print(f"broker killed: {sent_by - t0:.1f} s of sends, SinkUnavailable {failed_by - sent_by:.1f} s later "
              "(delivery-timeout 4 s)")
        assert failed_by - sent_by < 4 + 1 + 1.5
        # still down: a new producer cannot connect either, and says so within the dial timeout
        t0 = time.monotonic()
        with pytest.raises(SinkUnavailable, match="unavailable while connecting"):
            t.send(kafka_topic, 0, None, b"still down")
        print(f"broker down: SinkUnavailable for a new producer after {time.monotonic() - t0:.1f} s (dial-timeout 2 s)")
        assert time.monotonic() - t0 < 2 + 2
    finally:
        kafka_server.start()  # memory storage: the broker is back empty, its topics gone
    t.send(kafka_topic, 1, None, b"after")  # the topic is created again (auto-create-topic) with 2 partitions
    assert t.flush() == 1
    assert topic_partitions(kafka_server, kafka_topic) == 2
    assert read_back(kafka_server, kafka_topic, 2, 1, timeout=5) == {0: [], 1: [(None, b"after")]}


def test_broker_restarted_between_writes(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any) -> None:
    """A broker that restarted unnoticed (tansu: empty, producer ids forgotten) fails the next write as
    SinkUnavailable (kafka-python; librdkafka renews its producer id itself); the retry, on a new producer, is
    delivered, once."""
    t = open_transport(kafka_topic, partition_num="1", delivery_timeout="4s", write_timeout="2s", read_timeout="2s")
    t.send(kafka_topic, 0, None, b"one")
    assert t.flush() == 1
    kafka_server.stop()
    kafka_server.start()
    try:
        t.send(kafka_topic, 0, None, b"two")
        t.flush()
    except SinkUnavailable:  # kafka-python: the producer id is unknown to the new broker; librdkafka recovers alone
        t.send(kafka_topic, 0, None, b"two")
        assert t.flush() == 1
    assert read_back(kafka_server, kafka_topic, 1, 1, timeout=5) == {0: [(None, b"two")]}


def test_unreachable_broker_fails_check_up_front(kafka_server: KafkaServer) -> None:
    from playground.servers import free_port

    t = KafkaTransport(parse_kafka_uri(f"kafka://127.0.0.1:{free_port()}/t?protocol=canal-json&dial-timeout=1s"))
    t0 = time.monotonic()
    with pytest.raises(SinkUnavailable, match="unavailable while connecting"):
        t.check()
    assert time.monotonic() - t0 < 5
    t.close()


def test_transaction_commit_is_visible_to_read_committed(kafka_server: KafkaServer, kafka_topic: str,
                                                         open_transport: Any) -> None:
    t = open_transport(kafka_topic, kafka_transactional="true", partition_num="2",
                       transactional_id=f"tw-{kafka_topic}")
    t.begin()
    for i in range(10):
        t.send(kafka_topic, i % 2, None, b"committed %d" % i)
    assert t.commit() == 10
    t.begin()
    t.send(kafka_topic, 0, None, b"open")  # an open transaction: read_committed consumers do not see it yet
    t.flush()
    seen = read_back(kafka_server, kafka_topic, 2, 11, committed=True, timeout=2)
    assert sorted(v for p in seen.values() for _, v in p) == sorted(b"committed %d" % i for i in range(10))
    t.abort()


def test_aborted_unflushed_transaction_is_never_sent(kafka_server: KafkaServer, kafka_topic: str,
                                                     open_transport: Any) -> None:
    """What tansu can show of abort: messages still in the producer are dropped. (Aborted messages that reached
    the broker stay visible to read_committed consumers on tansu 0.6, docs/sinks.md "Test broker"; Apache Kafka
    hides them.)"""
    t = open_transport(kafka_topic, kafka_transactional="true", partition_num="1",
                       transactional_id=f"tw-{kafka_topic}")
    t.begin()
    t.send(kafka_topic, 0, None, b"first")
    t.commit()
    t.begin()
    t.send(kafka_topic, 0, None, b"aborted")
    t.abort()
    t.begin()
    t.send(kafka_topic, 0, None, b"second")
    t.commit()
    assert read_back(kafka_server, kafka_topic, 1, 3, committed=True, timeout=2) == {
        0: [(None, b"first"), (None, b"second")]}


def test_a_newer_producer_fences_the_older(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any
                                           ) -> None:
    old = open_transport(kafka_topic, kafka_transactional="true", partition_num="1", transactional_id="tw-fence")
    old.begin()
    old.send(kafka_topic, 0, None, b"old")
    old.flush()
    new = open_transport(kafka_topic, kafka_transactional="true", partition_num="1", transactional_id="tw-fence")
    new.begin()  # init_transactions: fences "old"
    new.send(kafka_topic, 0, None, b"new")
    assert new.commit() == 1
    with pytest.raises(SinkFenced, match="fenced by a newer one"):
        old.send(kafka_topic, 0, None, b"zombie")
        old.commit()


def test_flush_waits_for_every_acknowledgement(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any
                                               ) -> None:
    """flush returns only when the broker holds every message: a consumer that starts right after sees them all."""
    t = open_transport(kafka_topic, partition_num="4")
    n = 20_000
    for i in range(n):
        t.send(kafka_topic, i % 4, None, b"%d" % i)
    assert t.flush() == n
    counts = {p: len(v) for p, v in read_back(kafka_server, kafka_topic, 4, n, timeout=30).items()}
    assert counts == {p: n // 4 for p in range(4)}


def test_concurrent_transports_on_one_topic(kafka_server: KafkaServer, kafka_topic: str, open_transport: Any
                                            ) -> None:
    """Spans each have their own transport; two creating the same topic at once both find it."""
    ts = [open_transport(kafka_topic, partition_num="2") for _ in range(3)]
    errors: list[BaseException] = []

    def run(t: KafkaTransport, n: int) -> None:
        try:
            t.check()
            for i in range(100):
                t.send(kafka_topic, n % 2, None, b"%d-%d" % (n, i))
            t.flush()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t, n)) for n, t in enumerate(ts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    got = read_back(kafka_server, kafka_topic, 2, 300)
    assert sum(len(v) for v in got.values()) == 300


def test_raw_producer_sanity(kafka_server: KafkaServer, kafka_topic: str) -> None:
    """The broker itself: kafka-python's own idempotent producer round-trips (guards the fixture)."""
    p = KafkaProducer(bootstrap_servers=kafka_server.bootstrap, acks="all", enable_idempotence=True)
    try:
        p.send(kafka_topic, b"v", partition=0).get(10)
    finally:
        p.close()


def test_producer_ceiling_bench_runs(kafka_server: KafkaServer, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m bench.kafka_producer`` (the raw producer ceiling later sink benchmarks compare with), tiny."""
    from bench.kafka_producer import main

    assert main(["--bootstrap", kafka_server.bootstrap, "--messages", "2000", "--runs", "1", "--linger", "0",
                 "--batch", "262144"]) == 0
    out = capsys.readouterr().out
    assert "kafka-python linger_ms=0 batch_size=262144" in out and "sinks.kafka.transport" in out and "msg/s" in out
