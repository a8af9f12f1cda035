"""Consumer library: rebuild tables from the topics the Kafka sink writes, up to consistent cut points.

What it does (TiCDC's ``cmd/kafka-consumer``, plus exact duplicate removal):

1. Reads every partition of the given topics from the beginning (``read_committed``), decodes each record with the
   protocol's decoder (``sinks.codec``).
2. **Watermarks**: per partition it keeps the latest *trusted* watermark (one without a ``tidewater`` header: the
   changefeed checkpoint the owner publishes, or any producer's watermark) and the latest watermark of each span
   (header ``tidewater: i/n``). A partition's watermark is the larger of the trusted one and the minimum
   over all n spans' (0 until every span has sent one). The **global watermark** is the minimum over all partitions
   of all the topics: every change with a commit Ts at or below it has been read.
3. Buffers row and DDL events per partition and, when the global watermark advances, applies every buffered event
   at or below it in commit order ((commit Ts, span, event position): the order the upstream committed and the
   span wrote them; DDL at its place among the rows of its transaction) to the target, in one call.
4. **Duplicates**: an event at or below the applied watermark is dropped (a replay after the watermark); an event
   whose identity (span, commit Ts, event position from the ``tidewater`` header; without it: table, commit Ts,
   operation, key) was already buffered is dropped (a replay before it, or a broadcast copy of a DDL). With the sink's headers this is
   exact: each upstream change is applied once, whatever the sink replayed. Streams without the headers (other
   producers) are deduplicated by the watermark only.

Targets (:class:`Applier`): :class:`SinkApplier` writes through any SQL sink of ``sinks.factory`` (``sqlite:///``,
``postgresql://``, ``mysql://``), one downstream transaction per cut, storing the applied watermark in the target in
the same transaction (the SQL sink's exactly-once position), so a restarted consumer resumes exactly where it
stopped. Table schemas come from a :data:`sinks.codec.base.SchemaLookup` (e.g. the upstream's, for exact types) or
are inferred from the decoded values (``infer_schema``: the column set of the messages, types from the Python
values; lossy, see docs/sinks.md). DDL: a TRUNCATE is applied at its place; DROP TABLE drops the target table; any
other DDL marks the table so that the next row's column set, if it differs, becomes an ADD/DROP COLUMN downstream.
Key-only messages (``large-message-handle-option``): a claim check's full message is read from its ``file://``
location; a handle-key-only row is fetched with ``fetch_row`` when given, else the consumer fails naming the table
and key.

Threading: one thread. Memory: buffered events above the global watermark (a partition without watermarks holds
everything back: the sink sends them at least every second per span, and the owner's at each checkpoint).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import json
import logging
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cdc.errors import SinkError
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from sinks.codec import DecodedEvent, Decoder, MessageDecodeError, MessageKind, decoder_for
from sinks.codec.base import EncoderConfig, SchemaLookup
from sinks.kafka.headers import HEADER, parse

log = logging.getLogger(__name__)

CONSUMER_POSITION = "kafka-consumer"

RowFetcher = Callable[[TableName, dict[str, Any]], dict[str, Any] | None]
"""``fetch(table, key)``: the row's current values (all columns) from the upstream, or None when it is gone."""


@dataclasses.dataclass(slots=True)
class Record:
    """One Kafka record as the library needs it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


@dataclasses.dataclass(slots=True)
class Event:
    """A decoded row or DDL event with where it came from and its place in commit order."""

    ev: DecodedEvent
    commit_ts: int
    span: int
    seq: int | None
    topic: str
    partition: int
    offset: int

    def order(self) -> tuple[int, int, int, int, int]:
        return (self.commit_ts, self.span, -1 if self.seq is None else self.seq, self.partition, self.offset)


class Applier(Protocol):
    def open(self) -> int:
        """Prepare the target; return the watermark it already holds (0: none)."""

    def apply(self, events: list[Event], watermark: int, watermark_time: float) -> None:
        """Apply ``events`` (sorted in commit order, all at or below ``watermark``) and record ``watermark``
        atomically where the target allows."""

    def observe(self, event: Event) -> None:
        """An event at or below the applied watermark, read again (a restarted consumer reads from the start): not
        to be applied, but it tells the table's columns as the target holds them."""

    def close(self) -> None: ...


