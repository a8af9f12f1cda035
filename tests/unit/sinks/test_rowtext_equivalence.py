"""The C row renderer against the pure-Python reference (sinks.sql.dialect.rowtext): the same text, the same errors.

Rows of values of every type the sink's converters hand a MySQL/MariaDB connection, and of types they never hand it
(bytes, UUIDs, lists, int and str subclasses, timezone-aware times, objects), with hostile values (quotes,
backslashes, NUL, ^Z, CR/LF, unicode beyond the BMP, lone surrogates, NaN and infinities, huge and tiny decimals,
integers of 5,000 digits), are generated from a fixed seed and rendered by both implementations, as rows (tuples and
lists), under statement size limits that split them anywhere, with backslash escapes on and off, and with ``literal``
functions that return what is not a str; COPY text is compared the same way over rows of hostile texts and rows of
the wrong shape. Every outcome must be identical: the same list of statements (or text), or the same exception type
and message.
"""

from __future__ import annotations

import datetime as dt
import random
import sys
import uuid
from decimal import Decimal
from enum import IntEnum
from types import SimpleNamespace
from typing import Any

import pymysql
import pytest
from pymysql.constants import SERVER_STATUS

from cdc.events import ColumnSchema
from sinks.sql.dialect import rowtext
from sinks.sql.dialect.values import converter, keeps, mysql_literal_function
from sinks.sql.target.binding import row_function
from tests import rowtexts

pytestmark = pytest.mark.unit

SEED = 22_55

STRINGS = ["", "a", "it's", 'say "hi"', "back\\slash", "nul\0byte", "line\nfeed", "cr\rlf\r\n", "ctrl-z\x1a",
           "tab\there", "héllo wörld", "日本語", "emoji \U0001F600 'q'", "\\'", "'" * 5, "%s %% ?", "\x7f\x80\xff",
           "a" * 3000 + "'" + "b" * 3000, "\\N", "\\.", "lone \ud800 surrogate", "\udcff", "end\\",
           "-".join(chr(c) for c in range(0, 400, 7))]
DECIMALS = ["0", "1.50", "-0.00", "1E-7", "1E+5", "0E-10", "123456789012345678901234567890.123456789",
            "9" * 200 + "." + "9" * 200, "1E+400", "-1E-400", "NaN", "-NaN", "sNaN", "Infinity", "-Infinity"]


class Level(IntEnum):
    LOW = 1


class Text(str):
    pass


class Odd:
    def __repr__(self) -> str:
        return "Odd('x')"

    def __str__(self) -> str:
        return "odd 'x'"


def value(rng: random.Random) -> Any:
    kind = rng.randrange(16)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2**31, -2**63, 2**63 - 1, 2**63, -2**63 - 1, 10**50, -10**100,
                           rng.randrange(-10**9, 10**9)])
    if kind == 3:
        return rng.choice(STRINGS) + (str(rng.randrange(100)) if rng.random() < 0.3 else "")
    if kind == 4:
        return rng.choice([0.0, -0.0, 1.5, 1e16, 1e300, 1e-300, 5e-324, 123456789.0, 0.1, float("nan"), float("inf"),
                           float("-inf"), rng.uniform(-1e6, 1e6)])
    if kind == 5:
        return Decimal(rng.choice(DECIMALS))
    if kind == 6:
        return dt.datetime(rng.choice([1, 999, 2026, 9999]), rng.randrange(1, 13), rng.randrange(1, 29),
                           rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.choice([0, 1, 999999]))
    if kind == 7:
        return dt.datetime(2026, 11, 28, 1, 2, 3, rng.choice([0, 4]),
                           tzinfo=rng.choice([dt.UTC, dt.timezone(dt.timedelta(hours=5))]))
    if kind == 8:
        return dt.date(rng.choice([1, 2026, 9999]), rng.randrange(1, 13), rng.randrange(1, 29))
    if kind == 9:
        return dt.time(rng.randrange(24), rng.randrange(60), rng.randrange(60), rng.choice([0, 7, 999999]))
    if kind == 10:
        return dt.time(1, 2, 3, rng.choice([0, 5]), tzinfo=dt.UTC)
    if kind == 11:
        return rng.choice([b"a'b\\\0", bytearray(b"xy"), b""])
    if kind == 12:
        return rng.choice([uuid.UUID(int=rng.getrandbits(128)), dt.timedelta(seconds=5)])
    if kind == 13:
        return rng.choice([Level.LOW, Text("it's sub"), Odd()])
    if kind == 14:
        return rng.choice([[1, "a"], (1, 2), {"k": "v"}, {1, 2}])
    return rng.choice([10**5000, -(10**4400)])  # int -> str refuses more than 4,300 digits


def connection(status: int) -> Any:
    return SimpleNamespace(server_status=status, escape=lambda v: pymysql.converters.escape_item(v, "utf8mb4"))


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@pytest.fixture(scope="module")
def c_text() -> rowtext.RowText:
    return rowtexts.rowtext_named("c")


