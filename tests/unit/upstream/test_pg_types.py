"""PostgreSQL text-format value parsing (upstream.postgres.types).

Literal inputs marked "PG 18" were produced by PostgreSQL 18.6's output functions (``SELECT x::text``
with DateStyle ISO), the same functions pgoutput uses for text-format tuples.
"""

from __future__ import annotations

import math
import random
import uuid
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import DecodeError
from tests import rowcodecs
from upstream.postgres.rowcodec import RowCodec
from upstream.postgres.types import BUILTIN_TYPES, parse_value, parser_for

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, params=rowcodecs.NAMES)
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> RowCodec:
    """Every test here runs over both implementations of the per-row functions (tests/rowcodecs.py): with the C one,
    ``parse_value`` parses a one-column row with the codec's row parser (where the C value parsers run)."""
    c = rowcodecs.use(request.param, monkeypatch)

    def parse_value(base_type: str, is_array: bool, text: str | None) -> Any:
        if text is None:
            return None
        parse_row = c.row_parser((parser_for(base_type, is_array),))
        try:
            return parse_row([text])[0]
        except (ValueError, ArithmeticError) as e:  # as types.parse_value says it
            kind = f"{base_type}[]" if is_array else base_type
            raise DecodeError(f"cannot parse {kind} value {text[:60]!r}: {e}", cause=e) from e

    if request.param != "python":
        monkeypatch.setitem(globals(), "parse_value", parse_value)
    return c


# ---- OIDs ---------------------------------------------------------------------------------------------
REQUIRED = {
    "int2": (21, 1005),
    "int4": (23, 1007),
    "int8": (20, 1016),
    "numeric": (1700, 1231),
    "float4": (700, 1021),
    "float8": (701, 1022),
    "bool": (16, 1000),
    "text": (25, 1009),
    "varchar": (1043, 1015),
    "bpchar": (1042, 1014),
    "char": (18, 1002),
    "name": (19, 1003),
    "bytea": (17, 1001),
    "date": (1082, 1182),
    "time": (1083, 1183),
    "timetz": (1266, 1270),
    "timestamp": (1114, 1115),
    "timestamptz": (1184, 1185),
    "interval": (1186, 1187),
    "uuid": (2950, 2951),
    "json": (114, 199),
    "jsonb": (3802, 3807),
    "oid": (26, 1028),
}


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_builtin_oids(name: str) -> None:
    elem, arr = REQUIRED[name]
    assert BUILTIN_TYPES[elem] == (name, False)
    assert BUILTIN_TYPES[arr] == (name, True)


def test_builtin_oids_are_consistent() -> None:
    by_name: dict[tuple[str, bool], int] = {}
    for oid, key in BUILTIN_TYPES.items():
        assert key not in by_name, f"{key} mapped from {by_name.get(key)} and {oid}"
        by_name[key] = oid
    scalars = {name for name, is_array in BUILTIN_TYPES.values() if not is_array}
    arrays = {name for name, is_array in BUILTIN_TYPES.values() if is_array}
    assert scalars == arrays


# ---- NULL ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REQUIRED) + ["mood", "point"])
@pytest.mark.parametrize("is_array", [False, True])
def test_null_stays_none(name: str, is_array: bool) -> None:
    assert parse_value(name, is_array, None) is None


# ---- numbers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("typ", "text", "expected"),
    [
        ("int2", "-32768", -32768),
        ("int2", "32767", 32767),
        ("int4", "-2147483648", -(2**31)),
        ("int4", "0", 0),
        ("int8", "9223372036854775807", 2**63 - 1),
        ("int8", "-9223372036854775808", -(2**63)),
        ("oid", "4294967295", 2**32 - 1),
    ],
)
def test_integers(typ: str, text: str, expected: int) -> None:
    value = parse_value(typ, False, text)
    assert type(value) is int
    assert value == expected


@pytest.mark.parametrize(
    "text",
    [
        "123456789012345678901234567890.123456789012345678901234567890",
        "-0.000000000000000000000001",
        "1.50",
        "0",
        "-42",
        "1000000000000000000000000000000000000000",
    ],
)
def test_numeric_keeps_precision_and_scale(text: str) -> None:
    value = parse_value("numeric", False, text)
    assert isinstance(value, Decimal)
    assert format(value, "f") == text  # same digits and scale (str() may use exponent form)


