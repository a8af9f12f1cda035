"""Parquet files of the storage sink: typed columns through pyarrow (TiCDC has no Parquet; the meta columns are
named like its CSV header's).

One file = one table version; its columns, in order:

=============================== ================= ===============================================================
column                          Parquet type      value
=============================== ================= ===============================================================
``ticdc-meta$operation``        string            ``I``, ``U`` or ``D``
``ticdc-meta$table``            string            the table name
``ticdc-meta$schema``           string            the schema name
``ticdc-meta$commit-ts``        int64             the commit Ts (commit LSN)
``ticdc-meta$is-update``        bool              true on the ``D`` and ``I`` rows that together are one UPDATE
one column per table column     see below         the new row (``I``, ``U``), the old row (``D``)
``tidewater-meta$unavailable``  list<string>      the columns whose value the upstream did not send (then null):
                                                  unchanged TOAST values, a delete's non-key columns without
                                                  REPLICA IDENTITY FULL; null when none
=============================== ================= ===============================================================

An UPDATE is one ``U`` row, except when it changes the row's key or the table has no key (REPLICA IDENTITY FULL):
then a ``D`` row with the old row and an ``I`` row with the new one, both with ``is-update`` true (the storage sink
does the split; TiCDC splits key-changing updates the same way).

PostgreSQL type -> Parquet (logical) type:

=========================================== ========================================================================
PostgreSQL                                  Parquet / Arrow
=========================================== ========================================================================
``int2`` / ``int4`` / ``int8``, ``oid``,    int16 / int32 / int64 (``xid8``: uint64)
``xid``, ``cid``
``numeric(p,s)``, 1 <= p <= 38, 0 <= s <= p decimal(p, s)
``numeric`` (unbounded, or p > 38)          string: the exact decimal text (``1.50``; ``NaN``, ``Infinity``)
``float4`` / ``float8``                     float / double
``bool``                                    boolean
``bytea``                                   binary
``date``                                    date32
``time(p)``                                 time64 (microseconds)
``timestamp(p)``                            timestamp (microseconds, not adjusted to UTC)
``timestamptz(p)``                          timestamp (microseconds, UTC)
``uuid``                                    string (canonical text)
``json``, ``jsonb``, ``text``, ``varchar``, string (PostgreSQL's text)
``bpchar``, ``timetz``, ``interval``,
enums, everything else
one-dimensional arrays                      list of the element type (numeric elements as strings)
=========================================== ========================================================================

Values a typed column cannot hold (``infinity`` or BC dates and timestamps, ``24:00:00``, a numeric ``NaN`` in a
decimal column, a multi-dimensional array or one with bounds) raise :class:`sinks.codec.EncodeError` naming the
table, the column and the fix (use ``protocol=csv`` or ``canal-json``, which keep PostgreSQL's text): never a
silently different value.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableSchema
from sinks.codec import types as T
from sinks.codec.base import EncodeError
from sinks.codec.text import decimal_text

OPERATION, TABLE, SCHEMA, COMMIT_TS, IS_UPDATE = ("ticdc-meta$operation", "ticdc-meta$table", "ticdc-meta$schema",
                                                  "ticdc-meta$commit-ts", "ticdc-meta$is-update")
UNAVAILABLE = "tidewater-meta$unavailable"
META_COLUMNS = (OPERATION, TABLE, SCHEMA, COMMIT_TS, IS_UPDATE)
ROW_GROUP_ROWS = 65536

_SCALARS: dict[str, Callable[[], pa.DataType]] = {
    "int2": pa.int16, "int4": pa.int32, "int8": pa.int64, "oid": pa.int64, "xid": pa.int64, "cid": pa.int64,
    "xid8": pa.uint64, "float4": pa.float32, "float8": pa.float64, "bool": pa.bool_, "bytea": pa.binary,
    "date": pa.date32, "time": lambda: pa.time64("us"), "timestamp": lambda: pa.timestamp("us"),
    "timestamptz": lambda: pa.timestamp("us", tz="UTC"),
}


def _decimal_type(col: ColumnSchema) -> pa.DataType | None:
    ps = T.numeric_precision_scale(col)
    if ps is None:
        return None
    p, s = ps
    return pa.decimal128(p, s) if 1 <= p <= 38 and 0 <= s <= p else None


def arrow_type(col: ColumnSchema) -> pa.DataType:
    """The Arrow type of ``col`` (module docstring)."""
    if col.is_array:
        element = _SCALARS.get(col.base_type)
        return pa.list_(element() if element is not None else pa.string())
    if col.base_type == "numeric":
        return _decimal_type(col) or pa.string()
    make = _SCALARS.get(col.base_type)
    return make() if make is not None else pa.string()


def arrow_schema(schema: TableSchema) -> pa.Schema:
    fields = [pa.field(OPERATION, pa.string(), nullable=False), pa.field(TABLE, pa.string(), nullable=False),
              pa.field(SCHEMA, pa.string(), nullable=False), pa.field(COMMIT_TS, pa.int64(), nullable=False),
              pa.field(IS_UPDATE, pa.bool_(), nullable=False)]
    fields += [pa.field(c.name, arrow_type(c)) for c in schema.columns]
    fields.append(pa.field(UNAVAILABLE, pa.list_(pa.string())))
    return pa.schema(fields)


def _refuse(schema: TableSchema, col: ColumnSchema, value: Any, kind: str) -> EncodeError:
    return EncodeError(f"table {schema.name}: column {col.name!r}: the value {str(value)[:60]!r} cannot be stored in "
                       f"a Parquet {kind} column: use protocol=csv or canal-json for this table (they keep "
                       f"PostgreSQL's text)")


def _converter(schema: TableSchema, col: ColumnSchema) -> Callable[[Any], Any]:
    """``value -> what pyarrow takes for the column`` (module docstring), EncodeError for what it cannot hold."""
    base = col.base_type
    if col.is_array:
        elem = _element_converter(schema, col)

        def array(v: Any) -> Any:
            if not isinstance(v, list) or any(isinstance(x, list) for x in v):
                raise _refuse(schema, col, v, "one-dimensional list")
            return [None if x is None else elem(x) for x in v]
        return array
    if base == "numeric":
        if _decimal_type(col) is None:
            return lambda v: decimal_text(v) if isinstance(v, Decimal) else str(v)

        def decimal(v: Any) -> Any:
            if not isinstance(v, Decimal) or not v.is_finite():
                raise _refuse(schema, col, v, "decimal")
            return v
        return decimal
    want: tuple[type, ...] | None = {"date": (dt.date,), "time": (dt.time,), "timestamp": (dt.datetime,),
                                     "timestamptz": (dt.datetime,)}.get(base)
    if want is not None:
        def temporal(v: Any) -> Any:
            if not isinstance(v, want):
                raise _refuse(schema, col, v, base)
            return v
        return temporal
    if base in _SCALARS:
        return lambda v: v
    if base == "uuid":
        return str
    return lambda v: v if isinstance(v, str) else str(v)


def _element_converter(schema: TableSchema, col: ColumnSchema) -> Callable[[Any], Any]:
    if col.base_type not in _SCALARS:
        return lambda v: decimal_text(v) if isinstance(v, Decimal) else v if isinstance(v, str) else str(v)
    return _converter(schema, ColumnSchema(col.name, col.type_oid, col.base_type))


class ParquetRows:
    """Rows of one table version, buffered column by column and written to one Parquet file in row groups of
    ``ROW_GROUP_ROWS`` (``append`` / ``close``). Not thread-safe."""

    def __init__(self, f: BinaryIO, schema: TableSchema) -> None:
        self.schema = schema
        self.arrow = arrow_schema(schema)
        self._writer = pq.ParquetWriter(f, self.arrow, compression="snappy")
        self._f = f
        self._names = schema.column_names
        self._convs = [_converter(schema, c) for c in schema.columns]
        self._reset()
        self.rows = 0

    def _reset(self) -> None:
        self._meta: list[list[Any]] = [[], [], [], [], []]
        self._cols: list[list[Any]] = [[] for _ in self._names]
        self._unavailable: list[list[str] | None] = []

    @property
    def pending(self) -> int:
        """Rows buffered for the next row group."""
        return len(self._unavailable)

    def append(self, change: RowChange, op: str, is_update: bool, values: dict[str, Any] | None,
               row: tuple[Any, ...] | None) -> None:
        """One row: ``op`` I/U/D with ``values`` (by name; a missing or UNCHANGED value is unavailable) or the
        positional ``row`` (complete)."""
        name = change.schema.name
        meta = self._meta
        meta[0].append(op)
        meta[1].append(name.table)
        meta[2].append(name.schema)
        meta[3].append(change.commit_ts)
        meta[4].append(is_update)
        cols = self._cols
        missing: list[str] | None = None
        if row is not None:
            for i, (conv, v) in enumerate(zip(self._convs, row, strict=True)):
                cols[i].append(None if v is None else conv(v))
        else:
            assert values is not None
            for i, (n, conv) in enumerate(zip(self._names, self._convs, strict=True)):
                v = values.get(n, UNCHANGED)
                if v is UNCHANGED:
                    cols[i].append(None)
                    missing = (missing or []) + [n]
                else:
                    cols[i].append(None if v is None else conv(v))
        self._unavailable.append(missing)
        self.rows += 1
        if len(self._unavailable) >= ROW_GROUP_ROWS:
            self._write_group()

    def _write_group(self) -> None:
        if not self._unavailable:
            return
        arrays: list[pa.Array] = []
        fields = list(self.arrow)
        try:
            for f, values in zip(fields, [*self._meta, *self._cols, self._unavailable], strict=True):
                try:
                    arrays.append(pa.array(values, type=f.type))
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
                    raise EncodeError(f"table {self.schema.name}: column {f.name!r}: a value cannot be stored in a "
                                      f"Parquet {f.type} column ({e}): use protocol=csv or canal-json for this "
                                      f"table") from e
            self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.arrow))
        finally:
            self._reset()

    def abandon(self) -> None:
        """Give the file up (its writer closed without writing more; errors ignored): the file is discarded."""
        self._reset()
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - the file is removed anyway
            pass

    def close(self) -> None:
        """Write the buffered rows and the footer (the file object stays open)."""
        self._write_group()
        self._writer.close()


def write_change(out: ParquetRows, change: RowChange) -> None:
    """Append ``change`` as its Parquet row(s) (module docstring). The storage sink has split key-changing and
    key-less updates into DELETE + INSERT already (``is-update`` marks them through ``change.extra``)."""
    is_update = change.extra.get(SPLIT_UPDATE) is True
    op = change.op
    if op is OpType.INSERT:
        row = change.row
        out.append(change, "I", is_update, None if row is not None else change.values, row)
    elif op is OpType.UPDATE:
        out.append(change, "U", False, change.values, None)
    elif op is OpType.DELETE:
        if change.old_values is None:
            raise EncodeError(f"table {change.schema.name}: a DELETE without old values (commit Ts "
                              f"{change.commit_ts})")
        out.append(change, "D", is_update, change.old_values, None)
    else:
        raise EncodeError(f"table {change.schema.name}: {op.name} has no Parquet row (the storage sink records it as "
                          f"a table version)")


SPLIT_UPDATE = "storage_split_update"
"""Key of ``RowChange.extra`` the storage sink sets on the two halves of an UPDATE it split (Parquet's
``is-update``)."""


# ---- reading -----------------------------------------------------------------------------------------------
def _reader(col: ColumnSchema) -> Callable[[Any], Any]:
    """Parquet value -> the mounter's Python value (the inverse of ``_converter`` where it is not the identity)."""
    if col.is_array:
        if col.base_type == "numeric":
            return lambda v: [None if x is None else Decimal(x) for x in v]
        if col.base_type == "uuid":
            return lambda v: [None if x is None else uuid.UUID(x) for x in v]
        return lambda v: v
    if col.base_type == "numeric":
        return lambda v: Decimal(v) if isinstance(v, str) else v
    if col.base_type == "uuid":
        return uuid.UUID
    if col.base_type == "timestamptz":
        return lambda v: v.astimezone(dt.UTC)
    return lambda v: v


def read_rows(path: str, schema: TableSchema) -> list[dict[str, Any]]:
    """The rows of one of the sink's Parquet files, as dicts: the meta columns by their names, the table's columns
    as the mounter's Python values (``UNCHANGED`` where the upstream did not send the value)."""
    table = pq.read_table(path)
    readers = {c.name: _reader(c) for c in schema.columns}
    out = []
    for r in table.to_pylist():
        missing = r.pop(UNAVAILABLE, None) or ()
        for name, conv in readers.items():
            if name in missing:
                r[name] = UNCHANGED
            elif r.get(name) is not None:
                r[name] = conv(r[name])
        out.append(r)
    return out