def test_the_c_renderer_builds_where_a_compiler_is() -> None:
    """Where cc and Python.h exist the C renderer must build and load (else every [c] test would skip)."""
    if not rowtexts.can_build():
        pytest.skip("no C compiler or Python headers here")
    assert rowtext.native() is not None


@pytest.mark.parametrize("status", [0, SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES])
def test_mysql_statements_equal_the_reference(c_text: rowtext.RowText, status: int) -> None:
    lit = mysql_literal_function(connection(status))
    rng = random.Random(SEED + status)
    for case in range(1500):
        ncols = rng.randrange(0, 7)
        shape = rng.random()
        if shape < 0.8:  # a group of one value type per column, as the writer's groups are (fast paths)
            kinds = [value(rng) for _ in range(ncols)]
            params: Any = [tuple(v if rng.random() < 0.7 else value(rng) for v in kinds)
                           for _ in range(rng.randrange(1, 30))]
        else:  # rows of any length and shape
            params = [rng.choice([tuple, list])(value(rng) for _ in range(rng.randrange(0, 7)))
                      for _ in range(rng.randrange(0, 10))]
        if rng.random() < 0.05 and params:
            params[rng.randrange(len(params))] = rng.choice([None, 5, "row", {"k": 1}, range(2)])  # not a row
        if rng.random() < 0.03:
            params = tuple(params) if rng.random() < 0.5 else iter(params)
        limit = rng.choice([1, 10, 60, 300, 10**6])
        head, tail = rng.choice([("INSERT INTO `t` (`a`) VALUES ", ""),
                                 ("INSERT INTO `tä` VALUES ", " ON DUPLICATE KEY UPDATE `a` = VALUES(`a`)")])
        if isinstance(params, type(iter([]))):
            items = list(params)
            expected = outcome(rowtext.PYTHON.mysql_statements, iter(items), head, tail, limit, lit)
            got = outcome(c_text.mysql_statements, iter(items), head, tail, limit, lit)
        else:
            expected = outcome(rowtext.PYTHON.mysql_statements, params, head, tail, limit, lit)
            got = outcome(c_text.mysql_statements, params, head, tail, limit, lit)
        assert got == expected, (case, params, limit)


def test_mysql_statements_split_where_the_reference_splits(c_text: rowtext.RowText) -> None:
    lit = mysql_literal_function(connection(0))
    rows = [(i, "x'\\\n\0é" * (i % 7), Decimal("1.5"), dt.datetime(2026, 1, 1)) for i in range(200)]
    for limit in range(0, 400, 3):
        expected = rowtext.PYTHON.mysql_statements(rows, "H ", " T", limit, lit)
        assert c_text.mysql_statements(rows, "H ", " T", limit, lit) == expected
        assert all(len(s) <= max(limit, max(map(len, expected))) for s in expected)
    assert c_text.mysql_statements([], "H", "T", 10, lit) == []


def test_a_literal_that_is_not_a_str_takes_the_reference(c_text: rowtext.RowText) -> None:
    base = mysql_literal_function(connection(0))

    def lit(v: Any) -> Any:
        return b"bytes" if isinstance(v, bytes) else (None if isinstance(v, uuid.UUID) else base(v))

    lit.rows = base.rows  # type: ignore[attr-defined]
    lit.plain_str = True  # type: ignore[attr-defined]
    for row in [(1, b"x"), (uuid.UUID(int=1), "a"), ("\ud800",), ((1, 2),)]:
        expected = outcome(rowtext.PYTHON.mysql_statements, [row], "H", "T", 100, lit)
        assert outcome(c_text.mysql_statements, [row], "H", "T", 100, lit) == expected


def test_copy_text_equals_the_reference(c_text: rowtext.RowText) -> None:
    rng = random.Random(SEED)
    for case in range(1500):
        texts: Any = []
        for _ in range(rng.randrange(0, 12)):
            row = [rng.choice(STRINGS + [None, None, "plain", "1", "2026-11-28 01:02:03+00"])
                   for _ in range(rng.randrange(0, 6))]
            if rng.random() < 0.03 and row:
                row[rng.randrange(len(row))] = rng.choice([5, b"x", Text("sub\t"), 1.5])  # not a text
            texts.append(rng.choice([tuple, list])(row))
        if rng.random() < 0.03 and texts:
            texts[rng.randrange(len(texts))] = rng.choice([None, 7, "abc", {"a": 1}, range(1)])  # not a row
        if rng.random() < 0.03:
            items = list(texts)
            assert outcome(c_text.copy_text, iter(items)) == outcome(rowtext.PYTHON.copy_text, iter(items)), case
            continue
        assert outcome(c_text.copy_text, texts) == outcome(rowtext.PYTHON.copy_text, texts), (case, texts)


BASE_TYPES = ["int2", "int4", "int8", "bool", "bytea", "xid8", "numeric", "float4", "float8", "timestamptz", "timestamp",
              "date", "time", "uuid", "text", "varchar", "json", "jsonb", "interval", "timetz", "money", "inet"]
