"""The Kafka transport: bytes to topic partitions through kafka-python's producer, acknowledged by every in-sync
replica. Not a Sink: the Kafka sink encodes row changes (``sinks.codec``), picks topics and partitions
(dispatchers) and uses this to deliver them.

Contract (one caller thread at a time):
- ``send(topic, partition, key, value)`` queues one message and returns; it blocks only to wait for topic
  metadata or, when ``max_pending_bytes`` of messages are unacknowledged, until those are. Before queueing it
  checks the message's size (key + value + headers + Kafka's record overhead, as the producer counts it) against
  the topic's limit (``max-message-bytes``, or the topic's ``max.message.bytes`` when smaller): a larger message
  raises ``sinks.codec.MessageTooLarge`` (a :class:`SinkError`) naming the topic, partition, size and limit, and is
  not sent (the sink, which knows the table and key, checks first with :func:`message_size` and may send the
  codec's key-only form instead). The topic is looked up
  (and created, if ``auto-create-topic``) on its first use: :meth:`partitions` gives its partition count.
- ``flush()`` returns only once every message queued since the last ``flush`` is acknowledged (acks=all), and
  returns their number. Messages of one partition are written in ``send`` order, retries included (idempotent
  producer, at most 5 requests in flight per connection). The wait is bounded by ``delivery-timeout``
  (default 30 s): brokers unreachable or not answering raise :class:`SinkUnavailable`; a refusal that retrying
  cannot fix (too large, not authorized) raises :class:`SinkError` naming the topic. After any exception none of
  those messages may be assumed delivered (some may have been: at-least-once); the producer is discarded and
  the next ``send`` opens a new one (and looks its topics up again).
- Transactional mode (``kafka-transactional=true``, a ``transactional_id`` per span): ``begin()``, sends,
  ``commit()`` make the messages visible to ``read_committed`` consumers together or not at all; ``abort()``
  drops them. Opening the producer fences older producers with the same id (their open transaction is aborted
  by the broker); a producer fenced by a newer one raises :class:`SinkFenced`. Without transactions ``flush``
  is the commit point.
- ``check()`` connects and looks up (or creates) the default topic: for ``changefeed create``, so that an
  unreachable broker (:class:`SinkUnavailable`) or a missing topic with auto-create off (:class:`SinkError`)
  fails up front. ``close()`` waits up to a few seconds for queued messages, then drops them.

Throughput (200-byte messages, tansu on this machine, docs/sinks.md "Test broker"): the producer's Python code
is the limit (~11 us per message: 88-90k msg/s raw, 84-85k through this transport); ``linger_ms``/``batch_size``
below were measured with ``python -m bench.kafka_producer``.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder

from cdc.errors import SinkError, TidewaterError
from sinks.codec.base import MessageTooLarge
from sinks.kafka.errors import describe, wrap
from sinks.kafka.options import KafkaOptions
from sinks.kafka.topics import TopicAdmin, TopicInfo

log = logging.getLogger(__name__)

# Measured with bench/kafka_producer.py (200-byte messages, 3 partitions, tansu): batch_size 16 KiB -> 256 KiB took
# kafka-python from 35-47k to 88-90k msg/s (fewer, larger requests); 1 MiB gave no more. linger_ms 0 and 5 were
# equal for a tight loop; 5 ms lets batches fill while the sink encodes between sends (flush sends at once anyway).
LINGER_MS = 5
BATCH_BYTES = 256 * 1024  # per-partition batch; capped at the message size limit
MAX_IN_FLIGHT = 5  # per connection: the most that keeps order with the idempotent producer
RETRY_BACKOFF_MS = 100
RECONNECT_BACKOFF_MAX_MS = 1000
DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
_CLOSE_GRACE = 5.0  # seconds close() waits for queued messages
_OVERHEAD_SLACK = 128  # above Kafka's batch header + record overhead: below this no exact size is computed


def message_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None = None) -> int:
    """A message's size as the broker limits it: a record batch holding only it (batch header, record overhead,
    key, value, headers), as kafka-python counts it. ``send`` refuses a message above :meth:`KafkaTransport.topic`'s
    ``max_message_bytes`` by this count; the codecs' ``Message.size`` (TiCDC's) leaves out the 61-byte batch header."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers or []))


