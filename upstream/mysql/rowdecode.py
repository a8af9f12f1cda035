"""Row events decoded straight into the stored text form: the decoding interface of the span source's hot path.

:func:`rows_header` reads a WRITE/UPDATE/DELETE_ROWS event's header (v1, MariaDB's, and v2, MySQL 8's): the table
id, the column count and the **columns-present bitmaps** (``present``: the before image's for an UPDATE or DELETE,
the after image's for a WRITE; ``present_after``: an UPDATE's after image's), as the binlog carries them, so a check
of partial row images (``binlog_row_image`` not FULL in the writing session) runs on them before any row is decoded.

:class:`RowDecoder` is built once per (table map, schema version) from the table map's columns
(:mod:`upstream.mysql.tablemap`) and the span's text renderers (:mod:`upstream.mysql.types`). It decodes a whole
image into the list the payload stores (:mod:`upstream.mysql.payload`): per column its text form, None for NULL,
:data:`cdc.events.UNCHANGED` for a column the image does not carry. The text is exactly what the renderer gives for
the value the reference client (``pymysqlreplication``) decodes from the same bytes: integers, years and character
strings in a known character set are rendered inline (the same text), every other type is read as the reference
client's value and handed to the renderer. A value that cannot be kept exactly (a zero date, a TIME outside a day,
text that does not decode in its character set) raises :class:`ValueRefused` naming the column and why.

No I/O, no logging; one list per image and nothing else per row beyond the values.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from cdc.events import UNCHANGED
from upstream.mysql import binlog, json_binary, payload, rowcodec, types
from upstream.mysql import tablemap as tm

Column = Callable[[bytes, int], tuple[Any, int]]
"""Reads one non-NULL value at an offset: ``(text, offset after it)``."""


class ValueRefused(ValueError):
    """A value of column ``index`` that cannot be replicated exactly (``reason``)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class _Refuse(ValueError):
    """Raised by a column reader; :class:`RowDecoder` adds the column index."""


def rows_header(data: bytes, etype: int) -> tuple[int, int, bytes, bytes | None, int]:
    """``(table_id, column count, present, present_after, offset of the first row)`` of the rows event in packet
    ``data`` of type ``etype`` (``present_after`` None unless an UPDATE). Table ids are 6 bytes (every server that
    writes ``binlog_row_metadata``)."""
    off = binlog.HEADER_END
    table_id = int.from_bytes(data[off:off + 6], "little")
    off += 8  # table id, flags
    if etype in binlog.ROWS_V2 or etype == binlog.PARTIAL_UPDATE_ROWS:
        off += data[off] | data[off + 1] << 8  # extra data, its 2-byte length included
    n, off = binlog.packed_int(data, off)
    nb = (n + 7) >> 3
    present = data[off:off + nb]
    off += nb
    after = None
    if etype in binlog.UPDATES or etype == binlog.PARTIAL_UPDATE_ROWS:
        after = data[off:off + nb]
        off += nb
    return table_id, n, present, after, off


# ---- readers of the reference client's values ----------------------------------------------------------
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def _decimal_reader(precision: int, scale: int) -> Callable[[bytes, int], tuple[Decimal, int]]:
    integral = precision - scale
    ui, ci = divmod(integral, 9)
    uf, cf = divmod(scale, 9)
    size = _DIG2BYTES[ci] + ui * 4 + uf * 4 + _DIG2BYTES[cf]

    def read(data: bytes, off: int) -> tuple[Decimal, int]:
        raw = bytearray(data[off:off + size])
        negative = not raw[0] & 0x80
        raw[0] ^= 0x80
        if negative:
            for i in range(size):
                raw[i] ^= 0xFF
        parts = ["-"] if negative else []
        p = 0
        if ci:
            n = _DIG2BYTES[ci]
            parts.append(str(int.from_bytes(raw[p:p + n], "big")))
            p += n
        for _ in range(ui):
            parts.append(f"{int.from_bytes(raw[p:p + 4], 'big'):09d}")
            p += 4
        parts.append(".")
        for _ in range(uf):
            parts.append(f"{int.from_bytes(raw[p:p + 4], 'big'):09d}")
            p += 4
        if cf:
            n = _DIG2BYTES[cf]
            parts.append(f"{int.from_bytes(raw[p:p + n], 'big'):0{cf}d}")
        return Decimal("".join(parts)), off + size
    return read


