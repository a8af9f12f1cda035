"""MySQL/MariaDB column types -> the vocabulary's column types, and binlog values -> their text form.

The vocabulary (``cdc.events.ColumnSchema``) names types by their PostgreSQL base type, and the mounter parses
every value from text with :mod:`upstream.postgres.types`. A MySQL column is therefore described as the
PostgreSQL type that holds exactly its values, and each value the binlog carries (as ``pymysqlreplication``
decodes it) is rendered in that type's text form:

=============================================  ============================  ===================================
MySQL/MariaDB                                  base type (``type_name``)     text of a value
=============================================  ============================  ===================================
TINYINT, SMALLINT, TINYINT UNSIGNED            int2 (smallint)               decimal digits
MEDIUMINT [UNSIGNED], INT, SMALLINT UNSIGNED   int4 (integer)                decimal digits
INT UNSIGNED, BIGINT                           int8 (bigint)                 decimal digits
BIGINT UNSIGNED                                numeric(20,0)                 decimal digits (up to 2**64-1)
DECIMAL(p,s)                                   numeric(p,s)                  exact decimal, scale kept
FLOAT                                          float4 (real)                 shortest text of the float32
DOUBLE                                         float8 (double precision)     ``repr`` (round-trips)
CHAR(n), VARCHAR(n)                            varchar(n)                    the characters
TINYTEXT..LONGTEXT (also MariaDB's JSON)       text                          the characters
JSON (MySQL's binary JSON)                     text                          the JSON text MySQL prints
                                                                             (upstream.mysql.json_binary)
BINARY(n), VARBINARY(n), TINYBLOB..LONGBLOB    bytea                         ``\\x`` + hex (BINARY: 0x00-padded
                                                                             to n, as stored)
DATE                                           date                          ``YYYY-MM-DD``
DATETIME(fsp)                                  timestamp(fsp)                ``YYYY-MM-DD HH:MM:SS[.ffffff]``
TIMESTAMP(fsp)                                 timestamptz(fsp)              the same, in UTC, ``+00``
TIME(fsp)                                      time(fsp)                     ``HH:MM:SS[.ffffff]``
YEAR                                           int2                          the year (0 for ``0000``)
BIT(n)                                         bit(n)                        n characters ``0``/``1``, most
                                                                             significant bit first
ENUM('a',...)                                  text                          the member (``''``: the invalid
                                                                             value, index 0)
SET('a',...)                                   text                          the members in definition order,
                                                                             comma-separated (``''``: empty set)
=============================================  ============================  ===================================

Generated columns (STORED and VIRTUAL) are replicated as plain columns of their type holding the value the
upstream computed: MariaDB's FULL row image carries both kinds, so the target never recomputes an expression
(a target column is a plain column; TiCDC and Debezium likewise ship the upstream's value).

Refused (first rule: never a changed value): a column of any other type (GEOMETRY, INET6,
UUID...) and an ENUM/SET with a member that is not ASCII (the reference client decodes the binlog's member names
as UTF-8 and turns any other into ``''``) are refused by ``changefeed create`` (:func:`column_refusal`); a *value* that its type cannot hold exactly raises ``ValueError`` from its renderer
(zero dates ``0000-00-00``, zero TIMESTAMPs, TIME outside ``00:00:00``-``23:59:59.999999``, text that did not
decode in its character set), which the span reports as a decode error naming the table and column.

Pure functions, no I/O; renderers are built once per schema version.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from cdc.events import ColumnSchema

Render = Callable[[Any], str]
"""One binlog value (never None) -> its text form; raises ValueError for a value that cannot be kept exactly."""

# PostgreSQL type OIDs of the base types used here (upstream.postgres.types)
_OID = {"bit": 1560, "int2": 21, "int4": 23, "int8": 20, "numeric": 1700, "float4": 700, "float8": 701, "varchar": 1043,
        "text": 25, "bytea": 17, "date": 1082, "time": 1083, "timestamp": 1114, "timestamptz": 1184}

_INTS = {  # DATA_TYPE -> (signed base, unsigned base)
    "tinyint": ("int2", "int2"), "smallint": ("int2", "int4"), "mediumint": ("int4", "int4"),
    "int": ("int4", "int8"), "integer": ("int4", "int8"), "bigint": ("int8", "numeric"),
}
_INT_NAMES = {"int2": "smallint", "int4": "integer", "int8": "bigint"}
_TEXTS = frozenset({"tinytext", "text", "mediumtext", "longtext", "json"})
_BLOBS = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
SUPPORTED = frozenset({*_INTS, "decimal", "float", "double", "char", "varchar", *_TEXTS, *_BLOBS, "date",
                       "datetime", "timestamp", "time", "year", "bit", "enum", "set"})
_MEMBER = re.compile(r"'((?:[^'\\]|''|\\.)*)'")
_BIT_LEN = re.compile(r"^bit\s*\(\s*(\d+)\s*\)", re.IGNORECASE)


def members(column_type: str) -> tuple[str, ...]:
    """The members of ``enum('a','b')`` / ``set('a','b')`` (``information_schema.COLUMNS.COLUMN_TYPE``), in
    definition order."""
    body = column_type[column_type.index("(") + 1:column_type.rindex(")")]
    return tuple(m.replace("''", "'").replace("\\\\", "\\") for m in _MEMBER.findall(body))


def bit_length(column_type: str) -> int:
    """n of ``bit(n)`` (``bit`` alone is ``bit(1)``)."""
    m = _BIT_LEN.match(column_type.strip())
    return int(m.group(1)) if m else 1


def column_refusal(data_type: str, column_type: str, extra: str) -> str | None:
    """Why a column cannot be replicated yet (None: it can). ``data_type``/``column_type``/``extra`` as in
    ``information_schema.COLUMNS``. Generated columns are replicated like any other (see the module doc)."""
    dt = data_type.lower()
    if dt not in SUPPORTED:
        return f"type {column_type} is not replicated from MySQL/MariaDB yet (docs/upstream-mysql.md)"
    if dt in ("enum", "set") and not all(m.isascii() for m in members(column_type)):
        return (f"type {column_type}: ENUM/SET members that are not ASCII are not replicated yet (the binlog "
                f"client decodes member names as UTF-8 only; docs/upstream-mysql.md)")
    return None


def column_schema(name: str, data_type: str, column_type: str, *, nullable: bool, is_key: bool,
                  char_len: int | None, precision: int | None, scale: int | None, fsp: int | None) -> ColumnSchema:
    """The vocabulary's column for a supported MySQL column (see the module table)."""
    dt = data_type.lower()
    unsigned = "unsigned" in column_type.lower()
    modifier = -1
    if dt in _INTS:
        base = _INTS[dt][1 if unsigned else 0]
        if base == "numeric":
            type_name, modifier = "numeric(20,0)", ((20 << 16) | 0) + 4
        else:
            type_name = _INT_NAMES[base]
    elif dt == "year":
        base, type_name = "int2", "smallint"
    elif dt == "bit":
        n = bit_length(column_type)
        base, type_name, modifier = "bit", f"bit({n})", n
    elif dt in ("enum", "set"):
        base, type_name = "text", "text"
    elif dt == "decimal":
        p, s = precision or 10, scale or 0
        base, type_name, modifier = "numeric", f"numeric({p},{s})", ((p << 16) | s) + 4
    elif dt == "float":
        base, type_name = "float4", "real"
    elif dt == "double":
        base, type_name = "float8", "double precision"
    elif dt in ("char", "varchar"):
        n = char_len or 1
        base, type_name, modifier = "varchar", f"character varying({n})", n + 4
    elif dt in _TEXTS:
        base, type_name = "text", "text"
    elif dt in _BLOBS:
        base, type_name = "bytea", "bytea"
    elif dt == "date":
        base, type_name = "date", "date"
    elif dt == "datetime":
        base, type_name, modifier = "timestamp", f"timestamp({fsp or 0}) without time zone", fsp or 0
    elif dt == "timestamp":
        base, type_name, modifier = "timestamptz", f"timestamp({fsp or 0}) with time zone", fsp or 0
    elif dt == "time":
        base, type_name, modifier = "time", f"time({fsp or 0}) without time zone", fsp or 0
    else:
        raise ValueError(f"column {name}: type {column_type} is not supported")
    return ColumnSchema(name, _OID[base], base, False, type_name, modifier, nullable and not is_key, is_key)


