"""PostgreSQL column types as the MySQL-shaped protocols (canal-json, open-protocol, CSV) describe them.

TiCDC's protocols describe a column by MySQL type: canal-json's ``mysqlType`` (the bare type name, as TiCDC writes it
without ``content-compatible``) and ``sqlType`` (the ``java.sql.Types`` code TiCDC derives from it), open-protocol's
type code ``t`` and flags ``f``. A PostgreSQL column is described as the MySQL column the SQL sink creates for it
(docs/type-mapping.md, MySQL column) - so a consumer that replays canal-json or open-protocol into MySQL gets the
same table as Tidewater's MySQL sink:

=====================  =============  =======  =====  ======  ==========================================
PostgreSQL base type   mysqlType      sqlType  t      binary  value (canal-json text / open-protocol "v")
=====================  =============  =======  =====  ======  ==========================================
int2                   smallint       5        2      yes     decimal digits / number
int4                   int            4        3      yes     decimal digits / number
int8, oid, xid, cid    bigint         -5       8      yes     decimal digits / number
xid8                   bigint         -5       8      yes     (unsigned flag) decimal digits / number
numeric                decimal        3        246    yes     exact decimal text (``NaN``, ``Infinity``)
float4                 float          7        4      yes     shortest digits / number
float8                 double         8        5      yes     shortest digits / number
bool                   tinyint        -6       1      yes     ``1`` / ``0``
varchar, name          varchar        12       15     no      the text
bpchar, "char"         char           1        254    no      the text (blank padding kept)
text                   longtext       2005     251    no      the text / base64 of its UTF-8
bytea                  longblob       2004     251    yes     ISO-8859-1 text of the bytes / base64
date                   date           91       10     yes     ``YYYY-MM-DD``
time                   time           92       11     yes     ``HH:MM:SS[.f]`` (f: the column's precision)
timestamp              datetime       93       12     yes     ``YYYY-MM-DD HH:MM:SS[.f]``
timestamptz            timestamp      93       7      yes     the same, in UTC
uuid                   char           1        254    no      canonical text
json, jsonb            json           12       245    yes     the JSON text as PostgreSQL sent it
arrays (any element)   json           12       245    yes     a JSON array (see sinks.codec.text)
timetz, interval       varchar        12       15     no      PostgreSQL's text
anything else          longtext       2005     251    no      PostgreSQL's text (enums: the label)
=====================  =============  =======  =====  ======  ==========================================

"binary" is TiCDC's BinaryFlag (0x01): TiDB sets it on every non-string column and on binary strings.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.events import ColumnSchema, TableSchema

# java.sql.Types codes (TiCDC's JavaSQLType)
JAVA_BIT, JAVA_TINYINT, JAVA_SMALLINT, JAVA_INTEGER, JAVA_BIGINT = -7, -6, 5, 4, -5
JAVA_REAL, JAVA_DOUBLE, JAVA_DECIMAL, JAVA_CHAR, JAVA_VARCHAR = 7, 8, 3, 1, 12
JAVA_DATE, JAVA_TIME, JAVA_TIMESTAMP, JAVA_BLOB, JAVA_CLOB = 91, 92, 93, 2004, 2005

# MySQL protocol type codes (TiCDC open-protocol "t")
MYSQL_TINY, MYSQL_SHORT, MYSQL_LONG, MYSQL_FLOAT, MYSQL_DOUBLE = 1, 2, 3, 4, 5
MYSQL_TIMESTAMP, MYSQL_LONGLONG, MYSQL_DATE, MYSQL_DURATION, MYSQL_DATETIME = 7, 8, 10, 11, 12
MYSQL_VARCHAR, MYSQL_JSON, MYSQL_NEWDECIMAL, MYSQL_LONGBLOB, MYSQL_STRING = 15, 245, 246, 251, 254

# TiCDC column flags (open-protocol "f")
FLAG_BINARY, FLAG_HANDLE_KEY, FLAG_PRIMARY_KEY, FLAG_NULLABLE, FLAG_UNSIGNED = 0x01, 0x02, 0x08, 0x40, 0x80

# value kinds: how sinks.codec.text renders a value of the column
K_INT, K_BOOL, K_DECIMAL, K_FLOAT, K_TEXT, K_BYTES = "int", "bool", "decimal", "float", "text", "bytes"
K_DATE, K_TIME, K_DATETIME, K_TIMESTAMPTZ, K_UUID, K_ARRAY = "date", "time", "datetime", "timestamptz", "uuid", "array"
K_LONGTEXT = "longtext"  # text the open-protocol writes base64-encoded (MySQL TEXT types)


@dataclass(frozen=True, slots=True)
class MySQLType:
    mysql_type: str
    java_type: int
    code: int
    binary: bool
    kind: str
    unsigned: bool = False


_SCALARS: dict[str, MySQLType] = {
    "int2": MySQLType("smallint", JAVA_SMALLINT, MYSQL_SHORT, True, K_INT),
    "int4": MySQLType("int", JAVA_INTEGER, MYSQL_LONG, True, K_INT),
    "int8": MySQLType("bigint", JAVA_BIGINT, MYSQL_LONGLONG, True, K_INT),
    "oid": MySQLType("bigint", JAVA_BIGINT, MYSQL_LONGLONG, True, K_INT),
    "xid": MySQLType("bigint", JAVA_BIGINT, MYSQL_LONGLONG, True, K_INT),
    "cid": MySQLType("bigint", JAVA_BIGINT, MYSQL_LONGLONG, True, K_INT),
    "xid8": MySQLType("bigint", JAVA_BIGINT, MYSQL_LONGLONG, True, K_INT, unsigned=True),
    "numeric": MySQLType("decimal", JAVA_DECIMAL, MYSQL_NEWDECIMAL, True, K_DECIMAL),
    "float4": MySQLType("float", JAVA_REAL, MYSQL_FLOAT, True, K_FLOAT),
    "float8": MySQLType("double", JAVA_DOUBLE, MYSQL_DOUBLE, True, K_FLOAT),
    "bool": MySQLType("tinyint", JAVA_TINYINT, MYSQL_TINY, True, K_BOOL),
    "varchar": MySQLType("varchar", JAVA_VARCHAR, MYSQL_VARCHAR, False, K_TEXT),
    "name": MySQLType("varchar", JAVA_VARCHAR, MYSQL_VARCHAR, False, K_TEXT),
    "bpchar": MySQLType("char", JAVA_CHAR, MYSQL_STRING, False, K_TEXT),
    "char": MySQLType("char", JAVA_CHAR, MYSQL_STRING, False, K_TEXT),
    "text": MySQLType("longtext", JAVA_CLOB, MYSQL_LONGBLOB, False, K_LONGTEXT),
    "bytea": MySQLType("longblob", JAVA_BLOB, MYSQL_LONGBLOB, True, K_BYTES),
    "date": MySQLType("date", JAVA_DATE, MYSQL_DATE, True, K_DATE),
    "time": MySQLType("time", JAVA_TIME, MYSQL_DURATION, True, K_TIME),
    "timestamp": MySQLType("datetime", JAVA_TIMESTAMP, MYSQL_DATETIME, True, K_DATETIME),
    "timestamptz": MySQLType("timestamp", JAVA_TIMESTAMP, MYSQL_TIMESTAMP, True, K_TIMESTAMPTZ),
    "uuid": MySQLType("char", JAVA_CHAR, MYSQL_STRING, False, K_UUID),
    "json": MySQLType("json", JAVA_VARCHAR, MYSQL_JSON, True, K_TEXT),
    "jsonb": MySQLType("json", JAVA_VARCHAR, MYSQL_JSON, True, K_TEXT),
    "timetz": MySQLType("varchar", JAVA_VARCHAR, MYSQL_VARCHAR, False, K_TEXT),
    "interval": MySQLType("varchar", JAVA_VARCHAR, MYSQL_VARCHAR, False, K_TEXT),
}
_ARRAY = MySQLType("json", JAVA_VARCHAR, MYSQL_JSON, True, K_ARRAY)
_OTHER = MySQLType("longtext", JAVA_CLOB, MYSQL_LONGBLOB, False, K_LONGTEXT)


def mysql_type(col: ColumnSchema) -> MySQLType:
    """How canal-json and open-protocol describe ``col`` (see the module table)."""
    if col.is_array:
        return _ARRAY
    return _SCALARS.get(col.base_type, _OTHER)


def value_kind(col: ColumnSchema) -> str:
    """The rendering family of ``col``'s values (``K_*``); arrays are ``K_ARRAY``."""
    return mysql_type(col).kind