def _fsp_reader(fsp: int) -> Callable[[bytes, int], tuple[int, int]]:
    n = (fsp + 1) // 2

    def read(data: bytes, off: int) -> tuple[int, int]:
        if not n:
            return 0, off
        v = int.from_bytes(data[off:off + n], "big")
        if fsp % 2:
            v //= 10
        return v * 10 ** (6 - fsp), off + n
    return read


def _value_reader(c: tm.BinlogColumn) -> Callable[[bytes, int], tuple[Any, int]]:
    """The reader of the value the reference client gives for ``c`` (see the module docstring)."""
    t = c.type
    ints = {tm.TINY: (1, "b"), tm.SHORT: (2, "h"), tm.LONG: (4, "i"), tm.LONGLONG: (8, "q")}
    if t in ints:
        n, code = ints[t]
        unpack = struct.Struct("<" + (code.upper() if c.unsigned else code)).unpack_from
        return lambda data, off: (unpack(data, off)[0], off + n)
    if t == tm.INT24:
        signed = not c.unsigned
        return lambda data, off: (int.from_bytes(data[off:off + 3], "little", signed=signed), off + 3)
    if t in (tm.FLOAT, tm.DOUBLE):
        n = 4 if t == tm.FLOAT else 8
        unpack = struct.Struct("<f" if n == 4 else "<d").unpack_from
        return lambda data, off: (unpack(data, off)[0], off + n)
    if t in (tm.VARCHAR, tm.STRING, tm.BLOB):
        lsize = c.length_size if t == tm.BLOB else (2 if c.max_length > 255 else 1)
        enc = c.encoding

        def string(data: bytes, off: int) -> tuple[Any, int]:
            ln = int.from_bytes(data[off:off + lsize], "little")
            off += lsize
            raw = data[off:off + ln]
            if enc is None:
                return raw, off + ln
            try:
                return raw.decode(enc), off + ln
            except UnicodeDecodeError as exc:
                raise _Refuse(f"text that did not decode in its character set ({exc})") from exc
        return string
    if t == tm.NEWDECIMAL:
        return _decimal_reader(c.precision, c.decimals)
    if t == tm.JSON:  # MySQL's binary JSON: its text as MySQL prints it (upstream.mysql.json_binary)
        jsize = c.length_size

        def read_json(data: bytes, off: int) -> tuple[str, int]:
            ln = int.from_bytes(data[off:off + jsize], "little")
            off += jsize
            if off + ln > len(data):
                raise _Refuse("a JSON value that runs past its event")
            try:
                return json_binary.to_text(data[off:off + ln]), off + ln
            except json_binary.JsonBinaryError as exc:
                raise _Refuse(str(exc)) from None
        return read_json
    if t == tm.YEAR:
        return lambda data, off: (data[off] + 1900, off + 1)
    if t == tm.DATE:
        def read_date(data: bytes, off: int) -> tuple[date, int]:
            v = int.from_bytes(data[off:off + 3], "little")
            y, m, d = v >> 9, (v >> 5) & 15, v & 31
            if not (y and m and d):
                raise _Refuse("out of date range")
            return date(y, m, d), off + 3
        return read_date
    if t == tm.DATETIME2:
        fsp = _fsp_reader(c.fsp)

        def read_dt2(data: bytes, off: int) -> tuple[datetime, int]:
            v = int.from_bytes(data[off:off + 5], "big")
            ym = (v >> 22) & 0x1FFFF
            try:
                dt = datetime(ym // 13, ym % 13, (v >> 17) & 31, (v >> 12) & 31, (v >> 6) & 63, v & 63)
            except ValueError:
                raise _Refuse("out of datetime2 range") from None
            us, off = fsp(data, off + 5)
            return (dt.replace(microsecond=us) if us else dt), off
        return read_dt2
    if t == tm.TIMESTAMP2:
        fsp = _fsp_reader(c.fsp)

        def read_ts2(data: bytes, off: int) -> tuple[datetime, int]:
            secs = int.from_bytes(data[off:off + 4], "big")
            us, off = fsp(data, off + 4)
            dt = datetime.utcfromtimestamp(secs)  # noqa: DTZ004 - naive UTC, as the reference client
            return (dt.replace(microsecond=us) if us else dt), off
        return read_ts2
    if t == tm.TIME2:
        fsp = _fsp_reader(c.fsp)

        def read_t2(data: bytes, off: int) -> tuple[timedelta, int]:
            v = int.from_bytes(data[off:off + 3], "big")
            sign = 1
            if not v & 0x800000:
                sign, v = -1, (-v) & 0xFFFFFF  # two's complement of the 3 bytes
            us, off = fsp(data, off + 3)
            return timedelta(hours=(v >> 12) & 0x3FF, minutes=(v >> 6) & 63, seconds=v & 63,
                             microseconds=us) * sign, off
        return read_t2
    if t == tm.DATETIME:
        def read_dt(data: bytes, off: int) -> tuple[datetime, int]:
            v = int.from_bytes(data[off:off + 8], "little")
            d, s = divmod(v, 1000000)
            y, md = divmod(d, 10000)
            if not (y and md // 100 and md % 100):
                raise _Refuse("out of datetime range")
            return datetime(y, md // 100, md % 100, s // 10000, s // 100 % 100, s % 100), off + 8
        return read_dt
    if t == tm.TIME:
        def read_t(data: bytes, off: int) -> tuple[timedelta, int]:
            v = int.from_bytes(data[off:off + 3], "little")
            return timedelta(hours=v // 10000, minutes=v % 10000 // 100, seconds=v % 100), off + 3
        return read_t
    if t == tm.TIMESTAMP:
        return lambda data, off: (datetime.utcfromtimestamp(int.from_bytes(data[off:off + 4], "little")),  # noqa: DTZ004
                                  off + 4)
    if t == tm.ENUM:
        size, values = c.size, c.enum_values

        def read_enum(data: bytes, off: int) -> tuple[str, int]:
            if not values:
                raise _Refuse("an ENUM without its member names in the binlog (binlog_row_metadata not FULL)")
            i = int.from_bytes(data[off:off + size], "little")
            if i >= len(values):
                raise _Refuse(f"ENUM index {i} beyond its {len(values) - 1} members")
            return values[i], off + size
        return read_enum
    if t == tm.SET:
        size, members = c.size, c.set_values

        def read_set(data: bytes, off: int) -> tuple[Any, int]:
            if not members:
                raise _Refuse("a SET without its member names in the binlog (binlog_row_metadata not FULL)")
            mask = int.from_bytes(data[off:off + size], "little")
            return {m for i, m in enumerate(members) if mask >> i & 1}, off + size
        return read_set
    if t == tm.BIT:
        nbytes, nbits = c.bytes, c.bits

        def read_bit(data: bytes, off: int) -> tuple[str, int]:
            return format(int.from_bytes(data[off:off + nbytes], "big"), f"0{nbits}b")[-nbits:], off + nbytes
        return read_bit
    raise _Refuse(f"binlog column type {t} is not decoded")


_INT_RENDER = types.renderer("int", "int", None)
_TEXT_RENDER = types.renderer("text", "text", None)
_YEAR_RENDER = types.renderer("year", "year", None)
_BYTEA_RENDER = types.renderer("blob", "blob", None)
_DATE_RENDER = types.renderer("date", "date", None)
_DATETIME_RENDER = types.renderer("datetime", "datetime", None)
_TIMESTAMP_RENDER = types.renderer("timestamp", "timestamp", None)
_TIME_RENDER = types.renderer("time", "time", None)
_INT_SIZES = {tm.TINY: 1, tm.SHORT: 2, tm.INT24: 3, tm.LONG: 4, tm.LONGLONG: 8}
_TEMPORAL = {(tm.DATETIME2, _DATETIME_RENDER): rowcodec.DATETIME2, (tm.TIMESTAMP2, _TIMESTAMP_RENDER): rowcodec.TIMESTAMP2,
             (tm.TIME2, _TIME_RENDER): rowcodec.TIME2}


def _c_code(c: tm.BinlogColumn, render: types.Render) -> tuple[int, int, int]:
    """``(code, p1, p2)`` of column ``c`` for ``rowcodec.c``: a code C renders exactly as ``render`` renders the
    reference client's value, else ``CALL`` (its Python reader)."""
    t = c.type
    if render is _INT_RENDER and t in _INT_SIZES:
        return (rowcodec.UINT if c.unsigned else rowcodec.INT), _INT_SIZES[t], 0
    if render is _YEAR_RENDER and t == tm.YEAR:
        return rowcodec.YEAR, 0, 0
    if t in (tm.VARCHAR, tm.STRING, tm.BLOB):
        lsize = c.length_size if t == tm.BLOB else (2 if c.max_length > 255 else 1)
        if render is _TEXT_RENDER and c.encoding == "utf8":
            return rowcodec.TEXT, lsize, 0
        if c.encoding is None and lsize in (1, 2, 3, 4):
            if render is _BYTEA_RENDER:
                return rowcodec.BYTEA, lsize, 0
            if t == tm.STRING and c.max_length <= 255:
                try:  # BINARY(n)'s renderer pads to n: the same n as the binlog's length?
                    if render(b"") == "\\x" + "00" * c.max_length:
                        return rowcodec.BINARY, lsize, c.max_length
                except ValueError:
                    pass
    if render is _DATE_RENDER and t == tm.DATE:
        return rowcodec.DATE, 0, 0
    code = _TEMPORAL.get((t, render))
    if code is not None and 0 <= c.fsp <= 6:
        return code, c.fsp, 0
    return rowcodec.CALL, 0, 0


def _column(c: tm.BinlogColumn, render: types.Render) -> Column:
    """The text reader of column ``c`` rendered by ``render``."""
    t = c.type
    if render is _INT_RENDER and t == tm.INT24:
        signed = not c.unsigned
        return lambda data, off: (str(int.from_bytes(data[off:off + 3], "little", signed=signed)), off + 3)
    if render is _YEAR_RENDER and t == tm.YEAR:
        return lambda data, off: ("0" if not data[off] else str(data[off] + 1900), off + 1)
    if render is _TEXT_RENDER and t in (tm.VARCHAR, tm.STRING, tm.BLOB) and c.encoding is not None:
        lsize = c.length_size if t == tm.BLOB else (2 if c.max_length > 255 else 1)
        enc = c.encoding

        def text(data: bytes, off: int) -> tuple[str, int]:
            end = off + lsize + int.from_bytes(data[off:off + lsize], "little")
            try:
                return data[off + lsize:end].decode(enc), end
            except UnicodeDecodeError as exc:
                raise _Refuse(f"text that did not decode in its character set ({exc})") from exc
        return text
    read = _value_reader(c)
    if t == tm.SET:
        def set_text(data: bytes, off: int) -> tuple[str, int]:
            v, off = read(data, off)
            if not v:
                return "", off  # the empty set: '' (distinct from NULL)
            try:
                return render(v), off
            except ValueError as exc:
                raise _Refuse(str(exc)) from None
        return set_text

    def generic(data: bytes, off: int) -> tuple[str, int]:
        v, off = read(data, off)
        try:
            return render(v), off
        except ValueError as exc:  # (its own _Refuse included)
            raise _Refuse(str(exc)) from None
    return generic


def _fast_int(c: tm.BinlogColumn) -> Column | None:
    """An integer column's reader without the intermediate call (the common case of every key)."""
    sizes = {tm.TINY: (1, "b"), tm.SHORT: (2, "h"), tm.LONG: (4, "i"), tm.LONGLONG: (8, "q")}
    if c.type not in sizes:
        return None
    n, code = sizes[c.type]
    unpack = struct.Struct("<" + (code.upper() if c.unsigned else code)).unpack_from
    return lambda data, off: (str(unpack(data, off)[0]), off + n)


class RowDecoder:
    """Decodes the images of one table's row events (see the module docstring)."""

    __slots__ = ("columns", "count", "full", "padded", "_readers", "_null_bytes", "_native", "_plan", "_heads")

    def __init__(self, columns: Sequence[tm.BinlogColumn], renderers: Sequence[types.Render],
                 native: rowcodec.DecodeRows | None = None) -> None:
        """``native``: the C ``decode_rows`` (:func:`upstream.mysql.rowcodec.best`) that :meth:`payloads` tries
        first; None decodes in Python only."""
        self.columns = tuple(columns)
        self.count = n = len(columns)
        self.full = bytes([0xFF] * (n >> 3) + ([(1 << (n & 7)) - 1] if n & 7 else []))
        """The columns-present bitmap of an image that carries every column (MariaDB's: unused bits clear)."""
        self.padded = bytes([0xFF] * ((n + 7) >> 3))
        """The same with the unused bits of the last byte set, as MySQL 8 writes it: every column too."""
        readers: list[Column] = []
        for i, (c, r) in enumerate(zip(columns, renderers, strict=True)):
            fast = _fast_int(c) if r is _INT_RENDER else None
            try:
                readers.append(fast or _column(c, r))
            except _Refuse as exc:
                raise ValueRefused(i, str(exc)) from None
        self._readers = tuple(readers)
        self._null_bytes = (n + 7) >> 3
        self._native = native
        codes = [_c_code(c, r) for c, r in zip(columns, renderers, strict=True)]
        self._plan = (bytes(c for c, _, _ in codes), bytes(a for _, a, _ in codes), bytes(b for _, _, b in codes),
                      tuple(rd if code == rowcodec.CALL else None for rd, (code, _, _) in zip(readers, codes, strict=True)))
        self._heads: dict[tuple[bytes, bytes, int], bytes] = {}

    def event_decoder(self, native_event: rowcodec.DecodeEvent | None, prefix: bytes,
                      relid: int) -> Callable[[bytes, int, int], list[bytes] | None] | None:
        """``fast(data, end, etype)``: the payloads of a whole rows event of this table (its header read in C too)
        in one C call, the same bytes as :meth:`payloads` after :func:`rows_header`; None where C does not answer
        exactly (a partial image, another column count, a value C does not render: those two decide). None without
        ``native_event`` (``rowcodec.c``'s ``decode_event``)."""
        if native_event is None:
            return None
        heads = tuple(prefix + payload.encode(k, relid, None, None) for k in (b"I", b"U", b"D"))
        return functools.partial(native_event, heads, self.full, self.padded, *self._plan)

    def payloads(self, data: bytes, off: int, end: int, kind: bytes, prefix: bytes, relid: int) -> list[bytes]:
        """The stored payload (``prefix`` then :func:`upstream.mysql.payload.encode`) of every row change of a rows
        event whose images carry every column: ``kind`` ``b'I'`` (WRITE), ``b'U'`` (UPDATE), ``b'D'`` (DELETE).
        In C when the decoder has it and it recognises every value, else in Python (the same bytes, or
        :class:`ValueRefused`)."""
        if self._native is not None:
            key = (kind, prefix, relid)
            head = self._heads.get(key)
            if head is None:
                head = self._heads[key] = prefix + payload.encode(kind, relid, None, None)
            codes, p1, p2, calls = self._plan
            out = self._native(data, off, end, kind[0], head, codes, p1, p2, calls)
            if out is not None:
                return out  # type: ignore[no-any-return]
        encode = payload.encode
        if kind == b"U":
            return [prefix + encode(kind, relid, after, before)
                    for before, after in self.pairs(data, off, end, self.full, self.full)]
        if kind == b"I":
            return [prefix + encode(kind, relid, row, None) for row in self.images(data, off, end, self.full)]
        return [prefix + encode(kind, relid, None, row) for row in self.images(data, off, end, self.full)]

    def image(self, data: bytes, off: int) -> tuple[list[Any], int]:
        """The full image (every column present) at ``off``: ``(values, offset after it)``."""
        nb = self._null_bytes
        nulls = int.from_bytes(data[off:off + nb], "little")
        off += nb
        out: list[Any] = []
        append = out.append
        try:
            if not nulls:
                for read in self._readers:
                    v, off = read(data, off)
                    append(v)
            else:
                for i, read in enumerate(self._readers):
                    if nulls >> i & 1:
                        append(None)
                    else:
                        v, off = read(data, off)
                        append(v)
        except _Refuse as exc:
            raise ValueRefused(len(out), str(exc)) from None
        return out, off

    def partial_image(self, data: bytes, off: int, present: bytes) -> tuple[list[Any], int]:
        """An image carrying only the columns ``present`` marks: ``UNCHANGED`` for the others."""
        bits = int.from_bytes(present, "little")
        carried = [i for i in range(self.count) if bits >> i & 1]
        nb = (len(carried) + 7) >> 3
        nulls = int.from_bytes(data[off:off + nb], "little")
        off += nb
        out: list[Any] = [UNCHANGED] * self.count
        try:
            for k, i in enumerate(carried):
                if nulls >> k & 1:
                    out[i] = None
                else:
                    out[i], off = self._readers[i](data, off)
        except _Refuse as exc:
            raise ValueRefused(i, str(exc)) from None
        return out, off

    def images(self, data: bytes, off: int, end: int, present: bytes) -> list[list[Any]]:
        """Every image of a WRITE or DELETE event's rows from ``off`` to ``end``."""
        out = []
        if present == self.full:
            image = self.image
            while off < end:
                row, off = image(data, off)
                out.append(row)
        else:
            while off < end:
                row, off = self.partial_image(data, off, present)
                out.append(row)
        if off != end:
            raise ValueError(f"rows overran their event by {off - end} bytes")
        return out

    def pairs(self, data: bytes, off: int, end: int, present: bytes,
              present_after: bytes) -> list[tuple[list[Any], list[Any]]]:
        """Every ``(before, after)`` image pair of an UPDATE event's rows."""
        out = []
        full = self.full
        before_img = self.image if present == full else (lambda d, o: self.partial_image(d, o, present))
        after_img = self.image if present_after == full else (lambda d, o: self.partial_image(d, o, present_after))
        while off < end:
            before, off = before_img(data, off)
            after, off = after_img(data, off)
            out.append((before, after))
        if off != end:
            raise ValueError(f"rows overran their event by {off - end} bytes")
        return out