# binlog field types (MySQL's enum_field_types) each supported DATA_TYPE is written with
_BINLOG_TYPES: dict[str, frozenset[int]] = {
    "tinyint": frozenset({1}), "smallint": frozenset({2}), "mediumint": frozenset({9}), "int": frozenset({3}),
    "integer": frozenset({3}), "bigint": frozenset({8}), "decimal": frozenset({246}), "float": frozenset({4}),
    "double": frozenset({5}), "char": frozenset({254}), "varchar": frozenset({15}), "binary": frozenset({254}),
    "varbinary": frozenset({15}), "date": frozenset({10}), "datetime": frozenset({12, 18}),
    "timestamp": frozenset({7, 17}), "time": frozenset({11, 19}), "year": frozenset({13}), "bit": frozenset({16}),
    "enum": frozenset({247}), "set": frozenset({248}),
    **{t: frozenset({252}) for t in (*_TEXTS, "tinyblob", "blob", "mediumblob", "longblob")},
    "json": frozenset({245}),  # MySQL's binary JSON (MariaDB's JSON is a LONGTEXT: DATA_TYPE longtext)
}


def binlog_type_matches(data_type: str, field_type: int, column: Any = None) -> bool:
    """Whether a binlog column of ``field_type`` can be a column of ``data_type`` (a mismatch: the table's schema
    changed since the span read it). For ENUM/SET the binlog client's ``column`` must also carry the member names
    (from ``binlog_row_metadata=FULL``): without them it delivers every value as NULL or the empty set."""
    if field_type not in _BINLOG_TYPES.get(data_type.lower(), frozenset()):
        return False
    if field_type == 247:
        return bool(getattr(column, "enum_values", None))
    if field_type == 248:
        return bool(getattr(column, "set_values", None))
    return True


