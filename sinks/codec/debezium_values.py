"""PostgreSQL columns and values as Debezium's PostgreSQL connector writes them (Kafka Connect schemas, JSON).

Default connector settings (``time.precision.mode=adaptive``, ``decimal.handling.mode=precise``,
``binary.handling.mode=bytes``, ``interval.handling.mode=numeric``); the last three are configurable
(``EncoderConfig``). Kafka Connect literal type / Debezium semantic type per PostgreSQL base type:

===========================  ==========================================================================
int2 / int4 / int8, oid,     ``int16`` / ``int32`` / ``int64`` (xid, cid, xid8: ``int64``)
float4 / float8              ``float`` / ``double`` (JSON: Java's ``Float``/``Double.toString`` digits;
                             NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``,
                             as Jackson writes them)
bool                         ``boolean``
numeric(p,s)                 ``bytes`` ``org.apache.kafka.connect.data.Decimal`` (scale, precision
                             parameters; base64 of the unscaled two's complement big-endian integer)
numeric (unconstrained)      ``struct`` ``io.debezium.data.VariableScaleDecimal`` {scale, value}
                             (``string`` / ``double`` with decimal-handling-mode string / double)
bytea                        ``bytes`` (base64 in JSON); ``string`` in the base64 / base64-url-safe / hex modes
date                         ``int32`` ``io.debezium.time.Date`` (days since 1970-01-01)
time(p)                      ``int32`` ``io.debezium.time.Time`` (ms) for p <= 3, else ``int64``
                             ``io.debezium.time.MicroTime`` (us); undeclared precision is 6
timestamp(p)                 ``int64`` ``io.debezium.time.Timestamp`` (ms) for p <= 3, else
                             ``io.debezium.time.MicroTimestamp`` (us), both as if UTC
timestamptz                  ``string`` ``io.debezium.time.ZonedTimestamp`` (UTC, ``Z``, as many fraction
                             digits as the column's precision, 6 when undeclared)
timetz                       ``string`` ``io.debezium.time.ZonedTime`` (UTC, ``Z``)
interval                     ``int64`` ``io.debezium.time.MicroDuration`` (approximate: 365.25/12 days a
                             month) or ``string`` ``io.debezium.time.Interval`` (ISO 8601, exact)
uuid / json, jsonb / xml     ``string`` ``io.debezium.data.Uuid`` / ``io.debezium.data.Json`` / ``Xml``
text, varchar, bpchar, ...   ``string``; every other type (enums, money, bit, inet, ranges, geometry...):
                             ``string`` with PostgreSQL's text (see docs/sinks.md for the deviations)
arrays                       ``array`` of the element's schema (elements optional)
===========================  ==========================================================================

Special values as Debezium writes them: ``infinity``/``-infinity`` timestamps as 9223372036825200000 /
-9223372036832400000 us (``/1000`` for ms), timestamptz as the strings ``infinity``/``-infinity``, dates as the days
of -5877611-06-21 / -5877611-06-22; BC dates and years above 9999 exactly (proleptic Gregorian calendar).
A NaN or infinite numeric has no Decimal: with decimal-handling-mode precise it is an :class:`EncodeError` (Debezium
writes null); use ``string``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc.events import UNCHANGED, ColumnSchema
from sinks.codec import text as X
from sinks.codec import types as T
from sinks.codec.base import EncodeError, EncoderConfig

EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
DAYS_PER_MONTH_AVG = 365.25 / 12.0
TS_POS_INFINITY_US = 9223372036825200000
TS_NEG_INFINITY_US = -9223372036832400000
US_PER_DAY = 86_400_000_000


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (``y`` astronomical: 1 BC is 0)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


DATE_POS_INFINITY = days_from_civil(-5877611, 6, 21)
DATE_NEG_INFINITY = days_from_civil(-5877611, 6, 22)

_PG_DATE = re.compile(r"(\d+)-(\d\d)-(\d\d)( BC)?")
_PG_TS = re.compile(r"(\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(\.\d+)?([+-]\d\d(?::?\d\d(?::?\d\d)?)?)?( BC)?")
_PG_TIMETZ = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?")
_PG_INTERVAL = re.compile(r"([+-]?\d+) (years?|mons?|days?)|([+-]?)(\d+):(\d\d):(\d\d(?:\.\d+)?)")


def _offset_seconds(text: str | None) -> int:
    if not text:
        return 0
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    h, m, s = int(digits[0:2]), int(digits[2:4] or 0), int(digits[4:6] or 0)
    return sign * (h * 3600 + m * 60 + s)


def pg_date_days(v: Any) -> int:
    """Epoch days of a date value (a ``date`` or PostgreSQL's text of one Python cannot hold)."""
    if type(v) is date:
        return v.toordinal() - EPOCH_ORDINAL
    if v == "infinity":
        return DATE_POS_INFINITY
    if v == "-infinity":
        return DATE_NEG_INFINITY
    m = _PG_DATE.fullmatch(str(v))
    if m is None:
        raise ValueError(f"not a PostgreSQL date: {v!r}")
    y = int(m.group(1))
    return days_from_civil(1 - y if m.group(4) else y, int(m.group(2)), int(m.group(3)))


def pg_timestamp_micros(v: Any) -> int:
    """Microseconds since the epoch of a timestamp (naive: as UTC; aware: its instant) or its PostgreSQL text."""
    if type(v) is datetime:
        days = v.toordinal() - EPOCH_ORDINAL
        us = days * US_PER_DAY + (v.hour * 3600 + v.minute * 60 + v.second) * 1_000_000 + v.microsecond
        off = v.utcoffset()
        return us - (off // timedelta(microseconds=1) if off else 0)
    if v == "infinity":
        return TS_POS_INFINITY_US
    if v == "-infinity":
        return TS_NEG_INFINITY_US
    m = _PG_TS.fullmatch(str(v))
    if m is None:
        raise ValueError(f"not a PostgreSQL timestamp: {v!r}")
    y = int(m.group(1))
    days = days_from_civil(1 - y if m.group(9) else y, int(m.group(2)), int(m.group(3)))
    frac = m.group(7) or ""
    us = int((frac[1:] + "000000")[:6]) if frac else 0
    secs = int(m.group(4)) * 3600 + int(m.group(5)) * 60 + int(m.group(6)) - _offset_seconds(m.group(8))
    return days * US_PER_DAY + secs * 1_000_000 + us


def _java_year(y: int) -> str:
    if y > 9999:
        return "+" + str(y)
    if y < 0:
        return "-%04d" % -y  # noqa: UP031
    return "%04d" % y  # noqa: UP031


def _java_fraction(us: int, width: int) -> str:
    if width > 0:
        return "." + ("%06d" % us + "000")[:width]  # noqa: UP031
    return "." + ("%06d" % us).rstrip("0") if us else ""  # noqa: UP031


def zoned_timestamp(v: Any, width: int) -> str:
    """``io.debezium.time.ZonedTimestamp`` text of a timestamptz (UTC, ``Z``; ``width`` fraction digits, 0: as many
    as needed)."""
    if type(v) is datetime and v.tzinfo is not None and not v.utcoffset():
        return "%04d-%02d-%02dT%02d:%02d:%02d%sZ" % (  # noqa: UP031
            v.year, v.month, v.day, v.hour, v.minute, v.second, _java_fraction(v.microsecond, width))
    if v in ("infinity", "-infinity"):
        return str(v)
    us = pg_timestamp_micros(v)
    days, rem = divmod(us, US_PER_DAY)
    y, mo, d = civil_from_days(days)
    secs, micro = divmod(rem, 1_000_000)
    return "%s-%02d-%02dT%02d:%02d:%02d%sZ" % (  # noqa: UP031
        _java_year(y), mo, d, secs // 3600, secs // 60 % 60, secs % 60, _java_fraction(micro, width))


def zoned_time(v: Any) -> str:
    """``io.debezium.time.ZonedTime`` text of a timetz (PostgreSQL's text) in UTC."""
    m = _PG_TIMETZ.fullmatch(str(v))
    if m is None:
        raise ValueError(f"not a PostgreSQL timetz: {v!r}")
    frac = m.group(4) or ""
    us = int((frac[1:] + "000000")[:6]) if frac else 0
    off = (int(m.group(6)) * 3600 + int(m.group(7) or 0) * 60 + int(m.group(8) or 0)) * (-1 if m.group(5) == "-" else 1)
    secs = (int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) - off) % 86400
    return "%02d:%02d:%02d%sZ" % (secs // 3600, secs // 60 % 60, secs % 60, _java_fraction(us, 0))  # noqa: UP031


def _interval_parts(v: Any) -> tuple[int, int, int, int, int, float]:
    """pgjdbc's PGInterval fields of PostgreSQL's interval text (IntervalStyle postgres)."""
    years = months = days = hours = minutes = 0
    seconds = 0.0
    text = str(v)
    pos = 0
    for m in _PG_INTERVAL.finditer(text):
        if text[pos:m.start()].strip():
            break
        pos = m.end()
        if m.group(1) is not None:
            n, unit = int(m.group(1)), m.group(2)
            if unit.startswith("year"):
                years = n
            elif unit.startswith("mon"):
                months = n
            else:
                days = n
        else:
            sign = -1 if m.group(3) == "-" else 1
            hours, minutes, seconds = sign * int(m.group(4)), sign * int(m.group(5)), sign * float(m.group(6))
    if text[pos:].strip() or pos == 0:
        raise ValueError(f"not a PostgreSQL interval (IntervalStyle postgres): {v!r}")
    return years, months, days, hours, minutes, seconds


def micro_duration(v: Any) -> int:
    """``io.debezium.time.MicroDuration``: Debezium's approximate microseconds of an interval."""
    y, mo, d, h, mi, s = _interval_parts(v)
    n_days = ((y * 12) + mo) * DAYS_PER_MONTH_AVG + d
    n_seconds = (((n_days * 24 + h) * 60) + mi) * 60 + s
    return int(n_seconds * 1e6)


def iso_interval(v: Any) -> str:
    """``io.debezium.time.Interval``: ``P<y>Y<m>M<d>DT<h>H<m>M<s>S`` of an interval (exact)."""
    y, mo, d, h, mi, s = _interval_parts(v)
    sec = Decimal(repr(s)).normalize()
    sec_text = format(sec, "f") if sec else "0"
    return f"P{y}Y{mo}M{d}DT{h}H{mi}M{sec_text}S"


def unscaled_bytes(n: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: minimal two's complement, big-endian."""
    length = (n.bit_length() if n >= 0 else (~n).bit_length()) // 8 + 1
    return n.to_bytes(length, "big", signed=True)


def _b64(b: bytes) -> str:
    return '"' + base64.b64encode(b).decode("ascii") + '"'


# ---- per-column schema and value conversion ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DbzColumn:
    """One column as Debezium writes it: its Connect schema (without ``field``), ``to_json(value)`` (a non-NULL,
    available value -> JSON text) and the JSON of the unavailable-value placeholder (None: the type has none)."""

    name: str
    schema: dict[str, Any]
    to_json: Callable[[Any], str]
    placeholder: str | None


def _named(kind: str, name: str, optional: bool, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": kind, "optional": optional, "name": name, "version": 1}
    d.update(extra)
    return d


def _time_precision(col: ColumnSchema) -> int:
    tm = col.type_modifier
    return tm if tm >= 0 else 6


def _float_json(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return '"' + X.positional_float(v) + '"'
    return X.java_double(v)


def _scalar(col: ColumnSchema, cfg: EncoderConfig, optional: bool) -> tuple[dict[str, Any], Callable[[Any], str]]:
    """Schema and converter of one scalar value of ``col``'s base type (an array's element for array columns)."""
    base = col.base_type
    if base == "int2":
        return {"type": "int16", "optional": optional}, str
    if base == "int4":
        return {"type": "int32", "optional": optional}, str
    if base in ("int8", "oid", "xid", "cid", "xid8"):
        def int64(v: Any) -> str:
            if not -(1 << 63) <= v < (1 << 63):
                raise EncodeError(f"column {col.name!r}: {v} does not fit Debezium's int64")
            return str(v)
        return {"type": "int64", "optional": optional}, int64
    if base == "float4":
        return {"type": "float", "optional": optional}, _float_json
    if base == "float8":
        return {"type": "double", "optional": optional}, _float_json
    if base == "bool":
        return {"type": "boolean", "optional": optional}, lambda v: "true" if v else "false"
    if base == "numeric":
        mode = cfg.decimal_handling_mode
        if mode == "string":
            return {"type": "string", "optional": optional}, lambda v: X.json_string(X.decimal_text(v))
        if mode == "double":
            return {"type": "double", "optional": optional}, lambda v: _float_json(float(v))
        ps = T.numeric_precision_scale(col)

        def finite(v: Decimal) -> Decimal:
            if not v.is_finite():
                raise EncodeError(f"column {col.name!r}: {X.decimal_text(v)} has no Debezium Decimal; set "
                                  "decimal-handling-mode=string (or double) to write it")
            return v

        if ps is None:
            schema = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "scale"},
                                                   {"type": "bytes", "optional": False, "field": "value"}],
                      "optional": optional, "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
                      "doc": "Variable scaled decimal"}

            def vsd(v: Decimal) -> str:
                t = finite(v).as_tuple()
                digits = int("".join(map(str, t.digits)) or "0")
                exp = int(t.exponent)
                unscaled, scale = (digits * 10 ** exp, 0) if exp > 0 else (digits, -exp)
                return '{"scale":' + str(scale) + ',"value":' + _b64(unscaled_bytes(-unscaled if t.sign else unscaled)) + "}"

            return schema, vsd
        precision, scale = ps

        def dec(v: Decimal) -> str:
            t = finite(v).as_tuple()
            digits = int("".join(map(str, t.digits)) or "0")
            shift = int(t.exponent) + scale  # no context arithmetic: exact for any number of digits
            if shift >= 0:
                unscaled = digits * 10**shift
            elif digits % 10**-shift == 0:
                unscaled = digits // 10**-shift
            else:
                raise EncodeError(f"column {col.name!r}: {v} has more than {scale} fraction digits")
            return _b64(unscaled_bytes(-unscaled if t.sign else unscaled))

        return _named("bytes", "org.apache.kafka.connect.data.Decimal", optional,
                      parameters={"scale": str(scale), "connect.decimal.precision": str(precision)}), dec
    if base == "bytea":
        mode = cfg.binary_handling_mode
        if mode == "bytes":
            return {"type": "bytes", "optional": optional}, lambda v: _b64(bytes(v))
        if mode == "base64":
            return {"type": "string", "optional": optional}, lambda v: _b64(bytes(v))
        if mode == "base64-url-safe":
            return {"type": "string", "optional": optional}, \
                lambda v: '"' + base64.urlsafe_b64encode(bytes(v)).decode("ascii") + '"'
        return {"type": "string", "optional": optional}, lambda v: '"' + bytes(v).hex() + '"'
    if base == "date":
        return _named("int32", "io.debezium.time.Date", optional), lambda v: str(pg_date_days(v))
    if base == "time":
        def time_us(v: Any) -> int:
            if type(v) is time:
                return (v.hour * 3600 + v.minute * 60 + v.second) * 1_000_000 + v.microsecond
            if str(v).startswith("24:00:00"):
                return US_PER_DAY
            raise ValueError(f"not a time: {v!r}")
        if _time_precision(col) <= 3:
            return _named("int32", "io.debezium.time.Time", optional), lambda v: str(time_us(v) // 1000)
        return _named("int64", "io.debezium.time.MicroTime", optional), lambda v: str(time_us(v))
    if base == "timestamp":
        if _time_precision(col) <= 3:
            return _named("int64", "io.debezium.time.Timestamp", optional), \
                lambda v: str(pg_timestamp_micros(v) // 1000)
        return _named("int64", "io.debezium.time.MicroTimestamp", optional), lambda v: str(pg_timestamp_micros(v))
    if base == "timestamptz":
        width = col.type_modifier if col.type_modifier >= 0 else 6
        return _named("string", "io.debezium.time.ZonedTimestamp", optional), \
            lambda v: '"' + zoned_timestamp(v, width) + '"'
    if base == "timetz":
        return _named("string", "io.debezium.time.ZonedTime", optional), lambda v: '"' + zoned_time(v) + '"'
    if base == "interval":
        if cfg.interval_handling_mode == "string":
            return _named("string", "io.debezium.time.Interval", optional), lambda v: '"' + iso_interval(v) + '"'
        return _named("int64", "io.debezium.time.MicroDuration", optional), lambda v: str(micro_duration(v))
    if base == "uuid":
        return _named("string", "io.debezium.data.Uuid", optional), lambda v: '"' + str(v) + '"'
    if base in ("json", "jsonb"):
        return _named("string", "io.debezium.data.Json", optional), lambda v: X.json_string(str(v))
    if base == "xml":
        return _named("string", "io.debezium.data.Xml", optional), lambda v: X.json_string(str(v))
    return {"type": "string", "optional": optional}, lambda v: X.json_string(str(v))


def _string_placeholder(cfg: EncoderConfig) -> str:
    return X.json_string(cfg.unavailable_value_placeholder)


def column(col: ColumnSchema, cfg: EncoderConfig, optional: bool) -> DbzColumn:
    """``col`` as Debezium writes it (schema ``optional`` as given: see ``sinks.codec.debezium``)."""
    ph_bytes = cfg.unavailable_value_placeholder.encode()
    if not col.is_array:
        schema, conv = _scalar(col, cfg, optional)
        t = schema["type"]
        placeholder = (_string_placeholder(cfg) if t == "string"
                       else _b64(ph_bytes) if t == "bytes" and "name" not in schema else None)
        return DbzColumn(col.name, schema, conv, placeholder)
    elem_schema, elem = _scalar(col, cfg, True)
    schema = {"type": "array", "items": elem_schema, "optional": optional}

    def conv_array(v: Any) -> str:
        if type(v) is not list or any(type(x) is list for x in v):
            raise EncodeError(f"column {col.name!r}: the array {str(v)[:60]!r} has more than one dimension or "
                              "bounds other than 1; Debezium writes one-dimensional arrays only")
        return "[" + ",".join("null" if x is None else elem(x) for x in v) + "]"

    et = elem_schema["type"]
    if et == "string":
        placeholder: str | None = "[" + _string_placeholder(cfg) + "]"
    elif et in ("int16", "int32", "int64") and "name" not in elem_schema:
        placeholder = "[" + ",".join(str(b if b < 128 else b - 256) for b in ph_bytes) + "]"
    elif et == "bytes" and "name" not in elem_schema:
        placeholder = "[" + _b64(ph_bytes) + "]"
    else:
        placeholder = None
    if col.base_type == "uuid":
        placeholder = '["' + str(uuid.UUID(bytes=hashlib.md5(ph_bytes).digest(), version=3)) + '"]'  # noqa: S324
    return DbzColumn(col.name, schema, conv_array, placeholder)


# ---- decoding ----------------------------------------------------------------------------------------------
def _date_value(days: int) -> Any:
    if days == DATE_POS_INFINITY:
        return "infinity"
    if days == DATE_NEG_INFINITY:
        return "-infinity"
    y, m, d = civil_from_days(days)
    if 1 <= y <= 9999:
        return date(y, m, d)
    return f"{1 - y:04d}-{m:02d}-{d:02d} BC" if y < 1 else f"{y}-{m:02d}-{d:02d}"


def _timestamp_value(us: int, aware: bool) -> Any:
    if us == TS_POS_INFINITY_US:
        return "infinity"
    if us == TS_NEG_INFINITY_US:
        return "-infinity"
    days, rem = divmod(us, US_PER_DAY)
    y, m, d = civil_from_days(days)
    secs, micro = divmod(rem, 1_000_000)
    if 1 <= y <= 9999:
        return datetime(y, m, d, secs // 3600, secs // 60 % 60, secs % 60, micro, UTC if aware else None)
    frac = ("." + ("%06d" % micro).rstrip("0")) if micro else ""  # noqa: UP031
    text = f"{abs(1 - y) if y < 1 else y:04d}-{m:02d}-{d:02d} {secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}{frac}"
    return text + ("+00" if aware else "") + (" BC" if y < 1 else "")


def _unscaled(b64: str) -> int:
    return int.from_bytes(X.parse_b64(b64), "big", signed=True)


def decimal_of(unscaled: int, scale: int) -> Decimal:
    """``unscaled * 10**-scale`` exactly (Decimal arithmetic would round to the context's 28 digits)."""
    t = Decimal(unscaled).as_tuple()
    return Decimal((t.sign, t.digits, -scale))


def _array_placeholder(items: dict[str, Any], placeholder: str) -> list[Any] | None:
    """The JSON of an unavailable array value with elements ``items`` (see :func:`column`), None when there is none."""
    raw = placeholder.encode()
    t, name = items.get("type"), items.get("name")
    if name == "io.debezium.data.Uuid":
        return [str(uuid.UUID(bytes=hashlib.md5(raw).digest(), version=3))]  # noqa: S324
    if t == "string":
        return [placeholder]
    if t in ("int16", "int32", "int64") and name is None:
        return [b if b < 128 else b - 256 for b in raw]
    if t == "bytes" and name is None:
        return [base64.b64encode(raw).decode("ascii")]
    return None


def _time_value(us: int) -> Any:
    if us >= US_PER_DAY:
        return "24:00:00"
    return time(us // 3_600_000_000, us // 60_000_000 % 60, us // 1_000_000 % 60, us % 1_000_000)


def decode_value(schema: dict[str, Any], v: Any, col: ColumnSchema | None, cfg: EncoderConfig) -> Any:
    """A JSON value of a field back to Python, typed by the field's Connect schema (and by ``col``, the upstream
    column, when known: uuids, string-mode numerics and bytea, out-of-range dates). Lossy where the encoding is
    (docs/sinks.md); the unavailable-value placeholder comes back as ``UNCHANGED``."""
    if v is None:
        return None
    placeholder = cfg.unavailable_value_placeholder
    t, name = schema.get("type"), schema.get("name")
    if t == "array":
        items = schema.get("items") or {}
        if isinstance(v, list) and v == _array_placeholder(items, placeholder):
            return UNCHANGED
        elem_col = None if col is None else ColumnSchema(col.name, col.type_oid, col.base_type, False, col.type_name,
                                                         col.type_modifier)
        return [decode_value(items, x, elem_col, cfg) for x in v]
    if t == "string":
        if v == placeholder:
            return UNCHANGED
        if name == "io.debezium.time.ZonedTimestamp":
            if v in ("infinity", "-infinity"):
                return v
            try:
                return datetime.fromisoformat(v)
            except ValueError:
                return v
        if name == "io.debezium.data.Uuid" or (col is not None and col.base_type == "uuid"):
            return uuid.UUID(v)
        if col is not None and col.base_type == "numeric":
            return Decimal(v)
        if col is not None and col.base_type == "bytea":
            mode = cfg.binary_handling_mode
            if mode == "hex":
                return bytes.fromhex(v)
            return base64.b64decode(v, altchars=b"-_" if mode == "base64-url-safe" else None, validate=True)
        return v
    if t == "bytes":
        if name == "org.apache.kafka.connect.data.Decimal":
            return decimal_of(_unscaled(v), int(schema["parameters"]["scale"]))
        raw = X.parse_b64(v)
        return UNCHANGED if raw == placeholder.encode() else raw
    if t == "struct" and name == "io.debezium.data.VariableScaleDecimal":
        return decimal_of(_unscaled(v["value"]), int(v["scale"]))
    if t in ("float", "double"):
        f = float(v)
        if col is not None and col.base_type == "numeric":
            return Decimal(repr(f))
        return f
    if t == "boolean":
        return bool(v)
    if name == "io.debezium.time.Date":
        return _date_value(int(v))
    if name == "io.debezium.time.MicroTime":
        return _time_value(int(v))
    if name == "io.debezium.time.Time":
        return _time_value(int(v) * 1000)
    if name == "io.debezium.time.MicroTimestamp":
        return _timestamp_value(int(v), False)
    if name == "io.debezium.time.Timestamp":
        return _timestamp_value(int(v) * 1000, False)
    return v
