"""Value rendering shared by the codecs: PostgreSQL values (the mounter's Python values) as text, JSON and numbers
in the exact spelling the anchored implementations use, and the inverse parsers for the decoders.

The mounter's values (``upstream.postgres.types``): ``int``, ``Decimal`` (also ``NaN``/``Infinity``), ``float``,
``bool``, ``str``, ``bytes``, ``date``, ``time``, naive ``datetime`` (timestamp), aware ``datetime`` in UTC
(timestamptz), ``UUID``, lists (arrays), and ``str`` exactly as PostgreSQL sent it for everything else and for the
dates and times Python cannot hold (``infinity``, BC, years above 9999, ``24:00:00``, bounds-decorated arrays).

Text forms (canal-json values, CSV fields, open-protocol string values), by value kind (``sinks.codec.types``):

- numbers: decimal digits; numeric: PostgreSQL's exact text (``1.50``, ``NaN``, ``Infinity``), never an exponent;
  floats: the shortest digits that read back to the same float (spelled per protocol, see the ``*_float``
  functions), ``NaN`` / ``Infinity`` / ``-Infinity`` (PostgreSQL's and Java's spelling) for the specials;
- bool: ``1`` / ``0`` (TiCDC writes a MySQL BOOLEAN, a TINYINT(1), so);
- date ``YYYY-MM-DD``; time ``HH:MM:SS.ffffff``, timestamp ``YYYY-MM-DD HH:MM:SS.ffffff`` with as many fraction
  digits as the column's precision (6 when undeclared; none for precision 0), as TiDB writes a DATETIME(fsp);
  timestamptz: the same in UTC without an offset (TiCDC writes TIMESTAMP columns in the changefeed's time zone,
  here UTC); values Python cannot hold keep PostgreSQL's text (``infinity``, ``0044-03-15 BC``);
- uuid: canonical text; json/jsonb, interval, timetz, money, enums and other types: PostgreSQL's text as sent;
- arrays: a JSON array (numbers as numbers, numeric as exact strings, floats' specials as strings, bytea as
  ``\\x`` hex, dates and times in the forms above, nested lists for more dimensions); an array PostgreSQL sent with
  a bounds decoration (``[0:2]={1,2,3}``) keeps that text, which is not JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any

from sinks.codec import types as T

json_string: Callable[[str], str] = encode_basestring
"""``s`` as a JSON string literal, non-ASCII characters as they are (like Go's and Jackson's encoders)."""

json_dumps: Callable[[Any], str] = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False,
                                                   allow_nan=False).encode
"""Compact JSON (no blanks), non-ASCII as is; NaN/Infinity refused (the codecs spell them explicitly)."""

_GO_HTML = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def go_html_escape(doc: str) -> str:
    """A JSON document with ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as Go's encoders (encoding/json, easyjson,
    go-json) escape them inside strings; the characters cannot occur outside strings, so the whole document is
    translated at once."""
    if "<" in doc or ">" in doc or "&" in doc or "\u2028" in doc or "\u2029" in doc:
        return doc.translate(_GO_HTML)
    return doc


# ---- floats ------------------------------------------------------------------------------------------------
def _shortest(v: float) -> tuple[str, int]:
    """Shortest round-trip digits of ``|v|`` (no leading/trailing zeros) and the decimal point position ``dp``:
    ``|v| = 0.<digits> * 10**dp``. ``v`` is finite and non-zero."""
    mant, _, e = repr(abs(v)).partition("e")
    intpart, _, frac = mant.partition(".")
    s = intpart + frac
    stripped = s.lstrip("0")
    dp = len(intpart) - (len(s) - len(stripped)) + (int(e) if e else 0)
    return stripped.rstrip("0"), dp


def _positional(digits: str, dp: int) -> str:
    if dp <= 0:
        return "0." + "0" * -dp + digits
    if dp >= len(digits):
        return digits + "0" * (dp - len(digits))
    return digits[:dp] + "." + digits[dp:]


def _special(v: float) -> str | None:
    if v != v:
        return "NaN"
    if v == math.inf:
        return "Infinity"
    if v == -math.inf:
        return "-Infinity"
    return None


def _sign(v: float) -> str:
    return "-" if math.copysign(1.0, v) < 0 else ""


def positional_float(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)`` (canal-json): shortest digits, never an exponent."""
    sp = _special(v)
    if sp is not None:
        return sp
    if v == 0:
        return _sign(v) + "0"
    digits, dp = _shortest(v)
    return _sign(v) + _positional(digits, dp)


