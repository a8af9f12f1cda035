"""The C rows-event decoder (upstream/mysql/rowcodec.c) against the Python reference (upstream.mysql.rowdecode):
the same payload bytes, or the same refusal.

Rows events of a table with a column of every binlog type the C decoder renders itself (and some it hands to Python)
are generated from a fixed seed: valid values, random bytes in place of values (zero and invalid dates, TIMEs
outside a day, invalid UTF-8), NULLs, WRITE/UPDATE/DELETE shapes, truncated events. Each is decoded by
``RowDecoder.payloads`` with the C function and without it; the outcomes (payload list, or ValueRefused's column
and reason) must be identical, and the C function itself, where it answers, must answer exactly the Python bytes.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import Any

import pytest

from tests import rowcodecs
from upstream.mysql import rowcodec, rowdecode, types
from upstream.mysql import tablemap as tm

pytestmark = pytest.mark.unit

SEED = 23_7


def _col(ftype: int, **kw: Any) -> tm.BinlogColumn:
    c = tm.BinlogColumn(ftype)
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def _schema() -> list[tuple[tm.BinlogColumn, types.Render, Callable[[random.Random, float], bytes]]]:
    """(column, renderer, value generator) per column."""

    def ints(n: int) -> Callable[[random.Random, float], bytes]:
        return lambda rnd, junk: rnd.randbytes(n)

    def text(lsize: int, limit: int) -> Callable[[random.Random, float], bytes]:
        def gen(rnd: random.Random, junk: float) -> bytes:
            if rnd.random() >= junk:
                raw = "".join(rnd.choices("aé😀 z\n'\\\0", k=rnd.randrange(limit))).encode()[:limit]
                raw = raw.decode(errors="ignore").encode()
            else:
                raw = rnd.randbytes(rnd.randrange(limit))
            return len(raw).to_bytes(lsize, "little") + raw
        return gen

    def date_gen(rnd: random.Random, junk: float) -> bytes:
        if rnd.random() >= junk:
            v = rnd.randrange(1, 10000) << 9 | rnd.randrange(1, 13) << 5 | rnd.randrange(1, 32)
            return v.to_bytes(3, "little")
        return rnd.randbytes(3)

    def frac(rnd: random.Random, fsp: int) -> bytes:
        n = (fsp + 1) // 2
        if not n:
            return b""
        us = rnd.randrange(10**6) // 10 ** (6 - fsp)
        return (us * (10 if fsp % 2 else 1)).to_bytes(n, "big")

    def dt2(fsp: int) -> Callable[[random.Random, float], bytes]:
        def gen(rnd: random.Random, junk: float) -> bytes:
            if rnd.random() >= junk:
                ym = rnd.randrange(1, 10000) * 13 + rnd.randrange(1, 13)
                v = 1 << 39 | ym << 22 | rnd.randrange(1, 32) << 17 | rnd.randrange(24) << 12 | rnd.randrange(
                    60) << 6 | rnd.randrange(60)
                return v.to_bytes(5, "big") + frac(rnd, fsp)
            return rnd.randbytes(5) + frac(rnd, fsp)
        return gen

    def ts2(fsp: int) -> Callable[[random.Random, float], bytes]:
        def gen(rnd: random.Random, junk: float) -> bytes:
            if rnd.random() >= junk:
                secs = rnd.choice([1, 2**31 - 1, rnd.randrange(1, 2**31)])
            else:
                secs = rnd.choice([0, rnd.randrange(2**32)])
            return secs.to_bytes(4, "big") + frac(rnd, fsp)
        return gen

    def t2(fsp: int) -> Callable[[random.Random, float], bytes]:
        def gen(rnd: random.Random, junk: float) -> bytes:
            if rnd.random() >= junk:
                v = 1 << 23 | rnd.randrange(24) << 12 | rnd.randrange(60) << 6 | rnd.randrange(60)
                return v.to_bytes(3, "big") + frac(rnd, fsp)
            return rnd.randbytes(3) + frac(rnd, fsp)
        return gen

    def dec_gen(rnd: random.Random, junk: float) -> bytes:  # DECIMAL(10,2): 4 + 1 bytes, sign in the high bit
        v = bytearray(rnd.randbytes(5))
        v[1:4] = rnd.randrange(10**8).to_bytes(4, "big")[1:]
        v[0] = (v[0] & 0x80) | (rnd.randrange(100) >> 7)
        v[4] = rnd.randrange(100)
        if not v[0] & 0x80:
            v = bytearray(b ^ 0xFF for b in v)
            v[0] &= 0x7F
        return bytes(v)

    r = types.renderer
    out: list[tuple[tm.BinlogColumn, types.Render, Callable[[random.Random, float], bytes]]] = [
        (_col(tm.TINY), r("tinyint", "tinyint", None), ints(1)),
        (_col(tm.TINY, unsigned=True), r("tinyint", "tinyint unsigned", None), ints(1)),
        (_col(tm.SHORT), r("smallint", "smallint", None), ints(2)),
        (_col(tm.SHORT, unsigned=True), r("smallint", "smallint unsigned", None), ints(2)),
        (_col(tm.INT24), r("mediumint", "mediumint", None), ints(3)),
        (_col(tm.INT24, unsigned=True), r("mediumint", "mediumint unsigned", None), ints(3)),
        (_col(tm.LONG), r("int", "int", None), ints(4)),
        (_col(tm.LONG, unsigned=True), r("int", "int unsigned", None), ints(4)),
        (_col(tm.LONGLONG), r("bigint", "bigint", None), ints(8)),
        (_col(tm.LONGLONG, unsigned=True), r("bigint", "bigint unsigned", None), ints(8)),
        (_col(tm.YEAR), r("year", "year", None), ints(1)),
        (_col(tm.VARCHAR, max_length=80, encoding="utf8", character_set_name="utf8"), r("varchar", "varchar(20)", 20),
         text(1, 80)),
        (_col(tm.VARCHAR, max_length=1200, encoding="utf8", character_set_name="utf8"),
         r("varchar", "varchar(300)", 300), text(2, 600)),
        (_col(tm.STRING, max_length=20, encoding="utf8", character_set_name="utf8"), r("char", "char(5)", 5),
         text(1, 20)),
        (_col(tm.BLOB, length_size=2, encoding="utf8", character_set_name="utf8"), r("text", "text", None),
         text(2, 300)),
        (_col(tm.BLOB, length_size=4, encoding="utf8", character_set_name="utf8"), r("longtext", "longtext", None),
         text(4, 100)),
        (_col(tm.VARCHAR, max_length=20, encoding="cp1252", character_set_name="cp1252"),
         r("varchar", "varchar(20)", 20), text(1, 20)),
        (_col(tm.BLOB, length_size=2, character_set_name="binary"), r("blob", "blob", None), text(2, 300)),
        (_col(tm.VARCHAR, max_length=10, character_set_name="binary"), r("varbinary", "varbinary(10)", 10),
         text(1, 10)),
        (_col(tm.STRING, max_length=4, character_set_name="binary"), r("binary", "binary(4)", 4), text(1, 4)),
        (_col(tm.DATE), r("date", "date", None), date_gen),
        (_col(tm.NEWDECIMAL, precision=10, decimals=2), r("decimal", "decimal(10,2)", None), dec_gen),
        (_col(tm.FLOAT, size=4), r("float", "float", None), ints(4)),
        (_col(tm.DOUBLE, size=8), r("double", "double", None), ints(8)),
    ]
    for fsp in range(7):
        out.append((_col(tm.DATETIME2, fsp=fsp), r("datetime", f"datetime({fsp})", None), dt2(fsp)))
        out.append((_col(tm.TIMESTAMP2, fsp=fsp), r("timestamp", f"timestamp({fsp})", None), ts2(fsp)))
        out.append((_col(tm.TIME2, fsp=fsp), r("time", f"time({fsp})", None), t2(fsp)))
    return out


def _image(rnd: random.Random, schema: list[Any], null_rate: float, junk: float) -> bytes:
    n = len(schema)
    nulls = [rnd.random() < null_rate for _ in range(n)]
    bitmap = sum(1 << i for i, isnull in enumerate(nulls) if isnull).to_bytes((n + 7) // 8, "little")
    return bitmap + b"".join(gen(rnd, junk) for (_, _, gen), isnull in zip(schema, nulls, strict=True) if not isnull)


def _outcome(fn: Callable[[], list[bytes]]) -> Any:
    try:
        return fn()
    except rowdecode.ValueRefused as exc:
        return ("refused", exc.index, exc.reason)
    except (ValueError, struct.error, IndexError) as exc:  # a truncated event (the span: DecodeError)
        return ("error", type(exc).__name__, str(exc))


def test_c_decoder_builds_where_a_compiler_is() -> None:
    if rowcodecs.can_build():
        assert rowcodec.native() is not None, "the MySQL C row codec does not build although cc and Python.h are here"


@pytest.mark.parametrize("kind", [b"I", b"U", b"D"])
def test_c_and_python_decode_every_event_alike(kind: bytes) -> None:
    native = rowcodec.native()
    if native is None:
        pytest.skip("no C compiler or Python headers: the C decoder cannot be built here")
    schema = _schema()
    cols, renders = [c for c, _, _ in schema], [r for _, r, _ in schema]
    with_c = rowdecode.RowDecoder(cols, renders, native)
    python = rowdecode.RowDecoder(cols, renders, None)
    rnd = random.Random(SEED + kind[0])
    handled = refused = 0
    prefix = b"\x00\x00\x00\x07"
    for i in range(3000):
        rows = 1 if i % 3 else rnd.randrange(1, 5)
        junk = 0.0 if i % 2 else rnd.choice([0.01, 0.05, 0.3])  # (invalid values one event in two)
        body = b"".join(_image(rnd, schema, rnd.choice([0.0, 0.1, 0.5]), junk) * (2 if kind == b"U" else 1)
                        for _ in range(rows))
        if i % 50 == 0:
            body = body[:rnd.randrange(len(body))]  # truncated
        data = b"\x00" * 20 + body
        end = len(data)
        ours = _outcome(lambda d=data, e=end: with_c.payloads(d, 20, e, kind, prefix, 42))
        ref = _outcome(lambda d=data, e=end: python.payloads(d, 20, e, kind, prefix, 42))
        assert ours == ref, f"event {i}: C {ours!r} Python {ref!r}"
        codes, p1, p2, calls = with_c._plan  # noqa: SLF001 - the C function alone, to see it answers itself
        direct = native(data, 20, end, kind[0], prefix + bytes(kind) + (42).to_bytes(4, "big"), codes, p1, p2, calls)
        if direct is not None:
            assert direct == ref
            handled += 1
        refused += isinstance(ref, tuple)
    assert handled > 300 and refused > 300, (handled, refused)  # both paths were exercised


def test_the_plan_renders_hot_columns_in_c() -> None:
    schema = _schema()
    dec = rowdecode.RowDecoder([c for c, _, _ in schema], [r for _, r, _ in schema], None)
    codes = dec._plan[0]  # noqa: SLF001
    names = [c.type for c, _, _ in schema]
    # integers, utf8 text, binary strings, dates and times in C; latin1 text, DECIMAL, FLOAT, DOUBLE call Python
    called = [t for t, code in zip(names, codes, strict=True) if code == rowcodec.CALL]
    assert sorted(called) == sorted([tm.VARCHAR, tm.NEWDECIMAL, tm.FLOAT, tm.DOUBLE])


@pytest.mark.parametrize("etype", [23, 24, 25, 30, 31, 32])
def test_c_whole_event_is_header_then_payloads(etype: int) -> None:
    """RowDecoder.event_decoder (rowcodec.c's decode_event: the rows event's header read in C too) answers exactly
    what rowdecode.rows_header + RowDecoder.payloads answer, or None: for partial images, another column count and
    values C does not render, never a different answer."""
    native_event = rowcodec.best_event()
    if native_event is None:
        pytest.skip("no C compiler or Python headers: the C decoder cannot be built here")
    schema = _schema()
    cols, renders = [c for c, _, _ in schema], [r for _, r, _ in schema]
    python = rowdecode.RowDecoder(cols, renders, None)
    prefix = b"\x00\x00\x00\x07"
    fast = python.event_decoder(native_event, prefix, 42)
    assert fast is not None
    kind = {23: b"I", 30: b"I", 24: b"U", 31: b"U", 25: b"D", 32: b"D"}[etype]
    n = len(cols)
    rnd = random.Random(SEED + etype)
    answered = declined = 0
    for i in range(1500):
        junk = 0.0 if i % 2 else rnd.choice([0.01, 0.3])
        body = b"".join(_image(rnd, schema, rnd.choice([0.0, 0.2]), junk) * (2 if kind == b"U" else 1)
                        for _ in range(1 if i % 3 else rnd.randrange(1, 4)))
        bitmaps = [python.full, python.padded, bytes([0xFF] * (n >> 3) + [0x01])]  # (the last: a partial image)
        present = rnd.choice(bitmaps) if i % 4 == 0 else python.full
        ncols = n + 1 if i % 97 == 0 else n
        head = b"\x00" + bytes(19) + (77).to_bytes(6, "little") + b"\x00\x00"
        if etype >= 30:
            head += b"\x02\x00"  # the v2 extra data: its length only
        head += bytes([ncols]) + present + (present if kind == b"U" else b"")
        data = head + body
        end = len(data)
        ours = fast(data, end, etype)
        table_id, cnt, pres, after, off = rowdecode.rows_header(data, etype)
        assert table_id == 77
        if ours is None:
            declined += 1
            continue
        answered += 1
        assert cnt == n and pres in (python.full, python.padded) and after in (None, pres)
        assert ours == _outcome(lambda d=data, o=off, e=end: python.payloads(d, o, e, kind, prefix, 42))
    assert answered > 300 and declined > 100, (answered, declined)
    assert fast(b"\x00" + bytes(19) + b"\x00" * 20, 40, 2) is None  # (not a rows event)
