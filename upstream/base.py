"""The upstream interface: everything the capture, the owner and the processor need from a source database.

``upstream.open_upstream(uri)`` returns an :class:`Upstream` for the URI's scheme (``postgres://`` and
``postgresql://``: :mod:`upstream.postgres`; ``mysql://`` and ``mariadb://``: :mod:`upstream.mysql`). Callers never see a driver object: what crosses this interface
is the vocabulary of ``cdc`` (``TableName``, ``TableSchema``, ``SpanInfo``, ``Watermark``, ``RowChange``'s
parts) and the small typed dataclasses below. Every method raises only :class:`cdc.errors.TidewaterError`
subclasses: ``UpstreamUnavailable`` (retryable: unreachable, connection lost, lock or serialization
conflict), ``UpstreamNotReady`` (the upstream must be reconfigured: privileges, settings, capacity),
``InvalidArgument``/``TableNotEligible`` (the request cannot work as asked; the message names the fix),
``SlotLost`` (a span's retained position is gone: data after the checkpoint may be lost), ``DecodeError``
(a change cannot be decoded), ``UpstreamError`` (anything else the upstream refused).

Vocabulary of a span's upstream resources: a span (``cdc.model.SpanInfo``) has a *slot* (the retained
position its changes are read from; a logical replication slot on PostgreSQL) and a *publication* (the set
of tables whose changes it carries). An upstream without such server-side objects keeps the names as labels
(e.g. MySQL: the slot is a recorded binlog position, the table set a client-side filter).

Three parts, with separate lifetimes:

- :class:`Upstream` (control plane): readiness, tables, per-span resources, inspection. Cheap to create (no
  I/O until a method needs it); methods that talk to the upstream share one session, opened on first use
  and kept until :meth:`Upstream.close` (use it as a context manager). One thread at a time.
- :class:`SpanSource` (data plane, one per running span): streams the span's changes into a
  :class:`ChangeBuffer` (the sorter) and reports resolved watermarks; hands out the :class:`ChangeDecoder`
  the mounter uses for the payloads it stored.
- :class:`RowReader` (one per span's sink thread): re-reads current rows by key (``sinks.base.RowSource``).
- :class:`SnapshotReader` (one per snapshot-copy task): reads whole tables in key-range chunks as they were
  at one snapshot (the initial copy, docs/snapshot.md).

How a new upstream plugs in: implement these (the snapshot reader is optional) in ``upstream/<name>/`` and add its scheme to
``upstream._REGISTRY``. Nothing in ``capture``, ``owner`` or ``processor`` changes.
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from cdc.errors import DecodeError, InvalidArgument
from cdc.events import ColumnSchema, DdlEvent, RowChange, TableName, TableSchema
from cdc.filter import TableFilter
from cdc.model import DataWarning, SpanInfo
from cdc.snapshot import CopyText, SnapshotChunk, TablePlan
from cdc.ts import Watermark

__all__ = [
    "ChangeBuffer",
    "ChangeDecoder",
    "Mount",
    "ParsedChange",
    "Parser",
    "ExportedSnapshot",
    "JoinRule",
    "PartitionLeaf",
    "PlainPlan",
    "RowReader",
    "SCHEMA_CHANGE",
    "SlotState",
    "SnapshotReader",
    "SpanPlan",
    "SpanSource",
    "Upstream",
    "decode_payload",
    "encode_payload",
]

Parser = Callable[[str], Any]
"""Text value of a column as the upstream renders it -> Python value."""

Mount = Callable[[bytes, int, float], RowChange]
"""The mounter's per-row function: ``mount(payload, commit_ts, commit_time)`` (:meth:`ChangeDecoder.plain_mounter`)."""

PlainPlan = tuple[TableSchema, int, Callable[[Sequence[Any]], tuple[Any, ...]], int]
"""What :meth:`ChangeDecoder.plain_mounter` knows of a schema version: ``(schema, relation id or 0, parse_row,
ncols)``."""


# ---- stored payloads ------------------------------------------------------------------------------------
_VERSION = struct.Struct(">I")
_pack_version = _VERSION.pack
_unpack_version = _VERSION.unpack_from


def encode_payload(schema_version: int, raw: bytes) -> bytes:
    """What a :class:`SpanSource` stores per change: ``raw`` (the upstream's own encoding of one change) prefixed
    with the 4-byte big-endian schema version it was encoded with (0 <= version < 2**32)."""
    try:
        return _pack_version(schema_version) + raw
    except struct.error as e:
        raise ValueError(f"schema version {schema_version} does not fit in 32 bits") from e


