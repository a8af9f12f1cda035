"""The SQL sink's writer: applies one ``write`` call's row changes on one connection.

Apply rules (docs/architecture.md, "Apply rules: normalisation and ordering"):

* Changes are collected in a *window* of whole upstream transactions. A window ends at a transaction
  boundary (``commit_ts`` changes) once the pending changes reach ``max(batch_rows, txn_rows)``, or at
  the end of the call. A single transaction larger than twice that bound is cut where it reaches it
  (sequentially correct for immediate keys); while a table with REPLICA IDENTITY FULL and a key has
  updates or deletes pending (its key may be DEFERRABLE upstream), only at 16 times the bound
  (docs/limits.md).
* At the end of a window each table's changes are collapsed to their net effect per key
  (``sinks.sql.dialect.normalize``), then applied: every delete of an old image (child tables first, by the target's
  foreign keys), then per table, parent tables first: key moves (``UPDATE .. SET key``), in-place partial
  updates, inserts/upserts of new images.
* A table with a second unique key (a target unique key besides the upserted key) whose values may move
  between its rows in the window (``sinks.sql.dialect.unique_moves``, decided once per window and table) is
  applied in upstream order instead: plain rows in runs without a repeated key, then change by change (a FULL
  identity transaction that swaps keys as its own net effect). Plain rows of such a table, flushed early or at
  the window's end, always go in those runs (a statement keeps one row per key).
* Fast path: a table that has only seen INSERTs in the window (and has no foreign-key parent among the
  target's tables, and is not a FULL-identity keyed table) keeps plain rows and sends them every
  ``batch_rows`` rows, as a sequential prefix of its changes (an INSERT's key cannot exist upstream at that
  moment, so it cannot exist downstream either).
* TRUNCATE drops the table's pending changes; consecutive TRUNCATEs of one transaction are sent as one
  statement (``TRUNCATE a, b`` on PostgreSQL; ``DELETE FROM`` each, children first, elsewhere) before the
  next change.
* A partial update (UNCHANGED columns) whose row is missing downstream is never completed with NULLs: the
  row is re-read through the sink's row source, else left out, and a ``DataWarning`` says so. So is an INSERT
  with UNCHANGED columns (a MySQL partial row image; never a plain row): its known columns are a patch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

from sqlalchemy.engine import Connection

from cdc.config import SinkConfig
from cdc.errors import SinkError
from cdc.events import UNCHANGED, OpType, RowChange, TableSchema, parsed_rows
from cdc.model import DataWarning, WarningSeverity
from sinks.base import RowSource
from sinks.sql.dialect.normalize import (
    Image,
    KeyedNet,
    KeylessNet,
    hashable_key,
    normalize_keyed,
    normalize_keyless,
    same_image,
)
from sinks.sql.dialect.statements import Statements
from sinks.sql.dialect.unique_moves import deferred_key_swap, moves_unique_value
from sinks.sql.ops.fresh_load import FreshLoads
from sinks.sql.ops.output import Output, distinct_keys
from sinks.sql.target.binding import (
    K_DELETE,
    K_DELETE_ONE,
    K_INSERT,
    K_UPDATE_ONE,
    K_UPSERT,
    Binding,
)
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.pipeline import Pipeline

log = logging.getLogger(__name__)

MISSING_ROW = "CDC:WarnMissingRow"


class TableBuf:
    """A table's pending changes in the current window: plain INSERT rows (``names``/``rows``/``texts``)
    while nothing else came, then every further change in ``events``."""

    __slots__ = ("b", "names", "rows", "texts", "updates", "events", "early")

    def __init__(self, b: Binding, early: bool) -> None:
        self.b = b
        self.names: tuple[str, ...] | None = None
        self.rows: list[tuple[Any, ...]] = []
        self.texts: list[Any] | None = []  # RowChange.row_text of each row while every row has one
        self.updates: list[int] = []  # indexes of ``rows`` that came from in-place UPDATEs (all columns sent)
        self.events: list[RowChange] | None = None
        self.early = early  # rows may be sent before the window ends

    def size(self) -> int:
        return len(self.rows) + (len(self.events) if self.events is not None else 0)

    def reset(self) -> None:
        self.names = None
        self.rows = []
        self.texts = []
        self.updates = []
        self.events = None


class Writer:
    """Applies one ``write`` call on one connection (rules in the module docstring).

    Tables are bound through ``catalog`` (its foreign keys order them); statements go out through an
    :class:`Output` on ``conn`` and ``pipeline``. ``row_source`` re-reads rows that a partial update misses
    downstream (None: none); ``warn`` receives the data warnings. ``current`` names the table being written, or
    whose statement failed, for the caller's error message."""

    def __init__(self, conn: Connection, stmts: Statements, catalog: Catalog, pipeline: Pipeline, config: SinkConfig,
                 row_source: RowSource | None, warn: Callable[[DataWarning], None],
                 loads: FreshLoads | None = None) -> None:
        self.conn = conn
        self.catalog = catalog
        self.batch = max(1, config.batch_rows)
        self.out = Output(conn, stmts, pipeline, self.batch, loads=loads)
        self.row_source = row_source
        self.warn = warn
        self._win: dict[str, TableBuf] = {}  # by downstream table (label), in order of first change
        self._truncs: list[Binding] = []  # TRUNCATEs of the current transaction not sent yet
        self._cascade = False  # one of them had CASCADE upstream
        self._bound = max(self.batch, config.txn_rows)  # a window ends at a transaction boundary past this many changes
        # after a cut inside the current transaction: new images of FULL-identity keyed tables written
        self._flushed_full: dict[str, dict[Any, dict[str, Any]]] = {}

    @property
    def current(self) -> str | None:
        return self.out.current

    @current.setter
    def current(self, table: str | None) -> None:
        self.out.current = table

    # ---- intake --------------------------------------------------------------------------------------
    def run(self, changes: Iterable[RowChange]) -> int:
        """Apply ``changes``; returns their count once every statement has executed (the caller commits).
        On any error the pipeline is idle when this raises, and a failed statement's error wins over a
        later error of the caller's thread (it came first), with ``current`` naming its table."""
        out = self.out
        try:
            count = self._run(changes)
            out.sync()
            return count
        except BaseException as exc:
            error = out.pipe.quiesce()  # nothing runs on the connection when the caller rolls back
            if error is not None and isinstance(exc, Exception):
                out.current = error[1]
                raise error[0]  # noqa: B904 - the earlier failure; the caller's error stays as its context
            raise
        finally:
            out.close()

    def _buf(self, b: Binding, truncate: bool) -> TableBuf:
        buf = self._win.get(b.label)
        if buf is not None and buf.b is not b:
            old = buf.b.schema
            if truncate or not (buf.rows or buf.events) or (
                    old.columns == b.schema.columns and old.key == b.schema.key
                    and old.replica_identity == b.schema.replica_identity):
                buf.b = b  # the same columns (a Relation message sent again, e.g. after a TRUNCATE)
                return buf
            self._emit_window()  # another column set mid-window: apply what came before
            buf = None
        if buf is None:
            early = not (b.keyed and b.schema.replica_identity == "f") and not self.catalog.fk.has_parents(b.label)
            buf = self._win[b.label] = TableBuf(b, early)
        return buf

    def _run(self, changes: Iterable[RowChange]) -> int:
        # Once per change, so every step counts (docs/benchmarks.md, "the SQL writer's per-change loop"). The window's
        # state lives in locals: ``pending`` (changes in the window), ``cut_at`` (where one transaction is cut),
        # ``truncs`` (TRUNCATEs wait in ``self._truncs``); each ``_emit_window`` resets them (the one ``_buf`` runs on
        # another column set too: ``self._win`` is then another dict). The methods called here read none of them.
        count = 0
        last_ts: int | None = None
        last_schema: Any = None
        b = cast(Binding, None)  # (set by the first change: last_schema is None)
        buf = cast(TableBuf, None)
        batch = self.batch
        bound = self._bound
        first_cut = 2 * bound  # pending changes at which one transaction is cut
        cut_at = first_cut  # 16 * bound while a FULL-identity keyed table has updates/deletes pending
        pending = 0
        truncs = False
        out = self.out
        INSERT, UPDATE, DELETE, TRUNCATE = OpType.INSERT, OpType.UPDATE, OpType.DELETE, OpType.TRUNCATE
        # the window's tables by schema object: a change of another table than the one before (every row of a
        # pgbench-like transaction) finds its name, binding and buffer without str(), bind() and _buf(). Cleared with
        # the window; valid while the buffer is still that binding's. An entry holds its schema, so no other schema
        # takes its id while it is there.
        known: dict[int, tuple[str, Binding, TableBuf, TableSchema]] = {}
        for ch in changes:
            count += 1
            ts = ch.commit_ts
            if ts != last_ts:
                if self._flushed_full:
                    self._flushed_full = {}
                if truncs:
                    self._emit_truncates()
                    truncs = False
                if pending >= bound:
                    self._emit_window()
                    pending, cut_at, last_schema = 0, first_cut, None
                    known.clear()
                last_ts = ts
            elif pending >= cut_at:  # one huge transaction
                self._emit_window(cut=True)
                pending, cut_at, truncs, last_schema = 0, first_cut, False, None
                known.clear()
            schema = ch.schema
            if schema is not last_schema:
                hit = known.get(id(schema))
                if hit is not None and hit[2].b is hit[1]:
                    out.current, b, buf, _ = hit
                else:
                    name = out.current = str(schema.name)
                    b = self.catalog.bind(schema, self.conn, out.sync)
                    win = self._win
                    buf = self._buf(b, ch.op is TRUNCATE)
                    if self._win is not win:  # (_buf applied the window before another column set)
                        pending, cut_at, truncs = 0, first_cut, False
                        known.clear()
                    known[id(schema)] = (name, b, buf, schema)
                last_schema = schema
            op = ch.op
            if op is TRUNCATE:
                pending -= buf.size()
                buf.reset()
                if all(t.label != b.label for t in self._truncs):
                    self._truncs.append(b)
                self._cascade = self._cascade or bool(ch.extra.get("truncate_options", 0) & 1)
                truncs = True
                continue
            if truncs:
                self._emit_truncates()
                truncs = False
            pending += 1
            row = ch.row  # (maybe a deferred row: a group sent by its text never parses it)
            # whole rows, kept as they are: an INSERT, an in-place UPDATE of a keyed table with every column (``row``
            # without an old row), or every column and its whole old row with the key unchanged (a MySQL full image)
            if buf.events is None and (
                    (op is INSERT and (row is not None or UNCHANGED not in (ch.values or {}).values()))
                    or (op is UPDATE and b.keyed and (
                        (row is not None and ch.old_values is None) or _whole_in_place(ch, b)))):
                if row is not None:  # positional: every column, in schema order (see RowChange.row)
                    names = b.names
                    text = ch.row_text
                else:
                    vals = ch.values
                    assert vals is not None
                    names = tuple(vals)
                    row = tuple(vals.values())
                    text = None
                rows = buf.rows
                if buf.names is not names:
                    if rows and buf.names != names:
                        buf.events = [ch]  # another column set: normalised with the rest
                        continue
                    buf.names = names
                if op is UPDATE:
                    buf.updates.append(len(rows))
                rows.append(row)
                texts = buf.texts
                if texts is not None:
                    if text is None:
                        buf.texts = None
                    else:
                        texts.append(text)
                if len(rows) >= batch and buf.early:
                    pending -= len(rows)
                    self._flush_rows(buf)
            elif op is INSERT or op is UPDATE or op is DELETE:
                if self._flushed_full and op is not INSERT and b.label in self._flushed_full:
                    self._check_cut(b, ch)
                if buf.events is None:
                    buf.events = []
                    if b.keyed and b.schema.replica_identity == "f":
                        cut_at = 16 * bound
                buf.events.append(ch)
            else:
                raise SinkError(f"table {b.label}: unknown operation {op!r}")
        self._emit_window()
        return count

    def _flush_rows(self, buf: TableBuf) -> None:
        """Send a table's plain INSERT rows now (a sequential prefix of its changes)."""
        rows, texts, fresh = buf.rows, buf.texts, not buf.updates
        buf.rows, buf.texts, buf.updates = [], [], []
        b = buf.b
        assert buf.names is not None
        if b.keyed:
            self._upsert_in_order(b, buf.names, rows, texts, fresh)
        else:
            self.out.apply(b, K_INSERT, buf.names, None, rows, texts)

    def _upsert_in_order(self, b: Binding, names: tuple[str, ...], rows: list[tuple[Any, ...]],
                         texts: list[Any] | None, fresh: bool = False) -> None:
        """Upsert whole rows as the sequence they are. A statement keeps only the last row of a key (ON CONFLICT
        touches a row once), which is its net effect; for a table with a second unique key, whose values may move
        between rows, the rows go in runs without a repeated key instead (each run in order: the target checks
        each row's unique keys after the rows before it in the statement). ``fresh``: every row is an upstream
        INSERT (no in-place UPDATE among them), so the target most likely lacks their keys (``Output.apply``)."""
        if not b.other_uniques or len(rows) < 2:
            self.out.apply(b, K_UPSERT, names, None, rows, texts, fresh=fresh)
            return
        kidx = [names.index(k) for k in b.key]
        seen: set[Any] = set()
        start = 0
        for i, r in enumerate(rows):
            k = _freeze_key(tuple(r[j] for j in kidx))
            if k in seen:
                self.out.apply(b, K_UPSERT, names, None, rows[start:i],
                               texts[start:i] if texts is not None else None)
                seen = set()
                start = i
            seen.add(k)
        self.out.apply(b, K_UPSERT, names, None, rows[start:], texts[start:] if texts is not None else None)

    # ---- a window's net effect -----------------------------------------------------------------------
    def _emit_truncates(self) -> None:
        """One statement for the TRUNCATEs of one transaction (children first where they become deletes)."""
        tables = self.catalog.fk.order([b.label for b in self._truncs])
        by_label = {b.label: b for b in self._truncs}
        self._truncs = []
        bs = [by_label[t] for t in tables]
        cascade, self._cascade = self._cascade, False
        self.out.truncate(bs, cascade)

    def _check_cut(self, b: Binding, ch: RowChange) -> None:
        """After a cut inside this transaction, a "-" of a FULL-identity keyed table whose key was written
        as a new image before the cut must remove exactly that image; otherwise it removes the row that
        image overwrote (a deferred key swap split by the cut), which is gone downstream: refuse."""
        old = ch.old_values
        if old is None or len(old) < b.ncols:
            return
        flushed = self._flushed_full[b.label]
        key = _freeze_key(tuple(old[k] for k in b.key))
        img = flushed.get(key)
        if img is None:
            return
        if not same_image(img, old):
            raise SinkError(
                f"table {b.label}: a transaction of more than {16 * self._bound} changes moves keys of a table "
                "with REPLICA IDENTITY FULL (a DEFERRABLE key) in a way that cannot be applied in parts; raise "
                "sink.txn-rows above the transaction's size (docs/limits.md)")
        del flushed[key]

    def _remember_flushed(self, b: Binding, buf: TableBuf, net: KeyedNet | KeylessNet | None) -> None:
        """A cut inside a transaction: the new images of FULL-identity keyed tables it wrote."""
        flushed = self._flushed_full.setdefault(b.label, {})
        if net is None:
            assert buf.names is not None
            kidx = [buf.names.index(k) for k in b.key]
            for r in buf.rows:
                flushed[_freeze_key(tuple(r[i] for i in kidx))] = dict(zip(buf.names, r, strict=True))
        elif isinstance(net, KeyedNet):
            for img in net.upserts + [img for _, img in net.moves]:
                flushed[_freeze_key(tuple(img.values[k] for k in b.key))] = img.values

    def _emit_window(self, cut: bool = False) -> None:
        if self._truncs:
            self._emit_truncates()
        bufs = {label: buf for label, buf in self._win.items() if buf.rows or buf.events}
        self._win = {}  # (a new dict: ``_run`` sees that a window was applied)
        if not bufs:
            return
        order = [bufs[label] for label in self.catalog.fk.order(list(bufs))]  # parents first
        nets: list[tuple[TableBuf, KeyedNet | KeylessNet | None, list[tuple[Any, Image]], bool]] = []
        for buf in order:
            b = buf.b
            if buf.events is None:
                nets.append((buf, None, [], False))
                continue
            self.out.current = b.label
            buf.rows = parsed_rows(buf.rows)  # (the net effect compares typed values)
            if b.keyed:
                net: KeyedNet | KeylessNet = normalize_keyed(
                    b.names, b.key, b.schema.replica_identity == "f", buf.names, buf.rows, buf.texts, buf.events,
                    buf.updates)
                moves: list[tuple[Any, Image]] = []
                parent = self.catalog.fk.is_parent(b.label)
                for old, img in net.moves:
                    if parent or (img.src == old and img.partial):
                        moves.append((old, img))
                    else:
                        net.deletes.append(old)
                        net.upserts.append(img)
                sequential = any(img.src is not None and img.partial for img in net.upserts) or (
                    bool(b.other_uniques) and moves_unique_value(
                        b.key, b.other_uniques, b.schema.replica_identity == "f", buf.names, buf.rows, buf.updates,
                        buf.events, b.ncols, self.out.dialect == "mysql", parent))
                nets.append((buf, net, moves, sequential))
            else:
                try:
                    net = normalize_keyless(b.names, buf.names, buf.rows, buf.texts, buf.events)
                except ValueError:
                    raise SinkError(f"table {b.label} has no key and an UPDATE or DELETE came without its old "
                                    "row (set REPLICA IDENTITY FULL upstream)") from None
                nets.append((buf, net, [], False))
        if cut:
            for buf, net, _, _ in nets:
                if buf.b.keyed and buf.b.schema.replica_identity == "f":
                    self._remember_flushed(buf.b, buf, net)
        early = self._split_child_updates(nets)
        for buf, net, _moves, sequential in reversed(nets):  # deletes: children first
            if net is None or sequential:
                continue
            b = buf.b
            if isinstance(net, KeyedNet):
                if net.deletes:
                    self.out.apply(b, K_DELETE, b.key, None, net.deletes, None)
                if b.label in early:
                    self._apply_updates(b, *early[b.label])
            elif net.deletes:
                groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
                for old in net.deletes:
                    match, nulls, mrow = _match_parts(old)
                    groups.setdefault((match, nulls), []).append(mrow)
                for (match, nulls), rows in groups.items():
                    self.out.apply(b, K_DELETE_ONE, match, ((), nulls), rows, None)
        for buf, net, moves, sequential in nets:  # new images: parents first
            b = buf.b
            if net is None:
                assert buf.names is not None
                if b.keyed:
                    self._upsert_in_order(b, buf.names, buf.rows, buf.texts, not buf.updates)
                else:
                    self.out.apply(b, K_INSERT, buf.names, None, buf.rows, buf.texts)
            elif sequential:
                self._apply_sequential(buf)
            elif isinstance(net, KeyedNet):
                if moves:
                    self._apply_moves(b, moves)
                self._apply_updates(b, net.patches, net.updates)
                partial = [img for img in net.upserts if img.partial]  # (only from inconsistent streams)
                if partial:
                    self._apply_patches(b, [dict(zip(*img.defined(), strict=True)) for img in partial])
                self._apply_images(b, K_UPSERT, [img for img in net.upserts if not img.partial])
            else:
                for vals, old in net.updates:
                    match, nulls, mrow = _match_parts(old)
                    names = tuple(k for k, v in vals.items() if v is not UNCHANGED)
                    self.out.apply(b, K_UPDATE_ONE, names, (match, nulls), [tuple(vals[k] for k in names) + mrow], None)
                self._apply_images(b, K_INSERT, net.inserts)

    def _apply_updates(self, b: Binding, patches: list[dict[str, Any]], updates: list[Image]) -> None:
        """In-place updates of rows that existed before the window: partial ones, then complete ones."""
        if patches:
            self._apply_patches(b, patches)
        self._apply_images(b, K_UPSERT, updates)

    def _split_child_updates(self, nets: list[Any]) -> dict[str, tuple[list[dict[str, Any]], list[Image]]]:
        """The in-place updates of child tables to apply right after the child's deletes, before its parents'
        deletes (a reference moved away from a parent row that then goes): every one except those that
        reference a parent row new in this window, which wait for the parent's inserts (they are left in
        the net). Without column information for a foreign key whose parent has new rows, all wait."""
        fk = self.catalog.fk
        out: dict[str, tuple[list[dict[str, Any]], list[Image]]] = {}
        bufs = {buf.b.label: (buf, net, moves) for buf, net, moves, _ in nets}
        new_keys: dict[str, set[Any]] = {}

        def parent_new(label: str) -> set[Any]:
            keys = new_keys.get(label)
            if keys is None:
                buf, net, moves = bufs[label]
                keys = new_keys[label] = set()
                if net is None:
                    assert buf.names is not None
                    kidx = [buf.names.index(k) for k in buf.b.key]
                    keys.update(_freeze_key(tuple(r[i] for i in kidx)) for r in buf.rows)
                elif isinstance(net, KeyedNet):
                    for img in net.upserts + [i for _, i in moves]:
                        keys.add(_freeze_key(tuple(img.values[k] for k in buf.b.key)))
                elif net.inserts:
                    keys.add(None)  # a table without a key: unknown, treat every reference as new
            return keys

        for buf, net, _, seq in nets:
            label = buf.b.label
            if not isinstance(net, KeyedNet) or seq or not (net.patches or net.updates) or not fk.has_parents(label):
                continue
            growing = [p for p in fk.parents[label] if p in bufs and parent_new(p)]
            if not growing:
                out[label] = (net.patches, net.updates)
                net.patches, net.updates = [], []
                continue
            upstream = {t: u for u, t in buf.b.colmap.items()}
            checks = []
            for parent, ccols, pcols in fk.references(label):
                if parent not in growing:
                    continue
                pkey = bufs[parent][0].b.table.key
                if set(pcols) != set(pkey) or not all(c in upstream for c in ccols) or None in parent_new(parent):
                    checks = None
                    break
                by_p = dict(zip(pcols, ccols, strict=True))
                checks.append((tuple(upstream[by_p[k]] for k in pkey), parent_new(parent)))
            if checks is None or len({p for p, _, _ in fk.references(label) if p in growing}) < len(growing):
                continue  # a growing parent without column information: every update waits

            def late(vals: dict[str, Any], checks: list[tuple[tuple[str, ...], set[Any]]] = checks) -> bool:
                for cols, keys in checks:
                    ref = tuple(vals.get(c, UNCHANGED) for c in cols)
                    if UNCHANGED not in ref and None not in ref and _freeze_key(ref) in keys:
                        return True
                return False

            early_p = [p for p in net.patches if not late(p)]
            early_u = [u for u in net.updates if not late(u.values)]
            out[label] = (early_p, early_u)
            net.patches = [p for p in net.patches if late(p)]
            net.updates = [u for u in net.updates if late(u.values)]
        return out

    def _apply_images(self, b: Binding, kind: int, images: list[Image]) -> None:
        """Upsert/insert images, one statement group per column set (positional rows keep their texts)."""
        groups: dict[tuple[str, ...], tuple[list[tuple[Any, ...]], list[Any] | None]] = {}
        for img in images:
            names, row = img.defined()
            g = groups.get(names)
            if g is None:
                g = groups[names] = ([], [])
            g[0].append(row)
            texts = g[1]
            if texts is not None:
                if img.text is None or img.row is not row:
                    groups[names] = (g[0], None)
                else:
                    texts.append(img.text)
        for names, (rows, texts) in groups.items():
            self.out.apply(b, kind, names, None, rows, texts)

    # ---- key moves, partial updates, missing rows (synchronous: they read results) -------------------
    def _apply_moves(self, b: Binding, moves: list[tuple[Any, Image]]) -> None:
        """Rows whose key changed and nothing else happened to either key: ``UPDATE .. SET key = new ..
        WHERE key = old`` (so ON UPDATE CASCADE downstream acts, and unsent columns stay). When the new key
        already exists downstream (a replay) the old row is deleted and the image upserted instead."""
        out = self.out
        out.sync()
        out.current = b.label
        for old, img in moves:
            names, row = img.defined()
            new_key = tuple(img.values[k] for k in b.key)
            if out.exists(b, new_key):
                out.delete_key(b, tuple(old))
                self._upsert_or_patch(b, img, names, row)
                continue
            plan = b.plan(K_UPSERT, names, None)
            values = plan.convert(row) if plan.convert else row
            sets = [b.colmap[n] for n in names]
            if not out.update_key(b, sets, values, tuple(old)):  # the old row is missing downstream
                self._upsert_or_patch(b, img, names, row)

    def _upsert_or_patch(self, b: Binding, img: Image, names: tuple[str, ...], row: tuple[Any, ...]) -> None:
        if not img.partial and len(names) >= b.ncols:
            self.out.apply(b, K_UPSERT, names, None, [row], None)
            self.out.sync()
        else:
            self._apply_patches(b, [dict(zip(names, row, strict=True))])

    def _apply_patches(self, b: Binding, patches: list[dict[str, Any]]) -> None:
        """In-place partial updates (UNCHANGED columns left out) of rows that existed before the window.
        Rows missing downstream are never inserted with NULLs in place of the unsent columns: see
        :meth:`_missing`."""
        groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
        for p in patches:
            groups.setdefault(tuple(p), []).append(tuple(p.values()))
        for names, all_rows in groups.items():
            kidx = [names.index(k) for k in b.key]
            for i in range(0, len(all_rows), self.batch):
                self._patch_rows(b, names, kidx, all_rows[i:i + self.batch])

    def _patch_rows(self, b: Binding, names: tuple[str, ...], kidx: list[int], rows: list[tuple[Any, ...]]) -> None:
        keys = distinct_keys([tuple(r[i] for i in kidx) for r in rows])
        if self.out.count_existing(b, [self.out.key_params(b, k) for k in keys]) < len(keys):
            present = {k: self.out.exists(b, k) for k in keys} if _hashable_keys(keys) else None
            if present is None:  # array keys
                missing = [k for k in keys if not self.out.exists(b, k)]
                rows = [r for r in rows if tuple(r[i] for i in kidx) not in missing]
            else:
                missing = [k for k, p in present.items() if not p]
                rows = [r for r in rows if present[tuple(r[i] for i in kidx)]]
            self._missing(b, missing)
        if rows:
            self.out.apply(b, K_UPSERT, names, None, rows, None)
            self.out.sync()

    def _missing(self, b: Binding, keys: list[tuple[Any, ...]]) -> None:
        """Partial updates whose row is missing downstream: write the current upstream row when the sink
        has a row source (None from it: the row is gone upstream too, a later delete converges), and
        record a warning either way."""
        if not keys:
            return
        source = self.row_source
        shown = tuple(str(k[0] if len(k) == 1 else k) for k in keys[: DataWarning.MAX_KEYS])
        table = str(b.schema.name)
        if source is None:
            self.warn(DataWarning(
                MISSING_ROW, table, f"{len(keys)} updated row(s) missing downstream were not written: the update "
                "did not carry every column (unchanged TOAST values, a MySQL partial row image) and no upstream row "
                "source is set",
                WarningSeverity.DIVERGENCE, len(keys), shown))
            return
        fetched = source(b.schema, keys)
        rows = [tuple(r.get(n) for n in b.names) for r in fetched if r is not None]
        if rows:
            self.out.apply(b, K_UPSERT, b.names, None, rows, None)
            self.out.sync()
        self.warn(DataWarning(
            MISSING_ROW, table, f"{len(keys)} updated row(s) were missing downstream; {len(rows)} re-read from the "
            "upstream and written (the others are gone upstream)", WarningSeverity.NOTICE, len(keys), shown))

    def _apply_sequential(self, buf: TableBuf) -> None:
        """A table applied in upstream order instead of as the window's net effect: change by change, which is
        correct because its keys are immediate upstream. Taken when its new images need unsent columns of
        downstream rows that the window also replaces (key rotations of rows with unchanged TOAST values, replica
        identity DEFAULT), or when a value of a second unique key may move between its rows in the window
        (``sinks.sql.dialect.unique_moves``). The whole rows that came first go in runs without a repeated key
        (:meth:`_upsert_in_order`). A REPLICA IDENTITY FULL table's key may be DEFERRABLE upstream: a transaction
        whose changes take a key another row gives up later in it (a statement-level key swap) is applied as its
        own net effect; if that transaction also moves a second unique value between rows, no order is known
        that the target accepts and the write fails naming the table (docs/limits.md)."""
        b = buf.b
        self.out.current = b.label
        if buf.rows:
            assert buf.names is not None
            self._upsert_in_order(b, buf.names, buf.rows, buf.texts)
        events = buf.events or ()
        full = b.keyed and b.schema.replica_identity == "f"
        parent = self.catalog.fk.is_parent(b.label)
        i, n = 0, len(events)
        while i < n:
            j = i + 1
            if full:  # one transaction at a time
                ts = events[i].commit_ts
                while j < n and events[j].commit_ts == ts:
                    j += 1
                txn = events[i:j]
                if len(txn) > 1 and deferred_key_swap(b.key, b.ncols, txn):
                    if b.other_uniques and moves_unique_value(b.key, b.other_uniques, True, None, (), (), txn,
                                                              b.ncols, self.out.dialect == "mysql", parent):
                        raise SinkError(
                            f"table {b.label}: one upstream transaction (commit {ts}) both swaps keys (a DEFERRABLE "
                            "key) and moves a value of a second unique key between rows; it cannot be applied "
                            "change by change nor as its net effect (docs/limits.md)")
                    self.out.sync()
                    self._apply_net_in_order(b, normalize_keyed(b.names, b.key, True, None, (), None, txn))
                    i = j
                    continue
            for ch in events[i:j]:
                self.out.sync()
                self._apply_net_in_order(b, normalize_keyed(b.names, b.key, False, None, (), None, [ch]))
            i = j
        self.out.sync()

    def _apply_net_in_order(self, b: Binding, net: KeyedNet) -> None:
        """One change's (or one transaction's) net effect: deletes (with the old keys of moves that become delete +
        upsert), key moves, updates, upserts."""
        deletes, moves, upserts = list(net.deletes), [], []
        parent = self.catalog.fk.is_parent(b.label)
        for old, img in net.moves:
            if img.partial or parent:
                moves.append((old, img))
            else:
                deletes.append(old)
                upserts.append(img)
        if deletes:
            self.out.apply(b, K_DELETE, b.key, None, deletes, None)
        if moves:
            self._apply_moves(b, moves)
        self._apply_updates(b, net.patches, net.updates)
        self._apply_images(b, K_UPSERT, upserts + [i for i in net.upserts if not i.partial])
        for img in net.upserts:
            if img.partial:  # the row it came from is gone downstream
                self._missing(b, [tuple(img.values[k] for k in b.key)])


