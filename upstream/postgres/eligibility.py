"""Which upstream tables can be published without harm: the checks behind ``changefeed create`` and the
owner's pick-up of new tables.

Publishing a table that has no replica identity PostgreSQL can use makes the *application's* UPDATEs and
DELETEs on it fail (measured on PostgreSQL 18.6: "cannot update table ... because it does not have a
replica identity and publishes updates"); publishing one whose columns cannot all be published leaves
them silently absent downstream. :func:`check_tables` refuses both, naming every table and its fix; it
runs before any publication is touched. Identifiers in messages are quoted as in psql.
"""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from cdc.errors import InvalidArgument, TableNotEligible
from cdc.events import TableName, TableSchema
from upstream.postgres.catalog import generated_columns, partitions, relation_info, table_schema
from upstream.postgres.conn import describe_conn, pg_errors

GENERATED_COLUMNS_VERSION = 180000  # publish_generated_columns exists from PostgreSQL 18 on


def publishes_generated(conn: Any) -> bool:
    """True when publications created by :func:`upstream.postgres.admin.create_publication` on this
    server publish stored generated columns (PostgreSQL 18+)."""
    return int(conn.server_version) >= GENERATED_COLUMNS_VERSION


def _ident(conn: Any, *parts: str) -> str:
    return sql.Identifier(*parts).as_string(conn)


def _table_ident(conn: Any, table: TableName) -> str:
    return _ident(conn, table.schema, table.table)


_CANDIDATE_IDENTITY_INDEX = """
SELECT ci.relname
FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class ci ON ci.oid = i.indexrelid
WHERE i.indrelid = %s AND i.indisunique AND i.indimmediate AND i.indisvalid
  AND i.indpred IS NULL AND i.indexprs IS NULL
  AND NOT EXISTS (SELECT 1 FROM unnest(i.indkey::int2[]) AS k(attnum)
                  JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                  WHERE NOT a.attnotnull)
ORDER BY i.indisprimary DESC, ci.relname
LIMIT 1
"""

_PK_FACTS = """
SELECT i.indimmediate
FROM pg_catalog.pg_index i WHERE i.indrelid = %s AND i.indisprimary
"""


def _identity_fix(conn: Any, oid: int, t: str) -> str:
    """The fix for a table without a usable replica identity: USING INDEX <an existing candidate>, if one
    exists (a non-deferrable, valid, non-partial unique index on NOT NULL columns), else the placeholder."""
    with pg_errors(conn, f"looking for a replica identity index of {t}"), conn.cursor() as cur:
        cur.execute(_CANDIDATE_IDENTITY_INDEX, (oid,))
        row = cur.fetchone()
    index = _ident(conn, row[0]) if row else "<a non-deferrable unique index on NOT NULL columns>"
    return f"ALTER TABLE {t} REPLICA IDENTITY USING INDEX {index} or ALTER TABLE {t} REPLICA IDENTITY FULL"


def _identity_problem(conn: Any, schema: TableSchema, what: str) -> str | None:
    """Why ``schema``'s table has no replica identity PostgreSQL can use (None if it has one).

    Measured on PostgreSQL 18.6: a published table without one (no primary key, REPLICA IDENTITY
    NOTHING, or a DEFERRABLE primary key with REPLICA IDENTITY DEFAULT) fails every UPDATE and DELETE
    with "cannot update table ... because it does not have a replica identity and publishes updates".
    """
    if schema.has_key or schema.replica_identity == "f":
        return None
    t = _table_ident(conn, schema.name)
    ident = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX (the index is gone)"}.get(
        schema.replica_identity, schema.replica_identity
    )
    with pg_errors(conn, f"reading the primary key of {schema.name}"), conn.cursor() as cur:
        cur.execute(_PK_FACTS, (schema.relation_id,))
        row = cur.fetchone()
    if row is not None and not row[0] and schema.replica_identity == "d":
        return (
            f"{what} {t} has a DEFERRABLE primary key, which PostgreSQL cannot use as replica identity: once "
            f"published, every UPDATE and DELETE of {t} would fail; fix with {_identity_fix(conn, schema.relation_id, t)}"
        )
    if row is not None:
        return (
            f"{what} {t} has REPLICA IDENTITY {ident}; fix with "
            f"ALTER TABLE {t} REPLICA IDENTITY DEFAULT (use its primary key) or ALTER TABLE {t} REPLICA IDENTITY FULL"
        )
    return (
        f"{what} {t} has no primary key and REPLICA IDENTITY {ident}; fix with "
        f"ALTER TABLE {t} ADD PRIMARY KEY (<key columns>) or ALTER TABLE {t} REPLICA IDENTITY FULL"
    )


