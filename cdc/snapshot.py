"""Vocabulary of the initial snapshot copy (docs/snapshot.md): chunks, chunk plans, progress.

A table is copied in *chunks*: ranges of its key, read under one upstream snapshot and written downstream in
one transaction each. Everything here is a frozen dataclass that round-trips through ``cdc.serde`` JSON (it
is stored in etcd and in the Spark job's plan file), with no I/O and no import of anything but ``cdc``; except
:class:`CopyText`, which only carries a chunk's rows from a reader to a sink in one process.

Key bounds are the upstream's *text* of the key values (PostgreSQL: the type's output function under the
session settings of ``upstream.postgres.conn``), one per key column: text survives JSON exactly for every
type (numeric scale, float digits, timestamps) and the reader casts it back to the column's type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from cdc.events import TableName, TableSchema

__all__ = ["KEY_BUILT", "KEY_DEFERRED", "PG_COPY_TEXT", "ChunkDone", "ChunkMarker", "CopiedChunk", "CopyRedone", "CopyText", "SnapshotChunk", "SnapshotProgress", "SnapshotRun", "TablePlan",
           "TableProgress", "plan_from_bounds", "table_definition"]

PG_COPY_TEXT = "postgresql-copy-text"
"""The format of :class:`CopyText` a PostgreSQL upstream gives: COPY's text format (see :class:`CopyText`)."""


@dataclass(frozen=True, slots=True)
class CopyText:
    """A chunk's rows as text in bulk, for a sink that can store them without parsing (the initial copy's
    passthrough; not stored anywhere).

    ``format`` :data:`PG_COPY_TEXT`: PostgreSQL's ``COPY ... TO STDOUT`` text format, encoded in ``encoding``
    (``UTF8``): one line per row, the columns of the chunk's schema in order, tab-separated, ``\\N`` for NULL,
    backslash escapes for backslash and control characters; each value, once unescaped, is its type's output
    text under the upstream session settings (``upstream.postgres.conn``), i.e. exactly the text pgoutput sends
    for the same row (``RowChange.row_text``). ``blocks`` yields the bytes in order (pieces of any size);
    closing it early abandons the read."""

    format: str
    encoding: str
    blocks: Iterator[bytes]

    @property
    def pg_utf8(self) -> bool:
        """:data:`PG_COPY_TEXT` in ``UTF8``: the only text a passthrough path takes as it is."""
        return self.format == PG_COPY_TEXT and self.encoding == "UTF8"

    def abandon(self) -> None:
        """Close ``blocks`` when it can be closed (an unread or partly read text: the upstream's COPY is abandoned);
        never raises (called on the way out of an error, or after everything was read, where it does nothing)."""
        close = getattr(self.blocks, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):  # abandoning: the caller's own outcome stands
                close()


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    """One range of one table: the rows whose key ``k`` satisfies ``lower <= k < upper`` (row comparison of
    all key columns in key order; ``None`` for an open end), read ``ORDER BY`` key.

    ``index`` is the chunk's position among the table's ``count`` chunks (0-based; chunks are sorted by
    key and together cover the whole key space, so a row inserted after planning lands in exactly one of
    them). ``key`` names the key columns. ``whole`` marks the single chunk of a table without a key
    (``lower``/``upper`` None): it is written as "replace the table's rows" (a TRUNCATE then the rows, in
    one downstream transaction), so copying it twice never duplicates a row.
    """

    schema: str
    table: str
    index: int
    count: int
    key: tuple[str, ...] = ()
    lower: tuple[str, ...] | None = None
    upper: tuple[str, ...] | None = None
    whole: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"chunk index {self.index} outside 0..{self.count - 1}")
        for name, bound in (("lower", self.lower), ("upper", self.upper)):
            if bound is not None and len(bound) != len(self.key):
                raise ValueError(f"{name} bound has {len(bound)} values for a key of {len(self.key)} columns")
        if self.whole and (self.key or self.lower is not None or self.upper is not None or self.count != 1):
            raise ValueError("a whole-table chunk has no key, no bounds and is its table's only chunk")

    @property
    def table_name(self) -> TableName:
        return TableName(self.schema, self.table)

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.table}#{self.index}"


KEY_DEFERRED = "deferred"
"""``TablePlan.key_state``: the copy created the target table without its primary key; each chunk commits with a
marker row (:class:`ChunkMarker`) and the key is built once every chunk is done (docs/snapshot.md, "The key after
the load"). The table must not stream before its key is built."""
KEY_BUILT = "built"
"""``TablePlan.key_state``: the deferred key was built exactly as streaming creates it and the markers are gone."""


