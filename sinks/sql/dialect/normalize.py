"""Net effect of a window of row changes on one table (pure functions, no I/O).

A *window* is a run of whole upstream transactions (see ``sinks.sql.ops.writer``). Applying its changes one by
one as "delete old key, upsert new key" loses rows when keys swap or rotate (``UPDATE t SET id = 3 - id``
with a DEFERRABLE key, or a rotation through a temporary key in several statements). Instead each key is
collapsed to its net effect, and the writer applies every delete of an old image before any insert of a
new image (the normalisation RisingWave describes for ordered change streams).

Keyed tables, per key, events in upstream order (a key-changing UPDATE is "-old key" then "+new key"; an
UPDATE keeping its key is an in-place update; INSERT is "+"; DELETE is "-"). State per key: whether the row
that existed before the window was removed (``pre_removed``), the images added in the window (``live``,
normally at most one) and a pending in-place patch of the pre-existing row.

* "+" appends an image to ``live``.
* "-" with a full old image (REPLICA IDENTITY FULL) removes the live image equal to it; if none is equal it
  removed the pre-existing row (a deferred statement-level swap: key 2 gets "+A" then "-B"). Without a full
  old image it removes the last live image, else the pre-existing row.
* An in-place update merges into the last live image (UNCHANGED columns filled from it), else into the patch.
* A key change's new image takes its UNCHANGED columns from the event's full old image, else from what the
  "-" removed: a live image (its values), or the pre-existing row (the patch, and for the rest the downstream
  row at the old key: ``Image.src``, read by the writer before it deletes anything).

Result per key: DELETE (pre_removed, no live) / DELETE then INSERT (pre_removed and live) / UPSERT (live, not
pre_removed) / in-place patch (no live, not removed; partial columns stay partial). A key whose pre-existing
row was removed and whose new image came from that row moved from one key to another and nothing else
happened to either key: that is reported as a *move* (the writer may apply it as ``UPDATE .. SET key``).

Tables without a key (REPLICA IDENTITY FULL): the multiset net effect of full row images (an update is
"-old +new", the new image's UNCHANGED columns filled from the old one); deletes of one matching row each
come before inserts.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.events import UNCHANGED, OpType, RowChange

Key = tuple[Any, ...]


def freeze(v: Any) -> Any:
    """A hashable stand-in for a value (lists and dicts of JSON/array values)."""
    if isinstance(v, list):
        return tuple(freeze(x) for x in v)
    if isinstance(v, dict):
        return ("\0dict", tuple(sorted((k, freeze(x)) for k, x in v.items())))
    return v


def hashable_key(key: Key) -> Any:
    try:
        hash(key)
        return key
    except TypeError:
        return freeze(list(key))


class Image:
    """A row image added in the window: positional (``names``/``row``/``text`` of an untouched INSERT) or a
    dict (``values``, may hold UNCHANGED); ``src``: key of the pre-window downstream row that holds its
    UNCHANGED columns; ``moved_from``: the pre-existing key this row moved from (through any chain)."""

    __slots__ = ("names", "row", "text", "_values", "src", "moved_from")

    def __init__(self, names: tuple[str, ...] | None = None, row: tuple[Any, ...] | None = None, text: Any = None,
                 values: dict[str, Any] | None = None, src: Key | None = None, moved_from: Key | None = None) -> None:
        self.names = names
        self.row = row
        self.text = text
        self._values = values
        self.src = src
        self.moved_from = moved_from

    @property
    def values(self) -> dict[str, Any]:
        if self._values is None:
            assert self.names is not None and self.row is not None
            self._values = dict(zip(self.names, self.row, strict=True))
        return self._values

    def defined(self) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """(column names, values) without the UNCHANGED columns."""
        if self._values is None and self.row is not None:
            assert self.names is not None
            return self.names, self.row
        vals = self.values
        if UNCHANGED not in vals.values():  # (a whole image, e.g. MySQL's: no per-column loop)
            return tuple(vals), tuple(vals.values())
        names = tuple(k for k, v in vals.items() if v is not UNCHANGED)
        return names, tuple(vals[k] for k in names)

    @property
    def partial(self) -> bool:
        return self._values is not None and UNCHANGED in self._values.values()

    def __repr__(self) -> str:
        return f"Image({self.values!r}, src={self.src!r}, moved_from={self.moved_from!r})"


class _KeyState:
    __slots__ = ("key", "pre_removed", "live", "patch")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.pre_removed = False
        self.live: list[Image] = []
        self.patch: Image | None = None  # in-place changes of the pre-existing row (dict of sent columns)


@dataclass
class KeyedNet:
    """The net effect of a window on a keyed table, each list in the order keys first appeared.

    ``deletes``: keys whose pre-window row goes (before any insert). ``moves``: (old key, image) whose row
    moved from ``old key`` (not in ``deletes``: apply as ``UPDATE .. SET key .. WHERE key = old`` or as
    delete + upsert). ``patches``: partial in-place updates of pre-window rows (dicts of the sent columns,
    key included). ``updates``: complete in-place updates of pre-window rows (applied as upserts).
    ``upserts``: new images (partial ones carry ``src``)."""

    deletes: list[Key] = field(default_factory=list)
    moves: list[tuple[Key, Image]] = field(default_factory=list)
    patches: list[dict[str, Any]] = field(default_factory=list)
    updates: list[Image] = field(default_factory=list)
    upserts: list[Image] = field(default_factory=list)


def _fill(new: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``new`` with its UNCHANGED columns taken from ``base`` where ``base`` has them."""
    if UNCHANGED not in new.values():
        return new
    return {k: (base.get(k, UNCHANGED) if v is UNCHANGED else v) for k, v in new.items()}


