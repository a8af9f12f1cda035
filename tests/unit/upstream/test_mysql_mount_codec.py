"""The decoder side of the MySQL C row codec (upstream/mysql/rowcodec.c: parse_change, insert_values, plain_row and
MySqlMounter) against the Python reference (upstream.mysql.payload and processor.mounter.Mounter's own function).

Stored MySQL changes are generated from a fixed seed: inserts, updates and deletes with whole images, NULLs, absent
values (partial images), UTF-8 text, values that do not parse as their column's type, another relation's id, a wrong
column count, and malformed payloads (truncated, trailing bytes, invalid UTF-8, an unknown kind or length). Each is
parsed and mounted by a decoder with the C functions and by one with the Python ones; the outcomes (the value, or the
DecodeError's message) must be identical, the RowChange slot by slot. And a change with whole images whose values
parse must be mounted by C without calling the Python mounter at all (the point of the C path).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from cdc.errors import DecodeError
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from processor.mounter import Mounter
from tests import rowcodecs
from upstream.base import encode_payload
from upstream.mysql import payload, rowcodec
from upstream.mysql.source import MySqlChangeDecoder

pytestmark = pytest.mark.unit

SEED = 23_7_2
RELID = 4242


def _col(name: str, base: str, key: bool = False) -> ColumnSchema:
    return ColumnSchema(name, 0, base, False, base, nullable=not key, is_key=key)


COLUMNS = (_col("id", "int8", key=True), _col("name", "text"), _col("amount", "numeric"), _col("ts", "timestamp"),
           _col("d", "date"), _col("f", "float8"), _col("ok", "bool"), _col("t", "time"), _col("b", "bytea"))
SCHEMAS = {
    1: TableSchema(TableName("db", "t"), COLUMNS, ("id",), "f", RELID, version=1),
    2: TableSchema(TableName("db", "u"), COLUMNS[:3], ("id",), "f", 0, version=2),  # relation 0: any relation
}

GOOD: dict[str, Callable[[random.Random], str]] = {
    "int8": lambda r: str(r.randrange(-2**63, 2**63)),
    "text": lambda r: "".join(r.choice("aé😀 z\n'\\\0") for _ in range(r.randrange(12))),
    "numeric": lambda r: f"{r.randrange(-10**6, 10**6)}.{r.randrange(100):02d}",
    "timestamp": lambda r: f"{r.randrange(1, 10000):04d}-{r.randrange(1, 13):02d}-{r.randrange(1, 29):02d} "
                           f"{r.randrange(24):02d}:{r.randrange(60):02d}:{r.randrange(60):02d}"
                           + r.choice(["", f".{r.randrange(10**6):06d}"]),
    "date": lambda r: f"{r.randrange(1, 10000):04d}-{r.randrange(1, 13):02d}-{r.randrange(1, 29):02d}",
    "float8": lambda r: repr(r.uniform(-1e9, 1e9)),
    "bool": lambda r: r.choice(["t", "f"]),
    "time": lambda r: f"{r.randrange(24):02d}:{r.randrange(60):02d}:{r.randrange(60):02d}",
    "bytea": lambda r: "\\x" + bytes(r.randrange(256) for _ in range(r.randrange(6))).hex(),
}


def _value(rnd: random.Random, base: str, junk: float, absent: float) -> Any:
    x = rnd.random()
    if x < absent:
        return UNCHANGED
    if x < absent + 0.1:
        return None
    if x < absent + 0.1 + junk:
        return rnd.choice(["", "x", "2024-13-01", "25:00:00", "1e", "maybe", "\\xZZ", "9" * 30])
    return GOOD[base](rnd)


def _row(rnd: random.Random, cols: tuple[ColumnSchema, ...], junk: float, absent: float) -> list[Any]:
    n = len(cols) + (rnd.choice([-1, 1]) if rnd.random() < 0.03 else 0)
    return [_value(rnd, cols[i % len(cols)].base_type, junk, absent) for i in range(max(n, 1))]


def _mangle(rnd: random.Random, raw: bytes) -> bytes:
    how = rnd.randrange(5)
    if how == 0:
        return raw[:rnd.randrange(len(raw))]
    if how == 1:
        return raw + b"\0"
    if how == 2:
        return rnd.choice(b"XTi") .to_bytes(1, "big") + raw[1:]
    if how == 3 and len(raw) > 11:  # a length of -3 where the first value's length is
        return raw[:7] + b"\xff\xff\xff\xfd" + raw[11:]
    return raw + b"\xff" if raw[:1] == b"D" else raw.replace(b"a", b"\xc3", 1)


def _payloads(count: int) -> list[bytes]:
    rnd = random.Random(SEED)
    out = []
    for _ in range(count):
        version = rnd.choice([1, 1, 1, 2])
        cols = SCHEMAS[version].columns
        junk = rnd.choice([0.0, 0.0, 0.02, 0.2])
        absent = rnd.choice([0.0, 0.0, 0.0, 0.1])
        kind = rnd.choice([b"I", b"U", b"D"])
        relid = RELID if rnd.random() < 0.95 else RELID + 1
        new = _row(rnd, cols, junk, absent) if kind != b"D" else None
        old = _row(rnd, cols, junk, absent) if kind != b"I" else None
        raw = payload.encode_partial(kind, relid, new, old)
        if rnd.random() < 0.05:
            raw = _mangle(rnd, raw)
        out.append(encode_payload(version, raw))
    return out


def _decoders() -> tuple[MySqlChangeDecoder, MySqlChangeDecoder]:
    native = rowcodec.native_decoding()
    if native is None:
        if rowcodecs.can_build():
            pytest.fail("the MySQL C row codec does not build although a compiler and Python.h are here")
        pytest.skip("no C compiler or Python headers")
    return (MySqlChangeDecoder(SCHEMAS.__getitem__, rowcodec.PYTHON),
            MySqlChangeDecoder(SCHEMAS.__getitem__, native))


def _outcome(fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(*args))
    except DecodeError as exc:
        return ("error", str(exc))


def _slots(rc: RowChange) -> tuple[Any, ...]:
    """Every slot, ``row``/``row_text`` read before ``values`` (which builds the dict from ``row``)."""
    return (type(rc), rc.op, rc.schema, rc.commit_ts, rc.commit_time, rc.row, rc.row_text, rc.old_values, rc.extra,
            rc.values)


def test_c_decoding_is_the_python_one() -> None:
    py, c = _decoders()
    payloads = _payloads(4000)
    for p in payloads:
        raw = p[4:]
        assert _outcome(c.parse_change, raw) == _outcome(py.parse_change, raw), raw
        assert c.insert_values(p, 4) == py.insert_values(p, 4), p
        for version in (1, 2):
            ncols = len(SCHEMAS[version].columns)
            parse_row = c.row_parser([c.parser(col) for col in SCHEMAS[version].columns[:ncols]])
            assert c.plain_row(p, 4, parse_row, ncols) == py.plain_row(p, 4, parse_row, ncols), p


def test_c_mounter_mounts_as_python() -> None:
    py, c = _decoders()
    m_py, m_c = Mounter(py), Mounter(c)
    assert type(m_c.mount).__name__ == "MySqlMounter"
    kinds: set[tuple[str, str]] = set()
    for i, p in enumerate(_payloads(4000)):
        got, want = _outcome(m_c.mount, p, 1000 + i, 1.5), _outcome(m_py.mount, p, 1000 + i, 1.5)
        if want[0] == "ok":
            assert got[0] == "ok", (p, got)
            assert _slots(got[1]) == _slots(want[1]), p
            kinds.add((want[1].op.name, "dict" if want[1].row is None else "row"))
        else:
            assert got == want, p
    assert {("INSERT", "row"), ("INSERT", "dict"), ("UPDATE", "row"), ("UPDATE", "dict"), ("DELETE", "dict")} <= kinds


@pytest.mark.parametrize("which", ["python", "c"])
def test_a_whole_update_keeps_its_new_row_positional(which: str) -> None:
    """An update with whole images: the new row positional with the stored text (as an insert's), so that a sink can
    take it as a whole row and use the upstream's text; the old row by name; ``values`` built from ``row``."""
    py, c = _decoders()
    m = Mounter(py if which == "python" else c)
    new = ["7", "né", "1.50", "2026-01-02 03:04:05.5", None, "0.25", "t", "10:11:12", "\\x00ff"]
    old = ["7", "x", "2.00", "2026-01-02 03:04:05", "2026-01-02", None, "f", "00:00:00", "\\x"]
    p = encode_payload(1, payload.encode(b"U", RELID, new, old))
    m.mount(p, 9, 0.5)  # (the first change of a schema version plans it, through the general path)
    rc = m.mount(p, 9, 0.5)
    assert rc.op is OpType.UPDATE
    assert rc.row_text == new
    assert rc.row is not None and len(rc.row) == len(COLUMNS)
    assert rc.old_values is not None and list(rc.old_values) == [col.name for col in COLUMNS]
    assert rc.old_values["name"] == "x"
    assert rc.values == dict(zip([col.name for col in COLUMNS], rc.row, strict=True))
    assert rc.values["name"] == "né"
    # a partial new image stays by name, without ``row``
    rc = m.mount(encode_payload(1, payload.encode_partial(b"U", RELID, [UNCHANGED, *new[1:]], old)), 9, 0.5)
    assert rc.row is None and rc.row_text is None and rc.values is not None


def test_whole_images_are_mounted_without_python() -> None:
    """An insert, update and delete whose images are whole and whose values parse never reach the Python mounter."""
    _, c = _decoders()
    m_py = Mounter(MySqlChangeDecoder(SCHEMAS.__getitem__, rowcodec.PYTHON))
    m_c = Mounter(c)
    calls: list[bytes] = []

    def general(p: bytes, ts: int, t: float) -> RowChange:
        calls.append(p)
        return m_c._mount(p, ts, t)

    mount = c.plain_mounter(m_c._plain_plans, general)
    rnd = random.Random(SEED)
    rows = [[GOOD[col.base_type](rnd) if j % 4 else None for j, col in enumerate(COLUMNS)] for _ in range(3)]
    rows[0][0] = rows[1][0] = rows[2][0] = "7"
    for kind, new, old, op in ((b"I", rows[0], None, OpType.INSERT), (b"U", rows[1], rows[2], OpType.UPDATE),
                               (b"D", None, rows[1], OpType.DELETE)):
        p = encode_payload(1, payload.encode(kind, RELID, new, old))
        m_py.mount(p, 5, 0.5)  # plans version 1 (the Mounter does before its first mount)
        m_c._plan(1)
        rc = mount(p, 5, 0.5)
        assert rc.op is op
        assert _slots(rc) == _slots(m_py.mount(p, 5, 0.5))
    assert calls == []
    # a partial image does reach it
    p = encode_payload(1, payload.encode_partial(b"U", RELID, [UNCHANGED, *rows[0][1:]], rows[1]))
    assert _slots(mount(p, 5, 0.5)) == _slots(m_py.mount(p, 5, 0.5))
    assert calls == [p]


def test_deferred_inserts_mount_as_python() -> None:
    """Asked to defer (``Mounter(decoder, defer=True)``, for a sink that writes rows by their text), the C mounter
    stores an insert's row deferred where every value parses later exactly as now (``stored_row`` not a tuple), and
    every change, read slot by slot, is the Python mounter's; updates and deletes are never deferred."""
    cols = tuple(c for c in COLUMNS if c.base_type not in ("numeric", "float8", "bytea"))
    schemas = {1: TableSchema(TableName("db", "v"), cols, ("id",), "f", RELID, version=1)}
    native = rowcodec.native_decoding()
    if native is None:
        pytest.skip("no C compiler or Python headers")
    m_py = Mounter(MySqlChangeDecoder(schemas.__getitem__, rowcodec.PYTHON))
    m_d = Mounter(MySqlChangeDecoder(schemas.__getitem__, native), defer=True)
    rnd = random.Random(SEED + 1)
    deferred = 0
    for i in range(600):
        new = [GOOD[c.base_type](rnd) if rnd.random() > 0.2 else None for c in cols]
        old = [GOOD[c.base_type](rnd) for c in cols]
        new[0] = old[0] = str(i)
        for kind, n, o in ((b"I", new, None), (b"U", new, old), (b"D", None, old)):
            p = encode_payload(1, payload.encode(kind, RELID, n, o))
            got, want = m_d.mount(p, 5, 0.5), m_py.mount(p, 5, 0.5)
            if not isinstance(got.row, tuple | None):
                assert kind == b"I"
                deferred += 1
            assert _slots(got) == _slots(want), p
    assert deferred > 300