@dataclass(frozen=True, slots=True)
class TablePlan:
    """The chunks of one table, fixed the first time the table is planned for a (changefeed, span) and kept in
    etcd: a re-run (even under a later snapshot) copies the same ranges, so "chunk i is done" stays
    meaningful. ``rows`` is how many rows the planning snapshot held (for progress and ETA).

    ``key_state``: ``""`` (the target keeps its key while chunks arrive: a chunk copied twice is upserted),
    :data:`KEY_DEFERRED` or :data:`KEY_BUILT`. It only moves ``"" -> deferred -> built`` (compare-and-set in etcd),
    and ``deferred`` is stored before the key-less target table is created.

    ``definition`` (:func:`table_definition`) is the table's columns and key at the planning snapshot: every chunk
    of the plan must be read under a snapshot where the table has that definition (rows of two definitions in one
    target cannot be told apart), so a run that finds another one plans the table again from a fresh target
    (docs/snapshot.md, "A table changed between two runs"). ``snapshot``/``ts``: the export the plan was made
    under (its name and Ts; ``ts`` 0: not recorded). ``oid``: the table's relation oid at that snapshot (0: not
    recorded), by which its floor is found in the stream and a rename between two runs is recognised. Plans stored
    before these fields have them empty."""

    schema: str
    table: str
    rows: int
    chunk_rows: int
    chunks: tuple[SnapshotChunk, ...]
    has_key: bool = True
    key_state: str = ""
    definition: str = ""
    snapshot: str | None = None
    ts: int = 0
    oid: int = 0

    @property
    def table_name(self) -> TableName:
        return TableName(self.schema, self.table)


def table_definition(schema: TableSchema) -> str:
    """What a copy's rows depend on of ``schema``, as one comparable string: each column's name, type (with its
    modifier: ``numeric(10,2)``, ``varchar(20)``) and array-ness, in order, and the key (or that there is none).
    Two snapshots with the same definition give rows a target created from either can take the same way; nullability
    of non-key columns and defaults are left out (they change no copied value)."""
    cols = ", ".join(f"{c.name}:{c.type_name or c.base_type}{'[]' if c.is_array and not c.type_name else ''}"
                     for c in schema.columns)
    key = ",".join(schema.key) if schema.has_key else "-"
    return f"({cols}) key({key})"


FIXED_WIDTH_TYPES = frozenset({
    "int2", "int4", "int8", "float4", "float8", "bool", "date", "time", "timetz", "timestamp", "timestamptz",
    "interval", "uuid", "money", "oid", "char", "macaddr", "macaddr8", "point", "tid", "xid", "cid", "pg_lsn",
})
"""Base types of a fixed width: PostgreSQL never stores their values out of line, so it always sends them."""


def may_leave_values_unsent(schema: TableSchema) -> bool:
    """Whether the stream may send an UPDATE of ``schema``'s table without some column values (an unchanged value
    stored out of line: TOAST) and without the old row to take them from: replica identity not FULL and a column of
    variable width. Replaying such a key change over rows a later snapshot's chunk already holds takes the unsent
    values from whatever row is at the old key (processor.snapshot: such a table is never copied under two
    snapshots)."""
    return schema.replica_identity != "f" and any(c.is_array or c.base_type not in FIXED_WIDTH_TYPES
                                                  for c in schema.columns)


def plan_from_bounds(table: TableName, rows: int, chunk_rows: int, key: tuple[str, ...] | None,
                     bounds: list[tuple[str, ...]] | tuple[tuple[str, ...], ...] = ()) -> TablePlan:
    """The plan of ``table`` from its chunk bounds: ``key`` None (no key) gives one ``whole`` chunk; otherwise
    ``bounds`` (strictly increasing keys, each the first key of a chunk after the first) gives ``len(bounds) + 1``
    contiguous chunks from an open lower end to an open upper end."""
    if key is None:
        if bounds:
            raise ValueError("a table without a key has no chunk bounds")
        chunk = SnapshotChunk(table.schema, table.table, 0, 1, whole=True)
        return TablePlan(table.schema, table.table, rows, chunk_rows, (chunk,), has_key=False)
    if not key:
        raise ValueError("an empty key: use key=None for a table without a key")
    edges: list[tuple[str, ...] | None] = [None, *bounds, None]
    count = len(edges) - 1
    chunks = tuple(SnapshotChunk(table.schema, table.table, i, count, key, edges[i], edges[i + 1])
                   for i in range(count))
    return TablePlan(table.schema, table.table, rows, chunk_rows, chunks, has_key=True)


@dataclass(frozen=True, slots=True)
class ChunkDone:
    """Stored after a chunk's rows were committed downstream: how many rows, how long the copy took (s), when it
    finished (unix time), the snapshot it was read under (None: the reader's own) and the commit Ts its rows
    carry (the consistent point of the slot that exported that snapshot; 0: none). A key-less table's stream
    must skip the changes at or below that Ts (docs/snapshot.md)."""

    rows: int
    seconds: float
    finished_at: float
    snapshot: str | None = None
    commit_ts: int = 0