def client_config(opts: KafkaOptions) -> dict[str, Any]:
    """kafka-python settings shared by the producer and the admin client (connection, TLS, SASL, timeouts)."""
    return {
        "bootstrap_servers": list(opts.brokers),
        "client_id": opts.client_id,
        "request_timeout_ms": int(opts.request_timeout * 1000),
        "bootstrap_timeout_ms": int(opts.dial_timeout * 1000),
        "retry_backoff_ms": RETRY_BACKOFF_MS,
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        **security_config(opts),
    }


def security_config(opts: KafkaOptions) -> dict[str, Any]:
    """kafka-python's TLS and SASL settings for ``opts`` (``security_protocol`` always; the producer, the admin
    client and the consumer library use the same)."""
    config: dict[str, Any] = {}
    protocol = "PLAINTEXT"
    if opts.tls is not None:
        context = ssl.create_default_context(cafile=opts.tls.ca)
        if opts.tls.cert:
            context.load_cert_chain(opts.tls.cert, opts.tls.key)
        if opts.tls.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        config["ssl_context"] = context
        protocol = "SSL"
    if opts.sasl is not None:
        config.update(sasl_mechanism=opts.sasl.mechanism, sasl_plain_username=opts.sasl.user,
                      sasl_plain_password=opts.sasl.password)
        protocol = "SASL_SSL" if opts.tls is not None else "SASL_PLAINTEXT"
    config["security_protocol"] = protocol
    return config


def producer_config(opts: KafkaOptions, transactional_id: str | None) -> dict[str, Any]:
    limit = opts.max_message_bytes
    config = client_config(opts)
    config.update(
        acks="all",
        enable_idempotence=True,
        delivery_timeout_ms=int(opts.delivery_timeout * 1000),
        max_block_ms=int(opts.dial_timeout * 1000),
        max_in_flight_requests_per_connection=MAX_IN_FLIGHT,
        linger_ms=LINGER_MS,
        batch_size=min(BATCH_BYTES, limit),
        max_request_size=max(limit, 1024 * 1024),  # our own check (send) comes first and names the topic
        compression_type=None if opts.compression == "none" else opts.compression,
        allow_auto_create_topics=opts.auto_create_topic,
    )
    if transactional_id is not None:
        config["transactional_id"] = transactional_id
    return config


