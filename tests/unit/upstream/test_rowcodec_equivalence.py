"""The C row codec against the pure-Python reference (upstream.postgres.rowcodec): the same values, the same errors.

Rows of every column type PostgreSQL has a builtin parser for (and arrays, user types), with values in the forms
PostgreSQL's output functions write and in forms they never write (which the C path must hand to Python), NULLs,
unchanged TOAST values and binary values, are generated from a fixed seed; each is run through both codecs as a
value row, as Insert/Update/Delete messages (plain, with old key or full old rows), through the mounter, and as
damaged messages (truncated, a byte changed, bytes appended, not ``bytes``). Every outcome must be identical:
the same value types and ``repr`` (so a Decimal keeps its scale and a datetime its tzinfo), or the same exception
type and message.
"""

from __future__ import annotations

import contextlib
import random
import struct
import uuid
from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import pytest

from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from processor.mounter import Mounter
from tests import rowcodecs
from tests.pgoutput_wire import enc_tuple
from upstream.base import encode_payload
from upstream.postgres import rowcodec, types
from upstream.postgres.rowcodec import RowCodec
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.unit

RELID = 16390
SEED = 22_5


def test_the_c_codec_builds_where_a_compiler_is() -> None:
    """Where cc and Python.h exist the C codec must build and load (else every [c] test here would skip)."""
    if not rowcodecs.can_build():
        pytest.skip("no C compiler or Python headers here")
    assert rowcodec.native() is not None
    assert rowcodec.best().name == "c" or rowcodec.best() is rowcodec.PYTHON


@pytest.fixture(scope="module")
def c() -> RowCodec:
    return rowcodecs.codec_named("c")


PY = rowcodec.PYTHON


# ---- generated values ------------------------------------------------------------------------------------------
def _date(rng: random.Random) -> str:
    d = date(1, 1, 1) + timedelta(days=rng.randrange(0, 3_652_059))
    return d.isoformat()


def _time(rng: random.Random, digits: int | None = None) -> str:
    t = f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
    n = rng.choice([0, 0, 1, 2, 3, 4, 5, 6]) if digits is None else digits
    if n:
        t += "." + "".join(rng.choice("0123456789") for _ in range(n))
    return t


_ODD_DATES = ["infinity", "-infinity", "0044-03-15 BC", "10000-01-01", "2026-02-30", "2026-13-01", "0000-01-01",
              "2026-1-01", "20260101", "2026-01-01x", "", "2026-02-29", "2024-02-29", "９９９９-01-01"]
_ODD_TIMES = ["24:00:00", "25:00:00", "12:60:00", "12:00:60", "12:00", "12:00:00.", "12:00:00.1234567", "1:00:00",
              "12:00:00.12a", "24:00:00.5", "12:00:00+00"]
_OFFSETS = ["+00", "+00", "+00", "+05:30", "-08", "+00:00", "-00", "+14", "+00:00:01", "+0", "Z", "+00 ", ""]