def element_kind(col: ColumnSchema) -> str:
    """The rendering family of one element of an array column (of the value itself for a scalar column)."""
    return _SCALARS.get(col.base_type, _OTHER).kind


def fraction_digits(col: ColumnSchema) -> int:
    """Fractional second digits of a time/timestamp column: its declared precision, 6 when it has none."""
    tm = col.type_modifier
    return tm if 0 <= tm <= 6 else 6


def numeric_precision_scale(col: ColumnSchema) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric(p,s)`` column, None for an unconstrained ``numeric``."""
    tm = col.type_modifier
    if tm < 4:
        return None
    tm -= 4
    precision = (tm >> 16) & 0xFFFF
    scale = tm & 0x7FF
    if scale & 0x400:  # PostgreSQL 15+: negative scales, 11-bit two's complement
        scale -= 0x800
    return precision, scale


def column_flags(col: ColumnSchema, schema: TableSchema) -> int:
    """TiCDC's column flags of ``col`` (handle key and primary key for the table's key columns)."""
    t = mysql_type(col)
    flags = FLAG_BINARY if t.binary else 0
    if schema.has_key and col.name in schema.key:
        flags |= FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY
    if col.nullable:
        flags |= FLAG_NULLABLE
    if t.unsigned:
        flags |= FLAG_UNSIGNED
    return flags