class KafkaTransport:
    """Delivers messages to Kafka for one sink (one span): see the module docstring for the contract.

    ``producer_factory``/``admin_factory`` replace kafka-python's ``KafkaProducer``/``KafkaAdminClient`` (unit
    tests). ``max_pending_bytes`` bounds the bytes of unacknowledged messages kept in memory.
    """

    def __init__(self, options: KafkaOptions, *, transactional_id: str | None = None,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 producer_factory: Callable[..., Any] | None = None,
                 admin_factory: Callable[..., Any] | None = None) -> None:
        if options.transactional and not transactional_id:
            raise ValueError("kafka-transactional=true needs a transactional_id (one per span)")
        self.options = options
        self.transactional_id = transactional_id if options.transactional else None
        self._max_pending = max(max_pending_bytes, options.max_message_bytes)
        self._producer_factory = producer_factory
        self._admin = TopicAdmin(options, client_config(options), admin_factory=admin_factory)
        self._producer: Any = None
        self._topics: dict[str, TopicInfo] = {}
        # messages since the last flush: their number, bytes not yet drained, topics, and the errors their futures
        # reported (appended by kafka-python's network thread). Futures themselves are not kept: holding 100k
        # of them until flush cost 30 % of the throughput in garbage collection.
        self._count = 0
        self._pending_bytes = 0
        self._window_topics: set[str] = set()
        self._errors: list[BaseException] = []
        self._errback = self._errors.append
        self._in_txn = False
        self._closed = False

    # ---- topics ----------------------------------------------------------------------------------------
    def topic(self, topic: str, partitions: int | None = None) -> TopicInfo:
        """The topic as this transport uses it (looked up, or created, on first use). ``partitions``: a topic of
        the sink's own, created with that many partitions and used as it is (``TopicAdmin.ensure``)."""
        info = self._topics.get(topic)
        if info is None:
            self._check_open()
            info = self._topics[topic] = self._admin.ensure(topic, partitions)
        return info

    def partitions(self, topic: str) -> int:
        """How many partitions of ``topic`` the sink writes to (0 .. n-1)."""
        return self.topic(topic).partitions

    def all_partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (more than :meth:`partitions` when ``partition-num`` is smaller): where
        watermarks go."""
        return self.topic(topic).all_partitions

    def check(self) -> None:
        """Connect and look up (or create) the default topic; SinkUnavailable/SinkError naming the problem."""
        info = self.topic(self.options.topic)
        log.info("%s: topic %s has %d partition(s), messages up to %d bytes", self.options.where(), info.name,
                 info.partitions, info.max_message_bytes)

    # ---- sending ---------------------------------------------------------------------------------------
    def send(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        """Queue one message for ``partition`` of ``topic`` (see the module docstring)."""
        info = self._topics.get(topic) or self.topic(topic)
        size = (len(key) if key else 0) + (len(value) if value else 0)
        if headers or size + _OVERHEAD_SLACK > info.max_message_bytes:
            size = message_size(key, value, headers)
            if size > info.max_message_bytes:
                raise MessageTooLarge(
                    f"a message for topic {topic} partition {partition} is {size} bytes, above the limit of "
                    f"{info.max_message_bytes} (max-message-bytes={self.options.max_message_bytes}"
                    + (f", the topic's max.message.bytes={info.max_message_bytes}"
                       if info.max_message_bytes < self.options.max_message_bytes else "")
                    + "): not sent; raise max-message-bytes (and the topic's max.message.bytes) or make the row "
                    "smaller")
        if not 0 <= partition < info.partitions:
            raise SinkError(f"internal: partition {partition} of topic {topic} is outside 0..{info.partitions - 1}")
        if self._pending_bytes >= self._max_pending:
            self._wait_acked()  # the memory bound: the messages stay counted for the next flush
        producer = self._producer or self._open()
        try:
            self._produce(producer, topic, partition, key, value, headers)
        except Exception as exc:
            raise self._fail(exc, topic, size) from exc
        self._count += 1
        self._pending_bytes += size
        if topic not in self._window_topics:
            self._window_topics.add(topic)

    def flush(self) -> int:
        """Wait until every message sent since the last flush is acknowledged; return how many there were."""
        self._check_open()
        self._wait_acked()
        count = self._count
        self._reset_window()
        return count

    def _wait_acked(self) -> None:
        producer = self._producer
        if producer is None:
            return
        # Every queued batch was created before now, so kafka-python must have acknowledged or expired it within
        # delivery-timeout from now; it does not always expire batches in flight to a broker that vanished (seen
        # after a SIGKILL of the broker: still waiting 11 s later), hence our own deadline.
        try:
            self._flush_producer(producer, self.options.delivery_timeout + 1.0)
        except Exception as exc:
            raise self._fail(exc, self._window_topic(), None, doing="waiting for acknowledgements") from exc
        if self._errors:
            exc = self._errors[0]
            raise self._fail(exc, self._window_topic(), None) from exc
        self._pending_bytes = 0

    def _window_topic(self) -> str | None:
        """The topic of the messages since the last flush when there is one (to name it in errors)."""
        return next(iter(self._window_topics)) if len(self._window_topics) == 1 else None

    def _reset_window(self) -> None:
        self._count = self._pending_bytes = 0
        self._window_topics.clear()
        # a new list: errors kafka-python reports late for messages of the old window (aborted, discarded) land in
        # the old one
        self._errors = []
        self._errback = self._errors.append

    # ---- transactions ----------------------------------------------------------------------------------
    def begin(self) -> None:
        """Start a transaction (transactional mode only); the messages sent until commit/abort belong to it."""
        self._need_txn("begin")
        producer = self._producer or self._open()
        try:
            self._txn(producer, "begin_transaction")
        except Exception as exc:
            raise self._fail(exc, None, None, doing="beginning a transaction") from exc
        self._in_txn = True

    def commit(self) -> int:
        """Flush and commit the open transaction: its messages become visible together. Returns their number."""
        self._need_txn("commit")
        if not self._in_txn:
            raise SinkError("internal: commit without begin")
        count = self.flush()
        try:
            self._txn(self._producer, "commit_transaction")
        except Exception as exc:
            raise self._fail(exc, None, None, doing="committing a transaction") from exc
        self._in_txn = False
        return count

    def abort(self) -> None:
        """Abort the open transaction (its messages are never visible to read_committed consumers). Never
        raises for a broken producer: it is discarded instead (the broker aborts when the next one opens)."""
        self._need_txn("abort")
        self._in_txn = False
        self._reset_window()
        producer = self._producer
        if producer is None:
            return
        try:
            self._txn(producer, "abort_transaction")
        except Exception as exc:  # noqa: BLE001 - the replacement producer's init aborts it on the broker
            log.info("%s: abort failed (%s); the producer is replaced", self.options.where(), describe(exc))
            self._discard()

    def _need_txn(self, what: str) -> None:
        self._check_open()
        if self.transactional_id is None:
            raise SinkError(f"internal: {what} needs kafka-transactional=true")

    # ---- producer lifecycle ----------------------------------------------------------------------------
    def _open(self) -> Any:
        self._check_open()
        factory = self._producer_factory
        if factory is None:
            from kafka import KafkaProducer as factory
        where = self.options.where()
        try:
            producer = self._new_producer(factory)
        except Exception as exc:
            raise wrap(exc, where, doing="connecting") from exc
        if self.transactional_id is not None:
            try:
                self._txn(producer, "init_transactions")  # fences older producers of this id; their open
            except Exception as exc:  # transaction aborts
                self._close_producer(producer, 0)
                raise wrap(exc, where, doing=f"initializing transactional id {self.transactional_id}") from exc
        self._producer = producer
        return producer

    def _fail(self, exc: BaseException | None, topic: str | None, size: int | None,
              doing: str = "sending") -> TidewaterError:
        """Map ``exc``, discard the producer (and what it holds), forget topic lookups (the broker may have lost
        them); the caller raises the result."""
        limit = self._topics[topic].max_message_bytes if topic in self._topics else None
        err = wrap(exc or RuntimeError("unknown producer failure"), self.options.where(), topic=topic, size=size,
                   limit=limit, doing=doing)
        self._discard()
        self._reset_window()
        return err

    def _discard(self) -> None:
        producer, self._producer = self._producer, None
        self._in_txn = False
        self._topics.clear()
        self._admin.close()
        if producer is not None:
            self._close_producer(producer, 0)

    def close(self) -> None:
        """Wait up to a few seconds for queued messages, then drop them and release the connections."""
        if self._closed:
            return
        self._closed = True
        producer, self._producer = self._producer, None
        if producer is not None:
            self._close_producer(producer, _CLOSE_GRACE)
        self._admin.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SinkError(f"Kafka transport to {','.join(self.options.brokers)} is closed")

    # ---- the producer library (kafka-python here; sinks.kafka.confluent overrides these) ---------------------
    def _new_producer(self, factory: Callable[..., Any]) -> Any:
        return factory(**producer_config(self.options, self.transactional_id))

    def _produce(self, producer: Any, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]] | None) -> None:
        producer.send(topic, value=value, key=key, headers=headers, partition=partition).add_errback(self._errback)

    def _flush_producer(self, producer: Any, timeout: float) -> None:
        producer.flush(timeout=timeout)

    def _txn(self, producer: Any, method: str) -> None:
        """A transaction call within ``dial-timeout + delivery-timeout``. kafka-python's ``commit_transaction`` and
        ``abort_transaction`` wait without a bound (an abort by a producer fenced by its successor never ended on
        tansu), so they are started here and waited for with the deadline; a timeout raises (the caller discards
        the producer; the broker aborts what it held when the next one opens)."""
        ends = {"commit_transaction": "begin_commit", "abort_transaction": "begin_abort"}
        manager = getattr(producer, "_transaction_manager", None)
        if method not in ends or manager is None:
            getattr(producer, method)()
            return
        result = getattr(manager, ends[method])()
        producer._sender.wakeup()  # noqa: SLF001 - what kafka-python's own commit/abort does before waiting
        timeout = self.options.dial_timeout + self.options.delivery_timeout
        if not result.wait(timeout_ms=int(timeout * 1000)):
            from kafka.errors import KafkaTimeoutError

            raise KafkaTimeoutError(f"{method} did not complete within {timeout:g} s")

    def _close_producer(self, producer: Any, grace: float) -> None:
        _close_producer(producer, grace)


def _close_producer(producer: Any, grace: float) -> None:
    """Close a kafka-python producer within ``grace`` seconds whatever its state. Its ``close`` raises while
    batches are incomplete and then leaves its network thread running: stop that thread (which fails the
    batches) and close again."""
    t0 = time.monotonic()
    try:
        producer.close(timeout=grace)
        return
    except Exception as exc:  # noqa: BLE001 - forced below
        log.debug("producer close: %s; forcing", describe(exc))
    sender = getattr(producer, "_sender", None)
    if sender is not None:
        sender.force_close()
        sender.join(max(1.0, grace - (time.monotonic() - t0)))
    try:
        producer.close(timeout=0)
    except Exception as exc:  # noqa: BLE001 - nothing more to do
        log.warning("a Kafka producer did not close cleanly: %s", describe(exc))
