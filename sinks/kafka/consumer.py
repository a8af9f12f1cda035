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

Targets (:class:`sinks.kafka.target.Applier`, handed :class:`sinks.kafka.target.Event` s in commit order):
:class:`sinks.kafka.applier.SinkApplier` writes through any SQL sink of ``sinks.factory``
(``sqlite:///``, ``postgresql://``, ``mysql://``), one downstream transaction per cut, storing the applied watermark
in the target in the same transaction (the SQL sink's exactly-once position), so a restarted consumer resumes exactly
where it stopped; tables are created and altered as the events show them (its module docstring: schemas, DDL,
key-only messages). A DDL message's ``tidewater-ddl`` header (``sinks.kafka.headers``) rides on its
:class:`~sinks.kafka.target.Event` (``ddl``).

A copied row (a copy writer's header ``-:...``) behind a watermark of its partition that covers its commit Ts stops
the consumer (``SinkError``): a consumer cutting at that watermark would have dropped it as a replay.

**Incomplete copies** (``sinks.kafka.copy_markers``): the consumer also reads the sink's metadata topic
(``_tidewater.<topic>``) for the copies' chunk markers and announcements, counts the copied rows it received per
(table, Ts, chunk, partition) - rows it dropped as duplicates not counted - and, before applying a cut that covers an
announced copy, compares every chunk of it with its marker: a chunk missing or short in a partition (or one with more
rows than its marker says) stops the consumer with ``SinkError`` naming the table, the chunk, the topic and partition
and both counts, instead of rebuilding the table short. A cut covering copied rows whose copy was not announced yet
waits for the announcement (the metadata topic may be read behind the data topics), at most
``copy_markers.ANNOUNCE_WAIT`` seconds, then stops naming the table.

**Offsets**: a jump in a partition's offsets is counted (``stats.offset_gaps``, ``stats.offsets_skipped``; a jump of
one offset, the place of a transaction's commit or abort marker, apart as ``stats.txn_marker_gaps``), and the first
jump of more than one offset in a partition is logged: with a transactional producer aborted transactions also leave
gaps (a broker that hides them: Apache Kafka), so a gap is not an error by itself; records of a copy lost that way are
(above). A gap that is only a batch the broker had numbered but not stored yet when it answered (the test broker,
while producers write a partition at once) is no gap: :class:`KafkaReader` reads it again (:mod:`sinks.kafka.holes`,
``stats.holes_reread``).

Threading: one thread. Memory: buffered events above the global watermark (a partition without watermarks holds
everything back: the sink sends them at least every second per span, and the owner's at each checkpoint).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cdc.errors import SinkError
from cdc.events import OpType
from sinks.codec import DecodedEvent, Decoder, MessageDecodeError, MessageKind, decoder_for
from sinks.codec.base import EncoderConfig, SchemaLookup
from sinks.kafka.copy_markers import CopyCheck
from sinks.kafka.headers import DDL_HEADER, HEADER, copy_chunk, parse, parse_ddl
from sinks.kafka.holes import ContiguousRecords
from sinks.kafka.logstart import FIRST_OFFSET, RESET, out_of_range, seek_to_start
from sinks.kafka.target import Applier, Event, is_drop_table

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class Record:
    """One Kafka record as the library needs it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


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
    copied_rows: int = 0  # rows of copy chunks counted against their markers
    chunks_verified: int = 0  # announced copy chunks found complete in every partition
    offset_gaps: int = 0  # jumps of more than one offset within a partition (or a partition not starting at 0)
    offsets_skipped: int = 0  # offsets those jumps passed over
    txn_marker_gaps: int = 0  # jumps of exactly one offset: a transaction's commit or abort marker takes one
    holes_reread: int = 0  # polls read again from a hole in the broker's answer (KafkaReader, sinks.kafka.holes)


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
                 dedup: bool = True, claim_check: Callable[[str], tuple[bytes | None, bytes | None]] | None = None,
                 meta_topics: Iterable[str] = (), copies: CopyCheck | None = None) -> None:
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
        self.meta_topics = set(meta_topics)  # the sink's metadata topics: copy markers, not data
        self.copies = copies if copies is not None else CopyCheck(deduplicated=dedup)
        self._next: dict[tuple[str, int], int] = {}  # per partition: the offset expected next
        self._gapped: set[tuple[str, int]] = set()  # partitions whose gap was logged

    def open(self) -> int:
        self.applied = self.applier.open()
        return self.applied

    def feed(self, record: Record) -> None:
        self.stats.records += 1
        tp = (record.topic, record.partition)
        expected = self._next.get(tp, 0)
        if record.offset > expected:
            self._gap(tp, expected, record.offset)
        self._next[tp] = record.offset + 1
        if record.topic in self.meta_topics:
            self.copies.meta(record.key, record.value,
                             f"topic {record.topic} partition {record.partition} offset {record.offset}")
            return
        value = next((v for k, v in record.headers if k == HEADER), None)
        span_text, seqs = parse(value)
        try:
            events = self.decoder.decode(record.key, record.value)
        except MessageDecodeError as exc:
            raise MessageDecodeError(f"topic {record.topic} partition {record.partition} offset {record.offset}: "
                                     f"{exc.message}") from exc
        span = int(span_text.partition("/")[0]) if span_text else -1
        copied = value is not None and value[:1] == b"-"  # a copy writer's (initial copy, table copy)
        chunk = copy_chunk(value) if copied and value is not None else None  # (a copy chunk's: counted)
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
            if ev.kind is MessageKind.DDL:
                event.ddl = parse_ddl(next((v for k, v in record.headers if k == DDL_HEADER), None))
                if ev.table is not None and is_drop_table(ev):
                    self.copies.dropped(ev.table, event.commit_ts)
            if copied and event.commit_ts <= self._marks.get(tp, 0):
                self._late_copy(event)
            if event.commit_ts <= self.applied:
                self.stats.replayed += 1
                if chunk is not None:
                    self._count_copied(event, chunk)
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
            if chunk is not None:
                self._count_copied(event, chunk)
            self._buffer.append(event)

    def _count_copied(self, event: Event, chunk: int) -> None:
        ev = event.ev
        if ev.kind is MessageKind.ROW and ev.op is not OpType.TRUNCATE and ev.table is not None:
            self.copies.count(ev.table, event.commit_ts, chunk, event.topic, event.partition, bool(ev.key))
            self.stats.copied_rows += 1

    def _gap(self, tp: tuple[str, int], expected: int, offset: int) -> None:
        """Offsets ``expected`` .. ``offset - 1`` of ``tp`` were not delivered (module docstring, "Offsets")."""
        if offset - expected == 1 and expected > 0:
            self.stats.txn_marker_gaps += 1
            return
        self.stats.offset_gaps += 1
        self.stats.offsets_skipped += offset - expected
        if tp not in self._gapped:
            self._gapped.add(tp)
            log.warning("topic %s partition %d: offsets %d..%d were not delivered (aborted transactions, or records "
                        "deleted: retention, compaction); further gaps of this partition are only counted in the "
                        "consumer's stats", tp[0], tp[1], expected, offset - 1)

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
        if self.copies.holds(w) is not None:  # a copy's announcement not read yet (raises once waited too long)
            return self.applied
        self.copies.verify(w, self.partitions)  # every announced copy the cut covers: complete, or SinkError
        self.stats.chunks_verified = self.copies.verified
        ready = sorted((e for e in self._buffer if e.commit_ts <= w), key=Event.order)
        self._buffer = [e for e in self._buffer if e.commit_ts > w]
        self.applier.apply(ready, w, self.tracker.times.get(w, 0.0))
        self.stats.applied += len(ready)
        self.stats.cuts += 1
        self.applied = w
        self._seen = {s for s in self._seen if s[1] > w}
        return w


def _identity(e: Event) -> tuple[Any, ...] | None:
    ev = e.ev
    if e.seq is not None and e.span < 0 and ev.key and ev.kind is MessageKind.ROW and ev.op is not OpType.TRUNCATE:
        # a copied row of a keyed table: one row per key at one snapshot. Not its position: copy writers number from
        # the write's start in nanoseconds, so two chunks of one table written in parallel can share positions
        return ("c", e.commit_ts, str(ev.table), tuple(sorted((k, repr(v)) for k, v in ev.key.items())))
    if e.seq is not None:
        # a resync's TRUNCATEs all have position 0, and key-less copies number per write: the table tells them apart
        return ("s", e.commit_ts, e.span, e.seq) if e.span >= 0 else ("s", e.commit_ts, e.span, e.seq, str(e.ev.table))
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


# ---- reading Kafka ------------------------------------------------------------------------------------------
class KafkaReader:
    """Every partition of ``topics`` from the beginning (``read_committed``), as :class:`Record` s."""

    def __init__(self, brokers: Sequence[str], topics: Sequence[str], *, client: Mapping[str, Any] | None = None,
                 consumer_factory: Callable[..., Any] | None = None) -> None:
        if consumer_factory is None:
            from kafka import KafkaConsumer as consumer_factory
        self.topics = list(topics)
        self._consumer = consumer_factory(bootstrap_servers=list(brokers), isolation_level="read_committed",
                                          enable_auto_commit=False, group_id=None, auto_offset_reset=RESET,
                                          **dict(client or {}))
        # every record of every partition, also while producers write a partition at once (sinks.kafka.holes)
        self._holes = ContiguousRecords(self._consumer) if hasattr(self._consumer, "_fetcher") else None
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
        tps = [TopicPartition(t, p) for t, p in found]
        self._consumer.assign(tps)
        self._started(tps)
        self.partitions = found
        return found

    def add_topic(self, topic: str) -> bool:
        """Read ``topic`` too, from its beginning, if it exists now (the sink's metadata topic); False: it does not.
        Asks the cluster's topic list (a metadata request for the topic itself would create it on some brokers)."""
        from kafka import TopicPartition

        if any(t == topic for t, _ in self.partitions):
            return True
        if topic not in self._consumer.topics():
            return False
        parts = self._consumer.partitions_for_topic(topic)
        if not parts:
            return False
        new = [(topic, p) for p in sorted(parts)]
        self._consumer.assign([TopicPartition(t, p) for t, p in [*self.partitions, *new]])
        self._started([TopicPartition(t, p) for t, p in new])
        self.partitions = [*self.partitions, *new]
        return True

    def _started(self, tps: Sequence[Any]) -> None:
        seek_to_start(self._consumer, tps)  # not the broker's EARLIEST: sinks.kafka.logstart
        if self._holes is not None:
            for tp in tps:
                self._holes.start((tp.topic, tp.partition), FIRST_OFFSET)

    def poll(self, timeout: float = 1.0) -> list[Record]:
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=20_000)
        except Exception as exc:
            err = out_of_range(exc, "the Kafka consumer")
            if err is not None:
                raise err from exc
            raise
        if self._holes is not None:
            batches = self._holes.take(batches)
        out: list[Record] = []
        for tp, records in batches.items():
            for r in records:
                out.append(Record(tp.topic, tp.partition, r.offset, r.key, r.value, list(r.headers or ())))
        return out

    @property
    def holes_reread(self) -> int:
        """Polls whose answer skipped offsets of a partition and were read again (:mod:`sinks.kafka.holes`)."""
        return self._holes.reread if self._holes is not None else 0

    def close(self) -> None:
        self._consumer.close()


def rebuild(brokers: Sequence[str], topics: Sequence[str], protocol: str, applier: Applier, *,
            until: int | None = None, timeout: float | None = None, schemas: SchemaLookup | None = None,
            codec: EncoderConfig | None = None, client: Mapping[str, Any] | None = None, dedup: bool = True,
            stop: Callable[[], bool] | None = None, on_cut: Callable[[Rebuilder], None] | None = None,
            meta_topic: str | None = None) -> Rebuilder:
    """Read ``topics`` and apply to ``applier`` cut by cut until the applied watermark reaches ``until`` (None: until
    ``stop()`` is true or ``timeout`` passes). Returns the :class:`Rebuilder` (its ``applied`` and ``stats``).
    Raises :class:`SinkError` when ``until`` is not reached within ``timeout``. ``meta_topic``: the sink's metadata
    topic, read for the copies' markers (default ``_tidewater.<first topic>``: the sink URI's topic comes first)."""
    from sinks.kafka.meta import meta_topic_name

    decoder = decoder_for(protocol, codec, schemas=schemas)
    reader = KafkaReader(brokers, topics, client=client)
    meta = meta_topic or meta_topic_name(topics[0])
    try:
        partitions = reader.assign(timeout or 30.0)
        core = Rebuilder(decoder, applier, partitions, dedup=dedup, meta_topics=[meta])
        core.open()
        has_meta = reader.add_topic(meta)
        next_look = time.monotonic() + 1.0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if until is not None and core.applied >= until:
                return core
            if stop is not None and stop():
                return core
            if deadline is not None and time.monotonic() > deadline:
                if until is None:
                    return core
                waiting = core.copies.waiting_for
                raise SinkError(f"the consumer of {', '.join(topics)} applied up to watermark {core.applied}, not "
                                f"{until}, within {timeout:g} s (global watermark {core.watermark}; per partition: "
                                + ", ".join(f"{t}/{p}={core.tracker.partition((t, p))}" for t, p in partitions)
                                + (")" if waiting is None else
                                   f"; the cut waits for the announcement of table {waiting[0]}'s copy at Ts "
                                   f"{waiting[1]} in the metadata topic {meta})"))
            for record in reader.poll(0.5):
                core.feed(record)
            core.stats.holes_reread = reader.holes_reread
            if not has_meta and time.monotonic() >= next_look:  # (created by the first copy's marker)
                has_meta, next_look = reader.add_topic(meta), time.monotonic() + 1.0
            before = core.applied
            if core.advance() > before and on_cut is not None:
                on_cut(core)
    finally:
        reader.close()
