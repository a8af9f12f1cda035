"""The SQL sink's target catalog: which target table a schema version writes to (bindings, cached per
schema object and value), existing tables read from the catalog once per target schema, missing tables
created from the upstream schema (docs/type-mapping.md), and the foreign keys between target tables.
Functions of :class:`sinks.sql.sink.SQLSink` (they keep its caches).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from cdc.errors import SinkError
from cdc.events import TableSchema
from sinks.sql.binding import Binding, KnownTable
from sinks.sql.ddl import TargetColumn, create_schema_sql, create_table_sql, plan_table
from sinks.sql.fkgraph import read_foreign_keys

if TYPE_CHECKING:
    from sinks.sql.sink import SQLSink

log = logging.getLogger(__name__)

_PG_NUMERIC = re.compile(r"numeric\(\d+,(-?\d+)\)")
_MAX_BINDINGS = 1024  # cached (schema version -> target) bindings before the cache is reset


def bind(sink: SQLSink, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None = None
         ) -> Binding:
    """The binding of ``schema``; ``before_io`` is called before ``conn`` (or the server) is used."""
    entry = sink._bindings.get(id(schema))
    if entry is not None and entry[0] is schema:
        return entry[1]
    if len(sink._bindings) > _MAX_BINDINGS:  # callers that make a new schema object per change
        sink._bindings.clear()
    same = sink._bindings_by_value.get(schema)
    if same is not None:
        sink._bindings[id(schema)] = (schema, same)
        return same
    parts = sink._target_parts(schema.name)
    table = sink._tables.get(parts)
    fresh = False  # read from the catalog just now (not remembered from an earlier look)
    if table is None and sink.dialect != "sqlite":
        if before_io is not None and parts[0] not in sink._existing:
            before_io()
        table = existing_table(sink, conn, *parts)
    if table is None:
        table, fresh = _prepare(sink, schema, conn, before_io), True
    if table.label not in sink._fk_seen:
        if before_io is not None:
            before_io()
        load_foreign_keys(sink, conn, parts[0], table.label)
    try:
        binding = Binding(sink, schema, table)
    except SinkError:
        if fresh:
            raise
        # what this sink knew of the table may be stale: the initial copy drops and creates a table again when its
        # definition changed upstream (Sink.restart_copy_target, from another sink). Look once more before failing.
        log.info("%s: table %s does not fit %s as known; reading its definition again", sink._where(), table.label,
                 schema.name)
        sink._tables.pop(parts, None)
        binding = Binding(sink, schema, _prepare(sink, schema, conn, before_io))
    if len(sink._bindings_by_value) > _MAX_BINDINGS:
        sink._bindings_by_value.clear()
    sink._bindings[id(schema)] = (schema, binding)
    sink._bindings_by_value[schema] = binding
    return binding


def _prepare(sink: SQLSink, schema: TableSchema, conn: Connection, before_io: Callable[[], None] | None
             ) -> KnownTable:
    """The table of ``schema`` as the catalog shows it now, created if missing; remembered."""
    if before_io is not None:
        before_io()
    if sink.dialect == "sqlite":  # one writer per file: DDL inside our (transactional) write
        table = prepare_table(sink, schema, conn)
    else:  # MySQL DDL commits implicitly: never inside the write transaction
        with sink._engine.connect() as ddl:
            ddl.execution_options(isolation_level="AUTOCOMMIT")
            table = prepare_table(sink, schema, ddl)
    sink._tables[sink._target_parts(schema.name)] = table
    return table


def existing_table(sink: SQLSink, conn: Connection, tschema: str | None, tname: str) -> KnownTable | None:
    """The table as the catalog showed it at this sink's first look at ``tschema``, or None.

    Every base table of the schema is read in three catalog queries on the write connection (no second
    connection, no per-table round trips: binding 1,000 existing tables took 5-7 s through SQLAlchemy's
    per-table reflection on PostgreSQL, 1.6 s on MariaDB). Each table is handed out once; a table not
    seen then (created since, a view, a name the server folds) takes the per-table path."""
    existing = sink._existing.get(tschema)
    if existing is None:
        existing = sink._existing[tschema] = reflect_schema(sink, conn, tschema)
        log.info("%s has %d existing table(s)%s; they are used as they are", sink._where(), len(existing),
                 f" in schema {tschema}" if tschema else "")
    found = existing.pop(tname, None)
    if found is None:
        return None
    cols, uniques = found
    label = f"{tschema}.{tname}" if tschema else tname
    log.debug("using existing table %s in %s (%d columns)", label, sink._where(), len(cols))  # 1,000s at start
    return KnownTable(label, tschema, tname, cols, uniques, created=False)


def reflect_schema(sink: SQLSink, conn: Connection, tschema: str | None
                   ) -> dict[str, tuple[tuple[TargetColumn, ...], list[frozenset[str]]]]:
    stmts = sink._statements()
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
        if sink.dialect == "postgresql":
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


def prepare_table(sink: SQLSink, schema: TableSchema, conn: Connection) -> KnownTable:
    sink._statements()  # knows the server's flavour (MySQL collation) once connected
    tschema, tname = sink._target_parts(schema.name)
    label = sink.target_name(schema.name)
    insp = sa.inspect(conn)
    if insp.has_table(tname, schema=tschema):
        return reflect(sink, conn, tschema, tname, label)
    preparer = sink._engine.dialect.identifier_preparer
    if tschema is not None and tschema not in sink._schemas_created:
        run_ddl(sink, conn, create_schema_sql(tschema, preparer))
        sink._schemas_created.add(tschema)
    planned = plan_table(schema, sink.dialect, target_schema=tschema, target_name=tname)
    run_ddl(sink, conn, create_table_sql(planned, sink.dialect, preparer, mysql_collation=sink._mysql_collation))
    log.info("created table %s in %s for upstream %s", label, sink._where(), schema.name)
    return KnownTable(label, planned.schema, planned.name, planned.columns,
                  [frozenset(planned.key)] if planned.key else [], created=True)


_CONCURRENTLY_CREATED = ("23505", "42P06", "42P07", "42710")  # unique violation (pg_type), duplicate schema/table/type


def run_ddl(sink: SQLSink, conn: Connection, sql: str) -> None:
    """Run one ``... IF NOT EXISTS`` statement. PostgreSQL can still report a duplicate when another
    session creates the same object concurrently (other spans of the changefeed, or the copy's tasks writing chunks
    of one new table: ``type "t" already exists``, 42710, seen in the full suite): that is success."""
    try:
        conn.exec_driver_sql(sql, ())
    except sa.exc.DBAPIError as exc:
        if getattr(exc.orig, "pgcode", None) not in _CONCURRENTLY_CREATED:
            raise
        log.info("%s already created concurrently: %s", sink._where(), " ".join(str(exc.orig).split()))


def reflect(sink: SQLSink, conn: Connection, tschema: str | None, tname: str, label: str) -> KnownTable:
    insp = sa.inspect(conn)
    cols = []
    for c in insp.get_columns(tname, schema=tschema):
        typ = c["type"]
        is_json = isinstance(typ, sa.JSON)
        if sink.dialect == "postgresql":
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
    log.info("using existing table %s in %s (%d columns)", label, sink._where(), len(cols))
    return KnownTable(label, tschema, tname, tuple(cols), uniques, created=False)


def load_foreign_keys(sink: SQLSink, conn: Connection, tschema: str | None, label: str) -> None:
    """Read the foreign keys between the tables of target schema ``tschema`` (once per schema, and again
    when a table not seen then is bound: created or added downstream since)."""
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        edges, seen = read_foreign_keys(cur, sink._statements(), sink.dialect, tschema)
    finally:
        cur.close()
    sink._fk.add_all(edges)
    sink._fk_seen |= seen | {label}
    if edges:
        log.info("%s: %d foreign key(s) between target tables: deletes go children first, inserts parents "
                 "first", sink._where(), len(edges))