@dataclasses.dataclass
class Stats:
    records: int = 0
    events: int = 0
    applied: int = 0  # row and DDL events applied
    watermarks: int = 0
    checkpoints: int = 0  # of them trusted ones (no tidewater header: the changefeed checkpoint)
    replayed: int = 0  # dropped: at or below the applied watermark
    duplicates: int = 0  # row events dropped: an identity already buffered (a replay)
    copies: int = 0  # DDL and TRUNCATE events dropped: the same event from another partition (broadcast) or a replay
    cuts: int = 0


class WatermarkTracker:
    """Per (topic, partition): the trusted watermark and each span's (see the module docstring)."""

    def __init__(self) -> None:
        self._trusted: dict[tuple[str, int], int] = {}
        self._spans: dict[tuple[str, int], dict[int, int]] = {}
        self._span_count: dict[tuple[str, int], int] = {}
        self.times: dict[int, float] = {}

    def observe(self, tp: tuple[str, int], ts: int, span: str | None) -> None:
        if span is None:
            if ts > self._trusted.get(tp, 0):
                self._trusted[tp] = ts
            return
        index, _, count = span.partition("/")
        i, n = int(index), int(count or 1)
        spans = self._spans.setdefault(tp, {})
        if ts > spans.get(i, 0):
            spans[i] = ts
        self._span_count[tp] = max(n, self._span_count.get(tp, 1))

    def partition(self, tp: tuple[str, int]) -> int:
        trusted = self._trusted.get(tp, 0)
        spans = self._spans.get(tp)
        if not spans:
            return trusted
        n = self._span_count.get(tp, 1)
        if len(spans) < n:
            return trusted
        return max(trusted, min(spans[i] for i in range(n) if i in spans) if all(i in spans for i in range(n))
                   else 0)

    def global_watermark(self, partitions: Iterable[tuple[str, int]]) -> int:
        return min((self.partition(tp) for tp in partitions), default=0)


