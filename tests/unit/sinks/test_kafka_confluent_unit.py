"""The confluent-kafka transport's own logic (sinks/kafka/confluent.py): librdkafka's errors mapped to the
kafka-python errors of the same meaning (so the transport classifies both alike), its configuration, the
kafka-producer URI parameter. The real broker: tests/integration/test_kafka_transport.py runs every transport
test with both libraries."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka import errors as kerr

from cdc.errors import InvalidURI, SinkError, SinkFenced, SinkUnavailable
from sinks.codec import MessageTooLarge
from sinks.kafka.confluent import as_kafka_python, producer_config
from sinks.kafka.errors import wrap
from sinks.kafka.options import parse_kafka_uri

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("code", "expected"), [
    (KafkaError._MSG_TIMED_OUT, SinkUnavailable),
    (KafkaError._TRANSPORT, SinkUnavailable),
    (KafkaError._ALL_BROKERS_DOWN, SinkUnavailable),
    (KafkaError._FENCED, SinkFenced),
    (KafkaError.PRODUCER_FENCED, SinkFenced),
    (KafkaError.MSG_SIZE_TOO_LARGE, MessageTooLarge),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, SinkError),
    (KafkaError.NOT_LEADER_FOR_PARTITION, SinkUnavailable),
])
def test_librdkafka_errors_are_classified_like_kafka_python_ones(code: int, expected: type) -> None:
    for raw in (KafkaError(code), KafkaException(KafkaError(code))):
        err = wrap(as_kafka_python(raw), "Kafka at h:1", topic="t")
        assert type(err) is expected, (code, err)
    assert not isinstance(wrap(as_kafka_python(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), "K"),
                          SinkUnavailable)


def test_fencing_maps_to_kafka_pythons_fenced_error() -> None:
    assert isinstance(as_kafka_python(KafkaError(KafkaError._FENCED)), kerr.ProducerFencedError)


def test_a_fatal_error_that_flush_reports_as_a_systemerror_keeps_its_meaning() -> None:
    """flush() of a fenced transactional producer sets KafkaException(_FENCED) and still serves delivery reports;
    the callback's next C call then fails with SystemError caused by it (seen in the zombie-fencing integration test,
    run alone): it must still map to the fenced error, so the sink says SinkFenced, not ErrSinkFatal."""
    fenced = KafkaException(KafkaError(KafkaError._FENCED))
    try:
        try:
            raise fenced
        except KafkaException as cause:
            raise SystemError("<method 'code' of 'KafkaError' objects> returned a result with an exception set") \
                from cause
    except SystemError as exc:
        raised = exc
    assert isinstance(as_kafka_python(raised), kerr.ProducerFencedError)
    assert isinstance(wrap(as_kafka_python(raised), "Kafka at h:1", topic="t"), SinkFenced)


def test_config_mirrors_the_transport_settings() -> None:
    opts = parse_kafka_uri("kafka://h1:9092,h2:9093/t?protocol=canal-json&kafka-producer=confluent-kafka"
                           "&max-message-bytes=2097152&delivery-timeout=20s&compression=gzip&kafka-transactional=true"
                           "&sasl-mechanism=scram-sha-256&sasl-user=u&sasl-password=p")
    cfg = producer_config(opts, "tidewater-cf-0", 64 << 20)
    assert cfg["bootstrap.servers"] == "h1:9092,h2:9093" and cfg["acks"] == "all" and cfg["enable.idempotence"]
    assert cfg["delivery.timeout.ms"] == 20000 and cfg["message.max.bytes"] > 2097152
    assert cfg["compression.type"] == "gzip" and cfg["transactional.id"] == "tidewater-cf-0"
    assert cfg["security.protocol"] == "SASL_PLAINTEXT" and cfg["sasl.mechanisms"] == "SCRAM-SHA-256"
    assert cfg["max.in.flight.requests.per.connection"] == 5


def test_kafka_producer_parameter() -> None:
    assert parse_kafka_uri("kafka://h/t?protocol=canal-json").producer == "kafka-python"
    assert parse_kafka_uri("kafka://h/t?protocol=canal-json&kafka-producer=confluent-kafka").producer == \
        "confluent-kafka"
    with pytest.raises(InvalidURI, match="kafka-producer='librdkafka' is not supported"):
        parse_kafka_uri("kafka://h/t?protocol=canal-json&kafka-producer=librdkafka")


def test_missing_confluent_kafka_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "confluent_kafka"
                        else real(name, *a))
    with pytest.raises(InvalidURI, match="pip install confluent-kafka"):
        parse_kafka_uri("kafka://h/t?protocol=canal-json&kafka-producer=confluent-kafka")
