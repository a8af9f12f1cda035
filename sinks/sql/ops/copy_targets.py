"""What ``changefeed create`` asks of an SQL target before the initial copy: which target tables already hold
rows, and emptying them (``[snapshot] on-existing-rows``); how many rows they hold after a merge copy
(:func:`count_rows`); and dropping a table whose copy starts over under a new definition (:func:`drop_copy_target`).
Names follow the sink's routing (:meth:`sinks.sql.target.connection.Target.target_name`); a table is found as the
sink finds it when it writes (exact name on PostgreSQL, case-insensitively on MySQL/MariaDB and SQLite). Not on the hot path: one catalog read per target
schema and one ``SELECT 1 ... LIMIT 1`` per existing table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from cdc.events import TableName
from sinks.sql.ops.deferred_key import MARKER_TABLE
from sinks.sql.target.catalog import Catalog
from sinks.sql.target.connection import Target
from sinks.sql.target.own_table import PG_SCHEMA


def _existing(target: Target, conn: Any, tables: Sequence[TableName]) -> list[tuple[TableName, str]]:
    """``(table, quoted target)`` of those ``tables`` whose target exists."""
    q = conn.dialect.identifier_preparer.quote
    names: dict[str | None, dict[str, str]] = {}
    out = []
    for t in tables:
        schema, name = target.target_parts(t)
        if schema not in names:
            found = sa.inspect(conn).get_table_names(schema=schema)
            fold = target.dialect != "postgresql"
            names[schema] = {(n.casefold() if fold else n): n for n in found}
        actual = names[schema].get(name.casefold() if target.dialect != "postgresql" else name)
        if actual is not None:
            out.append((t, f"{q(schema)}.{q(actual)}" if schema else q(actual)))
    return out


def tables_with_rows(target: Target, tables: Sequence[TableName]) -> list[TableName]:
    with target.errors(), target.engine.connect() as conn:
        return [t for t, quoted in _existing(target, conn, tables)
                if conn.exec_driver_sql(f"SELECT 1 FROM {quoted} LIMIT 1").first() is not None]


def count_rows(target: Target, tables: Sequence[TableName]) -> dict[TableName, int]:
    with target.errors(), target.engine.connect() as conn:
        found = dict(_existing(target, conn, tables))
        return {t: int(conn.exec_driver_sql(f"SELECT count(*) FROM {found[t]}").scalar() or 0) if t in found else 0
                for t in tables}


def truncate_targets(target: Target, tables: Sequence[TableName]) -> None:
    with target.errors(), target.engine.begin() as conn:  # one transaction
        quoted = [q for _, q in _existing(target, conn, tables)]
        if target.dialect == "postgresql" and quoted:  # one statement: foreign keys among them do not refuse it
            conn.exec_driver_sql(f"TRUNCATE {', '.join(quoted)}")
        else:  # (InnoDB refuses TRUNCATE of a referenced table; SQLite has none)
            for q in quoted:
                conn.exec_driver_sql(f"DELETE FROM {q}")


def drop_copy_target(target: Target, catalog: Catalog, table: TableName, changefeed: str, span: int) -> None:
    """Drop the target of ``table`` if it exists, and the chunk markers the copy of ``changefeed``/``span`` kept for
    it (``sinks.sql.ops.deferred_key``: a stale marker would make a new run record a chunk it never wrote), in one
    transaction where DDL is transactional (PostgreSQL, SQLite; MySQL commits a DROP by itself, and keeps no markers).
    The copy then creates the table from the new definition, as streaming would: the record of the tables the
    changefeed has had (``sinks.sql.target.table_record``) forgets it in the same transaction, so that creating it
    is not refused as a table dropped behind the changefeed's back."""
    with target.errors(), target.engine.begin() as conn:
        if target.dialect == "postgresql":
            markers = f'"{PG_SCHEMA}"."{MARKER_TABLE}"'
            if conn.exec_driver_sql("SELECT to_regclass(%s) IS NOT NULL", (markers,)).scalar():
                conn.exec_driver_sql(f"DELETE FROM {markers} WHERE changefeed = %s AND span = %s AND "
                                     "table_name = %s", (changefeed, span, str(table)))
        for _, quoted in _existing(target, conn, [table]):
            conn.exec_driver_sql(f"DROP TABLE {quoted}")
        had = catalog.record.sql()
        if had.exists(conn):
            conn.exec_driver_sql(had.delete, (changefeed, target.target_name(table)))
    catalog.forget_table(target.target_parts(table))