TEXTS = ["2026-11-22 01:02:03.5+00", "2026-11-22 01:02:03.12+00", "2026-11-22 01:02:03.123+00",
         "2026-11-22 01:02:03.1234+00", "2026-11-22 01:02:03.12345+00", "2026-11-22 01:02:03.12345",
         "2026-11-22 01:02:03.1234", "2026-11-22 01:02:03.123456", "2026-11-22 01:02:03+00", "2026-11-22 01:02:03.123456+00",
         "2026-11-22 01:02:03.1234567+00", "2026-11-22 01:02:03.5", "2026-11-22 01:02:03", "2026-11-22 01:02:03.+00",
         "2026-11-22 01:02:03,5+00", "2026-11-22T01:02:03+00", "2026-11-22 01:02:03.5+05", "2026-11-22 01:02:03.5+00:00",
         "12026-11-22 01:02:03+00", "2026-11-22 01:02:03.5+00 BC", "2026-11-22 01:02:0é+00", "２026-11-22 01:02:03+00",
         "", "x", "1.50", "NaN", "abc" * 10, "\ud800"]


def shown(result: tuple[str, Any]) -> Any:
    """An outcome with each value as (its type, its repr or, for an int, itself: a repr may refuse 5,000 digits)."""
    kind, v = result
    if kind != "ok":
        return result
    return type(v), [(type(x), x if type(x) is int else repr(x)) for x in v]


def converted(rng: random.Random) -> Any:
    """A value of a type the mounter makes, or not."""
    kind = rng.randrange(8)
    if kind == 0:
        return dt.datetime(2026, 11, 22, 1, 2, 3, rng.choice([0, 500000]), tzinfo=rng.choice([None, dt.UTC]))
    if kind == 1:
        return rng.choice([Decimal("1.50"), Decimal("NaN"), Decimal("-Infinity"), Decimal("1E-7"),
                           Decimal("9" * 100 + ".001"), Decimal("sNaN")])
    if kind == 2:
        return rng.choice([1.5, -0.0, 0.0, float("nan"), float("inf"), 2**64, True])
    return value(rng)


@pytest.mark.parametrize("dialect", ["mysql", "postgresql", "sqlite"])
def test_row_converters_equal_the_generated_functions(c_text: rowtext.RowText, dialect: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEWATER_ROWTEXT", "python")  # row_function's own (generated) functions
    rng = random.Random(SEED + len(dialect))
    for case in range(400):
        n = rng.randrange(1, 7)
        convs = {}
        for i in range(n):
            base = rng.choice(BASE_TYPES)
            col = ColumnSchema(f"c{i}", 0, base, is_array=rng.random() < 0.1)
            conv = converter(col, dialect, table="t", scale=rng.choice([None, None, 0, 2]))
            if conv is not None:
                convs[i] = conv
        for with_text in (False, True):
            fn = row_function(n, convs, with_text=with_text)
            if fn is None:
                continue
            cfn = c_text.row_converter(n, convs, with_text, fn)
            for _ in range(20):
                row: Any = [converted(rng) for _ in range(n)]
                if rng.random() < 0.05:
                    row = row[:rng.randrange(n)]  # too short
                row = rng.choice([tuple, list])(row)
                args: tuple[Any, ...] = (row,)
                if with_text:
                    text: Any = [rng.choice(TEXTS) if rng.random() < 0.9 else rng.choice([None, 5, b"x"])
                                 for _ in range(n)]
                    if rng.random() < 0.05:
                        text = text[:rng.randrange(n)]  # too short
                    args = (row, rng.choice([tuple, list])(text))
                expected = outcome(fn, *args)
                got = outcome(cfn, *args)
                assert shown(got) == shown(expected), (case, dialect, convs, args)


def test_keeps_is_the_converters_own_result() -> None:
    """A converter's ``keeps`` (C returns such a value as it is) holds for every value of that type it accepts."""
    found = 0
    for dialect in ("mysql", "postgresql", "sqlite"):
        for base in BASE_TYPES:
            for scale in (None, 0, 2):
                conv = converter(ColumnSchema("c", 0, base), dialect, table="t", scale=scale)
                k = keeps(conv) if conv is not None else None
                if k is None:
                    continue
                found += 1
                typ, method = k
                for text in DECIMALS:
                    v = typ(text)
                    if getattr(v, method)():
                        assert conv(v) is v
    assert found >= 2


def test_rendering_leaves_no_utf8_copy_on_the_rows_strings(c_text: rowtext.RowText) -> None:
    """A row's str lives as long as its batch: C must not cache a UTF-8 copy on it (that would double the memory of
    non-ASCII text held by a batch in flight); ``sys.getsizeof`` counts such a cache."""
    lit = mysql_literal_function(connection(0))
    texts = ["żółw 🐢 'x'" * 100, "日本語\\" * 50]
    sizes = [sys.getsizeof(t) for t in texts]
    c_text.copy_text([tuple(texts)])
    c_text.mysql_statements([tuple(texts)], "H", "T", 10**6, lit)
    assert [sys.getsizeof(t) for t in texts] == sizes
