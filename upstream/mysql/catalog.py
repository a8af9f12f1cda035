"""The upstream's tables as ``information_schema`` describes them now.

A MySQL table has no stable object id that survives what PostgreSQL's oid survives (InnoDB's table id changes
with TRUNCATE and rebuilds), so a table's ``relation_id`` is derived from its name (:func:`relation_id`: CRC-32 of
``schema.table``, 31 bits, never 0). A renamed table is therefore another relation.

The key (``TableSchema.key``) is the primary key, else the first unique index (by name) whose columns are all
NOT NULL; without either, ``has_key`` is False and the key is every column.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from cdc.errors import InvalidArgument
from cdc.events import ColumnSchema, TableName, TableSchema
from upstream.mysql import types
from upstream.mysql.conn import mysql_errors

GUESSED = "tidewater: guessed"
"""``ColumnFacts.extra`` of a column whose MySQL type was guessed from a recorded description (:func:`facts_as_of`):
the span takes its renderer from the binlog's own column (``types.guessed_renderer``)."""


def relation_id(name: TableName) -> int:
    """The relation id of ``schema.table`` (stable across restarts and captures; 31 bits, never 0)."""
    return (zlib.crc32(f"{name.schema}.{name.table}".encode()) & 0x7FFF_FFFF) or 1


@dataclass(frozen=True, slots=True)
class ColumnFacts:
    """What ``information_schema.COLUMNS`` says of one column (for rendering and refusals)."""

    name: str
    data_type: str
    column_type: str
    nullable: bool
    extra: str
    char_len: int | None
    precision: int | None
    scale: int | None
    fsp: int | None

    def refusal(self) -> str | None:
        return types.column_refusal(self.data_type, self.column_type, self.extra)


@dataclass(frozen=True, slots=True)
class TableFacts:
    """One table: its columns in order, its primary key, and its unique indexes on NOT NULL columns."""

    name: TableName
    columns: tuple[ColumnFacts, ...]
    primary: tuple[str, ...]
    unique_not_null: tuple[tuple[str, tuple[str, ...]], ...]  # (index name, columns)

    @property
    def key(self) -> tuple[str, ...]:
        if self.primary:
            return self.primary
        return self.unique_not_null[0][1] if self.unique_not_null else ()

    def schema(self, version: int = 0) -> TableSchema:
        """The vocabulary's schema (raises ValueError for a column :meth:`ColumnFacts.refusal` refuses)."""
        key = self.key
        keyset = set(key)
        cols: list[ColumnSchema] = []
        for c in self.columns:
            cols.append(types.column_schema(c.name, c.data_type, c.column_type, nullable=c.nullable,
                                            is_key=c.name in keyset, char_len=c.char_len, precision=c.precision,
                                            scale=c.scale, fsp=c.fsp))
        has_key = bool(key)
        return TableSchema(self.name, tuple(cols), key if has_key else tuple(c.name for c in self.columns), "d",
                           relation_id(self.name), version, has_key)

    def renderers(self) -> tuple[types.Render, ...]:
        return tuple(types.renderer(c.data_type, c.column_type, c.char_len) for c in self.columns)


_TABLES = """
SELECT TABLE_NAME FROM information_schema.TABLES
WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME
"""

_COLUMNS = """
SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, EXTRA, CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION,
       NUMERIC_SCALE, DATETIME_PRECISION
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION
"""

_INDEXES = """
SELECT INDEX_NAME, COLUMN_NAME, NULLABLE, SUB_PART FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX
"""


def list_tables(conn: Any, where: str, database: str) -> list[TableName]:
    with mysql_errors(where, "listing tables"), conn.cursor() as cur:
        cur.execute(_TABLES, (database,))
        return [TableName(database, r[0]) for r in cur.fetchall()]


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def table_facts(conn: Any, where: str, name: TableName) -> TableFacts:
    """``name``'s columns and keys now; ``InvalidArgument`` when there is no such table."""
    with mysql_errors(where, f"reading the columns of {name}"), conn.cursor() as cur:
        cur.execute(_COLUMNS, (name.schema, name.table))
        rows = cur.fetchall()
        if not rows:
            raise InvalidArgument(f"table {name} does not exist in MySQL {where}")
        cur.execute(_INDEXES, (name.schema, name.table))
        idx_rows = cur.fetchall()
    cols = tuple(ColumnFacts(r[0], str(r[1]), str(r[2]), r[3] == "YES", str(r[4] or ""), _int(r[5]), _int(r[6]),
                             _int(r[7]), _int(r[8])) for r in rows)
    indexes: dict[str, list[tuple[str, bool, Any]]] = {}
    for idx, col, nullable, sub_part in idx_rows:
        indexes.setdefault(idx, []).append((col, nullable == "YES", sub_part))
    primary: tuple[str, ...] = ()
    unique: list[tuple[str, tuple[str, ...]]] = []
    for idx, parts in sorted(indexes.items()):
        if any(sub is not None for _, _, sub in parts):
            continue  # a prefix index does not identify rows by their whole values
        names = tuple(c for c, _, _ in parts)
        if idx == "PRIMARY":
            primary = names
        elif not any(n for _, n, _ in parts):
            unique.append((idx, names))
    return TableFacts(name, cols, primary, tuple(unique))


def _same(a: ColumnSchema, b: ColumnSchema) -> bool:
    return (a.name, a.base_type, a.type_name, a.type_modifier) == (b.name, b.base_type, b.type_name, b.type_modifier)


def facts_as_of(schema: TableSchema, now: TableFacts | None) -> TableFacts:
    """The facts of ``schema`` (a recorded version, e.g. the schema history's at a span's start): each column the
    catalog shows ``now`` the same way keeps the catalog's exact MySQL type; any other (dropped or changed since)
    gets the type :func:`upstream.mysql.types.facts_of` names. The key is the recorded one."""
    current = {c.name: c for c in now.columns} if now is not None else {}
    cols: list[ColumnFacts] = []
    for col in schema.columns:
        c = current.get(col.name)
        if c is not None and _same(col, types.column_schema(
                c.name, c.data_type, c.column_type, nullable=c.nullable, is_key=False, char_len=c.char_len,
                precision=c.precision, scale=c.scale, fsp=c.fsp)):
            cols.append(ColumnFacts(c.name, c.data_type, c.column_type, col.nullable, c.extra, c.char_len,
                                    c.precision, c.scale, c.fsp))
            continue
        dt, ct, n, p, sc, fsp = types.facts_of(col)
        cols.append(ColumnFacts(col.name, dt, ct, col.nullable, GUESSED, n, p, sc, fsp))
    key = tuple(schema.key) if schema.has_key else ()
    return TableFacts(schema.name, tuple(cols), key, ())