def _exponent(digits: str, exp: int, java: bool = False) -> str:
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else (".0" if java else ""))
    if java:
        return f"{mant}E{exp}"
    return f"{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def go_json_float(v: float) -> str:
    """A finite float as Go's encoding/json writes a float64 (open-protocol values): positional for
    ``1e-6 <= |v| < 1e21``, else exponent form with at least one exponent digit (``1e+21``, ``1.5e-7``)."""
    if v == 0:
        return _sign(v) + "0"
    digits, dp = _shortest(v)
    a = abs(v)
    if 1e-6 <= a < 1e21:
        return _sign(v) + _positional(digits, dp)
    text = _exponent(digits, dp - 1)
    if text[-4:-1] == "e-0":  # Go cleans e-07 up to e-7
        text = text[:-2] + text[-1]
    return _sign(v) + text


def go_format_g(v: float) -> str:
    """Go's ``%v`` of a float, ``strconv.FormatFloat(v, 'g', -1, 64)`` (TiCDC's CSV): the exponent form when the
    decimal exponent is below -4 or at least 6 (``1e+06``, ``1.5e-05``, but ``123456``); specials as
    :func:`positional_float`."""
    sp = _special(v)
    if sp is not None:
        return sp
    if v == 0:
        return _sign(v) + "0"
    digits, dp = _shortest(v)
    exp = dp - 1
    if exp < -4 or exp >= 6:
        return _sign(v) + _exponent(digits, exp)
    return _sign(v) + _positional(digits, dp)


def java_double(v: float) -> str:
    """A finite float as Java's ``Double.toString`` (Jackson, Debezium): positional with at least one fraction digit
    for ``1e-3 <= |v| < 1e7`` (``100.0``), else ``1.0E7`` / ``1.5E-4``."""
    if v == 0:
        return _sign(v) + "0.0"
    digits, dp = _shortest(v)
    a = abs(v)
    if 1e-3 <= a < 1e7:
        text = _positional(digits, dp)
        if "." not in text:
            text += ".0"
        return _sign(v) + text
    return _sign(v) + _exponent(digits, dp - 1, java=True)


# ---- numbers, bytes ----------------------------------------------------------------------------------------
def decimal_text(v: Decimal) -> str:
    """PostgreSQL's numeric text of a Decimal: fixed point, scale kept (``1.50``), ``NaN``, ``Infinity``."""
    if v.is_finite():
        return format(v, "f")
    if v.is_nan():
        return "NaN"
    return "Infinity" if v > 0 else "-Infinity"


def latin1_text(v: bytes) -> str:
    """Bytes as canal-json writes a BLOB: each byte one character U+0000..U+00FF (ISO-8859-1)."""
    return bytes(v).decode("latin-1")


def b64_text(v: bytes) -> str:
    return base64.b64encode(v).decode("ascii")


def hex_text(v: bytes) -> str:
    return bytes(v).hex()


# ---- dates and times ---------------------------------------------------------------------------------------
def _fraction(us: int, fsp: int) -> str:
    if fsp <= 0:
        if not us:
            return ""
        fsp = 6  # never drop digits a value has (PostgreSQL rounds to the column's precision already)
    digits = "%06d" % us  # noqa: UP031 - fastest
    if fsp < 6 and digits[fsp:].strip("0"):
        fsp = 6
    return "." + digits[:fsp]


def date_text(v: Any) -> str:
    return v.isoformat() if type(v) is date else str(v)


def time_text(v: Any, fsp: int) -> str:
    if type(v) is not time:
        return str(v)
    return "%02d:%02d:%02d" % (v.hour, v.minute, v.second) + _fraction(v.microsecond, fsp)  # noqa: UP031


def datetime_text(v: Any, fsp: int) -> str:
    """A naive datetime (timestamp), or an aware one in UTC written without its offset (timestamptz)."""
    if type(v) is not datetime:
        return str(v)
    tz = v.tzinfo
    if tz is not None and tz is not UTC and v.utcoffset():
        return v.isoformat(sep=" ")  # outside the range where it could be normalised to UTC: keep the offset
    return "%04d-%02d-%02d %02d:%02d:%02d" % (  # noqa: UP031 - fastest
        v.year, v.month, v.day, v.hour, v.minute, v.second) + _fraction(v.microsecond, fsp)


