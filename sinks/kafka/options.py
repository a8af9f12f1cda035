"""The ``kafka://`` sink URI, parsed and validated into :class:`KafkaOptions` (no I/O here).

``kafka://host[:port][,host[:port]...]/topic?protocol=canal-json&partition-num=6&...``: parameter names and
defaults follow TiCDC's Kafka sink URI so that a TiCDC URI works unchanged (``kafka-version`` is accepted and
ignored: kafka-python negotiates versions). Every error is an :class:`InvalidURI` that names the parameter,
what was given and the fix; SASL passwords never appear in messages or ``repr`` (the URI's ``redacted()``
form is used, and :class:`SaslOptions` keeps its password out of ``repr``).

Parameters (docs/sinks.md, "Kafka sink URI"):

=====================  ==========================================================================================
protocol               canal-json | debezium | open-protocol (required)
partition-num          partitions of a topic this sink creates (default 3); an existing topic must have at least
                       that many (the sink writes to the first partition-num)
replication-factor     replicas of a topic this sink creates (default 1)
max-message-bytes      largest message (key + value + record overhead) the sink sends (default 10 MiB, lowered to
                       the topic's ``max.message.bytes`` when the broker reports a smaller one)
auto-create-topic      create a missing topic (default true); false: a missing topic is an error naming it
kafka-transactional    one Kafka transaction per write (exactly-once for read_committed consumers; default false)
kafka-client-id        the producer's client id (default tidewater)
compression            none | gzip | lz4 | snappy | zstd (default none; lz4/snappy/zstd need their package)
required-acks          -1 only (acks=all: the idempotent producer needs it)
dial-timeout           bootstrap / connect timeout (default 10s); durations are 500ms, 10s, 2m or bare seconds
read-timeout           with write-timeout: how long one request may wait for its answer (default 10s each)
write-timeout
delivery-timeout       how long a message may stay unacknowledged before the write fails (default 30s); the bound
                       on ``flush`` while brokers are down
enable-tls             TLS to the brokers (default false); ca, cert, key: PEM files; insecure-skip-verify
sasl-mechanism         plain | scram-sha-256 | scram-sha-512, with sasl-user and sasl-password
kafka-producer         kafka-python (default) | confluent-kafka: the producer library (confluent-kafka, i.e.
                       librdkafka, sends small messages ~6x faster; the package must be installed)
=====================  ==========================================================================================

Codec parameters (``enable-tidb-extension``, ``max-batch-size``, ``schemas-enable``..., the fields of
``sinks.codec.EncoderConfig`` but the CSV ones) are not this module's: they are kept unparsed in
:attr:`KafkaOptions.codec_params` for ``EncoderConfig.from_params``, which validates them; other names are
refused here.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from cdc.errors import InvalidURI
from cdc.uri import ParsedURI, parse_sink_uri
from sinks.codec.base import EncoderConfig

PROTOCOLS = ("canal-json", "debezium", "open-protocol")
COMPRESSIONS = ("none", "gzip", "lz4", "snappy", "zstd")
SASL_MECHANISMS = {"plain": "PLAIN", "scram-sha-256": "SCRAM-SHA-256", "scram-sha-512": "SCRAM-SHA-512"}

def _codec_params() -> tuple[str, ...]:
    """The codec layer's URI parameters (``sinks.codec.EncoderConfig``) that apply to Kafka's protocols: all but the
    CSV ones (storage sink only) and max-message-bytes (parsed here, and read by the codecs too)."""
    names = [f.name.replace("_", "-") for f in fields(EncoderConfig)]
    return tuple(n for n in names if not n.startswith("csv-") and n != "max-message-bytes")


CODEC_PARAMS = _codec_params()

DEFAULT_PORT = 9092
DEFAULT_PARTITIONS = 3  # TiCDC's default partition-num for a topic it creates
DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024  # TiCDC's default max-message-bytes
MAX_PARTITIONS = 100_000
MAX_REPLICATION_FACTOR = 32767  # int16 on the wire

_TRANSPORT_PARAMS = (
    "protocol", "partition-num", "replication-factor", "max-message-bytes", "auto-create-topic",
    "kafka-transactional", "kafka-client-id", "kafka-version", "compression", "required-acks", "dial-timeout",
    "read-timeout", "write-timeout", "delivery-timeout", "enable-tls", "ca", "cert", "key",
    "insecure-skip-verify", "sasl-mechanism", "sasl-user", "sasl-password", "kafka-producer",
)
PRODUCERS = ("kafka-python", "confluent-kafka")
# Kafka's own rule for topic names (kafka.common.internals.Topic): legal characters, at most 249
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_DURATION = re.compile(r"(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)?")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_TRUE = ("true", "1", "t", "yes", "on")
_FALSE = ("false", "0", "f", "no", "off")


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the brokers: PEM files (None: the system CA store, no client certificate)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class SaslOptions:
    """SASL authentication; ``mechanism`` in kafka-python's spelling (``PLAIN``, ``SCRAM-SHA-256``...)."""

    mechanism: str
    user: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class KafkaOptions:
    """A parsed ``kafka://`` sink URI. Frozen; ``repr`` carries no password. Times are in seconds."""

    brokers: tuple[str, ...]  # "host:port", in URI order
    topic: str  # the default topic (the URI's path)
    protocol: str
    partition_num: int | None = None  # None: not given (an existing topic's count; DEFAULT_PARTITIONS if created)
    replication_factor: int = 1
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    auto_create_topic: bool = True
    transactional: bool = False
    client_id: str = "tidewater"
    compression: str = "none"
    dial_timeout: float = 10.0
    request_timeout: float = 10.0  # max(read-timeout, write-timeout)
    delivery_timeout: float = 30.0
    tls: TlsOptions | None = None
    sasl: SaslOptions | None = None
    codec_params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    producer: str = "kafka-python"  # the producer library: kafka-python | confluent-kafka
    uri: str = field(default="", repr=False, compare=False)  # the URI, redacted (for messages)

    @property
    def partitions_to_create(self) -> int:
        return self.partition_num or DEFAULT_PARTITIONS

    def where(self) -> str:
        """``Kafka at h1:9092,h2:9092`` for messages."""
        return f"Kafka at {','.join(self.brokers)}"


