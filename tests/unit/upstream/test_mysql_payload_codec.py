"""The C reader of stored MySQL changes (``upstream/mysql/payloadcodec.c`` through ``payload.best_parse``) against the
Python reference ``payload.parse``: the same ParsedChange for every well-formed change (NULLs, absent values, empty and
multi-byte text, old rows whole and key-only), and for every malformed one (truncated, flipped bytes, invalid UTF-8,
trailing bytes, an unknown kind) the same DecodeError."""

from __future__ import annotations

import random

import pytest

from cdc.errors import DecodeError
from cdc.events import UNCHANGED
from upstream.mysql import payload

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def fast() -> object:
    if payload.native() is None:
        pytest.skip("the C payload reader cannot be built here (no compiler or Python headers)")
    f = payload.best_parse()
    if f is payload.parse:
        pytest.skip("TIDEWATER_ROWCODEC=python is set")
    return f


def _value(rng: random.Random, absent: bool) -> object:
    r = rng.random()
    if absent and r < 0.15:
        return UNCHANGED
    if r < 0.3:
        return None
    return rng.choice(["", "0", "-12", "héllo wörld", "日本語", "x" * rng.randrange(0, 300), "a\x00b", "🙂"])


def _change(rng: random.Random) -> bytes:
    kind = rng.choice([b"I", b"U", b"D"])
    n = rng.randrange(0, 9)
    partial = rng.random() < 0.3
    new = [_value(rng, partial) for _ in range(n)] if kind != b"D" else None
    old = [_value(rng, partial) for _ in range(n)] if kind != b"I" else None
    relid = rng.choice([0, 1, 7, 2**31, 2**32 - 1])
    return payload.encode_partial(kind, relid, new, old) if partial else payload.encode(kind, relid, new, old)  # type: ignore[arg-type]


def _outcome(parse: object, raw: bytes) -> object:
    try:
        return parse(raw)  # type: ignore[operator]
    except DecodeError as exc:
        return ("DecodeError", str(exc))


@pytest.mark.parametrize("seed", range(4))
def test_the_c_reader_equals_python_on_well_formed_changes(fast: object, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        raw = _change(rng)
        want = payload.parse(raw)
        got = fast(raw)  # type: ignore[operator]
        assert got == want, raw
        assert [type(v) for v in got.new or ()] == [type(v) for v in want.new or ()]


@pytest.mark.parametrize("seed", range(4))
def test_the_c_reader_gives_pythons_error_on_malformed_changes(fast: object, seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(3000):
        raw = bytearray(_change(rng))
        how = rng.randrange(5)
        if how == 0 and raw:
            del raw[rng.randrange(len(raw)):]  # truncated
        elif how == 1 and raw:
            raw[rng.randrange(len(raw))] = rng.randrange(256)  # a flipped byte (a length, a count, the kind, text)
        elif how == 2:
            raw += bytes([rng.randrange(256)])  # trailing
        elif how == 3:
            raw += b"\x00\x01\x00\x00\x00\x02\xc3\x28"  # a row of invalid UTF-8
        else:
            raw[:1] = rng.choice([b"T", b"X", b"i", b""])
        assert _outcome(fast, bytes(raw)) == _outcome(payload.parse, bytes(raw)), bytes(raw)


def test_insert_values_through_the_c_reader_equal_pythons(fast: object) -> None:
    rng = random.Random(7)
    for _ in range(2000):
        raw = b"\x00\x00\x00\x05" + _change(rng)
        if rng.random() < 0.3:
            raw = raw[:rng.randrange(4, len(raw) + 1)]
        assert payload.insert_values(raw, 4, fast) == payload.insert_values(raw, 4)  # type: ignore[arg-type]
