"""The Kafka sink (``kafka://``): row changes, DDL and watermarks as messages of one protocol (``sinks.codec``),
dispatched to topics and partitions (``sinks.kafka.dispatcher``), delivered by ``sinks.kafka.transport``.

Guarantees (the contracts of its roles in :mod:`sinks.base` and :mod:`sinks.copy_roles`, and what Kafka changes in
them):

- ``write(changes)`` takes whole transactions in commit order and returns once every message of them is
  acknowledged by all in-sync replicas (acks=all, idempotent producer): the span's checkpoint moves only past
  delivered messages. A key change (an UPDATE whose key differs) is split into a delete of the old key and an
  insert of the new one before dispatch (TiCDC's rule), so each goes to its own key's partition. Messages of one
  partition are written in change order, so one key's changes keep their order within its partition (with the
  ``table`` and ``index-value`` dispatchers; ``ts`` spreads a key over partitions by commit Ts).
- One encoder per (topic, partition); batching protocols (open-protocol) never mix partitions.
- ``apply_ddl`` sends the protocol's DDL message after every row before it (those were acknowledged) and before
  every row after it: canal-json to partition 0 of the table's topic (TiCDC's choice), the other protocols to every
  partition of it; a TRUNCATE is routed the same way. It returns once acknowledged.
- **Size**: every message is checked against ``max-message-bytes`` (or the topic's smaller ``max.message.bytes``)
  before sending. An oversized row is sent in TiCDC's key-only form (``large-message-handle-option=
  handle-key-only``), or stored in full under ``claim-check-storage-uri`` (a local ``file://`` directory, written
  and fsynced before the message that points at it is sent) with a key-only message carrying its location
  (``claim-check``), or fails the write with :class:`sinks.codec.MessageTooLarge` naming the table, the key, the
  size and the limit (``none``, the default; and always for Debezium, which has no key-only form). Never dropped
  (:mod:`sinks.kafka.large`).
- **Watermarks**: ``publish_checkpoint(ts, time)`` (the owner, with the changefeed checkpoint) sends a watermark to
  every partition of every topic in use; it is consistent for any consumer: every change with a commit Ts at or
  below it is before it in every partition. ``publish_resolved`` (the span, after its checkpoint moved; header
  ``tidewater: i/n``) does the same for one span's changes; with one span (``span-watermarks=auto``) it is
  consistent for every consumer, with several a consumer must take the minimum over all n spans per partition
  (``sinks.kafka.consumer`` does).
- **Duplicates**: at-least-once by default (a write that fails after some messages were acknowledged is replayed
  in full). Every row and DDL message carries a header ``tidewater`` (``i/n:seq``: its span and its events'
  positions in their transaction, ``sinks.kafka.headers``), so a consumer can drop replays exactly:
  ``sinks.kafka.consumer`` does. Writes of the initial copy (chunks in parallel, a failed chunk copied again) number their events from the
  write's start time instead, so an attempt sorts after the one before it and nothing of it is taken for a
  duplicate (the copy is idempotent by key; a key-less table's chunk is a TRUNCATE and its rows).
- **Exactly-once** (``kafka-transactional=true``): each ``write``/``apply_ddl``/watermark is one Kafka transaction
  per span (transactional id ``tidewater-<changefeed>-<span>``), holding the messages and the span's position in
  the metadata topic (``sinks.kafka.meta``); ``open_position`` reads it back and later calls drop what is already
  committed, so a ``read_committed`` consumer of a broker with Kafka's transaction semantics sees every change once.
  Opening the producer fences the span's previous producer (``SinkFenced``, retryable).
- Errors: brokers unreachable -> :class:`SinkUnavailable` (within ``delivery-timeout``); refused or oversized ->
  :class:`SinkError`; after an exception nothing of the call counts as delivered (the span replays it).
- Threading: one caller thread at a time (``publish_checkpoint`` on an instance of its own). ``close`` waits a few
  seconds for queued messages.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from cdc.config import SinkConfig
from cdc.errors import InvalidArgument, InvalidURI, SinkError
from cdc.events import SNAPSHOT, DdlEvent, OpType, RowChange, TableName, TableSchema
from cdc.model import DataWarning
from cdc.snapshot import CopiedChunk
from cdc.ts import Watermark
from sinks.base import CheckpointSink, DdlSink, TxnSink, WatermarkSink
from sinks.codec import EncoderConfig, Message, encoder_for
from sinks.codec.base import split_key_change
from sinks.copy_roles import CopyAnnouncer, CopyTargets, ResyncRefusal
from sinks.kafka.copy_markers import announcement, chunk_marker
from sinks.kafka.dispatcher import Dispatcher
from sinks.kafka.headers import HEADER, copy_value, ddl_header, row_header, span_value
from sinks.kafka.large import LargeMessages
from sinks.kafka.meta import MetaTopic, Reader
from sinks.kafka.options import CODEC_PARAMS, KafkaOptions, parse_kafka_uri
from sinks.kafka.outbox import Dest, Outbox
from sinks.kafka.skipped import Skips

if TYPE_CHECKING:
    from sinks.kafka.transport import KafkaTransport

log = logging.getLogger(__name__)

SPAN_WATERMARK_MODES = ("auto", "true", "false")
SINK_PARAMS = ("large-message-handle-option", "claim-check-storage-uri", "span-watermarks")
SPAN_WATERMARK_INTERVAL = 1.0  # seconds between a span's watermarks
SEQ_STRIDE = 4  # event positions per change: a split key change's halves and a Debezium key change's records
DRAIN_ROWS = 2000  # rows appended before the encoders' messages are sent (bounds memory in a big transaction)
INSTALL_HINT = "pip install 'tidewater[kafka]'"

TransportFactory = Callable[[KafkaOptions, "str | None"], "KafkaTransport"]


def _kafka_missing() -> bool:
    return importlib.util.find_spec("kafka") is None


def default_transport(options: KafkaOptions, transactional_id: str | None) -> KafkaTransport:
    """The transport of ``kafka-producer`` (imported here: the extra ``kafka``; confluent-kafka when asked for)."""
    try:
        from sinks.kafka.transport import KafkaTransport
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "kafka":
            raise SinkError(f"the Kafka sink needs kafka-python, which is not installed: {INSTALL_HINT}") from exc
        raise
    if options.producer == "confluent-kafka":
        from sinks.kafka.confluent import ConfluentTransport

        return ConfluentTransport(options, transactional_id=transactional_id)
    return KafkaTransport(options, transactional_id=transactional_id)


def default_meta_reader(options: KafkaOptions) -> Reader:
    """The metadata topic's reader (imported here: the extra ``kafka``)."""
    from sinks.kafka.metaread import MetaReader

    return MetaReader(options)