def test_numeric_special_values() -> None:
    assert parse_value("numeric", False, "NaN").is_nan()
    inf = parse_value("numeric", False, "Infinity")
    ninf = parse_value("numeric", False, "-Infinity")
    assert inf.is_infinite() and inf > 0
    assert ninf.is_infinite() and ninf < 0


@pytest.mark.parametrize(
    ("typ", "text", "expected"),
    [
        ("float4", "1.5", 1.5),
        ("float4", "0.1", 0.1),
        ("float8", "-1e+300", -1e300),  # PG 18
        ("float8", "1e-320", 1e-320),
        ("float8", "0.30000000000000004", 0.1 + 0.2),
        ("float8", "Infinity", math.inf),
        ("float8", "-Infinity", -math.inf),
        ("float4", "-0", -0.0),
    ],
)
def test_floats(typ: str, text: str, expected: float) -> None:
    value = parse_value(typ, False, text)
    assert type(value) is float
    assert value == expected
    assert math.copysign(1, value) == math.copysign(1, expected)


def test_float_nan() -> None:
    assert math.isnan(parse_value("float8", False, "NaN"))
    assert math.isnan(parse_value("float4", False, "NaN"))


@pytest.mark.parametrize(
    ("typ", "text"), [("int4", "1.5"), ("int8", "x"), ("numeric", "1,5"), ("float8", "")]
)
def test_bad_numbers_raise(typ: str, text: str) -> None:
    with pytest.raises(DecodeError, match=typ):
        parse_value(typ, False, text)


# ---- bool, text ---------------------------------------------------------------------------------------
def test_bool() -> None:
    assert parse_value("bool", False, "t") is True
    assert parse_value("bool", False, "f") is False
    with pytest.raises(DecodeError):
        parse_value("bool", False, "true")


@pytest.mark.parametrize(
    "typ", ["text", "varchar", "bpchar", "char", "name", "json", "jsonb", "interval", "timetz"]
)
@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain",
        "日本語 🎉 ü",
        "ab  ",
        "  lead",
        "quote\"back\\slash'",
        "line\nbreak\ttab",
        '{"a": [1, 2]}',
    ],
)
def test_text_like_types_are_str_as_sent(typ: str, text: str) -> None:
    value = parse_value(typ, False, text)
    assert type(value) is str
    assert value == text


@pytest.mark.parametrize(
    ("typ", "text"),
    [
        ("interval", "1 year 2 mons 3 days 04:05:06.5"),  # PG 18
        ("interval", "-00:00:01"),
        ("timetz", "12:00:00+05"),  # PG 18
        ("timetz", "12:00:00-03:30"),
    ],
)
def test_interval_and_timetz_as_sent(typ: str, text: str) -> None:
    assert parse_value(typ, False, text) == text


@pytest.mark.parametrize("typ", ["mood", "point", "inet", "money", "tsvector", "int4range", "xml"])
def test_unknown_and_other_types_are_str(typ: str) -> None:
    for text in ["(1,2)", "happy", "$1.00", "10.0.0.0/8", "[1,5)"]:
        assert parse_value(typ, False, text) == text


# ---- bytea --------------------------------------------------------------------------------------------
ALL_BYTES = bytes(range(256))


def _bytea_escape_out(data: bytes) -> str:
    """PostgreSQL's bytea_output = escape format."""
    out = []
    for b in data:
        if b == 0x5C:
            out.append("\\\\")
        elif 0x20 <= b <= 0x7E:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return "".join(out)


def test_bytea_hex_all_byte_values() -> None:
    text = "\\x" + ALL_BYTES.hex()
    assert parse_value("bytea", False, text) == ALL_BYTES
    assert parse_value("bytea", False, "\\x") == b""
    assert parse_value("bytea", False, "\\x00ff") == b"\x00\xff"  # PG 18


def test_bytea_escape_all_byte_values() -> None:
    text = _bytea_escape_out(ALL_BYTES + ALL_BYTES[::-1])
    assert parse_value("bytea", False, text) == ALL_BYTES + ALL_BYTES[::-1]
    assert parse_value("bytea", False, "abc") == b"abc"
    assert parse_value("bytea", False, "") == b""


@pytest.mark.parametrize("text", ["\\xzz", "\\x0", "bad\\9escape", "trailing\\"])
def test_bytea_malformed(text: str) -> None:
    with pytest.raises(DecodeError, match="bytea"):
        parse_value("bytea", False, text)