def parse_kafka_uri(raw: str, *, codec_params: Collection[str] = CODEC_PARAMS) -> KafkaOptions:
    """Parse and validate a ``kafka://`` sink URI; :class:`InvalidURI` names the parameter and the fix."""
    uri = parse_sink_uri(raw)
    if uri.scheme != "kafka":
        raise InvalidURI(f"sink URI scheme {uri.scheme!r} is not a Kafka sink")
    return _Parser(uri, codec_params).options()


class _Parser:
    def __init__(self, uri: ParsedURI, codec_params: Collection[str]) -> None:
        self.uri = uri
        self.shown = uri.redacted()
        self.params = uri.params
        self.codec_params = tuple(codec_params)

    def fail(self, message: str) -> InvalidURI:
        return InvalidURI(f"sink URI {self.shown!r}: {message}")

    def options(self) -> KafkaOptions:
        accepted = (*_TRANSPORT_PARAMS, *self.codec_params)
        unknown = sorted(set(self.params) - set(accepted))
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, accepted, n=1)
                hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
            raise self.fail(f"unknown parameter(s) {', '.join(hints)}; accepted: {', '.join(accepted)}")
        topic = self.uri.path
        if not topic:
            raise self.fail("names no topic: use kafka://host:9092/topic-name?protocol=canal-json")
        if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
            raise self.fail(f"topic {topic!r} is not a legal Kafka topic name: use at most 249 of the characters "
                            "a-z A-Z 0-9 . _ -")
        protocol = self.params.get("protocol")
        if not protocol:
            raise self.fail(f"names no protocol: add protocol= one of {', '.join(PROTOCOLS)}")
        if protocol not in PROTOCOLS:
            raise self.fail(f"protocol {protocol!r} is not supported: use protocol= one of {', '.join(PROTOCOLS)}")
        acks = self.params.get("required-acks", "-1")
        if acks.strip() not in ("-1", "all"):
            raise self.fail(f"required-acks={acks} is not supported: the idempotent producer needs acks from every "
                            "in-sync replica; remove required-acks or set required-acks=-1")
        compression = self.params.get("compression", "none").lower()
        if compression not in COMPRESSIONS:
            raise self.fail(f"compression {compression!r} is not supported: use one of {', '.join(COMPRESSIONS)}")
        _require_codec_package(compression, self.fail)
        read_timeout = self.duration("read-timeout", 10.0)
        write_timeout = self.duration("write-timeout", 10.0)
        request_timeout = max(read_timeout, write_timeout)
        delivery_timeout = self.duration("delivery-timeout", 30.0)
        if delivery_timeout < request_timeout:
            raise self.fail(f"delivery-timeout ({delivery_timeout:g}s) must be at least read-timeout and "
                            f"write-timeout ({request_timeout:g}s): a message needs one request to be acknowledged")
        producer = self.params.get("kafka-producer", "kafka-python").strip().lower()
        if producer not in PRODUCERS:
            raise self.fail(f"kafka-producer={producer!r} is not supported: use one of {', '.join(PRODUCERS)}")
        if producer == "confluent-kafka":
            import importlib.util

            if importlib.util.find_spec("confluent_kafka") is None:
                raise self.fail("kafka-producer=confluent-kafka needs the Python package confluent-kafka, which is "
                                "not installed: pip install confluent-kafka (or leave kafka-producer out)")
        client_id = self.params.get("kafka-client-id", "tidewater")
        if not client_id or not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", client_id):
            raise self.fail(f"kafka-client-id {client_id!r} must be 1-255 of the characters a-z A-Z 0-9 . _ -")
        return KafkaOptions(
            brokers=tuple(f"[{h}]:{p or DEFAULT_PORT}" if ":" in h else f"{h}:{p or DEFAULT_PORT}"
                          for h, p in self.uri.hosts),
            topic=topic,
            protocol=protocol,
            partition_num=self.integer("partition-num", 1, MAX_PARTITIONS, example="partition-num=6"),
            replication_factor=self.integer("replication-factor", 1, MAX_REPLICATION_FACTOR,
                                            example="replication-factor=3") or 1,
            max_message_bytes=self.integer("max-message-bytes", 1024, 2**31 - 1,
                                           example="max-message-bytes=1048576") or DEFAULT_MAX_MESSAGE_BYTES,
            auto_create_topic=self.boolean("auto-create-topic", True),
            transactional=self.boolean("kafka-transactional", False),
            client_id=client_id,
            compression=compression,
            dial_timeout=self.duration("dial-timeout", 10.0),
            request_timeout=request_timeout,
            delivery_timeout=delivery_timeout,
            tls=self.tls(),
            sasl=self.sasl(),
            codec_params=MappingProxyType({k: v for k, v in self.params.items() if k in self.codec_params}),
            producer=producer,
            uri=self.shown,
        )

    def integer(self, name: str, low: int, high: int, *, example: str) -> int | None:
        """The parameter's value (None when absent)."""
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            value = int(raw.strip())
        except ValueError:
            raise self.fail(f"{name} must be a whole number from {low} to {high}, got {raw!r} (e.g. {example})"
                            ) from None
        if not low <= value <= high:
            raise self.fail(f"{name} must be from {low} to {high}, got {value} (e.g. {example})")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        raw = self.params.get(name)
        if raw is None:
            return default
        if raw.strip().lower() in _TRUE:
            return True
        if raw.strip().lower() in _FALSE:
            return False
        raise self.fail(f"{name} must be true or false, got {raw!r}")

    def duration(self, name: str, default: float) -> float:
        raw = self.params.get(name)
        if raw is None:
            return default
        m = _DURATION.fullmatch(raw.strip())
        value = float(m.group("num")) * _UNIT_SECONDS[m.group("unit")] if m else 0.0
        if not m or not 0 < value <= 3600:
            raise self.fail(f"{name} must be a duration from 1ms to 1h such as 500ms, 10s or 2m, got {raw!r}")
        return value

    def tls(self) -> TlsOptions | None:
        files = {k: self.params.get(k) for k in ("ca", "cert", "key")}
        skip = self.boolean("insecure-skip-verify", False)
        enabled = self.boolean("enable-tls", False)
        given = [k for k, v in files.items() if v] + (["insecure-skip-verify"] if skip else [])
        if not enabled:
            if given:
                raise self.fail(f"{', '.join(given)} given without enable-tls=true: add enable-tls=true")
            return None
        if bool(files["cert"]) != bool(files["key"]):
            raise self.fail("cert and key go together (the client certificate and its private key)")
        return TlsOptions(files["ca"], files["cert"], files["key"], skip)

    def sasl(self) -> SaslOptions | None:
        mechanism = self.params.get("sasl-mechanism")
        user = self.params.get("sasl-user")
        password = self.params.get("sasl-password")
        if mechanism is None:
            if user is not None or password is not None:
                raise self.fail(f"sasl-user/sasl-password need sasl-mechanism= one of {', '.join(SASL_MECHANISMS)}")
            return None
        name = SASL_MECHANISMS.get(mechanism.strip().lower())
        if name is None:
            raise self.fail(f"sasl-mechanism {mechanism!r} is not supported: use one of {', '.join(SASL_MECHANISMS)}"
                            + (" (GSSAPI/Kerberos is not)" if mechanism.strip().lower() == "gssapi" else ""))
        if not user or password is None:
            raise self.fail(f"sasl-mechanism={mechanism} needs sasl-user and sasl-password")
        return SaslOptions(name, user, password)


def _require_codec_package(compression: str, fail: Callable[[str], InvalidURI]) -> None:
    """lz4, snappy and zstd compress through optional packages; name the one to install up front."""
    if compression in ("none", "gzip"):
        return
    from kafka import codec

    present = {"lz4": codec.has_lz4, "snappy": codec.has_snappy, "zstd": codec.has_zstd}[compression]()
    if not present:
        package = {"lz4": "lz4", "snappy": "python-snappy", "zstd": "zstandard"}[compression]
        raise fail(f"compression={compression} needs the Python package {package!r}, which is not installed: "
                   "install it or use compression=gzip")
