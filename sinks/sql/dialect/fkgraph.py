"""Foreign keys between target tables, as the target's catalog shows them, and the apply order they imply.

The edges are read by :func:`sinks.sql.target.catalog.read_foreign_keys` (once per target schema, and again for
a table the sink creates or sees for the first time later); this module only keeps and orders them (no I/O). Edges
point from a child table to the parent it references; both are downstream table labels (``schema.name`` on
PostgreSQL, ``name`` elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable


class FkGraph:
    """Child -> parents edges between target tables, and orders derived from them.

    ``order(labels)`` puts parents before children (a topological order of the edges among ``labels``;
    tables on a cycle, and the members of unrelated groups, keep the given order). Self-references are
    ignored here: within one table the upstream order of a key's changes is kept by the normalisation,
    and what cannot be ordered inside one table is documented in docs/limits.md."""

    def __init__(self) -> None:
        self.parents: dict[str, set[str]] = {}
        self.children: dict[str, set[str]] = {}
        # per child: (parent, child columns, referenced parent columns) of each foreign key, when known
        self.columns: dict[str, set[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {}
        self._orders: dict[tuple[str, ...], list[str]] = {}

    def add(self, child: str, parent: str, child_cols: tuple[str, ...] = (), parent_cols: tuple[str, ...] = ()) -> None:
        if child == parent:
            return
        self.parents.setdefault(child, set()).add(parent)
        self.children.setdefault(parent, set()).add(child)
        if child_cols:
            self.columns.setdefault(child, set()).add((parent, child_cols, parent_cols))
        self._orders.clear()

    def add_all(self, edges: Iterable[tuple[str, str] | tuple[str, str, tuple[str, ...], tuple[str, ...]]]) -> None:
        for edge in edges:
            self.add(*edge)

    def references(self, child: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        """(parent, child columns, parent columns) of the child's foreign keys whose columns are known."""
        return sorted(self.columns.get(child, ()))

    def has_parents(self, label: str) -> bool:
        return bool(self.parents.get(label))

    def is_parent(self, label: str) -> bool:
        return bool(self.children.get(label))

    def order(self, labels: list[str]) -> list[str]:
        """``labels`` with every parent before its children (stable: otherwise the given order)."""
        if not self.parents or len(labels) < 2:
            return labels
        key = tuple(labels)
        cached = self._orders.get(key)
        if cached is not None:
            return cached
        present = set(labels)
        pos = {t: i for i, t in enumerate(labels)}
        indeg = {t: sum(1 for p in self.parents.get(t, ()) if p in present) for t in labels}
        out: list[str] = []
        ready = [t for t in labels if indeg[t] == 0]
        done: set[str] = set()
        while len(out) < len(labels):
            if not ready:  # a cycle: take the first remaining table in the given order
                ready = [min((t for t in labels if t not in done), key=pos.__getitem__)]
            ready.sort(key=pos.__getitem__)
            t = ready.pop(0)
            if t in done:
                continue
            done.add(t)
            out.append(t)
            for c in self.children.get(t, ()):
                if c in present and c not in done:
                    indeg[c] -= 1
                    if indeg[c] == 0:
                        ready.append(c)
        if len(self._orders) > 256:
            self._orders.clear()
        self._orders[key] = out
        return out

