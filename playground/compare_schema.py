"""Compare the shape of downstream tables with the upstream's current schema, as the SQL sink maps it.

The row compare (:mod:`playground.compare`) sees a missing column or different values, but not a column of
the wrong type, a nullability or a primary key that differ: a table altered by DDL must be indistinguishable
from one the sink creates fresh from the upstream's current schema (docs/ddl.md, "altered = created fresh").
For each table :func:`compare_schemas` therefore

- reads the upstream's current schema (``upstream.postgres.catalog.table_schema``, the catalog facts the
  capture uses), plans its target table with :func:`sinks.sql.dialect.typemap.plan_table` for the target's dialect and
  creates that plan as a *temporary* table on the target itself (``create_table_sql``, with the collation
  the sink uses on MySQL/MariaDB), so that the expected types are the target's own spelling of the mapped
  types (``INT`` is ``int(11)`` on MariaDB, ``integer`` on PostgreSQL);
- reflects the real downstream table and the temporary one the same way: PostgreSQL ``format_type`` +
  ``attnotnull`` + ``pg_get_expr`` of the default + collation; MariaDB/MySQL the column definitions of
  ``SHOW CREATE TABLE`` (type, character set, collation, ``CHECK (json_valid(..))``, NULL/NOT NULL, DEFAULT);
  SQLite ``PRAGMA table_info`` (declared type, notnull, default);
- reports, per table: columns only upstream or only downstream, and per column a different type,
  nullability or a default, and a primary key other than the planned one (column order within the key
  counts).

Column *order* is not compared (columns are matched by name: an order difference changes nothing the sink
writes, which always names its columns). **Defaults**: the mapping copies none (docs/type-mapping.md), so a
downstream column must have no default at all, whatever the upstream's default is; the upstream's defaults
reach the target only as the values of rows.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from cdc.events import TableName
from cdc.uri import parse_sink_uri
from playground.compare import sqlalchemy_url
from sinks.sql.dialect.typemap import create_table_sql, mysql_collation, plan_table
from sinks.sql.target.connection import DIALECTS
from upstream.postgres import catalog


@dataclass(frozen=True)
class ColumnShape:
    """One reflected column: ``type`` is the target's own text of it (MySQL: the column definition without
    its NULL and DEFAULT clauses, so character set, collation and checks count), ``default`` None when the
    column has none (MySQL's ``DEFAULT NULL`` is none)."""

    name: str
    type: str
    nullable: bool
    default: str | None


@dataclass(frozen=True)
class TableShape:
    columns: dict[str, ColumnShape]
    key: tuple[str, ...]


@dataclass
class SchemaDiff:
    """What differs between the downstream table ``target`` and the mapping of upstream ``table``."""

    table: str
    target: str
    problems: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.problems


# ---- reflection: the same function for the real table and the temporary one of the plan ----------------
def _pg_shape(conn: Any, regclass: str) -> TableShape | None:
    cols = conn.execute(sa.text(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) || coalesce(' COLLATE ' || c.collname, ''), "
        "NOT a.attnotnull, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "LEFT JOIN pg_collation c ON c.oid = a.attcollation AND c.collname <> 'default' "
        "WHERE a.attrelid = to_regclass(:r) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"),
        {"r": regclass}).fetchall()
    if not cols:
        return None
    key = conn.execute(sa.text(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(:r) AND i.indisprimary "
        "ORDER BY array_position(i.indkey, a.attnum)"), {"r": regclass}).fetchall()
    return TableShape({n: ColumnShape(n, t, bool(null), d) for n, t, null, d in cols}, tuple(k[0] for k in key))


_MYSQL_COLUMN = re.compile(r"^  `((?:[^`]|``)+)` (.*?),?$")
_MYSQL_NAME = re.compile(r"`((?:[^`]|``)+)`")
_MYSQL_DEFAULT = re.compile(r" DEFAULT ('(?:[^'\\]|\\.|'')*'|\([^)]*\)|\S+)")


