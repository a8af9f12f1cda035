"""MySQL's binary JSON (the value of a ``JSON`` column in the row binlog) -> the JSON text MySQL itself prints.

MySQL 8 stores and binlogs a ``JSON`` column in its own binary format (``sql-common/json_binary.cc``): a type byte,
then objects and arrays as a header (element count, byte size, key entries and value entries of 2 or 4 bytes) over
their keys and values, scalars (literals, 16/32/64-bit integers, doubles, utf8mb4 strings) and *opaque* values (a
MySQL column type and its bytes: DECIMAL, DATE/TIME/DATETIME/TIMESTAMP, anything else CAST into JSON).

:func:`to_text` renders it exactly as ``SELECT`` returns the column (``Json_wrapper::to_string``), so the text a
target receives is the text the upstream's own reads give: ``", "`` between members and elements, ``": "`` after a
key, members in their stored order (MySQL sorts keys by length, then bytes), strings escaped as MySQL escapes them
(``\\"``, ``\\\\``, ``\\b \\f \\n \\r \\t``, other control characters ``\\u00xx``; everything else as is), doubles as
MySQL's ``my_gcvt`` prints them (the shortest round-trip digits; ``.0`` added to an integral double), decimals with
their scale, temporal values quoted with six fractional digits, other opaque values as ``"base64:typeNN:..."``.

Guarantees: a well-formed value gives MySQL's text; anything else (a truncated value, an unknown type byte, an offset
outside the value) raises :class:`JsonBinaryError`, never a guess. An empty value (length 0, which MySQL writes for a
JSON ``null`` in some paths) is the JSON literal ``null``. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import struct
from decimal import Decimal

SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY = 0x00, 0x01, 0x02, 0x03
LITERAL, INT16, UINT16, INT32, UINT32, INT64, UINT64, DOUBLE, STRING, OPAQUE = (
    0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0F)
_LITERALS = {0x00: "null", 0x01: "true", 0x02: "false"}
# MySQL column types of opaque values printed as such (enum_field_types)
_DECIMAL, _DATE, _TIME, _DATETIME, _TIMESTAMP, _VAR_STRING = 246, 10, 11, 12, 7, 253
_DOUBLE = struct.Struct("<d")
_INT64, _UINT64 = struct.Struct("<q"), struct.Struct("<Q")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE_TABLE = str.maketrans({**{chr(c): f"\\u00{c:02x}" for c in range(0x20)}, **_ESCAPES})
_GCVT_WIDTH = 34  # MY_GCVT_MAX_FIELD_WIDTH: DBL_DIG + 4 + max(5, MAX_DECPT_FOR_F_FORMAT)
_MAX_DECPT_F = 15  # MAX_DECPT_FOR_F_FORMAT (DBL_DIG)
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


class JsonBinaryError(ValueError):
    """A binary JSON value that is not well formed."""


def to_text(data: bytes) -> str:
    """The JSON text MySQL prints for the binary JSON value ``data`` (see the module docstring)."""
    if not data:
        return "null"
    out: list[str] = []
    try:
        _value(data, data[0], 1, len(data), out)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise JsonBinaryError(f"malformed binary JSON value: {exc}") from exc
    return "".join(out)


def _quote(text: str) -> str:
    return '"' + text.translate(_ESCAPE_TABLE) + '"'


def _varlen(data: bytes, off: int, end: int) -> tuple[int, int]:
    """A variable-length size (7 bits a byte, least significant first): ``(value, offset after it)``."""
    value = shift = 0
    for i in range(5):
        if off + i >= end:
            break
        b = data[off + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, off + i + 1
        shift += 7
    raise JsonBinaryError("malformed variable-length size in a binary JSON value")


def _value(data: bytes, t: int, off: int, end: int, out: list[str]) -> None:  # noqa: PLR0912 - one branch per type
    """Append the text of the value of type ``t`` stored at ``data[off:end]``."""
    if t in (SMALL_OBJECT, LARGE_OBJECT, SMALL_ARRAY, LARGE_ARRAY):
        _container(data, t, off, end, out)
    elif t == LITERAL:
        lit = _LITERALS.get(data[off])
        if lit is None:
            raise JsonBinaryError(f"unknown binary JSON literal 0x{data[off]:02x}")
        out.append(lit)
    elif t == INT16:
        out.append(str(int.from_bytes(data[off:off + 2], "little", signed=True)))
    elif t == UINT16:
        out.append(str(int.from_bytes(data[off:off + 2], "little")))
    elif t == INT32:
        out.append(str(int.from_bytes(data[off:off + 4], "little", signed=True)))
    elif t == UINT32:
        out.append(str(int.from_bytes(data[off:off + 4], "little")))
    elif t == INT64:
        out.append(str(_INT64.unpack_from(data, off)[0]))
    elif t == UINT64:
        out.append(str(_UINT64.unpack_from(data, off)[0]))
    elif t == DOUBLE:
        out.append(mysql_double(_DOUBLE.unpack_from(data, off)[0]))
    elif t == STRING:
        n, p = _varlen(data, off, end)
        if p + n > end:
            raise JsonBinaryError("a binary JSON string runs past its value")
        out.append(_quote(data[p:p + n].decode("utf-8")))
    elif t == OPAQUE:
        field_type = data[off]
        n, p = _varlen(data, off + 1, end)
        if p + n > end:
            raise JsonBinaryError("a binary JSON opaque value runs past its value")
        out.append(_opaque(field_type, data[p:p + n]))
    else:
        raise JsonBinaryError(f"unknown binary JSON type 0x{t:02x}")


def _container(data: bytes, t: int, off: int, end: int, out: list[str]) -> None:
    """An object or array whose header starts at ``off`` (offsets in it are relative to ``off``)."""
    large = t in (LARGE_OBJECT, LARGE_ARRAY)
    is_object = t in (SMALL_OBJECT, LARGE_OBJECT)
    size = 4 if large else 2
    count = int.from_bytes(data[off:off + size], "little")
    nbytes = int.from_bytes(data[off + size:off + 2 * size], "little")
    if off + nbytes > end:
        raise JsonBinaryError("a binary JSON object or array runs past its value")
    limit = off + nbytes
    entry = off + 2 * size
    keys: list[str] = []
    if is_object:
        for _ in range(count):
            k_off = int.from_bytes(data[entry:entry + size], "little")
            k_len = int.from_bytes(data[entry + size:entry + size + 2], "little")
            if off + k_off + k_len > limit:
                raise JsonBinaryError("a binary JSON key runs past its object")
            keys.append(data[off + k_off:off + k_off + k_len].decode("utf-8"))
            entry += size + 2
    inline = (LITERAL, INT16, UINT16, INT32, UINT32) if large else (LITERAL, INT16, UINT16)
    out.append("{" if is_object else "[")
    for i in range(count):
        if i:
            out.append(", ")
        if is_object:
            out.append(_quote(keys[i]))
            out.append(": ")
        vt = data[entry]
        if vt in inline:
            _value(data, vt, entry + 1, entry + 1 + size, out)
        else:
            v_off = int.from_bytes(data[entry + 1:entry + 1 + size], "little")
            if v_off >= nbytes:
                raise JsonBinaryError("a binary JSON value offset points past its container")
            _value(data, vt, off + v_off, limit, out)
        entry += 1 + size
    out.append("}" if is_object else "]")


def _opaque(field_type: int, raw: bytes) -> str:
    """The text of an opaque value of MySQL column type ``field_type``."""
    if field_type == _DECIMAL:
        return _decimal(raw)
    if field_type in (_DATE, _TIME, _DATETIME, _TIMESTAMP):
        return '"' + _temporal(field_type, raw) + '"'
    if field_type == _VAR_STRING:
        return _quote(raw.decode("utf-8"))
    return _quote(f"base64:type{field_type}:" + base64.b64encode(raw).decode())


def _decimal(raw: bytes) -> str:
    """A DECIMAL opaque value: precision, scale, then MySQL's binary decimal; printed with its scale."""
    precision, scale = raw[0], raw[1]
    integral = precision - scale
    ui, ci = divmod(integral, 9)
    uf, cf = divmod(scale, 9)
    size = _DIG2BYTES[ci] + ui * 4 + uf * 4 + _DIG2BYTES[cf]
    b = bytearray(raw[2:2 + size])
    if len(b) != size:
        raise JsonBinaryError("a binary JSON decimal is shorter than its precision")
    negative = not b[0] & 0x80
    b[0] ^= 0x80
    if negative:
        for i in range(size):
            b[i] ^= 0xFF
    parts = ["-"] if negative else []
    p = 0
    if ci:
        n = _DIG2BYTES[ci]
        parts.append(str(int.from_bytes(b[p:p + n], "big")))
        p += n
    for _ in range(ui):
        parts.append(f"{int.from_bytes(b[p:p + 4], 'big'):09d}")
        p += 4
    parts.append(".")
    for _ in range(uf):
        parts.append(f"{int.from_bytes(b[p:p + 4], 'big'):09d}")
        p += 4
    if cf:
        parts.append(f"{int.from_bytes(b[p:p + _DIG2BYTES[cf]], 'big'):0{cf}d}")
    return format(Decimal("".join(parts)), "f")


