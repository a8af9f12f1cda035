"""pgoutput.insert_values: the mounter's fused Insert parser agrees with parse_change and declines anything else."""

from __future__ import annotations

import struct

import pytest

from cdc.events import UNCHANGED
from upstream.postgres.pgoutput import insert_values, parse_change

pytestmark = pytest.mark.unit


def tup(values: list[object]) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            data = str(v).encode()
            out += b"t" + struct.pack(">i", len(data)) + data
    return out


INSERT = b"I" + struct.pack(">I", 77) + b"N" + tup(["1", None, "é", "", UNCHANGED])


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
