"""MySQL and MariaDB behind the upstream interface (:class:`upstream.base.Upstream`): ``mysql://user:pass@host:port/db``.

A span reads the server's row binlog over a replication connection of its own (:mod:`upstream.mysql.source`, its
``server_id`` derived from the span's slot name). There are no server-side objects: the span's *slot* is the binlog
position its checkpoint Ts encodes (:mod:`upstream.mysql.positions`), its *publication* a label (the table set is
the database's tables the changefeed's filter selects). Retention is the server's (``binlog_expire_logs_seconds``):
a span whose checkpoint's binlog file was purged fails with ``SlotLost``. Each checkpoint also stores the span's
resume token (:mod:`upstream.mysql.resume`: GTID state and file/position), with which a promoted replica continues
the changefeed (:meth:`MySqlUpstream.check_takeover`, ``changefeed update --upstream``).

The initial copy reads through :mod:`upstream.mysql.snapshot_read` (each reader its own consistent snapshot at a
known binlog position; :meth:`MySqlUpstream.export_snapshot` is only the position the run starts from).

Several spans (``span-count`` > 1): each span has its own binlog connection and ``server_id`` and carries the tables
:mod:`upstream.mysql.span_set` gives it (a deterministic rule from the table's name, the span count stored in the
span's publication label); every span reads the whole binlog and drops the other spans' tables at their TABLE_MAP.
The control plane (:meth:`MySqlUpstream.span_tables`, :meth:`~MySqlUpstream.carrying_spans`,
:meth:`~MySqlUpstream.align_spans`) answers by the same rule, so every table the filter selects is carried by
exactly one span.

What this stage does not do yet (refused loudly, docs/upstream-mysql.md): DDL other than the kinds
:mod:`upstream.mysql.ddl` lists (a refused, skippable schema change), partitioned-table inspection. Errors: PyMySQL's become ``TidewaterError`` subclasses in :mod:`upstream.mysql.conn`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from cdc.errors import InvalidArgument, UpstreamNotReady
from cdc.events import TableName, TableSchema
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.ts import Watermark
from cdc.uri import parse_upstream_uri
from upstream.base import ExportedSnapshot, JoinRule, PartitionLeaf, SlotState, SpanPlan, Upstream
from upstream.mysql import admin, catalog, eligibility, positions, snapshot_read
from upstream.mysql import conn as my_conn
from upstream.mysql.resume import ResumePoint
from upstream.mysql.rowfetch import RowFetcher
from upstream.mysql.snapshot_read import MySqlSnapshotReader
from upstream.mysql.source import MySqlSpanSource, gtid_start_refusal
from upstream.mysql.span_set import SpanShare, publication_label


def span_server_id(slot: str) -> int:
    """The replication ``server_id`` of the span whose slot is ``slot`` (stable; in 0x40000000..0x7FFFFFFF, away from
    the small ids servers are usually given)."""
    return 0x4000_0000 | (zlib.crc32(slot.encode()) & 0x3FFF_FFFF)


class MySqlUpstream(Upstream):
    """``open_upstream("mysql://...")``. ``timeout``: seconds to connect; ``statement_timeout`` is accepted for the
    interface (inspections) and bounds nothing yet."""

    # binlog_row_image = FULL is checked at create; a session's partial image (upstream.mysql.row_image) never reaches
    # a sink as a key change: it is a DELETE and an INSERT whose values not carried are re-read, never taken from
    # the row at the old key
    sends_whole_rows = True

    def __init__(self, uri: str, *, timeout: float = 5.0, statement_timeout: float | None = None,
                 connect: Callable[..., Any] = my_conn.connect) -> None:
        super().__init__(uri)
        self._timeout = timeout
        self._connect = connect
        self._conn: Any = None
        parsed = parse_upstream_uri(uri)
        self.database = parsed.path
        self.where = my_conn.describe_uri(parsed)

    def _session(self) -> Any:
        if self._conn is None:
            self._conn = self._connect(self.uri, timeout=self._timeout)
        return self._conn

    def close(self) -> None:
        c, self._conn = self._conn, None
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def server_identity(self) -> tuple[str, int, str]:
        u = parse_upstream_uri(self.uri)
        return (u.host or "").lower(), u.port or my_conn.DEFAULT_PORT, u.path

    # ---- readiness ---------------------------------------------------------------------------------
    def check_ready(self, *, slots_needed: int = 1) -> dict[str, Any]:
        return admin.check_upstream(self._session(), self.where, self.database)

    def probe(self, timeout: float = 2.0) -> None:
        my_conn.probe(self.uri, timeout)

    def retention_notice(self, keep_seconds: float) -> str | None:
        """The server's binlog retention (``binlog_expire_logs_seconds``, else ``expire_logs_days``; 0: forever) when it
        is shorter than ``keep_seconds``: a changefeed stopped longer loses its position (``SlotLost``)."""
        kept = admin.binlog_retention_seconds(self._session(), self.where)
        if kept is None or kept >= keep_seconds:
            return None
        return (f"MySQL {self.where} keeps binlog files for {kept:.0f}s (binlog_expire_logs_seconds / expire_logs_days), "
                f"less than gc-ttl ({keep_seconds:.0f}s): a changefeed stopped or lagging longer than {kept:.0f}s "
                f"loses the binlog after its checkpoint and must be recreated. Fix: SET GLOBAL "
                f"binlog_expire_logs_seconds = {int(keep_seconds)} (or 0: keep forever), and in the server's "
                f"configuration")


    # ---- tables ------------------------------------------------------------------------------------
    def list_tables(self) -> list[TableName]:
        return catalog.list_tables(self._session(), self.where, self.database)

    def table_schema(self, table: TableName | int) -> TableSchema:
        if isinstance(table, int):
            for t in self.list_tables():
                if catalog.relation_id(t) == table:
                    return self.table_schema(t)
            raise InvalidArgument(f"no table with relation id {table} in MySQL {self.where}")
        return catalog.table_facts(self._session(), self.where, table).schema()

    def check_tables(self, tables: Sequence[TableName], *, publication: str | None = None) -> list[TableSchema]:
        return eligibility.check_tables(self._session(), self.where, list(tables))[0]

    def check_partition(self, leaf: TableName) -> None:
        raise InvalidArgument(f"MySQL {self.where}: partitions are not listed separately ({leaf})")

    # ---- per-span resources ------------------------------------------------------------------------
    def create_spans(self, plans: Sequence[SpanPlan]) -> list[SpanInfo]:
        """The spans start at the binlog end now; nothing is created on the server. Each span's publication label
        carries the span count (:func:`upstream.mysql.span_set.publication_label`), from which its table set follows
        (:class:`~upstream.mysql.span_set.SpanShare`); ``InvalidArgument`` when a plan's tables are not the ones that
        rule gives its span (the set could not be kept), or two spans would share a ``server_id``."""
        n = len(plans)
        if sorted(p.index for p in plans) != list(range(n)):
            raise InvalidArgument(f"MySQL upstream {self.where}: span indexes {[p.index for p in plans]} are not "
                                  f"0..{n - 1}")
        ids: dict[int, int] = {}
        for p in plans:
            share = SpanShare(p.index, n)
            stray = [str(t) for t in p.tables if not share.carries(t)]
            if stray:
                raise InvalidArgument(f"MySQL upstream {self.where}: span {p.index} of {n} was planned with "
                                      f"{', '.join(stray)}, which the span-set rule (cdc.spans.span_of) gives to "
                                      f"another span; MySQL keeps no table set per span")
            sid = span_server_id(p.slot)
            if sid in ids:
                raise InvalidArgument(f"MySQL upstream {self.where}: spans {ids[sid]} and {p.index} would share the "
                                      f"replication server_id {sid}; choose another changefeed id")
            ids[sid] = p.index
        conn = self._session()
        own = admin.variables(conn, self.where).get("server_id", "")
        replicas = admin.replica_server_ids(conn, self.where) or set()
        for p in plans:
            sid = span_server_id(p.slot)
            if own == str(sid):
                raise UpstreamNotReady(f"MySQL {self.where}: its server_id {own} is the one span {p.index} would use; "
                                       f"change the server's server_id")
            if sid in replicas:
                raise UpstreamNotReady(
                    f"MySQL {self.where}: a replica with server_id {sid} is connected, the id span {p.index} of this "
                    f"changefeed would use (the server would disconnect one of them): change that replica's "
                    f"server_id, or choose another changefeed id")
        log_file, pos = admin.master_position(conn, self.where)
        ts = positions.to_ts(log_file, pos)
        return [SpanInfo(p.index, p.slot, publication_label(p.publication, n), ts) for p in plans]

    def drop_spans(self, spans: Sequence[SpanInfo], *, timeout: float = 30.0) -> list[SpanInfo]:
        return list(spans)  # nothing lives upstream

    @contextmanager
    def align_spans(self, spans: Sequence[SpanInfo], wanted: Mapping[int, Sequence[TableName]], *,
                    label: str = "", join: JoinRule | None = None) -> Iterator[list[TableName]]:
        """Nothing to change upstream (a span's set is the rule's): yields the tables the spans carry now, after
        checking that ``wanted`` gives each table to the span the rule gives it (``InvalidArgument`` otherwise: that
        set could not be kept)."""
        for span in spans:
            share = SpanShare.of(span)
            stray = [str(t) for t in wanted.get(span.index, ()) if not share.carries(t)]
            if stray:
                raise InvalidArgument(f"MySQL upstream {self.where}: span {span.index} cannot carry "
                                      f"{', '.join(stray)}: the span-set rule (cdc.spans.span_of) gives them to "
                                      f"another span")
        tables = self.list_tables()
        yield sorted(t for t in tables if any(SpanShare.of(s).carries(t) for s in spans))

    def span_tables(self, span: SpanInfo) -> list[TableName] | None:
        """The tables of the database the span-set rule gives ``span`` (:mod:`upstream.mysql.span_set`; the span
        applies the changefeed's filter itself)."""
        share = SpanShare.of(span)
        return [t for t in self.list_tables() if share.carries(t)]

    def slot_state(self, slot: str) -> SlotState | None:
        return SlotState(slot, False, None, None, None, "binlog", False)

    def current_position(self) -> int:
        return positions.to_ts(*admin.master_position(self._session(), self.where))

    def add_table(self, span: SpanInfo, table: TableName, *, lock_timeout_ms: int, count_cap: int,
                  spans: Sequence[SpanInfo] = ()) -> int | None:
        return None  # every table of the database is in the set of the span the rule gives it already (span_tables)

    def carrying_spans(self, relation_id: int, spans: Sequence[SpanInfo]) -> list[int]:
        """The one span of ``spans`` the span-set rule gives the table named by ``relation_id`` (a MySQL relation id
        is derived from the name: a renamed table is another relation), none when no such table exists."""
        for t in self.list_tables():
            if catalog.relation_id(t) == relation_id:
                return sorted(s.index for s in spans if SpanShare.of(s).carries(t))
        return []

    def partition_leaves(self, spans: Sequence[SpanInfo]) -> list[PartitionLeaf]:
        return []

    def captures_ddl(self) -> bool:
        """The binlog carries every schema change at its position (a QUERY event), so there is nothing it cannot see
        (the span refuses a DDL of a replicated table for now, loudly)."""
        return True

    def relation_exists(self, oid: int) -> bool:
        return any(catalog.relation_id(t) == oid for t in self.list_tables())

    def has_rows(self, oid: int) -> bool:
        return False

    # ---- data plane --------------------------------------------------------------------------------
    def span_source(self, span: SpanInfo, start: Watermark, table_filter: TableFilter, *, label: str,
                    holder: str, resume: str | None = None) -> MySqlSpanSource:
        """``resume``: a :class:`~upstream.mysql.resume.ResumePoint` token (on this server: its file and position; read
        from another server: its GTID state, :meth:`check_takeover`)."""
        uri, timeout = self.uri, self._timeout
        return MySqlSpanSource(uri, self.database, self.where, span_server_id(span.slot), table_filter, start, label,
                               connect=lambda: my_conn.connect(uri, timeout=timeout), resume=resume,
                               share=SpanShare.of(span))

    def check_takeover(self, spans: Sequence[SpanInfo], tokens: Mapping[int, str | None]) -> None:
        """Every span's token names a MariaDB GTID state that this server's binlog contains (a replica with
        ``log_slave_updates``) and still holds what follows; ``InvalidArgument`` naming the missing GTIDs otherwise
        (and for a span without a token: it never stored one, resume it once on its old server first)."""
        conn = self._session()
        sid = admin.server_id(conn, self.where)
        problems = []
        for span in spans:
            token = tokens.get(span.index)
            if not token:
                problems.append(f"span {span.index} has no GTID position stored with its checkpoint (it was stored "
                                f"before checkpoints carried one): resume the changefeed once on its old upstream")
                continue
            point = ResumePoint.decode(token)
            if point.server_id == sid:
                continue  # (the same server under another address: it continues at its file and position)
            found = admin.takeover_problems(conn, self.where, point.gtid)
            if not found:  # the server's own word: is that exact GTID in its binlog (same topology)?
                refusal = gtid_start_refusal(self.uri, span_server_id(span.slot), point.gtid)
                found = [refusal] if refusal else []
            problems += [f"span {span.index} (checkpoint after GTID {point.gtid or '(none)'}): {p}" for p in found]
        if problems:
            raise InvalidArgument(f"MySQL {self.where} (server_id {sid}) cannot continue this changefeed: "
                                  + "; ".join(problems))

    def row_source(self, *, label: str = "") -> RowFetcher:
        return RowFetcher(self.uri, label=label)

    @contextmanager
    def export_snapshot(self, *, label: str = "", resume: str | None = None) -> Iterator[ExportedSnapshot]:
        """The binlog end now as the copy run's position (:func:`upstream.mysql.snapshot_read.export_position`):
        MySQL cannot share a snapshot between connections, so each reader opens its own at a position >= this one
        and says which (``SnapshotReader.read_ts``). Nothing is held on the server while the block runs.

        Its Ts is in the Ts epoch of the span's stream on this server (:mod:`upstream.mysql.positions`): the epoch
        of ``resume``, one higher when ``resume`` was read from another server (the stream's takeover raises it
        likewise), so that floors and ceilings compare with the stream's Ts after a failover (the readers take the
        epoch from the name)."""
        conn = self._session()
        epoch = 0
        if resume is not None:
            point = ResumePoint.decode(resume)
            epoch = point.epoch + (1 if point.server_id != admin.server_id(conn, self.where) else 0)
        yield snapshot_read.export_position(conn, self.where, epoch)

    def snapshot_reader(self, snapshot: str | None = None, *, label: str = "") -> MySqlSnapshotReader:
        return MySqlSnapshotReader(self.uri, snapshot, label=label, timeout=self._timeout)
