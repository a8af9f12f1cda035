"""Rows a merge copy keeps that the upstream does not have: ``[snapshot] on-existing-rows = "merge"``.

A merge copy upserts the upstream's rows by key over the rows a target table already held, and deletes nothing:
a row of the target whose key the upstream does not have stays, so the target differs from the source. That is
what merge means, but the changefeed must say it (the first rule: never silently wrong), with the table and how
many rows. The check:

1. The copy's first run, before it writes a row, records the tables whose target holds rows
   (:meth:`MergedRows.holding_rows`, stored in :attr:`cdc.model.SpanSnapshot.merged`).
2. When every chunk is copied, still under the run's exported snapshot and before the span streams, each such
   table's target rows are counted against the upstream's rows at that snapshot (:meth:`MergedRows.check`). The
   target then holds the snapshot's rows (upserted) plus the kept rows, so the difference is exactly how many
   rows were kept -- when the table was planned and every chunk read under this run's snapshot. A table copied
   under more than one snapshot (a run died and the next took a new one) cannot be counted that way: rows the
   earlier run copied that were deleted upstream since are still there until the stream replays their DELETEs.
   It gets the same warning, saying the rows could not be counted.

The warning, ``CDC:WarnMergedRowsKept`` (a divergence: the changefeed goes to ``warning``), names the table and
the count; it stays until the changefeed is resumed (acknowledged). The fix it names: delete those rows, or copy
the table again with ``cdc cli changefeed snapshot --table`` (a table copy empties its target first).
Not on the hot path: two ``count(*)`` per table that held rows, once per copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from cdc.events import TableName, TableSchema
from cdc.model import DataWarning, WarningSeverity
from sinks.base import TxnSink
from sinks.copy_roles import ExistingRows, RowCounts
from upstream.base import SnapshotReader

log = logging.getLogger(__name__)

CODE = "CDC:WarnMergedRowsKept"


class MergedRows:
    """The check of one span's merge copy (see the module doc). ``open_sink`` opens the span's sink (closed after
    each use); ``warn`` adds data warnings to the span (stored with its status)."""

    def __init__(self, changefeed: str, open_sink: Callable[[], TxnSink], warn: Callable[[list[DataWarning]], None],
                 label: str = "") -> None:
        self.changefeed = changefeed
        self.open_sink = open_sink
        self.warn = warn
        self.label = label

    def holding_rows(self, tables: Sequence[TableName]) -> tuple[str, ...]:
        """The tables of ``tables`` whose target holds rows now (before the copy writes any)."""
        sink = self.open_sink()
        try:
            if not isinstance(sink, ExistingRows):
                return ()  # no tables that could hold rows
            return tuple(sorted(str(t) for t in sink.tables_with_rows(tables)))
        finally:
            sink.close()

    def check(self, reader: SnapshotReader, schemas: Mapping[str, TableSchema], exact: set[str]) -> list[DataWarning]:
        """Count the targets of ``schemas`` (the tables that held rows) against ``reader``'s snapshot; warn for each
        table whose target holds more rows, or, for a table not in ``exact`` (copied under more than one snapshot),
        that its kept rows could not be counted. Returns the warnings it raised."""
        if not schemas:
            return []
        sink = self.open_sink()
        try:
            # (the others: no count; a sink that cannot count rows: no check)
            counted = sink.count_rows([s.name for n, s in schemas.items() if n in exact]) \
                if isinstance(sink, RowCounts) else None
        finally:
            sink.close()
        if counted is None:
            return []
        now = time.time()
        out: list[DataWarning] = []
        for name, schema in sorted(schemas.items()):
            fix = (f"delete them from the target, or copy the table again: cdc cli changefeed snapshot -c "
                   f"{self.changefeed} --table {name} (it empties the target first), then resume the changefeed")
            if name not in exact:
                out.append(DataWarning(
                    CODE, name, "the target table held rows before the initial copy, which merged the upstream's "
                    "rows into them ([snapshot] on-existing-rows = \"merge\"); rows whose key the upstream does not "
                    "have were kept, and how many could not be counted (the copy ran under more than one snapshot); "
                    f"check the table, and {fix}", WarningSeverity.DIVERGENCE, first_time=now, last_time=now))
                continue
            upstream = reader.count_rows(schema)
            reader.release()  # no lock held on one table while counting the next
            target = counted.get(schema.name, 0)
            if upstream is None or target <= upstream:
                continue
            kept = target - upstream
            out.append(DataWarning(
                CODE, name, f"{kept} row(s) of the target table that the upstream does not have were kept by the "
                "initial copy ([snapshot] on-existing-rows = \"merge\" upserts the upstream's rows and deletes "
                f"nothing): the target has {target} rows, the upstream {upstream} at the copy's snapshot; {fix}",
                WarningSeverity.DIVERGENCE, count=kept, first_time=now, last_time=now))
        for w in out:
            log.warning("span=%s table %s: %s", self.label, w.table, w.message)
        self.warn(out)
        return out
