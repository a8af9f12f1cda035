"""Value conversion: Python values from the mounter -> what each DB-API driver accepts for a column.

A converter is chosen once per (column, dialect) by :func:`converter` and then called on every non-NULL
value of that column (``None`` is never passed to it). ``None`` as a converter means "the driver takes the
value as it is", so the hot path skips the column entirely. Converters never return a lossy value: a value
the target cannot represent raises :class:`cdc.errors.DataRejected` (a ``SinkError``) naming the table and column
(docs/type-mapping.md lists every conversion).

A converter may carry a ``fast`` attribute ``(T, f)``: for a value whose type is exactly ``T`` the converter
returns ``f(value)``. The sink's generated row functions call ``f`` directly for such values (``f`` is often a
builtin such as ``str``), skipping the converter's own type tests; see :func:`fast_path`.

A converter may also carry ``from_text`` = ``(T, g)``: for a value of exact type ``T`` whose upstream text
(``RowChange.row_text``) is ``s``, ``g(s)`` is either None (not recognised) or exactly ``conv(value)``.
It lets the sink skip formatting a parsed value that arrived as text in the target's form already (SQLite
timestamps: ``2026-11-22 01:02:03.5+00`` -> ``2026-11-22 01:02:03.500000+00:00``); see :func:`text_path`.

Thread-safety: converters are pure functions.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from cdc.errors import DataRejected
from cdc.events import ColumnSchema

Converter = Callable[[Any], Any]

_UTC = dt.UTC


# ---- text forms shared by several targets ------------------------------------------------------------
def iso_datetime(v: dt.datetime) -> str:
    """``YYYY-MM-DD HH:MM:SS.ffffff[+HH:MM]``: fixed width, so text order is time order (per offset)."""
    tz = v.tzinfo
    if tz is None or tz is _UTC:  # the common cases, 3x faster than isoformat()
        return "%04d-%02d-%02d %02d:%02d:%02d.%06d%s" % (  # noqa: UP031 - fastest
            v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, "" if tz is None else "+00:00")
    return v.isoformat(sep=" ", timespec="microseconds")


def iso_time(v: dt.time) -> str:
    return v.isoformat(timespec="microseconds")


def temporal_text(v: Any) -> Any:
    """A datetime, time or date in its ISO text (:func:`iso_datetime`, :func:`iso_time`, ``date.isoformat``);
    anything else as it is."""
    if isinstance(v, dt.datetime):
        return iso_datetime(v)
    if isinstance(v, dt.time):
        return iso_time(v)
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


def _float_text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def decimal_text(v: Decimal) -> str:
    """A Decimal in PostgreSQL's ``numeric_out`` form: fixed point, scale kept (``1.50``, ``0.0000001``,
    ``NaN``, ``Infinity``), never exponent notation (``str()`` gives ``1E-7``). For a Decimal parsed from
    PostgreSQL's text this is that text again."""
    text = str(v)
    if "E" in text and v.is_finite():
        return format(v, "f")
    return text


