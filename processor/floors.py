"""Which changes a copy already holds: per upstream table a Ts (its *floor*, or its *ceiling*), found for a change by
the relation oid of its table (docs/snapshot.md, "Floors").

A copy records each table's floor under the table's name *at the copy's snapshot* and, with it, the table's relation
oid then (:attr:`cdc.model.SpanSnapshot.oids`, from :attr:`cdc.snapshot.TablePlan.oid`). The stream names a change
by the table's name *when it was made* (pgoutput's Relation message, which also carries the oid:
``TableSchema.relation_id``). A table renamed (``ALTER TABLE .. RENAME``, ``SET SCHEMA``) between its first change
in the stream and its copy's snapshot has both names; looked up by name, its changes under the old name escaped the
floor and were applied on top of a copy that already held them (a key-less table got duplicates). So:

- a change whose relation oid has a floor gets that floor, whatever the table is called (renames change nothing);
- a change of a relation the copy did not record (an oid no recorded table had: a table dropped, or renamed away
  and dropped, before the snapshot, whose name the copied table took) gets the floor of its *name*: the copy's
  snapshot shows what became of it (gone), so its changes up to the floor are in the copy as much as any;
- tables recorded without an oid (records stored before oids were; an upstream without relation oids) are found
  by name only, as before. For them a rename inside the window cannot be matched, and the batcher refuses it
  loudly (``processor.batcher``).

Costs: a dict lookup per change, asked only for transactions at or below the highest floor (the batcher).
"""

from __future__ import annotations

from collections.abc import Mapping

from cdc.events import DdlEvent, TableSchema


class TableFloors:
    """Per table a Ts, looked up by relation oid, else by name (module doc). Immutable."""

    __slots__ = ("_by_oid", "_names", "_oids", "top")

    def __init__(self, ts: Mapping[str, int] | None = None, oids: Mapping[str, int] | None = None) -> None:
        """``ts``: table name (``schema.table``, as the copy recorded it) -> Ts; ``oids``: table name -> its relation
        oid at the copy's snapshot (missing or 0: unknown)."""
        self._names: dict[str, int] = dict(ts or {})
        self._oids: dict[str, int] = {n: o for n, o in (oids or {}).items() if o and n in self._names}
        self._by_oid: dict[int, int] = {}
        for name, oid in self._oids.items():
            self._by_oid[oid] = max(self._names[name], self._by_oid.get(oid, 0))
        self.top: int = max(self._names.values(), default=0)  # no change above it has a floor

    def __bool__(self) -> bool:
        return bool(self._names)

    def __repr__(self) -> str:
        return f"TableFloors({self._names!r}, oids={self._oids!r})"

    def above(self, ts: int) -> TableFloors:
        """Only the tables whose Ts is above ``ts`` (a span that starts from checkpoint ``ts`` needs no other)."""
        return TableFloors({n: v for n, v in self._names.items() if v > ts}, self._oids)

    def above_floors(self, floors: TableFloors) -> TableFloors:
        """Only the tables whose Ts (a ceiling) is above their own floor in ``floors``."""
        keep = {}
        for name, ts in self._names.items():
            oid = self._oids.get(name, 0)
            floor = floors._by_oid[oid] if oid in floors._by_oid else floors._names.get(name, 0)
            if ts > floor:
                keep[name] = ts
        return TableFloors(keep, self._oids)

    def merged(self, other: TableFloors) -> TableFloors:
        """These tables and ``other``'s; ``other`` wins for a table both name."""
        return TableFloors({**self._names, **other._names}, {**self._oids, **other._oids})

    def of(self, schema: TableSchema) -> int:
        """The Ts of the table of a change whose schema is ``schema`` (0: none)."""
        oid = schema.relation_id
        if oid and oid in self._by_oid:
            return self._by_oid[oid]
        return self._names.get(str(schema.name), 0)

    def of_ddl(self, event: DdlEvent) -> int:
        """The Ts of the table a schema change is of (:func:`ddl_relation_id`, else its name before the change)."""
        oid = ddl_relation_id(event)
        if oid and oid in self._by_oid:
            return self._by_oid[oid]
        return self._names.get(str(event.table), 0)

    def by_oid(self, oid: int) -> bool:
        """Whether relation ``oid`` was recorded with its oid (its renames are matched)."""
        return bool(oid) and oid in self._by_oid

    def named(self, name: str) -> int:
        """The Ts recorded under table name ``name`` (0: none)."""
        return self._names.get(name, 0)


def ddl_relation_id(event: DdlEvent) -> int:
    """The relation oid of the table a schema change is of: from its schema before the change, else after (0: unknown,
    e.g. a schema change without schemas)."""
    schema = event.before if event.before is not None else event.after
    return schema.relation_id if schema is not None else 0
