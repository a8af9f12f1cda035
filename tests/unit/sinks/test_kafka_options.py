"""``kafka://`` sink URIs: parsing into KafkaOptions, and every bad input naming the parameter and the fix."""

from __future__ import annotations

import pytest

from cdc.errors import InvalidURI
from cdc.uri import parse_sink_uri, redact, scrub
from sinks.kafka.options import (
    CODEC_PARAMS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PARTITIONS,
    KafkaOptions,
    SaslOptions,
    parse_kafka_uri,
)

pytestmark = pytest.mark.unit

BASE = "kafka://127.0.0.1:9092/orders?protocol=canal-json"


def test_defaults_follow_ticdc() -> None:
    o = parse_kafka_uri(BASE)
    assert o == KafkaOptions(brokers=("127.0.0.1:9092",), topic="orders", protocol="canal-json")
    assert (o.partition_num, o.partitions_to_create, o.replication_factor) == (None, DEFAULT_PARTITIONS, 1)
    assert (o.max_message_bytes, o.auto_create_topic, o.transactional) == (DEFAULT_MAX_MESSAGE_BYTES, True, False)
    assert (o.dial_timeout, o.request_timeout, o.delivery_timeout) == (10.0, 10.0, 30.0)
    assert o.tls is None and o.sasl is None and dict(o.codec_params) == {}
    assert o.where() == "Kafka at 127.0.0.1:9092"


def test_every_option() -> None:
    o = parse_kafka_uri(
        "kafka://k1:9093,K2,[::1]:9094/cdc.orders_v2?protocol=debezium&partition-num=6&replication-factor=3"
        "&max-message-bytes=1048576&auto-create-topic=false&kafka-transactional=true&kafka-client-id=tw-1"
        "&compression=gzip&required-acks=-1&dial-timeout=2s&read-timeout=500ms&write-timeout=3&delivery-timeout=1m"
        "&kafka-version=2.4.0&enable-tls=true&ca=/etc/ca.pem&cert=/etc/c.pem&key=/etc/k.pem"
        "&sasl-mechanism=SCRAM-SHA-512&sasl-user=alice&sasl-password=s3cr%26t&enable-tidb-extension=true")
    assert o.brokers == ("k1:9093", "k2:9092", "[::1]:9094")
    assert (o.topic, o.protocol, o.partition_num, o.replication_factor) == ("cdc.orders_v2", "debezium", 6, 3)
    assert (o.max_message_bytes, o.auto_create_topic, o.transactional) == (1048576, False, True)
    assert (o.client_id, o.compression) == ("tw-1", "gzip")
    assert (o.dial_timeout, o.request_timeout, o.delivery_timeout) == (2.0, 3.0, 60.0)
    assert o.tls is not None and (o.tls.ca, o.tls.cert, o.tls.key, o.tls.insecure_skip_verify) == (
        "/etc/ca.pem", "/etc/c.pem", "/etc/k.pem", False)
    assert o.sasl == SaslOptions("SCRAM-SHA-512", "alice", "s3cr&t")
    assert dict(o.codec_params) == {"enable-tidb-extension": "true"}


def test_passwords_stay_out_of_repr_and_messages() -> None:
    uri = BASE + "&sasl-mechanism=plain&sasl-user=bob&sasl-password=Hunter2-Kafka"
    o = parse_kafka_uri(uri)
    assert o.sasl is not None and o.sasl.password == "Hunter2-Kafka"
    assert "Hunter2" not in repr(o) and "Hunter2" not in str(o.sasl)
    assert "Hunter2" not in redact(uri) and "Hunter2" not in scrub(f"failed: {uri}")
    assert "Hunter2" not in scrub("broker said: bad password Hunter2-Kafka")  # noted by the parser
    with pytest.raises(InvalidURI) as exc:
        parse_kafka_uri(uri + "&partition-num=zero")
    assert "Hunter2" not in str(exc.value) and "sasl-password=***" in str(exc.value)


def test_userinfo_is_refused_without_echoing_it() -> None:
    with pytest.raises(InvalidURI, match="sasl-user, sasl-password") as exc:
        parse_kafka_uri("kafka://alice:Pa55word@k1:9092/t?protocol=canal-json")
    assert "Pa55word" not in str(exc.value)


