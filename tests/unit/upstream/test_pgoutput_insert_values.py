"""pgoutput.insert_values: the mounter's fused Insert parser agrees with parse_change and declines anything else."""

from __future__ import annotations

import struct

import pytest

from cdc.events import UNCHANGED
from tests import rowcodecs
from tests.pgoutput_wire import enc_tuple
from upstream.postgres.pgoutput import insert_values, parse_change
from upstream.postgres.rowcodec import RowCodec

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, params=rowcodecs.NAMES)
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> RowCodec:
    """Every test here runs over both implementations of the per-row functions (tests/rowcodecs.py)."""
    return rowcodecs.use(request.param, monkeypatch, globals())


INSERT = b"I" + struct.pack(">I", 77) + b"N" + enc_tuple(["1", None, "é", "", UNCHANGED])


@pytest.mark.parametrize("prefix", [b"", b"\x00\x00\x00\x07"])
def test_same_values_as_parse_change(prefix: bytes) -> None:
    pc = parse_change(INSERT)
    assert insert_values(prefix + INSERT, len(prefix)) == (pc.relid, pc.new) == (77, ["1", None, "é", "", UNCHANGED])


@pytest.mark.parametrize("raw", [
    INSERT[:-1],  # truncated
    INSERT + b"x",  # trailing byte
    b"U" + INSERT[1:],  # not an insert
    INSERT[:5] + b"K" + INSERT[6:],  # wrong tuple marker
    INSERT[:8] + b"z" + INSERT[9:],  # unknown column kind
    b"I",
])
def test_declines_malformed_or_other_messages(raw: bytes) -> None:
    assert insert_values(b"\x00\x00\x00\x01" + raw, 4) is None


VALUE_POOL: list[object] = [None, UNCHANGED, "", "a", "0cc175b9c0f1b6a831c399e269772661", "é", "日本語 🎉", "x" * 300,
                            "2026-11-22 01:02:03.5+00", b"\x00\xff", b"", "\x00nul", "\x7f"]


def test_tuples_of_every_shape_decode_and_every_truncation_fails() -> None:
    """Mixed ASCII/non-ASCII messages, NULL/unchanged/binary values in the last bytes, long values (length
    bytes >= 0x80): the values come back as sent; every truncated or extended message is refused."""
    import random

    from cdc.errors import DecodeError

    rng = random.Random(5)
    for _ in range(300):
        values = [rng.choice(VALUE_POOL) for _ in range(rng.randint(0, 7))]
        for kind in (b"I", b"U"):
            raw = kind + struct.pack(">I", 9) + b"N" + enc_tuple(values)
            pc = parse_change(raw)
            assert pc.new == values and pc.relid == 9
            if kind == b"I":
                assert insert_values(b"\x00\x00\x00\x01" + raw, 4) == (9, values)
        raw = b"I" + struct.pack(">I", 9) + b"N" + enc_tuple(values)
        for cut in range(6, len(raw)):
            with pytest.raises(DecodeError):
                parse_change(raw[:cut])
            assert insert_values(raw[:cut], 0) is None
        with pytest.raises(DecodeError):
            parse_change(raw + b"n")
