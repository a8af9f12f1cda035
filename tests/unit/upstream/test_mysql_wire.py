"""upstream.mysql.wire on the dump's byte stream (a byte stream standing in for the socket file): events framed as
many per read as arrived, also across read boundaries; continuation packets of 16 MB joined; a wrong sequence number,
a size or checksum mismatch, an error packet, an EOF packet and a short read are errors; the C framer
(rowcodec.c's frame_events) frames exactly what the Python one does, on random streams with damage."""

from __future__ import annotations

import io
import random
import socket
import struct
from types import SimpleNamespace

import pymysql
import pytest

from tests.binlog_wire import event, packet
from upstream.mysql import binlog, rowcodec, wire
from upstream.mysql.binlog import FramingError
from upstream.mysql.wire import EventReader

pytestmark = pytest.mark.unit


def _framers() -> list[wire.Frame]:
    c = rowcodec.best_frame() if rowcodec.native() is not None else None
    return [wire.frame] + ([c] if c is not None and c is not wire.frame else [])


FRAMERS = _framers()


class _Trickle(io.RawIOBase):
    """A socket that delivers at most ``step`` bytes per read."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.pos, self.step = data, 0, step

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        n = min(len(b), self.step, len(self.data) - self.pos)
        b[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n


def _reader(stream: bytes, seq: int = 1, *, checksum: bool = False, framer: wire.Frame | None = None,
            step: int | None = None) -> EventReader:
    raw = io.BytesIO(stream) if step is None else _Trickle(stream, step)
    return EventReader(SimpleNamespace(_rfile=io.BufferedReader(raw), _next_seq_id=seq), checksum, framer)


def _all(r: EventReader, n: int) -> list[wire.Event]:
    out: list[wire.Event] = []
    while len(out) < n:
        out.extend(r.events())
    return out


@pytest.mark.parametrize("framer", FRAMERS)
@pytest.mark.parametrize("step", [None, 1, 7, 100])
def test_events_in_order_checked_and_split_anywhere(framer: wire.Frame, step: int | None) -> None:
    evs = [event(binlog.GTID_MARIADB, struct.pack("<QIB", 42, 0, 0), log_pos=100),
           event(binlog.TABLE_MAP, b"t" * 40, log_pos=200),
           event(binlog.WRITE_ROWS_V1, b"r" * 300, log_pos=500),
           event(binlog.XID, struct.pack("<Q", 9), log_pos=531),
           event(binlog.HEARTBEAT, b"mariadb-bin.000001", log_pos=531, checksum=False)]
    stream = b"".join(packet(1 + i, e) for i, e in enumerate(evs))
    r = _reader(stream, checksum=True, framer=framer, step=step)
    got = _all(r, len(evs))
    assert got == [(e[5], e, len(e) - (0 if e[5] == binlog.HEARTBEAT else 4), pos)
                   for e, pos in zip(evs, (100, 200, 500, 531, 531), strict=True)]
    if step is None:
        assert len(_reader(stream, checksum=True, framer=framer).events()) == len(evs)  # (one read, one call)
    with pytest.raises(ConnectionError):
        r.events()


@pytest.mark.parametrize("framer", FRAMERS)
def test_continuations_joined_and_an_exact_16mbpacket(framer: wire.Frame) -> None:
    big = event(binlog.WRITE_ROWS_V1, b"x" * (0xFFFFFF + 10), checksum=False)
    stream = (packet(1, big[:0xFFFFFF]) + packet(2, big[0xFFFFFF:]) + packet(3, event(binlog.XID, b"12345678",
                                                                                           checksum=False)))
    r = _reader(stream, framer=framer, step=1 << 20)
    assert r.events() == [(binlog.WRITE_ROWS_V1, big, len(big), 1234)]
    assert r.events()[0][0] == binlog.XID
    exact = event(binlog.WRITE_ROWS_V1, b"y" * (0xFFFFFF - 20), checksum=False)
    assert len(exact) == 0xFFFFFF
    r = _reader(packet(7, exact) + packet(8, b""), seq=7, framer=framer)
    assert r.events() == [(binlog.WRITE_ROWS_V1, exact, len(exact), 1234)]


@pytest.mark.parametrize("framer", FRAMERS)
def test_errors(framer: wire.Frame) -> None:
    good = event(binlog.XID, b"12345678")
    with pytest.raises(FramingError, match="sequence"):
        _reader(packet(5, good), checksum=True, framer=framer).events()
    err = b"\xff" + (1236).to_bytes(2, "little") + b"#HY000" + b"Could not find first log file name"
    r = _reader(packet(1, good) + packet(2, err), checksum=True, framer=framer)
    assert len(r.events()) == 1
    with pytest.raises(pymysql.err.OperationalError) as exc:
        r.events()
    assert exc.value.args == (1236, "Could not find first log file name")
    with pytest.raises(ConnectionError, match="ended"):
        _reader(packet(1, b"\xfe\x00\x00\x02\x00"), framer=framer).events()
    with pytest.raises(ConnectionError):
        _reader(packet(1, good)[:-2], checksum=True, framer=framer).events()
    damaged = good[:25] + bytes([good[25] ^ 1]) + good[26:]
    with pytest.raises(FramingError, match="checksum"):
        _reader(packet(1, damaged), checksum=True, framer=framer).events()
    assert _reader(packet(1, damaged), checksum=False, framer=framer).events()[0][2] == len(damaged)  # (no CRC asked)
    wrong_size = good[:10] + bytes([good[10] + 1]) + good[11:]
    with pytest.raises(FramingError, match="holds an event"):
        _reader(packet(1, wrong_size), checksum=False, framer=framer).events()
    with pytest.raises(FramingError, match="unexpected packet"):
        _reader(packet(1, b"\x01" + good[1:]), checksum=True, framer=framer).events()


@pytest.mark.parametrize("framer", FRAMERS)
def test_a_read_of_the_closed_connection_is_a_lost_connection_not_an_undecodable_event(framer: wire.Frame) -> None:
    """The span's close() from another thread closes the socket file under a blocked read: the read's ValueError
    ("read of closed file") is a ConnectionError (the span stops quietly when it was closed), never a ValueError the
    span reports as a DecodeError (CI of stop 28 failed on exactly that)."""
    good = event(binlog.XID, b"12345678")
    r = _reader(packet(1, good) + packet(2, good)[:-3], checksum=True, framer=framer)
    assert len(r.events()) == 1
    rfile = r._read1.__self__  # noqa: SLF001 - the buffered socket file the reader holds
    rfile.close()
    with pytest.raises(ConnectionError, match="closed"):
        r.events()


@pytest.mark.skipif(len(FRAMERS) < 2, reason="no C compiler or Python headers: the C framer cannot be built here")
def test_c_frames_what_python_frames() -> None:
    rnd = random.Random(23)
    for _ in range(300):
        checksum = rnd.random() < 0.8
        seq = rnd.randrange(256)
        parts = []
        for i in range(rnd.randrange(1, 12)):
            etype = rnd.choice([binlog.XID, binlog.TABLE_MAP, binlog.WRITE_ROWS_V1, binlog.HEARTBEAT, 162])
            ev = event(etype, bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 60))),
                        log_pos=rnd.randrange(1 << 32), checksum=checksum and etype != binlog.HEARTBEAT)
            parts.append(packet(seq + i, ev))
        buf = bytearray(b"".join(parts))
        for _ in range(rnd.randrange(3)):  # damage: any byte, incl. lengths, sequence numbers, sizes, checksums
            buf[rnd.randrange(len(buf))] ^= 1 << rnd.randrange(8)
        cut = bytes(buf[:rnd.randrange(len(buf) + 1)]) if rnd.random() < 0.3 else bytes(buf)
        off = 0 if rnd.random() < 0.8 else len(parts[0])
        assert FRAMERS[1](cut, off, (seq + (off > 0)) & 0xFF, checksum) == wire.frame(cut, off, (seq + (off > 0)) & 0xFF,
                                                                                       checksum)


def test_pending_sees_bytes_read_but_not_framed_and_bytes_on_the_socket() -> None:
    # (upstream.mysql.source: whether the stream has more waiting when the span announces resolved)
    evs = [event(binlog.XID, struct.pack("<Q", i), log_pos=100 + i) for i in range(3)]
    a, b = socket.socketpair()
    try:
        rfile = a.makefile("rb")
        r = EventReader(SimpleNamespace(_rfile=rfile, _next_seq_id=1), False)
        assert not r.pending()
        first, second = packet(1, evs[0]), packet(2, evs[1])
        b.sendall(first + second[:5])  # one whole packet and the start of the next
        assert r.pending()
        assert len(r.events()) == 1
        assert r.pending(), "the next packet's first bytes are read"
        b.sendall(second[5:])
        assert len(r.events()) == 1 and not r.pending()
        b.sendall(packet(3, evs[2]))
        assert r.pending(), "bytes on the socket"
        assert len(r.events()) == 1 and not r.pending()
    finally:
        a.close()
        b.close()


def test_backlog_says_whether_a_read_found_at_least_backlog_bytes_once() -> None:
    small = packet(1, event(binlog.XID, struct.pack("<Q", 1), log_pos=100))
    big = b"".join(packet(2 + i, event(binlog.WRITE_ROWS_V1, b"r" * 1000, log_pos=200 + i))
                   for i in range(wire.BACKLOG // 1000 + 1))
    r = _reader(small + big, step=len(small))  # the first read gets one small packet, the next ones more
    assert len(r.events()) == 1 and not r.backlog()
    r = _reader(small + big)
    assert r.events() and r.backlog(), "one read of everything waiting"
    assert not r.backlog(), "asked once per read"
