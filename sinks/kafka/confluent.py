"""The Kafka transport over confluent-kafka (librdkafka) instead of kafka-python: ``kafka-producer=confluent-kafka``.

Same contract as :class:`sinks.kafka.transport.KafkaTransport` (it is a subclass: the size check before sending,
topics through the same admin client, the memory bound, ``flush`` bounded by ``delivery-timeout``, transactions and
fencing, errors mapped once into ``cdc.errors``); only the producer calls differ. Why: kafka-python's producer is
the wall of the Kafka sink for small messages (~16 us per message with a header, 61k msg/s of 488 B here), where
librdkafka sends the same messages at 260-450k msg/s (docs/benchmarks.md, "Kafka sink").

librdkafka specifics handled here:
- delivery reports arrive only inside ``poll``/``flush``: ``send`` polls without waiting, and retries ``produce``
  after polling while librdkafka's queue is full (``BufferError``), up to ``delivery-timeout``.
- ``flush(timeout)`` returns how many messages are still queued: any left is a failure (:class:`SinkUnavailable`).
- its errors (``KafkaError`` codes; broker codes are Kafka's, negative ones local) become the kafka-python
  exceptions of the same meaning, so :func:`sinks.kafka.errors.wrap` classifies both libraries alike.
- its log lines go to this module's logger, not to stderr.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kafka import errors as kerr

from sinks.kafka.options import KafkaOptions
from sinks.kafka.transport import BATCH_BYTES, LINGER_MS, MAX_IN_FLIGHT, RETRY_BACKOFF_MS, KafkaTransport

log = logging.getLogger(__name__)


def producer_config(opts: KafkaOptions, transactional_id: str | None, max_pending_bytes: int) -> dict[str, Any]:
    """librdkafka settings equivalent to :func:`sinks.kafka.transport.producer_config`."""
    limit = opts.max_message_bytes
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(opts.brokers),
        "client.id": opts.client_id,
        "acks": "all",
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": MAX_IN_FLIGHT,
        "linger.ms": LINGER_MS,
        "batch.size": min(BATCH_BYTES, limit),
        "message.max.bytes": max(limit + 1024, 1024 * 1024),  # our own check (send) comes first and names the topic
        "delivery.timeout.ms": int(opts.delivery_timeout * 1000),
        "request.timeout.ms": int(opts.request_timeout * 1000),
        "socket.connection.setup.timeout.ms": int(opts.dial_timeout * 1000),
        "retry.backoff.ms": RETRY_BACKOFF_MS,
        "queue.buffering.max.kbytes": max(1, max_pending_bytes // 1024),
        "compression.type": opts.compression,
        "logger": log,
    }
    protocol = "PLAINTEXT"
    if opts.tls is not None:
        protocol = "SSL"
        if opts.tls.ca:
            config["ssl.ca.location"] = opts.tls.ca
        if opts.tls.cert:
            config["ssl.certificate.location"] = opts.tls.cert
            config["ssl.key.location"] = opts.tls.key
        if opts.tls.insecure_skip_verify:
            config["enable.ssl.certificate.verification"] = False
            config["ssl.endpoint.identification.algorithm"] = "none"
    if opts.sasl is not None:
        config.update({"sasl.mechanisms": opts.sasl.mechanism, "sasl.username": opts.sasl.user,
                       "sasl.password": opts.sasl.password})
        protocol = "SASL_SSL" if opts.tls is not None else "SASL_PLAINTEXT"
    config["security.protocol"] = protocol
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
        config["transaction.timeout.ms"] = max(60_000, int(opts.delivery_timeout * 1000) + 10_000)
    return config


def as_kafka_python(err: Any) -> BaseException:
    """A librdkafka ``KafkaError`` (or ``KafkaException``) as the kafka-python exception of the same meaning."""
    from confluent_kafka import KafkaError, KafkaException

    # a fatal error (e.g. _FENCED) that flush() sets while it still serves delivery reports makes the next C call of a
    # callback fail with SystemError("... returned a result with an exception set") caused by the KafkaException:
    # the error that happened is that cause (seen as ErrSinkFatal where a zombie producer must be SinkFenced)
    while isinstance(err, SystemError) and isinstance(err.__cause__, KafkaException):
        err = err.__cause__
    if isinstance(err, KafkaException):
        err = err.args[0] if err.args else None
    if not isinstance(err, KafkaError):
        return err if isinstance(err, BaseException) else kerr.KafkaError(str(err))
    code, text = err.code(), err.str()
    if code == KafkaError._FENCED or code in (KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
        return kerr.ProducerFencedError(text)
    if code >= 0:
        exc = kerr.for_code(code)(text)
        if type(exc) is kerr.UnknownError and err.retriable():
            return kerr.KafkaTimeoutError(text)
        return exc
    if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE):
        return kerr.KafkaConnectionError(text)
    if code in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._QUEUE_FULL) or err.retriable() \
            or err.txn_requires_abort():
        return kerr.KafkaTimeoutError(text)
    return kerr.KafkaError(text)


class _Timeout(kerr.KafkaTimeoutError):
    pass


class ConfluentTransport(KafkaTransport):
    """:class:`KafkaTransport` over confluent-kafka's ``Producer`` (see the module docstring)."""

    def __init__(self, options: KafkaOptions, *, transactional_id: str | None = None,
                 producer_factory: Callable[..., Any] | None = None, **kwargs: Any) -> None:
        super().__init__(options, transactional_id=transactional_id, **kwargs)
        self._confluent_factory = producer_factory
        self._cb_errors: list[BaseException] | None = None
        self._cb: Callable[[Any, Any], None] = lambda err, msg: None

    def _new_producer(self, factory: Callable[..., Any]) -> Any:
        make = self._confluent_factory
        if make is None:
            from confluent_kafka import Producer as make
        return make(producer_config(self.options, self.transactional_id, self._max_pending))

    def _callback(self) -> Callable[[Any, Any], None]:
        """The delivery callback of the current window: errors reported late for messages of an earlier window
        (aborted, discarded) land in that window's list, as with kafka-python's errbacks; purged messages (our own
        abort or close) are no error."""
        if self._cb_errors is not self._errors:
            errors = self._cb_errors = self._errors
            from confluent_kafka import KafkaError

            purged = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)

            def on_delivery(err: Any, _msg: Any) -> None:
                if err is not None and err.code() not in purged:
                    errors.append(as_kafka_python(err))

            self._cb = on_delivery
        return self._cb

    def _produce(self, producer: Any, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]] | None) -> None:
        deadline = 0.0
        on_delivery = self._callback()
        while True:
            try:
                producer.produce(topic, value, key, partition, on_delivery=on_delivery, headers=headers)
                break
            except BufferError:  # librdkafka's queue is full: serve delivery reports, then again
                now = time.monotonic()
                deadline = deadline or now + self.options.delivery_timeout
                if now > deadline:
                    raise _Timeout(f"librdkafka's queue stayed full for {self.options.delivery_timeout:g} s") from None
                producer.poll(0.05)
            except Exception as exc:
                raise as_kafka_python(exc) from exc
        producer.poll(0)

    def _flush_producer(self, producer: Any, timeout: float) -> None:
        try:
            left = producer.flush(timeout)
        except Exception as exc:
            raise as_kafka_python(exc) from exc
        if left:
            raise _Timeout(f"{left} message(s) not acknowledged within {timeout:g} s")

    def _txn(self, producer: Any, method: str) -> None:
        timeout = self.options.dial_timeout + self.options.delivery_timeout
        try:
            if method == "begin_transaction":
                producer.begin_transaction()
            else:
                getattr(producer, method)(timeout)
        except Exception as exc:
            raise as_kafka_python(exc) from exc

    def _close_producer(self, producer: Any, grace: float) -> None:
        try:
            left = producer.flush(grace)
            if left and self.transactional_id is None:
                log.info("%s: %d message(s) dropped at close", self.options.where(), left)
            producer.purge()
        except Exception as exc:  # noqa: BLE001 - closing a broken producer
            log.debug("confluent producer close: %s", exc)
