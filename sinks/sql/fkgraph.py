"""Foreign keys between target tables, as the target's catalog shows them, and the apply order they imply.

Read once per sink and target schema (PostgreSQL ``pg_constraint``, MySQL ``information_schema``
``REFERENTIAL_CONSTRAINTS``/``KEY_COLUMN_USAGE``, SQLite ``PRAGMA foreign_key_list``), and again for a
table the sink creates or sees for the first time later. Edges point from a child table to the parent it
references; both are downstream table labels (``schema.name`` on PostgreSQL, ``name`` elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinks.sql.statements import Statements


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


def read_foreign_keys(cur: Any, stmts: Statements, dialect: str, tschema: str | None
                      ) -> tuple[list[tuple[Any, ...]], set[str]]:
    """The foreign keys between the tables of target schema ``tschema`` read on cursor ``cur`` (SQLite:
    ``PRAGMA foreign_key_list``; MySQL: ``information_schema``; PostgreSQL: ``pg_constraint``), as
    :meth:`FkGraph.add_all` edges ``(child, parent[, child columns, parent columns])``, and the labels of
    every table seen."""
    cols: dict[tuple[str, str, str], list[tuple[str, str]]] = {}  # (child, parent, fk id) -> pairs
    if dialect == "sqlite":
        cur.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        tables = [r[0] for r in cur.fetchall()]
        for t in tables:
            cur.execute(f"PRAGMA foreign_key_list({stmts.q(t)})")
            for fid, _seq, parent, frm, to, *_ in cur.fetchall():
                cols.setdefault((t, parent, str(fid)), []).append((frm, to))
        seen = set(tables)
    elif dialect == "mysql":
        cur.execute(stmts.catalog_foreign_keys())
        for name, child, parent, ccol, pcol in cur.fetchall():
            cols.setdefault((str(child), str(parent), str(name)), []).append((ccol, pcol))
        cur.execute(stmts.catalog_tables())
        seen = {r[0] for r in cur.fetchall()}
    else:
        cur.execute(stmts.catalog_foreign_keys(), (tschema, tschema))
        for name, cs, c, ps, p, ccol, pcol in cur.fetchall():
            cols.setdefault((f"{cs}.{c}", f"{ps}.{p}", str(name)), []).append((ccol, pcol))
        cur.execute(stmts.catalog_tables(), (tschema,))
        seen = {f"{tschema}.{r[0]}" for r in cur.fetchall()}
    edges = [(c, p, tuple(x for x, _ in pairs), tuple(y for _, y in pairs))
             if all(x and y for x, y in pairs) else (c, p) for (c, p, _), pairs in cols.items()]
    return edges, seen
