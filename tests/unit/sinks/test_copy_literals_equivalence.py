"""The C literal rows of the initial copy into MySQL/MariaDB (sinks.sql.dialect.copy_literals) against the parsed path
they stand in for: the same bytes, or C declines.

The reference is the parsed path's own functions, line by line as ``PgSnapshotReader.read_chunk`` and the SQL sink's
MySQL output run them: split on TAB, ``copy_unescape``, the columns' PostgreSQL parsers (``types.row_parser``), the
MySQL converters with the target's scale (``values.converter``, through ``binding.row_function`` with the upstream
text as ``convert_rows`` does) and ``mysql_literal_function``'s row renderer. Lines of every kind C renders are
generated from a fixed seed, in the forms PostgreSQL's output functions write (which C must render: every one is
checked to be accepted) and in forms they never write or that the parsed path refuses (NaN, infinities, digits beyond
the target scale, BC and 5-digit years, other offsets, invalid dates, leading zeros, ``-0``, escapes in non-text
values, wrong column counts), for which C must either make the same text or decline -- never render a value the
parsed path refuses.

Every line is also rendered as ``LOAD DATA`` input (``LoadRows``, the load path of sinks/sql/ops/load_copy.py): C
must decline exactly the lines it declines as literals, and make of the others each converted parameter's literal
without its quotes (strings with the load format's escapes, NULL as ``\\N``).
"""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from typing import Any

import pymysql.converters
import pytest

from cdc.errors import DataRejected
from cdc.events import ColumnSchema, TableName, TableSchema
from sinks.sql.dialect import copy_literals
from sinks.sql.dialect.copy_literals import LiteralRows, LoadRows, column_kinds
from sinks.sql.dialect.values import converter, mysql_literal_function
from sinks.sql.target.binding import row_function
from upstream.postgres import types
from upstream.postgres.rowfetch import copy_unescape

pytestmark = pytest.mark.unit

SEED = 22_8


class _Conn:
    """What ``mysql_literal_function`` reads of a PyMySQL connection (backslash escapes on, utf8mb4)."""

    server_status = 0

    @staticmethod
    def escape(v: Any) -> str:
        return str(pymysql.converters.escape_item(v, "utf8mb4"))


LITERAL = mysql_literal_function(_Conn())


@pytest.fixture(scope="module", autouse=True)
def _native() -> None:
    if copy_literals.native() is None:
        pytest.skip("the C literal renderer cannot be built here (no compiler or Python headers)")


def _schema(types_: Sequence[str]) -> TableSchema:
    cols = tuple(ColumnSchema(f"c{i}", 0, t) for i, t in enumerate(types_))
    return TableSchema(TableName("public", "t"), cols, key=("c0",))


def python_literal(line: str, schema: TableSchema, scales: Sequence[int | None]) -> str | None:
    """The parsed path's literal row of one COPY line, or None where it refuses the line (it raises)."""
    params = python_params(line, schema, scales)
    if params is None:
        return None
    try:
        return str(LITERAL.rows(tuple(map(type, params)))(params))  # type: ignore[attr-defined]
    except (DataRejected, pymysql.err.ProgrammingError, ValueError, TypeError):
        return None


@functools.cache
def parsed_path(schema: TableSchema, scales: tuple[int | None, ...]) -> tuple[Callable[..., Any], Any, Any]:
    """The parsed path's functions for ``schema`` into a target of ``scales``: the row parser and the converting row
    functions with and without the upstream text. Built once per schema and scales, as the reader and the SQL sink
    build them once per table (they are generated code: building them per line was most of this module's time)."""
    cols = schema.columns
    parse = types.row_parser(tuple(types.parser_for(c.base_type, c.is_array) for c in cols))
    convs = {i: cv for i, c in enumerate(cols) if (cv := converter(c, "mysql", table="t", scale=scales[i])) is not None}
    return parse, row_function(len(cols), convs, with_text=True), row_function(len(cols), convs)


def python_params(line: str, schema: TableSchema, scales: Sequence[int | None]) -> Sequence[Any] | None:
    """The parsed path's converted parameters of one COPY line, or None where it refuses the line (it raises)."""
    texts: list[str | None] = [copy_unescape(f) for f in line.split("\t")] if "\\" in line else line.split("\t")  # type: ignore[misc]
    if len(texts) != len(schema.columns):
        return None
    parse, with_text, plain = parsed_path(schema, tuple(scales))
    try:
        row = parse(texts)
    except (ValueError, ArithmeticError):
        return None
    try:
        return with_text(row, texts) if with_text is not None else plain(row) if plain is not None else row  # type: ignore[no-any-return]
    except (DataRejected, pymysql.err.ProgrammingError, ValueError, TypeError):
        return None