def value_text(base: str, rng: random.Random) -> str:
    """One text value for a column of ``base`` type: usually what PostgreSQL writes, sometimes not."""
    odd = rng.random() < 0.2
    if base in ("int2", "int4", "int8", "oid", "xid", "xid8", "cid"):
        if odd:
            return rng.choice(["+5", " 5", "5 ", "5_000", "", "-", "--1", "١٢", "0x10", "007", "-0", "1.0",
                               "9" * 19, "-" + "9" * 19, "99999999999999999999999999", "1e3", "٣"])
        return str(rng.choice([0, 1, -1, rng.randrange(-2**15, 2**15), rng.randrange(-2**31, 2**31),
                               rng.randrange(-2**63, 2**63), 10**17, -10**17, 999_999_999_999_999_999,
                               -999_999_999_999_999_999, 10**18, rng.randrange(2**64)]))
    if base == "numeric":
        return rng.choice(["1.50", "-0.001", "NaN", "Infinity", "-Infinity", "0", "1e5", "abc", "1.2.3",
                           "123456789012345678901234567890.123", f"{rng.randrange(-10**9, 10**9)}.{rng.randrange(100):02d}"])
    if base in ("float4", "float8"):
        if odd:
            return rng.choice(["abc", "1_0", " 1.5 ", "inf", "nan", "", "1e500", "0x1p3", "١.٥"])
        return rng.choice(["1.5", "-0", "NaN", "Infinity", "-Infinity", "1e+100", "1.7976931348623157e+308",
                           "5e-324", repr(rng.uniform(-1e9, 1e9)), repr(rng.random())])
    if base == "bool":
        return rng.choice(["t", "f", "t", "f", "true", "", "T", "tt", "1"]) if odd else rng.choice("tf")
    if base == "date":
        return rng.choice(_ODD_DATES) if odd else _date(rng)
    if base == "time":
        return rng.choice(_ODD_TIMES) if odd else _time(rng)
    if base in ("timestamp", "timestamptz"):
        if odd:
            return rng.choice(["infinity", "-infinity", "0044-03-15 12:00:00 BC", "10000-01-01 00:00:00",
                               "2026-01-01T00:00:00", "2026-01-01 00:00", "0001-01-01 00:00:00+01",
                               "9999-12-31 23:59:59-01", "2026-02-30 00:00:00", "2026-01-01  00:00:00",
                               f"{_date(rng)} {rng.choice(_ODD_TIMES)}", "2026-01-01 24:00:00+00"])
        text = f"{_date(rng)} {_time(rng)}"
        if base == "timestamptz":
            text += rng.choice(_OFFSETS)
        elif rng.random() < 0.05:
            text += "+00"  # a timestamp with an offset: the Python parser refuses it
        return text
    if base == "uuid":
        u = str(uuid.UUID(int=rng.getrandbits(128)))
        return rng.choice([u.upper(), "{" + u + "}", "not-a-uuid", u.replace("-", "")]) if odd else u
    if base == "bytea":
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
        return rng.choice(["\\x" + raw.hex(), "abc", "a\\\\b", "\\001\\377", "\\x0", "\\xzz", "\\q"])
    if base == "bpchar":
        return rng.choice(["ab  ", "", "x"])
    return rng.choice(["", "it's", "NULL", 'a "quoted" b', "héllo wörld ✓", "日本語 🎉", "x" * 300, "\\", "{}",
                       "1 day 02:03:04", '{"a": [1, 2]}', "t", "1.5"])


def array_text(base: str, rng: random.Random) -> str:
    if rng.random() < 0.15:
        return rng.choice(["{}", "[0:1]={1,2}", "{1,2", "{{1,2},{3,4}}", '{"a b",NULL,"NULL"}', "{,}", "junk"])
    items = ["NULL" if rng.random() < 0.2 else value_text(base, rng) for _ in range(rng.randrange(4))]
    quoted = ['"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' if i != "NULL" else i for i in items]
    return "{" + ",".join(quoted) + "}"


BASES = sorted({name for name, _ in types.BUILTIN_TYPES.values()} | {"mood"})  # "mood": a user type (enum)


def columns(rng: random.Random, n: int) -> list[tuple[str, bool]]:
    return [(rng.choice(BASES), rng.random() < 0.1) for _ in range(n)]


def texts_for(cols: list[tuple[str, bool]], rng: random.Random, extra: bool = False) -> list[Any]:
    """Values of a tuple: text, None, and with ``extra`` also UNCHANGED and binary values."""
    out: list[Any] = []
    for base, is_array in cols:
        r = rng.random()
        if r < 0.12:
            out.append(None)
        elif extra and r < 0.17:
            out.append(UNCHANGED)
        elif extra and r < 0.19:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(4))))
        else:
            out.append(array_text(base, rng) if is_array else value_text(base, rng))
    return out


# ---- comparing outcomes -------------------------------------------------------------------------------------
def canon(v: Any) -> Any:
    """A value as the comparison sees it: its exact type and repr, recursively."""
    if isinstance(v, list | tuple):
        return (type(v).__name__, [canon(x) for x in v])
    if isinstance(v, dict):
        return ("dict", [(k, canon(x)) for k, x in v.items()])
    if isinstance(v, RowChange):
        return ("RowChange", v.op, v.schema.version, v.commit_ts, repr(v.commit_time), canon(v.values),
                canon(v.old_values), canon(v.extra), canon(parsed(v.row)), canon(v.row_text))
    if hasattr(v, "__dataclass_fields__"):
        return (type(v).__name__, [(f, canon(getattr(v, f))) for f in v.__dataclass_fields__])
    tz = getattr(v, "tzinfo", None)
    return (type(v).__name__, repr(v), None if tz is None else repr(tz))