@dataclass(frozen=True, slots=True)
class CopiedChunk:
    """One chunk of a copy as a log-shaped sink (Kafka) tells its readers about it (docs/sinks.md, "Copy markers"):
    the table, the chunk's index in the table's plan, the commit Ts its rows carry (the snapshot of
    the run that wrote it) and, in a copy's announcement (``CopyAnnouncer.announce_copy``), the rows its :class:`ChunkDone`
    records, and ``of``, how many chunks the table's plan has. ``CopyAnnouncer.write_copy_chunk`` gets it without rows and
``of`` (the sink counts what it writes)."""

    table: TableName
    index: int
    commit_ts: int
    rows: int = 0
    of: int = 0  # in an announcement: the number of chunks of the table's plan (indexes 0 .. of - 1)


@dataclass(frozen=True, slots=True)
class ChunkMarker:
    """The row a chunk of a table whose key is deferred commits in the target, in the same transaction as the
    chunk's rows (``sinks.sql.ops.deferred_key``). The marker table's primary key is (changefeed, span, table, chunk),
    so at most one transaction per chunk ever commits: the proof that no chunk lands twice while the target table
    has no key. ``run`` is the job run that wrote it; ``rows``, ``snapshot`` and ``commit_ts`` are what its
    :class:`ChunkDone` records (a resumed run records a chunk from its marker when etcd missed it)."""

    changefeed: str
    span: int
    table: str
    chunk: int
    run: str = ""
    rows: int = 0
    snapshot: str | None = None
    commit_ts: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotRun:
    """The one job run allowed to commit chunks of a span (a fence): each run stores itself when it starts, and
    every chunk's downstream transaction commits only while this is still that run. Deleting it (before the
    span starts streaming) fences out any job still running, e.g. Python workers that outlived a killed driver."""

    run_id: str
    started_at: float
    host: str = ""
    pid: int = 0


@dataclass(frozen=True, slots=True)
class CopyRedone:
    """What the copy of one table wrote downstream under plans that were dropped since: its copy started over (its
    definition changed between two runs, a restart under a new snapshot that must read it whole at one snapshot, a
    resync, a key-less table whose place in the stream was unknown). Those rows are copied again under the current
    plan; they are kept here so that the rows a person sees copied never go backwards. ``rows``/``chunks``: the
    recorded chunks of every dropped plan; ``restarts``: how many plans were dropped."""

    rows: int = 0
    chunks: int = 0
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class TableProgress:
    """What a person watches per table, ``chunks_*`` and ``rows_planned`` being those of the table's current plan:
    chunks done of total; ``rows_copied``: every row the copy wrote downstream so far, over all runs (it never goes
    backwards), of which ``rows_redone`` were written under plans dropped since (:class:`CopyRedone`: they are copied
    again), so :attr:`rows_done` (the current plan's) is what compares with ``rows_planned``; the rows/s the current
    run's chunks were copied at; the ETA at that speed (None until a chunk of the current plan gave a rate; 0 once
    every chunk is done; never 0 while chunks are left); and how the table is chunked: :data:`KEY_RANGES`, or
    :data:`WHOLE_TABLE` for a table without a key (one chunk, one task, one transaction: no progress inside it, no
    parallelism). A table whose copy is starting over and is not planned again yet has ``chunks_total`` 0."""

    table: str
    chunks_done: int
    chunks_total: int
    rows_copied: int
    rows_planned: int
    rows_per_second: float | None = None
    eta_seconds: float | None = None
    chunking: str = "key ranges"
    rows_redone: int = 0

    @property
    def rows_done(self) -> int:
        """Rows of the current plan copied (``rows_copied - rows_redone``)."""
        return self.rows_copied - self.rows_redone

    @property
    def done(self) -> bool:
        return self.chunks_total > 0 and self.chunks_done >= self.chunks_total


KEY_RANGES = "key ranges"
WHOLE_TABLE = "whole table (no key)"
"""``TableProgress.chunking`` of a table without a key: copied as one chunk (docs/snapshot.md, "Chunking")."""


@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """The snapshot copy of one span (``span`` >= 0) or of a whole changefeed (``span`` = -1)."""

    changefeed: str
    span: int
    tables: tuple[TableProgress, ...] = ()
    runs: tuple[SnapshotRun, ...] = ()  # the job run(s) currently allowed to commit (one per span)
    rows_per_second: float | None = None
    """The spans' copies together: each span's rate over its current run's chunks, summed (None: none measured)."""
    eta_seconds: float | None = None
    """Until the last span's copy is done, each span's rows left at its own rate (spans copy in parallel); None while
    a span with chunks left has no measured rate (or a table is not planned yet), 0 once every chunk is done."""

    @property
    def chunks_done(self) -> int:
        return sum(t.chunks_done for t in self.tables)

    @property
    def chunks_total(self) -> int:
        return sum(t.chunks_total for t in self.tables)

    @property
    def rows_copied(self) -> int:
        return sum(t.rows_copied for t in self.tables)

    @property
    def rows_redone(self) -> int:
        return sum(t.rows_redone for t in self.tables)

    @property
    def done(self) -> bool:
        return all(t.done for t in self.tables)
