"""TABLE_MAP events: parsed once per distinct body, cached by table id.

MariaDB and MySQL write a TABLE_MAP event before the row events of every transaction (statement) that touches a
table, each time the same bytes while the table is unchanged. :class:`TableMapCache` keeps, per table id, the last
body and what it was parsed into: a TABLE_MAP whose body equals the cached one costs one bytes compare and returns
the *same* :class:`TableMap` object (the span source keys its per-table checks and row decoders on that identity);
a different body (a new table id, an ALTER, a rotation to a new binlog file after :meth:`TableMapCache.clear`) is
parsed again.

What a :class:`BinlogColumn` holds is what ``pymysqlreplication``'s ``Column`` holds for the same table map (its
type, with ENUM/SET as their own types, the metadata of its type, its name, signedness and character set from the
optional metadata of ``binlog_row_metadata = FULL``), so that the span source's table-map check
(:meth:`upstream.mysql.source.MySqlSpanSource._table`) and the row decoder (:mod:`upstream.mysql.rowdecode`) see
what the reference client sees; ``tests/integration/test_mysql_own_decoder.py`` compares the two on real events.
A table map without column names (``binlog_row_metadata`` not FULL) gives columns named None, which that check
refuses loudly. Pure functions and a dict, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pymysql.charset import charset_by_name
from pymysqlreplication.row_event import find_charset

from upstream.mysql.binlog import HEADER_END, packed_int

# field types (MySQL's enum_field_types)
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 7, 8, 9
DATE, TIME, DATETIME, YEAR, VARCHAR, BIT = 10, 11, 12, 13, 15, 16
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
JSON, NEWDECIMAL, ENUM, SET, BLOB, VAR_STRING, STRING, GEOMETRY = 245, 246, 247, 248, 252, 253, 254, 255

_NUMERIC = frozenset({TINY, SHORT, INT24, LONG, LONGLONG, NEWDECIMAL, FLOAT, DOUBLE, YEAR})


class BinlogColumn:
    """One column of a table map (see the module docstring); attributes a type does not have stay None."""

    __slots__ = ("type", "name", "unsigned", "character_set_name", "encoding", "max_length", "size", "length_size",
                 "precision", "decimals", "fsp", "bits", "bytes", "enum_values", "set_values")

    def __init__(self, ftype: int) -> None:
        self.type = ftype
        self.name: str | None = None
        self.unsigned = False
        self.character_set_name: str | None = None
        self.encoding: str | None = None  # the Python codec of its text; None: binary, or no codec (raw bytes)
        self.max_length = 0
        self.size = 0
        self.length_size = 0
        self.precision = 0
        self.decimals = 0
        self.fsp = 0
        self.bits = 0
        self.bytes = 0
        self.enum_values: list[str] | None = None
        self.set_values: list[str] | None = None

    def __repr__(self) -> str:
        return f"BinlogColumn({self.name!r}, type={self.type})"


@dataclass(eq=False, slots=True)
class TableMap:
    """A parsed TABLE_MAP event: the table's id, schema, name and columns. ``state`` is the span source's own
    per-table-map memo (its check and row decoder), dropped with the table map when its body changes."""

    table_id: int
    schema: str
    table: str
    columns: tuple[BinlogColumn, ...]
    state: dict[Any, Any] = field(default_factory=dict)


def _strings(data: bytes, off: int, end: int) -> list[list[str]]:
    out = []
    while off < end:
        n, off = packed_int(data, off)
        vals = []
        for _ in range(n):
            ln, off = packed_int(data, off)
            raw = data[off:off + ln]
            off += ln
            try:
                vals.append(raw.decode())
            except UnicodeDecodeError:
                vals.append("")  # (as the reference client: ENUM/SET members that are not UTF-8 are refused at create)
        out.append(vals)
    return out


def _ints(data: bytes, off: int, end: int) -> list[int]:
    out = []
    while off < end:
        v, off = packed_int(data, off)
        out.append(v)
    return out


def _is_char(ftype: int, dbms: str) -> bool:
    return ftype in (STRING, VAR_STRING, VARCHAR, BLOB) or (ftype == GEOMETRY and dbms == "mariadb")


def _set_charset(col: BinlogColumn, collation: int, dbms: str) -> None:
    name = find_charset(str(collation), dbms=dbms)[0]
    col.character_set_name = name
    cs = charset_by_name(name)
    enc = cs.encoding if cs else name
    try:
        "".encode(enc)
    except LookupError:  # binary, or a charset Python has no codec for: the value stays bytes
        enc = None
    col.encoding = enc


def _column_meta(col: BinlogColumn, data: bytes, off: int) -> int:
    t = col.type
    if t == VARCHAR:
        col.max_length = data[off] | data[off + 1] << 8
        return off + 2
    if t in (DOUBLE, FLOAT):
        col.size = data[off]
        return off + 1
    if t in (TIMESTAMP2, DATETIME2, TIME2):
        col.fsp = data[off]
        return off + 1
    if t in (VAR_STRING, STRING):
        meta = data[off] << 8 | data[off + 1]
        real = meta >> 8
        if real in (ENUM, SET):
            col.type, col.size = real, meta & 0xFF
        else:
            col.max_length = (((meta >> 4) & 0x300) ^ 0x300) + (meta & 0xFF)
        return off + 2
    if t in (BLOB, GEOMETRY, JSON):
        col.length_size = data[off]
        return off + 1
    if t == NEWDECIMAL:
        col.precision, col.decimals = data[off], data[off + 1]
        return off + 2
    if t == BIT:
        col.bits = data[off + 1] * 8 + data[off]
        col.bytes = (col.bits + 7) // 8
        return off + 2
    return off


def parse(data: bytes, end: int, dbms: str) -> TableMap:
    """The TABLE_MAP event in packet ``data`` (its body ends at ``end``); ``dbms`` ``"mariadb"`` or ``"mysql"``
    (which collation ids mean which character set)."""
    off = HEADER_END
    table_id = int.from_bytes(data[off:off + 6], "little")
    off += 8  # table id, flags
    ln = data[off]
    schema = data[off + 1:off + 1 + ln].decode()
    off += ln + 2
    ln = data[off]
    table = data[off + 1:off + 1 + ln].decode()
    off += ln + 2
    n, off = packed_int(data, off)
    cols = [BinlogColumn(t) for t in data[off:off + n]]
    off += n
    meta_len, off = packed_int(data, off)
    moff = off
    for c in cols:
        moff = _column_meta(c, data, moff)
    off += meta_len + (n + 7) // 8  # metadata, null bitmap
    chars = [c for c in cols if _is_char(c.type, dbms)]
    enum_sets = [c for c in cols if c.type in (ENUM, SET)]
    while off < end:
        kind = data[off]
        ln, off = packed_int(data, off + 1)
        vend = off + ln
        if kind == 1:  # signedness: one bit per numeric column, most significant first
            numeric = [c for c in cols if c.type in _NUMERIC]
            for i, c in enumerate(numeric):
                c.unsigned = bool(data[off + i // 8] & (0x80 >> (i % 8)))
        elif kind in (2, 10):  # default charset (+ exceptions by position) of character / ENUM-SET columns
            which = chars if kind == 2 else enum_sets
            default, p = packed_int(data, off)
            per = dict.fromkeys(range(len(which)), default)
            while p < vend:
                idx, p = packed_int(data, p)
                per[idx], p = packed_int(data, p)
            for i, c in enumerate(which):
                _set_charset(c, per[i], dbms)
        elif kind in (3, 11):  # charset of each character / ENUM-SET column
            which = chars if kind == 3 else enum_sets
            for c, coll in zip(which, _ints(data, off, vend), strict=False):
                _set_charset(c, coll, dbms)
        elif kind == 4:  # column names
            p = off
            for c in cols:
                if p >= vend:
                    break
                ln2, p = packed_int(data, p)
                c.name = data[p:p + ln2].decode()
                p += ln2
        elif kind == 5:
            for c, vals in zip((c for c in cols if c.type == SET), _strings(data, off, vend), strict=False):
                c.set_values = vals
        elif kind == 6:
            for c, vals in zip((c for c in cols if c.type == ENUM), _strings(data, off, vend), strict=False):
                c.enum_values = ["", *vals]
        off = vend
    return TableMap(table_id, schema, table, tuple(cols))


class TableMapCache:
    """The table maps of one stream by table id, each parsed only when its body differs from the cached one."""

    __slots__ = ("_bodies", "_maps", "dbms")

    def __init__(self, dbms: str) -> None:
        self.dbms = dbms
        self._bodies: dict[int, bytes] = {}
        self._maps: dict[int, TableMap] = {}

    def put(self, data: bytes, end: int) -> TableMap:
        """The table map of the TABLE_MAP event in ``data``: the cached object when its body is unchanged."""
        table_id = int.from_bytes(data[HEADER_END:HEADER_END + 6], "little")
        body = data[HEADER_END:end]
        if self._bodies.get(table_id) == body:
            return self._maps[table_id]
        tm = self._maps[table_id] = parse(data, end, self.dbms)
        self._bodies[table_id] = body
        return tm

    def get(self, table_id: int) -> TableMap | None:
        return self._maps.get(table_id)

    def clear(self) -> None:
        """Forget every table map (table ids are reused after a server restart, which starts a new binlog file)."""
        self._bodies.clear()
        self._maps.clear()