def _mysql_column(name: str, definition: str) -> ColumnShape:
    nullable = " NOT NULL" not in f" {definition}"
    m = _MYSQL_DEFAULT.search(definition)
    default = None if m is None or m.group(1) == "NULL" else m.group(1)
    rest = _MYSQL_DEFAULT.sub("", definition)
    rest = re.sub(r"(^| )(NOT )?NULL(?= |$)", "", rest).strip()
    return ColumnShape(name, rest, nullable, default)


def _mysql_shape(conn: Any, quoted: str) -> TableShape | None:
    try:
        create = conn.exec_driver_sql(f"SHOW CREATE TABLE {quoted}").fetchone()[1]
    except sa.exc.DBAPIError as exc:
        if "doesn't exist" in str(exc):
            return None
        raise
    cols: dict[str, ColumnShape] = {}
    key: tuple[str, ...] = ()
    for line in create.splitlines():
        m = _MYSQL_COLUMN.match(line)
        if m:
            name = m.group(1).replace("``", "`")
            cols[name] = _mysql_column(name, m.group(2))
        elif line.strip().startswith("PRIMARY KEY"):
            key = tuple(n.replace("``", "`") for n in _MYSQL_NAME.findall(line))
    return TableShape(cols, key)


def _sqlite_shape(conn: Any, db: str, quoted: str) -> TableShape | None:
    info = conn.exec_driver_sql(f"PRAGMA {db}.table_info({quoted})").fetchall()
    if not info:
        return None
    cols = {r[1]: ColumnShape(r[1], r[2], not r[3], r[4]) for r in info}
    return TableShape(cols, tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])))


def target_shape(conn: Any, dialect: str, schema: str | None, name: str, *, temporary: bool = False
                 ) -> TableShape | None:
    """The downstream table ``schema.name`` (``schema`` None on MySQL/SQLite) as reflected on ``conn``
    (a SQLAlchemy connection to the target); None when there is no such table. ``temporary``: the session's
    temporary table of that name."""
    q = conn.dialect.identifier_preparer.quote_identifier
    if dialect == "postgresql":
        return _pg_shape(conn, f"pg_temp.{q(name)}" if temporary else f"{q(schema or 'public')}.{q(name)}")
    if dialect == "mysql":
        return _mysql_shape(conn, q(name))
    return _sqlite_shape(conn, "temp" if temporary else "main", q(name))


def _planned_shape(conn: Any, dialect: str, schema: Any) -> tuple[TableShape, tuple[str, ...]]:
    """The shape the target gives the sink's plan of ``schema`` (a temporary table, dropped again), and the
    planned key."""
    probe = f"tw_probe_{uuid.uuid4().hex[:10]}"
    plan = plan_table(schema, dialect, target_schema=None, target_name=probe)
    collation = "utf8mb4_bin"
    if dialect == "mysql":
        d = conn.dialect
        collation = mysql_collation(bool(getattr(d, "is_mariadb", False)),
                                    tuple(getattr(d, "server_version_info", None) or (0,)))
    sql = create_table_sql(plan, dialect, conn.dialect.identifier_preparer, mysql_collation=collation)
    assert sql.startswith("CREATE TABLE IF NOT EXISTS ")
    conn.exec_driver_sql("CREATE TEMPORARY TABLE " + sql[len("CREATE TABLE IF NOT EXISTS "):])
    try:
        shape = target_shape(conn, dialect, None, probe, temporary=True)
    finally:
        conn.exec_driver_sql(("DROP TEMPORARY TABLE " if dialect == "mysql" else "DROP TABLE ")
                             + ("temp." if dialect == "sqlite" else "")
                             + conn.dialect.identifier_preparer.quote_identifier(probe))
    assert shape is not None, f"the planned table {probe} was not created"
    return shape, plan.key


