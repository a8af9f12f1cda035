"""The SQL sink's target catalog: which target table a schema version writes to (bindings, cached per schema
object and value), existing tables read from the catalog once per target schema, missing tables created from the
upstream schema (docs/type-mapping.md) unless the changefeed has had them (``record``, :mod:`table_record`: a table
dropped behind its back is refused, never created again), and the foreign keys between target tables (:class:`FkGraph`).

:class:`Catalog` owns those caches; the writer, the DDL runner and the initial-copy loaders ask it for bindings and
tell it what to forget. Threading: the sink's caller thread only.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.errors import SinkError
from cdc.events import TableSchema
from sinks.base import TableShape
from sinks.sql.dialect.fkgraph import FkGraph
from sinks.sql.dialect.statements import Statements
from sinks.sql.dialect.typemap import TargetColumn, create_schema_sql, create_table_sql, plan_table
from sinks.sql.target.binding import Binding, KnownTable
from sinks.sql.target.connection import Target
from sinks.sql.target.table_record import TableRecord

log = logging.getLogger(__name__)

_PG_NUMERIC = re.compile(r"numeric\(\d+,(-?\d+)\)")
_MAX_BINDINGS = 1024  # cached (schema version -> target) bindings before the cache is reset

Parts = tuple[str | None, str]  # (target schema or None, target table)


class Catalog:
    """What one sink knows of its target's tables: their columns and keys (read once, or created by it), the
    binding of each schema version to its table, and the foreign keys between them (``fk``: replaced by a new
    graph when :meth:`forget_tables` drops what a DDL touched, so read it where it is used). ``record``: the target
    tables the sink's changefeed has had (bound by ``open_position``; until then it records and refuses nothing)."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self.record = TableRecord(target)
        self._tables: dict[Parts, KnownTable] = {}
        # per target schema: its base tables as the catalog showed them, handed out once (see existing_table)
        self._existing: dict[str | None, dict[str, tuple[tuple[TargetColumn, ...], list[frozenset[str]]]]] = {}
        self._bindings: dict[int, tuple[TableSchema, Binding]] = {}  # by identity, then by value
        self._bindings_by_value: dict[TableSchema, Binding] = {}
        self._schemas_created: set[str] = set()
        self._stage_ids = itertools.count(1)  # names of PostgreSQL staging tables (one per plan)
        self.fk = FkGraph()  # foreign keys between target tables (see load_foreign_keys)
        self._fk_seen: set[str] = set()  # tables whose foreign keys were read

    # ---- bindings ----------------------------------------------------------------------------------------
    def cached(self, schema: TableSchema) -> Binding | None:
        """The binding of ``schema`` if :meth:`bind` would return it without I/O (this very schema object bound
        before), else None."""
        entry = self._bindings.get(id(schema))
        return entry[1] if entry is not None and entry[0] is schema else None

    def bind(self, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None = None) -> Binding:
        """The binding of ``schema``; ``before_io`` is called before ``conn`` (or the server) is used. A table is read
        from the catalog once: another schema version of it (PostgreSQL's pgoutput describes a table again after any
        cache invalidation upstream, an ANALYZE say, and each description is a new version) binds without I/O until
        :meth:`forget_tables` (or another ``forget_*``) drops what is known of it."""
        entry = self._bindings.get(id(schema))
        if entry is not None and entry[0] is schema:
            return entry[1]
        if len(self._bindings) > _MAX_BINDINGS:  # callers that make a new schema object per change
            self._bindings.clear()
        same = self._bindings_by_value.get(schema)
        if same is not None:
            self._bindings[id(schema)] = (schema, same)
            return same
        target = self._target
        parts = target.target_parts(schema.name)
        table = self._tables.get(parts)
        first = table is None  # the first binding of the table in what this sink knows: the record is checked
        fresh = False  # read from the catalog just now (not remembered from an earlier look)
        if table is None and target.dialect != "sqlite":
            if before_io is not None and parts[0] not in self._existing:
                before_io()
            table = self.existing_table(conn, *parts)
            if table is not None:  # known from now on: a later schema version of the table needs no catalog read
                self._tables[parts] = table
        if table is None:
            table, fresh = self._prepare(schema, conn, before_io), True
        if table.label not in self._fk_seen:
            if before_io is not None:
                before_io()
            self.load_foreign_keys(conn, parts[0], table.label)
        try:
            binding = self.new_binding(schema, table)
        except SinkError:
            if fresh:
                raise
            # what this sink knew of the table may be stale: the initial copy drops and creates a table again when its
            # definition changed upstream (CopyTargets.restart_copy_target, from another sink). Look once more before
            # failing.
            log.info("%s: table %s does not fit %s as known; reading its definition again", target.where, table.label,
                     schema.name)
            self._tables.pop(parts, None)
            binding = self.new_binding(schema, self._prepare(schema, conn, before_io))
        record = self.record
        if first and record.bound:
            if before_io is not None and not record.shows(binding.label):
                before_io()
            record.note(conn, binding.label, schema.name)
        if len(self._bindings_by_value) > _MAX_BINDINGS:
            self._bindings_by_value.clear()
        self._bindings[id(schema)] = (schema, binding)
        self._bindings_by_value[schema] = binding
        return binding

    def new_binding(self, schema: TableSchema, table: KnownTable) -> Binding:
        """A binding of ``schema`` to ``table`` (not cached): ``SinkError`` when the table does not fit it."""
        target = self._target
        return Binding(schema, table, target.statements(), self._stage_ids, temp_ok=target.pg_temp_ok is not False)

    def assume(self, table: KnownTable) -> None:
        """Take ``table`` as its target table as it is, without reading the catalog, and its foreign keys as known
        (edges added to ``fk``)."""
        self._tables[(table.schema, table.name)] = table
        self._fk_seen.add(table.label)

    # ---- forgetting --------------------------------------------------------------------------------------
    def forget_all(self) -> None:
        """Forget every table and binding (a write failed: tables created inside its transaction are gone, and so may be
        rows of the record)."""
        self.record.forget_cache()
        self._tables.clear()
        self._existing.clear()
        self._bindings.clear()
        self._bindings_by_value.clear()

    def forget_table(self, parts: Parts) -> None:
        """Forget target table ``parts`` (dropped) and every binding."""
        self._tables.pop(parts, None)
        self._bindings.clear()
        self._bindings_by_value.clear()

    def forget_tables(self, touched: set[Parts]) -> None:
        """Forget what is known of ``touched`` target tables (their shape changed), their bindings, and the foreign
        keys: the next rows read them again."""
        labels = set()
        for parts in touched:
            self._tables.pop(parts, None)
            self._existing.get(parts[0], {}).pop(parts[1], None)
            labels.add(f"{parts[0]}.{parts[1]}" if parts[0] else parts[1])
        for key, (_schema, b) in list(self._bindings.items()):
            if b.label in labels:
                del self._bindings[key]
        for schema, b in list(self._bindings_by_value.items()):
            if b.label in labels:
                del self._bindings_by_value[schema]
        self.fk = FkGraph()
        self._fk_seen = set()

    # ---- tables --------------------------------------------------------------------------------------------
    def _prepare(self, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None) -> KnownTable:
        """The table of ``schema`` as the catalog shows it now, created if missing; remembered."""
        if before_io is not None:
            before_io()
        target = self._target
        if target.dialect == "sqlite":  # one writer per file: DDL inside our (transactional) write
            table = self.prepare_table(schema, conn)
        else:  # MySQL DDL commits implicitly: never inside the write transaction
            with target.engine.connect() as ddl:
                ddl.execution_options(isolation_level="AUTOCOMMIT")
                table = self.prepare_table(schema, ddl)
        self._tables[target.target_parts(schema.name)] = table
        return table

    def existing_table(self, conn: Connection, tschema: str | None, tname: str) -> KnownTable | None:
        """The table as the catalog showed it at this sink's first look at ``tschema``, or None.

        Every base table of the schema is read in three catalog queries on the write connection (no second
        connection, no per-table round trips: binding 1,000 existing tables took 5-7 s through SQLAlchemy's
        per-table reflection on PostgreSQL, 1.6 s on MariaDB). Each table is handed out once; a table not
        seen then (created since, a view, a name the server folds) takes the per-table path."""
        existing = self._existing.get(tschema)
        if existing is None:
            existing = self._existing[tschema] = self.reflect_schema(conn, tschema)
            log.info("%s has %d existing table(s)%s; they are used as they are", self._target.where, len(existing),
                     f" in schema {tschema}" if tschema else "")
        found = existing.pop(tname, None)
        if found is None:
            return None
        cols, uniques = found
        label = f"{tschema}.{tname}" if tschema else tname
        log.debug("using existing table %s in %s (%d columns)", label, self._target.where, len(cols))  # 1,000s at start
        return KnownTable(label, tschema, tname, cols, uniques, created=False)

    def reflect_schema(self, conn: Connection, tschema: str | None
                       ) -> dict[str, tuple[tuple[TargetColumn, ...], list[frozenset[str]]]]:
        """Every base table of ``tschema``: its columns and unique keys, in three catalog queries."""
        stmts = self._target.statements()
        params = () if tschema is None else (tschema,)
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute(stmts.catalog_tables(), params or None)
            base = {r[0] for r in cur.fetchall()}
            cur.execute(stmts.catalog_columns(), params or None)
            col_rows = [r for r in cur.fetchall() if r[0] in base]
            cur.execute(stmts.catalog_unique_keys(), params or None)
            key_rows = cur.fetchall()
        finally:
            cur.close()
        cols: dict[str, list[TargetColumn]] = {}
        for tname, cname, nullable, typ, scale in col_rows:
            typ = str(typ)
            if self._target.dialect == "postgresql":
                is_json = typ == "json"  # jsonb has '=', json does not
                m = _PG_NUMERIC.fullmatch(typ)
                scale = int(m.group(1)) if m else None
            else:
                is_json = typ == "json"
                scale = int(scale) if typ in ("decimal", "numeric") and scale is not None else None
            cols.setdefault(tname, []).append(TargetColumn(cname, None, bool(nullable), is_json, scale))
        indexes: dict[tuple[str, str], list[str | None]] = {}
        for tname, index, cname in key_rows:
            indexes.setdefault((tname, index), []).append(cname)
        uniques: dict[str, list[frozenset[str]]] = {}
        for (tname, _index), names in indexes.items():
            if all(n is not None for n in names):  # expression parts cannot serve as a key
                uniques.setdefault(tname, []).append(frozenset(n for n in names if n is not None))
        return {t: (tuple(c), uniques.get(t, [])) for t, c in cols.items()}

    def prepare_table(self, schema: TableSchema, conn: Connection) -> KnownTable:
        """The target table of ``schema`` read through ``conn`` (per table), or created from the upstream schema;
        ``TargetTableDropped`` instead when the changefeed has had the table (:mod:`table_record`)."""
        target = self._target
        target.statements()  # knows the server's flavour (MySQL collation) once connected
        tschema, tname = target.target_parts(schema.name)
        label = target.target_name(schema.name)
        insp = sa.inspect(conn)
        if insp.has_table(tname, schema=tschema):
            return self.reflect(conn, tschema, tname, label)
        if self.record.had(conn, label):
            raise self.record.refuse(label, schema.name)
        preparer = target.engine.dialect.identifier_preparer
        if tschema is not None and tschema not in self._schemas_created:
            target.run_ddl(conn, create_schema_sql(tschema, preparer))
            self._schemas_created.add(tschema)
        planned = plan_table(schema, target.dialect, target_schema=tschema, target_name=tname)
        target.run_ddl(conn, create_table_sql(planned, target.dialect, preparer,
                                              mysql_collation=target.mysql_collation))
        log.info("created table %s in %s for upstream %s", label, target.where, schema.name)
        return KnownTable(label, planned.schema, planned.name, planned.columns,
                          [frozenset(planned.key)] if planned.key else [], created=True)

    def shape(self, tschema: str | None, tname: str, label: str) -> TableShape | None:
        """The table's columns and unique keys as the catalog shows them now, read on a connection of its own
        (nothing cached: ``sinks.base.TableShapes``); None when there is no such table."""
        with self._target.engine.connect() as conn:
            if not sa.inspect(conn).has_table(tname, schema=tschema):
                return None
            known = self.reflect(conn, tschema, tname, label)
        return TableShape(label, tuple(c.name for c in known.columns), tuple(known.uniques))

    def reflect(self, conn: Connection, tschema: str | None, tname: str, label: str) -> KnownTable:
        """One table's columns and unique keys through SQLAlchemy's per-table reflection."""
        insp = sa.inspect(conn)
        cols = []
        for c in insp.get_columns(tname, schema=tschema):
            typ = c["type"]
            is_json = isinstance(typ, sa.JSON)
            if self._target.dialect == "postgresql":
                is_json = is_json and type(typ).__name__ == "JSON"  # jsonb has '=', json does not
            scale = typ.scale if isinstance(typ, sa.Numeric) and not isinstance(typ, sa.Float) else None
            cols.append(TargetColumn(c["name"], None, bool(c.get("nullable", True)), is_json, scale))
        uniques: list[frozenset[str]] = []
        pk = insp.get_pk_constraint(tname, schema=tschema).get("constrained_columns") or []
        if pk:
            uniques.append(frozenset(pk))
        for uc in insp.get_unique_constraints(tname, schema=tschema):
            uniques.append(frozenset(uc["column_names"]))
        for ix in insp.get_indexes(tname, schema=tschema):
            if ix.get("unique") and all(n is not None for n in ix["column_names"]):
                uniques.append(frozenset(ix["column_names"]))
        if self._target.dialect == "sqlite":  # SQLAlchemy reports no inline ``col UNIQUE`` (an automatic index)
            uniques += [u for u in sqlite_unique_indexes(conn, tname) if u not in uniques]
        log.info("using existing table %s in %s (%d columns)", label, self._target.where, len(cols))
        return KnownTable(label, tschema, tname, tuple(cols), uniques, created=False)

    # ---- foreign keys --------------------------------------------------------------------------------------
    def load_foreign_keys(self, conn: Connection, tschema: str | None, label: str) -> None:
        """Read the foreign keys between the tables of target schema ``tschema`` (once per schema, and again
        when a table not seen then is bound: created or added downstream since)."""
        cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            edges, seen = read_foreign_keys(cur, self._target.statements(), self._target.dialect, tschema)
        finally:
            cur.close()
        self.fk.add_all(edges)
        self._fk_seen |= seen | {label}
        if edges:
            log.info("%s: %d foreign key(s) between target tables: deletes go children first, inserts parents "
                     "first", self._target.where, len(edges))


def sqlite_unique_indexes(conn: Connection, tname: str) -> list[frozenset[str]]:
    """The column sets of every unique index of SQLite table ``tname`` (automatic ones of inline ``UNIQUE`` and
    ``PRIMARY KEY`` constraints included; indexes on expressions left out)."""
    q = conn.dialect.identifier_preparer.quote_identifier
    out = []
    for r in conn.exec_driver_sql(f"PRAGMA index_list({q(tname)})").fetchall():
        if r[2]:  # (seq, name, unique, origin, partial)
            cols = [c[2] for c in conn.exec_driver_sql(f"PRAGMA index_info({q(r[1])})").fetchall()]
            if cols and None not in cols and not r[4]:
                out.append(frozenset(cols))
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
