"""The Kafka transport's own logic with a fake producer and admin client: size check before sending, error
mapping, the producer discarded after a failure, transactions, topic rules. The real broker is exercised in
tests/integration/test_kafka_transport.py."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import errors as kerr
from kafka.future import Future

from cdc.errors import SinkError, SinkFenced, SinkUnavailable
from sinks.codec import MessageTooLarge
from sinks.kafka.errors import wrap
from sinks.kafka.options import parse_kafka_uri
from sinks.kafka.transport import KafkaTransport, message_size, producer_config

pytestmark = pytest.mark.unit


class FakeAdmin:
    def __init__(self, topics: dict[str, int], limits: dict[str, int] | None = None) -> None:
        self.topics = topics
        self.limits = limits or {}
        self.created: list[tuple[str, int, int]] = []
        self.configs: dict[str, dict[str, str]] = {}
        self.closed = 0

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        (name,) = names
        if name not in self.topics:
            return [{"name": name, "error_code": 3, "partitions": []}]
        return [{"name": name, "error_code": 0, "partitions": [{"partition_index": i}
                                                               for i in range(self.topics[name])]}]

    def describe_configs(self, resources: list[Any]) -> dict[str, Any]:
        name = resources[0].name
        if name in self.limits:
            return {"topic": {name: {"max.message.bytes": {"value": str(self.limits[name])}}}}
        return {"topic": {name: {}}}

    def create_topics(self, spec: dict[str, dict[str, Any]], raise_errors: bool = True) -> dict[str, Any]:
        ((name, s),) = spec.items()
        self.created.append((name, s["num_partitions"], s["replication_factor"]))
        self.configs[name] = dict(s.get("configs", {}))
        self.topics[name] = s["num_partitions"]
        return {"topics": [{"name": name, "error_code": 0}]}

    def close(self) -> None:
        self.closed += 1


class FakeProducer:
    instances: list[FakeProducer] = []

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.sent: list[tuple[str, int, bytes | None, bytes | None]] = []
        self.futures: list[Future] = []
        self.fail_with: BaseException | None = None  # every future fails with it at flush
        self.commit_error: BaseException | None = None
        self.calls: list[str] = []
        self.closed = False
        FakeProducer.instances.append(self)

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, headers: Any = None,
             partition: int | None = None) -> Future:
        assert partition is not None
        self.sent.append((topic, partition, key, value))
        f = Future()
        self.futures.append(f)
        return f

    def flush(self, timeout: float | None = None) -> None:
        for f in self.futures:
            if not f.is_done:
                f.failure(self.fail_with) if self.fail_with else f.success(None)

    def init_transactions(self) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self) -> None:
        self.calls.append("commit")
        if self.commit_error:
            raise self.commit_error

    def abort_transaction(self) -> None:
        self.calls.append("abort")

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


def make(uri: str = "kafka://k:9092/orders?protocol=canal-json", *, topics: dict[str, int] | None = None,
         limits: dict[str, int] | None = None, txn: str | None = None) -> tuple[KafkaTransport, FakeAdmin]:
    FakeProducer.instances = []
    admin = FakeAdmin({"orders": 3} if topics is None else topics, limits)
    t = KafkaTransport(parse_kafka_uri(uri), transactional_id=txn, producer_factory=FakeProducer,
                       admin_factory=lambda **_: admin)
    return t, admin


def test_producer_settings() -> None:
    c = producer_config(parse_kafka_uri("kafka://k:9092/t?protocol=canal-json&max-message-bytes=2048"
                                        "&delivery-timeout=20s&auto-create-topic=false"), "tx-1")
    assert (c["acks"], c["enable_idempotence"], c["max_in_flight_requests_per_connection"]) == ("all", True, 5)
    assert (c["delivery_timeout_ms"], c["batch_size"], c["transactional_id"]) == (20000, 2048, "tx-1")
    assert c["allow_auto_create_topics"] is False and c["security_protocol"] == "PLAINTEXT"
    sasl = producer_config(parse_kafka_uri("kafka://k/t?protocol=canal-json&sasl-mechanism=plain&sasl-user=u"
                                           "&sasl-password=p"), None)
    assert (sasl["security_protocol"], sasl["sasl_mechanism"], sasl["sasl_plain_password"]) == (
        "SASL_PLAINTEXT", "PLAIN", "p")


def test_send_and_flush_count_and_keep_order() -> None:
    t, _ = make()
    for i in range(5):
        t.send("orders", i % 3, b"k%d" % i, b"v%d" % i)
    assert t.flush() == 5
    assert [m[1:] for m in FakeProducer.instances[0].sent] == [
        (0, b"k0", b"v0"), (1, b"k1", b"v1"), (2, b"k2", b"v2"), (0, b"k3", b"v3"), (1, b"k4", b"v4")]
    assert t.flush() == 0


def test_oversized_message_is_refused_before_sending() -> None:
    t, _ = make("kafka://k:9092/orders?protocol=canal-json&max-message-bytes=1024")
    t.send("orders", 0, None, b"x" * 900)
    with pytest.raises(MessageTooLarge, match=r"topic orders partition 1 is 1[0-9]{3} bytes, above the limit of "
                                              r"1024 \(max-message-bytes=1024\).*not sent"):
        t.send("orders", 1, b"key", b"x" * 1000)
    assert message_size(b"key", b"x" * 1000) > 1024 >= message_size(None, b"x" * 900)
    assert [m[1] for m in FakeProducer.instances[0].sent] == [0]


def test_the_topics_smaller_limit_wins() -> None:
    t, _ = make(limits={"orders": 2000})
    assert t.topic("orders").max_message_bytes == 2000
    with pytest.raises(MessageTooLarge, match="the topic's max.message.bytes=2000"):
        t.send("orders", 0, None, b"x" * 2500)


def test_missing_topic_with_auto_create_off_names_it() -> None:
    t, admin = make("kafka://k:9092/orders?protocol=canal-json&auto-create-topic=false", topics={})
    with pytest.raises(SinkError, match="topic 'orders' does not exist on Kafka at k:9092 and auto-create-topic="
                                        "false: create it \\(with 3 partition\\(s\\)\\)"):
        t.check()
    assert admin.created == [] and FakeProducer.instances == []


def test_topic_created_with_partition_num_and_replication_factor() -> None:
    t, admin = make("kafka://k:9092/orders?protocol=canal-json&partition-num=6&replication-factor=2", topics={})
    t.check()
    assert admin.created == [("orders", 6, 2)] and t.partitions("orders") == 6


def test_a_created_data_topic_takes_max_message_bytes_as_its_limit_and_the_metadata_topic_keeps_the_brokers() -> None:
    t, admin = make("kafka://k:9092/orders?protocol=canal-json&max-message-bytes=2097152", topics={})
    t.check()
    assert admin.configs["orders"] == {"max.message.bytes": "2097152"}
    t.topic("_tidewater.orders", 1)
    assert admin.configs["_tidewater.orders"] == {}


def test_partition_num_below_the_topics_count_still_reaches_every_partition_with_watermarks() -> None:
    t, _ = make("kafka://k:9092/orders?protocol=canal-json&partition-num=2", topics={"orders": 5})
    assert (t.partitions("orders"), t.all_partitions("orders")) == (2, 5)
    t2, _ = make("kafka://k:9092/orders?protocol=canal-json", topics={"orders": 5})
    assert (t2.partitions("orders"), t2.all_partitions("orders")) == (5, 5)


def test_partition_num_above_the_topics_count_fails() -> None:
    t, _ = make("kafka://k:9092/orders?protocol=canal-json&partition-num=8")
    with pytest.raises(SinkError, match="has 3 partition\\(s\\), fewer than partition-num=8: lower partition-num"):
        t.check()
    t2, _ = make("kafka://k:9092/orders?protocol=canal-json&partition-num=2")
    assert t2.partitions("orders") == 2  # the first 2 of 3


@pytest.mark.parametrize("error,kind,message", [
    (kerr.KafkaTimeoutError("Expiring 3 record(s) for orders-0"), SinkUnavailable, "unavailable while sending"),
    (kerr.NotEnoughReplicasError(), SinkUnavailable, "unavailable"),
    (kerr.UnknownProducerIdError(), SinkUnavailable, "unavailable"),
    (kerr.MessageSizeTooLargeError(), MessageTooLarge, "refused a message topic orders .*as too large"),
    (kerr.TopicAuthorizationFailedError(), SinkError, "not authorized.*Write"),
    (kerr.ProducerFencedError(), SinkFenced, "fenced by a newer one"),
    (kerr.InvalidRequiredAcksError(), SinkError, "failed sending topic orders"),
])
def test_flush_failures_map_to_cdc_errors_and_replace_the_producer(error: BaseException, kind: type,
                                                                   message: str) -> None:
    t, _ = make()
    t.send("orders", 0, None, b"v")
    FakeProducer.instances[0].fail_with = error
    with pytest.raises(kind, match=message) as exc:
        t.flush()
    assert type(exc.value) is kind
    first = FakeProducer.instances[0]
    assert first.closed
    t.send("orders", 0, None, b"again")  # a new producer; the topic is looked up again
    assert t.flush() == 1 and len(FakeProducer.instances) == 2 and not FakeProducer.instances[1].closed


def test_unreachable_brokers_at_check_are_sink_unavailable() -> None:
    def refuse(**_: Any) -> Any:
        raise kerr.KafkaTimeoutError("Unable to bootstrap from 10.0.0.1:9092")

    t = KafkaTransport(parse_kafka_uri("kafka://10.0.0.1:9092/orders?protocol=canal-json"), admin_factory=refuse)
    with pytest.raises(SinkUnavailable, match="Kafka at 10.0.0.1:9092 unavailable while connecting"):
        t.check()


def test_pending_bytes_are_bounded() -> None:
    FakeProducer.instances = []
    admin = FakeAdmin({"orders": 1})
    t = KafkaTransport(parse_kafka_uri("kafka://k/orders?protocol=canal-json&max-message-bytes=1024"),
                       max_pending_bytes=1024, producer_factory=FakeProducer, admin_factory=lambda **_: admin)
    for _ in range(10):
        t.send("orders", 0, None, b"x" * 300)
        assert sum(not f.is_done for f in FakeProducer.instances[0].futures) <= 4
    assert t.flush() == 10


def test_transactions() -> None:
    t, _ = make("kafka://k:9092/orders?protocol=canal-json&kafka-transactional=true", txn="tw-cf-0")
    t.begin()
    t.send("orders", 0, None, b"a")
    assert t.commit() == 1
    t.begin()
    t.send("orders", 1, None, b"b")
    t.abort()
    p = FakeProducer.instances[0]
    assert p.config["transactional_id"] == "tw-cf-0"
    assert p.calls == ["init", "begin", "commit", "begin", "abort"]
    t.begin()
    p.commit_error = kerr.ProducerFencedError()
    with pytest.raises(SinkFenced, match="transactional producer was fenced"):
        t.commit()
    assert p.closed


def test_transactional_mode_needs_an_id_and_plain_mode_has_no_transactions() -> None:
    with pytest.raises(ValueError, match="transactional_id"):
        make("kafka://k:9092/orders?protocol=canal-json&kafka-transactional=true")
    t, _ = make()
    with pytest.raises(SinkError, match="needs kafka-transactional=true"):
        t.begin()


def test_closed_transport_refuses_work() -> None:
    t, admin = make()
    t.send("orders", 0, None, b"v")
    t.close()
    assert FakeProducer.instances[0].closed and admin.closed
    with pytest.raises(SinkError, match="is closed"):
        t.flush()


def test_wrap_keeps_request_dumps_and_secrets_out() -> None:
    exc = kerr.TopicAlreadyExistsError("Request 'CreateTopicsRequest(...)' failed with response 'X'")
    assert "CreateTopicsRequest" not in str(wrap(exc, "Kafka at k:9092", topic="t"))


def test_a_refused_message_inside_a_transaction_leaves_the_producer_usable() -> None:
    t, _ = make("kafka://k:9092/orders?protocol=canal-json&kafka-transactional=true&max-message-bytes=1024",
                txn="tw-cf-1")
    t.begin()
    t.send("orders", 0, None, b"ok")
    with pytest.raises(MessageTooLarge, match="above the limit"):
        t.send("orders", 0, None, b"x" * 2000)
    t.abort()
    t.begin()
    t.send("orders", 0, None, b"next")
    assert t.commit() == 1
    p = FakeProducer.instances[0]
    assert len(FakeProducer.instances) == 1 and p.calls == ["init", "begin", "abort", "begin", "commit"]