class Rebuilder:
    """The transport-free core: feed records, then :meth:`advance` to apply what the global watermark covers."""

    def __init__(self, decoder: Decoder, applier: Applier, partitions: Iterable[tuple[str, int]], *,
                 dedup: bool = True, claim_check: Callable[[str], tuple[bytes | None, bytes | None]] | None = None
                 ) -> None:
        self.decoder = decoder
        self.applier = applier
        self.partitions = set(partitions)
        self.dedup = dedup
        self.tracker = WatermarkTracker()
        self.stats = Stats()
        self.applied = 0  # every event at or below it is applied
        self._buffer: list[Event] = []
        self._seen: set[tuple[Any, ...]] = set()
        self._claim_check = claim_check or read_claim_check
        self._watermark_time = 0.0
        self._marks: dict[tuple[str, int], int] = {}  # per partition: the highest watermark read so far

    def open(self) -> int:
        self.applied = self.applier.open()
        return self.applied

    def feed(self, record: Record) -> None:
        self.stats.records += 1
        value = next((v for k, v in record.headers if k == HEADER), None)
        span_text, seqs = parse(value)
        try:
            events = self.decoder.decode(record.key, record.value)
        except MessageDecodeError as exc:
            raise MessageDecodeError(f"topic {record.topic} partition {record.partition} offset {record.offset}: "
                                     f"{exc.message}") from exc
        tp = (record.topic, record.partition)
        span = int(span_text.partition("/")[0]) if span_text else -1
        copied = value is not None and value[:1] == b"-"  # a copy writer's (initial copy, table copy)
        i = 0
        for ev in events:
            if ev.kind is MessageKind.WATERMARK:
                if ev.commit_ts is None:
                    raise MessageDecodeError(f"topic {record.topic}: a watermark without its Ts")
                self.stats.watermarks += 1
                self.stats.checkpoints += span_text is None
                self.tracker.observe(tp, int(ev.commit_ts), span_text)
                # a cut for every change (the changefeed's, or the only span's): a copied row may not follow it
                if (span_text is None or span_text.endswith("/1")) and ev.commit_ts > self._marks.get(tp, 0):
                    self._marks[tp] = int(ev.commit_ts)
                if ev.commit_time:
                    self.tracker.times[int(ev.commit_ts)] = ev.commit_time
                continue
            if ev.kind is MessageKind.TOMBSTONE:
                continue
            seq = seqs[i] if i < len(seqs) else None
            i += 1
            if ev.commit_ts is None:
                raise MessageDecodeError(
                    f"topic {record.topic} partition {record.partition} offset {record.offset}: the message carries "
                    "no commit Ts (canal-json needs enable-tidb-extension=true, the sink's default)")
            claim = ev.extra.get("claimCheckLocation")
            if claim:
                ev = self._claimed(ev, claim)
            self.stats.events += 1
            event = Event(ev, int(ev.commit_ts), span, seq, record.topic, record.partition, record.offset)
            if copied and event.commit_ts <= self._marks.get(tp, 0):
                self._late_copy(event)
            if event.commit_ts <= self.applied:
                self.stats.replayed += 1
                self.applier.observe(event)
                continue
            if self.dedup:
                ident = _identity(event)
                if ident is not None:
                    if ident in self._seen:
                        if ev.kind is MessageKind.ROW and ev.op is not OpType.TRUNCATE:
                            self.stats.duplicates += 1
                        else:
                            self.stats.copies += 1
                        continue
                    self._seen.add(ident)
            self._buffer.append(event)

    def _late_copy(self, event: Event) -> None:
        """A copied row (or a copy's TRUNCATE) behind a watermark that covers its commit Ts in its own partition: the
        sink published a cut before writing it, so every consumer that trusts watermarks may have dropped it (this
        one would, as a replay). Never silently: the consumer stops, naming it."""
        ev = event.ev
        what = "TRUNCATE" if ev.op is OpType.TRUNCATE else f"row {ev.key or ev.values}"
        raise SinkError(f"topic {event.topic} partition {event.partition} offset {event.offset}: the {what} of "
                        f"{ev.table} copied at commit Ts {event.commit_ts} comes after watermark "
                        f"{self._marks.get((event.topic, event.partition), 0)} of that partition, which covers it: "
                        "a consumer cutting at that watermark misses it. The producer must hold its watermarks below "
                        "a table copy until it is written (Tidewater does); rebuild this table from a resync")

    def _claimed(self, ev: DecodedEvent, location: str) -> DecodedEvent:
        key, value = self._claim_check(location)
        full = [e for e in self.decoder.decode(key, value) if e.kind is MessageKind.ROW]
        if len(full) != 1:
            raise MessageDecodeError(f"claim check {location}: {len(full)} row events instead of 1")
        return full[0]

    @property
    def watermark(self) -> int:
        return self.tracker.global_watermark(self.partitions)

    def advance(self) -> int:
        """Apply everything buffered at or below the global watermark; return the applied watermark."""
        w = self.watermark
        if w <= self.applied:
            return self.applied
        ready = sorted((e for e in self._buffer if e.commit_ts <= w), key=Event.order)
        self._buffer = [e for e in self._buffer if e.commit_ts > w]
        self.applier.apply(ready, w, self.tracker.times.get(w, 0.0))
        self.stats.applied += len(ready)
        self.stats.cuts += 1
        self.applied = w
        self._seen = {s for s in self._seen if s[1] > w}
        return w


def _identity(e: Event) -> tuple[Any, ...] | None:
    if e.seq is not None:
        # copy writers number from nanosecond times per write, and a resync's TRUNCATEs all have position 0: the
        # table tells them apart
        return ("s", e.commit_ts, e.span, e.seq) if e.span >= 0 else ("s", e.commit_ts, e.span, e.seq, str(e.ev.table))
    ev = e.ev
    if ev.key:
        return ("k", e.commit_ts, str(ev.table), ev.op, tuple(sorted((k, repr(v)) for k, v in ev.key.items())))
    return None


def read_claim_check(location: str) -> tuple[bytes | None, bytes | None]:
    """The key and value of a claim-check message the Kafka sink stored at ``location`` (``file://`` only)."""
    parsed = urllib.parse.urlsplit(location)
    if parsed.scheme != "file":
        raise SinkError(f"claim check {location}: only file:// locations can be read")
    try:
        doc = json.loads(Path(urllib.parse.unquote(parsed.path)).read_bytes())
    except (OSError, ValueError) as exc:
        raise SinkError(f"claim check {location} cannot be read: {exc}") from exc

    def b(v: str | None) -> bytes | None:
        return None if v is None else base64.b64decode(v)

    return b(doc.get("key")), b(doc.get("value"))