# ---- arrays ------------------------------------------------------------------------------------------------
def _array_element(kind: str, fsp: int) -> Callable[[Any], Any]:
    if kind in (T.K_INT, T.K_BOOL):
        return lambda v: v
    if kind == T.K_FLOAT:
        return lambda v: v if math.isfinite(v) else _special(v)
    if kind == T.K_DECIMAL:
        return decimal_text
    if kind == T.K_BYTES:
        return lambda v: "\\x" + bytes(v).hex()
    if kind == T.K_DATE:
        return date_text
    if kind == T.K_TIME:
        return lambda v: time_text(v, fsp)
    if kind in (T.K_DATETIME, T.K_TIMESTAMPTZ):
        return lambda v: datetime_text(v, fsp)
    return str


def array_renderer(kind: str, fsp: int = 6) -> Callable[[Any], str]:
    """Renders an array value (a list, nested for more dimensions) as compact JSON; a ``str`` (an array PostgreSQL
    sent with bounds) as it is."""
    elem = _array_element(kind, fsp)

    def conv(items: list[Any]) -> list[Any]:
        return [None if x is None else conv(x) if type(x) is list else elem(x) for x in items]

    def render(v: Any) -> str:
        if type(v) is list:
            return json_dumps(conv(v))
        return str(v)

    return render


# ---- text -> value (decoders) ------------------------------------------------------------------------------
def _iso_or_text(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` of an ISO text, or the text as it is when it is not ISO (infinity, a year beyond 9999, BC)."""

    def parse_or_text(t: str) -> Any:
        try:
            return parse(t)
        except ValueError:
            return t

    return parse_or_text


def _timestamptz(t: str) -> datetime:
    d = datetime.fromisoformat(t)
    return d.replace(tzinfo=UTC) if d.tzinfo is None else d


_parse_date = _iso_or_text(date.fromisoformat)
_parse_time = _iso_or_text(time.fromisoformat)
_parse_datetime = _iso_or_text(datetime.fromisoformat)
_parse_timestamptz = _iso_or_text(_timestamptz)


def _parse_bool(t: str) -> bool:
    if t in ("1", "true", "t"):
        return True
    if t in ("0", "false", "f"):
        return False
    raise ValueError(f"not a boolean: {t!r}")


def _element_parser(kind: str) -> Callable[[Any], Any]:
    """An array element's parser: JSON already typed integers and booleans; decimals may come as numbers and byte
    strings in PostgreSQL's hex form; the rest as :func:`text_parser`."""
    if kind == T.K_DECIMAL:
        return lambda v: Decimal(v) if isinstance(v, str) else Decimal(str(v))
    if kind == T.K_BYTES:
        return lambda v: bytes.fromhex(v[2:]) if v.startswith("\\x") else v.encode("latin-1")
    if kind in (T.K_FLOAT, T.K_DATE, T.K_TIME, T.K_DATETIME, T.K_TIMESTAMPTZ, T.K_UUID):
        return text_parser(kind)
    return lambda v: v


def array_parser(kind: str) -> Callable[[str], Any]:
    elem = _element_parser(kind)

    def conv(items: list[Any]) -> list[Any]:
        return [None if x is None else conv(x) if type(x) is list else elem(x) for x in items]

    def parse(t: str) -> Any:
        if t[:1] != "[":
            return t
        try:
            items = json.loads(t)
        except ValueError:
            return t  # bounds-decorated PostgreSQL array text
        return conv(items) if type(items) is list else t

    return parse


def text_parser(kind: str, bytes_parser: Callable[[str], bytes] | None = None) -> Callable[[str], Any]:
    """The inverse of the text forms above for values of ``kind`` (``bytes_parser``: the protocol's byte text)."""
    if kind == T.K_INT:
        return int
    if kind == T.K_BOOL:
        return _parse_bool
    if kind == T.K_DECIMAL:
        return Decimal
    if kind == T.K_FLOAT:
        return float
    if kind == T.K_BYTES:
        return bytes_parser or (lambda t: t.encode("latin-1"))
    if kind == T.K_DATE:
        return _parse_date
    if kind == T.K_TIME:
        return _parse_time
    if kind == T.K_DATETIME:
        return _parse_datetime
    if kind == T.K_TIMESTAMPTZ:
        return _parse_timestamptz
    if kind == T.K_UUID:
        return uuid.UUID
    return lambda t: t


def parse_b64(t: str) -> bytes:
    try:
        return base64.b64decode(t, validate=True)
    except binascii.Error as e:
        raise ValueError(f"invalid base64 {t[:40]!r}") from e
