"""Copy markers: how a reader of the Kafka sink's topics tells that every copied row of a table arrived
(docs/sinks.md, "Copy markers").

Rows of the initial copy and of table copies are written by copy writers, chunk by chunk, in parallel, outside any
span (``-:`` headers, ``sinks.kafka.headers``); a chunk lost on its way (or a consumer that misses records) would
leave a table short with nothing saying so. So:

- each copied row of a chunk names its chunk in its header (``-<chunk>:<seq>...``);
- after a chunk's rows are acknowledged, the writer records a **chunk marker** in the sink's metadata topic
  (``_tidewater.<topic>``, ``sinks.kafka.meta``), key ``chunk/<schema>.<table>/<ts>/<chunk>``: the table, the commit
  Ts the rows carry (the copy run's snapshot), the chunk, and how many rows it wrote to each (topic, partition);
- when a table's copy is complete, the span records an **announcement**, key ``copied/<schema>.<table>/<ts>``: every
  chunk of the table as recorded (index, the Ts of the run that wrote it, rows) and how many chunks its plan has
  (``of``: a chunk never recorded is told too), before any change of the table after
  the copy and so before any watermark that covers it (``CopyAnnouncer.announce_copy``). A DROP TABLE read in the
  stream stands for an announcement of the table up to its Ts (a table dropped during its copy is never announced).

Nothing is added to the data topics but the chunk number in a header, so consumers of canal-json, Debezium and
open-protocol that know nothing of Tidewater see exactly the records they saw before; the metadata topic is Tidewater's
own (one partition, read by nobody else).

:class:`CopyCheck` is the reader's side (``sinks.kafka.consumer``): it counts the copied rows it received per (table,
Ts, chunk, topic, partition) and, once a cut covers an announced copy, compares each announced chunk with its marker
and what arrived; any difference (a chunk short, missing, or with rows the marker does not account for, a marker
missing) is a :class:`SinkError` naming the table, the chunk, the partition and both counts. Copied rows with a chunk
number whose table has no announcement covering their Ts hold the cut back (the metadata topic may be read behind the
data topics) for at most ``wait`` seconds, then fail naming the table.

Replays: a chunk written again under another run carries another Ts and is counted apart; the announcement names
the run each chunk was recorded under, so chunks of an abandoned run (rows of a run that died, of a table copied
again whole later) are never compared. Duplicates the consumer drops (the same row read twice) are not counted, so a
keyed chunk written twice under one snapshot counts each key once. A key-less chunk written twice under one snapshot
(each write a TRUNCATE and the rows; the copy itself writes again only under a new run's snapshot) cannot be told
apart from its rows: there, more rows than the marker says pass, fewer stop the consumer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cdc.errors import SinkError
from cdc.events import TableName
from cdc.snapshot import CopiedChunk

CHUNK_PREFIX = "chunk/"
ANNOUNCE_PREFIX = "copied/"
ANNOUNCE_WAIT = 30.0
"""Seconds a cut waits for a copy's announcement once its rows are covered by the watermark."""

Partition = tuple[str, int]


def chunk_key(chunk: CopiedChunk) -> bytes:
    return f"{CHUNK_PREFIX}{chunk.table}/{chunk.commit_ts}/{chunk.index}".encode()


def announce_key(table: TableName, ts: int) -> bytes:
    return f"{ANNOUNCE_PREFIX}{table}/{ts}".encode()


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def chunk_marker(chunk: CopiedChunk, rows: Mapping[Partition, int]) -> tuple[bytes, bytes]:
    """Key and value of a chunk's marker: ``rows`` written per (topic, partition), those with rows only."""
    doc = {"schema": chunk.table.schema, "table": chunk.table.table, "ts": chunk.commit_ts, "chunk": chunk.index,
           "rows": sorted([t, p, n] for (t, p), n in rows.items() if n)}
    return chunk_key(chunk), _encode(doc)