def _match_parts(old: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Any, ...]]:
    """Split an old row into (non-NULL column names, NULL column names, non-NULL values); skips UNCHANGED."""
    names, nulls, values = [], [], []
    for k, v in old.items():
        if v is UNCHANGED:
            continue
        if v is None:
            nulls.append(k)
        else:
            names.append(k)
            values.append(v)
    return tuple(names), tuple(nulls), tuple(values)



_freeze_key = hashable_key


def _hashable_keys(keys: list[tuple[Any, ...]]) -> bool:
    try:
        hash(tuple(keys))
        return True
    except TypeError:
        return False


def _whole_in_place(ch: RowChange, b: Binding) -> bool:
    """An UPDATE of keyed ``b`` (not REPLICA IDENTITY FULL, whose old images name the row they replace) that
    carries every new value and an old row with the same key: applied as a whole in-place row, exactly as an
    UPDATE without an old row (its other old values say nothing the new row does not). A positional ``row`` (a MySQL
    update's, with its upstream text) holds every value, in ``b.names`` order."""
    old = ch.old_values
    if old is None or b.schema.replica_identity == "f":
        return False
    row = ch.row
    if row is not None:
        for k, i in zip(b.key, b.key_pos, strict=True):  # noqa: SIM110 - no generator per row
            if old.get(k, UNCHANGED) != row[i]:
                return False
        return True
    vals = ch.values
    if vals is None or len(vals) < len(b.schema.columns):
        return False
    for k in b.key:
        v = vals.get(k, UNCHANGED)
        if v is UNCHANGED or old.get(k, UNCHANGED) != v:
            return False
    return UNCHANGED not in vals.values()