# ---- schemas --------------------------------------------------------------------------------------------------
_INFERRED: list[tuple[type, str, int]] = [
    (bool, "bool", 16), (int, "int8", 20), (decimal.Decimal, "numeric", 1700), (float, "float8", 701),
    (bytes, "bytea", 17), (dt.datetime, "timestamp", 1114), (dt.date, "date", 1082), (dt.time, "time", 1083),
    (uuid.UUID, "uuid", 2950), (dict, "jsonb", 3802), (str, "text", 25),
]


def _inferred_column(name: str, value: Any, is_key: bool) -> ColumnSchema:
    for tp, base, oid in _INFERRED:
        if isinstance(value, tp):
            if tp is dt.datetime and value.tzinfo is not None:
                base, oid = "timestamptz", 1184
            return ColumnSchema(name, oid, base, False, base, nullable=not is_key, is_key=is_key)
    return ColumnSchema(name, 25, "text", False, "text", nullable=not is_key, is_key=is_key)


def infer_schema(table: TableName, values: Mapping[str, Any], key: Sequence[str], base: TableSchema | None,
                 version: int) -> TableSchema:
    """A table schema for a row's column set: each column from ``base`` (e.g. the upstream's schema) when it has
    it, else inferred from the value's Python type; the key from the message, else from ``base``."""
    known = {c.name: c for c in base.columns} if base is not None else {}
    key = tuple(key) or (base.key if base is not None and base.has_key else ())
    cols = tuple(known[n] if n in known else _inferred_column(n, values[n], n in key) for n in values)
    has_key = bool(key)
    return TableSchema(table, cols, key if has_key else tuple(values), "d" if has_key else "f", 0, version, has_key)