def _temporal(field_type: int, raw: bytes) -> str:
    """A DATE/TIME/DATETIME/TIMESTAMP opaque value (MySQL's packed 8-byte integer), as ``my_TIME_to_str(t, 6)``."""
    if len(raw) != 8:
        raise JsonBinaryError(f"a binary JSON temporal value of {len(raw)} bytes (8 expected)")
    packed = _INT64.unpack(raw)[0]
    sign = "-" if packed < 0 else ""
    packed = abs(packed)
    frac = packed % (1 << 24)
    whole = packed >> 24
    if field_type == _TIME:
        hms = whole
        return (f"{sign}{(hms >> 12) % (1 << 10):02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}.{frac:06d}")
    ymd, hms = whole >> 17, whole % (1 << 17)
    day, ym = ymd % 32, ymd >> 5
    month, year = ym % 13, ym // 13
    if field_type == _DATE:
        return f"{year:04d}-{month:02d}-{day:02d}"
    return (f"{year:04d}-{month:02d}-{day:02d} {hms >> 12:02d}:{(hms >> 6) % 64:02d}:{hms % 64:02d}.{frac:06d}")


def mysql_double(x: float) -> str:
    """A JSON double as MySQL prints it: ``my_gcvt(x, DOUBLE, 34)`` (the shortest digits that read back as ``x``, in
    the 'f' or 'e' form my_gcvt chooses), ``.0`` added when that has neither a point nor an exponent."""
    negative = x < 0 or (x == 0 and str(x).startswith("-"))
    width = _GCVT_WIDTH - (1 if x < 0 else 0)
    digits, decpt = _shortest(abs(x))
    n = len(digits)
    exp_len = 1 + (decpt >= 101 or decpt <= -99) + (decpt >= 11 or decpt <= -9)
    have_space = (n - decpt + 2 if decpt <= 0 else n + 1 if decpt < n else decpt) <= width
    force_e = decpt <= 0 and width <= 2 - decpt and width >= 3 + exp_len
    use_f = ((have_space or (decpt <= width and (decpt >= -1 or (decpt == -2 and (n > 1 or not force_e)))
                             and not force_e))
             and (not have_space or (decpt >= -_MAX_DECPT_F + 1 and (decpt <= _MAX_DECPT_F or n > decpt))))
    sign = "-" if negative else ""
    if use_f:
        if decpt <= 0:
            text = "0." + "0" * -decpt + digits
        elif decpt < n:
            text = digits[:decpt] + "." + digits[decpt:]
        else:
            text = digits + "0" * (decpt - n)
    else:
        e = decpt - 1
        text = digits[0] + ("." + digits[1:] if n > 1 else "") + "e" + ("-" if e < 0 else "") + str(abs(e))
    text = sign + text
    if "." not in text and "e" not in text:
        text += ".0"
    return text


def _shortest(x: float) -> tuple[str, int]:
    """The shortest decimal digits that read back as ``x`` (>= 0), and the decimal point's position (dtoa's
    ``decpt``: the value is ``0.DIGITS * 10**decpt``)."""
    if x == 0:
        return "0", 1
    mantissa, _, exp = repr(x).partition("e")
    whole, _, frac = mantissa.partition(".")
    if frac == "0":
        frac = ""
    raw = whole + frac
    decpt = len(whole) + (int(exp) if exp else 0)
    stripped = raw.lstrip("0")
    decpt -= len(raw) - len(stripped)
    return stripped.rstrip("0") or "0", decpt
