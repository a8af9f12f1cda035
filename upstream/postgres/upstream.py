"""PostgreSQL behind the upstream interface (:class:`upstream.base.Upstream`).

A span's slot is a logical replication slot (plugin pgoutput), its table set a publication
(``publish_via_partition_root``; on PostgreSQL 18+ ``publish_generated_columns = stored``: see
:mod:`upstream.postgres.admin`). The control-plane methods share one autocommit connection, opened on first
use (with ``statement_timeout`` when given) and closed by :meth:`PostgresUpstream.close`; the span source
(:mod:`upstream.postgres.source`) and the row source (:mod:`upstream.postgres.rowfetch`) open their own.
Errors: psycopg2's become :class:`cdc.errors.TidewaterError` subclasses in :mod:`upstream.postgres.conn`.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from cdc.errors import InvalidArgument, TidewaterError
from cdc.events import TableName, TableSchema
from cdc.filter import TableFilter
from cdc.model import SpanInfo
from cdc.ts import Watermark, lsn_to_str
from cdc.uri import parse_upstream_uri
from upstream.base import ExportedSnapshot, JoinRule, PartitionLeaf, SlotState, SpanPlan, Upstream
from upstream.postgres import admin, capture_objects, catalog, eligibility
from upstream.postgres import conn as pg_conn
from upstream.postgres.rowfetch import RowFetcher
from upstream.postgres.snapshot_read import PgSnapshotReader
from upstream.postgres.source import PgSpanSource
from upstream.postgres.stream import ReplicationStream

log = logging.getLogger(__name__)


class PostgresUpstream(Upstream):
    """``open_upstream("postgresql://...")``. ``timeout``: seconds to connect; ``statement_timeout``: seconds
    any one query of the control-plane session may run (None: the server's setting); ``connect(uri,
    timeout=...)`` opens an autocommit connection (default :func:`upstream.postgres.conn.connect`)."""

    def __init__(self, uri: str, *, timeout: float = 5.0, statement_timeout: float | None = None,
                 connect: Callable[..., Any] = pg_conn.connect) -> None:
        super().__init__(uri)
        self._timeout = timeout
        self._statement_timeout = statement_timeout
        self._connect = connect
        self._conn: Any = None
        self._gencols: dict[str, bool | None] = {}  # publication -> publishes stored generated columns

    # ---- session -----------------------------------------------------------------------------------
    def _session(self) -> Any:
        if self._conn is None:
            conn = self._connect(self.uri, timeout=self._timeout)
            if self._statement_timeout is not None:
                try:
                    with pg_conn.pg_errors(conn, "setting statement_timeout"), conn.cursor() as cur:
                        cur.execute(f"SET statement_timeout = {int(self._statement_timeout * 1000)}")
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._gencols.clear()
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def server_identity(self) -> tuple[str, int, str]:
        u = parse_upstream_uri(self.uri)
        return (u.host or "").lower(), u.port or pg_conn.DEFAULT_PORT, u.path

    # ---- readiness ---------------------------------------------------------------------------------
    def check_ready(self, *, slots_needed: int = 1) -> dict[str, Any]:
        return admin.check_upstream(self._session(), slots_needed=slots_needed)

    def probe(self, timeout: float = 2.0) -> None:
        pg_conn.probe(self.uri, timeout)

    # ---- tables ------------------------------------------------------------------------------------
    def list_tables(self) -> list[TableName]:
        return catalog.list_tables(self._session())

    def table_schema(self, table: TableName | int) -> TableSchema:
        return catalog.table_schema(self._session(), table)

    def check_tables(self, tables: Sequence[TableName], *, publication: str | None = None) -> list[TableSchema]:
        conn = self._session()
        if publication is None:
            return eligibility.check_tables(conn, list(tables))
        if publication not in self._gencols:
            self._gencols[publication] = admin.publication_publishes_generated(conn, publication)
        return eligibility.check_tables(conn, list(tables), publish_generated=bool(self._gencols[publication]))

    def check_partition(self, leaf: TableName) -> None:
        # the leaf's columns are its root's, whose generated columns the publication already accepted
        eligibility.check_tables(self._session(), [leaf], publish_generated=True)

    # ---- per-span resources ------------------------------------------------------------------------
    def create_spans(self, plans: Sequence[SpanPlan]) -> list[SpanInfo]:
        conn = self._session()
        for p in plans:
            if admin.slot_info(conn, p.slot) is not None:
                raise InvalidArgument(
                    f"replication slot {p.slot!r} already exists upstream: it belongs to another changefeed whose "
                    f"id maps to the same name (names are lower-case) or to another Tidewater cluster, or it was "
                    f"left behind; choose another changefeed id, or drop it with "
                    f"SELECT pg_drop_replication_slot('{p.slot}') if nothing uses it")
        # Clean up only what this call created: a slot or publication that already existed may belong to a
        # running changefeed, and dropping it would break that one.
        created_pubs: list[str] = []
        created_slots: list[str] = []
        spans: list[SpanInfo] = []
        # before the slots: every partition operation from the slots' start on is repaired in the stream
        result = capture_objects.install(conn)
        self.capture_notice = result.reason
        if result.reason:
            log.warning("upstream %s: %s", pg_conn.redact_uri(self.uri), result.reason)
        try:
            pubs = [p.publication for p in plans]
            for p in plans:
                if admin.create_publication(conn, p.publication, list(p.tables)):
                    created_pubs.append(p.publication)
                admin.set_join_rule(conn, p.publication,
                                    None if p.join is None else admin.join_rule_doc(p.join, p.index, pubs))
                lsn = admin.create_slot(conn, p.slot)
                created_slots.append(p.slot)
                spans.append(SpanInfo(p.index, p.slot, p.publication, lsn))
        except BaseException:
            for slot in created_slots:
                try:
                    admin.drop_slot(conn, slot)
                except TidewaterError as exc:
                    log.error("cleanup after failed create: %s", exc)
            for pub in created_pubs:
                try:
                    admin.drop_publication(conn, pub)
                except TidewaterError as exc:
                    log.error("cleanup after failed create: %s", exc)
            if result.installed:
                try:
                    capture_objects.uninstall(conn, *(p.slot for p in plans))
                except TidewaterError as exc:
                    log.error("cleanup after failed create: %s", exc)
            raise
        return spans

    def drop_spans(self, spans: Sequence[SpanInfo], *, timeout: float = 30.0) -> list[SpanInfo]:
        conn = self._session()
        dropped: list[SpanInfo] = []
        for s in spans:
            if admin.drop_slot(conn, s.slot, timeout=timeout):
                dropped.append(s)
            admin.drop_publication(conn, s.publication)
        capture_objects.uninstall(conn, *(s.slot for s in spans))
        return dropped

    @contextmanager
    def align_spans(self, spans: Sequence[SpanInfo], wanted: Mapping[int, Sequence[TableName]], *,
                    label: str = "", join: JoinRule | None = None) -> Iterator[list[TableName]]:
        conn = self._session()
        conn.autocommit = False
        try:
            before: set[TableName] = set()
            for span in spans:
                have = admin.publication_tables(conn, span.publication)
                if have is None:
                    raise InvalidArgument(
                        f"publication {span.publication!r} of span {span.index} no longer exists upstream; the "
                        f"changefeed cannot be updated: remove it and create it again")
                before.update(have)
                want = list(wanted.get(span.index, ()))
                added = admin.add_tables_to_publication(conn, span.publication, want)
                removed = admin.remove_tables_from_publication(conn, span.publication, sorted(set(have) - set(want)))
                if join is not None:
                    admin.set_join_rule(conn, span.publication,
                                        admin.join_rule_doc(join, span.index, [s.publication for s in spans]))
                if added or removed:
                    log.info("changefeed=%s span %d publication %s: +%s -%s", label, span.index, span.publication,
                             [str(t) for t in added], [str(t) for t in removed])
            yield sorted(before)
            with pg_conn.pg_errors(conn, "committing the publication changes"):
                conn.commit()
        except BaseException:
            try:
                conn.rollback()
            except Exception:  # noqa: BLE001 - a broken connection rolls back by itself
                pass
            raise
        finally:
            try:
                conn.autocommit = True
            except Exception:  # noqa: BLE001 - broken: drop the session, the next call reconnects
                self.close()

    def span_tables(self, span: SpanInfo) -> list[TableName] | None:
        return admin.publication_tables(self._session(), span.publication)

    def slot_state(self, slot: str) -> SlotState | None:
        s = admin.slot_info(self._session(), slot)
        if s is None:
            return None
        return SlotState(s.name, s.active, s.active_pid, None if s.lost else s.retained_bytes,
                         s.confirmed_flush_lsn, s.wal_status, s.lost, s.invalidation_reason)

    def current_position(self) -> int:
        return admin.current_wal_lsn(self._session())

    def add_table(self, span: SpanInfo, table: TableName, *, lock_timeout_ms: int, count_cap: int,
                  spans: Sequence[SpanInfo] = ()) -> int | None:
        return admin.add_table_locked(self._session(), span.publication, table, lock_timeout_ms=lock_timeout_ms,
                                      count_cap=count_cap, others=[s.publication for s in spans])

    def carrying_spans(self, relation_id: int, spans: Sequence[SpanInfo]) -> list[int]:
        listing = set(admin.publications_listing(self._session(), relation_id, [s.publication for s in spans]))
        return sorted(s.index for s in spans if s.publication in listing)

    # ---- partitions --------------------------------------------------------------------------------
    def partition_leaves(self, spans: Sequence[SpanInfo]) -> list[PartitionLeaf]:
        return catalog.published_partition_leaves(self._session(), [s.publication for s in spans])

    def repairs_partitions(self) -> bool:
        return capture_objects.installed(self._session())

    def captures_ddl(self) -> bool:
        return capture_objects.captures_ddl(self._session())

    def relation_exists(self, oid: int) -> bool:
        return catalog.relation_info(self._session(), oid) is not None

    def has_rows(self, oid: int) -> bool:
        return catalog.has_rows(self._session(), oid)

    # ---- data plane --------------------------------------------------------------------------------
    def span_source(self, span: SpanInfo, start: Watermark, table_filter: TableFilter, *, label: str,
                    holder: str, resume: str | None = None) -> PgSpanSource:
        """(``resume`` is ignored: the slot keeps PostgreSQL's position, the checkpoint's LSN is it.)"""
        stream = ReplicationStream(self.uri, span.slot, span.publication, start.ts, label=label, holder=holder,
                                   takeover=True)
        # (a partial, not a lambda: the source is pickled when it runs in a process of its own)
        return PgSpanSource(stream, table_filter, start, functools.partial(pg_conn.connect, self.uri), label)

    def row_source(self, *, label: str = "") -> RowFetcher:
        return RowFetcher(self.uri, label=label)

    @contextmanager
    def export_snapshot(self, *, label: str = "", resume: str | None = None) -> Iterator[ExportedSnapshot]:
        """A temporary slot created with ``(SNAPSHOT 'export')`` on a replication connection of its own, which
        stays idle (the snapshot's lifetime) until the block ends; the slot goes with the connection, also if
        this process dies. Its consistent point is the snapshot's Ts: the snapshot holds exactly the
        transactions whose commit (end) LSN is at or below it, and every later one commits above it."""
        name = f"tidewater_snap_{uuid.uuid4().hex[:16]}"
        conn = pg_conn.connect(self.uri, replication=True)
        try:
            ts, snapshot = admin.create_slot_exported(conn, name, temporary=True)
            log.info("span=%s exported snapshot %s at %s (temporary slot %s)", label, snapshot, lsn_to_str(ts), name)
            yield ExportedSnapshot(snapshot, ts, time.time())
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a broken connection: the server drops the slot with it
                pass

    def snapshot_reader(self, snapshot: str | None = None, *, label: str = "") -> PgSnapshotReader:
        return PgSnapshotReader(self.uri, snapshot, label=label, timeout=self._timeout)
