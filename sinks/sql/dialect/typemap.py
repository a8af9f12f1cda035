"""Type mapping and CREATE TABLE for the SQL sink (the rules are documented in docs/type-mapping.md).

:func:`plan_table` turns an upstream :class:`cdc.events.TableSchema` into a :class:`TargetTable` (column
names, DDL types, key) for one dialect; :func:`create_table_sql` renders the ``CREATE TABLE IF NOT EXISTS``
statement(s) with every identifier quoted by the dialect's identifier preparer. Pure functions, no I/O.

Choices that matter for correctness:
- Only the key is copied as a constraint (NOT NULL + PRIMARY KEY); other columns are nullable downstream
  (the upstream enforces its constraints; a row inserted without its UNCHANGED columns must be storable).
- MySQL/MariaDB tables use a binary, NO PAD collation so that keys differing in case or trailing spaces
  stay distinct rows, as they are upstream.
- MySQL/MariaDB key columns of text or bytea type get a bounded VARCHAR/VARBINARY: the whole key must fit
  InnoDB's 3072-byte index limit (4 bytes per utf8mb4 character).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cdc.events import ColumnSchema, TableSchema

MYSQL_MAX_KEY_BYTES = 3072
MYSQL_BYTES_PER_CHAR = 4  # utf8mb4

# Base types kept verbatim (``type_name``, i.e. format_type()) on a PostgreSQL target: built-in types
# whose text form PostgreSQL parses back. Other types (enums, domains, composites, extension types) may
# not exist downstream and become ``text``.
PG_VERBATIM_TYPES = frozenset({
    "int2", "int4", "int8", "numeric", "float4", "float8", "bool", "text", "varchar", "bpchar", "char", "name",
    "bytea", "date", "time", "timetz", "timestamp", "timestamptz", "interval", "uuid", "json", "jsonb",
    "inet", "cidr", "macaddr", "macaddr8", "bit", "varbit", "xml", "money", "tsvector", "tsquery",
    "point", "line", "lseg", "box", "path", "polygon", "circle", "int4range", "int8range", "numrange",
    "daterange", "tsrange", "tstzrange", "pg_lsn",
})


@dataclass(frozen=True, slots=True)
class TargetColumn:
    """One downstream column. ``ddl_type`` is None for columns of a reflected (pre-existing) table."""

    name: str
    ddl_type: str | None = None
    nullable: bool = True
    is_json: bool = False  # MySQL JSON / PostgreSQL json: equality needs a cast (see statements.py)
    scale: int | None = None  # DECIMAL scale when known


@dataclass(frozen=True, slots=True)
class TargetTable:
    """A downstream table: ``schema`` is None for MySQL/SQLite (the URI's database); ``key`` is empty for
    a table without a key."""

    schema: str | None
    name: str
    columns: tuple[TargetColumn, ...]
    key: tuple[str, ...]

    def column(self, name: str) -> TargetColumn:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


# ---- upstream type details ---------------------------------------------------------------------------
_LEN_RE = re.compile(r"\((\d+)\)")
_NUMERIC_RE = re.compile(r"numeric\((\d+)(?:\s*,\s*(-?\d+))?\)")


def char_length(col: ColumnSchema) -> int | None:
    """Declared length of varchar(n)/char(n), or None when unbounded."""
    if col.base_type not in ("varchar", "bpchar"):
        return None
    if col.type_modifier >= 4:
        return col.type_modifier - 4
    m = _LEN_RE.search(col.type_name)
    return int(m.group(1)) if m else None


def numeric_precision_scale(col: ColumnSchema) -> tuple[int, int] | None:
    """(precision, scale) of numeric(p,s) (scale may be negative since PostgreSQL 15), None if unbounded."""
    if col.base_type != "numeric":
        return None
    if col.type_modifier >= 4:
        tm = col.type_modifier - 4
        scale = ((tm & 0x7FF) ^ 1024) - 1024
        return (tm >> 16) & 0xFFFF, scale
    m = _NUMERIC_RE.search(col.type_name)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


# ---- MySQL / MariaDB ---------------------------------------------------------------------------------
_MYSQL_FIXED = {
    "int2": ("SMALLINT", 2), "int4": ("INT", 4), "int8": ("BIGINT", 8), "oid": ("BIGINT", 8),
    "xid": ("BIGINT", 8), "cid": ("BIGINT", 8), "xid8": ("DECIMAL(20,0)", 10),
    "float4": ("DOUBLE", 8), "float8": ("DOUBLE", 8), "bool": ("TINYINT(1)", 1), "date": ("DATE", 3),
    "time": ("TIME(6)", 6), "timestamp": ("DATETIME(6)", 8), "timestamptz": ("DATETIME(6)", 8),
    "uuid": ("CHAR(36) CHARACTER SET ascii COLLATE ascii_bin", 36),
}
_MYSQL_DECIMAL_MAX_P, _MYSQL_DECIMAL_MAX_S = 65, 30


def _mysql_decimal(col: ColumnSchema) -> tuple[str, int]:
    ps = numeric_precision_scale(col)
    if ps is None:
        return f"DECIMAL({_MYSQL_DECIMAL_MAX_P},{_MYSQL_DECIMAL_MAX_S})", _MYSQL_DECIMAL_MAX_S
    p, s = ps
    if s < 0:  # numeric(3,-2): integers rounded to hundreds upstream; digits = p - s
        p, s = p - s, 0
    s = min(s, _MYSQL_DECIMAL_MAX_S)
    p = max(min(p, _MYSQL_DECIMAL_MAX_P), s, 1)
    return f"DECIMAL({p},{s})", s


def _mysql_text(col: ColumnSchema) -> str:
    n = char_length(col)
    if col.base_type == "char":
        return "VARCHAR(1)"
    if col.base_type == "name":
        return "VARCHAR(64)"
    if col.base_type == "interval":
        return "VARCHAR(255)"
    if col.base_type == "timetz":
        return "VARCHAR(32)"
    if n is not None and n <= 255:
        return f"VARCHAR({n})"
    if n is not None and n * MYSQL_BYTES_PER_CHAR <= 65535:
        return "TEXT"
    return "LONGTEXT"


def _mysql_key_chars(col: ColumnSchema) -> int | None:
    """Declared maximum length in characters of a text-like key column (None = unbounded)."""
    fixed = {"char": 1, "name": 64, "interval": 255, "timetz": 32}
    if col.base_type in fixed and not col.is_array:
        return fixed[col.base_type]
    return char_length(col) if not col.is_array else None


def _is_mysql_fixed_key(col: ColumnSchema) -> bool:
    return not col.is_array and (col.base_type in _MYSQL_FIXED or col.base_type == "numeric")


def _mysql_key_types(cols: list[ColumnSchema]) -> dict[str, str]:
    """Types of the key columns, sharing InnoDB's 3072-byte key limit between the variable-length ones."""
    out: dict[str, str] = {}
    budget = MYSQL_MAX_KEY_BYTES
    variable: list[ColumnSchema] = []
    for c in cols:
        if _is_mysql_fixed_key(c):
            if c.base_type == "numeric":
                out[c.name] = _mysql_decimal(c)[0]
                budget -= 30
            else:
                t, size = _MYSQL_FIXED[c.base_type]
                out[c.name] = t
                budget -= size
        else:
            variable.append(c)

    def wanted_bytes(c: ColumnSchema) -> float:
        n = _mysql_key_chars(c)
        if c.base_type == "bytea" and not c.is_array:
            return float("inf")
        return float("inf") if n is None else n * MYSQL_BYTES_PER_CHAR

    remaining = sorted(variable, key=wanted_bytes)
    while remaining:
        c = remaining.pop(0)
        share = max(budget // (len(remaining) + 1), MYSQL_BYTES_PER_CHAR)
        want = wanted_bytes(c)
        size = int(min(want, share))
        budget -= size
        if c.base_type == "bytea" and not c.is_array:
            out[c.name] = f"VARBINARY({size})"
        else:
            out[c.name] = f"VARCHAR({max(size // MYSQL_BYTES_PER_CHAR, 1)})"
    return out


def _mysql_column(col: ColumnSchema) -> tuple[str, bool, int | None]:
    """(DDL type, is JSON, decimal scale) of a non-key column."""
    if col.is_array:
        return "JSON", True, None
    base = col.base_type
    if base in _MYSQL_FIXED:
        return _MYSQL_FIXED[base][0], False, None
    if base == "numeric":
        t, s = _mysql_decimal(col)
        return t, False, s
    if base == "bytea":
        return "LONGBLOB", False, None
    if base in ("json", "jsonb"):
        return "JSON", True, None
    if base in ("text", "varchar", "bpchar", "char", "name", "interval", "timetz"):
        return _mysql_text(col), False, None
    return "LONGTEXT", False, None


# ---- SQLite ------------------------------------------------------------------------------------------
_SQLITE = {
    "int2": "INTEGER", "int4": "INTEGER", "int8": "INTEGER", "oid": "INTEGER", "xid": "INTEGER",
    "cid": "INTEGER", "xid8": "INTEGER", "float4": "REAL",
    "float8": "REAL", "bool": "BOOLEAN", "bytea": "BLOB", "date": "DATE", "time": "TIME",
    "timestamp": "DATETIME", "timestamptz": "DATETIME",
}


def _sqlite_column(col: ColumnSchema) -> str:
    """numeric is always TEXT (the exact decimal text): NUMERIC affinity would turn '0.0000001' into the REAL
    1e-07, drop trailing zeros ('1.50' -> 1.5) and keep only 15 significant digits."""
    if col.is_array:
        return "TEXT"
    return _SQLITE.get(col.base_type, "TEXT")


# ---- PostgreSQL --------------------------------------------------------------------------------------
# System types that mean nothing downstream (or lack a btree opclass): stored as plain numbers.
_PG_REPLACED = {"oid": "bigint", "xid": "bigint", "cid": "bigint", "xid8": "numeric(20,0)"}
def _pg_column(col: ColumnSchema) -> tuple[str, bool]:
    """(DDL type, is json): json has no equality operator, so row matching compares its text.

    ``base_type`` ``text`` with another ``type_name`` is a type exchanged as text (an enum, a composite, an
    extension type such as citext): it may not exist downstream, so the column is ``text`` (``text[]``).
    Domains arrive as their base type already (``type_name`` is the base type's, see the upstream catalog).
    """
    base = col.base_type
    is_json = base == "json" and not col.is_array
    if base == "text":
        t = "text"
    elif base in _PG_REPLACED:
        t = _PG_REPLACED[base]
    elif base in PG_VERBATIM_TYPES:
        if col.type_name:
            return col.type_name, is_json
        t = '"char"' if base == "char" else base
    else:
        t = "text"
    return (t + "[]" if col.is_array else t), is_json


# ---- tables ------------------------------------------------------------------------------------------
def plan_table(schema: TableSchema, dialect: str, *, target_schema: str | None, target_name: str) -> TargetTable:
    """The table to create downstream for ``schema`` on ``dialect`` (``mysql``, ``postgresql``, ``sqlite``)."""
    keyed = schema.has_key and bool(schema.key)
    key = tuple(schema.key) if keyed else ()
    key_cols = [schema.column(k) for k in key]
    mysql_keys = _mysql_key_types(key_cols) if dialect == "mysql" else {}
    cols = []
    for c in schema.columns:
        is_key = c.name in key
        is_json = False
        scale: int | None = None
        if dialect == "mysql":
            if is_key:
                t = mysql_keys[c.name]
                if c.base_type == "numeric" and not c.is_array:
                    scale = _mysql_decimal(c)[1]
            else:
                t, is_json, scale = _mysql_column(c)
        elif dialect == "postgresql":
            t, is_json = _pg_column(c)
            ps = numeric_precision_scale(c) if not c.is_array else None
            scale = ps[1] if ps is not None and ps[1] >= 0 else None
        elif dialect == "sqlite":
            t = _sqlite_column(c)
        else:
            raise ValueError(f"unknown dialect {dialect!r}")
        cols.append(TargetColumn(c.name, t, nullable=not is_key, is_json=is_json, scale=scale))
    return TargetTable(target_schema, target_name, tuple(cols), key)


def mysql_collation(mariadb: bool, version: tuple[int, ...]) -> str:
    """The collation of the tables created on a MySQL/MariaDB server (binary, NO PAD where the server has one,
    see the module doc): ``mariadb`` and ``version`` as SQLAlchemy's dialect reports them once connected."""
    if mariadb:
        return "utf8mb4_nopad_bin"
    return "utf8mb4_0900_bin" if version >= (8, 0, 17) else "utf8mb4_bin"


def qualified(preparer: Any, table: TargetTable) -> str:
    """The table's name, always quoted (``"schema"."table"`` or ``"table"``)."""
    q = preparer.quote_identifier(table.name)
    return f"{preparer.quote_identifier(table.schema)}.{q}" if table.schema else q


def create_table_sql(table: TargetTable, dialect: str, preparer: Any, *, mysql_collation: str = "utf8mb4_bin") -> str:
    """``CREATE TABLE IF NOT EXISTS`` for a planned table (every identifier quoted)."""
    q = preparer.quote_identifier
    lines = []
    for c in table.columns:
        assert c.ddl_type is not None, "reflected columns are never created"
        lines.append(f"{q(c.name)} {c.ddl_type}{'' if c.nullable else ' NOT NULL'}")
    if table.key:
        lines.append(f"PRIMARY KEY ({', '.join(q(k) for k in table.key)})")
    sql = f"CREATE TABLE IF NOT EXISTS {qualified(preparer, table)} (\n  " + ",\n  ".join(lines) + "\n)"
    if dialect == "mysql":
        sql += f" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={mysql_collation}"
    return sql


def create_schema_sql(schema: str, preparer: Any) -> str:
    return f"CREATE SCHEMA IF NOT EXISTS {preparer.quote_identifier(schema)}"


def scale_to_check(col: ColumnSchema, target: TargetColumn) -> int | None:
    """The target DECIMAL scale when upstream values may have more fractional digits, else None."""
    if target.scale is None or col.base_type != "numeric" or col.is_array:
        return None
    ps = numeric_precision_scale(col)
    return target.scale if ps is None or ps[1] > target.scale else None