SCHEMA_CHANGE = 0xFFFF_FFFF
"""The schema version of a stored *schema change* (a DDL at its position in the transaction): its ``raw`` is
for :meth:`ChangeDecoder.schema_changes`, never a row. Row schema versions stay below it."""


def decode_payload(payload: bytes) -> tuple[int, bytes]:
    """Split a payload made by :func:`encode_payload` into ``(schema_version, raw)``."""
    if len(payload) < 5:
        raise DecodeError(f"sorter payload too short ({len(payload)} bytes)")
    return _unpack_version(payload)[0], payload[4:]


# ---- vocabulary -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ParsedChange:
    """One stored change, parsed (:meth:`ChangeDecoder.parse_change`).

    ``kind``: 'I' insert, 'U' update, 'D' delete, 'T' truncate. ``new``/``old`` hold one value per column of
    the change's schema version, in its column order: ``None`` for NULL, ``cdc.events.UNCHANGED`` for a value
    the upstream did not send (unchanged TOAST value), ``str`` for text format (anything else is refused by
    the mounter). ``old_kind`` is 'K' (only the key columns are meaningful), 'O' (the full old row) or None
    (no old row sent). For 'T', ``relid`` is the first relation and ``truncate_options`` the option bits
    (1 = CASCADE, 2 = RESTART IDENTITY).
    """

    kind: str
    relid: int
    new: list[Any] | None
    old: list[Any] | None
    old_kind: str | None
    truncate_options: int


@dataclass(frozen=True, slots=True)
class PartitionLeaf:
    """One leaf partition of a published partitioned table, as an inspection saw it.

    ``storage`` identifies the leaf's physical storage (PostgreSQL: ``pg_class.relfilenode``; it changes on
    TRUNCATE and table rewrites), ``bound`` is the partition bound as SQL, relative to its parent.
    """

    root: TableName
    oid: int
    name: TableName
    storage: int
    bound: str


@dataclass(frozen=True, slots=True)
class SlotState:
    """The retained upstream position of one span (a replication slot on PostgreSQL).

    ``retained_bytes``: what the upstream keeps for it (WAL from its restart point to the current position;
    None when unknown or lost). ``confirmed_ts``: the position acknowledged so far (commit Ts units).
    ``lost``: it exists but can never be read again (its data was removed or it was invalidated; then
    ``invalidation_reason`` says why when the upstream tells). ``wal_status``: the upstream's own word for
    its retention state (PostgreSQL: reserved/extended/unreserved/lost), for messages.
    """

    name: str
    active: bool
    active_pid: int | None
    retained_bytes: int | None
    confirmed_ts: int | None
    wal_status: str | None
    lost: bool
    invalidation_reason: str | None = None


@dataclass(frozen=True, slots=True)
class ExportedSnapshot:
    """A consistent view of the upstream that several readers can share (:meth:`Upstream.export_snapshot`):
    ``name`` is what a :class:`SnapshotReader` imports; it shows every commit with Ts <= ``ts`` and none after
    (``ts`` is a point of the upstream's Ts order: every later commit has a greater Ts), ``time`` when it was
    taken (upstream clock where known)."""

    name: str
    ts: int
    time: float


@dataclass(frozen=True, slots=True)
class JoinRule:
    """How a table created after the changefeed joins a span *in its creating transaction*, for an upstream
    that can do so (PostgreSQL's DDL trigger adds it to the span's publication, so its rows are replicated
    from its first one; elsewhere the owner's look picks it up later and reports the rows it missed).

    ``filter``: the changefeed's :class:`cdc.filter.TableFilter`; ``span_count``: the fixed span count
    (``cdc.spans.span_of`` decides the span); ``target_names``: ``"qualified"`` when the sink names a table
    ``schema.table``, ``"table"`` when it drops the schema (two new names may then collide); ``fold_case``:
    the sink compares those names case-insensitively; ``keyless``: a table without a key may join (False
    under at-least-once delivery). A table the upstream cannot vouch for by these rules (no usable replica
    identity, generated columns, a possible name collision, rows already in it) is left to the owner's look,
    which applies every check of ``changefeed create`` and reports what it did not add.
    """

    filter: TableFilter
    span_count: int
    target_names: str = "qualified"
    fold_case: bool = False
    keyless: bool = True


@dataclass(frozen=True, slots=True)
class SpanPlan:
    """A span to create: its index, the names of its slot and publication, the tables it carries, and the rule
    by which tables created later join it (None: only the owner's look adds them)."""

    index: int
    slot: str
    publication: str
    tables: tuple[TableName, ...]
    join: JoinRule | None = None