class SinkApplier:
    """Applies cuts to an SQL target through ``sinks.factory`` (see the module docstring)."""

    def __init__(self, sink_uri: str, *, position: str = CONSUMER_POSITION, schemas: SchemaLookup | None = None,
                 fetch_row: RowFetcher | None = None, open_sink: Callable[[str], Any] | None = None) -> None:
        if open_sink is None:
            from sinks.factory import open_sink
        self.sink = open_sink(sink_uri)
        self.position = position
        self.schemas = schemas
        self.fetch_row = fetch_row
        self._tables: dict[TableName, TableSchema] = {}
        self._ddl_pending: set[TableName] = set()
        self._seen_at: dict[TableName, int] = {}  # commit Ts of the event that gave _tables its entry (observe)
        self._version = 0
        self._ddl_seq: dict[int, int] = {}
        self._rows: list[RowChange] = []  # the cut's rows not yet written

    def open(self) -> int:
        self.sink.check()
        return self.sink.open_position(self.position, 0, 0)

    def observe(self, event: Event) -> None:
        ev = event.ev
        if ev.table is None:
            return
        if ev.kind is MessageKind.DDL and _is_drop_table(ev):
            if event.commit_ts >= self._seen_at.get(ev.table, 0):
                self._tables.pop(ev.table, None)
                self._seen_at[ev.table] = event.commit_ts
            return
        if ev.kind is not MessageKind.ROW or ev.op not in (OpType.INSERT, OpType.UPDATE) or not ev.values \
                or ev.extra.get("onlyHandleKey") or event.commit_ts < self._seen_at.get(ev.table, 0):
            return
        current = self._tables.get(ev.table)
        if current is None or set(ev.values) != set(current.column_names):
            self._version += 1
            base = self.schemas(ev.table) if self.schemas is not None else None
            self._tables[ev.table] = infer_schema(ev.table, ev.values, tuple(ev.key or ()), base, self._version)
        self._seen_at[ev.table] = event.commit_ts

    def apply(self, events: list[Event], watermark: int, watermark_time: float) -> None:
        self._rows = []
        for e in events:
            ev = e.ev
            if ev.kind is MessageKind.DDL and ev.op is not OpType.TRUNCATE:
                self._flush()
                self._ddl(e)
                continue
            change = self._change(e)
            if change is not None:
                self._rows.append(change)
        self._flush()

    def _flush(self) -> None:
        """The rows gathered so far in one downstream transaction; the SQL sink records the last row's commit Ts in
        it (its exactly-once position), and every event of the stream up to that Ts is in this or an earlier cut,
        so a restart resumes exactly after it."""
        rows, self._rows = self._rows, []
        if rows:
            self.sink.write(rows)

    def _schema(self, table: TableName, ev: DecodedEvent) -> TableSchema:
        current = self._tables.get(table)
        values = ev.values
        if values is None or ev.op not in (OpType.INSERT, OpType.UPDATE):
            if current is None:
                base = self.schemas(table) if self.schemas is not None else None
                if base is None:
                    raise SinkError(f"table {table}: a {ev.op.name if ev.op else 'row'} event before any row that "
                                    "shows its columns; give the consumer the table's schema (--upstream)")
                current = self._tables[table] = base
            return current
        if current is not None and tuple(values) == current.column_names:
            return current
        if current is not None and set(values) == set(current.column_names):
            return current
        self._version += 1
        base = self.schemas(table) if self.schemas is not None else None
        new = infer_schema(table, values, tuple(ev.key or ()), base, self._version)
        if current is not None:
            self._alter(current, new, ev)
        self._tables[table] = new
        return new

    def _alter(self, before: TableSchema, after: TableSchema, ev: DecodedEvent) -> None:
        """The column set changed (after a DDL): ADD/DROP COLUMN downstream."""
        if before.name not in self._ddl_pending:
            log.warning("table %s: the columns changed without a DDL event (%s -> %s)", before.name,
                        ", ".join(before.column_names), ", ".join(after.column_names))
        self._ddl_pending.discard(before.name)
        self._flush()  # the rows before it, in their shapes
        old, new = set(before.column_names), set(after.column_names)
        changes = tuple([DdlChange(DdlKind.DROP_COLUMN, c) for c in before.column_names if c not in new]
                        + [DdlChange(DdlKind.ADD_COLUMN, c) for c in after.column_names if c not in old])
        if changes:
            ts = int(ev.commit_ts or 0)
            self.sink.apply_ddl(DdlEvent(ts, ev.commit_time or 0.0, before.name, changes, before, after,
                                         "(column set changed)", self._next_ddl_seq(ts)))

    def _next_ddl_seq(self, ts: int) -> int:
        seq = self._ddl_seq.get(ts, 0)
        self._ddl_seq = {ts: seq + 1}
        return seq

    def _ddl(self, e: Event) -> None:
        ev = e.ev
        table = ev.table
        if table is None:
            return
        if _is_drop_table(ev):
            before = self._tables.pop(table, None) or (self.schemas(table) if self.schemas is not None else None)
            self._ddl_pending.discard(table)
            if before is not None:
                self.sink.apply_ddl(DdlEvent(e.commit_ts, ev.commit_time or 0.0, table,
                                             (DdlChange(DdlKind.DROP_TABLE),), before, None, ev.query or "",
                                             self._next_ddl_seq(e.commit_ts)))
            return
        self._ddl_pending.add(table)

    def _change(self, e: Event) -> RowChange | None:
        ev = e.ev
        table = ev.table
        assert table is not None
        if ev.op is OpType.TRUNCATE:
            schema = self._tables.get(table) or (self.schemas(table) if self.schemas is not None else None)
            if schema is None:
                return None  # nothing of it downstream yet
            return RowChange(OpType.TRUNCATE, schema, e.commit_ts, ev.commit_time or 0.0)
        if ev.extra.get("onlyHandleKey"):
            ev = self._fetched(ev)
            if ev is None:
                return None
        schema = self._schema(table, ev)
        op = ev.op
        if op is OpType.INSERT:
            return RowChange(OpType.INSERT, schema, e.commit_ts, ev.commit_time or 0.0, dict(ev.values or {}))
        if op is OpType.UPDATE:
            return RowChange(OpType.UPDATE, schema, e.commit_ts, ev.commit_time or 0.0, dict(ev.values or {}),
                             dict(ev.old) if ev.old else None)
        if op is OpType.DELETE:
            old = ev.old or ev.key
            if not old:
                raise SinkError(f"table {table}: a delete at commit Ts {e.commit_ts} without its key")
            return RowChange(OpType.DELETE, schema, e.commit_ts, ev.commit_time or 0.0, None, dict(old))
        raise SinkError(f"table {table}: unknown operation {op!r}")

    def _fetched(self, ev: DecodedEvent) -> DecodedEvent | None:
        """A handle-key-only row: a delete needs only its key; an insert or update its current upstream values."""
        if ev.op is OpType.DELETE:
            return ev
        if self.fetch_row is None:
            raise SinkError(f"table {ev.table}: the row with key {ev.key} at commit Ts {ev.commit_ts} was sent in "
                            "key-only form (too large for the topic); give the consumer the upstream (--upstream) to "
                            "read it, or have the sink use large-message-handle-option=claim-check")
        assert ev.table is not None and ev.key is not None
        values = self.fetch_row(ev.table, ev.key)
        if values is None:
            log.info("table %s: key-only row %s no longer exists upstream; a later event removes it", ev.table,
                     ev.key)
            return None
        return dataclasses.replace(ev, values=values)

    def close(self) -> None:
        self.sink.close()


