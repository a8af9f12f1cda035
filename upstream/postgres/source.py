"""A span's PostgreSQL change stream: pgoutput messages demultiplexed into the sorter (``upstream.base.SpanSource``).

:class:`PgSpanSource` reads one :class:`~upstream.postgres.stream.ReplicationStream` and turns its messages
into buffer operations (add / abort / commit), keeps the span's schema versions (a Relation message makes a
new ``TableSchema`` version; every stored change carries the version valid when it was decoded) and reports
the span's resolved watermark. :class:`PgChangeDecoder` is what the mounter decodes the stored payloads with.

Guarantees: those of :class:`upstream.base.SpanSource`. In particular ``on_resolved(w)`` is called with
non-decreasing watermarks, only after every transaction with commit Ts (end LSN) <= ``w.ts`` is committed in
the buffer; transactions with commit Ts <= the start are aborted in the buffer (already downstream). Runs in
one thread (``run``); ``schema(version)`` may be called from any thread (dict reads; versions are never
mutated once published).

Hot path: ``run`` does nothing per row. The stream routes the non-streamed Insert/Update/Delete messages itself
(``ReplicationStream.messages`` with the source's relid -> payload prefix map, drained from libpq in C:
:mod:`upstream.postgres.walread`): they arrive in runs already stored as ``version prefix + raw``, each run handed
to the buffer in one ``add_many``, those of relations the span does not carry dropped by the stream. A stream that
does not route (a test stream) yields each raw; those are stored with locals only and handed over in runs too,
before any other message is handled.

Resolved: the commits of plain transactions are reported (``on_resolved``) together, not one by one: at the
stream's idle mark (``None``: it has read everything received so far and is about to wait), before any other message
is handled, at the end of the stream, and at least every ``REPORT_EVERY`` commits while the stream has more to read
at once. One ``Watermark`` and one call per such moment instead of per transaction; the sink thread reads what was
reported no sooner anyway (``processor.span.PASS_GAP``), and a commit waits for its report at most until the
stream's buffer is read (a catch-up: at most ``REPORT_EVERY`` transactions).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from cdc.events import ColumnSchema, DdlEvent, TableName, TableSchema
from cdc.filter import TableFilter
from cdc.model import DataWarning
from cdc.ts import Watermark
from upstream.base import SCHEMA_CHANGE, ChangeBuffer, ChangeDecoder, Parser, SpanSource, encode_payload
from upstream.postgres import (
    catalog,
    ddl_stream,
    partition_messages,
    pgoutput,
    pgoutput_messages,
    rowcodec,
    types,
)
from upstream.postgres.stream import Keepalive, ReplicationStream

log = logging.getLogger(__name__)

_RUN_ROWS = 1024  # plain changes handed to the buffer in one add_many at most
# plain commits reported resolved in one on_resolved at most (module docstring, "Resolved"): while the stream has more
# to read at once, a report per this many commits; whenever it has nothing (its idle mark), at once
REPORT_EVERY = 32


def merge_schema(rel: pgoutput_messages.Relation, current: TableSchema | None, version: int,
                 described: TableSchema | None = None) -> TableSchema:
    """The schema of a Relation message: its column list (authoritative for decoding tuples) enriched
    with the catalog's nullability and type names where the catalog still agrees.

    The key is the one *at the message's position in the stream*, never the catalog's of now (which may
    already hold a later DDL's key: rows written before ``ALTER TABLE .. DROP CONSTRAINT pkey, ADD PRIMARY
    KEY (other)`` in the same transaction were bound by the new key and failed, or were upserted by the wrong
    columns): for replica identity DEFAULT/INDEX (and NOTHING) it is the columns the message flags; under FULL
    the message flags every column, and the key (the primary key a FULL table may have) comes from
    ``described`` (the table as the stream last described it: a DDL message, or its previous version), and only
    when the stream knows nothing of the table from the catalog; provided its columns are all still there.
    """
    known = {c.name: c for c in current.columns} if current is not None else {}
    cols: list[ColumnSchema] = []
    for rc in rel.columns:
        c = known.get(rc.name)
        if c is not None and c.type_oid == rc.type_oid:
            cols.append(c)
            continue
        base, is_array = types.BUILTIN_TYPES.get(rc.type_oid, ("text", False))
        cols.append(ColumnSchema(rc.name, rc.type_oid, base, is_array, type_name=base,
                                 type_modifier=rc.type_modifier, is_key=bool(rc.flags & 1)))
    names = {c.name for c in cols}
    flagged = tuple(rc.name for rc in rel.columns if rc.flags & 1)
    key: tuple[str, ...] = flagged
    has_key = True
    if rel.replica_identity == "f":
        key, has_key = flagged, False
        source = described if described is not None else current
        if source is not None and source.key and source.has_key and all(k in names for k in source.key):
            key, has_key = source.key, True
    key_set = set(key)
    cols = [c if c.is_key == (c.name in key_set) else _with_key(c, c.name in key_set) for c in cols]
    return TableSchema(TableName(rel.namespace, rel.name), tuple(cols), tuple(key), rel.replica_identity,
                       rel.relid, version, has_key)


def describes(schema: TableSchema, rel: pgoutput_messages.Relation) -> bool:
    """Whether ``schema`` is a table exactly as ``rel`` shows it: same name, replica identity, columns (names,
    type oids and modifiers, in order) and, unless the identity is FULL (which flags every column), the same
    key columns."""
    if schema.name != TableName(rel.namespace, rel.name) or schema.replica_identity != rel.replica_identity:
        return False
    if [(c.name, c.type_oid, c.type_modifier) for c in schema.columns] != [
            (c.name, c.type_oid, c.type_modifier) for c in rel.columns]:
        return False
    return rel.replica_identity == "f" or (
        {c.name for c in rel.columns if c.flags & 1} == (set(schema.key) if schema.has_key else set()))


def _shape(s: TableSchema) -> tuple[object, ...]:
    """What a schema history records of a table (everything but the source's version number)."""
    return (s.name, s.columns, s.key, s.replica_identity, s.has_key)


def _with_key(c: ColumnSchema, is_key: bool) -> ColumnSchema:
    return ColumnSchema(c.name, c.type_oid, c.base_type, c.is_array, c.type_name, c.type_modifier,
                        c.nullable and not is_key, is_key)


class PgChangeDecoder(ChangeDecoder):
    """Decodes stored pgoutput changes (non-streamed Insert/Update/Delete, or :func:`pgoutput.truncate_raw`)
    with the text parsers of :mod:`upstream.postgres.types`. ``schemas(version)`` resolves schema versions.

    The per-row members are the plain functions of ``codec`` (:mod:`upstream.postgres.rowcodec`: C when it is
    available, else the pure-Python reference; both give the same values), set on the instance: binding them
    costs nothing per row.
    """

    # the class's own are the reference implementation; __init__ puts the codec's on the instance
    parse_change = staticmethod(pgoutput.parse_change)
    insert_values = staticmethod(pgoutput.insert_values)
    plain_row = staticmethod(pgoutput.plain_row)
    row_parser = staticmethod(types.row_parser)

    def __init__(self, schemas: Callable[[int], TableSchema], codec: rowcodec.RowCodec | None = None) -> None:
        self._schemas = schemas
        self.codec = codec = codec or rowcodec.best()
        self.parse_change = codec.parse_change  # type: ignore[method-assign]
        self.insert_values = codec.insert_values  # type: ignore[method-assign]
        self.plain_row = codec.plain_row  # type: ignore[method-assign]
        self.row_parser = codec.row_parser  # type: ignore[method-assign]
        self.plain_mounter = codec.plain_mounter  # type: ignore[method-assign]

    def schema(self, version: int) -> TableSchema:
        return self._schemas(version)

    def schema_changes(self, raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
        before, seq, local, content = ddl_stream.unpack(raw)
        return ddl_stream.events(content, self._schemas(before) if before else None, commit_ts, commit_time, seq,
                                 schemas=self._schemas, local=local)

    def parser(self, column: ColumnSchema) -> Parser:
        return types.parser_for(column.base_type, column.is_array)


class PgSpanSource(SpanSource):
    """One span's pgoutput stream into a :class:`~upstream.base.ChangeBuffer` (see the module docstring).

    ``catalog_conn()`` opens an ordinary connection, used to enrich Relation messages with the catalog's key,
    nullability and type names (opened on the first Relation message, closed when ``run`` ends). ``codec``: the
    per-row functions (:func:`upstream.postgres.rowcodec.best` when None) of ``run`` and of :meth:`decoder`.
    """

    def __init__(
        self,
        stream: ReplicationStream,
        table_filter: TableFilter,
        start: Watermark,
        catalog_conn: Callable[[], Any],
        label: str,
        codec: rowcodec.RowCodec | None = None,
    ) -> None:
        self.stream = stream
        self.filter = table_filter
        self.start = start
        self.label = label
        self._catalog_conn_factory = catalog_conn
        self._catalog_conn: Any = None
        self._schemas: dict[int, TableSchema] = {}
        self._relation_version: dict[int, int] = {}
        # relid -> encode_payload(its version, b""), for the relids of _relation_version: what the stream prefixes the
        # plain changes it routes with (ReplicationStream.messages)
        self._plain_prefixes: dict[int, bytes] = {}
        self._next_version = 1
        self._decoder = PgChangeDecoder(self.schema, codec)
        self.buffer: ChangeBuffer | None = None  # the buffer ``run`` feeds (for the message hook)
        # xid -> the transaction's DDL position so far (DdlEvent.seq): every tidewater.ddl message, also of tables
        # this span does not carry (every span sees them all, so every span counts the same), plus the schema changes
        # this span derived itself (fallback), after which its numbers are local (_ddl_local)
        self._ddl_seq: dict[int, int] = {}
        self._ddl_local: set[int] = set()  # xids with a schema change derived here: later seqs are local to the span
        self._ddl_sub_first: dict[int, tuple[int, int]] = {}  # streamed subxid -> (xid, seq of its first DDL message)
        self._ddl_held: set[int] = set()  # xids with a schema change stored in this span
        self._ddl_commits: set[int] = set()
        self._ddl_described: set[int] = set()  # relids with a DDL message since their last schema version
        self._ddl_after: dict[int, TableSchema | None] = {}  # relid -> the table after its last DDL message
        self._carried_by_join: set[int] = set()  # relids that joined the span by a DDL message (CREATE TABLE)
        self._carried: set[int] = set()  # relids this span replicates (asked by partition repair and DDL messages)
        self._started_with: set[int] | None = None  # the publication's tables when the span started
        self._carried_at_start: set[int] = set()  # relids the schema history gives this span at its start
        self._warnings: list[DataWarning] = []
        self._warnings_lock = threading.Lock()
        self._seeded: dict[int, int] = {}  # relid -> schema version from the schema history (seed_schemas)
        self._known: dict[int, TableSchema] = {}  # relid -> last schema recorded or seeded (for take_schema_versions)
        self._unrecorded: list[TableSchema] = []  # new schemas since the last commit
        self._versions: list[tuple[int, TableSchema]] = []  # (commit Ts, schema) not yet taken
        self.resolved = start
        # process mode (take_state / put_state): schema versions below this were sent to (or pickled for) the parent;
        # the schema-change commits in the order they were found, and how many of them were sent
        self._sent_version = 0
        self._ddl_commit_log: list[int] = []
        self._sent_ddl_commits = 0

    # ---- a process of its own (upstream.base.SpanSource.runs_in_child) -----------------------------------------
    runs_in_child = True

    def __getstate__(self) -> dict[str, Any]:
        """Picklable before ``open()``: no connection, lock, buffer or compiled codec crosses (the codec is chosen
        again by name in the other process)."""
        state = self.__dict__.copy()
        for name in ("_decoder", "_warnings_lock", "_catalog_conn", "buffer"):
            state.pop(name, None)
        state["_codec_name"] = self._decoder.codec.name
        state["_sent_version"] = self._next_version  # the other process starts with every version so far
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        codec_name = state.pop("_codec_name")
        self.__dict__.update(state)
        codec = rowcodec.best()
        if codec.name != codec_name:
            codec = rowcodec.PYTHON if codec_name == "python" else (rowcodec.native() or rowcodec.PYTHON)
        self._decoder = PgChangeDecoder(self.schema, codec)
        self._warnings_lock = threading.Lock()
        self._catalog_conn = None
        self.buffer = None

    def take_state(self) -> object:
        """Schema versions made since the last call (in version order; one allocated but not stored yet waits for
        the next call), schema-change commits, data warnings and schema versions to record (these two are taken:
        in the child nobody else takes them). None when there is nothing. Safe beside ``run``: it only reads dict
        entries and list prefixes ``run`` has finished writing, and takes the lists under their lock."""
        schemas: dict[int, TableSchema] = {}
        v, top = self._sent_version, self._next_version
        while v < top:
            schema = self._schemas.get(v)
            if schema is None:
                break
            schemas[v] = schema
            v += 1
        self._sent_version = v
        n = len(self._ddl_commit_log)
        commits = self._ddl_commit_log[self._sent_ddl_commits:n]
        self._sent_ddl_commits = n
        with self._warnings_lock:
            warnings, self._warnings = self._warnings, []
            versions, self._versions = self._versions, []
        if not (schemas or commits or warnings or versions):
            return None
        return schemas, commits, warnings, versions

    def put_state(self, state: object) -> None:
        schemas, commits, warnings, versions = state  # type: ignore[misc]
        self._schemas.update(schemas)
        self._ddl_commits.update(commits)
        if warnings or versions:
            with self._warnings_lock:
                self._warnings.extend(warnings)
                self._versions.extend(versions)

    # ---- SpanSource --------------------------------------------------------------------------------
    def open(self) -> None:
        self.stream.open()

    def close(self) -> None:
        self.stream.close()

    def ack(self, ts: int) -> None:
        self.stream.ack(ts)

    def decoder(self) -> PgChangeDecoder:
        return self._decoder

    def schema(self, version: int) -> TableSchema:
        return self._schemas[version]

    def seed_schemas(self, schemas: Iterable[TableSchema], carried: Collection[int] | None = None) -> None:
        """See :meth:`upstream.base.SpanSource.seed_schemas`. With ``carried``, only those tables' seeded schemas
        count as recorded by this span: the first schema the stream shows of another one (a table moved to this
        span by ``changefeed update``) is recorded again, as this span's."""
        if carried is not None:
            self._carried_at_start.update(carried)
        for schema in schemas:
            version = self._next_version
            self._next_version += 1
            self._schemas[version] = dataclasses.replace(schema, version=version)
            self._seeded[schema.relation_id] = version
            if carried is None or schema.relation_id in self._carried_at_start:
                self._known[schema.relation_id] = schema

    def take_schema_versions(self) -> list[tuple[int, TableSchema]]:
        with self._warnings_lock:
            out, self._versions = self._versions, []
        return out

    def _last_schema(self, relid: int) -> int | None:
        """The table's latest schema version: from the stream, else from the schema history."""
        ver = self._relation_version.get(relid)
        return ver if ver is not None else self._seeded.get(relid)

    # ---- message handlers (not per row) ------------------------------------------------------------
    def _on_relation(self, rel: pgoutput_messages.Relation, xid: int = 0, subxid: int = 0) -> None:
        """A new schema version. When the table's columns changed and no DDL message came for it since its last
        version (no DDL trigger upstream, or it was disabled), a schema change derived from the two versions is
        stored before the rows that use the new one (the fallback of docs/ddl.md)."""
        name = TableName(rel.namespace, rel.name)
        if not self.filter.match(name):
            self._relation_version.pop(rel.relid, None)
            self._plain_prefixes.pop(rel.relid, None)
            return
        previous = self._last_schema(rel.relid)
        described = rel.relid in self._ddl_described
        # What the stream itself knows of the table at this position, when the message confirms it: the schema
        # after the DDL message just before it, else the previous version (a message sent again after a cache
        # invalidation). The catalog is read *now*, possibly after later DDL (the span decodes behind the
        # upstream): its key, nullability or type modifier may not be those of these rows.
        known_here = self._ddl_after.pop(rel.relid, None) if described else (
            self._schemas[previous] if previous is not None else None)
        current: TableSchema | None
        if known_here is not None and describes(known_here, rel):
            current = known_here
        else:
            current = self._catalog_schema(rel.relid, name)
        version = self._next_version
        self._next_version += 1
        schema = self._schemas[version] = merge_schema(rel, current, version)
        self._relation_version[rel.relid] = version
        self._plain_prefixes[rel.relid] = encode_payload(version, b"")
        known = self._known.get(rel.relid)
        if known is None or _shape(known) != _shape(schema):
            self._known[rel.relid] = schema
            self._unrecorded.append(schema)
        self._ddl_described.discard(rel.relid)
        if previous is None or described or xid == 0 or self.buffer is None:
            return
        prev = self._schemas[previous]
        old_cols = [(c.name, c.type_oid, c.type_modifier) for c in prev.columns]
        if prev.name == name and old_cols == [(c.name, c.type_oid, c.type_modifier) for c in schema.columns]:
            return  # (a table renamed is a schema change too: its rows would land on another name downstream)
        seq = self._take_seq(xid, subxid)
        self._ddl_local.add(xid)
        self._ddl_held.add(xid)
        self.buffer.add(xid, subxid, encode_payload(SCHEMA_CHANGE, ddl_stream.pack(
            previous, seq, ddl_stream.fallback(rel.relid, name, version), local=True)))

    def _catalog_schema(self, relid: int, name: TableName) -> TableSchema | None:
        if self._catalog_conn is None:
            self._catalog_conn = self._catalog_conn_factory()
        try:
            return catalog.table_schema(self._catalog_conn, relid)
        except Exception as exc:  # noqa: BLE001 - table dropped since: fall back to the message alone
            log.warning("span=%s no catalog schema for %s (%s); using the Relation message only",
                        self.label, name, exc)
            return None

    def _on_message(self, m: pgoutput_messages.LogicalMessage, xid: int, subxid: int) -> None:
        """A ``pg_logical_emit_message`` record. Partition repair messages (:mod:`partition_messages`) of a root
        this span carries become Insert/Delete changes of the root in the message's (sub)transaction, at its
        position; a ``lost`` marker becomes a data warning (:meth:`take_warnings`). Other prefixes carry
        nothing to replicate."""
        if not m.transactional:
            return
        if m.prefix == ddl_stream.PREFIX:
            self._on_ddl(m, xid, subxid)
            return
        if m.prefix != partition_messages.PREFIX:
            return
        msg = partition_messages.parse(m.content)
        if msg.root_oid and not self._carries(msg.root, msg.root_oid):
            return
        if msg.op == "lost":
            with self._warnings_lock:
                self._warnings.append(msg.warning(time.time()))
            return
        assert msg.relation is not None and self.buffer is not None
        relid = msg.root_oid
        ver = self._relation_version.get(relid)
        if ver is None or not partition_messages.same_columns(msg.relation, self._schemas[ver]):
            self._on_relation(msg.relation)  # the columns the rows are encoded with: a schema version of them
            ver = self._relation_version.get(relid)
            if ver is None:
                return
        add = self.buffer.add
        for raw in msg.changes:
            add(xid, subxid, encode_payload(ver, raw))
        log.info("span=%s partition %s of %s: %d row(s) %s (%s)", self.label, msg.leaf, msg.root, len(msg.changes),
                 "deleted" if msg.op == "delete" else "upserted", msg.reason)

    def _on_ddl(self, m: pgoutput_messages.LogicalMessage, xid: int, subxid: int) -> None:
        """A schema change (``ddl_stream``) of a table this span carries: stored at its position in the transaction
        as a :data:`~upstream.base.SCHEMA_CHANGE` payload with the table's schema version before it, and the
        transaction remembered so that the span cuts it there (:meth:`schema_change_commits`). Every message takes
        the transaction's next DDL position (:meth:`_take_seq`), also one of a table this span does not carry."""
        seq = self._take_seq(xid, subxid)
        about = ddl_stream.about(m.content)
        if about.error:
            with self._warnings_lock:
                self._warnings.append(about.warning(time.time()))
            return
        if about.relid and self.stream.publication in about.joined and self.filter.match(about.table):
            self._carried.add(about.relid)  # joined in this transaction (maybe not committed yet: streamed)
            self._carried_by_join.add(about.relid)
        if about.relid == 0 or not self._carries(about.table, about.relid):
            return
        if self._last_schema(about.relid) is None and about.relid not in self._carried_by_join:
            # the span has no schema of the table: it is in the publication only because the owner added it after
            # this transaction (picked up: CREATE TABLE AS, a key added later, no DDL trigger join). Its schema
            # comes with its first Relation message, its earlier rows with a table copy (docs/snapshot.md)
            log.info("span=%s schema change of %s before it joined the span: not replicated (%s)", self.label,
                     about.table, about.query[:200])
            return
        assert self.buffer is not None
        before = self._last_schema(about.relid) or 0
        self._ddl_described.add(about.relid)  # its next Relation message is this DDL's, no fallback
        self._ddl_after[about.relid] = ddl_stream.after(m.content)
        self._ddl_held.add(xid)
        self.buffer.add(xid, subxid, encode_payload(SCHEMA_CHANGE, ddl_stream.pack(
            before, seq, m.content, local=xid in self._ddl_local)))

    def _take_seq(self, xid: int, subxid: int) -> int:
        """The next DDL position (``DdlEvent.seq``) of transaction ``xid``. Every span counts the same: the messages
        of a subtransaction rolled back are not sent when the transaction is sent at its commit, and when it was
        streamed before, its abort (:meth:`_abort_sub`) takes its positions back, so the next message gets the same
        number in both cases."""
        seq = self._ddl_seq.get(xid, 0)
        self._ddl_seq[xid] = seq + 1
        if subxid != xid and subxid not in self._ddl_sub_first:
            self._ddl_sub_first[subxid] = (xid, seq)
        return seq

    def _abort_sub(self, xid: int, subxid: int) -> None:
        """A streamed subtransaction rolled back: everything decoded since its first DDL message belongs to it or to
        its own subtransactions (one backend runs them in turn), so the count goes back to that message's number (the
        lowest of the aborted ones: a parent's abort may come before or after its children's)."""
        first = self._ddl_sub_first.pop(subxid, None)
        if first is not None and first[0] == xid and xid in self._ddl_seq:
            self._ddl_seq[xid] = min(self._ddl_seq[xid], first[1])

    def _forget_txn(self, xid: int) -> None:
        """The transaction ended (committed, aborted): its DDL counting state goes."""
        self._ddl_seq.pop(xid, None)
        self._ddl_local.discard(xid)
        if self._ddl_sub_first:
            for sub in [k for k, v in self._ddl_sub_first.items() if v[0] == xid]:
                del self._ddl_sub_first[sub]

    def schema_change_commits(self) -> set[int]:
        return self._ddl_commits

    def _carries(self, root: TableName, relid: int) -> bool:
        """Whether this span replicates ``root``: it has seen its Relation, or the root matches the filter and
        is in the span's publication (now, or when the span started), or the schema history says this span
        replicated it at its start and the table no longer exists upstream. The last is a table dropped before
        the start whose DROP TABLE the span decodes now (its message, and any DDL of the table before it): the
        drop took it out of the publication, so only what the span replicated before can say the DDL is its own.
        A table that still exists and left the publication was moved to another span (or out of the changefeed)
        by ``changefeed update``: that span's publication answers for it. Only a yes is remembered: a table is
        added to a publication later (the owner's pick-up), and the messages that ask are rare (partition repair,
        DDL)."""
        if relid in self._relation_version or relid in self._carried:
            return True
        if not self.filter.match(root):
            return False
        if self._in_publication(relid) or (relid in self._carried_at_start and not self._exists(relid)):
            self._carried.add(relid)
            return True
        return False

    def _exists(self, relid: int) -> bool:
        if self._catalog_conn is None:
            self._catalog_conn = self._catalog_conn_factory()
        return catalog.relation_info(self._catalog_conn, relid) is not None

    def _in_publication(self, relid: int) -> bool:
        """Whether ``relid`` is in the span's publication now, or was when the span started (a DROP TABLE's
        message is decoded after the table left the publication)."""
        if self._started_with is not None and relid in self._started_with:
            return True
        return relid in self._publication_relids()

    def _publication_relids(self) -> set[int]:
        if self._catalog_conn is None:
            self._catalog_conn = self._catalog_conn_factory()
        with self._catalog_conn.cursor() as cur:
            cur.execute("SELECT pr.prrelid FROM pg_catalog.pg_publication_rel pr "
                        "JOIN pg_catalog.pg_publication p ON p.oid = pr.prpubid WHERE p.pubname = %s",
                        (self.stream.publication,))
            return {int(r[0]) for r in cur.fetchall()}

    def take_warnings(self) -> list[DataWarning]:
        with self._warnings_lock:
            out, self._warnings = self._warnings, []
        return out

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self, buffer: ChangeBuffer, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        self.buffer = buffer
        try:
            self._started_with = self._publication_relids()
        except Exception as exc:  # noqa: BLE001 - only DROP TABLE detection needs it; the stream reports outages
            log.warning("span=%s could not list the publication's tables: %s", self.label, exc)
        relver = self._relation_version
        skip_upto = self.start.ts
        txn_xid = 0
        stream_xid = 0
        resolved = self.start
        change_t, begin_t = pgoutput_messages.Change, pgoutput_messages.Begin
        commit_t = pgoutput_messages.Commit
        relid_of = self._decoder.codec.plain_change_relid
        begin_b, commit_b = pgoutput.BEGIN, pgoutput.COMMIT
        begin_xid, commit_position = pgoutput.begin_xid, pgoutput.commit_position
        add, add_many, commit = buffer.add, buffer.add_many, buffer.commit
        plain_prefixes = self._plain_prefixes  # relid -> its version's payload prefix (the stream routes by it too)
        # the resolved watermark not yet reported (module docstring, "Resolved"): pend_ts > resolved.ts while commits
        # wait for the report; ``unreported`` counts them
        pend_ts, pend_time = resolved.ts, resolved.time
        unreported = 0
        report_every = REPORT_EVERY
        # the plain changes of the current transaction not yet handed to the buffer: added as one run (add_many)
        # before any other message is handled, so the buffer sees every change in stream order
        run: list[bytes] = []
        try:
            for m in self.stream.messages(stop, plain_prefixes):
                t = type(m)
                if t is list:  # a run of plain changes the stream stored already (prefix + raw: ReplicationStream)
                    if run:  # (never from a stream that routes: it yields only malformed plain changes raw)
                        add_many(txn_xid, txn_xid, run)
                        run = []
                    add_many(txn_xid, txn_xid, m)
                    continue
                if t is bytes:  # a non-streamed Insert/Update/Delete, Begin or Commit, raw (ReplicationStream.messages)
                    first = m[0]
                    if first == commit_b:
                        if run:
                            add_many(txn_xid, txn_xid, run)
                            run = []
                        end_lsn, commit_time = commit_position(m)
                        if end_lsn <= skip_upto or self._unrecorded or self._ddl_seq:
                            if not self._commit(buffer, txn_xid, end_lsn, commit_time, skip_upto):
                                continue
                        else:  # (the common case without a call of _commit)
                            commit(txn_xid, end_lsn, commit_time)
                        if end_lsn > pend_ts:
                            pend_ts = end_lsn
                            if commit_time > pend_time:
                                pend_time = commit_time
                            unreported += 1
                            if unreported >= report_every:
                                resolved = Watermark(pend_ts, pend_time)
                                on_resolved(resolved)
                                unreported = 0
                        continue
                    if first == begin_b:
                        if run:  # (never: a Commit ended the last transaction)
                            add_many(txn_xid, txn_xid, run)
                            run = []
                        txn_xid = begin_xid(m)
                        continue
                    prefix = plain_prefixes.get(relid_of(m))
                    if prefix is None:  # (a relation the span does not carry)
                        continue
                    run.append(prefix + m)
                    if len(run) >= _RUN_ROWS:
                        add_many(txn_xid, txn_xid, run)
                        run = []
                    continue
                if run:
                    add_many(txn_xid, txn_xid, run)
                    run = []
                if unreported:  # any other message (the stream's idle mark, None, among them) reports the commits
                    resolved = Watermark(pend_ts, pend_time)
                    on_resolved(resolved)
                    unreported = 0
                if m is None:
                    continue
                if t is change_t:
                    ver = relver.get(m.relid)
                    if ver is None:
                        continue
                    if m.xid is None:
                        add(txn_xid, txn_xid, encode_payload(ver, m.raw))
                    else:
                        add(stream_xid, m.xid, encode_payload(ver, m.raw))
                elif t is begin_t:
                    txn_xid = m.xid
                elif t is commit_t:
                    if self._commit(buffer, txn_xid, m.end_lsn, m.commit_time, skip_upto) and m.end_lsn > resolved.ts:
                        resolved = Watermark(m.end_lsn, max(m.commit_time, resolved.time))
                        on_resolved(resolved)
                elif t is Keepalive:
                    if m.ts > resolved.ts or (m.ts == resolved.ts and m.time > resolved.time):
                        resolved = Watermark(max(m.ts, resolved.ts), max(m.time, resolved.time))
                        on_resolved(resolved)
                elif t is pgoutput_messages.StreamStart:
                    stream_xid = m.xid
                elif t is pgoutput_messages.StreamStop:
                    stream_xid = 0
                elif t is pgoutput_messages.StreamCommit:
                    if self._commit(buffer, m.xid, m.end_lsn, m.commit_time, skip_upto) and m.end_lsn > resolved.ts:
                        resolved = Watermark(m.end_lsn, max(m.commit_time, resolved.time))
                        on_resolved(resolved)
                elif t is pgoutput_messages.StreamAbort:
                    buffer.abort(m.xid, m.subxid)
                    if self._ddl_seq:
                        if m.xid == m.subxid:
                            self._forget_txn(m.xid)
                            self._ddl_held.discard(m.xid)
                        else:
                            self._abort_sub(m.xid, m.subxid)
                elif t is pgoutput_messages.Relation:
                    if m.xid is None:
                        self._on_relation(m, txn_xid, txn_xid)
                    else:
                        self._on_relation(m, stream_xid, m.xid)
                elif t is pgoutput_messages.Truncate:
                    xid = txn_xid if m.xid is None else stream_xid
                    sub = xid if m.xid is None else m.xid
                    for relid in m.relids:
                        ver = relver.get(relid)
                        if ver is not None:
                            add(xid, sub, encode_payload(ver, pgoutput.truncate_raw(relid, m.options)))
                elif t is pgoutput_messages.LogicalMessage:
                    # HOOK: pg_logical_emit_message records (partition repair, DDL) -> _on_message
                    if m.xid is None:
                        self._on_message(m, txn_xid, txn_xid)
                    else:
                        self._on_message(m, stream_xid, m.xid)
                # Origin and Type messages carry nothing we replicate.
                pend_ts, pend_time = resolved.ts, resolved.time
            if run:  # (the stream ended inside a transaction: its changes are in the buffer, uncommitted)
                add_many(txn_xid, txn_xid, run)
            if unreported:  # (the stream ended, or stop: the commits read are in the buffer)
                on_resolved(Watermark(pend_ts, pend_time))
        finally:
            if self._catalog_conn is not None:
                try:
                    self._catalog_conn.close()
                except Exception:  # noqa: BLE001
                    pass
                self._catalog_conn = None

    def _commit(self, buffer: ChangeBuffer, xid: int, end_lsn: int, commit_time: float, skip_upto: int) -> bool:
        """Transaction ``xid`` committed at ``end_lsn``: its schema versions and schema change recorded, the buffer's
        commit; or, at or below ``skip_upto`` (already downstream before the restart), its abort. Whether it was
        committed in the buffer (the caller then reports it resolved)."""
        if self._unrecorded:  # valid from this commit on (a version seen in a rolled-back one is still in use)
            with self._warnings_lock:
                self._versions.extend((end_lsn, s) for s in self._unrecorded)
            self._unrecorded = []
        if self._ddl_seq:
            self._forget_txn(xid)
            if xid in self._ddl_held:
                self._ddl_held.discard(xid)
                if end_lsn > skip_upto:
                    self._ddl_commits.add(end_lsn)  # before the buffer commit: the span must not read it uncut
                    self._ddl_commit_log.append(end_lsn)
        if end_lsn <= skip_upto:
            buffer.abort(xid, xid)  # already downstream before the restart
            return False
        buffer.commit(xid, end_lsn, commit_time)
        return True