# ---- data plane -----------------------------------------------------------------------------------------
class ChangeBuffer(Protocol):
    """Where a :class:`SpanSource` puts changes: ``sorter.base.SpanSorter`` (its contract applies: ``xid``,
    ``subxid`` and ``commit_ts`` unsigned 64-bit, ``commit_ts`` strictly increasing)."""

    def add(self, xid: int, subxid: int, payload: bytes) -> None: ...

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None: ...

    def abort(self, xid: int, subxid: int) -> None: ...

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None: ...


class ChangeDecoder(ABC):
    """Turns the payloads a :class:`SpanSource` stored back into values (used by ``processor.mounter``).

    Pure and thread-safe: no I/O, no logging; schema versions are immutable once published, so
    :meth:`schema` may be called from any thread. The per-row methods are plain functions, meant to be bound
    to locals once (``insert_values``, ``parse_change``, the parsers): no per-row indirection.
    """

    @abstractmethod
    def schema(self, version: int) -> TableSchema:
        """The schema a stored change of ``version`` was encoded with (KeyError: unknown version)."""

    def schema_changes(self, raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
        """The DDL events of a payload stored with version :data:`SCHEMA_CHANGE` (``raw`` after the version), of
        a transaction committed at ``commit_ts``. An empty list: a DDL that changes nothing a sink replicates.
        Raises DecodeError when ``raw`` cannot be decoded. Default: this upstream stores no schema changes."""
        raise DecodeError("this upstream stores no schema changes")

    @abstractmethod
    def parse_change(self, raw: bytes) -> ParsedChange:
        """Parse one stored change (the payload after its 4-byte version); DecodeError if malformed."""

    @abstractmethod
    def insert_values(self, payload: bytes, offset: int) -> tuple[int, list[Any]] | None:
        """Fast path: ``(relid, new values)`` when ``payload[offset:]`` is a well-formed insert, else None
        (then :meth:`parse_change` raises the precise error, or handles the other kinds)."""

    def plain_row(self, payload: bytes, offset: int, parse_row: Callable[[Sequence[Any]], tuple[Any, ...]],
                  ncols: int) -> tuple[str, int, tuple[Any, ...], list[Any]] | None:
        """Fast path of the mounter: ``(kind, relid, parse_row(values), values)`` when ``payload[offset:]`` is a
        well-formed insert (kind 'I') or an update that carries nothing but its new row (kind 'U'), of ``ncols``
        values that are all ``str`` or ``None`` and that ``parse_row`` (a :meth:`row_parser` of this decoder)
        parses; else None (then :meth:`parse_change` handles it, or raises the precise error). Default: inserts
        through :meth:`insert_values` (:func:`plain_insert`). Meant to be bound once, like the other per-row
        members."""
        return plain_insert(self.insert_values, payload, offset, parse_row, ncols)

    def plain_mounter(self, plans: dict[int, PlainPlan], general: Mount, defer: bool = False) -> Mount:
        """The mounter's per-row function with its plain rows (those of :meth:`plain_row`) mounted by this decoder.

        ``plans`` maps a schema version to ``(schema, relation id or 0 for any, parse_row, ncols)`` (the mounter
        fills it as it meets versions; ``parse_row`` one of this decoder's :meth:`row_parser`); ``general`` is the
        mounter's own function. The result is called as ``mount(payload, commit_ts, commit_time)`` and returns what
        ``general`` returns for every payload: a plain row of a version in ``plans`` becomes the RowChange the
        mounter builds for it (INSERT or UPDATE, ``row`` and ``row_text`` set, ``values`` built lazily, an empty
        ``extra``); everything else is ``general``'s. ``defer``: the caller's sink writes rows by their text, so an
        insert's ``row`` may be a deferred row (``cdc.events.RowChange.row``: parsed from ``row_text`` on first use),
        where the decoder knows that parsing later gives exactly what parsing now gives and cannot fail (a decoder may
        ignore it). Default: ``general`` itself."""
        return general

    @abstractmethod
    def parser(self, column: ColumnSchema) -> Parser:
        """The parser of ``column``'s text values (raises ValueError/ArithmeticError on a bad value)."""

    @abstractmethod
    def row_parser(self, parsers: Sequence[Parser]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """One function parsing a whole row of ``str``/``None`` values with ``parsers`` (None stays None)."""


class SpanSource(ABC):
    """The change stream of one span, from its start watermark on.

    Lifecycle: ``open()`` (takes the span's slot: a previous holder's session is ended, which the caller may
    ask for only when that holder can no longer commit downstream), then ``run()`` in one thread until
    ``stop`` is set or it raises; ``close()`` from any thread ends it (``run`` then returns or raises).
    ``ack(ts)`` may be called from any thread.

    Guarantees of ``run(buffer, stop, on_resolved)``:

    - Every change of a committed transaction with commit Ts > the start watermark's Ts whose table matches
      the filter is added to ``buffer`` as ``encode_payload(schema_version, raw)``, then the transaction is
      committed with its commit Ts and time; transactions arrive in commit order. Transactions at or below
      the start are aborted in the buffer (already downstream). Rolled-back (sub)transactions are aborted.
    - ``on_resolved(w)`` is called with non-decreasing watermarks, only after every transaction with commit
      Ts <= ``w.ts`` is committed in ``buffer``; on an idle upstream it still advances (``w.time`` is the
      upstream time the watermark stands for).
    - Errors: ``SlotLost`` when the slot is gone, ``UpstreamUnavailable`` when the stream breaks,
      ``DecodeError`` for a message that cannot be decoded.
    - The upstream forgets nothing above the last ``ack(ts)``; the caller acks only durable checkpoints.
    """

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def run(self, buffer: ChangeBuffer, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        ...

    @abstractmethod
    def ack(self, ts: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def decoder(self) -> ChangeDecoder:
        """The decoder of the payloads this source stores (its schema versions; valid after ``close``)."""

    def schema_change_commits(self) -> Container[int]:
        """Commit Ts of the transactions whose stored payloads include a :data:`SCHEMA_CHANGE` (filled as they
        commit, before they are committed in the buffer; any thread may test membership). The span splits
        those transactions at their DDL; every other transaction is mounted row by row without looking.
        Default: none."""
        return frozenset()

    def resume_token(self, ts: int) -> str | None:
        """The upstream's own resume position after every transaction with commit Ts <= ``ts`` (a checkpoint this
        source passed to ``on_resolved``, or the start), as an opaque string the caller stores beside the checkpoint
        and gives back to :meth:`Upstream.span_source` (``resume``) when the span restarts there; None when this
        upstream needs none (the Ts is its position) or does not know it yet. Any thread. Default: None."""
        return None

    def caught_up_ts(self) -> int:
        """The last resolved Ts given to ``on_resolved`` at which the source found nothing more of its stream waiting
        to be read after a backlog (since ``run`` started, or since it found one after the previous such point): the
        end of a catch-up after a start or of a burst; 0 when it never did or cannot tell. A hint for the cadence
        of checkpoint reports only (the processor stores the checkpoint that reaches it at once instead of up to
        ``checkpoint-min-interval`` later: ``processor.processor.report_due``); a wrong answer costs one status
        write early or late, never a change. Any thread. Default: 0."""
        return 0

    def check_target_ahead(self, applied_ts: int) -> None:  # noqa: B027 - optional: Ts that never change
        """After ``open``: the target already holds transactions past the start, the last with commit Ts
        ``applied_ts`` (every one up to it, or with parallel apply some of them; the sink skips them by commit Ts
        when they are streamed again). Raise (``SlotLost``, naming the fix) when
        this source cannot stream them again under the same commit Ts (MySQL: it continues on another server, whose
        Ts are new): they would be applied twice. Called by the span's sink thread. Default: its Ts are stable."""

    def take_warnings(self) -> list[DataWarning]:
        """Data warnings the stream itself carried since the last call (e.g. rows the upstream could not put
        into the stream), and forget them. Any thread. Default: none."""
        return []

    def seed_schemas(self, schemas: Iterable[TableSchema], carried: Collection[int] | None = None) -> None:
        """Before ``run``: the schema history's view of the tables at the start watermark (``cdc.model.
        SchemaHistory.as_of``). The source compares the first schema the stream shows of such a table with it
        (a change made while the span was down is a schema change like any other) and uses it as the schema
        *before* a DDL that the stream itself has not described yet. Tables not carried by the span are
        ignored. ``carried``: the oids of the tables the history says this span replicated at the start
        (``SchemaHistory.span_as_of``; None: not known). A DDL of such a table concerns the span even when the
        table has left the span's upstream table set since (a DROP TABLE committed before the start and decoded
        after it must be applied). Default: not used."""
        return None

    def take_schema_versions(self) -> list[tuple[int, TableSchema]]:
        """``(commit Ts, schema)`` of every table schema the stream showed that differs from the last one known
        (seeded or seen), since the last call; the schema is valid from that commit Ts on. A version appears
        here before ``on_resolved`` passes its Ts, so the caller can store it before the span's checkpoint
        does. Any thread. Default: none."""
        return []

    # -- running ``run`` in a process of its own (processor.source_process) ------------------------------------
    #: True when this source can run in a child process: it is picklable before ``open()`` (with what
    #: ``seed_schemas`` gave it), and :meth:`take_state` / :meth:`put_state` carry to the parent's instance everything
    #: ``run`` learns that the parent's readers need (:meth:`decoder`, :meth:`schema_change_commits`,
    #: :meth:`take_warnings`, :meth:`take_schema_versions`). A source that leaves it False always runs in a thread.
    runs_in_child: bool = False

    def take_state(self) -> object:
        """Child side: what ``run`` learned since the last call that the parent's readers need (schema versions,
        schema-change commits, warnings, ...), picklable; None when nothing. Called from any thread of the child
        while ``run`` goes on: it must be safe against ``run``'s own changes. The child sends it *before* the buffer
        operations it took with it, so the parent knows every schema version a change it buffers was encoded with
        (state a little ahead of the buffer is allowed: the contracts above only say "before")."""
        return None

    def put_state(self, state: object) -> None:  # noqa: B027 - a source without state has nothing to put
        """Parent side: merge a :meth:`take_state` result of the child's instance into this one (which is never
        opened). Called from the parent's puller thread while the sink thread reads."""


class RowReader(Protocol):
    """``sinks.base.RowSource`` with a ``close``: ``reader(schema, keys)`` returns, per key in order, the
    current upstream row (every column of ``schema`` by name, values as the mounter produces them) or None
    when the upstream has no row with that key. Read-only; one caller thread at a time."""

    def __call__(self, schema: TableSchema, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any] | None]: ...

    def close(self) -> None: ...


def plain_insert(insert_values: Callable[[bytes, int], tuple[int, list[Any]] | None], payload: bytes, offset: int,
                 parse_row: Callable[[Sequence[Any]], tuple[Any, ...]], ncols: int
                 ) -> tuple[str, int, tuple[Any, ...], list[Any]] | None:
    """:meth:`ChangeDecoder.plain_row` of an insert read by ``insert_values``: ``("I", relid, parse_row(values),
    values)`` when it holds ``ncols`` values, each text or NULL, that ``parse_row`` parses; else None."""
    ins = insert_values(payload, offset)
    if ins is None:
        return None
    relid, new = ins
    if len(new) != ncols or not all(v is None or type(v) is str for v in new):
        return None
    try:
        row = parse_row(new)
    except Exception:  # noqa: BLE001 - the caller's general path reports it
        return None
    return "I", relid, row, new


def planned_schema(reader: SnapshotReader, name: TableName, oid: int = 0) -> TableSchema:
    """The schema at ``reader``'s snapshot of a table an earlier snapshot's plan named ``name`` (relation ``oid``, 0:
    unknown): by name; when no table has that name at this snapshot, relation ``oid``'s (renamed since the plan), under
    ``name``, the name its copy writes (docs/snapshot.md, "A table renamed between two runs"). Its reads go by the oid
    the schema carries. ``InvalidArgument`` when neither is found."""
    try:
        return reader.table_schema(name)
    except InvalidArgument:
        found = reader.relation_schema(oid) if oid else None
        if found is None:
            raise
    return dataclasses.replace(found, name=name)


class SnapshotReader(ABC):
    """Reads tables as they were at one upstream snapshot, in key-range chunks (docs/snapshot.md).

    Made by :meth:`Upstream.snapshot_reader` without I/O. The first call opens one connection with one
    read-only transaction at the snapshot (the named exported snapshot, imported; or, without a name, the
    transaction's own) and keeps it until :meth:`close`: every call of one reader sees the same data, and
    readers given the same snapshot name see the same data as each other. One thread at a time.

    Errors (all ``cdc.errors.TidewaterError``): ``SnapshotExpired`` when the named snapshot no longer exists;
    ``InvalidArgument`` for a table that does not exist at the snapshot; ``UpstreamUnavailable`` when the
    upstream cannot be reached or the connection breaks (the transaction is gone: make a new reader);
    ``DecodeError`` for a value the column's parser refuses.
    """

    snapshot: str | None = None
    #: :meth:`read_chunk_text` gives the rows as text (a copy whose target's key is deferred needs it: there is no
    #: parsed fallback for such a chunk); False: it always returns None
    reads_text: bool = False

    @abstractmethod
    def table_schema(self, table: TableName) -> TableSchema:
        """``table``'s schema at the snapshot (as ``Upstream.table_schema`` describes it)."""

    def relation_schema(self, oid: int) -> TableSchema | None:
        """The schema of relation ``oid`` at the snapshot, under the name it had then (None: none, or this reader
        cannot look relations up by oid)."""
        return None


    @abstractmethod
    def plan(self, schema: TableSchema, chunk_rows: int) -> TablePlan:
        """Split the table into chunks of about ``chunk_rows`` rows of the snapshot (at least one chunk; the
        chunks cover the whole key space, so rows written later also fall into exactly one). A table without
        a key (``schema.has_key`` False) is one ``whole`` chunk."""

    @abstractmethod
    def read_chunk(self, schema: TableSchema, chunk: SnapshotChunk, *, commit_ts: int = 0,
                   commit_time: float = 0.0) -> Iterator[RowChange]:
        """The chunk's rows at the snapshot, ordered by key, as INSERT changes exactly as the mounter makes them
        from the stream (``row`` with the parsed values and ``row_text`` with the upstream's text of each
        value, so a sink writes a copied row and the same row streamed identically), stamped with
        ``commit_ts``/``commit_time`` and marked as copied rows (``extra[cdc.events.SNAPSHOT] = True``: Debezium
        writes them as ``op: "r"``). The query runs when the iterator is first advanced and its rows
        stream (memory stays bounded whatever the chunk's size). Closing the iterator early abandons the read;
        after an abandoned or failed read the reader opens a new transaction at its snapshot (the same exported
        one; a new one of its own when it has no name)."""

    def read_ts(self) -> int | None:
        """The Ts the reader's current transaction sees (opening it if none is open; it stays open until
        :meth:`release`), when that may be *later* than the exported snapshot's ``ts``: an upstream that cannot
        share one snapshot between connections (MySQL/MariaDB) gives each transaction a snapshot of its own at a
        known position >= the export's. The copy stamps and records a chunk read in that transaction with it
        (keyed tables converge: docs/snapshot.md). None (the default, no I/O): exactly the imported snapshot."""
        return None

    def read_chunk_text(self, schema: TableSchema, chunk: SnapshotChunk) -> CopyText | None:
        """The same rows as :meth:`read_chunk`, as text in bulk (:class:`cdc.snapshot.CopyText`: no row is parsed),
        or None when this reader has no such form. Same snapshot, order, streaming and abandoning rules as
        :meth:`read_chunk`; the query runs when ``blocks`` is first advanced."""
        return None

    def count_rows(self, schema: TableSchema) -> int | None:
        """How many rows ``schema``'s table holds at the snapshot (a whole-table count: not for the hot path), or
        None when this reader cannot count them."""
        return None

    def release(self) -> None:  # noqa: B027 - optional: a reader that takes no locks has nothing to release
        """End the current transaction but keep the snapshot: the next call reads under it again. Call between
        tables: a reader that holds its lock on one table while it waits for another's can deadlock with the
        application's statement on both (measured: ``TRUNCATE parent, child`` under a copy was killed by
        PostgreSQL's deadlock detector), and the application's statement is the one that must never fail."""

    @abstractmethod
    def close(self) -> None:
        """End the transaction and the connection (idempotent)."""

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- control plane --------------------------------------------------------------------------------------
class Upstream(ABC):
    """One source database (see the module docstring for errors, sessions and threading).

    Idempotency: :meth:`drop_spans` and :meth:`align_spans` can be repeated after a crash at any point and
    converge; :meth:`create_spans` is all-or-nothing for what it created itself.
    """

    capture_notice: str | None = None
    #: every change the stream sends carries every column's value (MySQL/MariaDB: ``binlog_row_image = FULL``, checked
    #: at create), so a key change replayed over a later snapshot's copy never takes a value from another row: a
    #: half-copied keyed table goes on chunk by chunk under a new snapshot (docs/snapshot.md). False: PostgreSQL,
    #: whose unchanged TOASTed values are not sent
    sends_whole_rows: bool = False
    """Set by :meth:`create_spans` when the upstream could not install what puts otherwise invisible changes into
    the stream (PostgreSQL: event triggers for partition repair and DDL need a superuser): why, and what the
    changefeed does without it. ``changefeed create`` shows it."""

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __enter__(self) -> Upstream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """End the session (if one was opened). Idempotent; the object may be used again (new session)."""

    @abstractmethod
    def server_identity(self) -> tuple[str, int, str]:
        """(host, port, database) the URI names, normalised (no I/O): two URIs with the same identity reach the
        same slots and tables, whatever their credentials or options."""

    # -- readiness
    @abstractmethod
    def check_ready(self, *, slots_needed: int = 1) -> dict[str, Any]:
        """Raise ``UpstreamNotReady`` listing every problem with its fix unless the upstream can serve
        ``slots_needed`` more spans to this user; return the facts checked (for messages)."""

    def check_copy(self) -> None:  # noqa: B027 - optional: an upstream that copies has nothing to refuse
        """Raise ``InvalidArgument`` (naming the fix) unless this upstream can copy existing rows (the initial copy,
        :meth:`export_snapshot` and :meth:`snapshot_reader`); ``changefeed create`` asks before it creates anything
        when the changefeed is to copy them. Default: it can."""

    def retention_notice(self, keep_seconds: float) -> str | None:
        """Why this upstream may discard a stopped changefeed's position before ``keep_seconds`` (the servers'
        gc-ttl: how long a stopped or failed changefeed keeps it) have passed, with the fix; None when it keeps it
        at least that long (PostgreSQL: a slot retains its WAL until dropped). ``changefeed create`` shows it and
        the owner's look keeps it in the changefeed's warnings. Default: None."""
        return None

    @abstractmethod
    def probe(self, timeout: float = 2.0) -> None:
        """Cheap reachability check on its own short-lived connection (raises ``UpstreamUnavailable``)."""

    # -- tables
    @abstractmethod
    def list_tables(self) -> list[TableName]:
        """Every replicable table, sorted (partitions are not listed: their root is)."""

    @abstractmethod
    def table_schema(self, table: TableName | int) -> TableSchema:
        """The current schema of ``table`` (by name or relation id); ``InvalidArgument`` when there is none."""

    @abstractmethod
    def check_tables(self, tables: Sequence[TableName], *, publication: str | None = None) -> list[TableSchema]:
        """Check that every table can be replicated without harm (publishing it cannot make the application's
        writes fail, no column would be silently absent); return their schemas in order. ``publication``: the
        existing table set they would join (its settings apply), None: one made by :meth:`create_spans` now.
        ``InvalidArgument`` names missing tables, then ``TableNotEligible`` every ineligible one with its fix."""

    @abstractmethod
    def check_partition(self, leaf: TableName) -> None:
        """Like :meth:`check_tables` for a leaf partition of an already published root (it is published with
        its root): ``TableNotEligible`` when its UPDATEs and DELETEs fail upstream, ``InvalidArgument`` if gone."""

    # -- per-span resources
    @abstractmethod
    def create_spans(self, plans: Sequence[SpanPlan]) -> list[SpanInfo]:
        """Create each plan's publication and slot; return the spans with their start Ts (changes committed
        after it are streamed). ``InvalidArgument`` when a slot of that name exists already. All or nothing:
        on failure, what this call created (never what existed before) is dropped again, then it raises."""

    @abstractmethod
    def drop_spans(self, spans: Sequence[SpanInfo], *, timeout: float = 30.0) -> list[SpanInfo]:
        """Drop the spans' slots and publications (idempotent; a session still reading a slot is ended, waiting
        at most ``timeout`` s per slot). Returns the spans whose slot this call dropped."""

    @abstractmethod
    def align_spans(self, spans: Sequence[SpanInfo], wanted: Mapping[int, Sequence[TableName]], *,
                    label: str = "", join: JoinRule | None = None) -> AbstractContextManager[list[TableName]]:
        """Context manager: make each span's table set exactly ``wanted[span.index]`` (and its rule for tables
        created later ``join``), in one upstream transaction that is committed when the ``with`` block ends
        normally and rolled back when it raises. Yields the tables published before (sorted).
        ``InvalidArgument`` when a span's table set is gone. Recomputed from the actual table sets, so
        repeating it is harmless."""

    @abstractmethod
    def span_tables(self, span: SpanInfo) -> list[TableName] | None:
        """The tables ``span`` carries now (sorted), or None when its table set (publication) is gone."""

    @abstractmethod
    def slot_state(self, slot: str) -> SlotState | None:
        """The retained position named ``slot``, or None when there is none."""

    @abstractmethod
    def current_position(self) -> int:
        """The upstream's current write position (commit Ts units)."""

    @abstractmethod
    def add_table(self, span: SpanInfo, table: TableName, *, lock_timeout_ms: int, count_cap: int,
                  spans: Sequence[SpanInfo] = ()) -> int | None:
        """Add ``table`` to ``span``'s table set atomically with respect to the table's writers: every change
        committed after the add is streamed, none before. Returns how many rows the table held then (counted
        up to ``count_cap``: those rows will never be streamed), None when nothing was done (the table's
        writers could not be held back within ``lock_timeout_ms``, or it is already in the set of ``span`` or
        of one of ``spans``, the changefeed's others). Whether it is, is decided for the table the name denotes
        while its writers are held back: a table renamed onto the name since the caller read the sets (``DROP
        TABLE b; ALTER TABLE a RENAME TO b``) is found in the set of the span that carries it, and never added to
        a second one."""

    @abstractmethod
    def carrying_spans(self, relation_id: int, spans: Sequence[SpanInfo]) -> list[int]:
        """The indexes of those of ``spans`` whose table set holds relation ``relation_id`` now (sorted). By
        relation, not by name: a rename does not change the answer."""

    # -- inspection of partitioned tables
    @abstractmethod
    def partition_leaves(self, spans: Sequence[SpanInfo]) -> list[PartitionLeaf]:
        """The leaf partitions of every partitioned table the ``spans`` carry (one query)."""

    def captures_ddl(self) -> bool:
        """True when the upstream itself puts every schema change into the stream at its position (PostgreSQL:
        Tidewater's event triggers are installed and enabled); False when only what the row stream shows can be
        seen (docs/ddl.md: the fallback). Default: False."""
        return False

    def repairs_partitions(self) -> bool:
        """True when the upstream itself puts the rows of partitions that leave or join a published table into
        the stream (truncate, detach, drop, attach): then a look that sees such a change has nothing to warn
        about. Default: False."""
        return False

    @abstractmethod
    def relation_exists(self, oid: int) -> bool:
        """True when a relation with id ``oid`` exists."""

    @abstractmethod
    def has_rows(self, oid: int) -> bool:
        """True when relation ``oid`` holds at least one row (False when it no longer exists)."""

    # -- data plane
    @abstractmethod
    def span_source(self, span: SpanInfo, start: Watermark, table_filter: TableFilter, *, label: str,
                    holder: str, resume: str | None = None) -> SpanSource:
        """The change stream of ``span`` from ``start`` (see :class:`SpanSource`), not yet opened. ``holder``
        names this capture to the upstream (shown when another one finds the slot taken). ``resume``: the
        :meth:`SpanSource.resume_token` stored with the checkpoint ``start`` (None: none stored, e.g. a checkpoint
        written before tokens existed; then ``start.ts`` alone says where to continue, on the same server)."""

    def check_takeover(self, spans: Sequence[SpanInfo], tokens: Mapping[int, str | None]) -> None:
        """This upstream is another server than the one ``spans`` were read from (``changefeed update --upstream``
        with a new host or port: a promoted replica). Raise ``InvalidArgument`` naming what is missing unless every
        span can continue here exactly after its checkpoint from its resume token (``tokens[span.index]``): the
        server holds every transaction the token names, and still has everything after it. Default: an upstream
        whose positions are its own cannot be continued elsewhere."""
        raise InvalidArgument(f"{type(self).__name__}: a changefeed cannot continue on another server; create a new "
                              f"changefeed for it")

    @abstractmethod
    def row_source(self, *, label: str = "") -> RowReader:
        """A read-only :class:`RowReader` on its own connection (opened on first use)."""

    def export_snapshot(self, *, label: str = "", resume: str | None = None
                        ) -> AbstractContextManager[ExportedSnapshot]:
        """Context manager: a snapshot of the whole database that readers in other processes can import for as
        long as the block runs, with its exact position ``ts`` in the commit order (the snapshot holds exactly
        the commits with Ts <= ``ts``), so that changes at or below ``ts`` are known to be in a copy read under
        it. Costs the upstream one extra retained position while it lasts (PostgreSQL: a temporary logical
        slot, dropped with its session, also if this process dies). ``UpstreamUnavailable`` /
        ``UpstreamNotReady`` (no slot free) as for the spans' resources.

        ``resume``: the resume token (:meth:`SpanSource.resume_token`) of the span the copy belongs to, as last
        stored; ``ts`` (and the readers' Ts) are then numbered as that span's stream numbers its commits, also
        where that depends on the stream's history (MySQL: the Ts epoch raised when the changefeed moved to
        another server). None: a stream that starts now (a new changefeed)."""
        raise NotImplementedError(f"{type(self).__name__} cannot export a snapshot")

    def snapshot_reader(self, snapshot: str | None = None, *, label: str = "") -> SnapshotReader:
        """A :class:`SnapshotReader` at the exported snapshot named ``snapshot`` (PostgreSQL: the name
        ``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')`` returned), or at a snapshot of its own when None.
        Default: this upstream cannot copy existing rows (``InvalidArgument``)."""
        raise InvalidArgument(f"{type(self).__name__} cannot copy existing rows (no snapshot reader)")