# ---- renderers -------------------------------------------------------------------------------------------
def _int(v: Any) -> str:
    if type(v) is not int:
        raise ValueError(f"not an integer: {v!r}")
    return str(v)


def _year(v: Any) -> str:
    if type(v) is not int:
        raise ValueError(f"not a year: {v!r}")
    return "0" if v == 1900 else str(v)  # the library adds 1900 to the stored byte; 0 is YEAR 0000


def _decimal(v: Any) -> str:
    if not isinstance(v, Decimal):
        raise ValueError(f"not a decimal: {v!r}")
    return format(v, "f")


_F32 = struct.Struct("<f")


def _float4(v: Any) -> str:
    """The shortest decimal text that reads back as the same float32 (the library widens it to a double)."""
    x = float(v)
    want = _F32.pack(x)
    for digits in range(1, 10):
        text = format(x, f".{digits}g")
        if _F32.pack(float(text)) == want:
            return text
    return repr(x)


def _float8(v: Any) -> str:
    return repr(float(v))


def _text(v: Any) -> str:
    if type(v) is not str:
        raise ValueError("text that did not decode in its column's character set")
    return v


def _bytes(v: Any) -> bytes:
    """The library hands an empty binary value over as ``''`` (CPython decodes b'' without looking the codec
    up); any other ``str`` for a binary column is refused."""
    if type(v) is bytes:
        return v
    if v == "":
        return b""
    raise ValueError(f"binary value delivered as {type(v).__name__}")


def _bytea(v: Any) -> str:
    v = _bytes(v)
    return "\\x" + v.hex()


def _binary(n: int) -> Render:
    def render(v: Any) -> str:
        return "\\x" + _bytes(v).ljust(n, b"\0").hex()  # the binlog drops BINARY(n)'s trailing 0x00 padding
    return render


def _date(v: Any) -> str:
    if type(v) is not date:
        raise ValueError(f"not a date: {v!r}")
    return v.isoformat()


