"""What a streaming span holds back while a table copy runs (docs/snapshot.md, "Table copies").

A *table copy* copies the existing rows of some tables of a span (a table that joined the span with rows, or a
resync asked for by ``cdc cli changefeed snapshot --table``) while the span goes on streaming its other tables.
The rule that makes it exact is the initial copy's: no change of a copied table is applied after the copy's
snapshot until the copy is written. The span's batcher asks :meth:`TableHold.verdict` for every change of a held
table (row or schema change), in commit order:

1. Before the copy has exported its snapshot, every change of a held table *waits*: the stream stops before the
   transaction holding it (the span's other tables stream up to there).
2. Once the copy's first snapshot ``B`` is known (:meth:`TableHold.pass_up_to`), a held table's changes at or
   below ``B`` pass (they are older than the copy: applying them first is what the initial copy's target
   would have seen), except those at or below the table's ``drop`` Ts (a key-less table whose single chunk is
   already committed under a snapshot: its rows up to that snapshot are in the copy); changes above ``B`` wait.
3. :meth:`TableHold.release` ends the hold with each table's final floor: from then on a held table's changes at
   or below its floor are dropped (in the copy already) and the rest pass.

A held table is found by its relation oid (``oids``: each table's oid when the copy was asked for or taken up), as
floors are (``processor.floors``), so a table renamed (``ALTER TABLE .. RENAME``, ``SET SCHEMA``) while its copy is
taken up or runs is held under its new name too, and its rename with it; a change of another relation that took a
held table's name is not held. A table whose oid is unknown is found by name. ``pass_up_to`` and ``release`` are given
the copy's tables under the names they had at its snapshot, with their oids, and match them to the held tables by oid
(docs/snapshot.md, "A table renamed while it is copied").

Thread-safety: the copy thread calls ``pass_up_to``/``release``, the sink thread ``verdict``/``wait``; the state
only ever becomes less restrictive (wait -> pass up to ``B`` -> released), so a transaction found passable stays
passable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

PASS, DROP, WAIT = 0, 1, 2


class TableHold:
    def __init__(self, tables: Iterable[str], drop: Mapping[str, int] | None = None,
                 oids: Mapping[str, int] | None = None) -> None:
        """``tables``: the held tables' names as the copy was asked for; ``oids``: name -> relation oid (missing or 0:
        found by name only)."""
        self.tables = frozenset(tables)
        self._oid_key: dict[int, str] = {o: t for t, o in (oids or {}).items() if o and t in self.tables}
        self.oids = frozenset(self._oid_key)  # (the batcher's quick test)
        self._by_oid = frozenset(self._oid_key.values())  # tables found by oid only
        self._drop: dict[str, int] = {}
        self._boundary: int | None = None
        self._floors: dict[str, int] | None = None
        self._changed = threading.Condition()
        self.blocked_at = 0  # the commit Ts of the transaction the stream waits before (0: it does not wait)
        if drop:
            self._drop.update(self._keyed(drop, None))

    @property
    def released(self) -> bool:
        return self._floors is not None

    @property
    def boundary(self) -> int | None:
        """The copy's first snapshot ``B`` once :meth:`pass_up_to` told it (None before)."""
        return self._boundary

    @property
    def floor_max(self) -> int:
        """Above this commit Ts no change is dropped or held back any more (only once released)."""
        floors = self._floors
        if floors is None:
            return 1 << 63
        return max(floors.values(), default=0)

    def held(self, table: str, oid: int = 0) -> str | None:
        """The held table (its name as asked for) a change of ``table`` with relation ``oid`` (0: unknown) is of;
        None: not held. A change of another relation under a name held by oid is not held."""
        if oid:
            key = self._oid_key.get(oid)
            if key is not None:
                return key
            return table if table in self.tables and table not in self._by_oid else None
        return table if table in self.tables else None

    def verdict(self, table: str, ts: int, oid: int = 0) -> int:
        """``PASS``, ``DROP`` or ``WAIT`` for a change of ``table`` (relation ``oid``, 0: unknown) committed at
        ``ts``."""
        key = self.held(table, oid)
        if key is None:
            return PASS
        floors = self._floors
        if floors is not None:
            return DROP if ts <= floors.get(key, 0) else PASS
        if ts <= self._drop.get(key, 0):
            return DROP
        boundary = self._boundary
        return PASS if boundary is not None and ts <= boundary else WAIT

    def _keyed(self, by_name: Mapping[str, int], oids: Mapping[str, int] | None) -> dict[str, int]:
        """``by_name`` (the copy's names, with their ``oids``) keyed by the held tables' names (by oid, else name)."""
        out: dict[str, int] = {}
        for name, ts in by_name.items():
            key = self.held(name, (oids or {}).get(name, 0))
            if key is not None:
                out[key] = max(ts, out.get(key, 0))
        return out

    def pass_up_to(self, boundary: int, drop: Mapping[str, int] | None = None,
                   oids: Mapping[str, int] | None = None) -> None:
        """Let the held tables' changes at or below ``boundary`` pass (``drop``: per table, drop those at or
        below it instead; ``oids``: those tables' relation oids)."""
        with self._changed:
            if drop:
                self._drop.update(self._keyed(drop, oids))
            self._boundary = boundary
            self._changed.notify_all()

    def release(self, floors: Mapping[str, int], oids: Mapping[str, int] | None = None) -> None:
        """The copy is written: drop each held table's changes at or below its floor, pass the rest (``floors`` by
        the names the copy recorded, ``oids`` their relation oids)."""
        with self._changed:
            keyed = self._keyed(floors, oids)
            self._floors = {t: keyed.get(t, 0) for t in self.tables}
            self.blocked_at = 0
            self._changed.notify_all()

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait(self, stop: threading.Event, timeout: float = 0.5) -> None:
        """Wait (at most ``timeout`` s) for the hold to change; the caller checks ``stop`` and tries again."""
        with self._changed:
            if not stop.is_set():
                self._changed.wait(timeout)