# ---- dates and times ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-02-29", date(2024, 2, 29)),
        ("0001-01-01", date(1, 1, 1)),
        ("9999-12-31", date(9999, 12, 31)),
    ],
)
def test_date(text: str, expected: date) -> None:
    assert parse_value("date", False, text) == expected


@pytest.mark.parametrize("typ", ["date", "timestamp", "timestamptz"])
@pytest.mark.parametrize("text", ["infinity", "-infinity"])
def test_infinite_dates_stay_str(typ: str, text: str) -> None:
    assert parse_value(typ, False, text) == text


@pytest.mark.parametrize(
    ("typ", "text"),
    [
        ("date", "0044-03-15 BC"),  # PG 18
        ("timestamp", "0044-03-15 12:00:00 BC"),
        ("timestamptz", "0044-03-15 12:00:00+00 BC"),  # PG 18
        ("date", "10000-01-01"),
        ("timestamp", "10000-01-01 00:00:00"),  # PG 18
        ("timestamptz", "294276-12-31 23:59:59.999999+00"),
    ],
)
def test_out_of_python_range_dates_stay_str(typ: str, text: str) -> None:
    assert parse_value(typ, False, text) == text


@pytest.mark.parametrize(
    ("typ", "text"),
    [
        ("date", "01/02/2024"),
        ("timestamp", "Tue Jan 02 03:04:05 2024"),
        ("timestamptz", "Tue Jan 02 03:04:05 2024 PST"),
        ("timestamptz", "2024-01-02 03:04:05"),  # no offset
        ("timestamp", "2024-01-02 03:04:05+00"),  # an offset on a timestamp without time zone
        ("time", "25:00:00"),
    ],
)
def test_non_iso_datetimes_raise(typ: str, text: str) -> None:
    with pytest.raises(DecodeError, match=typ):
        parse_value(typ, False, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00:00:00", time(0, 0)),
        ("23:59:59.999999", time(23, 59, 59, 999999)),
        ("12:34:56.5", time(12, 34, 56, 500000)),
        ("24:00:00", "24:00:00"),  # PG 18 accepts it, Python's time cannot hold it
    ],
)
def test_time(text: str, expected: time | str) -> None:
    assert parse_value("time", False, text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-02 03:04:05", datetime(2024, 1, 2, 3, 4, 5)),
        ("2024-01-02 03:04:05.123456", datetime(2024, 1, 2, 3, 4, 5, 123456)),
        ("2024-01-02 03:04:05.1", datetime(2024, 1, 2, 3, 4, 5, 100000)),
        ("0001-01-01 00:00:00", datetime(1, 1, 1)),
    ],
)
def test_timestamp_is_naive(text: str, expected: datetime) -> None:
    value = parse_value("timestamp", False, text)
    assert value == expected
    assert value.tzinfo is None


@pytest.mark.parametrize(
    ("text", "utc"),
    [
        ("2026-11-21 23:50:14.02734+00", datetime(2026, 11, 21, 23, 50, 14, 27340)),  # PG 18
        ("2024-01-01 05:30:00.123456+05:30", datetime(2024, 1, 1, 0, 0, 0, 123456)),  # PG 18, Asia/Kolkata
        ("2023-12-31 20:30:00-03:30", datetime(2024, 1, 1)),  # PG 18, America/St_Johns
        ("2024-01-01 21:00:00-03", datetime(2024, 1, 2)),
        ("1850-01-01 05:53:28+05:53:28", datetime(1850, 1, 1)),  # PG 18, LMT offset with seconds
        ("2024-06-30 23:59:59.999999+14", datetime(2024, 6, 30, 9, 59, 59, 999999)),
    ],
)
def test_timestamptz_normalised_to_utc(text: str, utc: datetime) -> None:
    value = parse_value("timestamptz", False, text)
    assert value.tzinfo is UTC
    assert value == utc.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "offset_hours"),
    [("0001-01-01 00:00:00+05", 5), ("9999-12-31 23:00:00-05", -5)],
)
def test_timestamptz_outside_utc_range_keeps_offset(text: str, offset_hours: int) -> None:
    value = parse_value("timestamptz", False, text)
    assert value.utcoffset() == timedelta(hours=offset_hours)
    assert value.replace(tzinfo=None) == datetime.fromisoformat(text[:19])


# ---- uuid ---------------------------------------------------------------------------------------------
def test_uuid() -> None:
    u = uuid.uuid4()
    assert parse_value("uuid", False, str(u)) == u
    with pytest.raises(DecodeError, match="uuid"):
        parse_value("uuid", False, "not-a-uuid")