def _generated_problem(conn: Any, oid: int, t: str, publish_generated: bool) -> str | None:
    """Why ``t``'s generated columns cannot be replicated (None when they can, or it has none).

    PostgreSQL 18 sends *stored* generated columns as plain columns when the publication has
    ``publish_generated_columns = stored`` (Tidewater's do); older servers cannot publish them at all.
    *Virtual* generated columns (PostgreSQL 18's default for ``GENERATED ALWAYS AS``) are never
    published. Either way they would be silently absent downstream: refused, naming the columns.
    """
    gen = generated_columns(conn, oid)
    virtual = [c for c, kind in gen.items() if kind == "v"]
    stored = [c for c, kind in gen.items() if kind == "s"]
    if virtual:
        cols = ", ".join(_ident(conn, c) for c in virtual)
        return (
            f"{t} has VIRTUAL generated column(s) {cols}, which PostgreSQL never publishes: they would be missing "
            f"downstream; make them STORED (drop the column and add it again with GENERATED ALWAYS AS (...) STORED), "
            f"or exclude {t} with the filter"
        )
    if publish_generated or not stored:
        return None
    cols = ", ".join(_ident(conn, c) for c in stored)
    where = (
        "this PostgreSQL is older than 18 and cannot publish generated columns"
        if conn.server_version < GENERATED_COLUMNS_VERSION
        else "its publication was created without publish_generated_columns = stored"
    )
    return (
        f"{t} has stored generated column(s) {cols} and {where}: they would be missing downstream (and a replica "
        f"identity containing one makes UPDATE/DELETE fail); upgrade to PostgreSQL 18, or exclude {t} with the filter"
    )


def check_tables(conn: Any, tables: list[TableName], *, publish_generated: bool | None = None) -> list[TableSchema]:
    """Check that every table can be replicated and return their schemas, in the input order.

    A table is eligible when it is a permanent (not temporary or unlogged) ordinary or partitioned
    table with a usable replica identity: a non-deferrable primary key (replica identity DEFAULT), an
    identity index (REPLICA IDENTITY USING INDEX) or REPLICA IDENTITY FULL (then a deferrable primary key
    is fine and is the key); for a partitioned table, every leaf partition must qualify too. Publishing a
    table without one would make UPDATE and DELETE on it *fail upstream*, so this runs before any
    publication is touched. Stored generated columns need a publication that publishes them
    (``publish_generated``: default true on PostgreSQL 18+, where :func:`create_publication` does);
    otherwise a table that has any is refused, and so is a table with a virtual generated column (never
    published): they would be silently absent downstream.

    Raises :class:`cdc.errors.InvalidArgument` naming every missing table, then
    :class:`cdc.errors.TableNotEligible` naming every ineligible table with its fixes.
    """
    gen = publishes_generated(conn) if publish_generated is None else publish_generated
    missing: list[str] = []
    problems: list[str] = []
    schemas: list[TableSchema] = []
    for table in tables:
        info = relation_info(conn, table)
        if info is None:
            missing.append(_table_ident(conn, table))
            continue
        t = _table_ident(conn, info.name)
        if info.relkind not in ("r", "p"):
            kind = {"v": "a view", "m": "a materialized view", "f": "a foreign table", "S": "a sequence"}
            problems.append(f"{t} is {kind.get(info.relkind, 'not a table')}; only tables can be replicated")
            continue
        if info.persistence != "p":
            what = "temporary" if info.persistence == "t" else "unlogged"
            problems.append(f"{t} is {what} and cannot be published; fix with ALTER TABLE {t} SET LOGGED")
            continue
        schema = table_schema(conn, info.oid)
        schemas.append(schema)
        problem = _identity_problem(conn, schema, "table") or _generated_problem(conn, info.oid, t, gen)
        if problem:
            problems.append(problem)
        elif info.relkind == "p":
            for part in partitions(conn, info.oid):
                problem = _identity_problem(conn, table_schema(conn, part.oid), f"partition of {t},")
                if problem:
                    problems.append(problem)
    if missing:
        raise InvalidArgument(
            f"table(s) not found in upstream PostgreSQL {describe_conn(conn)}: {', '.join(missing)}"
        )
    if problems:
        raise TableNotEligible(
            f"{len(problems)} table(s) cannot be replicated (each needs a primary key, a replica identity "
            "index or REPLICA IDENTITY FULL): " + "; ".join(problems)
        )
    return schemas
