"""Whether a window of row changes may move a value of a second unique key (a unique key of the target table besides
the key the sink upserts by) from one row to another: the test that makes the SQL sink's writer apply a table in
upstream order instead of as its net effect (``sinks.sql.ops.writer``, docs/architecture.md "Apply rules").

Why it matters: the net effect of a window is applied as deletes, key moves, in-place updates and upserts, each list
in the order its keys first appeared. A unique value freed by one row (``UPDATE u SET code = 'c9' WHERE id = 1``) and
taken by another in a later change (``INSERT INTO u VALUES (2, 'c1')``) is legal upstream in that order only; the net
effect may send the taker first (the target refuses: duplicate on ``code``), and a swap of two rows' values through a
temporary value has no order of net images at all that the target accepts.

Guarantee of :func:`moves_unique_value`: it returns False only when no row's new image in the window takes a value
of an ``others`` key that another row held downstream before the window and gave up by an UPDATE in the window
(values freed by a DELETE are safe: the window's deletes run before its other statements). With whole old images
(REPLICA IDENTITY FULL) the test is exact on the values sent; with old images holding the key only (DEFAULT) the
freed values are unknown, so it answers True whenever an UPDATE and the new image of another row share the window.
No I/O; one pass over the window's changes, run only for tables that have a second unique key.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Hashable, Sequence
from typing import Any

from cdc.events import UNCHANGED, OpType, RowChange
from sinks.sql.dialect.normalize import hashable_key, same_image


def fold_text(v: Any) -> Any:
    """A text value as a case- and accent-insensitive collation compares it (MySQL/MariaDB keys)."""
    if isinstance(v, str):
        return "".join(c for c in unicodedata.normalize("NFKD", v.casefold()) if not unicodedata.combining(c)).rstrip()
    return v


def _hkey(vals: tuple[Any, ...], fold: bool) -> Hashable:
    if fold:
        vals = tuple(map(fold_text, vals))
    try:
        hash(vals)
        return vals
    except TypeError:  # arrays: lists
        return hashable_key(vals)


def moves_unique_value(key: tuple[str, ...], others: Sequence[tuple[str, ...]], full_identity: bool,
                       names: Sequence[str] | None, rows: Sequence[Sequence[Any]], updates: Collection[int],
                       events: Sequence[RowChange], ncols: int, fold: bool, parent: bool) -> bool:
    """Whether the window (whole rows ``rows`` positional by ``names``, in-place UPDATEs at the indexes ``updates``,
    then ``events``) may move a value of a key in ``others`` between rows (module docstring). ``full_identity``: old
    images of UPDATE/DELETE are whole rows (``ncols`` columns); ``fold``: text compares case-insensitively.
    ``parent``: the table is a foreign-key parent downstream, whose key changes are applied as ``UPDATE .. SET key``
    (elsewhere a key change is a delete, run first, and an upsert: what it gives up is freed as by a DELETE)."""
    if not full_identity:
        return _may_move_without_old_values(key, names, rows, updates, events, parent)
    if updates:  # (whole-row in-place updates without their old row: not sent under FULL identity)
        return True
    freed: dict[tuple[int, Hashable], Hashable] = {}  # (unique key #, value) -> key of the row that gave it up
    taken: list[tuple[tuple[int, Hashable], Hashable]] = []
    if rows:
        assert names is not None
        kidx = [names.index(k) for k in key]
        uidx = [[names.index(c) for c in u] for u in others]
        for r in rows:
            pk = _hkey(tuple(r[i] for i in kidx), False)
            for n, idx in enumerate(uidx):
                vals = tuple(r[i] for i in idx)
                if None not in vals:
                    taken.append(((n, _hkey(vals, fold)), pk))
    DELETE = OpType.DELETE
    for ch in events:
        old = ch.old_values
        new = ch.values
        if ch.op != DELETE and new is None:
            assert ch.row is not None
            new = dict(zip(ch.schema.column_names, ch.row, strict=True))
        if ch.op == OpType.UPDATE:
            if old is None or len(old) < ncols or UNCHANGED in old.values():
                return True  # the values it gives up are unknown
            opk = _hkey(tuple(old[k] for k in key), False)
        else:
            opk = None
        assert ch.op == DELETE or new is not None
        npk = _hkey(tuple(new[k] for k in key), False) if new is not None else None
        for n, u in enumerate(others):
            nvals = tuple(new.get(c) for c in u) if new is not None else None
            if nvals is not None and opk is not None and UNCHANGED in nvals:
                assert old is not None
                nvals = tuple(old[c] if v is UNCHANGED else v for c, v in zip(u, nvals, strict=True))
            if opk is not None and (parent or opk == npk):  # an UPDATE gives up its old value (unless it keeps it)
                assert old is not None
                ovals = tuple(old[c] for c in u)
                if None not in ovals and not (ovals == nvals and opk == npk):
                    k = (n, _hkey(ovals, fold))
                    if freed.setdefault(k, opk) != opk:
                        return True  # given up by two rows: another row held it in between
            if nvals is not None and None not in nvals and UNCHANGED not in nvals:
                taken.append(((n, _hkey(nvals, fold)), npk))
            elif nvals is not None and UNCHANGED in nvals:
                return True
    return any(freed.get(k, pk) != pk for k, pk in taken)


def _may_move_without_old_values(key: tuple[str, ...], names: Sequence[str] | None, rows: Sequence[Sequence[Any]],
                                 updates: Collection[int], events: Sequence[RowChange], parent: bool) -> bool:
    """Old images hold the key only: an in-place UPDATE (or any UPDATE of a ``parent`` table) may have given up any
    value, so such an UPDATE together with the new image of another row may be a move."""
    updated = bool(updates)
    pks: set[Hashable] = set()
    if rows:
        assert names is not None
        kidx = [names.index(k) for k in key]
        for r in rows:
            pks.add(_hkey(tuple(r[i] for i in kidx), False))
    DELETE, UPDATE = OpType.DELETE, OpType.UPDATE
    for ch in events:
        op = ch.op
        if op == DELETE:
            continue
        if ch.row is not None:
            kidx = [ch.schema.column_names.index(k) for k in key]
            npk = tuple(ch.row[i] for i in kidx)
        else:
            assert ch.values is not None
            npk = tuple(ch.values[k] for k in key)
        if op == UPDATE and not updated:
            old = ch.old_values
            # (a key change with unsent columns is an ``UPDATE .. SET key`` too, ordered among the moves)
            updated = parent or old is None or tuple(old.get(k) for k in key) == npk or (
                ch.row is None and UNCHANGED in ch.values.values())
        pks.add(_hkey(npk, False))
        if updated and len(pks) > 1:
            return True
    return updated and len(pks) > 1


def deferred_key_swap(key: tuple[str, ...], ncols: int, events: Sequence[RowChange]) -> bool:
    """Whether one transaction's changes of a REPLICA IDENTITY FULL table take a key that a later change of the
    same transaction gives up from another row (``UPDATE t SET id = 3 - id`` under a DEFERRABLE key): such a
    transaction cannot be applied change by change, only as its net effect."""
    taken: dict[Hashable, dict[str, Any]] = {}
    for ch in events:
        old = ch.old_values
        if old is not None and len(old) >= ncols:
            img = taken.pop(_hkey(tuple(old[k] for k in key), False), None)
            if img is not None and not same_image(img, old):
                return True
        if ch.op != OpType.DELETE:
            new = ch.values
            if new is None:
                assert ch.row is not None
                new = dict(zip(ch.schema.column_names, ch.row, strict=True))
            taken[_hkey(tuple(new[k] for k in key), False)] = new
    return False