# ---- arrays -------------------------------------------------------------------------------------------
def test_text_array_quoting_pg18_sample() -> None:
    # PG 18: ARRAY['a b','x"y','', 'NULL', NULL, 'a,b', 'back\slash', '{}', ' lead', 'ü']::text[]
    text = '{"a b","x\\"y","","NULL",NULL,"a,b","back\\\\slash","{}"," lead",ü}'
    assert parse_value("text", True, text) == [
        "a b",
        'x"y',
        "",
        "NULL",
        None,
        "a,b",
        "back\\slash",
        "{}",
        " lead",
        "ü",
    ]


@pytest.mark.parametrize(
    ("typ", "text", "expected"),
    [
        ("int4", "{}", []),
        ("int4", "{1,2,NULL,-4}", [1, 2, None, -4]),
        ("int4", "[0:1]={1,2}", "[0:1]={1,2}"),  # PG 18: bounds kept, the text as sent
        ("int4", "[-2:-1]={7,NULL}", "[-2:-1]={7,NULL}"),
        ("int4", "{{1,2},{3,4}}", [[1, 2], [3, 4]]),  # PG 18
        ("int4", "[1:2][0:0]={{1},{2}}", "[1:2][0:0]={{1},{2}}"),
        ("text", '[0:1]={"a b",NULL}', '[0:1]={"a b",NULL}'),
        ("int8", "{{{1}},{{NULL}}}", [[[1]], [[None]]]),
        ("bpchar", '{"ab  "}', ["ab  "]),  # PG 18, char(4)
        ("bytea", '{"\\\\x00ff",NULL}', [b"\x00\xff", None]),  # PG 18
        ("numeric", "{1.5,NaN,-0.10}", [Decimal("1.5"), "nan", Decimal("-0.10")]),
        ("bool", "{t,f,NULL}", [True, False, None]),
        ("date", "{2024-01-01,infinity}", [date(2024, 1, 1), "infinity"]),
        ("jsonb", '{"{\\"a\\": [1, 2]}",NULL}', ['{"a": [1, 2]}', None]),  # PG 18
        ("text", '{"tab\there","nl\n"}', ["tab\there", "nl\n"]),  # PG 18
        ("text", '{""}', [""]),  # PG 18
        ("text", '{"{",",","}","\\\\","\\""}', ["{", ",", "}", "\\", '"']),
        ("text", '{"a,b,c","d","NULL","null",NULL}', ["a,b,c", "d", "NULL", "null", None]),
        ("text", '{{a,b},{NULL,"c d"}}', [["a", "b"], [None, "c d"]]),
        ("mood", "{happy,sad}", ["happy", "sad"]),
        ("box", "{(1,1),(0,0);(3,3),(2,2)}", ["(1,1),(0,0)", "(3,3),(2,2)"]),  # PG 18, ';' delimiter
        ("point", '{"(1,2)","(3,4)"}', ["(1,2)", "(3,4)"]),
    ],
)
def test_arrays(typ: str, text: str, expected: list) -> None:
    value = parse_value(typ, True, text)
    if typ == "numeric":
        assert value[1].is_nan()
        value[1] = "nan"
    assert value == expected


def test_timestamptz_array() -> None:
    value = parse_value("timestamptz", True, '{"2026-11-21 23:50:14.02734+00","2024-01-01 05:30:00+05:30"}')
    assert value == [datetime(2026, 11, 21, 23, 50, 14, 27340, UTC), datetime(2024, 1, 1, tzinfo=UTC)]
    assert all(v.tzinfo is UTC for v in value)


def test_uuid_array() -> None:
    us = [uuid.uuid4() for _ in range(3)]
    assert parse_value("uuid", True, "{" + ",".join(map(str, us)) + ",NULL}") == [*us, None]


@pytest.mark.parametrize(
    "text",
    [
        "{1,2",
        "{1,,2}",
        "{1,2}}",
        "{,}",
        "{1,}",
        '{"a"b}',
        '{"a}',
        "x{1}",
        "{1}x",
        "[1:2]{1,2}",
        "[1:2]={1,{2}}",
        "[x]={1}",
        "[1:2]=",
        "{{1},2}",
        "{1,{2}}",
        "",
    ],
)
def test_malformed_arrays_raise(text: str) -> None:
    with pytest.raises(DecodeError, match=r"text\[\]"):
        parse_value("text", True, text)