def same_image(img: dict[str, Any], old: dict[str, Any]) -> bool:
    """The image equals a full old image on every column both know."""
    for k, v in old.items():
        if v is UNCHANGED:
            continue
        w = img.get(k, UNCHANGED)
        if w is not UNCHANGED and w != v:
            return False
    return True


def normalize_keyed(names: tuple[str, ...], key: tuple[str, ...], full_identity: bool,
                    prefix_names: tuple[str, ...] | None, prefix_rows: Sequence[tuple[Any, ...]],
                    prefix_texts: Sequence[Any] | None, events: Sequence[RowChange],
                    prefix_updates: Collection[int] = ()) -> KeyedNet:
    """Net effect of ``prefix_rows`` (whole rows that came first, positional by ``prefix_names``: INSERTs,
    and in-place UPDATEs at the indexes in ``prefix_updates``) followed by ``events`` on a table keyed by
    ``key``. ``full_identity``: old images of UPDATE/DELETE are whole rows."""
    states: dict[Any, _KeyState] = {}
    ncols = len(names)
    all_kidx = [names.index(k) for k in key]

    def state(k: Key) -> _KeyState:
        try:
            st = states.get(k)
        except TypeError:  # array keys
            return state_slow(k)
        if st is None:
            st = states[k] = _KeyState(k)
        return st

    def state_slow(k: Key) -> _KeyState:
        hk = hashable_key(k)
        st = states.get(hk)
        if st is None:
            st = states[hk] = _KeyState(k)
        return st

    def set_row(st: _KeyState, img: Image) -> None:
        """A complete in-place update (every column sent, key unchanged)."""
        if st.live:
            img.moved_from = st.live[-1].moved_from
            st.live[-1] = img
        elif st.pre_removed:  # an update of a row removed in the window cannot happen upstream: keep it
            st.live.append(img)
        else:
            st.patch = img

    if prefix_rows:
        assert prefix_names is not None
        kidx = [prefix_names.index(k) for k in key]
        texts = prefix_texts if prefix_texts is not None and len(prefix_texts) == len(prefix_rows) else None
        updates = set(prefix_updates)
        for i, row in enumerate(prefix_rows):
            img = Image(prefix_names, row, texts[i] if texts is not None else None)
            st = state(tuple(row[j] for j in kidx))
            if i in updates:
                set_row(st, img)
            else:
                st.live.append(img)

    def remove(st: _KeyState, full_old: dict[str, Any] | None) -> tuple[dict[str, Any], Key | None, Key | None]:
        """Apply "-" to a key; return (known values of the removed row, key of the downstream row holding
        the rest, key it had before the window)."""
        if full_old is not None:
            for i, img in enumerate(st.live):
                if same_image(img.values, full_old):
                    del st.live[i]
                    return img.values, img.src, img.moved_from
            st.pre_removed = True
            st.patch = None
            return full_old, None, st.key
        if st.live:
            img = st.live.pop()
            return img.values, img.src, img.moved_from
        if st.pre_removed:  # removing a row that is already gone: nothing known about it
            return {}, None, None
        st.pre_removed = True
        patch, st.patch = st.patch, None
        return (patch.values if patch is not None else {}), st.key, st.key

    for ch in events:
        op = ch.op
        if op == OpType.INSERT:
            row = ch.row
            if row is not None:  # positional, every column in schema order
                state(tuple([row[j] for j in all_kidx])).live.append(Image(names, row, ch.row_text))
            else:
                vals = ch.values
                assert vals is not None
                state(tuple([vals[k] for k in key])).live.append(Image(values=vals))
            continue
        old = ch.old_values
        full_old = old if full_identity and old is not None and len(old) >= ncols else None
        if op == OpType.DELETE:
            src = old if old is not None else ch.values
            assert src is not None
            remove(state(tuple([src[k] for k in key])), full_old)
            continue
        # UPDATE
        row = ch.row
        if row is not None and old is None:  # positional, every column sent, key unchanged
            set_row(state(tuple([row[j] for j in all_kidx])), Image(names, row, ch.row_text))
            continue
        # a positional row with its old image (a MySQL full image): the dict here, not through ``RowChange.values``
        # (which builds the schema's column names per change and keeps the dict on the change)
        vals = ch.values if row is None else dict(zip(names, row, strict=True))
        assert vals is not None
        if full_old is not None:
            vals = _fill(vals, full_old)
        new_key = tuple([vals.get(k, UNCHANGED) for k in key])  # (list comprehensions: no generator per change)
        old_key = tuple([old.get(k, UNCHANGED) for k in key]) if old is not None else new_key
        if UNCHANGED in new_key:
            new_key = tuple(o if n is UNCHANGED else n for n, o in zip(new_key, old_key, strict=True))
        if old_key != new_key and UNCHANGED not in old_key:
            base, src, origin = remove(state(old_key), full_old)
            vals = _fill(vals, base)
            if UNCHANGED not in vals.values():
                src = None
            state(new_key).live.append(Image(values=vals, src=src, moved_from=origin))
            continue
        st = state(new_key)
        positional = ch.row is not None and old is None  # every column sent, in schema order
        complete = positional or (len(vals) >= ncols and UNCHANGED not in vals.values())
        idx = len(st.live) - 1
        if idx >= 0 and full_old is not None:  # the image it names; none: the pre-existing row (deferred key)
            idx = next((i for i, img in enumerate(st.live) if same_image(img.values, full_old)), -1)
        if idx >= 0:
            img = st.live[idx]
            if positional:
                st.live[idx] = Image(names, ch.row, ch.row_text, moved_from=img.moved_from)
            elif complete:
                st.live[idx] = Image(values=vals, moved_from=img.moved_from)
            else:
                merged = _fill(vals, img.values)
                st.live[idx] = Image(values=merged, src=img.src if UNCHANGED in merged.values() else None,
                                     moved_from=img.moved_from)
        elif not st.pre_removed:
            if positional:
                st.patch = Image(names, ch.row, ch.row_text)
            elif complete:
                st.patch = Image(values=vals)
            else:
                patch = dict(st.patch.values) if st.patch is not None else {}
                patch.update((k, v) for k, v in vals.items() if v is not UNCHANGED)
                st.patch = Image(values=patch)
        # else: an update of a row already removed in the window cannot happen upstream; nothing to apply

    net = KeyedNet()
    moved_sources: dict[Any, Image] = {}
    for st in states.values():
        if st.live and not st.pre_removed:
            img = st.live[-1]
            if img.moved_from is not None:
                src_st = states.get(hashable_key(img.moved_from))
                if src_st is not None and src_st is not st and src_st.pre_removed and not src_st.live:
                    moved_sources[hashable_key(img.moved_from)] = img
    for hk, st in states.items():
        if st.live:
            img = st.live[-1]
            if st.pre_removed:
                net.deletes.append(st.key)
            if img.moved_from is not None and moved_sources.get(hashable_key(img.moved_from)) is img:
                net.moves.append((img.moved_from, img))
            else:
                net.upserts.append(img)
        elif st.pre_removed:
            if hk not in moved_sources:
                net.deletes.append(st.key)
        elif st.patch is not None:
            if st.patch.row is not None or len(st.patch.values) >= ncols:
                net.updates.append(st.patch)
            else:
                net.patches.append(st.patch.values)
    return net


