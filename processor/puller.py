"""The span's puller: one upstream replication stream demultiplexed into the sorter.

It turns pgoutput messages into sorter operations (add / abort / commit), keeps the span's schema
versions (a Relation message makes a new ``TableSchema`` version; every stored change carries the
version valid when it was decoded), and reports the span's resolved watermark.

Guarantees: ``on_resolved(w)`` is called with non-decreasing watermarks, only after every transaction
with commit Ts <= ``w.ts`` is committed in the sorter. Transactions with commit Ts <= the start
checkpoint are dropped (they are already downstream). Runs in one thread (``run``); ``schema(version)``
may be called from any thread (dict reads; versions are never mutated once published).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cdc.events import ColumnSchema, TableName, TableSchema
from cdc.filter import TableFilter
from cdc.ts import Watermark
from processor.mounter import encode_payload
from sorter.base import SpanSorter
from upstream.postgres import catalog, pgoutput
from upstream.postgres.stream import Keepalive, ReplicationStream
from upstream.postgres.types import BUILTIN_TYPES

log = logging.getLogger(__name__)


def merge_schema(rel: pgoutput.Relation, current: TableSchema | None, version: int) -> TableSchema:
    """The schema of a Relation message: its column list (authoritative for decoding tuples) enriched
    with the catalog's key, nullability and type names where the catalog still agrees."""
    known = {c.name: c for c in current.columns} if current is not None else {}
    cols: list[ColumnSchema] = []
    for rc in rel.columns:
        c = known.get(rc.name)
        if c is not None and c.type_oid == rc.type_oid:
            cols.append(c)
            continue
        base, is_array = BUILTIN_TYPES.get(rc.type_oid, ("text", False))
        cols.append(ColumnSchema(rc.name, rc.type_oid, base, is_array, type_name=base,
                                 type_modifier=rc.type_modifier, is_key=bool(rc.flags & 1)))
    names = {c.name for c in cols}
    if current is not None and current.key and all(k in names for k in current.key):
        key, has_key = current.key, current.has_key
    else:
        key = tuple(rc.name for rc in rel.columns if rc.flags & 1)
        has_key = rel.replica_identity != "f"
    key_set = set(key)
    cols = [c if c.is_key == (c.name in key_set) else _with_key(c, c.name in key_set) for c in cols]
    return TableSchema(TableName(rel.namespace, rel.name), tuple(cols), tuple(key), rel.replica_identity,
                       rel.relid, version, has_key)


def _with_key(c: ColumnSchema, is_key: bool) -> ColumnSchema:
    return ColumnSchema(c.name, c.type_oid, c.base_type, c.is_array, c.type_name, c.type_modifier,
                        c.nullable and not is_key, is_key)


class Puller:
    def __init__(
        self,
        stream: ReplicationStream,
        sorter: SpanSorter,
        table_filter: TableFilter,
        start: Watermark,
        catalog_conn: Callable[[], Any],
        label: str,
    ) -> None:
        self.stream = stream
        self.sorter = sorter
        self.filter = table_filter
        self.start = start
        self.label = label
        self._catalog_conn_factory = catalog_conn
        self._catalog_conn: Any = None
        self._schemas: dict[int, TableSchema] = {}
        self._relation_version: dict[int, int] = {}
        self._next_version = 1
        self.resolved = start

    def schema(self, version: int) -> TableSchema:
        return self._schemas[version]

    def _on_relation(self, rel: pgoutput.Relation) -> None:
        name = TableName(rel.namespace, rel.name)
        if not self.filter.match(name):
            self._relation_version.pop(rel.relid, None)
            return
        if self._catalog_conn is None:
            self._catalog_conn = self._catalog_conn_factory()
        try:
            current: TableSchema | None = catalog.table_schema(self._catalog_conn, rel.relid)
        except Exception as exc:  # noqa: BLE001 - table dropped since: fall back to the message alone
            log.warning("span=%s no catalog schema for %s (%s); using the Relation message only",
                        self.label, name, exc)
            current = None
        version = self._next_version
        self._next_version += 1
        self._schemas[version] = merge_schema(rel, current, version)
        self._relation_version[rel.relid] = version

    def run(self, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        sorter = self.sorter
        relver = self._relation_version
        skip_upto = self.start.ts
        txn_xid = 0
        stream_xid = 0
        resolved = self.start
        change_t, begin_t, commit_t = pgoutput.Change, pgoutput.Begin, pgoutput.Commit
        relid_of = pgoutput.plain_change_relid
        add = sorter.add
        prefixes: dict[int, bytes] = {}  # schema version -> its encoded payload prefix
        try:
            for m in self.stream.messages(stop):
                t = type(m)
                if t is bytes:  # a non-streamed Insert/Update/Delete, raw (see ReplicationStream.messages)
                    ver = relver.get(relid_of(m))
                    if ver is None:
                        continue
                    prefix = prefixes.get(ver)
                    if prefix is None:
                        prefix = prefixes[ver] = encode_payload(ver, b"")
                    add(txn_xid, txn_xid, prefix + m)
                elif t is change_t:
                    ver = relver.get(m.relid)
                    if ver is None:
                        continue
                    if m.xid is None:
                        sorter.add(txn_xid, txn_xid, encode_payload(ver, m.raw))
                    else:
                        sorter.add(stream_xid, m.xid, encode_payload(ver, m.raw))
                elif t is begin_t:
                    txn_xid = m.xid
                elif t is commit_t:
                    resolved = self._commit(txn_xid, m.end_lsn, m.commit_time, skip_upto, resolved, on_resolved)
                elif t is Keepalive:
                    if m.ts > resolved.ts or (m.ts == resolved.ts and m.time > resolved.time):
                        resolved = Watermark(max(m.ts, resolved.ts), max(m.time, resolved.time))
                        on_resolved(resolved)
                elif t is pgoutput.StreamStart:
                    stream_xid = m.xid
                elif t is pgoutput.StreamStop:
                    stream_xid = 0
                elif t is pgoutput.StreamCommit:
                    resolved = self._commit(m.xid, m.end_lsn, m.commit_time, skip_upto, resolved, on_resolved)
                elif t is pgoutput.StreamAbort:
                    sorter.abort(m.xid, m.subxid)
                elif t is pgoutput.Relation:
                    self._on_relation(m)
                elif t is pgoutput.Truncate:
                    xid = txn_xid if m.xid is None else stream_xid
                    sub = xid if m.xid is None else m.xid
                    for relid in m.relids:
                        ver = relver.get(relid)
                        if ver is not None:
                            sorter.add(xid, sub, encode_payload(ver, pgoutput.truncate_raw(relid, m.options)))
                # Origin, Type and logical messages carry nothing we replicate.
        finally:
            if self._catalog_conn is not None:
                try:
                    self._catalog_conn.close()
                except Exception:  # noqa: BLE001
                    pass
                self._catalog_conn = None

    def _commit(self, xid: int, end_lsn: int, commit_time: float, skip_upto: int, resolved: Watermark,
                on_resolved: Callable[[Watermark], None]) -> Watermark:
        if end_lsn <= skip_upto:
            self.sorter.abort(xid, xid)  # already downstream before the restart
            return resolved
        self.sorter.commit(xid, end_lsn, commit_time)
        if end_lsn > resolved.ts:
            resolved = Watermark(end_lsn, max(commit_time, resolved.time))
            on_resolved(resolved)
        return resolved