def parsed(row: Any) -> Any:
    """A row as a reader uses it: a deferred row (``Mounter(..., defer=True)``) as its tuple."""
    return row() if row is not None and not isinstance(row, tuple) else row


def outcome(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", canon(fn()))
    except Exception as e:  # noqa: BLE001 - compared, not handled
        return ("raised", type(e).__name__, str(e))


def same(a: Callable[[], Any], b: Callable[[], Any], what: object) -> None:
    got, want = outcome(a), outcome(b)
    assert got == want, what


# ---- tests ------------------------------------------------------------------------------------------------------
def test_row_parsers_agree_on_every_type(c: RowCodec) -> None:
    rng = random.Random(SEED)
    for _ in range(4000):
        cols = columns(rng, rng.randrange(1, 9))
        parsers = tuple(types.parser_for(b, a) for b, a in cols)
        texts = texts_for(cols, rng)
        p_c, p_py = c.row_parser(parsers), PY.row_parser(parsers)
        same(lambda: p_c(texts), lambda: p_py(texts), (cols, texts))  # noqa: B023 - called at once
        same(lambda: p_c(tuple(texts)), lambda: p_py(tuple(texts)), (cols, texts))  # noqa: B023
    for base in BASES:  # each type alone, many values, including a long row that is not a list
        p = (types.parser_for(base, False),)
        for _ in range(200):
            t = value_text(base, rng)
            same(lambda: c.row_parser(p)([t]), lambda: PY.row_parser(p)([t]), (base, t))  # noqa: B023


def test_row_parsers_agree_on_odd_calls(c: RowCodec) -> None:
    parsers = (types.parser_for("int4", False), types.parser_for("text", False), types.parser_for("numeric", False))
    for arg in (["1", "a", "2.5", "extra"], ["1", "a"], [], ("1", None, None), iter(["1", "a", "1"]), ["1", 5, "1"],
                [b"1", "a", "1"], [UNCHANGED, UNCHANGED, None], "123", None):
        same(lambda: c.row_parser(parsers)(arg), lambda: PY.row_parser(parsers)(arg), arg)  # noqa: B023
    assert c.row_parser(())([]) == PY.row_parser(())([]) == ()


def messages(rng: random.Random, cols: list[tuple[str, bool]]) -> list[bytes]:
    """Insert, Update (plain, with a 'K' or an 'O' old tuple) and Delete messages of one generated row."""
    head = struct.pack(">I", RELID)
    new, old = texts_for(cols, rng, extra=True), texts_for(cols, rng, extra=True)
    plain = texts_for(cols, rng)
    return [b"I" + head + b"N" + enc_tuple(plain), b"I" + head + b"N" + enc_tuple(new),
            b"U" + head + b"N" + enc_tuple(plain), b"U" + head + b"N" + enc_tuple(new),
            b"U" + head + b"K" + enc_tuple(old) + b"N" + enc_tuple(new),
            b"U" + head + b"O" + enc_tuple(old) + b"N" + enc_tuple(new),
            b"D" + head + b"K" + enc_tuple(old), b"D" + head + b"O" + enc_tuple(old)]


def damaged(rng: random.Random, msg: bytes) -> list[Any]:
    cut = rng.randrange(len(msg))
    pos = rng.randrange(len(msg))
    flipped = msg[:pos] + bytes([rng.randrange(256)]) + msg[pos + 1:]
    return [msg[:cut], flipped, msg + b"n", msg + b"\x00", b"", msg[:1], msg[:6], bytearray(msg), memoryview(msg)]


def row_parsers(c: RowCodec, cols: list[tuple[str, bool]]) -> tuple[Any, Any]:
    """The C and the Python row parser of ``cols``: made once per schema, as the decoder makes them (they are
    generated code: making them for every message was most of this module's time)."""
    parsers = tuple(types.parser_for(b, a) for b, a in cols)
    return c.row_parser(parsers), PY.row_parser(parsers)


def check_message(c: RowCodec, msg: Any, cols: list[tuple[str, bool]], p_c: Any, p_py: Any) -> None:
    """Every entry point of both codecs on ``msg`` of a table of ``cols`` (``p_c``, ``p_py``: its row parsers)."""
    same(lambda: c.parse_change(msg), lambda: PY.parse_change(msg), msg)
    same(lambda: c.plain_change_relid(msg), lambda: PY.plain_change_relid(msg), msg)
    same(lambda: c.plain_row(msg, 0, p_c, len(cols)), lambda: PY.plain_row(msg, 0, p_py, len(cols)), msg)
    if isinstance(msg, bytes):
        prefixed = b"\x00\x00\x00\x09" + msg
        same(lambda: c.insert_values(prefixed, 4), lambda: PY.insert_values(prefixed, 4), msg)
        same(lambda: c.plain_row(prefixed, 4, p_c, len(cols)), lambda: PY.plain_row(prefixed, 4, p_py, len(cols)),
             msg)
        same(lambda: c.plain_row(prefixed, 4, p_c, len(cols) + 1),
             lambda: PY.plain_row(prefixed, 4, p_py, len(cols) + 1), msg)
    same(lambda: c.insert_values(msg, 0), lambda: PY.insert_values(msg, 0), msg)


def test_messages_agree(c: RowCodec) -> None:
    rng = random.Random(SEED + 1)
    for _ in range(600):
        cols = columns(rng, rng.randrange(0, 7))
        p_c, p_py = row_parsers(c, cols)
        for msg in messages(rng, cols):
            check_message(c, msg, cols, p_c, p_py)
            for bad in damaged(rng, msg):
                check_message(c, bad, cols, p_c, p_py)
    p_c, p_py = row_parsers(c, [("int4", False)])
    for msg in (b"T" + struct.pack(">iBI", 1, 2, RELID), b"B" + bytes(20), b"Ixxxx", b"I" + bytes(4) + b"N\xff\xff"):
        check_message(c, msg, [("int4", False)], p_c, p_py)
    for args in ((b"I" + bytes(4) + b"N\x00\x00", -1), (b"I" + bytes(4) + b"N\x00\x00", 99), ("str", 0)):
        same(lambda: c.insert_values(*args), lambda: PY.insert_values(*args), args)  # noqa: B023


def test_mounters_agree(c: RowCodec) -> None:
    """The mounter with the C codec (plain rows built in C) and with the Python one: the same RowChanges, the same
    errors, for every message kind, schemas of every type, the wrong relation, unknown versions."""
    rng = random.Random(SEED + 2)
    schemas: dict[int, TableSchema] = {}
    for version in range(1, 81):
        cols = columns(rng, rng.randrange(1, 7))
        key = rng.sample(range(len(cols)), rng.randrange(1, len(cols) + 1))
        schemas[version] = TableSchema(
            TableName("public", f"t{version}"),
            tuple(ColumnSchema(f"c{i}", 0, b, a, b, nullable=i not in key, is_key=i in key) for i, (b, a) in
                  enumerate(cols)), tuple(f"c{i}" for i in key), rng.choice("dfi"),
            rng.choice([RELID, RELID, 0, RELID + 1]), version)
    m_c = Mounter(PgChangeDecoder(schemas.__getitem__, c))
    m_py = Mounter(PgChangeDecoder(schemas.__getitem__, PY))
    for _ in range(3000):
        version = rng.choice([*schemas, 999])
        cols = [(col.base_type, col.is_array) for col in schemas[version].columns] if version in schemas else \
            columns(rng, 2)
        if rng.random() < 0.1:  # a tuple of another shape than the schema's
            cols = cols + [("text", False)] if rng.random() < 0.5 else cols[:-1]
        for msg in messages(rng, cols) + [b"T" + struct.pack(">iBI", 1, 1, RELID)]:
            payload = encode_payload(version, msg)
            for p in (payload, rng.choice(damaged(rng, payload))):
                same(lambda: m_c.mount(p, 77, 1.5), lambda: m_py.mount(p, 77, 1.5), (version, p))  # noqa: B023
                if isinstance(p, bytes) and len(p) >= 5:
                    same(lambda: m_c.mount(p, 77, 1.5).values, lambda: m_py.mount(p, 77, 1.5).values,  # noqa: B023
                         (version, p))


def test_mounted_rows_behave_like_python_ones(c: RowCodec) -> None:
    """A RowChange built in C is an ordinary one: values built lazily from ``row``, assignable, comparable,
    picklable, its ``extra`` its own dict."""
    import pickle

    schema = TableSchema(TableName("public", "t"), (ColumnSchema("id", 23, "int4", is_key=True, nullable=False),
                                                    ColumnSchema("v", 1700, "numeric")), ("id",), "d", RELID, 1)
    m_c = Mounter(PgChangeDecoder({1: schema}.__getitem__, c))
    m_py = Mounter(PgChangeDecoder({1: schema}.__getitem__, PY))
    payload = encode_payload(1, b"I" + struct.pack(">I", RELID) + b"N" + enc_tuple(["7", "1.50"]))
    a, b = m_c.mount(payload, 5, 2.0), m_py.mount(payload, 5, 2.0)
    assert type(a) is RowChange and a == b and a.row == (7, b.row[1]) and a.row_text == ["7", "1.50"]
    assert pickle.loads(pickle.dumps(a)) == a
    assert a.extra is not m_c.mount(payload, 5, 2.0).extra
    a.extra["x"] = 1
    assert m_c.mount(payload, 5, 2.0).extra == {}
    assert a.values == {"id": 7, "v": b.row[1]}
    a.values = {"id": 8, "v": None}
    assert a.row is None and a.row_text is None and a.key_values() == (8,)


def test_deferred_mounts_agree(c: RowCodec) -> None:
    """The mounter asked to defer (a sink that writes rows by their text, ``sinks.base.TextRows``): every RowChange,
    read in full, is the Python reference's, errors included, for every message kind and column type; and some
    inserts were in fact deferred (``row`` not a tuple) while every other change kept its tuple."""
    rng = random.Random(SEED + 3)
    schemas: dict[int, TableSchema] = {}
    for version in range(1, 61):
        cols = columns(rng, rng.randrange(1, 7))
        schemas[version] = TableSchema(
            TableName("public", f"t{version}"),
            tuple(ColumnSchema(f"c{i}", 0, b, a, b, is_key=i == 0) for i, (b, a) in enumerate(cols)), ("c0",), "d",
            RELID, version)
    m_d = Mounter(PgChangeDecoder(schemas.__getitem__, c), defer=True)
    m_py = Mounter(PgChangeDecoder(schemas.__getitem__, PY))
    deferred = 0
    for _ in range(2000):
        version = rng.choice(list(schemas))
        cols = [(col.base_type, col.is_array) for col in schemas[version].columns]
        for msg in messages(rng, cols):
            p = encode_payload(version, msg)
            try:
                got = m_d.mount(p, 77, 1.5)
            except Exception:  # noqa: BLE001 - compared below
                got = None
            if got is not None and not isinstance(got.row, tuple | None):
                assert got.op is OpType.INSERT
                deferred += 1
            same(lambda: m_d.mount(p, 77, 1.5), lambda: m_py.mount(p, 77, 1.5), (version, msg))  # noqa: B023
            same(lambda: m_d.mount(p, 77, 1.5).values, lambda: m_py.mount(p, 77, 1.5).values,  # noqa: B023
                 (version, msg))
    assert deferred > 100


DEFER_COLS = (ColumnSchema("id", 20, "int8", is_key=True, nullable=False), ColumnSchema("ts", 1184, "timestamptz"),
              ColumnSchema("d", 1082, "date"), ColumnSchema("s", 25, "text"), ColumnSchema("b", 16, "bool"),
              ColumnSchema("t", 1083, "time"), ColumnSchema("lt", 1114, "timestamp"), ColumnSchema("n", 1700, "numeric"),
              ColumnSchema("f", 701, "float8"))
_N = [None] * 8


@pytest.mark.parametrize(("texts", "deferred"), [
    (["1", "2026-01-02 03:04:05.123456+00", "2024-02-29", "x\ty", "t", "23:59:59", "2026-01-02 03:04:05", "-12.50",
      "1.5e+30"], True),
    (["-9", *_N], True),
    (["1", None, None, None, None, None, None, "0", "-Infinity"], True),
    (["1", None, None, None, None, None, None, "7", "NaN"], True),
    (["1", "infinity", *_N[1:]], False),  # parsed to str
    (["1", "2026-01-02 03:04:05+05:30", *_N[1:]], False),
    (["1", None, "2023-02-29", *_N[2:]], False),
    (["1", None, None, None, None, "24:00:00", None, None, None], False),
    (["1", None, "0044-03-15 BC", *_N[2:]], False),
    (["9223372036854775807", *_N], False),  # 19 digits: the Python parser's
    (["1", None, None, None, "true", None, None, None, None], False),
    (["1", None, None, None, None, None, "2026-01-02 03:04:60", None, None], False),
    (["1", *_N[:6], "NaN", None], False),
    (["1", *_N[:6], "1.", None], False),
    (["1", *_N[:6], "1e5", None], False),
    (["1", *_N[:7], "1.5E+30"], False),
    (["1", *_N[:7], "inf"], False),
])
def test_deferred_per_column(c: RowCodec, texts: list[Any], deferred: bool) -> None:
    """An insert is stored deferred only when every value is in a form C parses later exactly as now and cannot refuse
    (canonical text with every field in range), decided column by column; otherwise it is parsed at once, as without
    deferring. Read in full, both are the reference's RowChange (or its error)."""
    schema = TableSchema(TableName("public", "t"), DEFER_COLS, ("id",), "d", RELID, 1)
    m_d = Mounter(PgChangeDecoder({1: schema}.__getitem__, c), defer=True)
    m_py = Mounter(PgChangeDecoder({1: schema}.__getitem__, PY))
    payload = encode_payload(1, b"I" + struct.pack(">I", RELID) + b"N" + enc_tuple(texts))
    with contextlib.suppress(Exception):  # (the first payload of a version plans it, in Python)
        m_d.mount(payload, 1, 0.0)
    try:
        got = m_d.mount(payload, 1, 0.0)
    except Exception:  # noqa: BLE001 - the reference must raise the same
        got = None
    if got is not None:
        assert isinstance(got.row, tuple) is not deferred
    same(lambda: m_d.mount(payload, 1, 0.0), lambda: m_py.mount(payload, 1, 0.0), texts)


def test_a_deferred_row_reads_as_its_tuple(c: RowCodec) -> None:
    """A deferred row stands in for its tuple wherever a sink keeps it: length, items, slices, iteration, equality
    and hash are the tuple's; calling it gives the tuple (kept: the same object each time); ``values`` is built from
    it; a column whose parser C only calls (uuid) is never deferred."""
    schema = TableSchema(TableName("public", "t"), DEFER_COLS[:4], ("id",), "d", RELID, 1)
    m_d = Mounter(PgChangeDecoder({1: schema}.__getitem__, c), defer=True)
    payload = encode_payload(1, b"I" + struct.pack(">I", RELID) + b"N" +
                             enc_tuple(["5", "2026-01-02 03:04:05+00", "2024-02-29", "s"]))
    m_d.mount(payload, 1, 0.0)
    ch = m_d.mount(payload, 1, 0.0)
    d = ch.row
    want = Mounter(PgChangeDecoder({1: schema}.__getitem__, PY)).mount(payload, 1, 0.0).row
    assert not isinstance(d, tuple) and len(d) == 4 and d[0] == 5 and d[-1] == "s" and d[1:3] == want[1:3]
    assert list(d) == list(want) and d == want and want == d and hash(d) == hash(want) and d() is d()
    assert ch.values == dict(zip(schema.column_names, want, strict=True))
    assert ch.row == want and ch.key_values() == (5,) and d.parsed
    called = TableSchema(TableName("public", "n"), (DEFER_COLS[0], ColumnSchema("v", 2950, "uuid")), ("id",), "d",
                         RELID, 1)
    m_n = Mounter(PgChangeDecoder({1: called}.__getitem__, c), defer=True)
    payload = encode_payload(1, b"I" + struct.pack(">I", RELID) + b"N" +
                             enc_tuple(["5", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]))
    m_n.mount(payload, 1, 0.0)
    assert type(m_n.mount(payload, 1, 0.0).row) is tuple
