"""``cdc cli changefeed snapshot -c ID --table schema.name``: copy some tables' rows again (a resync) while the
changefeed goes on streaming (docs/snapshot.md, "Table copies").

The request is stored in the changefeed's info (:meth:`cdc.meta.store.MetaStore.request_table_copies`); the span
that publishes the table takes it up (``processor.processor``), empties the table downstream and copies it under
a new snapshot, holding back only that table's changes meanwhile. Refused, naming the fix: an unknown changefeed, a
table the changefeed does not replicate, a changefeed that is being removed.

A sink that refuses to create a target table the changefeed has had (``sinks.copy_roles.TablesHad``: dropped behind the
changefeed's back, the changefeed failed with ``CDC:ErrTargetTableDropped``) is told, after the request is stored,
that these tables are copied again, so that the copy (and the span's changes before it) may create them anew.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from cdc.config import ChangefeedConfig
from cdc.errors import ChangefeedNotFound, ChangefeedStateConflict, InvalidArgument, TidewaterError
from cdc.events import TableName
from cdc.meta.store import MetaStore
from cdc.model import ChangefeedInfo, FeedState, TableCopy
from cdc.uri import parse_sink_uri
from sinks.copy_roles import ResyncRefusal, TablesHad
from sinks.factory import open_sink, sink_class
from upstream import open_upstream
from upstream.base import Upstream

log = logging.getLogger(__name__)


def request_resync(store: MetaStore, cf_id: str, tables: Sequence[str]) -> tuple[TableCopy, ...]:
    """Store a table copy (reason ``resync``) of each of ``tables`` for changefeed ``cf_id``; return them."""
    if not tables:
        raise InvalidArgument("name at least one table to copy again (--table schema.name)")
    entry = store.get_changefeed(cf_id)
    if entry is None:
        raise ChangefeedNotFound(f"changefeed {cf_id!r} does not exist")
    info = entry.value
    if info.state is FeedState.REMOVED:
        raise ChangefeedStateConflict(f"changefeed {cf_id!r} is being removed")
    names = []
    for raw in tables:
        if not isinstance(raw, str) or not raw.strip():
            raise InvalidArgument(f"table names are 'schema.name' strings, got {raw!r}")
        names.append(TableName.parse(raw.strip()))
    try:
        cls = sink_class(parse_sink_uri(info.sink_uri).scheme)
        why = cls.resync_refusal(info.sink_uri) if issubclass(cls, ResyncRefusal) else None
    except TidewaterError:
        why = None  # an unusable sink URI fails the changefeed elsewhere
    if why is not None:
        raise InvalidArgument(f"changefeed {cf_id!r} cannot resync: {why}")
    up = open_upstream(info.upstream_uri)
    try:
        where: dict[TableName, int] = {}
        for span in info.spans:
            for t in up.span_tables(span) or ():
                where[t] = span.index
        missing = [str(t) for t in names if t not in where]
        if missing:
            known = ", ".join(sorted(str(t) for t in where)[:20]) or "none"
            raise InvalidArgument(f"changefeed {cf_id!r} does not replicate {', '.join(missing)} (it replicates: "
                                  f"{known}); name a replicated table, or change the changefeed's filter first")
        # each table's relation oid now: the span finds the table by it if it is renamed before its copy begins
        oids = {str(t): _oid(up, t) for t in names}
    finally:
        up.close()
    copies = store.request_table_copies(cf_id, [(str(t), where[t]) for t in dict.fromkeys(names)], "resync",
                                        time.time(), oids=oids)
    log.info("changefeed=%s: table copy asked for %s", cf_id, ", ".join(c.table for c in copies))
    _forget_tables_had(info, names)
    return copies


def _forget_tables_had(info: ChangefeedInfo, tables: Sequence[TableName]) -> None:
    """Tell a ``TablesHad`` sink that ``tables`` are copied again (module docstring). After the request is stored: a
    failure here leaves a stored copy whose span fails again on a dropped table (the request is then repeated), never
    a record forgotten without its copy."""
    sink = open_sink(info.sink_uri, ChangefeedConfig.from_dict(info.config).sink)
    try:
        if isinstance(sink, TablesHad):
            n = sink.forget_tables_had(info.id, tables)
            if n:
                log.info("changefeed=%s: %d target table(s) may be created anew by their copy", info.id, n)
    finally:
        sink.close()


def _oid(up: Upstream, table: TableName) -> int:
    """``table``'s relation oid now (0: gone meanwhile; the span's copy then says what it finds)."""
    try:
        return up.table_schema(table).relation_id
    except InvalidArgument:
        return 0
