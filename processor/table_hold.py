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

Thread-safety: the copy thread calls ``pass_up_to``/``release``, the sink thread ``verdict``/``wait``; the state
only ever becomes less restrictive (wait -> pass up to ``B`` -> released), so a transaction found passable stays
passable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

PASS, DROP, WAIT = 0, 1, 2


class TableHold:
    def __init__(self, tables: Iterable[str], drop: Mapping[str, int] | None = None) -> None:
        self.tables = frozenset(tables)
        self._drop = dict(drop or {})
        self._boundary: int | None = None
        self._floors: dict[str, int] | None = None
        self._changed = threading.Condition()
        self.blocked_at = 0  # the commit Ts of the transaction the stream waits before (0: it does not wait)

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

    def verdict(self, table: str, ts: int) -> int:
        """``PASS``, ``DROP`` or ``WAIT`` for a change of ``table`` committed at ``ts``."""
        if table not in self.tables:
            return PASS
        floors = self._floors
        if floors is not None:
            return DROP if ts <= floors.get(table, 0) else PASS
        if ts <= self._drop.get(table, 0):
            return DROP
        boundary = self._boundary
        return PASS if boundary is not None and ts <= boundary else WAIT

    def pass_up_to(self, boundary: int, drop: Mapping[str, int] | None = None) -> None:
        """Let the held tables' changes at or below ``boundary`` pass (``drop``: per table, drop those at or
        below it instead)."""
        with self._changed:
            if drop:
                self._drop.update(drop)
            self._boundary = boundary
            self._changed.notify_all()

    def release(self, floors: Mapping[str, int]) -> None:
        """The copy is written: drop each held table's changes at or below its floor, pass the rest."""
        with self._changed:
            self._floors = {t: floors.get(t, 0) for t in self.tables}
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