_LOAD_ESCAPES = {0: "\\0", 9: "\\t", 10: "\\n", 13: "\\r", 92: "\\\\"}


def python_load(line: str, schema: TableSchema, scales: Sequence[int | None]) -> str | None:
    """The LOAD DATA line the load path must send for one COPY line: each converted parameter's literal without its
    quotes (a string: itself with the load format's escapes), ``\\N`` for NULL; None where the literal path refuses
    the line."""
    if python_literal(line, schema, scales) is None:
        return None
    params = python_params(line, schema, scales)
    assert params is not None
    out = []
    for v in params:
        if v is None:
            out.append("\\N")
        elif isinstance(v, str):
            out.append(v.translate(_LOAD_ESCAPES))
        else:
            lit = str(LITERAL(v))
            out.append(lit[1:-1] if lit.startswith("'") else lit)
    return "\t".join(out) + "\n"


def c_load(line: str, schema: TableSchema, scales: Sequence[int | None]) -> str | None:
    kinds = column_kinds(schema)
    assert kinds is not None
    rows = LoadRows(kinds, scales, 1 << 30, 1 << 30)
    bodies = rows.feed((line + "\n").encode())
    if bodies is None:
        return None
    assert len(bodies) == 1 and bodies[0][1] == 1 and rows.rows == 1 and rows.finish()
    return bodies[0][0].decode()


def both(line: str, schema: TableSchema, scales: Sequence[int | None]) -> str | None:
    """C's literal row of ``line``, after checking that C's load line is what the load path must send for it
    (:func:`python_load`) and that C declines the same lines in both forms."""
    got = c_literal(line, schema, scales)
    load = c_load(line, schema, scales)
    assert (got is None) == (load is None), (line, got, load)
    if load is not None:
        assert load == python_load(line, schema, scales), (line, load)
    return got


def c_literal(line: str, schema: TableSchema, scales: Sequence[int | None]) -> str | None:
    kinds = column_kinds(schema)
    assert kinds is not None
    rows = LiteralRows(kinds, scales, 1 << 30, 1 << 30)
    bodies = rows.feed((line + "\n").encode())
    if bodies is None:
        return None
    assert len(bodies) == 1 and rows.rows == 1 and rows.finish()
    return bodies[0].decode()


# ---- values: (canonical, as PostgreSQL writes them) and odd ----------------------------------------------------------
def _copy_escape(s: str) -> str:
    out = s.replace("\\", "\\\\")
    for ch, esc in (("\b", "\\b"), ("\f", "\\f"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\v", "\\v")):
        out = out.replace(ch, esc)
    return out


_ALPHABET = "aZ09 _-'\"\\\n\r\t\b\f\v\x1a\x01%é中😀ß,()\u2028"


def _text(rng: random.Random) -> str:
    return _copy_escape("".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 12))))


def _int(rng: random.Random, bits: int) -> str:
    return str(rng.choice([0, 1, -1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1)), rng.randrange(-2 ** (bits - 1),
                                                                                             2 ** (bits - 1))]))


def _numeric(rng: random.Random) -> str:
    ip = rng.choice(["0", "1", "12", "9" * rng.randrange(1, 40), str(rng.randrange(10 ** 6))])
    frac = "".join(rng.choice("0123456789") for _ in range(rng.randrange(0, 9)))
    if rng.random() < 0.3:
        frac = frac[:2] + "000"
    s = ip + ("." + frac if frac else "")
    return ("-" if rng.random() < 0.4 and s.strip("0.") else "") + s


def _float(rng: random.Random, single: bool) -> str:
    v = rng.choice([0.0, -0.0, 1.0, 0.1, 1e16, 1e15, 123456.789, 1.5e-5, 5e-324, 1.7976931348623157e308,
                    rng.uniform(-1e6, 1e6), rng.uniform(-1, 1) * 10 ** rng.randrange(-30, 30)])
    if single:
        v = struct.unpack("f", struct.pack("f", v if abs(v) < 3e38 else 1.0))[0]
        text = f"{v:.9g}"
    else:
        text = repr(v)
    text = text.removesuffix(".0")  # float8out writes 100000, not 100000.0
    return text.replace("e+0", "e+").replace("e-0", "e-")


def _date(rng: random.Random) -> str:
    return (date(1, 1, 1) + timedelta(days=rng.randrange(0, 3_652_059))).isoformat()


def _clock(rng: random.Random) -> str:
    t = f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
    digits = rng.choice([0, 0, 1, 3, 6])
    frac = "".join(rng.choice("0123456789") for _ in range(digits)).rstrip("0")
    return t + ("." + frac if frac else "")


def _uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