def _is_drop_table(ev: DecodedEvent) -> bool:
    if ev.extra.get("type") == "ERASE" or ev.extra.get("action") == 4:
        return True
    return (ev.query or "").lstrip().upper().startswith("DROP TABLE") and "type" not in ev.extra \
        and "action" not in ev.extra


# ---- reading Kafka ------------------------------------------------------------------------------------------
class KafkaReader:
    """Every partition of ``topics`` from the beginning (``read_committed``), as :class:`Record` s."""

    def __init__(self, brokers: Sequence[str], topics: Sequence[str], *, client: Mapping[str, Any] | None = None,
                 consumer_factory: Callable[..., Any] | None = None) -> None:
        if consumer_factory is None:
            from kafka import KafkaConsumer as consumer_factory
        self.topics = list(topics)
        self._consumer = consumer_factory(bootstrap_servers=list(brokers), isolation_level="read_committed",
                                          enable_auto_commit=False, group_id=None, auto_offset_reset="earliest",
                                          **dict(client or {}))
        self.partitions: list[tuple[str, int]] = []

    def assign(self, timeout: float = 30.0) -> list[tuple[str, int]]:
        from kafka import TopicPartition

        deadline = time.monotonic() + timeout
        found: list[tuple[str, int]] = []
        for topic in self.topics:
            parts = None
            while not parts:
                parts = self._consumer.partitions_for_topic(topic)
                if parts:
                    break
                if time.monotonic() > deadline:
                    raise SinkError(f"topic {topic} does not exist (or shows no partitions) after {timeout:g} s")
                time.sleep(0.2)
            found.extend((topic, p) for p in sorted(parts))
        self._consumer.assign([TopicPartition(t, p) for t, p in found])
        self._consumer.seek_to_beginning()
        self.partitions = found
        return found

    def poll(self, timeout: float = 1.0) -> list[Record]:
        batches = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=20_000)
        out: list[Record] = []
        for tp, records in batches.items():
            for r in records:
                out.append(Record(tp.topic, tp.partition, r.offset, r.key, r.value, list(r.headers or ())))
        return out

    def close(self) -> None:
        self._consumer.close()


def rebuild(brokers: Sequence[str], topics: Sequence[str], protocol: str, applier: Applier, *,
            until: int | None = None, timeout: float | None = None, schemas: SchemaLookup | None = None,
            codec: EncoderConfig | None = None, client: Mapping[str, Any] | None = None, dedup: bool = True,
            stop: Callable[[], bool] | None = None, on_cut: Callable[[Rebuilder], None] | None = None) -> Rebuilder:
    """Read ``topics`` and apply to ``applier`` cut by cut until the applied watermark reaches ``until`` (None: until
    ``stop()`` is true or ``timeout`` passes). Returns the :class:`Rebuilder` (its ``applied`` and ``stats``).
    Raises :class:`SinkError` when ``until`` is not reached within ``timeout``."""
    decoder = decoder_for(protocol, codec, schemas=schemas)
    reader = KafkaReader(brokers, topics, client=client)
    try:
        partitions = reader.assign(timeout or 30.0)
        core = Rebuilder(decoder, applier, partitions, dedup=dedup)
        core.open()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if until is not None and core.applied >= until:
                return core
            if stop is not None and stop():
                return core
            if deadline is not None and time.monotonic() > deadline:
                if until is None:
                    return core
                raise SinkError(f"the consumer of {', '.join(topics)} applied up to watermark {core.applied}, not "
                                f"{until}, within {timeout:g} s (global watermark {core.watermark}; per partition: "
                                + ", ".join(f"{t}/{p}={core.tracker.partition((t, p))}" for t, p in partitions)
                                + ")")
            for record in reader.poll(0.5):
                core.feed(record)
            before = core.applied
            if core.advance() > before and on_cut is not None:
                on_cut(core)
    finally:
        reader.close()
