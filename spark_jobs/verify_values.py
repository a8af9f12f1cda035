"""Canonical forms of row values for ``cdc cli changefeed verify`` (docs/verify.md, "Normalisation"): no I/O, no
Spark, no state.

A value read upstream (the snapshot reader's parsed value and its text) and the same value read back from the
target (its driver's value) have equal canonical forms exactly when the target holds what docs/type-mapping.md
says it stores for that upstream value. Never within a tolerance: floats are compared by their exact binary value,
``numeric`` by its exact decimal value (and, where the target keeps the text, by the text with its scale).

Two modes, chosen by the target's dialect:

* ``postgresql``: every column is read downstream as ``col::text`` under the upstream's session settings
  (``TimeZone=UTC``, ``DateStyle=ISO``, ``IntervalStyle=postgres``, ``extra_float_digits=3``, ``bytea_output=hex``:
  :data:`PG_TEXT_SETTINGS`), and compared with the upstream's text of the value (``RowChange.row_text``): the same
  type's output function on both sides, so equal text is equal value for every type, arrays with their bounds,
  numeric with its scale.
* ``mysql`` (MySQL/MariaDB) and ``sqlite``: per upstream base type (:func:`column_forms`), see the table in
  docs/verify.md; ``lake`` (a storage sink's lake, Parquet read with pyarrow) as ``mysql``, except ``float4``:
  a Parquet FLOAT, so both sides are compared as the float32 they round to. A value the target cannot hold as it is upstream (a ``timestamp`` of ``infinity``, ``24:00:00``, an
  array with lower bounds other than 1 -- the upstream parser gives them as text) is *inexact*: its canonical
  form is :data:`INEXACT` on the upstream side, which equals nothing, so the row is reported, never called equal.

A row's checksum (:func:`row_hash`) is 64 bits of BLAKE2b over the canonical tuple's ``repr``; a chunk's checksum
is the row count and the sum of its rows' hashes modulo 2**64 (:class:`ChunkSum`): independent of row order, and
a multiset sum, so a duplicated row changes it (key-less tables).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

from cdc.events import ColumnSchema, TableSchema
from sinks.sql.dialect.values import array_to_json

Canon = Callable[[Any], Any]

PG_TEXT_SETTINGS: dict[str, str] = {"TimeZone": "UTC", "DateStyle": "ISO", "IntervalStyle": "postgres",
                                    "extra_float_digits": "3", "bytea_output": "hex"}
"""The session settings of a PostgreSQL target read in text mode: those of the upstream's connections
(``upstream.postgres.conn.SESSION_SETTINGS``), so both sides print a value with the same output function."""

INEXACT = "\x00inexact"
"""The canonical form of an upstream value the target cannot hold exactly (it never equals a target's form)."""

_MASK = (1 << 64) - 1
_INTS = frozenset({"int2", "int4", "int8", "oid", "xid", "xid8", "cid"})
_FLOATS = frozenset({"float4", "float8"})
_TIMESTAMPS = frozenset({"timestamp", "timestamptz"})
_JSON = frozenset({"json", "jsonb"})


def exact_number(v: decimal.Decimal) -> str:
    """The exact value of a finite Decimal as fixed-point text without trailing zeros (``1.50`` -> ``1.5``,
    ``0E-8`` -> ``0``); never rounded (``Decimal.normalize()`` would round to 28 digits)."""
    text = format(v, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _null(fn: Canon) -> Canon:
    return lambda v: None if v is None else fn(v)


def _int(v: Any) -> Any:
    return int(v)


def _float(v: Any) -> Any:
    if isinstance(v, str):  # SQLite stores NaN as the text 'NaN'
        v = float(v)
    f = float(v)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return 0.0 if f == 0 else f  # -0.0 is 0.0: MariaDB and SQLite drop the sign (docs/type-mapping.md)


def _float32(v: Any) -> Any:
    f = _float(v)
    return f if isinstance(f, str) else struct.unpack("<f", struct.pack("<f", f))[0]


def _decimal_value(v: Any) -> Any:
    d = v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))
    return exact_number(d) if d.is_finite() else str(d)


def _bool(v: Any) -> Any:
    return int(bool(int(v))) if not isinstance(v, str) else int(v.strip().lower() in ("1", "t", "true"))


def _date(v: Any) -> Any:
    if isinstance(v, str):
        return dt.date.fromisoformat(v).isoformat()
    return v.isoformat()


def _time(v: Any) -> Any:
    if isinstance(v, dt.timedelta):  # PyMySQL's TIME
        micros = v // dt.timedelta(microseconds=1)
        hours, rest = divmod(micros, 3_600_000_000)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, micro = divmod(rest, 1_000_000)
        return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{micro:06d}"
    if isinstance(v, str):
        v = dt.time.fromisoformat(v)
    return v.isoformat(timespec="microseconds")


def _timestamp(v: Any) -> Any:
    if isinstance(v, str):
        v = dt.datetime.fromisoformat(v)
    if v.tzinfo is not None:
        v = v.astimezone(dt.UTC).replace(tzinfo=None)
    return v.isoformat(sep=" ", timespec="microseconds")


