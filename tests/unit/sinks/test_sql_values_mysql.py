"""MySQL value rendering: the fast literal renderer and the timestamp text paths must produce exactly what the
generic paths produce (PyMySQL's escaping, formatting the parsed value) for every value."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pymysql.converters
import pytest
from pymysql.constants import SERVER_STATUS

from cdc.events import ColumnSchema
from sinks.sql.dialect.values import (
    converter,
    mysql_literal_function,
    mysql_timestamp,
    mysql_timestamptz_text,
    text_path,
)
from upstream.postgres.types import parser_for

pytestmark = pytest.mark.unit


def connection(status: int = 0) -> Any:
    return SimpleNamespace(server_status=status, escape=lambda v: pymysql.converters.escape_item(v, "utf8mb4"))


STRINGS = ["", "a", "0cc175b9c0f1b6a831c399e269772661", "it's", 'say "hi"', "back\\slash", "nul\0byte", "line\nfeed",
           "cr\rlf\r\n", "ctrl-z\x1a", "héllo wörld", "日本語テキスト", "emoji \U0001F600 'q'", "\\'", "'" * 5,
           "%s %% ?", "tab\there", "\x7f\x80\xff", "a" * 5000 + "'" + "b" * 5000, " trailing space ",
           "2026-11-22 01:02:03.500000", "-".join(chr(c) for c in range(0, 400, 3))]


@pytest.mark.parametrize("status", [0, SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES])
def test_string_literals_equal_pymysql_escaping(status: int) -> None:
    conn = connection(status)
    lit = mysql_literal_function(conn)
    for s in STRINGS:
        expected = conn.escape(s) if status else "'" + pymysql.converters.escape_string(s) + "'"
        assert lit(s) == expected, repr(s)


DECIMALS = ["0", "0.00", "-0", "-0.00", "1", "1.50", "-1234.5678", "123456789012345678901234567890.123456789",
            "0.000001", "0.0000001", "0.00000000", "-0.0000001234", "1E+3", "1.5E+10", "1E-7", "12345678901234567890E+5",
            "0E-8", "0E+2", "999999.999999", "100", "0.1"]


def test_decimal_literals_equal_fixed_point_formatting() -> None:
    lit = mysql_literal_function(connection())
    for text in DECIMALS:
        v = Decimal(text)
        out = lit(v)
        assert out == format(v, "f"), text
        assert "E" not in out and "e" not in out
        assert Decimal(out) == v


@pytest.mark.parametrize("text", ["NaN", "-NaN", "sNaN", "Infinity", "-Infinity"])
def test_non_finite_decimals_go_to_pymysql(text: str) -> None:
    conn = connection()
    lit = mysql_literal_function(conn)
    v = Decimal(text)
    try:
        expected: Any = conn.escape(v)
    except Exception as exc:  # noqa: BLE001 - whatever PyMySQL does, the renderer does the same
        with pytest.raises(type(exc)):
            lit(v)
    else:
        assert lit(v) == expected


def test_other_literals() -> None:
    lit = mysql_literal_function(connection())
    assert lit(None) == "NULL"
    assert lit(True) == "1" and lit(False) == "0"
    assert lit(-42) == "-42" and lit(2**70) == str(2**70)
    assert lit(1.5) == "1.5e0" and lit(1e300) == "1e+300"
    assert lit(dt.date(2026, 1, 2)) == "'2026-01-02'"
    assert lit(b"a'b") == pymysql.converters.escape_item(b"a'b", "utf8mb4")


def old_literal(v: dt.datetime) -> str:
    """What the sink sent for a timestamp before the text form: the naive UTC datetime, formatted."""
    if v.tzinfo is not None:
        v = v.astimezone(dt.UTC).replace(tzinfo=None)
    return "'%04d-%02d-%02d %02d:%02d:%02d.%06d'" % (  # noqa: UP031
        v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond)


DATETIMES = [dt.datetime(2026, 11, 22, 1, 2, 3, 500000), dt.datetime(2026, 11, 22, 1, 2, 3),
             dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(999, 2, 3, 4, 5, 6, 7),
             dt.datetime(2000, 2, 29, 12, 0, 0, 1)]
ZONES = [None, dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-8))]


def test_timestamp_converter_renders_the_old_literal() -> None:
    lit = mysql_literal_function(connection())
    for base in ("timestamp", "timestamptz"):
        conv = converter(ColumnSchema("c", 0, base), "mysql", table="t")
        assert conv is not None
        for d in DATETIMES:
            for tz in ZONES:
                v = d.replace(tzinfo=tz)
                if tz is not None and tz is not dt.UTC and d.year in (1, 9999):
                    continue  # outside Python's range once in UTC
                out = conv(v)
                assert out == mysql_timestamp(v)
                assert lit(out) == old_literal(v), (base, v)
                naive = v if tz is None else v.astimezone(dt.UTC).replace(tzinfo=None)
                if naive.microsecond:  # PyMySQL drops a zero fraction; otherwise the very same text
                    assert lit(out) == pymysql.converters.escape_item(naive, "utf8mb4")
        assert conv("infinity") == "infinity"  # text the parser kept (infinity, BC) passes through
        assert conv("0044-03-15 BC") == "0044-03-15 BC"


PG_TEXTS = ["2026-11-22 01:02:03", "2026-11-22 01:02:03.1", "2026-11-22 01:02:03.12", "2026-11-22 01:02:03.123",
            "2026-11-22 01:02:03.1234", "2026-11-22 01:02:03.12345", "2026-11-22 01:02:03.123456",
            "0001-01-01 00:00:00", "9999-12-31 23:59:59.999999", "2000-02-29 12:00:00.000001", "0999-05-06 07:08:09.5"]


@pytest.mark.parametrize("text", PG_TEXTS)
def test_mysql_timestamp_text_paths_equal_converting_the_parsed_value(text: str) -> None:
    for base, t in (("timestamp", text), ("timestamptz", text + "+00")):
        conv = converter(ColumnSchema("c", 0, base), "mysql", table="t")
        path = text_path(conv)  # type: ignore[arg-type]
        assert path is not None
        typ, g = path
        value = parser_for(base, False)(t)
        assert type(value) is typ
        assert g(t) == conv(value), (base, t)  # type: ignore[misc]
        assert len(g(t)) == 26  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["infinity", "-infinity", "2026-11-22 01:02:03+05:30", "2026-11-22 01:02:03+00 BC",
                                  "2026-11-22T01:02:03+00", "2026-11-22 01:02:03,5+00", "2026-W47-7 01:02:03+00",
                                  "2026-11-22 01:02+00", "2026-11-22 01:02:03.+00", "2026-11-22 01:02:03.1234567+00",
                                  "12026-11-22 01:02:03+00", "2026-11-22 01:02:03", "2026-11-22 01:02:03.123456+01",
                                  "2026-11-22 01:02:03.123456-00"])
def test_mysql_timestamptz_text_path_declines_other_shapes(text: str) -> None:
    assert mysql_timestamptz_text(text) is None


ROW_VALUES = [None, True, False, 0, -7, 2**70, 1.5, -0.0, "", "plain", "it's", "nul\0", "日本", Decimal("1.50"),
              Decimal("1E+3"), Decimal("0E-8"), Decimal("-0.0000001"), dt.datetime(2026, 1, 2, 3, 4, 5, 6),
              dt.date(2026, 1, 2), dt.time(1, 2, 3, 4), b"by'tes", "2026-11-22 01:02:03.500000"]


class Text(str):
    pass


@pytest.mark.parametrize("status", [0, SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES])
def test_row_renderer_equals_joining_literals(status: int) -> None:
    """Whatever types the renderer was generated for, every row renders as the literals joined."""
    import random

    lit = mysql_literal_function(connection(status))
    rng = random.Random(11)
    for _ in range(300):
        n = rng.randint(1, 6)
        first = [rng.choice(ROW_VALUES) for _ in range(n)]
        render = lit.rows(tuple(map(type, first)))  # type: ignore[attr-defined]
        for row in (first, [rng.choice(ROW_VALUES) for _ in range(n)], [Text("a'b")] * n,
                    [rng.choice(ROW_VALUES) for _ in range(n + 1)]):
            assert render(tuple(row)) == "(" + ",".join(map(lit, row)) + ")", row
    assert lit.rows((int, str)) is lit.rows((int, str))  # type: ignore[attr-defined]