def _datetime(v: Any) -> str:
    if type(v) is not datetime:
        raise ValueError(f"not a datetime: {v!r}")
    return v.isoformat(sep=" ")


_EPOCH = datetime(1970, 1, 1)


def _timestamp(v: Any) -> str:
    if type(v) is not datetime:
        raise ValueError(f"not a timestamp: {v!r}")
    if v == _EPOCH:  # no TIMESTAMP can be 1970-01-01 00:00:00 UTC: the stored 0 is the zero TIMESTAMP
        raise ValueError("zero TIMESTAMP '0000-00-00 00:00:00'")
    return v.replace(tzinfo=UTC).isoformat(sep=" ").replace("+00:00", "+00")


_DAY = timedelta(days=1)


def _time(v: Any) -> str:
    if type(v) is not timedelta:
        raise ValueError(f"not a time: {v!r}")
    if not timedelta(0) <= v < _DAY:
        raise ValueError(f"TIME {v} is outside 00:00:00..23:59:59.999999 (kept exactly only in that range)")
    secs = v.seconds
    text = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return f"{text}.{v.microseconds:06d}" if v.microseconds else text


def _bit(n: int) -> Render:
    def render(v: Any) -> str:
        if type(v) is str and len(v) == n and not v.strip("01"):
            return v  # the binlog client's form: n characters, most significant bit first
        if type(v) is bytes and len(v) == (n + 7) // 8:
            return format(int.from_bytes(v, "big"), f"0{n}b")  # SELECT's form: big-endian bytes
        raise ValueError(f"not a BIT({n}) value: {v!r}")
    return render


def _enum(allowed: tuple[str, ...]) -> Render:
    valid = frozenset(("", *allowed))

    def render(v: Any) -> str:
        if type(v) is not str or v not in valid:
            raise ValueError(f"not a member of the ENUM: {v!r}")
        return v
    return render


def _set(allowed: tuple[str, ...]) -> Render:
    valid = frozenset(allowed)

    def render(v: Any) -> str:
        if type(v) is str:  # SELECT's form: already the members in definition order
            picked = set(v.split(",")) if v else set()
        elif isinstance(v, set | frozenset):  # the binlog client's form: an unordered set of members
            picked = v
        else:
            raise ValueError(f"not a SET value: {v!r}")
        if not picked <= valid:
            raise ValueError(f"not members of the SET: {sorted(picked - valid)!r}")
        return ",".join(m for m in allowed if m in picked)
    return render


def renderer(data_type: str, column_type: str, char_len: int | None) -> Render:
    """The text renderer of one supported column's non-NULL binlog values."""
    dt = data_type.lower()
    if dt == "bit":
        return _bit(bit_length(column_type))
    if dt == "enum":
        return _enum(members(column_type))
    if dt == "set":
        return _set(members(column_type))
    if dt in _INTS:
        return _int
    if dt == "year":
        return _year
    if dt == "decimal":
        return _decimal
    if dt == "float":
        return _float4
    if dt == "double":
        return _float8
    if dt in ("char", "varchar") or dt in _TEXTS:
        return _text
    if dt == "binary":
        return _binary(char_len or 1)
    if dt in _BLOBS:
        return _bytea
    if dt == "date":
        return _date
    if dt == "datetime":
        return _datetime
    if dt == "timestamp":
        return _timestamp
    if dt == "time":
        return _time
    raise ValueError(f"type {column_type} is not supported")


_INT_DEFAULT = re.compile(r"^-?[0-9]+$")


def default_text(data_type: str, char_len: int | None, scale: int | None, literal: str | None) -> str | None:
    """The text form of the value an added column's DEFAULT ``literal`` gives the existing rows (None: NULL), as
    the stream would render the stored value; ValueError (``ddl.Unsupported``'s base) for a default whose stored
    value Tidewater does not reproduce exactly yet."""
    if literal is None:
        return None
    dt = data_type.lower()
    if dt in _INTS and _INT_DEFAULT.match(literal):
        return str(int(literal))
    if dt == "decimal":
        return format(Decimal(literal).quantize(Decimal(1).scaleb(-(scale or 0))), "f")
    if dt == "varchar" or dt in _TEXTS:
        return literal
    if dt == "char":
        return literal.rstrip(" ")
    raise ValueError(f"a DEFAULT {literal!r} of a {data_type} column added to existing rows is not replicated yet")