def _bytes(v: Any) -> Any:
    return bytes(v).hex()


def _str(v: Any) -> Any:
    return str(v)


def _uuid(v: Any) -> Any:
    return str(v).lower()


def _json_value(x: Any) -> Any:
    if isinstance(x, decimal.Decimal):
        return exact_number(x) if x.is_finite() else str(x)
    if isinstance(x, float):
        return _float(x)
    if isinstance(x, list):
        return [_json_value(e) for e in x]
    if isinstance(x, dict):
        return {k: _json_value(e) for k, e in x.items()}
    return x


def _json_text(v: Any) -> Any:
    """JSON text (or a parsed document) as canonical JSON: keys sorted, numbers by exact value."""
    doc = json.loads(v, parse_float=decimal.Decimal) if isinstance(v, (str, bytes)) else v
    return json.dumps(_json_value(doc), sort_keys=True, separators=(",", ":"))


def _upstream_array(v: Any) -> Any:
    if isinstance(v, str):
        return INEXACT  # lower bounds other than 1: no JSON array holds them (docs/type-mapping.md)
    return _json_text(array_to_json(v))


def _strict(fn: Canon) -> Canon:
    """``fn`` for an upstream value: one the parser left as text (``infinity``, ``24:00:00``, a BC date) has no
    exact form downstream."""
    def canon(v: Any) -> Any:
        return INEXACT if isinstance(v, str) else fn(v)
    return canon


def column_forms(col: ColumnSchema, dialect: str) -> tuple[Canon, Canon]:
    """``(upstream, target)`` canonical functions of one column for a ``mysql`` or ``sqlite`` target; the upstream
    one takes the snapshot reader's parsed value, the target one the driver's value. NULL is None on both sides
    (never equal to an empty string or array)."""
    base = col.base_type
    if col.is_array:
        return _null(_upstream_array), _null(_json_text)
    if base in _INTS:
        return _null(_int), _null(_int)
    if base == "numeric":
        if dialect == "sqlite":  # stored as the exact upstream text, scale and trailing zeros included
            return _null(lambda v: v if isinstance(v, str) else format(v, "f")), _null(_str)
        return _null(_decimal_value), _null(_decimal_value)
    if base == "float4" and dialect == "lake":  # a Parquet FLOAT: both sides as the float32 they round to
        return _null(_float32), _null(_float32)
    if base in _FLOATS:
        return _null(_float), _null(_float)
    if base == "bool":
        return _null(_bool), _null(_bool)
    if base == "date":
        return _null(_strict(_date)), _null(_date)
    if base == "time":
        return _null(_strict(_time)), _null(_time)
    if base in _TIMESTAMPS:
        return _null(_strict(_timestamp)), _null(_timestamp)
    if base == "bytea":
        return _null(_bytes), _null(_bytes)
    if base == "uuid":
        return _null(_uuid), _null(_uuid)
    if base in _JSON:
        return _null(_json_text), _null(_json_text)
    return _null(_str), _null(_str)  # text types and every type stored as its upstream text


class RowForms:
    """The canonical row functions of one table for one target dialect (see the module docstring).

    ``upstream(row, row_text)`` and ``target(values)`` give the canonical tuple of a row (columns in the upstream
    schema's order); ``key(canonical)`` its key (the whole row for a key-less table)."""

    def __init__(self, schema: TableSchema, dialect: str) -> None:
        self.text_mode = dialect == "postgresql"
        self.columns = schema.columns
        names = [c.name for c in schema.columns]
        self.key_index = [names.index(k) for k in schema.key] if schema.has_key else []
        if self.text_mode:
            self._up: list[Canon] = []
            self._down: list[Canon] = []
        else:
            forms = [column_forms(c, dialect) for c in schema.columns]
            self._up = [f[0] for f in forms]
            self._down = [f[1] for f in forms]

    def upstream(self, row: Sequence[Any], row_text: Sequence[str | None]) -> tuple[Any, ...]:
        if self.text_mode:
            return tuple(row_text)
        return tuple(f(v) for f, v in zip(self._up, row, strict=True))

    def target(self, values: Sequence[Any]) -> tuple[Any, ...]:
        if self.text_mode:
            return tuple(values)
        return tuple(f(v) for f, v in zip(self._down, values, strict=True))

    def key(self, canonical: tuple[Any, ...]) -> tuple[Any, ...]:
        if not self.key_index:
            return canonical
        return tuple(canonical[i] for i in self.key_index)


def row_hash(canonical: tuple[Any, ...]) -> int:
    """64 bits of BLAKE2b over the canonical row's ``repr`` (str, int, float, None only: a stable repr)."""
    return int.from_bytes(hashlib.blake2b(repr(canonical).encode(), digest_size=8).digest(), "big")


def add_hash(total: int, h: int) -> int:
    """The chunk sum after one more row (a multiset sum modulo 2**64)."""
    return (total + h) & _MASK


def key_text(key: tuple[Any, ...]) -> tuple[str | None, ...]:
    """A canonical key as text for the report (``(5,)`` -> ``("5",)``; NULL stays None)."""
    return tuple(None if k is None else (k if isinstance(k, str) else str(k)) for k in key)