def announcement(table: TableName, chunks: Iterable[CopiedChunk]) -> tuple[bytes, bytes]:
    """Key and value of a table's copy announcement: every chunk as recorded."""
    chunks = list(chunks)
    listed = sorted([c.index, c.commit_ts, c.rows] for c in chunks)
    ts = max((c[1] for c in listed), default=0)
    of = max((c.of for c in chunks), default=0) or len(listed)
    doc = {"schema": table.schema, "table": table.table, "ts": ts, "of": of, "chunks": listed}
    return announce_key(table, ts), _encode(doc)


class CopyCheck:
    """The consumer's count of copied rows against the markers and announcements (module docstring). ``clock``:
    monotonic seconds (injectable for tests); ``deduplicated``: the consumer counts a row read twice once."""

    def __init__(self, *, wait: float = ANNOUNCE_WAIT, clock: Callable[[], float] = time.monotonic,
                 deduplicated: bool = True) -> None:
        self.wait = wait
        self.deduplicated = deduplicated  # False: the consumer keeps duplicates, so more rows than a marker pass
        self.clock = clock
        self._seen: dict[tuple[TableName, int, int], dict[Partition, int]] = {}  # (table, Ts, chunk) -> rows
        self._copied: dict[TableName, set[int]] = {}  # the Ts of a table's chunk-numbered copied rows
        self._markers: dict[tuple[TableName, int, int], dict[Partition, int]] = {}
        self._announced: dict[TableName, int] = {}  # the highest Ts an announcement of the table covers
        self._pending: list[tuple[TableName, int, int, list[tuple[int, int, int]]]] = []
        self._waiting_since: float | None = None
        self._keyless: set[TableName] = set()  # tables whose copied rows have no key
        self.waiting_for: tuple[TableName, int] | None = None  # (table, Ts) whose announcement the cut waits for
        self.verified = 0  # chunks compared and found complete

    def count(self, table: TableName, ts: int, chunk: int, topic: str, partition: int, keyed: bool = True) -> None:
        """A copied row of ``chunk`` of ``table`` at ``ts`` arrived in (topic, partition), and was not a duplicate
        (``keyed``: the row has a key)."""
        per = self._seen.get((table, ts, chunk))
        if per is None:
            self._copied.setdefault(table, set()).add(ts)
            per = self._seen[(table, ts, chunk)] = {}
            if not keyed:
                self._keyless.add(table)
        tp = (topic, partition)
        per[tp] = per.get(tp, 0) + 1

    def meta(self, key: bytes | None, value: bytes | None, where: str) -> None:
        """A record of the metadata topic (``where``: topic/partition/offset for errors); others than markers and
        announcements are not ours to read."""
        if not key or not value or not (key.startswith(b"chunk/") or key.startswith(b"copied/")):
            return
        try:
            doc = json.loads(value)
            table = TableName(str(doc["schema"]), str(doc["table"]))
            ts = int(doc["ts"])
            if key.startswith(b"chunk/"):
                rows = {(str(t), int(p)): int(n) for t, p, n in doc["rows"]}
                self._markers[(table, ts, int(doc["chunk"]))] = rows
                return
            chunks = [(int(i), int(t), int(n)) for i, t, n in doc["chunks"]]
            of = int(doc.get("of", len(chunks)))
        except (ValueError, KeyError, TypeError) as exc:
            raise SinkError(f"{where}: a copy record {key.decode(errors='replace')!r} this consumer cannot read "
                            f"({type(exc).__name__}: {exc}); update the consumer to the sink's version") from exc
        if ts > self._announced.get(table, 0):
            self._announced[table] = ts
        self._pending.append((table, ts, of, chunks))

    def dropped(self, table: TableName, ts: int) -> None:
        """``table`` was dropped at ``ts``: copied rows of it below are not waited for (a table dropped during its
        copy is never announced; what the consumer holds of it goes with it)."""
        if ts - 1 > self._announced.get(table, 0):
            self._announced[table] = ts - 1

    def holds(self, watermark: int) -> int | None:
        """Before a cut at ``watermark``: None when it may go ahead; else the lowest Ts of copied rows it covers whose
        table's copy has not been announced yet (the cut waits; after ``wait`` seconds: :class:`SinkError`)."""
        lowest: tuple[int, TableName] | None = None
        for table, stamps in self._copied.items():
            top = self._announced.get(table, 0)
            for ts in stamps:
                if top < ts <= watermark and (lowest is None or ts < lowest[0]):
                    lowest = (ts, table)
        self.waiting_for = None if lowest is None else (lowest[1], lowest[0])
        if lowest is None:
            self._waiting_since = None
            return None
        now = self.clock()
        if self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_since > self.wait:
            ts, table = lowest
            raise SinkError(
                f"table {table}: rows of its copy at commit Ts {ts} arrived, and no announcement that the copy is "
                f"complete (a 'copied/' record of the sink's metadata topic, written before any watermark above "
                f"{ts}) was read within {self.wait:g} s of watermark {watermark}: whether every chunk arrived cannot be "
                "told. Give the consumer the sink's metadata topic (_tidewater.<the sink URI's topic>), or rebuild "
                "this table from a resync")
        return lowest[0]

    def verify(self, watermark: int, partitions: Iterable[Partition]) -> None:
        """Compare every announced chunk whose Ts is at or below ``watermark`` (all its rows are read in every
        partition by then) with its marker and what arrived; :class:`SinkError` on the first difference."""
        if not self._pending:
            return
        read = set(partitions)
        left = []
        for table, ts, of, chunks in self._pending:
            if ts > watermark:
                left.append((table, ts, of, chunks))
                continue
            unlisted = sorted(set(range(of)) - {i for i, _, _ in chunks})
            if unlisted:
                raise SinkError(f"table {table}: its copy at commit Ts {ts} was announced with {len(chunks)} of its "
                                f"{of} chunks: chunk {', '.join(map(str, unlisted[:10]))} never copied. Rebuild this "
                                "table from a resync")
            for index, chunk_ts, rows in chunks:
                self._verify_chunk(table, index, chunk_ts, rows, read)
        self._pending = left

    def _verify_chunk(self, table: TableName, index: int, ts: int, rows: int, read: set[Partition]) -> None:
        what = f"table {table}: chunk {index} of its copy at commit Ts {ts}"
        marker = self._markers.get((table, ts, index))
        if marker is None:
            if rows == 0:
                return  # recorded empty (a table empty at its snapshot): nothing was written
            raise SinkError(f"{what} ({rows} rows) has no chunk marker in the sink's metadata topic: the copy "
                            "recorded it as written but no writer said where its rows went. Rebuild this table from a "
                            "resync")
        if sum(marker.values()) != rows:
            raise SinkError(f"{what}: its marker counts {sum(marker.values())} rows, the copy's record {rows}")
        seen = self._seen.get((table, ts, index), {})
        for tp in sorted(set(marker) | set(seen)):
            expected, got = marker.get(tp, 0), seen.get(tp, 0)
            if got == expected or (got > expected and (table in self._keyless or not self.deduplicated)):
                continue  # (a key-less chunk written twice under one snapshot: each write replaces the one before)
            topic, partition = tp
            if tp not in read:
                raise SinkError(f"{what}: {expected} of its rows went to topic {topic} partition {partition}, which "
                                "this consumer does not read: give it every topic the changefeed writes to")
            kind = "missing: none of its rows arrived" if got == 0 else ("short" if got < expected else "too long")
            raise SinkError(f"{what} is {kind} in topic {topic} partition {partition}: expected {expected} rows, "
                            f"seen {got}. The consumer would rebuild {table} wrong; rebuild this table from a resync "
                            "(cdc cli changefeed snapshot --table) and find why records were lost")
        self.verified += 1