CANONICAL: dict[str, Callable[[random.Random], str]] = {
    "int2": lambda r: _int(r, 16), "int4": lambda r: _int(r, 32), "int8": lambda r: _int(r, 64),
    "bool": lambda r: r.choice("tf"), "text": _text, "varchar": _text, "bpchar": lambda r: _text(r) + "  ",
    "name": _text, "numeric": _numeric, "float4": lambda r: _float(r, True), "float8": lambda r: _float(r, False),
    "date": _date, "time": _clock, "timestamp": lambda r: f"{_date(r)} {_clock(r)}",
    "timestamptz": lambda r: f"{_date(r)} {_clock(r)}+00", "uuid": _uuid,
}

ODD: dict[str, list[str]] = {
    "int4": ["+5", "05", "-0", "", " 5", "5 ", "1_000", "1e3", "\\N5", "9" * 50, "٣", "\\x35"],
    "int8": ["-", "00", "99999999999999999999"],
    "bool": ["true", "T", "1", "", "t "],
    "text": ["\\", "a\\", "\\N\\N", "\\x41", "\\101", "\\q"],
    "numeric": ["NaN", "Infinity", "-Infinity", ".5", "5.", "00.5", "-.5", "1e5", "1E-7", "+1", "1.2.3", "0.0000001",
                "0.00000010", "-0", "-0.00", "123456789012345678901234567890.123456789", "1,5"],
    "float8": ["NaN", "Infinity", "-Infinity", "inf", "1e999", "-1e999", "1_0", " 1", "0x10", "1e", ".", "-0", "1e-400",
               "4.9e-324", "1E5", "+1.5", "1.", ".5"],
    "float4": ["NaN", "3.4028235e+38", "1e-45"],
    "date": ["0001-01-01", "9999-12-31", "2024-02-29", "2023-02-29", "2024-13-01", "2024-00-10", "2024-04-31",
             "0000-01-01", "10000-01-01", "0044-03-15 BC", "infinity", "-infinity", "2024-1-01", "20240101",
             "2024/01/01"],
    "time": ["24:00:00", "23:59:60", "12:00", "12:00:00.1234567", "12:00:00.", "1:00:00", "12:60:00",
             "12:00:00+00", "12:00:00.000000"],
    "timestamp": ["2024-01-01T00:00:00", "2024-01-01 24:00:00", "10000-01-01 00:00:00", "0044-03-15 00:00:00 BC",
                  "infinity", "2024-02-30 00:00:00", "2024-01-01 00:00:00+00", "2024-01-01 00:00"],
    "timestamptz": ["2024-01-01 00:00:00+01", "2024-01-01 00:00:00+00:00", "2024-01-01 00:00:00", "infinity",
                    "2024-01-01 00:00:00.5+00", "2024-01-01 00:00:00-00", "0001-01-01 00:00:00+00",
                    "2024-01-01 00:00:00+0030"],
    "uuid": ["0B6E0F0C-1D2E-4F3A-8B9C-0D1E2F3A4B5C", "0b6e0f0c1d2e4f3a8b9c0d1e2f3a4b5c",
             "{0b6e0f0c-1d2e-4f3a-8b9c-0d1e2f3a4b5c}", "0b6e0f0c-1d2e-4f3a-8b9c-0d1e2f3a4b5"],
}


def test_every_upstream_type_of_the_c_path_has_generated_values() -> None:
    assert set(CANONICAL) == set(copy_literals.KINDS)


@pytest.mark.parametrize("typ", sorted(copy_literals.KINDS))
def test_canonical_values_are_rendered_in_c_exactly_as_the_parsed_path_renders_them(typ: str) -> None:
    rng = random.Random(f"{SEED}-{typ}")
    schema = _schema(["int8", typ])
    scales: list[int | None] = [None, None]
    declined = []
    for i in range(3000):
        value = "\\N" if i % 50 == 0 else CANONICAL[typ](rng)
        line = f"{i}\t{value}"
        want, got = python_literal(line, schema, scales), both(line, schema, scales)
        if got is None:
            declined.append((value, want))
            continue
        assert want is not None, f"C renders {value!r} as {got!r}, the parsed path refuses it"
        assert got == want, (value, got, want)
    # the non-finite floats of float4's rounding aside, C takes every canonical value
    assert not [d for d in declined if d[1] is not None], declined[:10]


@pytest.mark.parametrize("typ", sorted(ODD))
def test_odd_forms_are_rendered_identically_or_declined(typ: str) -> None:
    schema = _schema(["int8", typ])
    for value in ODD[typ]:
        for scales in ([None, None], [None, 2]):
            line = f"1\t{value}"
            want, got = python_literal(line, schema, scales), both(line, schema, scales)
            if got is not None:
                assert got == want, (value, got, want)
    # the values of docs/limits.md never pass as something else
    for bad in ("NaN", "Infinity"):
        assert both(f"1\t{bad}", _schema(["int8", "numeric"]), [None, None]) is None
        assert both(f"1\t{bad}", _schema(["int8", "float8"]), [None, None]) is None