@dataclass
class KeylessNet:
    """Net effect on a table without a key: ``deletes`` (old images, one matching row each, repeated as
    often as listed), ``inserts`` (images, positional or dicts), ``updates`` ((new values, old image) pairs
    that could not become delete + insert because a new value was not sent and the old image lacks it)."""

    deletes: list[dict[str, Any]] = field(default_factory=list)
    inserts: list[Image] = field(default_factory=list)
    updates: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)


def normalize_keyless(names: tuple[str, ...], prefix_names: tuple[str, ...] | None,
                      prefix_rows: Sequence[tuple[Any, ...]], prefix_texts: Sequence[Any] | None,
                      events: Sequence[RowChange]) -> KeylessNet:
    """Multiset net effect of ``prefix_rows`` (INSERTs) then ``events`` on a table without a key."""
    counts: dict[Any, list[Any]] = {}  # frozen image -> [count, image]

    def frozen(vals: dict[str, Any]) -> Any:
        t = tuple(vals.get(n, UNCHANGED) for n in names)
        try:
            hash(t)
            return t
        except TypeError:
            return freeze(list(t))

    def add(img: Image, n: int) -> None:
        fz = frozen(img.values)
        entry = counts.get(fz)
        if entry is None:
            counts[fz] = [n, img]
        else:
            entry[0] += n

    for i, row in enumerate(prefix_rows):
        assert prefix_names is not None
        text = prefix_texts[i] if prefix_texts is not None and i < len(prefix_texts) else None
        add(Image(prefix_names, row, text), 1)
    net = KeylessNet()
    for ch in events:
        op = ch.op
        if op == OpType.INSERT:
            vals = ch.values
            assert vals is not None
            add(Image(values=vals), 1)
            continue
        old = ch.old_values if ch.old_values is not None else (ch.values if op == OpType.DELETE else None)
        if old is None:
            raise ValueError("an UPDATE or DELETE of a table without a key came without its old row")
        if op == OpType.DELETE:
            add(Image(values=old), -1)
            continue
        vals = ch.values
        assert vals is not None
        new = _fill(vals, old)
        if UNCHANGED in new.values() or UNCHANGED in old.values():
            net.updates.append((vals, old))
            continue
        add(Image(values=old), -1)
        add(Image(values=new), 1)
    for n, img in counts.values():
        if n < 0:
            net.deletes.extend([img.values] * -n)
        elif n > 0:
            net.inserts.extend([img] * n)
    return net