def _json_element(v: Any) -> Any:
    """One array element as a JSON value (exact: decimals become strings, bytes PostgreSQL's hex text)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else _float_text(v)
    if isinstance(v, Decimal):
        return decimal_text(v)
    if isinstance(v, (dt.date, dt.time)):
        return temporal_text(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(v).hex()
    if isinstance(v, list):
        return [_json_element(x) for x in v]
    return str(v)


def array_to_json(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return json.dumps([_json_element(x) for x in v], ensure_ascii=False)
    return v


def _json_array(table: str, column: str) -> Converter:
    """Arrays into MySQL/SQLite: a JSON array, which has no lower bounds. An array that arrives as its
    PostgreSQL text with a bounds decoration (``[0:2]={1,2,3}``: a lower bound other than 1, see
    ``upstream.postgres.types``) cannot be stored exactly and is refused."""

    def conv(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return array_to_json(v)
        if isinstance(v, str) and v[:1] == "[":
            raise DataRejected(
                f"table {table}: column {column!r} has the array {v[:60]!r} whose lower bound is not 1; a JSON "
                "array cannot keep array bounds: replicate the table to PostgreSQL, exclude it, or make the "
                "upstream arrays start at 1")
        return v

    return conv


def _pg_element_text(v: Any) -> str:
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, float):
        return _float_text(v)
    if isinstance(v, dt.datetime):
        return iso_datetime(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(v).hex()
    if isinstance(v, Decimal):
        return decimal_text(v)
    return str(v)


def array_to_pg_literal(v: Any) -> Any:
    """A list (nested lists for more dimensions) as a PostgreSQL array literal (``{"a","b",NULL}``), every
    element quoted; a str (an array that arrived as PostgreSQL's own text, e.g. with a bounds decoration
    ``[0:2]={1,2,3}``) is sent as it is, so its bounds are kept.

    Sent as an untyped literal, PostgreSQL casts it to the target column's array type (so ``uuid[]``,
    ``numeric[]``, enum arrays mapped to ``text[]``... all work without a cast in the SQL).
    """
    if not isinstance(v, (list, tuple)):
        return v
    parts = []
    for e in v:
        if e is None:
            parts.append("NULL")
        elif isinstance(e, (list, tuple)):  # multi-dimensional: {{1,2},{3,4}}
            parts.append(array_to_pg_literal(e))
        else:
            text = _pg_element_text(e)
            parts.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(parts) + "}"


# ---- per-dialect converters --------------------------------------------------------------------------
def _generic_text(v: Any) -> Any:
    """Fallback for values of unexpected Python types in text-like columns."""
    if isinstance(v, (str, int, float, bytes)):
        return v
    if isinstance(v, (dt.date, dt.time)):
        return temporal_text(v)
    if isinstance(v, (Decimal, uuid.UUID)):
        return str(v)
    return v


def _mysql_numeric(table: str, column: str, scale: int | None) -> Converter:
    def conv(v: Any) -> Any:
        if isinstance(v, Decimal):
            if not v.is_finite():
                raise DataRejected(
                    f"table {table}: column {column!r} has value {v} which MySQL/MariaDB DECIMAL cannot store; "
                    "exclude the table or replicate it to PostgreSQL")
            if scale is not None and _too_many_fraction_digits(v, scale):
                raise DataRejected(
                    f"table {table}: column {column!r} value {decimal_text(v)} has more than {scale} fractional "
                    f"digits and would be rounded by MySQL/MariaDB DECIMAL(.., {scale}); create the target "
                    "column with a larger scale")
            return v
        if isinstance(v, float) and not math.isfinite(v):
            raise DataRejected(f"table {table}: column {column!r} has value {v} which MySQL/MariaDB cannot store")
        return v

    if scale is None:
        conv.keeps = (Decimal, "is_finite")  # type: ignore[attr-defined]
    return conv


def _mysql_float(table: str, column: str) -> Converter:
    def conv(v: Any) -> Any:
        if isinstance(v, float):
            if not math.isfinite(v):
                raise DataRejected(
                    f"table {table}: column {column!r} has value {v} which MySQL/MariaDB DOUBLE cannot store "
                    "(no NaN/Infinity); exclude the table or replicate it to PostgreSQL or SQLite")
            return v
        if isinstance(v, Decimal):
            if not v.is_finite():
                raise DataRejected(f"table {table}: column {column!r} has value {v} which MySQL/MariaDB cannot store")
            return float(v)
        return v

    return conv


def mysql_timestamp(v: Any) -> Any:
    """A datetime as the text of its naive UTC value, ``YYYY-MM-DD HH:MM:SS.ffffff`` (MySQL takes DATETIME
    and TIMESTAMP values as such strings; the literal is the one a naive datetime renders to); anything
    else as it is."""
    if isinstance(v, dt.datetime):
        tz = v.tzinfo
        if tz is not None and tz is not _UTC:
            v = v.astimezone(_UTC)
        return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 - fastest
            v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)
    return v


def _pg_numeric(v: Any) -> Any:
    # psycopg2 sends every non-finite Decimal as 'NaN': send the text so that +-Infinity survive.
    if isinstance(v, Decimal) and not v.is_finite():
        return str(v)
    return v


_pg_numeric.keeps = (Decimal, "is_finite")  # type: ignore[attr-defined]


def _too_many_fraction_digits(v: Decimal, scale: int) -> bool:
    """True when ``v`` has a non-zero digit beyond ``scale`` fractional digits (it would be rounded)."""
    t = v.as_tuple()
    exp = t.exponent
    if not isinstance(exp, int) or -exp <= scale:
        return False
    return any(t.digits[max(0, len(t.digits) + exp + scale):])


def _pg_numeric_scaled(table: str, column: str, scale: int) -> Converter:
    """PostgreSQL into an existing ``numeric(p, scale)`` column whose upstream column may carry more
    fractional digits (the upstream type was widened): PostgreSQL would round them silently; refuse."""

    def conv(v: Any) -> Any:
        if isinstance(v, Decimal):
            if not v.is_finite():
                return str(v)
            if _too_many_fraction_digits(v, scale):
                raise DataRejected(
                    f"table {table}: column {column!r} value {decimal_text(v)} has more than {scale} fractional "
                    f"digits and would be rounded by the target's numeric(.., {scale}); widen the target column "
                    "(ALTER TABLE ... ALTER COLUMN ... TYPE numeric)")
        return v

    conv.checks = True  # type: ignore[attr-defined]
    return conv


def _pg_float8(v: Any) -> Any:
    # psycopg2 renders -0.0 as a numeric literal, and numeric has no negative zero: send it as text
    if v == 0.0 and type(v) is float and math.copysign(1.0, v) < 0:
        return "-0"
    return v


def _pg_float4(v: Any) -> Any:
    # A float literal would be typed double precision and compare unequal to the stored real; untyped text
    # is cast to real, so keys and REPLICA IDENTITY FULL matches on real columns find their rows.
    if isinstance(v, float):
        return _float_text(v)
    if isinstance(v, Decimal):
        return str(v)
    return v


def _sqlite_float(v: Any) -> Any:
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else v  # SQLite stores a NaN REAL as NULL; the text survives
    if isinstance(v, Decimal):
        return str(v)
    return v


def _sqlite_numeric(v: Any) -> Any:
    """numeric into SQLite: the exact decimal text PostgreSQL sent (``0.0000001``, ``1.50``), for a TEXT column."""
    if isinstance(v, Decimal):
        return decimal_text(v)
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return v


def same_text(t: str) -> str:
    """The text as it is (a text path whose upstream text is already the converted value)."""
    return t


def _with_fast(conv: Converter, typ: type, fn: Callable[[Any], Any]) -> Converter:
    """A wrapper of ``conv`` (same results) that declares the fast path ``(typ, fn)``."""

    def wrapped(v: Any) -> Any:
        return conv(v)

    wrapped.fast = (typ, fn)  # type: ignore[attr-defined]
    wrapped.__name__ = getattr(conv, "__name__", "converter")
    return wrapped


def keeps(conv: Converter) -> tuple[type, str] | None:
    """``(T, m)`` when ``conv(v) is v`` for every value of exact type ``T`` whose ``v.m()`` is true, else None (lets
    compiled row functions skip calling ``conv`` for such values: sinks.sql.dialect.rowtext)."""
    return getattr(conv, "keeps", None)


def fast_path(conv: Converter) -> tuple[type, Callable[[Any], Any]] | None:
    """``(T, f)`` when ``conv(v) == f(v)`` for every value of exact type ``T``, else None."""
    return getattr(conv, "fast", None)


def checks_every_value(conv: Converter | None) -> bool:
    """True when ``conv`` may refuse a value (raise DataRejected) that the upstream text would carry into the
    target unchanged: such a column must not bypass its converter (PostgreSQL COPY of the upstream text),
    else the target would change the value silently (a narrower numeric scale rounds)."""
    return bool(getattr(conv, "checks", False))


def text_path(conv: Converter) -> tuple[type, Callable[[str], Any]] | None:
    """``(T, g)``: for a value of exact type ``T`` parsed from upstream text ``s``, ``g(s)`` is None or
    exactly ``conv(value)`` (see the module docstring)."""
    return getattr(conv, "from_text", None)


def _iso_text(t: str, offset: str, suffix: str) -> str | None:
    """``YYYY-MM-DD HH:MM:SS[.f{1,6}]`` + ``offset`` (PostgreSQL's ISO output) -> :func:`iso_datetime`'s
    fixed-width form of the same value (by padding the fraction) + ``suffix``; None for any other shape."""
    n = len(t) - len(offset)
    if n < 19 or n > 26 or n == 20 or t[4] != "-" or t[7] != "-" or t[10] != " " or t[13] != ":" \
            or t[16] != ":" or not t.endswith(offset):
        return None
    if n == 19:
        return t[:19] + ".000000" + suffix
    if t[19] != ".":
        return None
    return t[:n] + "000000"[: 26 - n] + suffix


def timestamptz_text(t: str) -> str | None:
    # TimeZone UTC: the parsed value is UTC, iso_datetime appends +00:00. Six fractional digits first.
    if len(t) == 29 and t[26:] == "+00" and t[19] == "." and t[10] == " " and t[4] == "-" and t[7] == "-" \
            and t[13] == ":" and t[16] == ":":
        return t[:26] + "+00:00"
    return _iso_text(t, "+00", "+00:00")


def timestamp_text(t: str) -> str | None:
    return _iso_text(t, "", "")


def mysql_timestamptz_text(t: str) -> str | None:
    # The UTC value without its offset: what mysql_timestamp makes of the parsed value.
    if len(t) == 29 and t[26:] == "+00" and t[19] == "." and t[10] == " " and t[4] == "-" and t[7] == "-" \
            and t[13] == ":" and t[16] == ":":
        return t[:26]
    return _iso_text(t, "+00", "")


_sqlite_numeric.fast = (Decimal, decimal_text)  # type: ignore[attr-defined]
# numeric_out's text is already the exact decimal text decimal_text() makes of the parsed value.
_sqlite_numeric.from_text = (Decimal, same_text)  # type: ignore[attr-defined]
_SQLITE_TIMESTAMPTZ = _with_fast(temporal_text, dt.datetime, iso_datetime)
_SQLITE_TIMESTAMPTZ.from_text = (dt.datetime, timestamptz_text)  # type: ignore[attr-defined]
_SQLITE_TIMESTAMP = _with_fast(temporal_text, dt.datetime, iso_datetime)
_SQLITE_TIMESTAMP.from_text = (dt.datetime, timestamp_text)  # type: ignore[attr-defined]
_SQLITE_DATE = _with_fast(temporal_text, dt.date, dt.date.isoformat)
_SQLITE_TIME = _with_fast(temporal_text, dt.time, iso_time)
# MySQL: both timestamp types from the upstream text (TimeZone UTC), as mysql_timestamp formats them.
_MYSQL_TIMESTAMPTZ = _with_fast(mysql_timestamp, dt.datetime, mysql_timestamp)
_MYSQL_TIMESTAMPTZ.from_text = (dt.datetime, mysql_timestamptz_text)  # type: ignore[attr-defined]
_MYSQL_TIMESTAMP = _with_fast(mysql_timestamp, dt.datetime, mysql_timestamp)
_MYSQL_TIMESTAMP.from_text = (dt.datetime, timestamp_text)  # type: ignore[attr-defined]
_UUID_TO_STR = _with_fast(lambda v: str(v) if isinstance(v, uuid.UUID) else v, uuid.UUID, str)


_INT_TYPES = frozenset({"int2", "int4", "int8", "oid", "xid", "cid"})
_SQLITE_MAX_INT = 2**63 - 1


def _sqlite_big_int(v: Any) -> Any:
    return str(v) if isinstance(v, int) and v > _SQLITE_MAX_INT else v
_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "char", "name", "json", "jsonb", "interval", "timetz"})


def converter(col: ColumnSchema, dialect: str, *, table: str, scale: int | None = None) -> Converter | None:
    """The converter for ``col``'s values on ``dialect`` (``mysql``, ``postgresql``, ``sqlite``), or None.

    ``scale`` is the target DECIMAL / numeric column's scale when upstream values may have more fractional
    digits (MySQL, PostgreSQL: such values are refused instead of being rounded).
    """
    base = col.base_type
    if col.is_array:
        if dialect == "postgresql":
            return array_to_pg_literal
        return _json_array(table, col.name)
    if base in _INT_TYPES or base == "bool" or base == "bytea":
        return None
    if base == "xid8":
        return _sqlite_big_int if dialect == "sqlite" else None
    if dialect == "mysql":
        if base == "numeric":
            return _mysql_numeric(table, col.name, scale)
        if base in ("float4", "float8"):
            return _mysql_float(table, col.name)
        if base == "timestamptz":
            return _MYSQL_TIMESTAMPTZ
        if base == "timestamp":
            return _MYSQL_TIMESTAMP
        if base == "uuid":
            return _UUID_TO_STR
        if base in ("date", "time") or base in _TEXT_TYPES:
            return None
        return _generic_text
    if dialect == "postgresql":
        if base == "numeric":
            return _pg_numeric if scale is None else _pg_numeric_scaled(table, col.name, scale)
        if base == "float4":
            return _pg_float4
        if base == "float8":
            return _pg_float8
        if base == "uuid":
            return _UUID_TO_STR
        if base in ("date", "time", "timestamp", "timestamptz") or base in _TEXT_TYPES:
            return None
        return _generic_text
    if dialect == "sqlite":
        if base == "numeric":
            return _sqlite_numeric
        if base in ("float4", "float8"):
            return _sqlite_float
        if base == "timestamptz":
            return _SQLITE_TIMESTAMPTZ
        if base == "timestamp":
            return _SQLITE_TIMESTAMP
        if base == "date":
            return _SQLITE_DATE
        if base == "time":
            return _SQLITE_TIME
        if base == "uuid":
            return _UUID_TO_STR
        if base in _TEXT_TYPES:
            return None
        return _generic_text
    raise ValueError(f"unknown dialect {dialect!r}")


# ---- MySQL literals ----------------------------------------------------------------------------------
# What pymysql.converters.escape_string changes (NUL, LF, CR, ^Z, '"', "'", backslash), and how.
# A list indexed by code point (faster in str.translate than a dict; code points past it stay as they are).
_MYSQL_ESCAPES = [{0: "\\0", 10: "\\n", 13: "\\r", 26: "\\Z", 34: '\\"', 39: "\\'", 92: "\\\\"}.get(i, chr(i))
                  for i in range(128)]
_MYSQL_SPECIAL = re.compile("[\x00\n\r\x1a\"'\\\\]")
_DIGITS = frozenset("0123456789")


def mysql_literal_function(connection: Any) -> Callable[[Any], str]:
    """A function rendering one (already converted) value as a MySQL literal for ``connection``.

    Its attribute ``rows(types)`` returns a function rendering a whole row, ``(lit1,lit2,...)``, exactly as
    ``"(" + ",".join(map(literal, row)) + ")"`` for any row, fastest for rows whose value types are ``types``;
    ``plain_str`` is True when a str is rendered by PyMySQL's escape_string rules (backslash escapes on), False
    when it goes to ``connection.escape`` (NO_BACKSLASH_ESCAPES).

    Faster than PyMySQL's generic ``escape`` for the types the sink sends (str, int, Decimal, float,
    naive date/time/datetime, None), with the same escaping rules; anything else (bytes...) and any
    connection in NO_BACKSLASH_ESCAPES mode falls back to ``connection.escape``.
    """
    from pymysql.constants import SERVER_STATUS

    fallback = connection.escape
    needs_escape = _MYSQL_SPECIAL.search
    table = _MYSQL_ESCAPES

    def _str(v: str) -> str:
        # PyMySQL's escape_string is v.translate(its table); most strings hold none of the seven characters
        # it changes, and one regex search finds that faster than translating (x5 for non-ASCII text).
        if needs_escape(v) is None:
            return "'" + v + "'"
        return "'" + v.translate(table) + "'"

    if connection.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
        _str = fallback  # noqa: F811 - quotes are escaped differently in that mode

    def _float(v: float) -> str:
        if not math.isfinite(v):
            return fallback(v)  # raises: MySQL has no NaN/Infinity
        text = repr(v)
        return text if "e" in text else text + "e0"  # a DOUBLE literal, not a DECIMAL one

    def _datetime(v: dt.datetime) -> str:
        if v.tzinfo is not None:
            return fallback(v)
        return "'%04d-%02d-%02d %02d:%02d:%02d.%06d'" % (  # noqa: UP031
            v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)

    def _date(v: dt.date) -> str:
        return "'%04d-%02d-%02d'" % (v.year, v.month, v.day)  # noqa: UP031

    def _time(v: dt.time) -> str:
        if v.tzinfo is not None:
            return fallback(v)
        return "'%02d:%02d:%02d.%06d'" % (v.hour, v.minute, v.second, v.microsecond)  # noqa: UP031

    def _decimal(v: Decimal) -> str:
        # str() is format(v, "f") unless it chose exponent notation ('E') or v is not finite (no final digit).
        text = str(v)
        if "E" in text or text[-1] not in _DIGITS:
            return format(v, "f") if v.is_finite() else fallback(v)
        return text

    by_type: dict[type, Callable[[Any], str]] = {
        type(None): lambda v: "NULL",
        bool: lambda v: "1" if v else "0",
        int: int.__repr__,
        str: _str,
        float: _float,
        Decimal: _decimal,
        dt.datetime: _datetime,
        dt.date: _date,
        dt.time: _time,
    }
    get = by_type.get

    def literal(v: Any) -> str:
        f = get(type(v))
        return f(v) if f is not None else fallback(v)

    plain_str = _str is not fallback  # backslash escapes on: a string without special characters is quoted as is
    row_functions: dict[tuple[type, ...], Callable[[Sequence[Any]], str]] = {}

    def rows(types: tuple[type, ...]) -> Callable[[Sequence[Any]], str]:
        """``f(row) == "(" + ",".join(map(literal, row)) + ")"`` for every row; fastest for rows whose
        values have exactly ``types`` (generated once per ``types``: inline tests, no dispatch)."""
        fn = row_functions.get(types)
        if fn is None:
            fn = row_functions[types] = _mysql_row_function(types, literal, by_type, needs_escape, plain_str)
        return fn

    literal.rows = rows  # type: ignore[attr-defined]
    literal.plain_str = plain_str  # type: ignore[attr-defined]
    return literal


def _mysql_row_function(types: tuple[type, ...], literal: Callable[[Any], str],
                        by_type: dict[type, Callable[[Any], str]], needs_escape: Callable[[str], Any],
                        plain_str: bool) -> Callable[[Sequence[Any]], str]:
    namespace: dict[str, Any] = {"type": type, "L": literal, "S": needs_escape, "repr": repr, "str": str,
                                 "D": _DIGITS}
    parts = []
    for i, t in enumerate(types):
        x = f"r[{i}]"
        if t is type(None):
            parts.append(f'("NULL" if {x} is None else L({x}))')
            continue
        f = by_type.get(t)
        if f is None:
            parts.append(f"L({x})")
            continue
        namespace[f"T{i}"] = t
        if t is int:
            fast = f"repr({x})"
        elif t is str and plain_str:
            fast = f"((\"'\" + {x} + \"'\") if S({x}) is None else F{i}({x}))"
            namespace[f"F{i}"] = f
        elif t is Decimal:  # str() unless it chose exponent notation or v is not finite (see _decimal)
            fast = f'(d if "E" not in (d := str({x})) and d[-1] in D else F{i}({x}))'
            namespace[f"F{i}"] = f
        else:
            fast = f"F{i}({x})"
            namespace[f"F{i}"] = f
        parts.append(f"({fast} if type({x}) is T{i} else L({x}))")
    if not parts:
        return lambda r: "(" + ",".join(map(literal, r)) + ")"
    n = len(types)
    fn: Callable[[Sequence[Any]], str] = eval(  # indices only, no data
        f'lambda r: ("(" + ",".join(({", ".join(parts)},)) + ")") if len(r) == {n} else '
        '"(" + ",".join(map(L, r)) + ")"', namespace)
    return fn
