"""PostgreSQL text-format values -> Python values.

pgoutput sends every column in the type's *text output* form (we never request ``binary``). This
module turns that text into Python values, one parser function per type, built once:

=========================================  ==========================================================
base type                                  Python value
=========================================  ==========================================================
int2, int4, int8, oid, xid, xid8, cid      ``int``
numeric                                    ``decimal.Decimal`` (incl. ``NaN``, ``Infinity``,
                                           ``-Infinity``; the scale is kept: ``1.50`` stays ``1.50``)
float4, float8                             ``float`` (incl. ``nan``, ``inf``, ``-inf``)
bool                                       ``bool``
text, varchar, bpchar, char, name          ``str`` as sent (bpchar keeps its blank padding)
bytea                                      ``bytes`` (hex format ``\\x..``, also the escape format)
date                                       ``datetime.date``
time                                       ``datetime.time`` (``24:00:00`` stays ``str``)
timestamp                                  naive ``datetime.datetime``
timestamptz                                aware ``datetime.datetime`` normalised to UTC
uuid                                       ``uuid.UUID``
timetz, interval, json, jsonb, money, ...  ``str`` as sent
any other type (enums, geometric, ...)     ``str`` as sent
=========================================  ==========================================================

Dates and timestamps that Python cannot represent stay ``str`` exactly as sent: ``infinity``,
``-infinity``, BC years (``0044-03-15 BC``) and years above 9999. A timestamptz whose UTC
normalisation would leave Python's range (year 1 or 9999 near the edge) keeps its original offset.
The date/time parsers expect ``DateStyle = ISO`` (PostgreSQL's default); any other style raises.

Arrays (``is_array``) are parsed from ``array_out``'s literal: ``{1,2,NULL,"a b","x\\"y"}``.
Quoted elements are unescaped, an unquoted ``NULL`` is SQL NULL (``None``) while ``"NULL"`` is the
string, ``{}`` is ``[]``, and a multi-dimensional array becomes nested lists. ``box`` arrays use
PostgreSQL's ``;`` delimiter. An array with a bounds decoration (``[0:2]={1,2,3}``,
``[0:1][2:3]={{1,2},{3,4}}``: ``array_out`` writes one exactly when some lower bound is not 1, and
pgoutput sends that text) stays ``str`` exactly as sent, after its elements were checked: a list
cannot carry the bounds, and dropping them would change the value (``a[1]`` is another element).
Sinks store that text where the target has arrays, and refuse it where it has not.

Guarantees: every function here is pure and thread-safe; the parser caches only ever grow with
immutable functions. Parsers returned by :func:`parser_for` raise ``ValueError`` (``numeric``:
``decimal.InvalidOperation``, an ``ArithmeticError``) on malformed text; :func:`parse_value` wraps
either in :class:`cdc.errors.DecodeError`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from cdc.errors import DecodeError

Parser = Callable[[str], Any]

# (element type OID, array type OID, base type name), from PostgreSQL's src/include/catalog/pg_type.dat.
_OIDS: tuple[tuple[int, int, str], ...] = (
    (16, 1000, "bool"),
    (17, 1001, "bytea"),
    (18, 1002, "char"),
    (19, 1003, "name"),
    (20, 1016, "int8"),
    (21, 1005, "int2"),
    (23, 1007, "int4"),
    (24, 1008, "regproc"),
    (25, 1009, "text"),
    (26, 1028, "oid"),
    (27, 1010, "tid"),
    (28, 1011, "xid"),
    (29, 1012, "cid"),
    (114, 199, "json"),
    (142, 143, "xml"),
    (5069, 271, "xid8"),
    (600, 1017, "point"),
    (601, 1018, "lseg"),
    (602, 1019, "path"),
    (603, 1020, "box"),
    (604, 1027, "polygon"),
    (628, 629, "line"),
    (700, 1021, "float4"),
    (701, 1022, "float8"),
    (718, 719, "circle"),
    (790, 791, "money"),
    (829, 1040, "macaddr"),
    (774, 775, "macaddr8"),
    (869, 1041, "inet"),
    (650, 651, "cidr"),
    (1042, 1014, "bpchar"),
    (1043, 1015, "varchar"),
    (1082, 1182, "date"),
    (1083, 1183, "time"),
    (1114, 1115, "timestamp"),
    (1184, 1185, "timestamptz"),
    (1186, 1187, "interval"),
    (1266, 1270, "timetz"),
    (1560, 1561, "bit"),
    (1562, 1563, "varbit"),
    (1700, 1231, "numeric"),
    (2205, 2210, "regclass"),
    (2206, 2211, "regtype"),
    (2950, 2951, "uuid"),
    (3220, 3221, "pg_lsn"),
    (3614, 3643, "tsvector"),
    (3615, 3645, "tsquery"),
    (3802, 3807, "jsonb"),
    (4072, 4073, "jsonpath"),
    (3904, 3905, "int4range"),
    (3906, 3907, "numrange"),
    (3908, 3909, "tsrange"),
    (3910, 3911, "tstzrange"),
    (3912, 3913, "daterange"),
    (3926, 3927, "int8range"),
)

BUILTIN_TYPES: dict[int, tuple[str, bool]] = {}
"""Builtin type OID -> (base type name, is_array). User types (enums, domains...) are not here."""
for _elem_oid, _array_oid, _name in _OIDS:
    BUILTIN_TYPES[_elem_oid] = (_name, False)
    BUILTIN_TYPES[_array_oid] = (_name, True)
del _elem_oid, _array_oid, _name

# Types whose array_out uses a delimiter other than ','.
_ARRAY_DELIMITERS: dict[str, str] = {"box": ";"}


# ---- scalar parsers -----------------------------------------------------------------------------------
def _text(text: str) -> str:
    return text


def _bool(text: str) -> bool:
    if text == "t":
        return True
    if text == "f":
        return False
    raise ValueError(f"invalid bool text {text!r}")


_BYTEA_ESCAPE = re.compile(rb"\\(\\|[0-3][0-7]{2})")


def _bytea_escape_sub(m: re.Match[bytes]) -> bytes:
    g = m.group(1)
    return b"\\" if g == b"\\" else bytes((int(g, 8),))


def _bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    # bytea_output = escape: printable ASCII as is, '\\' for a backslash, '\ooo' for other bytes.
    raw = text.encode("latin-1")
    if b"\\" not in raw:
        return raw
    out = _BYTEA_ESCAPE.sub(_bytea_escape_sub, raw)
    if b"\\" in _BYTEA_ESCAPE.sub(b"", raw):
        raise ValueError(f"invalid bytea escape text {text[:40]!r}")
    return out


_BIG_YEAR = re.compile(r"-?\d{5,}-")


def _unrepresentable(text: str) -> bool:
    """True for date/time text Python cannot hold and that is kept as str (see module docstring)."""
    return text in ("infinity", "-infinity") or text.endswith(" BC") or _BIG_YEAR.match(text) is not None


def _date(text: str) -> date | str:
    try:
        return date.fromisoformat(text)
    except ValueError:
        if _unrepresentable(text):
            return text
        raise ValueError(f"invalid date text {text!r} (DateStyle must be ISO)") from None


def _time(text: str) -> time | str:
    try:
        return time.fromisoformat(text)
    except ValueError:
        if text.startswith("24:00:00"):
            return text
        raise ValueError(f"invalid time text {text!r}") from None


def _timestamp(text: str) -> datetime | str:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        if _unrepresentable(text):
            return text
        raise ValueError(f"invalid timestamp text {text!r} (DateStyle must be ISO)") from None
    if value.tzinfo is not None:
        raise ValueError(f"timestamp text {text!r} carries a time zone")
    return value


def _timestamptz(text: str) -> datetime | str:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        if _unrepresentable(text):
            return text
        raise ValueError(f"invalid timestamptz text {text!r} (DateStyle must be ISO)") from None
    tz = value.tzinfo
    if tz is UTC:
        return value
    if tz is None:
        raise ValueError(f"timestamptz text {text!r} has no UTC offset")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return value  # the UTC instant is outside Python's range: keep the original offset


def _uuid(text: str) -> uuid.UUID:
    return uuid.UUID(text)


_SCALAR_PARSERS: dict[str, Parser] = {
    "int2": int,
    "int4": int,
    "int8": int,
    "oid": int,
    "xid": int,
    "xid8": int,
    "cid": int,
    "numeric": Decimal,
    "float4": float,
    "float8": float,
    "bool": _bool,
    "text": _text,
    "varchar": _text,
    "bpchar": _text,
    "char": _text,
    "name": _text,
    "bytea": _bytea,
    "date": _date,
    "time": _time,
    "timestamp": _timestamp,
    "timestamptz": _timestamptz,
    "uuid": _uuid,
}


# ---- arrays -------------------------------------------------------------------------------------------
_UNESCAPE = re.compile(r"\\(.)", re.S)
_BOUNDS = re.compile(r"(?:\[-?\d+:-?\d+\])+")
_NOT_SIMPLE = re.compile(r'[{}"\\\s]')


def _array_token_re(delim: str) -> re.Pattern[str]:
    d = re.escape(delim)
    return re.compile(
        r'"((?:[^"\\]|\\.)*)"'  # 1: quoted element
        r"|(\{)"  # 2: open
        r"|(\})"  # 3: close
        rf"|({d})"  # 4: delimiter
        r"|(\s+)"  # 5: blanks between tokens
        rf'|((?:[^{{}}"\\\s{d}]|\\.)(?:(?:[^{{}}"\\{d}]|\\.)*(?:[^{{}}"\\\s{d}]|\\.))?)'  # 6: unquoted
        r"|(.)",  # 7: anything else is an error
        re.S,
    )


def _make_array_parser(elem: Parser, delim: str) -> Parser:
    token_re = _array_token_re(delim)

    def parse_array(text: str) -> list[Any] | str:
        if text[:1] == "[":  # bounds decoration, e.g. '[0:1]={1,2}': a lower bound other than 1
            eq = text.find("=")
            if eq < 0 or not _BOUNDS.fullmatch(text, 0, eq):
                raise ValueError(f"invalid array text {text[:40]!r}")
            _parse_array_slow(text[eq + 1 :], elem, token_re)  # validates the elements
            return text  # a list cannot carry the bounds: the text as sent, see the module doc
        # Fast path: one dimension, nothing quoted, escaped or blank (array_out quotes those).
        if text[:1] == "{" and text[-1:] == "}":
            body = text[1:-1]
            if not body:
                return []
            if not _NOT_SIMPLE.search(body):
                parts = body.split(delim)
                if "" not in parts:
                    return [None if s == "NULL" else elem(s) for s in parts]
        return _parse_array_slow(text, elem, token_re)

    return parse_array


def _parse_array_slow(text: str, elem: Parser, token_re: re.Pattern[str]) -> list[Any]:
    root: list[Any] | None = None
    stack: list[list[Any]] = []
    need_item = False  # just after a delimiter: an element or sub-array must follow
    have_item = False  # the current level just received an element or sub-array
    for m in token_re.finditer(text):
        kind = m.lastindex
        if kind == 5:
            continue
        if root is not None and not stack:
            raise ValueError(f"junk after array text {text[:40]!r}")
        if kind == 1 or kind == 6:
            if not stack or have_item:
                raise ValueError(f"misplaced element in array text {text[:40]!r}")
            if stack[-1] and type(stack[-1][0]) is list:
                raise ValueError(f"element beside a sub-array in array text {text[:40]!r}")
            if kind == 1:
                raw = m.group(1)
                stack[-1].append(elem(_UNESCAPE.sub(r"\1", raw) if "\\" in raw else raw))
            else:
                raw = m.group(6)
                if raw == "NULL":
                    stack[-1].append(None)
                else:
                    stack[-1].append(elem(_UNESCAPE.sub(r"\1", raw) if "\\" in raw else raw))
            need_item, have_item = False, True
        elif kind == 2:
            if have_item:
                raise ValueError(f"misplaced '{{' in array text {text[:40]!r}")
            sub: list[Any] = []
            if stack:
                if stack[-1] and type(stack[-1][0]) is not list:
                    raise ValueError(f"sub-array beside an element in array text {text[:40]!r}")
                stack[-1].append(sub)
            else:
                root = sub
            stack.append(sub)
            need_item, have_item = False, False
        elif kind == 3:
            if not stack or need_item:
                raise ValueError(f"misplaced '}}' in array text {text[:40]!r}")
            stack.pop()
            need_item, have_item = False, True
        elif kind == 4:
            if not stack or not have_item:
                raise ValueError(f"misplaced delimiter in array text {text[:40]!r}")
            need_item, have_item = True, False
        else:
            raise ValueError(f"invalid array text {text[:40]!r}")
    if root is None or stack:
        raise ValueError(f"unterminated array text {text[:40]!r}")
    return root


# ---- public API ---------------------------------------------------------------------------------------
_ARRAY_PARSERS: dict[str, Parser] = {}


def parser_for(base_type: str, is_array: bool) -> Parser:
    """The function that turns one non-NULL text value of this type into its Python value.

    Unknown base types parse to ``str`` as sent. The returned function is pure, thread-safe, and
    raises ``ValueError`` (``decimal.InvalidOperation`` for numeric) on malformed text. Calls with
    the same arguments return the same function.
    """
    scalar = _SCALAR_PARSERS.get(base_type, _text)
    if not is_array:
        return scalar
    parser = _ARRAY_PARSERS.get(base_type)
    if parser is None:
        parser = _make_array_parser(scalar, _ARRAY_DELIMITERS.get(base_type, ","))
        parser = _ARRAY_PARSERS.setdefault(base_type, parser)
    return parser


def row_parser(parsers: tuple[Parser, ...]) -> Callable[[Sequence[str | None]], tuple[Any, ...]]:
    """One function parsing a whole tuple of text values (``None`` = NULL stays ``None``) with ``parsers``.

    ``row_parser(ps)(texts) == tuple(None if t is None else p(t) for p, t in zip(ps, texts))`` for any
    ``texts`` of ``len(ps)`` str-or-None values (same exceptions, raised by the first failing column in
    order). Generated once per tuple of parsers from column indices only: text columns are taken as they
    are (no call of the identity parser) and the others call their parser directly, so parsing a row costs
    one Python call instead of one per column. Pure and thread-safe.
    """
    namespace: dict[str, Any] = {}
    parts = []
    for i, p in enumerate(parsers):
        if p is _text:
            parts.append(f"v[{i}]")
        else:
            namespace[f"p{i}"] = p
            parts.append(f"(None if v[{i}] is None else p{i}(v[{i}]))")
    if not parts:
        return lambda v: ()
    fn: Callable[[Sequence[str | None]], tuple[Any, ...]] = eval(  # indices only, no data
        "lambda v: (" + ", ".join(parts) + ",)", namespace)
    return fn


def parse_value(base_type: str, is_array: bool, text: str | None) -> Any:
    """Parse one text-format value (``None`` is SQL NULL and stays ``None``).

    Convenience wrapper over :func:`parser_for`; raises :class:`DecodeError` on malformed text.
    """
    if text is None:
        return None
    try:
        return parser_for(base_type, is_array)(text)
    except (ValueError, ArithmeticError) as e:
        kind = f"{base_type}[]" if is_array else base_type
        raise DecodeError(f"cannot parse {kind} value {text[:60]!r}: {e}", cause=e) from e