@dataclasses.dataclass
class Sending:
    """What the body of :meth:`KafkaSink._sending` hands its frame: the span's position it sent up to (None: none)."""

    position: tuple[int, int] | None = None


class KafkaSink(TxnSink, DdlSink, CheckpointSink, WatermarkSink, CopyAnnouncer, CopyTargets, ResyncRefusal):
    """Row changes to Kafka (see the module docstring for the guarantees)."""

    def __init__(self, uri: str, config: SinkConfig | None = None, *,
                 transport_factory: TransportFactory | None = None, clock: Callable[[], float] = time.time,
                 meta_reader: Callable[[KafkaOptions], Reader] | None = None) -> None:
        config = config or SinkConfig()
        self.options = options = parse_kafka_uri(uri, codec_params=(*CODEC_PARAMS, *SINK_PARAMS))
        params = dict(options.codec_params)
        if transport_factory is None and _kafka_missing():
            raise InvalidArgument(f"the Kafka sink needs kafka-python, which is not installed: {INSTALL_HINT}")
        self._large = LargeMessages.from_params(params, options.protocol, options.uri)
        self._skips = Skips(options.protocol, EncoderConfig.from_params(params), params, options.uri)
        self._span_watermarks = params.pop("span-watermarks", "auto").lower()
        if self._span_watermarks not in SPAN_WATERMARK_MODES:
            raise InvalidURI(f"sink URI {options.uri!r}: span-watermarks={self._span_watermarks!r}: use auto, true or "
                             "false")
        base = EncoderConfig(max_message_bytes=options.max_message_bytes)
        self.codec = EncoderConfig.from_params(params, base=base)
        self._clock = clock
        self.out = Outbox(options.protocol, self.codec, self._large, clock=clock)  # row messages to partitions
        self.control = encoder_for(options.protocol, self.codec, clock=clock)  # DDL and watermarks
        self.dispatcher = Dispatcher(config.dispatchers, options.topic)
        self._factory = transport_factory or default_transport
        self.meta = MetaTopic(options, table_topics=self.dispatcher.has_table_topics, clock=clock,
                              reader=meta_reader or default_meta_reader)
        self._transport: KafkaTransport | None = None
        # per table schema (by id, the schema held): (schema, topic, partitioner, partition count)
        self._routes: dict[int, tuple[TableSchema, str, Callable[[RowChange, int], int], int]] = {}
        self._plain: KafkaTransport | None = None  # non-transactional, beside a transactional one
        # the span this sink writes for (bind_span / open_position)
        self.changefeed: str | None = None
        self.span: int | None = None
        self.spans = 1
        self._span_header: bytes | None = None
        self._origin = 0
        # event positions: per commit Ts, the changes and DDLs seen in it (event positions) and its DDLs so far
        self._seq_ts = -1
        self._pos = 0
        self._txn_ddls = 0
        # exactly-once: the position (commit Ts, step) of the span's last committed Kafka transaction
        self._applied: tuple[int, int] = (0, -1)
        self._positioned = False
        self.watermark_interval = 0.0
        self._closed = False

    # ---- the roles (sinks.base, sinks.copy_roles) ------------------------------------------------------
    def check(self) -> None:
        if self.options.transactional and self._transport is None and self.changefeed is None:
            probe = self._factory(dataclasses.replace(self.options, transactional=False), None)
            try:
                probe.check()
            finally:
                probe.close()
            return
        self._tr().check()

    def take_warnings(self) -> list[DataWarning]:
        """Notices of what ``skipped-operations`` / ``include-schema-changes=false`` left out (per table)."""
        return self._skips.take_warnings()

    def target_name(self, table: TableName) -> str:
        return f"{self.dispatcher.topic(table)}/{table}"

    def bind_span(self, changefeed: str, span: int, spans: int) -> None:
        """The span this sink writes for: span ``span`` (0-based) of ``spans`` of ``changefeed``; before any write."""
        self.changefeed, self.span, self.spans = changefeed, span, max(1, spans)
        self._span_header = span_value(span, self.spans)
        on = self._span_watermarks == "true" or (self._span_watermarks == "auto" and self.spans == 1)
        self.watermark_interval = SPAN_WATERMARK_INTERVAL if on else 0.0

    @property
    def applied(self) -> tuple[int, int]:
        """The span's position, ``(commit Ts, step)``: the last one committed, or read back by :meth:`open_position`
        (``(0, -1)``: none)."""
        return self._applied

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        if self.changefeed is None or (self.changefeed, self.span) != (changefeed, span):
            self.bind_span(changefeed, span, self.spans)
        self._origin = origin
        if not self.options.transactional:
            return 0
        stored = self.meta.stored_position(self._tr(), changefeed, span)
        self._positioned = True
        if not stored:
            self._applied = (0, -1)
            return 0
        if origin and stored.get("origin") not in (None, origin):
            log.warning("changefeed=%s span=%d: the Kafka metadata topic holds position %s of an earlier changefeed "
                        "with this id (origin %s, this one starts at %d); ignored", changefeed, span,
                        stored.get("ts"), stored.get("origin"), origin)
            self._applied = (0, -1)
            return 0
        self._applied = (int(stored["ts"]), int(stored.get("step", -1)))
        return self._applied[0]

    # ---- writing rows ----------------------------------------------------------------------------------
    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        tr = self._tr()
        txn = self._txn_mode()
        try:
            # (without a transaction _write fences each batch it sends, and nothing is left to fence at the end)
            with self._sending(tr, txn, fence if txn else None) as sending:
                count, sending.position = self._write(tr, changes, fence)
        except BaseException:
            self.out.clear()  # encoders' state is unspecified after an error
            self._routes.clear()
            raise
        return count

    def _write(self, tr: KafkaTransport, changes: Iterable[RowChange], fence: Callable[[], None] | None
               ) -> tuple[int, tuple[int, int] | None]:
        count = appended = copied = 0
        last: tuple[int, int] | None = None
        applied = self._applied if self._positioned else None
        copy_base = 0
        unbound = self.span is None
        routes, dests = self._routes, self.out.dests
        debezium = self.options.protocol == "debezium"
        skip = self._skips.ops  # skipped-operations (sinks.kafka.skipped): empty unless asked for
        UPDATE, TRUNCATE = OpType.UPDATE, OpType.TRUNCATE  # noqa: N806 - locals for the loop
        for change in changes:
            ts = change.commit_ts
            if ts != self._seq_ts:
                self._seq_ts, self._pos, self._txn_ddls = ts, 0, 0
            pos = self._pos
            self._pos = pos + 1
            step = 2 * self._txn_ddls
            if applied is not None and (ts, step) <= applied:
                continue  # committed by an earlier transaction of this span
            copying = unbound or change.extra.get(SNAPSHOT) is True
            if copying:  # the initial copy's writers: see _copy_base
                copy_base = copy_base or _copy_base()
                base = copy_base + copied * SEQ_STRIDE
                copied += 1
            else:
                base = pos * SEQ_STRIDE
            op = change.op
            if skip and op in skip and change.extra.get(SNAPSHOT) is not True:  # (a copied row is always written)
                self._skips.skipped(str(change.table), op)
                last = (ts, step)
                continue
            if op is TRUNCATE:
                self._append_all(tr, change, base)
            else:
                halves = split_key_change(change) if op is UPDATE else None
                for i, half in enumerate(halves or (change,)):
                    schema = half.schema
                    r = routes.get(id(schema))
                    if r is None or r[0] is not schema:
                        route = self.dispatcher.route(schema)
                        r = routes[id(schema)] = (schema, route.topic, route.partition, tr.partitions(route.topic))
                    key = (r[1], r[2](half, r[3]))
                    d = dests.get(key) or self._dest(tr, *key)
                    d.enc.append_row(half)
                    d.items.append((half, base + 2 * i))
                    if copying:
                        d.copied += 1
                    if debezium and halves is None and op is UPDATE and _key_changed(half):
                        d.items.append((half, base + 1))  # Debezium writes an unsplit key change as two records
            count += 1
            last = (ts, step)
            appended += 1
            if appended >= DRAIN_ROWS:
                if fence is not None:
                    fence()
                self.out.drain(tr, self._span_header, self.span)
                appended = 0
        if fence is not None and appended:
            fence()
        self.out.drain(tr, self._span_header, self.span)
        return count, last

    def write_copy_chunk(self, changes: Iterable[RowChange], chunk: CopiedChunk,
                         fence: Callable[[], None] | None = None) -> int:
        """A copy writer's chunk (``CopyAnnouncer.write_copy_chunk``): its rows as ``write`` sends them, each header
        naming the chunk (``-<chunk>:...``), then, once they are acknowledged, the chunk's marker in the metadata topic:
        how many rows went to each partition (``sinks.kafka.copy_markers``). A failure before the marker leaves the
        chunk unrecorded: the copy writes it again."""
        self.out.reset_copied()
        before = self._span_header
        self._span_header = copy_value(chunk.index)
        try:
            count = self.write(changes, fence)
        finally:
            self._span_header = before
        self.meta.record_copy(self._tr(), [chunk_marker(chunk, self.out.copied())])
        return count

    def announce_copy(self, chunks: Sequence[CopiedChunk]) -> None:
        """The copies of the tables of ``chunks`` are complete (``CopyAnnouncer.announce_copy``): an announcement per
        table in the metadata topic (``sinks.kafka.copy_markers``), acknowledged together."""
        by_table: dict[TableName, list[CopiedChunk]] = {}
        for c in chunks:
            by_table.setdefault(c.table, []).append(c)
        self.meta.record_copy(self._tr(), [announcement(t, cs) for t, cs in by_table.items()])

    def _position(self, ts: int) -> int:
        """The next event position in transaction ``ts`` (row changes and DDL count alike, skipped or not, so a
        replay numbers every event as the first run did)."""
        if ts != self._seq_ts:
            self._seq_ts, self._pos, self._txn_ddls = ts, 0, 0
        pos = self._pos
        self._pos += 1
        return pos

    def _dest(self, tr: KafkaTransport, topic: str, partition: int) -> Dest:
        d = self.out.dest(tr, topic, partition)
        self.meta.use_topic(tr, topic)  # (watermarks reach every topic in use)
        return d

    def _append_all(self, tr: KafkaTransport, change: RowChange, seq: int) -> None:
        """A TRUNCATE: to the partitions a DDL of its table goes to, with one event position."""
        topic = self.dispatcher.topic(change.table)
        for p in self._ddl_partitions(tr, topic):
            d = self._dest(tr, topic, p)
            d.enc.append_row(change)
            d.items.append((change, seq))

    def _ddl_partitions(self, tr: KafkaTransport, topic: str) -> range:
        return range(1) if self.options.protocol == "canal-json" else range(tr.partitions(topic))

    def _ddl_headers(self, msg: Message, seq: int, event: DdlEvent) -> list[tuple[str, bytes]]:
        """The protocol's headers, ``tidewater`` and, for a column-set change, ``tidewater-ddl`` (what the statement
        does, exactly: a consumer renames instead of dropping and adding; ``sinks.kafka.headers``)."""
        headers = [*msg.headers, row_header(self._span_header, (seq,))]
        ddl = ddl_header(event)
        if ddl is not None:
            headers.append(ddl)
        return headers

    # ---- a resync's emptying ---------------------------------------------------------------------------
    def truncate_targets(self, tables: Sequence[TableName], *, schemas: Sequence[TableSchema] = (),
                         at: Watermark | None = None) -> None:
        """A table copy that replaces a table's rows (a resync, docs/snapshot.md "Table copies") empties it for the
        consumers: a TRUNCATE event per table (canal-json/open-protocol TRUNCATE DDL, Debezium ``op: "t"``), routed
        as the row stream's TRUNCATE, with the copy's snapshot Ts ``at.ts`` (its copied rows carry the same Ts) and
        event position 0 under the copy writers' header (``-:0``), so a consumer ordering by (commit Ts, span,
        position) applies it after every change before the copy and before every copied row (whose positions are
        nanosecond times). The span's watermarks stay below ``at.ts`` until the copy is written (the table hold), so
        no consumer has cut past it. Refused (``SinkError``) without the schemas and ``at``: old rows must not stay."""
        if not tables:
            return
        by_name = {s.name: s for s in schemas}
        missing = [str(t) for t in tables if t not in by_name]
        if at is None or missing:
            raise SinkError(f"the Kafka sink empties {', '.join(missing or map(str, tables))} for its consumers with a "
                            "TRUNCATE event, which needs the table's schema and the copy's snapshot Ts; not given, so "
                            "the copy cannot replace the rows consumers hold")
        if OpType.TRUNCATE in self._skips.ops:  # (a resync is refused when asked for: resync_refusal)
            for t in tables:
                self._skips.skipped(str(t), OpType.TRUNCATE)
            return
        tr = self._tr()
        try:
            for t in tables:
                self._append_all(tr, RowChange(OpType.TRUNCATE, by_name[t], at.ts, at.time), 0)
            self.out.drain(tr, self._span_header, self.span)
            tr.flush()
        except BaseException:
            self.out.clear()
            raise

    @classmethod
    def resync_refusal(cls, uri: str) -> str | None:
        """A resync must first empty the table for the consumers: not with ``skipped-operations`` holding ``t``."""
        options = parse_kafka_uri(uri, codec_params=(*CODEC_PARAMS, *SINK_PARAMS))
        skipped = EncoderConfig.from_params(dict(options.codec_params)).skipped
        if "t" in skipped:
            return ("a resync first empties the table for the consumers with a TRUNCATE event, and this Kafka sink "
                    "drops TRUNCATE events (skipped-operations holds t): take t out of skipped-operations "
                    "(changefeed update), or empty the consumers' tables yourself and resync without it")
        return None

    # ---- DDL ------------------------------------------------------------------------------------------
    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        ts = event.commit_ts
        seq = self._position(ts) * SEQ_STRIDE
        step = 2 * self._txn_ddls + 1
        self._txn_ddls += 1
        if self._positioned and (ts, step) <= self._applied:
            return False
        if skip:
            return False
        msg = self.control.encode_ddl(event)
        if msg is None:
            if not self._skips.ddl:  # include-schema-changes=false: shown, not only left out
                self._skips.ddl_left_out(str(event.table), event.query)
            return True
        tr = self._tr()
        topics = [self.dispatcher.topic(event.table)]
        if event.new_table is not None and self.dispatcher.topic(event.new_table) not in topics:
            topics.append(self.dispatcher.topic(event.new_table))
        with self._sending(tr, self._txn_mode(), fence) as sending:
            sending.position = (ts, step)
            for topic in topics:
                self.meta.use_topic(tr, topic)
                headers = self._ddl_headers(msg, seq, event)
                for p in self._ddl_partitions(tr, topic):
                    tr.send(topic, p, msg.key, msg.value, headers)
        return True

    # ---- watermarks ------------------------------------------------------------------------------------
    def publish_resolved(self, watermark: Watermark, fence: Callable[[], None] | None = None) -> None:
        """The span's checkpoint: a watermark with header ``tidewater: i/n`` to every partition of every topic
        in use (see the module docstring)."""
        if self.watermark_interval <= 0:
            return
        self._broadcast(watermark, self._span_header, fence)

    def publish_checkpoint(self, ts: int, commit_time: float = 0.0) -> None:
        """The changefeed checkpoint (the owner, off its main loop): a watermark to every partition of every topic
        in use. Non-transactional; consistent for every consumer (see the module docstring)."""
        self._broadcast(Watermark(ts, commit_time), None, None, transactional=False)

    def _broadcast(self, watermark: Watermark, span: bytes | None, fence: Callable[[], None] | None,
                   transactional: bool | None = None) -> None:
        msg = self.control.encode_watermark(watermark)
        if msg is None:
            return
        txn = self._txn_mode() if transactional is None else transactional
        tr = self._tr() if transactional is None or transactional else self._plain_tr()
        topics = self.meta.watermark_topics(tr)
        headers = [(HEADER, span)] if span is not None else []
        with self._sending(tr, txn, fence):
            for topic in sorted(topics):
                for p in range(tr.all_partitions(topic)):  # every partition a consumer reads
                    tr.send(topic, p, msg.key, msg.value, headers)

    @contextlib.contextmanager
    def _sending(self, tr: KafkaTransport, txn: bool, fence: Callable[[], None] | None) -> Iterator[Sending]:
        """The frame of one send of the sink: in a Kafka transaction when ``txn`` (begun first). When the body returns:
        with a transaction and a ``position`` set by the body, the messages are flushed and the span's position is
        recorded in the same transaction (:meth:`MetaTopic.record_position`); then ``fence()``; then the commit (and
        ``position`` is the applied one), or without a transaction a flush. When anything raises, the transaction is
        aborted (nothing of it is read by consumers) and the error raised."""
        sending = Sending()
        if txn:
            tr.begin()
        try:
            yield sending
            position = sending.position
            if txn and position is not None:
                tr.flush()  # the messages first: see MetaTopic.record_position
                self._record_position(tr, position)
            if fence is not None:
                fence()
            if txn:
                tr.commit()
                if position is not None:
                    self._applied = position
            else:
                tr.flush()
        except BaseException:
            if txn:
                tr.abort()
            raise

    def _record_position(self, tr: KafkaTransport, position: tuple[int, int]) -> None:
        assert self.changefeed is not None and self.span is not None
        self.meta.record_position(tr, self.changefeed, self.span, position, self._origin)

    # ---- transport ---------------------------------------------------------------------------------------
    def _txn_mode(self) -> bool:
        return self.options.transactional and self.changefeed is not None

    def _tr(self) -> KafkaTransport:
        if self._closed:
            raise SinkError(f"Kafka sink {self.options.uri} is closed")
        if self._transport is None:
            if self.options.transactional and self.changefeed is None:
                # not bound to a span (the initial copy's writers): plain idempotent producer, at-least-once
                return self._plain_tr()
            tid = f"tidewater-{self.changefeed}-{self.span}" if self._txn_mode() else None
            opts = self.options if tid is not None else dataclasses.replace(self.options, transactional=False)
            self._transport = self._factory(opts, tid)
        return self._transport

    def _plain_tr(self) -> KafkaTransport:
        if not self.options.transactional:
            return self._tr()
        if self._plain is None:
            self._plain = self._factory(dataclasses.replace(self.options, transactional=False), None)
        return self._plain

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.meta.close()
        for tr in (self._transport, self._plain):
            if tr is not None:
                tr.close()


def _key_changed(change: RowChange) -> bool:
    old, new = change.old_values, change.values
    if not old or new is None or not change.schema.has_key:
        return False
    return any(k in old and old[k] != new.get(k) for k in change.schema.key)


def _copy_base() -> int:
    """Event positions of a write of the initial copy: its chunks are written by several sinks in parallel, and a
    chunk copied again (after a failure) must come after the earlier attempt in the consumer's order (a key-less
    table's chunk is a TRUNCATE and its rows), so the positions start at the time of the write in nanoseconds:
    distinct per write and increasing from one attempt to the next (on one host's clock)."""
    return time.time_ns() * SEQ_STRIDE
