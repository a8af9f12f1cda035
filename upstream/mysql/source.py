"""A span's MySQL/MariaDB change stream: the row binlog, grouped into whole transactions, into the sorter.

:class:`MySqlSpanSource` reads the binlog over its own replication connection (its own ``server_id``; connected,
registered and asked for the dump by ``pymysqlreplication``) from the span's start position
(:mod:`upstream.mysql.positions`: the start Ts *is* the file and position after the last transaction already
downstream). The events themselves are read and decoded by our own hot path, with no object per event:
:mod:`upstream.mysql.wire` reads the packets, :mod:`upstream.mysql.binlog` frames them (CRC32 verified),
:mod:`upstream.mysql.tablemap` parses a TABLE_MAP only when its bytes change, and :mod:`upstream.mysql.rowdecode`
(in C where built, :mod:`upstream.mysql.rowcodec`) decodes rows straight into stored payloads. The events become
buffer operations:

- a GTID event (MariaDB; MySQL's GTID event and ``BEGIN``) opens a transaction; its row events (of tables the
  filter selects in the span's database) are rendered to text (:mod:`upstream.mysql.types`) and stored
  (:mod:`upstream.mysql.payload`); the XID event (or a ``COMMIT`` query, non-transactional engines) commits it at
  Ts = (file sequence << 32) | the XID event's end position, with the event's timestamp as commit time;
- a transaction without rows of the span commits nothing but still advances the resolved watermark, and so do the
  server's heartbeats (``master_heartbeat_period``) on an idle server;
- a schema change naming a table the span carries (any statement other than transaction control) is stored at its
  position as a SCHEMA_CHANGE when :mod:`upstream.mysql.ddl` understands it (ADD/DROP COLUMN, DROP TABLE, ...), the
  rows after it decoded with the new schema version; any other is refused with a DecodeError naming it; a CREATE
  TABLE of a table the filter selects is a ``create table`` schema change (its columns from the catalog);
- a value its column's type cannot hold exactly (zero dates, TIME outside a day...) is refused with a DecodeError
  naming the table, column and binlog position; a table whose binlog columns differ from the schema the span
  decodes it with (the seeded schema history's at the start, else the catalog's) likewise.

Resume (:mod:`upstream.mysql.resume`): the source keeps the GTID of every commit it passes until the processor has
stored a checkpoint past it (one small tuple per transaction), so :meth:`MySqlSpanSource.resume_token` gives the GTID
state and binlog position after any checkpoint. Started with a token of the same server it continues at the token's
file and position; with a token of another server (a promoted replica) it checks that the server contains the
token's GTID state and still has what follows, then streams from that GTID state with the Ts epoch one higher.

Any stream error ends ``run`` with ``UpstreamUnavailable``; the caller restarts the span from its checkpoint. The
library never reconnects by itself (it reads no packet after the dump's first). A row event whose columns-present
bitmap does not cover every column (a session's ``binlog_row_image`` not FULL), a compressed event
(``log_bin_compress``) and a MySQL partial JSON update are refused with a DecodeError, never decoded as full rows.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import threading
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import RotateEvent

from cdc.errors import (
    DdlRejected,
    DecodeError,
    InvalidArgument,
    SlotLost,
    TidewaterError,
    UpstreamUnavailable,
)
from cdc.events import (
    UNCHANGED,
    ColumnFill,
    ColumnSchema,
    DdlChange,
    DdlEvent,
    DdlKind,
    IndexSpec,
    TableName,
    TableSchema,
)
from cdc.filter import TableFilter
from cdc.model import WARN_TABLE_INELIGIBLE, DataWarning, WarningSeverity
from cdc.ts import Watermark, lsn_to_str
from upstream.base import (
    SCHEMA_CHANGE,
    ChangeBuffer,
    ChangeDecoder,
    Parser,
    SpanSource,
    encode_payload,
)
from upstream.mysql import (
    admin,
    binlog,
    catalog,
    ddl,
    eligibility,
    payload,
    positions,
    row_image,
    rowcodec,
    rowdecode,
    types,
    wire,
)
from upstream.mysql.conn import Connection, stream_settings
from upstream.mysql.resume import GtidState, MysqlGtidSet, ResumePoint, is_mysql_gtid, uuid_text
from upstream.mysql.span_set import SpanShare
from upstream.mysql.tablemap import TableMap, TableMapCache
from upstream.postgres import types as text_types

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
BACKLOG_SECONDS = 0.05
"""A backlog counts as caught up with (``MySqlSpanSource.caught_up_ts``) only when reading it took at least this long:
a catch-up or a burst, not a steady stream that fell a few transactions behind for a moment (each such point costs a
span status write)."""
_INTEGER_FIELDS = frozenset({1, 2, 3, 8, 9})  # TINY, SHORT, LONG, LONGLONG, INT24
_CHECKSUM_ATTR = "_BinLogStreamReader__use_checksum"  # set by the library's handshake (@master_binlog_checksum)
ROWS_EVENTS = binlog.ROWS_V1 | binlog.ROWS_V2 | {binlog.PARTIAL_UPDATE_ROWS}
_PASSED = binlog.PASSED
_NOT_DDL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|XA\s)", re.IGNORECASE)
# CREATE TEMPORARY TABLE (ddl.created_table names every other CREATE TABLE): a session's own table, never replicated
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+(TEMPORARY\s+)?TABLE\s", re.IGNORECASE)
_IDENT = re.compile(r"(`(?:[^`]|``)+`|[A-Za-z0-9_$]+)(?:\s*\.\s*(`(?:[^`]|``)+`|[A-Za-z0-9_$]+))?")


def _unquote(part: str) -> str:
    return part[1:-1].replace("``", "`") if part.startswith("`") else part


def named_tables(query: str, default_schema: str) -> set[TableName]:
    """Every ``name`` or ``schema.name`` the statement mentions (a superset of the tables it changes)."""
    out: set[TableName] = set()
    for m in _IDENT.finditer(query):
        a, b = m.group(1), m.group(2)
        out.add(TableName(_unquote(a), _unquote(b)) if b else TableName(default_schema, _unquote(a)))
    return out


def _change(doc: list[Any]) -> DdlChange:
    """A stored ``[kind, column, new_name?, [index name, columns, unique]?]`` as a DdlChange."""
    ix = doc[3] if len(doc) > 3 else None
    return DdlChange(DdlKind(doc[0]), doc[1], doc[2] if len(doc) > 2 else None,
                     IndexSpec(ix[0], tuple(ix[1]), bool(ix[2])) if ix else None)


def _change_doc(c: ddl.Change) -> list[Any]:
    return [c.kind, c.column, c.new_name, [c.index[0], list(c.index[1]), c.index[2]] if c.index else None]


def gtid_start_refusal(uri: str, server_id: int, gtid: str) -> str | None:
    """What the MariaDB server at ``uri`` answers a replica (``server_id``) that asks to stream after GTID state
    ``gtid`` in strict mode: None when it accepts, else its refusal (e.g. the GTID is not in its binlog: a server of
    another replication topology, whose own sequence numbers merely happen to be higher). Reads nothing but the
    first event of the dump."""
    reader = BinLogStreamReader(stream_settings(uri), server_id=server_id, auto_position=gtid,
                                is_mariadb=not is_mysql_gtid(gtid), blocking=False, only_events=[RotateEvent],
                                pymysql_wrapper=Connection)
    try:
        reader.fetchone()
        return None
    except pymysql.MySQLError as exc:
        return str(exc.args[1] if len(exc.args) > 1 else exc)
    finally:
        reader.close()


class MySqlChangeDecoder(ChangeDecoder):
    """Decodes stored MySQL changes (:mod:`upstream.mysql.payload`); values are text parsed with
    :mod:`upstream.postgres.types` (the vocabulary's types, see :mod:`upstream.mysql.types`)."""

    # the class's own are the reference implementation; __init__ puts the decoding's on the instance
    parse_change = staticmethod(payload.parse)
    insert_values = staticmethod(payload.insert_values)
    plain_row = staticmethod(payload.plain_row)
    row_parser = staticmethod(text_types.row_parser)  # type: ignore[assignment]

    def __init__(self, schemas: Callable[[int], TableSchema], decoding: rowcodec.Decoding | None = None) -> None:
        """``decoding``: the per-row functions (:func:`upstream.mysql.rowcodec.best_decoding` when None: C where it
        is built; both give the same values), set on the instance so that binding them costs nothing per row."""
        self._schemas = schemas
        self.decoding = decoding = decoding or rowcodec.best_decoding()
        self.parse_change = decoding.parse_change  # type: ignore[method-assign]
        self.insert_values = decoding.insert_values  # type: ignore[method-assign]
        self.plain_row = decoding.plain_row  # type: ignore[method-assign]
        self.row_parser = decoding.row_parser  # type: ignore[method-assign]
        self.plain_mounter = decoding.plain_mounter  # type: ignore[method-assign]

    def schema(self, version: int) -> TableSchema:
        return self._schemas(version)

    def schema_changes(self, raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
        """The DdlEvent of a schema change the span stored (:meth:`MySqlSpanSource._store_ddl`)."""
        try:
            doc = json.loads(raw)
            if doc.get("refused"):  # a statement the span could not translate (MySqlSpanSource._refuse)
                raise DdlRejected(doc["query"], ".".join(doc["table"]), f"{doc['refused']}; the span decodes the "
                                  f"rows after it with the table as the upstream's catalog showed it then. Apply the "
                                  f"change downstream by hand, then skip it", commit_ts=commit_ts)
            before = self._schemas(doc["before"]) if doc["before"] else None  # (0: CREATE TABLE)
            after = self._schemas(doc["after"]) if doc["after"] else None  # (0: DROP TABLE)
            fills = []
            for col, text in doc["fills"]:
                assert after is not None
                fills.append(ColumnFill(col, None if text is None else self.parser(after.column(col))(text)))
            return [DdlEvent(commit_ts, commit_time, TableName(*doc["table"]),
                             tuple(_change(ch) for ch in doc["changes"]), before, after, doc["query"],
                             int(doc["seq"]), fills=tuple(fills))]
        except (ValueError, KeyError, TypeError, AssertionError, ArithmeticError) as exc:
            raise DecodeError(f"malformed MySQL schema change payload: {exc}") from exc

    def parser(self, column: ColumnSchema) -> Parser:
        return text_types.parser_for(column.base_type, column.is_array)


class _Table:
    """A table the span decodes: its schema version, column names and value renderers."""

    __slots__ = ("version", "relid", "names", "renderers", "name", "data_types", "unsigned", "checked", "facts",
                 "guessed", "live")

    def __init__(self, facts: catalog.TableFacts, version: int, relid: int) -> None:
        self.facts = facts
        self.name, self.version, self.relid = facts.name, version, relid
        self.names = tuple(c.name for c in facts.columns)
        self.renderers = facts.renderers()
        self.data_types = tuple(c.data_type for c in facts.columns)
        self.unsigned = tuple("unsigned" in c.column_type.lower() for c in facts.columns)
        self.guessed = tuple(c.extra == catalog.GUESSED for c in facts.columns)
        self.checked: Any = None  # the table map's column list last checked against (one check per table map)
        self.live = True  # False once another version replaced it or the span stopped carrying the table


class MySqlSpanSource(SpanSource):
    """One span's binlog into a :class:`~upstream.base.ChangeBuffer` (see the module docstring).

    ``uri``: the upstream; ``database``: the span's schema; ``server_id``: this replication connection's id (unique
    per span and distinct from the server's own); ``share``: which tables this span carries of those the filter
    selects (:mod:`upstream.mysql.span_set`; the others' rows are dropped at their TABLE_MAP, their DDL ignored,
    except a rename onto a name this span carries, which it refuses at its position).
    """

    def __init__(self, uri: str, database: str, where: str, server_id: int, table_filter: TableFilter,
                 start: Watermark, label: str, *, connect: Callable[[], Any], resume: str | None = None,
                 share: SpanShare | None = None) -> None:
        self.uri = uri
        self.database = database
        self.where = where
        self.server_id = server_id
        self.filter = table_filter
        self.share = share if share is not None else SpanShare(0, 1)
        self.start = start
        self.label = label
        self._connect = connect
        self._schemas: dict[int, TableSchema] = {}
        self._tables: dict[TableName, _Table] = {}
        self._next_version = 1
        self._decoder = MySqlChangeDecoder(self.schema)
        self._stream: BinLogStreamReader | None = None
        self._ctl: Any = None
        self._closed = threading.Event()
        self._start_file: str | None = None
        self._start_pos = 0
        self._carried: set[TableName] = set()  # the span's tables when it started (a DDL of one is refused)
        self._ddl_seq = -1  # the open transaction's last schema change position (DdlEvent.seq)
        self._ddl_commits: set[int] = set()
        self._unrecorded: list[TableSchema] = []  # schema versions of the open transaction
        self._versions: list[tuple[int, TableSchema]] = []
        self._versions_lock = threading.Lock()
        self._seeds: dict[TableName, TableSchema] = {}  # seed_schemas
        self._ineligible: dict[TableName, str] = {}  # tables created since that cannot be replicated -> why
        self._warnings: list[DataWarning] = []
        # resume positions (resume_token): the token given, the state at the start and the GTID of each commit since
        self.resume = resume
        self._epoch = positions.epoch_of(start.ts)
        self._server_id: int | None = None  # (set by open)
        self._start_gtid: str | None = None  # a takeover streams from this GTID state, not a file position
        self._binlog_base = ""
        self._base_pos_ts = start.ts
        self._base_state: dict[int, tuple[int, int]] = {}
        self._base_token: str | None = resume
        # per commit since the base (until a stored checkpoint passes it): commit Ts, domain, server_id, seq_no in
        # parallel arrays (no object per transaction kept: a backlog of millions of commits costs 24 bytes each)
        self._mark_ts = array("Q")
        self._mark_dom = array("I")
        self._mark_srv = array("I")
        self._mark_seq = array("Q")
        self._mark_domains: set[int] = set()  # the domains among the marks
        self._marks_lock = threading.Lock()
        self._gtid: tuple[int, int, int] | None = None  # the open transaction's (domain, server_id, seq_no)
        # MySQL: the executed GTID set at the base position (None on MariaDB); a mark's domain is then the index of its
        # source uuid in _uuids, its seq_no the transaction number
        self._mysql_base: MysqlGtidSet | None = None
        self._uuids: list[str] = []
        self._uuid_ids: dict[bytes, int] = {}
        self._codec = rowcodec.best()  # rows decoded in C where it is built (upstream.mysql.rowcodec)
        self._event_codec = rowcodec.best_event()  # whole rows events, header included, in one C call
        self._frame = rowcodec.best_frame()  # the dump's packets framed into events in C where built
        self._pending_marks: list[tuple[int, tuple[int, int, int]]] = []  # GTID marks not yet announced (_announce)
        self._res_ts, self._res_time = start.ts, start.time  # the resolved watermark of the events read (_loop)
        self._caught_up_ts = 0  # caught_up_ts (set by _loop, read by the span's threads: one int assignment)

    # ---- SpanSource --------------------------------------------------------------------------------
    def open(self) -> None:
        """Find where to start: the start position's binlog file (``SlotLost`` when it was purged) on the server the
        resume token was read from; on another server, the token's GTID state (``SlotLost`` naming what the server
        lacks)."""
        self._ctl = self._connect()
        point = ResumePoint.decode(self.resume) if self.resume else None
        sid = admin.server_id(self._ctl, self.where)
        files = [f for f, _ in admin.binary_logs(self._ctl, self.where)]
        if files:
            self._binlog_base = files[-1].rpartition(".")[0]
        if point is not None and point.server_id != sid:
            self._take_over(point, sid)
        else:
            seq, pos = positions.split_ts(self.start.ts)
            if point is not None and positions.epoch_of(self.start.ts) == point.epoch and point.file:
                seq, pos = positions.file_sequence(point.file), point.pos  # (the last commit at or before the start)
            name = positions.file_name(files, seq)
            if name is None:
                raise SlotLost(f"span={self.label}: binlog file #{seq} of the checkpoint {lsn_to_str(self.start.ts)} is "
                               f"no longer on MySQL {self.where} (purged; files now: {files[:1]}..{files[-1:]}): "
                               f"changes after the checkpoint may be lost; recreate the changefeed")
            self._start_file, self._start_pos, self._start_gtid = name, max(pos, 4), None
            if "mariadb" not in str(self._ctl.get_server_info()).lower():  # MySQL: its executed GTID set there
                text = point.gtid if point is not None else admin.mysql_gtid_at(self._ctl, self.where, name,
                                                                                max(pos, 4))
                self._mysql_base = MysqlGtidSet.parse(text or "")
            else:
                gtid = point.gtid if point is not None else admin.gtid_at(self._ctl, self.where, name, max(pos, 4))
                self._base_state = dict(GtidState.parse(gtid or "").domains)
        self._server_id = sid
        self._carried = {t for t in catalog.list_tables(self._ctl, self.where, self.database) if self._mine(t)}
        if self._seeds:  # the history knows every table at the start: one it lacks was created after it, and its
            self._carried &= set(self._seeds)  # CREATE TABLE, replayed, is its create event (else its first row)
        for t in sorted(self._carried, key=str):
            if t in self._tables:
                continue
            seeded = self._seeds.get(t)
            if seeded is None:  # the schema as of now: rows before a DDL since fail the table map check
                self._load(t)
            else:  # the schema history's at the start: rows before a later DDL decode as they were written
                self._install(catalog.facts_as_of(seeded, catalog.table_facts(self._ctl, self.where, t)))
        for t, seeded in sorted(self._seeds.items(), key=lambda kv: str(kv[0])):
            if t not in self._tables:  # dropped since the start: its rows and its DROP TABLE are still to come
                self._carried.add(t)
                self._install(catalog.facts_as_of(seeded, None))
        self._closed.clear()

    def _take_over(self, point: ResumePoint, sid: int) -> None:
        """Continue on a server other than the token's (a promoted replica): from the token's GTID state, one Ts epoch
        higher, after checking the server holds that state and everything after it."""
        if point.epoch >= positions.MAX_EPOCH:
            raise SlotLost(f"span={self.label}: the changefeed moved to another upstream server {point.epoch} times, "
                           f"the most its Ts encoding counts (docs/upstream-mysql.md); recreate the changefeed")
        problems = admin.takeover_problems(self._ctl, self.where, point.gtid)
        if not problems:  # the server's own word: is that exact GTID in its binlog (same topology)?
            refusal = gtid_start_refusal(self.uri, self.server_id, point.gtid)
            problems = [refusal] if refusal else []
        if problems:
            raise SlotLost(f"span={self.label}: MySQL {self.where} (server_id {sid}) cannot continue the stream read "
                           f"from server_id {point.server_id} after GTID {point.gtid or '(none)'}: "
                           f"{'; '.join(problems)}; changes after the checkpoint would be lost")
        self._epoch = point.epoch + 1
        self._start_file, self._start_pos, self._start_gtid = None, 4, point.gtid
        if is_mysql_gtid(point.gtid):
            self._mysql_base = MysqlGtidSet.parse(point.gtid)
        else:
            self._base_state = dict(GtidState.parse(point.gtid).domains)
        log.info("span=%s continues on MySQL %s (server_id %d) after GTID %s, Ts epoch %d (was server_id %d)",
                 self.label, self.where, sid, point.gtid, self._epoch, point.server_id)

    def check_target_ahead(self, applied_ts: int) -> None:
        """After a takeover the Ts of the old server's transactions are not those the new server's stream carries:
        a target holding commits of the old server past the checkpoint (its capture ended before it stored the
        checkpoint, then the changefeed was moved) would get them again. Refused: ``SlotLost``."""
        if self._start_gtid is not None and positions.epoch_of(applied_ts) < self._epoch:
            raise SlotLost(
                f"span={self.label}: the target already holds transactions of the previous upstream server up to Ts "
                f"{lsn_to_str(applied_ts)}, past the checkpoint {lsn_to_str(self.start.ts)} whose GTID state "
                f"({self._start_gtid}) the new server continues from: they cannot be told apart on the new server and "
                f"would be applied twice. Recreate the changefeed (or resync the target); to avoid this, pause a "
                f"changefeed only while its spans run, so each stores its final checkpoint, before moving it")

    def resume_token(self, ts: int) -> str | None:
        """The :class:`~upstream.mysql.resume.ResumePoint` after every commit with Ts <= ``ts`` (module docstring): the
        binlog position of the last such commit (or the start) and the GTID state there. Before ``open``, or while
        nothing was committed since a takeover, the token it was given."""
        with self._marks_lock:
            sid = self._server_id
            if sid is None or ts < self._base_pos_ts:
                return self._base_token
            k = bisect_right(self._mark_ts, ts)  # the marks at or below ts: [0, k)
            if k == 0:
                if self._base_token is not None:
                    return self._base_token
                pos_ts = self._base_pos_ts
                text = str(self._mysql_base) if self._mysql_base is not None else str(GtidState(self._base_state))
            else:
                pos_ts = self._mark_ts[k - 1]
                text = str(self._mysql_upto(k)) if self._mysql_base is not None else str(GtidState(self._state_upto(k)))
        if positions.epoch_of(pos_ts) != self._epoch:
            return self._base_token  # (a takeover that has not committed anything yet)
        seq, pos = positions.split_ts(pos_ts)
        return ResumePoint(self._epoch, sid, f"{self._binlog_base}.{seq:06d}", pos, text).encode()

    def _mysql_upto(self, k: int) -> MysqlGtidSet:
        """MySQL: the executed GTID set after the first ``k`` marks (under the lock): the base and each mark's GTID
        (one step per commit since the last stored checkpoint)."""
        assert self._mysql_base is not None
        out = self._mysql_base.copy()
        uuids, dom, seq = self._uuids, self._mark_dom, self._mark_seq
        for i in range(k):
            out.add(uuids[dom[i]], seq[i])
        return out

    def _state_upto(self, k: int) -> dict[int, tuple[int, int]]:
        """The GTID state after the first ``k`` marks (under the lock): the base, then the last mark of each domain
        (found from the end: one step per mark only until every domain among the marks is seen, one usually)."""
        state = dict(self._base_state)
        todo = set(self._mark_domains)
        i = k - 1
        while todo and i >= 0:
            d = self._mark_dom[i]
            if d in todo:
                todo.discard(d)
                state[d] = (self._mark_srv[i], self._mark_seq[i])
            i -= 1
        return state

    def _fold(self, upto: int) -> None:
        """Forget the marks of commits at or below ``upto`` (a stored checkpoint): fold them into the base state."""
        with self._marks_lock:
            k = bisect_right(self._mark_ts, upto)
            if not k:
                return
            if self._mysql_base is not None:
                self._mysql_base = self._mysql_upto(k)
            else:
                self._base_state = self._state_upto(k)
            self._base_pos_ts = self._mark_ts[k - 1]
            self._base_token = None
            for arr in (self._mark_ts, self._mark_dom, self._mark_srv, self._mark_seq):
                del arr[:k]
            if not self._mark_ts:
                self._mark_domains.clear()
            elif len(self._mark_domains) > 1:  # (one domain, the usual case: nothing to recount)
                self._mark_domains = set(self._mark_dom)

    def close(self) -> None:
        self._closed.set()
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                pass
        ctl, self._ctl = self._ctl, None
        if ctl is not None:
            try:
                ctl.close()
            except Exception:  # noqa: BLE001
                pass

    def ack(self, ts: int) -> None:
        """Nothing to confirm upstream (the server keeps binlogs by its own retention, ``binlog_expire_logs_seconds``);
        the GTIDs of commits up to the stored checkpoint ``ts`` are no longer needed one by one."""
        self._fold(ts)

    def decoder(self) -> MySqlChangeDecoder:
        return self._decoder

    def caught_up_ts(self) -> int:
        """The resolved Ts at which the stream last had nothing more waiting after a backlog (``_loop``)."""
        return self._caught_up_ts

    def schema(self, version: int) -> TableSchema:
        return self._schemas[version]

    def seed_schemas(self, schemas: Iterable[TableSchema], carried: Collection[int] | None = None) -> None:
        """The schema history's view of the tables at the start watermark: :meth:`open` decodes each such table of
        the span's database with it instead of the catalog's schema of now, so a span restarted before an ALTER
        decodes the rows written before it with the columns they have."""
        for s in schemas:
            if self._mine(s.name):
                self._seeds[s.name] = s

    def _mine(self, name: TableName) -> bool:
        """Whether this span carries ``name``: in its database, selected by the filter, given to it by the rule."""
        return name.schema == self.database and self.filter.match(name) and self.share.carries(name)

    def schema_change_commits(self) -> set[int]:
        return self._ddl_commits

    def take_schema_versions(self) -> list[tuple[int, TableSchema]]:
        with self._versions_lock:
            out, self._versions = self._versions, []
        return out

    # ---- tables ------------------------------------------------------------------------------------
    def _load(self, name: TableName) -> _Table:
        """The span's decoding of ``name`` from the catalog now (DecodeError for a column it cannot replicate)."""
        facts = catalog.table_facts(self._ctl, self.where, name)
        refusals = [f"{c.name}: {c.refusal()}" for c in facts.columns if c.refusal()]
        if refusals:
            raise DecodeError(f"span={self.label} table {name}: {'; '.join(refusals)}")
        return self._install(facts)

    def _install(self, facts: catalog.TableFacts) -> _Table:
        """A new schema version of ``facts``' table, used from now on in the stream."""
        version = self._next_version
        self._next_version += 1
        schema = self._schemas[version] = facts.schema(version)
        old = self._tables.get(facts.name)
        if old is not None:
            old.live = False
        t = self._tables[facts.name] = _Table(facts, version, schema.relation_id)
        return t

    def _table(self, name: TableName, columns: list[Any], where: str) -> _Table | None:
        """The span's decoding of ``name`` (read when the span opened, or on first sight for a table created since);
        DecodeError when the binlog's columns (names, types, signedness) are not those it decodes with: the table's
        schema changed where the span cannot place it). None for a table created since that cannot be replicated
        (no key, a column type not replicated): its rows are skipped and counted in a data warning, as the owner's
        pick-up does for PostgreSQL."""
        t = self._tables.get(name)
        if t is None:
            if name in self._ineligible:
                self._warn_ineligible(name, self._ineligible[name])
                return None
            facts = catalog.table_facts(self._ctl, self.where, name)
            problems = eligibility.problems_of(facts)
            if problems:
                self._ineligible[name] = "; ".join(problems)
                self._warn_ineligible(name, self._ineligible[name])
                return None
            t = self._install(facts)
        if t.checked is not columns:
            names = tuple(c.name for c in columns)
            bad = names != t.names
            if not bad:
                renderers = list(t.renderers)
                for i, (dt, u, c, g) in enumerate(zip(t.data_types, t.unsigned, columns, t.guessed, strict=True)):
                    if g:  # the recorded description only: the binlog's column says which MySQL type it is
                        r = types.guessed_renderer(self._schemas[t.version].columns[i].base_type, c.type,
                                                   bool(getattr(c, "unsigned", False)),
                                                   getattr(c, "character_set_name", None) == "binary",
                                                   int(getattr(c, "max_length", 0) or 0))
                        if r is None:
                            bad = True
                            break
                        renderers[i] = r
                    elif not types.binlog_type_matches(dt, c.type, c) or (
                            c.type in _INTEGER_FIELDS and hasattr(c, "unsigned") and bool(c.unsigned) != u):
                        bad = True
                        break
                t.renderers = tuple(renderers)
            if bad:
                raise DecodeError(
                    f"span={self.label} table {name} at binlog {where}: the binlog row has columns "
                    f"{[(c.name, c.type) for c in columns]} but the table is decoded as {list(zip(t.names, t.data_types, strict=True))} "
                    f"(its schema changed where the span cannot place the change)")
            t.checked = columns
        return t

    def _warn_ineligible(self, name: TableName, reason: str) -> None:
        now = time.time()
        with self._versions_lock:
            self._add_warning(DataWarning(
                WARN_TABLE_INELIGIBLE, str(name),
                f"table {name} was created after the changefeed and matches its filter but is not replicated: "
                f"{reason}. Its rows are skipped; recreate the changefeed once the table is fixed, or exclude it with "
                f"the filter", WarningSeverity.DIVERGENCE, 1, (), first_time=now, last_time=now))

    def _add_warning(self, w: DataWarning) -> None:
        """Queue ``w`` for :meth:`take_warnings`, merged into a queued one of its (code, table) (under the lock)."""
        for i, q in enumerate(self._warnings):
            if q.ident == w.ident:
                self._warnings[i] = q.merge(w)
                return
        self._warnings.append(w)

    def take_warnings(self) -> list[DataWarning]:
        with self._versions_lock:
            out, self._warnings = self._warnings, []
        return out

    # ---- the loop ----------------------------------------------------------------------------------
    def _reader(self) -> BinLogStreamReader:
        """The replication connection: ``pymysqlreplication`` registers the replica, sends the dump request (file and
        position, or MariaDB's GTID state for a takeover) and the checksum and heartbeat settings; the span reads the
        events itself after the dump's first event (:meth:`run`)."""
        assert self._ctl is not None
        if self._start_gtid is not None:  # a takeover: MariaDB's GTID mode (slave_connect_state), MySQL's GTID dump
            where: dict[str, Any] = {"auto_position": self._start_gtid,
                                     "is_mariadb": not is_mysql_gtid(self._start_gtid)}
        else:  # is_mariadb=True would ignore file/pos (GTID mode)
            where = {"log_file": self._start_file, "log_pos": self._start_pos, "is_mariadb": False}
        return BinLogStreamReader(
            stream_settings(self.uri), server_id=self.server_id, resume_stream=True, blocking=True, **where,
            slave_heartbeat=HEARTBEAT_SECONDS, only_schemas=None, only_events=[RotateEvent],
            pymysql_wrapper=Connection)

    def run(self, buffer: ChangeBuffer, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        if self._ctl is None or (self._start_file is None and self._start_gtid is None):
            raise UpstreamUnavailable(f"span={self.label}: run before open")
        stream = self._stream = self._reader()
        try:
            # the dump's first event is a ROTATE naming the file it streams from; reading it connects the stream
            if stream.fetchone() is None or stream.log_file is None:
                raise UpstreamUnavailable(f"span={self.label}: the binlog stream from MySQL {self.where} ended")
            conn = stream._stream_connection  # noqa: SLF001 - its packets are read here, never by the library
            if not hasattr(stream, _CHECKSUM_ATTR):  # (a pymysqlreplication that no longer has it: never guess)
                raise DecodeError(f"span={self.label}: this pymysqlreplication does not say whether the binlog "
                                  f"stream carries checksums ({_CHECKSUM_ATTR}); pin mysql-replication 1.0.x")
            checksum = bool(getattr(stream, _CHECKSUM_ATTR))  # what the library asked the server for
            dbms = "mariadb" if "mariadb" in str(getattr(conn, "server_version", "")).lower() else "mysql"
            self._pending_marks.clear()
            reader = wire.EventReader(conn, checksum, self._frame)
            self._loop(reader.events, stream.log_file, dbms, buffer, stop, on_resolved, reader.pending, reader.backlog)
        except TidewaterError:
            raise
        except (pymysql.MySQLError, OSError, EOFError, AttributeError, binlog.FramingError) as exc:
            if self._closed.is_set() or stop.is_set():
                return
            raise UpstreamUnavailable(f"span={self.label}: binlog stream from MySQL {self.where} broke: {exc}") from exc
        except (NotImplementedError, UnicodeDecodeError, ValueError, KeyError, IndexError, struct.error) as exc:
            if self._closed.is_set():  # close() under pymysqlreplication's own first read: "read of closed file"
                return  # (the span restarts from its checkpoint and decodes the same events again)
            raise DecodeError(f"span={self.label}: binlog event from MySQL {self.where} cannot be decoded: "
                              f"{type(exc).__name__}: {exc}") from exc
        finally:
            try:
                stream.close()
            except Exception:  # noqa: BLE001
                pass

    def _loop(self, next_events: Callable[[], list[wire.Event]], log_file: str, dbms: str, buffer: ChangeBuffer,
              stop: threading.Event, on_resolved: Callable[[Watermark], None],
              pending: Callable[[], bool] = lambda: False, backlog: Callable[[], bool] = lambda: False,
              clock: Callable[[], float] = time.monotonic) -> None:
        """The event loop over the stream's events (:mod:`upstream.mysql.wire` frames them, CRC32 verified, as many
        per call as the socket delivered): table maps through the :class:`~upstream.mysql.tablemap.TableMapCache`,
        rows decoded by each table's :class:`~upstream.mysql.rowdecode.RowDecoder` straight into payloads. The stop
        check, the commits' GTID marks and the resolved watermark are per batch of events, not per event or commit
        (:meth:`_announce`). Any packet the library would have reconnected on is an error here (the caller restarts
        the span from its checkpoint). ``backlog()``: whether a read since the last call found a backlog waiting
        (``wire.EventReader.backlog``); ``pending()``: whether more of the stream has arrived (``wire.EventReader.
        pending``); both asked when a batch moved the resolved watermark: the first such batch with nothing more
        pending after a backlog (or the run's start) ends the backlog, a caught-up point (:meth:`caught_up_ts`) when
        it lasted :data:`BACKLOG_SECONDS` or more (``clock``). A steady stream, whose reads are small, is never behind,
        however often the next transaction is already there."""
        db, filt, carries = self.database, self.filter, self.share.carries
        skip_upto = self.start.ts
        resolved = self.start
        self._res_ts, self._res_time = resolved.ts, resolved.time  # of the events so far (announced per batch)
        xid = 0
        in_txn = False
        has_rows = False
        ddl_txn = False  # the open transaction stored a schema change
        add_many = buffer.add_many
        epoch = self._epoch
        file_ts = positions.to_ts(log_file, 0, epoch)  # the Ts of position 0 of log_file (a position is 32 bits)
        maps = TableMapCache(dbms)
        updates, writes = binlog.UPDATES, binlog.WRITES
        rows_types, table_map_type, xid_type, gtid_mariadb = ROWS_EVENTS, binlog.TABLE_MAP, binlog.XID, binlog.GTID_MARIADB
        timestamp, mariadb_gtid = binlog.timestamp, binlog.mariadb_gtid
        stopped, closed = stop.is_set, self._closed.is_set
        commit, marks = self._commit, self._pending_marks
        behind_since: float | None = clock()  # when the backlog being read was found (a run starts with one)
        while True:
            events = next_events()
            read_at = clock()
            if stopped() or closed():
                return
            for etype, data, end, log_pos in events:
                if etype == table_map_type:
                    maps.put(data, end)
                    continue
                if etype in rows_types:
                    tmap = maps.get(int.from_bytes(data[20:26], "little"))
                    if tmap is not None:  # the common case in one C call: a whole image of a table decoded before
                        state = tmap.state
                        fast = state.get("fast")
                        if fast is not None and state["table"].live:
                            out = fast(data, end, etype)
                            if out is not None:
                                add_many(xid, xid, out)
                                has_rows = True
                                continue
                    table_id, ncols, present, present_after, off = rowdecode.rows_header(data, etype)
                    tmap = maps.get(table_id)
                    if tmap is None:
                        raise DecodeError(f"span={self.label}: a row event at binlog {log_file}:{log_pos} names table "
                                          f"id {table_id}, whose TABLE_MAP the stream did not carry")
                    state = tmap.state
                    dec = state.get("decoder")
                    if dec is None:
                        if state.get("skip"):
                            continue
                        name = TableName(tmap.schema, tmap.table)
                        if name.schema != db or not filt.match(name) or not carries(name):
                            # another database's, a filtered table or another span's: its rows are not read (decided
                            # once per table map body)
                            state["skip"] = True
                            continue
                        where = f"{log_file}:{log_pos}"
                        tbl = self._table(name, tmap.columns, where)
                        if tbl is None:
                            continue
                        dec = self._row_decoder(tmap, tbl, where)
                    else:
                        tbl = state["table"]
                        if not tbl.live:  # a schema change since: decode with the new version
                            state.clear()
                            where = f"{log_file}:{log_pos}"
                            tbl = self._table(tbl.name, tmap.columns, where)
                            if tbl is None:
                                continue
                            dec = self._row_decoder(tmap, tbl, where)
                    if etype == binlog.PARTIAL_UPDATE_ROWS:
                        raise DecodeError(f"span={self.label} table {tbl.name} at binlog {log_file}:{log_pos}: a "
                                          f"partial JSON update (binlog_row_value_options=PARTIAL_JSON) is not "
                                          f"replicated; set binlog_row_value_options='' upstream, then resync the table")
                    if ncols != dec.count:
                        raise DecodeError(f"span={self.label} table {tbl.name} at binlog {log_file}:{log_pos}: the "
                                          f"row event has {ncols} columns, its table map {dec.count}")
                    if present != dec.full or (present_after is not None and present_after != dec.full):
                        if present == dec.padded:  # MySQL 8 sets the bitmap's unused bits: every column is there
                            present = dec.full
                        if present_after == dec.padded:
                            present_after = dec.full
                    if present != dec.full or (present_after is not None and present_after != dec.full):
                        # binlog_row_image not FULL in the writing session (rare): never taken as full rows
                        self._add_partial(tbl, dec, etype, data, off, end, present, present_after,
                                          f"{log_file}:{log_pos}", buffer, xid, state["prefix"])
                        has_rows = True
                        continue
                    try:
                        add_many(xid, xid, dec.payloads(data, off, end, b"U" if etype in updates else b"I"
                                                        if etype in writes else b"D", state["prefix"], tbl.relid))
                    except rowdecode.ValueRefused as exc:
                        raise DecodeError(
                            f"span={self.label} table {tbl.name} column {tbl.names[exc.index]} at binlog "
                            f"{log_file}:{log_pos}: a value that cannot be replicated exactly ({exc.reason}: e.g. a "
                            f"zero date); fix the row upstream or exclude the table") from exc
                    has_rows = True
                    continue
                if etype == xid_type:
                    commit(buffer, xid, has_rows, ddl_txn, file_ts | log_pos, float(timestamp(data)), skip_upto)
                    in_txn = has_rows = ddl_txn = False
                elif etype == gtid_mariadb or etype == binlog.GTID_MYSQL or etype == binlog.ANONYMOUS_GTID_MYSQL:
                    if etype == gtid_mariadb:
                        self._gtid = mariadb_gtid(data)
                    elif etype == binlog.GTID_MYSQL:
                        raw_uuid, gno = binlog.mysql_gtid(data)
                        uid = self._uuid_ids.get(raw_uuid)
                        if uid is None:
                            uid = self._uuid_ids[raw_uuid] = len(self._uuids)
                            self._uuids.append(uuid_text(raw_uuid))
                        self._gtid = (uid, 0, gno)
                    if in_txn and has_rows:
                        # a transaction whose end the span did not see (an XA transaction prepared, then committed by a
                        # later event group): its rows are neither committed nor dropped silently
                        raise DecodeError(
                            f"span={self.label}: the transaction before binlog {log_file}:{log_pos} has "
                            f"rows but no commit the span understands (an XA transaction?): XA transactions are not "
                            f"replicated from MySQL/MariaDB yet")
                    xid += 1
                    in_txn, has_rows = True, False
                elif etype == binlog.QUERY:
                    schema, query = binlog.query(data, end)
                    if query.strip().upper() == "BEGIN":
                        in_txn = True
                        continue
                    if not _NOT_DDL.match(query) and self._on_ddl(query, schema, log_file, log_pos, buffer, xid):
                        has_rows = ddl_txn = True
                    word = query.strip().upper()
                    if word in ("COMMIT", "ROLLBACK") or not _NOT_DDL.match(query):
                        # a COMMIT (non-transactional tables) or a DDL (committed by itself) ends the transaction; so
                        # does a ROLLBACK, whose logged rows are those of non-transactional tables: they stay changed
                        # upstream, so they are committed downstream too
                        commit(buffer, xid, has_rows, ddl_txn, file_ts | log_pos, float(timestamp(data)),
                               skip_upto)
                        in_txn = has_rows = ddl_txn = False
                elif etype == binlog.ROTATE:
                    log_file, _pos = binlog.rotate(data, end)
                    file_ts = positions.to_ts(log_file, 0, epoch)
                    maps.clear()  # table ids are reused after a restart of the server, which starts a new file
                elif etype == binlog.HEARTBEAT:
                    if not in_txn:
                        # the server sends one only when it has nothing more to send: every commit up to its position
                        # is here, and the upstream was at that position now
                        ts = file_ts | log_pos if log_pos else 0
                        if ts > self._res_ts:
                            self._res_ts = ts
                        now = time.time()
                        if now > self._res_time:
                            self._res_time = now
                elif etype not in _PASSED:
                    self._refuse_event(etype, log_file, log_pos)
            if self._res_ts != resolved.ts or self._res_time != resolved.time:
                resolved = Watermark(self._res_ts, self._res_time)
                if backlog() and behind_since is None:
                    behind_since = read_at
                if behind_since is not None and not pending():  # the end of a backlog: known before on_resolved
                    if clock() - behind_since >= BACKLOG_SECONDS:  # (the span sees it with the rows it covers)
                        self._caught_up_ts = resolved.ts
                    behind_since = None
                self._announce(marks, resolved, on_resolved)

    def _announce(self, marks: list[tuple[int, tuple[int, int, int]]], resolved: Watermark,
                  on_resolved: Callable[[Watermark], None]) -> None:
        """Hand the GTID marks of the commits since the last call to :meth:`resume_token` (before ``on_resolved``: a
        checkpoint at the resolved Ts finds its GTID), then the resolved watermark to the processor."""
        if marks:
            with self._marks_lock:
                for ts, (d, srv, seq) in marks:
                    self._mark_ts.append(ts)
                    self._mark_dom.append(d)
                    self._mark_srv.append(srv)
                    self._mark_seq.append(seq)
                    if d not in self._mark_domains:
                        self._mark_domains.add(d)
            marks.clear()
        on_resolved(resolved)

    def _refuse_event(self, etype: int, log_file: str, log_pos: int) -> None:
        """An event type the span does not pass over (:data:`_PASSED`): a compressed one by name, any other (one that
        could carry rows or a schema change the span would miss) as unknown; always a DecodeError."""
        where = f"{log_file}:{log_pos}"
        if etype == binlog.TRANSACTION_PAYLOAD:
            raise DecodeError(f"span={self.label}: a compressed transaction (TRANSACTION_PAYLOAD event) at binlog "
                              f"{where}: MySQL's binlog_transaction_compression is not replicated yet; SET GLOBAL "
                              f"binlog_transaction_compression = OFF (and in every session that sets it), then resync "
                              f"the tables it wrote")
        if etype == binlog.QUERY_COMPRESSED or etype in binlog.ROWS_COMPRESSED:
            raise DecodeError(f"span={self.label}: a compressed binlog event (type {etype}) at binlog {where}: "
                              f"MariaDB's log_bin_compress is not replicated yet; turn it off")
        if etype == binlog.INCIDENT:
            raise DecodeError(f"span={self.label}: the server logged an incident at binlog {where} (changes may be "
                              f"missing from the binlog after it, e.g. a lost event group): the target cannot be "
                              f"known to equal the upstream; resync the tables (recreate the changefeed)")
        raise DecodeError(f"span={self.label}: a binlog event of type {etype} at binlog {where}, which the span does "
                          f"not replicate: it may carry row changes or a schema change the target would miss "
                          f"(statement-based LOAD DATA, a newer server's event type), so the span stops")

    def _row_decoder(self, tmap: TableMap, tbl: _Table, where: str) -> rowdecode.RowDecoder:
        """The row decoder of ``tbl`` for table map ``tmap``, kept in the table map's memo with the table and payload
        prefix (built once per table map body and schema version)."""
        try:
            dec = rowdecode.RowDecoder(tmap.columns, tbl.renderers, self._codec)
        except rowdecode.ValueRefused as exc:
            raise DecodeError(f"span={self.label} table {tbl.name} column {tbl.names[exc.index]} at binlog {where}: "
                              f"{exc.reason}") from exc
        prefix = encode_payload(tbl.version, b"")
        tmap.state.update(decoder=dec, table=tbl, prefix=prefix,
                          fast=dec.event_decoder(self._event_codec, prefix, tbl.relid))
        return dec

    def _add_partial(self, tbl: _Table, dec: rowdecode.RowDecoder, etype: int, data: bytes, off: int, end: int,
                     present: bytes, present_after: bytes | None, where: str, buffer: ChangeBuffer, xid: int,
                     prefix: bytes) -> None:
        """The rows of a row event whose image is partial (:mod:`upstream.mysql.row_image`), never stored as full: an
        absent column is ``UNCHANGED`` (an UPDATE's absent after value taken from its before image where that has it),
        an old row with an absent value holds the key only, a key-changing UPDATE with an absent value is a DELETE and
        a partial INSERT; a data warning (notice) names the table and keys. A
        before image (or an INSERT's row) without every key column cannot name its row: DecodeError naming the
        table, the key and why."""
        kind = b"U" if etype in binlog.UPDATES else b"I" if etype in binlog.WRITES else b"D"
        partial = row_image.partial_image(dec.count, present, present_after, has_before=kind != b"I")
        if partial is None:  # (the bitmaps' unused bits differed only)
            partial = row_image.PartialImage((), ())
        try:
            if kind == b"U":
                assert present_after is not None
                rows: list[tuple[list[Any] | None, list[Any] | None]] = [
                    (old, row_image.complete_after(old, new))
                    for old, new in dec.pairs(data, off, end, present, present_after)]
            elif kind == b"I":
                rows = [(None, new) for new in dec.images(data, off, end, present)]
            else:
                rows = [(old, None) for old in dec.images(data, off, end, present)]
        except rowdecode.ValueRefused as exc:
            raise DecodeError(
                f"span={self.label} table {tbl.name} column {tbl.names[exc.index]} at binlog {where}: a value that "
                f"cannot be replicated exactly ({exc.reason}: e.g. a zero date); fix the row upstream or exclude the "
                f"table") from exc
        key_idx = [tbl.names.index(k) for k in self._schemas[tbl.version].key]
        keys: list[str] = []
        for old, new in rows:
            ident = old if old is not None else new
            assert ident is not None
            lacking = row_image.missing_key(ident, key_idx)
            if lacking:
                raise DecodeError(
                    f"span={self.label} table {tbl.name} at binlog {where}: a row event with a partial row image (the "
                    f"writing session's binlog_row_image is not FULL) lacks key column(s) "
                    f"{', '.join(tbl.names[i] for i in lacking)} of the key ({', '.join(tbl.names[i] for i in key_idx)}) "
                    f"the changefeed replicates by, so its row cannot be named; set binlog_row_image=FULL in every "
                    f"writing session, then resync the table")
            if len(keys) < DataWarning.MAX_KEYS:
                kv = [ident[i] for i in key_idx]
                keys.append(str(kv[0]) if len(kv) == 1 else str(tuple(kv)))
            if (kind == b"U" and new is not None and old is not None and UNCHANGED in new
                    and any(new[i] != old[i] for i in key_idx)):
                # a key change without every value: a DELETE of the old key and a partial INSERT of the new one, so
                # that no sink takes the values not carried from the row at the old key downstream (over a later
                # snapshot's copy that may be another row, docs/snapshot.md condition 2); the new row's are re-read
                buffer.add(xid, xid, prefix + payload.encode_partial(b"D", tbl.relid, None, old))
                buffer.add(xid, xid, prefix + payload.encode_partial(b"I", tbl.relid, new, None))
                continue
            buffer.add(xid, xid, prefix + payload.encode_partial(kind, tbl.relid, new, old))
        absent = sorted({tbl.names[i] for i in partial.before + partial.after})
        now = time.time()
        with self._versions_lock:
            self._add_warning(DataWarning(
                row_image.WARN_PARTIAL_ROW_IMAGE, str(tbl.name),
                f"row changes of table {tbl.name} came with a partial row image (the writing session's "
                f"binlog_row_image is not FULL; last at binlog {where}, columns not carried: {', '.join(absent)}): "
                f"SQL targets keep the columns the event did not carry and re-read a row missing downstream from the "
                f"upstream by key; Kafka and storage messages carry the unavailable-value placeholder for them. Set "
                f"binlog_row_image=FULL in the writing sessions", WarningSeverity.NOTICE, len(rows), tuple(keys),
                first_time=now, last_time=now))

    def _on_ddl(self, query: str, schema: Any, log_file: str, pos: int, buffer: ChangeBuffer, xid: int) -> bool:
        """A statement that is not transaction control. One naming a table the span carries is either a schema
        change :mod:`upstream.mysql.ddl` understands (stored in transaction ``xid`` as a SCHEMA_CHANGE payload, the
        table's new decoding used from here on; returns True) or refused with a DecodeError naming it."""
        default = schema.decode() if isinstance(schema, bytes) else str(schema or "")
        created = ddl.created_table(query, default)
        if created is not None:
            name = TableName(created.schema, created.table)
            if name not in self._tables and name not in self._carried:
                return self._create_table(name, created, query, buffer, xid, f"{log_file}:{pos}")
            if not created.replace:
                return False  # IF NOT EXISTS of a table that exists: nothing changed
        elif _CREATE_TABLE.match(query):
            return False  # CREATE TEMPORARY TABLE
        hit = sorted((n for n in named_tables(query, default) if n in self._tables or n in self._carried), key=str)
        where = f"{log_file}:{pos}"
        renames = [(TableName(*old), TableName(*new)) for old, new in ddl.renamed_tables(query, default)]
        if renames:
            return self._rename(renames, hit, query, where, buffer, xid)
        if not hit:
            return False
        try:
            dropped = ddl.dropped_tables(query, default)
            if dropped is not None:
                return self._drop_tables([TableName(s, t) for s, t in dropped], query, buffer, xid)
            truncated = ddl.truncated_table(query, default)
            if truncated is not None:
                return self._same_shape(TableName(*truncated), ddl.Change("truncate table"), query, buffer, xid)
            indexed = ddl.index_target(query, default)
            if indexed is not None:
                t = self._tables.get(TableName(*indexed))
                if t is None:
                    return False
                found = ddl.index_statement(query, default, bool(t.facts.primary), [c.name for c in t.facts.columns])
                assert found is not None
                return self._same_shape(t.name, found[1], query, buffer, xid)
            m = ddl.ALTER.match(query)
            if m is not None:
                name = TableName(*ddl.split_name(m.group("name"), default))
                t = self._tables.get(name)
                if t is None:
                    return False  # another table's ALTER that merely mentions one of ours
                return self._alter(t, query, buffer, xid)
            raise ddl.Unsupported("only ALTER TABLE (ADD/DROP/MODIFY/CHANGE/RENAME COLUMN, ADD/DROP INDEX), "
                                  "CREATE/DROP INDEX, TRUNCATE and DROP TABLE are replicated yet")
        except ddl.Unsupported as exc:
            return self._refuse(hit, query, f"cannot be replicated: {exc} (at binlog {where})", buffer, xid)

    def _create_table(self, name: TableName, created: ddl.Created, query: str, buffer: ChangeBuffer, xid: int,
                      where: str) -> bool:
        """``CREATE TABLE`` of a table the span does not carry yet: when the filter selects it, a ``create table``
        schema change with the table's columns as the catalog shows them (stored in transaction ``xid``; the
        table is carried from here on, its rows checked against those columns by the table-map check), so an empty
        table appears downstream too. A table that cannot be replicated (no primary or unique NOT NULL key, a
        column type not replicated) gets the ``CDC:WarnTableIneligible`` data warning now, and its rows are skipped
        (:meth:`_table`). A table gone from the catalog since (dropped or renamed later in the binlog) is left to its
        first row, as before: the span fails loudly there if it has rows."""
        if not self._mine(name):
            return False  # (another span's, when the filter selects it: the rule gives it one span only)
        try:
            facts = catalog.table_facts(self._ctl, self.where, name)
        except InvalidArgument:
            log.info("span=%s table %s created at binlog %s is no longer in the catalog; no create event",
                     self.label, name, where)
            return False
        problems = eligibility.problems_of(facts)
        if problems:
            self._ineligible[name] = "; ".join(problems)
            self._warn_ineligible(name, self._ineligible[name])
            return False
        self._ineligible.pop(name, None)
        t = self._install(facts)
        self._carried.add(name)
        self._unrecorded.append(self._schemas[t.version])
        self._store_ddl(buffer, xid, {"table": [name.schema, name.table], "before": 0, "after": t.version,
                                      "changes": [["create table", None]], "query": query, "fills": []})
        log.info("span=%s table %s created at binlog %s (%s): replicated from here on", self.label, name, where,
                 created.how)
        return True

    def _rename(self, renames: list[tuple[TableName, TableName]], hit: list[TableName], query: str, where: str,
                buffer: ChangeBuffer, xid: int) -> bool:
        """``RENAME TABLE`` (or ``ALTER TABLE ... RENAME``) is not replicated yet: refused at its position by the span
        that carries an old name (:meth:`_refuse`) *and* by the span that carries a new name it did not carry
        before (another span's table, or one the changefeed did not replicate, moves onto it: its rows are in no
        stream of this span), so that no span writes a row after it before the operator has renamed the table
        downstream and skipped the statement; the new name's rows are then this span's (read from the catalog at
        its first row), the old name's are no longer carried. Returns True when a refusal was stored."""
        reason = (f"cannot be replicated: RENAME TABLE is not replicated yet; rename the table downstream by hand "
                  f"(at binlog {where})")
        stored = self._refuse(hit, query, reason, buffer, xid) if hit else False
        for old, new in renames:
            if old in hit or not self._mine(new) or new in self._tables:
                continue
            self._store_ddl(buffer, xid, {"table": [new.schema, new.table], "query": query, "refused":
                                          f"{reason}; table {old} is renamed onto {new}, which span {self.label} "
                                          f"carries: the rows it holds are not in this span's stream"})
            self._carried.discard(new)
            self._ineligible.pop(new, None)
            log.warning("span=%s rename %r onto %s refused: %s", self.label, query[:200], new, reason)
            stored = True
        return stored

    def _refuse(self, hit: list[TableName], query: str, reason: str, buffer: ChangeBuffer, xid: int) -> bool:
        """A statement naming ``hit`` tables that cannot be translated: stored as a refused schema change (the
        decoder raises ``DdlRejected`` for it at its commit Ts, which fails the changefeed or is skipped like a DDL
        the sink rejects, docs/ddl.md), and each table's decoding re-read from the catalog, so the rows after it
        decode with the columns the table has now; the table-map check refuses them loudly where those are not
        the columns the binlog row has (a later change of the table). A table gone from the catalog (RENAME TABLE)
        is no longer carried; one that cannot be replicated any more has its rows skipped with a data warning."""
        stored = False
        for n in hit:
            if n not in self._tables:
                continue
            stored = True
            self._store_ddl(buffer, xid, {"table": [n.schema, n.table], "refused": reason, "query": query})
            self._tables.pop(n).live = False
            try:
                facts = catalog.table_facts(self._ctl, self.where, n)
            except InvalidArgument:
                self._carried.discard(n)
                continue
            problems = eligibility.problems_of(facts)
            if problems:
                self._ineligible[n] = "; ".join(problems)
                continue
            self._unrecorded.append(self._schemas[self._install(facts).version])
        log.warning("span=%s schema change %r refused: %s", self.label, query[:200], reason)
        return stored

    def _store_ddl(self, buffer: ChangeBuffer, xid: int, doc: dict[str, Any], seq: int | None = None) -> None:
        """Store a schema change in transaction ``xid`` at the next position (``DdlEvent.seq``), or at ``seq``: its
        place in the statement when the statement names tables of several spans (each span stores its own), so that
        the same change has the same position in every span."""
        if seq is None:
            seq = getattr(self, "_ddl_seq", -1) + 1
        self._ddl_seq = seq
        doc["seq"] = seq
        buffer.add(xid, xid, encode_payload(SCHEMA_CHANGE, json.dumps(doc).encode()))

    def _alter(self, t: _Table, query: str, buffer: ChangeBuffer, xid: int) -> bool:
        before = self._schemas[t.version]
        cols, changes, added = ddl.parse_alter(query, t.facts.columns, before.key if before.has_key else (),
                                               has_primary=bool(t.facts.primary))
        renamed = {c.column: c.new_name for c in changes if c.kind == "rename column"}
        facts = catalog.TableFacts(t.name, cols, tuple(renamed.get(k, k) for k in t.facts.primary),
                                   tuple((n, tuple(renamed.get(k, k) for k in ks)) for n, ks in t.facts.unique_not_null))
        fills = []
        for a in added:
            col = next(c for c in cols if c.name == a.column)
            fills.append([a.column, types.default_text(col.data_type, col.char_len, col.scale, a.fill)])
        new = self._install(facts)
        self._unrecorded.append(self._schemas[new.version])
        self._store_ddl(buffer, xid, {"table": [t.name.schema, t.name.table], "before": t.version,
                                      "after": new.version, "changes": [_change_doc(c) for c in changes],
                                      "query": query, "fills": fills})
        return True

    def _same_shape(self, name: TableName, change: ddl.Change, query: str, buffer: ChangeBuffer, xid: int) -> bool:
        """A schema change that leaves the table's columns as they are (TRUNCATE, an index): stored with the
        current version before and after."""
        t = self._tables.get(name)
        if t is None:
            return False
        self._store_ddl(buffer, xid, {"table": [name.schema, name.table], "before": t.version, "after": t.version,
                                      "changes": [_change_doc(change)], "query": query, "fills": []})
        return True

    def _drop_tables(self, names: list[TableName], query: str, buffer: ChangeBuffer, xid: int) -> bool:
        stored = False
        for i, n in enumerate(names):
            t = self._tables.pop(n, None)
            self._carried.discard(n)
            if t is None:
                continue
            t.live = False
            self._store_ddl(buffer, xid, {"table": [n.schema, n.table], "before": t.version, "after": 0,
                                          "changes": [["drop table", None]], "query": query, "fills": []}, seq=i)
            stored = True
        return stored

    def _commit(self, buffer: ChangeBuffer, xid: int, has_rows: bool, ddl_txn: bool, ts: int, commit_time: float,
                skip_upto: int) -> None:
        """Commit transaction ``xid`` at ``ts`` (abort it when a restart's replay finds it already downstream: then it
        does not advance the resolved watermark, else ``_res_ts``/``_res_time`` take it); its GTID mark waits in
        ``_pending_marks`` for :meth:`_announce`."""
        self._ddl_seq = -1
        gtid, self._gtid = self._gtid, None
        if gtid is not None and ts > self._base_pos_ts:
            self._pending_marks.append((ts, gtid))
        if self._unrecorded:  # valid from this commit on
            with self._versions_lock:
                self._versions.extend((ts, s) for s in self._unrecorded)
            self._unrecorded = []
        if ddl_txn and ts > skip_upto:
            self._ddl_commits.add(ts)  # before the buffer commit: the span must not read it uncut
        if has_rows:
            if ts <= skip_upto:
                buffer.abort(xid, xid)  # already downstream before the restart
                return
            buffer.commit(xid, ts, commit_time)
        if ts > self._res_ts:
            self._res_ts = ts
            if commit_time > self._res_time:
                self._res_time = commit_time
