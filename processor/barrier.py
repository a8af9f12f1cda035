"""What contradicts a changefeed barrier: another span's copy that ran ahead of it (docs/ddl.md, "Changefeed barrier").

A DDL that changes which table holds a downstream name (CREATE, DROP, RENAME TABLE) waits until every other span of
the changefeed wrote everything committed before it (``SpanRunner._changefeed_barrier``). A copy does not move
through the stream: it writes a table as of its snapshot's Ts at once. When a table was renamed onto a name while its
copy ran (``DROP TABLE b; ALTER TABLE a RENAME TO b`` with ``a`` being copied in one span and ``b`` in another), the
copy can write ``b`` as of a Ts *after* that DDL before the other span has applied its side of it (dropping its own
``b``), and that span then drops the copied rows: the changefeed said ``normal`` with ``b`` empty downstream (seen
under load in tests/e2e/test_ddl_concurrent.py). A copy run reads a renamed table by its relation oid under the
snapshot it was planned at (``upstream.postgres.snapshot_read``), so it no longer gets ahead by itself; a run that
*restarts* after the rename cannot import its old snapshot again and copies the table under its new name at a later
one. Until the copy is ordered with the barrier, the span about to apply such a DDL checks the copy plans of the
other spans and refuses it, naming the tables, instead of applying it (docs/ddl.md, "Still refused loudly").
"""

from __future__ import annotations

from collections.abc import Iterable

from cdc.events import DdlEvent, TableName
from cdc.meta.snapshot_progress import SnapshotProgressStore


def ddl_names(event: DdlEvent) -> list[TableName]:
    """The downstream names a name-changing DDL takes away or gives: its table's name before and after."""
    names = [event.table]
    for name in (event.new_table, event.after.name if event.after is not None else None):
        if name is not None and name not in names:
            names.append(name)
    return names


def copied_after(progress: SnapshotProgressStore, changefeed: str, spans: Iterable[int], names: Iterable[TableName],
                 ts: int) -> list[str]:
    """For each of ``names`` that one of ``spans`` planned its copy of under a snapshot after commit Ts ``ts``, or
    copied chunks of under one (a run that restarted: its chunks left are read under the new run's snapshot): a
    sentence naming the span, table and Ts (empty: no copy ran ahead of ``ts``). Two etcd reads per span and planned
    name; asked only at name-changing DDLs of changefeeds with several spans."""
    out = []
    names = list(names)
    for span in spans:
        for name in names:
            plan = progress.get_plan(changefeed, span, name)
            if plan is None:
                continue
            read = max((d.commit_ts for d in progress.done_chunks(changefeed, span, name).values()), default=0)
            if max(plan.ts, read) > ts:
                out.append(f"span {changefeed}/{span} copied table {name} as of Ts {max(plan.ts, read)}, after this "
                           "DDL")
    return out