def _diff(qualified: str, target: str, got: TableShape, want: TableShape, key: tuple[str, ...]) -> SchemaDiff:
    out = SchemaDiff(qualified, target)
    only_up = [n for n in want.columns if n not in got.columns]
    only_down = [n for n in got.columns if n not in want.columns]
    if only_up:
        out.problems.append(f"columns missing downstream: {only_up}")
    if only_down:
        out.problems.append(f"columns only downstream: {only_down}")
    for name, w in want.columns.items():
        g = got.columns.get(name)
        if g is None:
            continue
        if g.type != w.type:
            out.problems.append(f"column {name!r}: type {g.type!r} downstream, {w.type!r} as mapped")
        if g.nullable != w.nullable:
            out.problems.append(f"column {name!r}: {'nullable' if g.nullable else 'NOT NULL'} downstream, "
                                f"{'nullable' if w.nullable else 'NOT NULL'} as mapped")
        if g.default is not None:
            out.problems.append(f"column {name!r}: default {g.default!r} downstream (the mapping copies none)")
    if got.key != key:
        out.problems.append(f"primary key {list(got.key)} downstream, {list(key)} as mapped")
    assert want.key == key, (want.key, key)  # the plan's own key, as the target reflects it
    return out


def compare_schemas(pg_conn: Any, tables: list[str], sink_uri: str) -> list[SchemaDiff]:
    """Compare the downstream tables of the upstream ``schema.table`` names in ``tables`` (read on
    ``pg_conn``, their current schema) with what the SQL sink at ``sink_uri`` maps them to: column names,
    types, nullability, no defaults, primary key (see the module doc)."""
    dialect = DIALECTS[parse_sink_uri(sink_uri).scheme]
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    out = []
    try:
        with engine.connect() as conn:
            for qualified in tables:
                name = TableName.parse(qualified)
                upstream = catalog.table_schema(pg_conn, name)
                tschema = name.schema if dialect == "postgresql" else None
                target = f"{tschema}.{name.table}" if tschema else name.table
                got = target_shape(conn, dialect, tschema, name.table)
                if got is None:
                    out.append(SchemaDiff(qualified, target, [f"table {target} missing downstream"]))
                    continue
                want, key = _planned_shape(conn, dialect, upstream)
                out.append(_diff(qualified, target, got, want, key))
            conn.rollback()
    finally:
        engine.dispose()
    return out


def assert_schemas_equal(pg_conn: Any, tables: list[str], sink_uri: str) -> None:
    """:func:`compare_schemas` found no difference (the assertion names every one)."""
    bad = [d for d in compare_schemas(pg_conn, tables, sink_uri) if not d.equal]
    assert not bad, "downstream schema differs from the upstream's as mapped: " + "; ".join(
        f"{d.table} -> {d.target}: {', '.join(d.problems)}" for d in bad)


def target_tables(sink_uri: str, schema: str = "public") -> set[str]:
    """The names of the base tables downstream (PostgreSQL: in ``schema``), without Tidewater's own
    (``tidewater_*``: positions, the DDL record)."""
    dialect = DIALECTS[parse_sink_uri(sink_uri).scheme]
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        names = sa.inspect(engine).get_table_names(schema=schema if dialect == "postgresql" else None)
    finally:
        engine.dispose()
    return {n for n in names if not n.startswith("tidewater_")}


def downstream_shape(sink_uri: str, table: str) -> TableShape | None:
    """The downstream table of upstream ``schema.table`` as :func:`target_shape` reflects it (None when the
    table is missing downstream)."""
    dialect = DIALECTS[parse_sink_uri(sink_uri).scheme]
    name = TableName.parse(table)
    engine = sa.create_engine(sqlalchemy_url(sink_uri))
    try:
        with engine.connect() as conn:
            return target_shape(conn, dialect, name.schema if dialect == "postgresql" else None, name.table)
    finally:
        engine.dispose()


def target_columns(sink_uri: str, table: str) -> list[str]:
    """The column names of upstream ``schema.table``'s downstream table, in the target's order (empty when
    the table is missing downstream)."""
    shape = downstream_shape(sink_uri, table)
    return list(shape.columns) if shape is not None else []