@pytest.mark.parametrize("query,message", [
    ("", "names no protocol: add protocol= one of canal-json, debezium, open-protocol"),
    ("protocol=avro", "protocol 'avro' is not supported: use protocol= one of canal-json, debezium, open-protocol"),
    ("protocol=canal-json&partiton-num=3", "unknown parameter.*partiton-num \\(did you mean partition-num\\?\\)"),
    ("protocol=canal-json&worker-count=4", "unknown parameter.*worker-count; accepted: protocol"),
    ("protocol=canal-json&partition-num=abc", "partition-num must be a whole number from 1 to 100000, got 'abc'"),
    ("protocol=canal-json&partition-num=0", "partition-num must be from 1 to 100000, got 0 \\(e.g. partition-num=6\\)"),
    ("protocol=canal-json&replication-factor=-1", "replication-factor must be from 1 to 32767, got -1"),
    ("protocol=canal-json&max-message-bytes=1e6", "max-message-bytes must be a whole number"),
    ("protocol=canal-json&max-message-bytes=100", "max-message-bytes must be from 1024"),
    ("protocol=canal-json&auto-create-topic=maybe", "auto-create-topic must be true or false, got 'maybe'"),
    ("protocol=canal-json&kafka-transactional=yes please", "kafka-transactional must be true or false"),
    ("protocol=canal-json&compression=brotli", "compression 'brotli' is not supported: use one of none, gzip"),
    ("protocol=canal-json&required-acks=1", "required-acks=1 is not supported.*required-acks=-1"),
    ("protocol=canal-json&dial-timeout=soon", "dial-timeout must be a duration .* got 'soon'"),
    ("protocol=canal-json&write-timeout=0s", "write-timeout must be a duration"),
    ("protocol=canal-json&delivery-timeout=5s&write-timeout=10s", "delivery-timeout \\(5s\\) must be at least"),
    ("protocol=canal-json&ca=/x.pem", "ca given without enable-tls=true: add enable-tls=true"),
    ("protocol=canal-json&enable-tls=true&cert=/c.pem", "cert and key go together"),
    ("protocol=canal-json&sasl-user=a&sasl-password=b", "need sasl-mechanism= one of plain"),
    ("protocol=canal-json&sasl-mechanism=gssapi&sasl-user=a", "GSSAPI/Kerberos is not"),
    ("protocol=canal-json&sasl-mechanism=plain&sasl-user=a", "needs sasl-user and sasl-password"),
    ("protocol=canal-json&kafka-client-id=a b", "kafka-client-id 'a b' must be"),
])
def test_bad_options_name_the_parameter_and_the_fix(query: str, message: str) -> None:
    with pytest.raises(InvalidURI, match=message):
        parse_kafka_uri(f"kafka://127.0.0.1:9092/orders?{query}")


@pytest.mark.parametrize("uri,message", [
    ("kafka://127.0.0.1:9092?protocol=canal-json", "names no topic: use kafka://host:9092/topic-name"),
    ("kafka://127.0.0.1:9092/?protocol=canal-json", "names no topic"),
    ("kafka://127.0.0.1:9092/bad%20topic?protocol=canal-json", "'bad topic' is not a legal Kafka topic name"),
    ("kafka://127.0.0.1:9092/..?protocol=canal-json", "not a legal Kafka topic name"),
    ("kafka://127.0.0.1:9092/" + "t" * 250 + "?protocol=canal-json", "at most 249"),
    ("kafka://h1:9092,,h2:9092/t?protocol=canal-json", "'' is not host\\[:port\\]"),
    ("kafka://h1:99999/t?protocol=canal-json", "the port of 'h1:99999' must be 1-65535"),
    ("kafka://h1:/t?protocol=canal-json", "the port of 'h1:' must be 1-65535"),
    ("kafka:///t?protocol=canal-json", "is not host\\[:port\\]"),
    ("mysql://u@h/db", "not a Kafka sink"),
])
def test_bad_uris(uri: str, message: str) -> None:
    with pytest.raises(InvalidURI, match=message):
        parse_kafka_uri(uri)


def test_codec_parameters_are_the_codec_layers() -> None:
    o = parse_kafka_uri(BASE + "&max-batch-size=16&schemas-enable=false&tombstones-on-delete=false")
    assert dict(o.codec_params) == {"max-batch-size": "16", "schemas-enable": "false", "tombstones-on-delete": "false"}
    assert "max-message-bytes" not in CODEC_PARAMS  # parsed here (the codecs read it from the query too)
    with pytest.raises(InvalidURI, match="unknown parameter.*csv-delimiter"):  # the storage sink's
        parse_kafka_uri(BASE + "&csv-delimiter=;")
    o = parse_kafka_uri(BASE + "&debezium-disable-schema=true", codec_params=("debezium-disable-schema",))
    assert dict(o.codec_params) == {"debezium-disable-schema": "true"}


def test_durations_and_booleans() -> None:
    o = parse_kafka_uri(BASE + "&dial-timeout=1.5&read-timeout=2m&write-timeout=250ms&delivery-timeout=1h"
                        "&auto-create-topic=FALSE&kafka-transactional=1")
    assert (o.dial_timeout, o.request_timeout, o.delivery_timeout) == (1.5, 120.0, 3600.0)
    assert (o.auto_create_topic, o.transactional) == (False, True)


def test_kafka_is_a_sink_scheme_with_several_brokers() -> None:
    u = parse_sink_uri("kafka://b1:9092,b2:9093/t?protocol=canal-json")
    assert (u.scheme, u.host, u.port, u.hosts, u.path) == ("kafka", "b1", 9092, (("b1", 9092), ("b2", 9093)), "t")
    assert u.redacted() == "kafka://b1:9092,b2:9093/t?protocol=canal-json"
