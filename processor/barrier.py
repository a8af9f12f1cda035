"""The changefeed barrier's rule, and what contradicts it: another span's copy that ran ahead of it (docs/ddl.md,
"Changefeed barrier").

**The wait rule** (:func:`barrier_verdict`). A name-changing DDL at position ``(B, s)`` (commit Ts ``B``, ``s`` its
``DdlEvent.seq``: its place among all DDLs of transaction ``B``, the same in every span) may be applied once every
other span of the changefeed, as last stored in etcd, either

- has a checkpoint ``>= B``: it wrote all of transaction ``B``, its DDLs at ``B`` included (a span waiting at a
  barrier at ``B'`` counts as checkpoint ``B' - 1``: ``cdc.model.SpanStatus.covered_ts``; its stored checkpoint stays
  a restart point below ``B'``, since one inside ``B'``'s commit record makes PostgreSQL skip ``B'``); or
- waits at a barrier ``(B, s')`` with ``(s', its index) > (s, this index)``: a span publishes where it waits
  (``SpanStatus.barrier_ts`` / ``barrier_seq``) only after applying all its earlier DDLs, so it applied all of its
  DDLs at ``B`` before ``s'``, hence all before ``s``; and it cannot apply ``s'`` before this span applied ``s``.

Any other state (checkpoint below ``B`` and not waiting at ``B``; waiting at an earlier seq) may still hold a DDL of
``B`` before ``s``, so the span waits. A span with checkpoint ``B - 1`` that is not waiting is exactly that case: it
may be about to reach an earlier DDL of ``B``. Every fact used is monotone (checkpoints only grow; a span's waiting
positions only grow, and each one remains true of the past once it moved on), so a stale etcd read only delays.

*The smallest waiting position always proceeds* (no deadlock): let ``(B, s, i)`` be the least (commit Ts, seq, span
index) at which any span waits. Every other span either waits at a larger position: at ``B`` with a larger
``(seq, index)`` (the second case), or at ``B' > B``, where it counts as checkpoint ``B' - 1 >= B`` while waiting
(the first case); or it does not wait, so nothing of the barrier holds it: it streams until its checkpoint passes
``B`` or it waits itself, at a position that is then either larger (above) or the new least one. So the least
waiting span's condition becomes true unless a span is stopped or failed, which must hold the barrier back. The span
index breaks ties between equal positions (one statement's DDL seen by two spans during a move of its table).

A DDL without a position across spans (``DdlEvent.seq_local``: seen in the stream alone, without the DDL trigger)
waits at :data:`UNORDERED`. It may proceed only when every other span has a checkpoint ``>= B``; when it meets
another span waiting at ``B`` the order of the two cannot be known, and the span refuses the DDL
(``CDC:ErrDdlOrderUnknown``) instead of guessing; the other span (ordered) waits for it, so it never guesses either.

**A copy that ran ahead** (:func:`copied_after`). A DDL that changes which table holds a downstream name (CREATE,
DROP, RENAME TABLE) waits as above (``SpanRunner._changefeed_barrier``). A copy does not move
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
from dataclasses import dataclass, field

from cdc.events import DdlEvent, TableName
from cdc.meta.snapshot_progress import SnapshotProgressStore

UNORDERED = -1  # SpanStatus.barrier_seq of a DDL without a position across spans (DdlEvent.seq_local)


def barrier_position(event: DdlEvent) -> tuple[int, int]:
    """Where a span waits to apply ``event``: ``(commit Ts, seq)``, seq :data:`UNORDERED` when it has no position
    across spans."""
    return event.commit_ts, UNORDERED if event.seq_local else event.seq


@dataclass(frozen=True)
class OtherSpan:
    """Another span of the changefeed as its stored status shows it. ``checkpoint_ts``: its stored checkpoint, or its
    start Ts when that is higher (a span created after a commit holds nothing of it); ``barrier_ts``/``barrier_seq``:
    where it waits at a barrier (0: it does not)."""

    index: int
    checkpoint_ts: int
    barrier_ts: int = 0
    barrier_seq: int = 0


@dataclass(frozen=True)
class Verdict:
    """``behind``: the spans to wait for (empty and no ``unordered``: proceed). ``unordered``: spans waiting at the same
    commit Ts where one of the two DDLs has no position: no order can be established (refuse the DDL)."""

    behind: list[int] = field(default_factory=list)
    unordered: list[int] = field(default_factory=list)

    @property
    def proceed(self) -> bool:
        return not self.behind and not self.unordered


def barrier_verdict(index: int, ts: int, seq: int, others: Iterable[OtherSpan]) -> Verdict:
    """The wait rule (module docstring) for span ``index`` waiting at ``(ts, seq)``."""
    verdict = Verdict()
    for o in others:
        if o.checkpoint_ts >= ts:
            continue  # it wrote all of transaction ts
        if o.barrier_ts == ts:
            if seq == UNORDERED:
                verdict.unordered.append(o.index)
                continue
            if o.barrier_seq != UNORDERED and (o.barrier_seq, o.index) > (seq, index):
                continue  # it applied all its DDLs of ts before this one
        verdict.behind.append(o.index)
    return verdict


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