@pytest.mark.parametrize("scale", [0, 2, 5])
def test_a_narrower_target_scale_is_declined_where_the_parsed_path_refuses_and_kept_where_it_does_not(
        scale: int) -> None:
    rng = random.Random(f"{SEED}-scale-{scale}")
    schema = _schema(["int8", "numeric"])
    scales = [None, scale]
    refused = taken = 0
    for i in range(3000):
        line = f"{i}\t{_numeric(rng)}"
        want, got = python_literal(line, schema, scales), both(line, schema, scales)
        if want is None:
            refused += 1
            assert got is None, (line, got)  # refused, never rounded
        else:
            taken += 1
            assert got == want, (line, got, want)
    assert refused and taken


def test_rows_of_every_kind_together_and_wrong_column_counts() -> None:
    rng = random.Random(f"{SEED}-rows")
    typs = sorted(copy_literals.KINDS)
    schema = _schema(["int8", *typs])
    scales: list[int | None] = [None] * len(schema.columns)
    for i in range(1000):
        vals = ["\\N" if rng.random() < 0.1 else CANONICAL[t](rng) for t in typs]
        line = "\t".join([str(i), *vals])
        want, got = python_literal(line, schema, scales), both(line, schema, scales)
        assert want is not None and got == want, (line, got, want)
    for line in ["1", "1\t" + "\t".join(["\\N"] * len(typs)) + "\t\\N", "1\t\\N"]:
        assert python_literal(line, schema, scales) is None and both(line, schema, scales) is None


def test_blocks_cut_anywhere_give_the_same_rows_in_bodies_within_the_limits() -> None:
    rng = random.Random(f"{SEED}-blocks")
    schema = _schema(["int8", "text", "numeric", "timestamp"])
    scales: list[int | None] = [None, None, None, None]
    lines = [f"{i}\t{_text(rng)}\t{_numeric(rng)}\t{CANONICAL['timestamp'](rng)}" for i in range(2000)]
    want = [python_literal(line, schema, scales) for line in lines]
    data = ("\n".join(lines) + "\n").encode()
    want_loads = "".join(str(python_load(line, schema, scales)) for line in lines)
    kinds = column_kinds(schema)
    assert kinds is not None
    for _ in range(20):
        max_rows, max_bytes = rng.randrange(1, 300), rng.randrange(50, 20_000)
        rows = LiteralRows(kinds, scales, max_bytes, max_rows)
        bodies: list[bytes] = []
        pos = 0
        while pos < len(data):
            step = rng.randrange(1, 5000)
            got = rows.feed(data[pos:pos + step])
            assert got is not None
            bodies += got
            pos += step
        assert rows.finish() and rows.rows == len(lines)
        single = {w.encode() for w in want if w is not None}
        for b in bodies:  # a body of one row may exceed max_bytes (a row is never split)
            assert len(b) <= max_bytes or b in single, len(b)
        assert b",".join(bodies).decode() == ",".join(w for w in want if w is not None)
        loads = LoadRows(kinds, scales, max_bytes, max_rows)
        pieces: list[tuple[bytes, int]] = []
        pos = 0
        while pos < len(data):
            step = rng.randrange(1, 5000)
            got_load = loads.feed(data[pos:pos + step])
            assert got_load is not None
            pieces += got_load
            pos += step
        assert loads.finish() and loads.rows == len(lines)
        for body, n in pieces:  # (text rows escape their newlines: one per row)
            assert body.count(b"\n") == n <= max_rows and (len(body) <= max_bytes or n == 1)
        assert b"".join(b for b, _ in pieces).decode() == want_loads
    ints = LiteralRows(bytes(kinds[:1]), [None], 1 << 20, 7)  # (integers: counting rows by "),(" is safe)
    int_bodies = ints.feed(b"".join(b"%d\n" % i for i in range(100)))
    assert int_bodies is not None and [b.count(b"),(") + 1 for b in int_bodies] == [7] * 14 + [2]
    partial = LiteralRows(kinds, scales, 1000, 10)
    assert partial.feed(data[:-1]) is not None and not partial.finish()


def test_a_table_with_a_column_c_does_not_render_has_no_kinds() -> None:
    assert column_kinds(_schema(["int8", "bytea"])) is None
    arr = TableSchema(TableName("public", "t"), (ColumnSchema("c0", 0, "int8"), ColumnSchema("c1", 0, "int4", True)),
                      key=("c0",))
    assert column_kinds(arr) is None
    assert column_kinds(_schema(["int8", "jsonb"])) is None