def facts_of(column: ColumnSchema) -> tuple[str, str, int | None, int | None, int | None, int | None]:
    """``(data_type, column_type, char_len, precision, scale, fsp)`` of a MySQL column that :func:`column_schema`
    describes as ``column``, for a column the catalog no longer shows as such (dropped or changed since a recorded
    schema version). Where several MySQL types share one description (TINYINT/SMALLINT/YEAR, CHAR/VARCHAR,
    BINARY/VARBINARY/BLOB, BIGINT UNSIGNED/DECIMAL(20,0)) it names one of them; the span's check of every table map
    against the binlog's own column types then refuses the others, loudly, rather than decoding them as another
    type."""
    base, tm = column.base_type, column.type_modifier
    if base == "int2":
        return "smallint", "smallint", None, None, None, None
    if base == "int4":
        return "int", "int", None, None, None, None
    if base == "int8":
        return "bigint", "bigint", None, None, None, None
    if base == "numeric":
        p, sc = ((tm - 4) >> 16) & 0xFFFF, (tm - 4) & 0xFFFF
        return "decimal", f"decimal({p},{sc})", None, p, sc, None
    if base == "float4":
        return "float", "float", None, None, None, None
    if base == "float8":
        return "double", "double", None, None, None, None
    if base == "varchar":
        return "varchar", f"varchar({tm - 4})", tm - 4, None, None, None
    if base == "text":
        return "longtext", "longtext", None, None, None, None
    if base == "bytea":
        return "longblob", "longblob", None, None, None, None
    if base == "date":
        return "date", "date", None, None, None, None
    if base == "bit":
        return "bit", f"bit({max(tm, 1)})", None, None, None, None
    if base == "timestamp":
        return "datetime", f"datetime({max(tm, 0)})", None, None, None, max(tm, 0)
    if base == "timestamptz":
        return "timestamp", f"timestamp({max(tm, 0)})", None, None, None, max(tm, 0)
    if base == "time":
        return "time", f"time({max(tm, 0)})", None, None, None, max(tm, 0)
    raise ValueError(f"column {column.name}: type {column.type_name or base} is not a MySQL column's")


_FIELD_INTS = {1: ("int2", "int2"), 2: ("int2", "int4"), 9: ("int4", "int4"), 3: ("int4", "int8"), 8: ("int8", "numeric")}
_FIELD_FIXED: dict[int, tuple[str, Render]] = {
    246: ("numeric", _decimal), 4: ("float4", _float4), 5: ("float8", _float8), 10: ("date", _date),
    12: ("timestamp", _datetime), 18: ("timestamp", _datetime), 7: ("timestamptz", _timestamp),
    17: ("timestamptz", _timestamp), 11: ("time", _time), 19: ("time", _time),
}


def guessed_renderer(base_type: str, field_type: int, unsigned: bool, binary: bool, max_length: int) -> Render | None:
    """For a column known only by its recorded description (``base_type``; :func:`facts_of` guessed its MySQL type):
    the renderer of the binlog column that carries it (``field_type``, signedness, binary character set, maximum
    length in bytes), or None when no MySQL column described as ``base_type`` is written that way."""
    if field_type in _FIELD_INTS:
        return _int if _FIELD_INTS[field_type][1 if unsigned else 0] == base_type else None
    if field_type == 13:
        return _year if base_type == "int2" else None
    if field_type == 245:  # MySQL's binary JSON, read as its text
        return _text if base_type == "text" else None
    if field_type in _FIELD_FIXED:
        base, render = _FIELD_FIXED[field_type]
        return render if base == base_type else None
    if field_type in (15, 254, 252):
        if binary:
            if base_type != "bytea":
                return None
            return _binary(max_length) if field_type == 254 else _bytea
        if field_type == 252:
            return _text if base_type == "text" else None
        return _text if base_type == "varchar" else None
    return None
