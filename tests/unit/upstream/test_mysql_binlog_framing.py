"""upstream.mysql.binlog: event framing of raw packets (header, body end, CRC32, ROTATE/QUERY/GTID bodies,
length-encoded integers): a damaged or mis-framed event is an error, never decoded."""

from __future__ import annotations

import struct

import pytest

from tests.binlog_wire import event
from upstream.mysql import binlog

pytestmark = pytest.mark.unit


def test_header_body_end_and_crc() -> None:
    data = event(binlog.ROTATE, struct.pack("<Q", 4) + b"mariadb-bin.000002")
    ts, etype, sid, size, pos = binlog.HEADER.unpack_from(data)
    assert (ts, etype, sid, pos) == (1700000000, binlog.ROTATE, 7, 1234)
    end = binlog.body_end(data, size, True)
    binlog.check_crc(data, end)
    assert binlog.rotate(data, end) == ("mariadb-bin.000002", 4)
    damaged = data[:30] + bytes([data[30] ^ 1]) + data[31:]
    with pytest.raises(binlog.FramingError, match="checksum"):
        binlog.check_crc(damaged, end)
    with pytest.raises(binlog.FramingError, match="holds an event"):
        binlog.body_end(data + b"x", size, True)


def test_query_and_gtid_bodies() -> None:
    post = struct.pack("<IIBHH", 9, 0, 2, 0, 3)
    data = event(binlog.QUERY, post + b"\x01\x02\x03" + b"db\x00" + "ALTER TABLE t ADD c INT -- é".encode())
    end = binlog.body_end(data, len(data) - 1, True)
    assert binlog.query(data, end) == ("db", "ALTER TABLE t ADD c INT -- é")
    gtid = event(binlog.GTID_MARIADB, struct.pack("<QIB", 42, 3, 0))
    assert binlog.mariadb_gtid(gtid) == (3, 7, 42)
    assert binlog.timestamp(gtid) == 1700000000


@pytest.mark.parametrize(("raw", "value", "size"), [
    (b"\xfa", 250, 1), (b"\xfc\x34\x12", 0x1234, 3), (b"\xfd\x56\x34\x12", 0x123456, 4),
    (b"\xfe" + (2**40 + 5).to_bytes(8, "little"), 2**40 + 5, 9)])
def test_packed_int(raw: bytes, value: int, size: int) -> None:
    assert binlog.packed_int(b"x" + raw, 1) == (value, 1 + size)


def test_packed_int_refuses_the_null_marker() -> None:
    with pytest.raises(binlog.FramingError):
        binlog.packed_int(b"\xfb", 0)
