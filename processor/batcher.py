"""Whole upstream transactions into sink-sized batches of row changes, for the span's sink thread (:class:`TxnBatcher`).

See the class docstring for what a batch holds and where it is cut (DDL barriers, held tables, floors)."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from itertools import repeat

from cdc.errors import DdlRejected, DecodeError
from cdc.events import REPLAYED, DdlEvent, DdlKind, RowChange
from cdc.ts import Watermark
from processor.floors import TableFloors, ddl_relation_id
from processor.table_hold import PASS, WAIT, TableHold
from sorter.base import SortedTxn
from upstream.base import SCHEMA_CHANGE, encode_payload

_SCHEMA_CHANGE_PREFIX = encode_payload(SCHEMA_CHANGE, b"")


class TxnBatcher:
    """Cuts a lazy stream of sorted transactions into batches of whole transactions.

    ``next_batch()`` returns a lazy iterator of row changes (``mount(payload, commit_ts, commit_time)``
    of each payload, in order): it ends at the first transaction boundary after ``max_rows`` rows (a
    single transaction is never split, except at its DDL). After the iterator is exhausted, ``last`` is
    the watermark of the last transaction it completed (unchanged when the batch was the first part of a
    transaction split at a DDL). Per row it costs one ``mount`` call (the loop runs in ``map``).

    Schema changes: a transaction whose commit Ts is in ``ddl_commits`` (the source's
    ``schema_change_commits()``) gets batches of its own, cut at each stored schema change
    (``upstream.base.SCHEMA_CHANGE``): rows before the DDL, then the DDL (``ddl`` after that batch: the
    caller applies it before asking for the next batch), then the rows after it. ``schema_changes`` turns a
    stored schema change into DDL events (``ChangeDecoder.schema_changes``).
    """

    def __init__(self, txns: Iterable[SortedTxn], mount: Callable[[bytes, int, float], RowChange],
                 max_rows: int, ddl_commits: Container[int] = frozenset(),
                 schema_changes: Callable[[bytes, int, float], list[DdlEvent]] | None = None,
                 floors: TableFloors | Mapping[str, int] | None = None, hold: TableHold | None = None,
                 ceilings: TableFloors | Mapping[str, int] | None = None) -> None:
        self._it = iter(txns)
        self._peek: SortedTxn | None = next(self._it, None)
        self._mount = mount
        # the initial copy's floors (cdc.model.SpanSnapshot; processor.floors: by relation oid, so a table renamed
        # inside its copy's window keeps its floor): a table's changes at or below its floor are in the copy already
        # and are dropped; checked only in transactions at or below the highest floor
        self._floors = floors if isinstance(floors, TableFloors) else TableFloors(floors)
        # ... and its ceilings: a change in (floor, ceiling] of a table is replayed over rows that may already be
        # newer: marked (cdc.events.REPLAYED), and each transaction holding one is a batch of its own (a sink's net
        # effect over several transactions assumes the rows were as the first one found them)
        self._ceilings = (ceilings if isinstance(ceilings, TableFloors) else TableFloors(ceilings)).above_floors(
            self._floors)
        self._ceiling_max = self._ceilings.top
        self._floor_max = max(self._floors.top, self._ceilings.top)
        # a table copy's hold (processor.table_hold): its tables' changes pass, drop or wait; the transaction
        # waited before keeps its mounted parts here, so that it is mounted once
        self._hold = hold
        self._peek_parts: list[tuple[list[RowChange], list[DdlEvent]]] | None = None
        self._max_rows = max_rows
        self._ddl_commits = ddl_commits
        self._schema_changes = schema_changes
        self._parts: list[tuple[list[RowChange], list[DdlEvent]]] = []  # the rest of a split transaction
        self._split: Watermark | None = None
        self.last: Watermark | None = None
        self.batch_complete = False
        self.ddl: list[DdlEvent] = []
        # what the last next_batch() read from the sorter (whole transactions; for metrics)
        self.read_rows = 0
        self.read_bytes = 0
        self.read_txns = 0

    def has_more(self) -> bool:
        return self._peek is not None or bool(self._parts)

    def next_batch(self) -> Iterator[RowChange]:
        self.batch_complete = False
        self.ddl = []
        self.read_rows = self.read_bytes = self.read_txns = 0
        if self._parts:
            yield from self._next_part()
            self.batch_complete = True
            return
        rows = nbytes = txns = 0
        it, mount, max_rows, ddl_commits = self._it, self._mount, self._max_rows, self._ddl_commits
        last: SortedTxn | None = None  # the last whole transaction of this batch: ``last`` once the batch ends
        while self._peek is not None:
            t = self._peek
            if rows and rows >= max_rows:
                break
            if t.commit_ts <= self._floor_max or (self._hold is not None and t.commit_ts <= self._hold.floor_max):
                # (rare: only transactions of a copy's window)
                if rows and (t.commit_ts in ddl_commits or t.commit_ts <= self._ceiling_max):
                    break  # (a replayed transaction: a batch of its own, see _mark_replayed)
                parts = self._filtered(t)
                if parts is None:  # a change a table copy holds back: the batch ends before its transaction
                    break
                self._peek = next(it, None)
                self._peek_parts = None
                if any(ddl for _, ddl in parts):  # a schema change of a table above its floor: still a barrier
                    self._parts = parts
                    self._split = Watermark(t.commit_ts, t.commit_time)
                    self.read_rows, self.read_bytes, self.read_txns = t.rows, t.nbytes, 1
                    yield from self._next_part()
                    break
                last = t
                rows += t.rows  # (read from the sorter: the rows the copy holds are read, then dropped)
                nbytes += t.nbytes
                txns += 1
                for part_rows, _ in parts:
                    yield from part_rows
                if t.commit_ts <= self._ceiling_max and any(r.extra.get(REPLAYED) for p, _ in parts for r in p):
                    break  # (alone in its batch)
                continue
            if t.commit_ts in ddl_commits:
                if rows:
                    break  # a transaction with DDL starts a batch of its own
                self._peek = next(it, None)
                self._parts = self._cut(t)
                self._split = Watermark(t.commit_ts, t.commit_time)
                self.read_rows, self.read_bytes, self.read_txns = t.rows, t.nbytes, 1
                yield from self._next_part()
                break
            self._peek = next(it, None)
            last = t
            rows += t.rows
            nbytes += t.nbytes
            txns += 1
            payloads = t.payloads
            if type(payloads) is list and len(payloads) == 1:  # (a single-row transaction: no iterator objects)
                yield mount(payloads[0], t.commit_ts, t.commit_time)
            else:
                yield from map(mount, payloads, repeat(t.commit_ts), repeat(t.commit_time))
        if last is not None and (self.last is None or last.commit_ts > self.last.ts):
            self.last = Watermark(last.commit_ts, last.commit_time)  # (once per batch, not per transaction)
        if txns:
            self.read_rows, self.read_bytes, self.read_txns = rows, nbytes, txns
        self.batch_complete = True

    def _next_part(self) -> Iterator[RowChange]:
        rows, self.ddl = self._parts.pop(0)
        yield from rows
        if not self._parts:
            self.last = self._split

    def blocked(self) -> bool:
        """The next transaction holds a change that a table copy holds back (the caller waits on the hold and
        asks again; ``next_batch`` would return no row). Sets the hold's ``blocked_at``."""
        hold, t = self._hold, self._peek
        if hold is None or t is None or self._parts or t.commit_ts > hold.floor_max:
            return False
        if self._filtered(t) is None:
            hold.blocked_at = t.commit_ts
            return True
        return False

    def _filtered(self, t: SortedTxn) -> list[tuple[list[RowChange], list[DdlEvent]]] | None:
        """Transaction ``t`` (the peeked one) as parts without the changes the floors and the hold drop; None
        when the hold makes it wait."""
        parts = self._peek_parts
        if parts is None:
            parts = self._peek_parts = (self._cut(t) if t.commit_ts in self._ddl_commits else
                                        [([self._mount(p, t.commit_ts, t.commit_time) for p in t.payloads], [])])
        ts = t.commit_ts
        if ts <= self._floor_max:
            parts = self._above_floors(ts, parts)
        hold = self._hold
        if hold is None or ts > hold.floor_max:
            if self._ceilings:
                self._mark_replayed(ts, parts)
            return parts
        out: list[tuple[list[RowChange], list[DdlEvent]]] = []
        verdict, tables, oids = hold.verdict, hold.tables, hold.oids
        for rows, ddl in parts:
            kept_rows: list[RowChange] = []
            for r in rows:
                name, oid = str(r.schema.name), r.schema.relation_id
                v = verdict(name, ts, oid) if name in tables or oid in oids else PASS
                if v == WAIT:
                    return None
                if v == PASS:
                    kept_rows.append(r)
            kept_ddl: list[DdlEvent] = []
            for e in ddl:
                v = verdict(str(e.table), ts, ddl_relation_id(e))
                if v == WAIT:
                    return None
                if v == PASS:
                    kept_ddl.append(e)
            out.append((kept_rows, kept_ddl))
        if self._ceilings:
            self._mark_replayed(ts, out)  # (what the hold lets pass: its drops are in the copy)
        return out

    def _above_floors(self, ts: int, parts: list[tuple[list[RowChange], list[DdlEvent]]]
                      ) -> list[tuple[list[RowChange], list[DdlEvent]]]:
        """``parts`` of the transaction committed at ``ts`` without the rows and schema changes of the tables
        whose copy already holds them (their floor is at or above ``ts``)."""
        floors = self._floors
        for _, ddl in parts:
            for e in ddl:
                renamed = [c.new_name for c in e.changes if c.kind is DdlKind.RENAME_TABLE and c.new_name]
                if renamed and not floors.by_oid(ddl_relation_id(e)) and (
                        any(ts <= floors.named(n) for n in renamed) or ts <= floors.named(str(e.table))):
                    # a floor recorded by name only (a record stored before oids were): a table renamed inside its
                    # copy's window cannot be told apart
                    raise DdlRejected(e.query or "rename table", str(e.table),
                                      f"the table was renamed to {renamed[0]} while the initial copy ran (commit Ts "
                                      f"{ts}), so its copied rows and its streamed changes cannot be matched exactly; "
                                      f"copy it again: cdc cli changefeed snapshot --table {renamed[0]}, then skip "
                                      f"this DDL (--skip-ddl-ts {ts})", commit_ts=ts)
        of, of_ddl = floors.of, floors.of_ddl
        return [([r for r in rows if of(r.schema) < ts], [e for e in ddl if of_ddl(e) < ts]) for rows, ddl in parts]

    def _mark_replayed(self, ts: int, parts: list[tuple[list[RowChange], list[DdlEvent]]]) -> None:
        """Mark the changes of tables copied under several snapshots committed between a table's floor and its
        ceiling (:data:`cdc.events.REPLAYED`): they are replayed over rows a later snapshot's chunk may already hold
        newer, one transaction per batch (``next_batch``). A sink's net effect over several transactions assumes the
        rows were as the first found them: a key that one transaction moves a row into and a later one moves it out
        of nets to nothing, and a row a later chunk copied at that key stayed (found by a kill during a copy under key
        rotations: extra rows). One transaction at a time, every change applied by key, converges."""
        ceiling, floor = self._ceilings.of, self._floors.of
        for rows, _ in parts:
            for r in rows:
                if floor(r.schema) < ts <= ceiling(r.schema):
                    r.extra[REPLAYED] = True

    def _cut(self, t: SortedTxn) -> list[tuple[list[RowChange], list[DdlEvent]]]:
        """The transaction as (rows, then DDL) parts; the last part has no DDL."""
        if self._schema_changes is None:
            raise DecodeError(f"transaction {t.commit_ts} holds a schema change but the span has no decoder for it")
        parts: list[tuple[list[RowChange], list[DdlEvent]]] = []
        rows: list[RowChange] = []
        for p in t.payloads:
            if p[:4] == _SCHEMA_CHANGE_PREFIX:
                events = self._schema_changes(p[4:], t.commit_ts, t.commit_time)
                if events:
                    parts.append((rows, events))
                    rows = []
            else:
                rows.append(self._mount(p, t.commit_ts, t.commit_time))
        parts.append((rows, []))
        return parts