def test_element_parse_errors_surface() -> None:
    with pytest.raises(DecodeError, match=r"int4\[\]"):
        parse_value("int4", True, "{1,two}")
    with pytest.raises(DecodeError, match=r"int4\[\]"):
        parse_value("int4", True, "[0:1]={1,two}")
    with pytest.raises(DecodeError, match=r"int4\[\]"):
        parse_value("int4", True, '{"1 ",x}')


# A Python model of PostgreSQL's array_out for one-dimensional text arrays, to check round trips.
def _array_out(items: list[str | None]) -> str:
    parts = []
    for item in items:
        if item is None:
            parts.append("NULL")
            continue
        needs_quotes = item == "" or item.upper() == "NULL" or any(c in '{},"\\ \t\n\r\v\f' for c in item)
        if needs_quotes:
            parts.append('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            parts.append(item)
    return "{" + ",".join(parts) + "}"


def test_text_array_round_trip_random() -> None:
    rng = random.Random(20261121)
    alphabet = ["a", "Z", "0", " ", ",", '"', "\\", "{", "}", "\t", "\n", "é", "日", "🎉", "N", "U", "L"]
    for _ in range(2000):
        items: list[str | None] = []
        for _ in range(rng.randint(0, 6)):
            r = rng.random()
            if r < 0.1:
                items.append(None)
            elif r < 0.15:
                items.append(rng.choice(["NULL", "null", ""]))
            else:
                items.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
        text = _array_out(items)
        assert parse_value("text", True, text) == items, text


def test_int_array_round_trip_random() -> None:
    rng = random.Random(7)
    for _ in range(500):
        items = [
            None if rng.random() < 0.2 else rng.randint(-(2**63), 2**63 - 1)
            for _ in range(rng.randint(0, 20))
        ]
        text = "{" + ",".join("NULL" if i is None else str(i) for i in items) + "}"
        assert parse_value("int8", True, text) == items


# ---- parser_for ---------------------------------------------------------------------------------------
def test_parser_for_is_cached_and_typed() -> None:
    assert parser_for("int4", True) is parser_for("int4", True)
    assert parser_for("int4", False) is parser_for("int4", False)
    assert parser_for("int4", False)("12") == 12
    assert parser_for("no_such_type", False)("x y") == "x y"
    assert parser_for("no_such_type", True)('{"x y",z}') == ["x y", "z"]
    with pytest.raises(ValueError):
        parser_for("bool", False)("yes")


def test_timezone_objects_are_utc_singleton() -> None:
    # Equal instants from different offsets compare and hash equal after normalisation.
    a = parse_value("timestamptz", False, "2024-01-01 00:00:00+00")
    b = parse_value("timestamptz", False, "2024-01-01 09:00:00+09")
    assert a == b and hash(a) == hash(b)
    assert b.tzinfo is UTC


# ---- row_parser -------------------------------------------------------------------------------------------
ROW_TYPES = [("int4", False), ("text", False), ("numeric", False), ("timestamptz", False), ("varchar", False),
             ("bool", False), ("date", False), ("int4", True), ("uuid", False), ("bpchar", False), ("mood", False)]
ROW_TEXTS = ["42", "it's", "-1.50", "2026-11-22 01:02:03.5+00", "héllo", "t", "infinity", "{1,NULL,3}",
             "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "ab  ", "happy"]


def test_row_parser_equals_parsing_each_column(codec: RowCodec) -> None:
    row_parser = codec.row_parser
    parsers = tuple(parser_for(t, a) for t, a in ROW_TYPES)
    parse = row_parser(parsers)
    rng = random.Random(7)
    for _ in range(200):
        texts = [None if rng.random() < 0.3 else t for t in ROW_TEXTS]
        expected = tuple(None if t is None else p(t) for p, t in zip(parsers, texts, strict=True))
        got = parse(texts)
        assert got == expected
        assert [type(v) for v in got] == [type(v) for v in expected]
        assert all(g is t for g, t, (typ, _) in zip(got, texts, ROW_TYPES, strict=True) if typ in ("text", "varchar"))
    assert row_parser(())([]) == ()


def test_row_parser_raises_the_parsers_error(codec: RowCodec) -> None:
    row_parser = codec.row_parser
    parse = row_parser((parser_for("text", False), parser_for("int4", False), parser_for("numeric", False)))
    with pytest.raises(ValueError):
        parse(["x", "twelve", "1"])
    with pytest.raises(ArithmeticError):
        parse(["x", "12", "one"])
    assert parse(["x", None, None]) == ("x", None, None)
