"""upstream.mysql.wire.PacketReader on the MySQL packet framing (a byte stream standing in for the socket file):
continuation packets of 16 MB are joined, a wrong sequence number, an error packet and a short read are errors."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pymysql
import pytest

from upstream.mysql.binlog import FramingError
from upstream.mysql.wire import PacketReader

pytestmark = pytest.mark.unit


def _packet(seq: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "little") + bytes([seq & 0xFF]) + payload


def _reader(stream: bytes, seq: int = 1) -> PacketReader:
    return PacketReader(SimpleNamespace(_rfile=io.BufferedReader(io.BytesIO(stream)), _next_seq_id=seq))


def test_packets_in_order_and_continuations_joined() -> None:
    big = b"\x00" + b"x" * (0xFFFFFF - 1)
    stream = _packet(1, b"\x00abc") + _packet(2, big) + _packet(3, b"tail") + _packet(4, b"\xfe\x00\x00\x02\x00")
    r = _reader(stream)
    assert r.read() == b"\x00abc"
    assert r.read() == big + b"tail"
    assert r.read() == b"\xfe\x00\x00\x02\x00"
    with pytest.raises(ConnectionError):
        r.read()


def test_an_exact_16mb_packet_ends_with_an_empty_continuation() -> None:
    big = b"\x00" + b"y" * (0xFFFFFF - 1)
    r = _reader(_packet(7, big) + _packet(8, b""), seq=7)
    assert r.read() == big


def test_wrong_sequence_error_packet_and_short_read() -> None:
    with pytest.raises(FramingError, match="sequence"):
        _reader(_packet(5, b"\x00x")).read()
    err = b"\xff" + (1236).to_bytes(2, "little") + b"#HY000" + b"Could not find first log file name"
    with pytest.raises(pymysql.err.OperationalError) as exc:
        _reader(_packet(1, err)).read()
    assert exc.value.args == (1236, "Could not find first log file name")
    with pytest.raises(ConnectionError):
        _reader(_packet(1, b"\x00abcdef")[:-2]).read()
