"""The replication stream's events, read off the PyMySQL connection that requested the binlog dump.

``pymysqlreplication`` connects, registers the replica and sends the dump request on a PyMySQL connection; after
that the connection carries nothing but the server's packets of the dump. :class:`EventReader` reads them itself:
what the socket has (up to :data:`CHUNK` bytes per read, through the connection's buffered socket file, whose
buffered bytes come first) is framed into events in one call, :func:`frame` (in C where built:
``rowcodec.c``'s ``frame_events``), so a single-row transaction's four events cost no read call, header unpack or
checksum call of their own in Python. Each event is an :data:`Event` tuple ``(type, packet, body end, log_pos)``.

Guarantees: every packet's sequence number is the next one (else :class:`~upstream.mysql.binlog.FramingError`);
every event's size is its packet's and its CRC32 (``binlog_checksum = CRC32``) is verified over exactly the bytes the
server checksummed, except a heartbeat's, whose body is not read (else FramingError: a mis-framed or damaged event is
never decoded); a packet of 16 MB or more is joined with its continuation packets; a short read or a read of the
closed socket file (the connection closed or lost, also by the span's ``close()`` from another thread) and the end
of a non-blocking dump (an EOF packet) raise ``ConnectionError``, never a ``ValueError`` the span would report as an
undecodable event; an error packet raises PyMySQL's ``OperationalError`` with the server's code and message, as
PyMySQL would. No reconnect, ever: the span restarts from its checkpoint on any of these.
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any

import pymysql

from upstream.mysql import binlog
from upstream.mysql.binlog import FramingError

_MAX_PACKET = 0xFFFFFF
CHUNK = 1 << 17
"""Bytes asked of the socket per read (what it has, at most this)."""
BACKLOG = 1 << 15
"""A read that gets at least this much found a backlog waiting (:meth:`EventReader.backlog`): a few of a steady
stream's largest transactions, hundreds of its small ones."""

Event = tuple[int, bytes, int, int]
"""``(event type, packet, offset where the event's body ends (before its checksum), log_pos)``."""

Frame = Callable[[bytes, int, int, bool], "tuple[list[Event], int, int]"]
"""``frame(buf, off, seq, checksum) -> (events, off, seq)`` (:func:`frame`)."""


def frame(buf: bytes, off: int, seq: int, checksum: bool) -> tuple[list[Event], int, int]:
    """Every whole packet of ``buf`` from ``off`` that is one plain binlog event (the next sequence number, under
    16 MB, an event packet whose size and checksum are right), as :data:`Event` tuples; it stops before the first
    packet that is not whole or not such an event (:meth:`EventReader.events` reads that one with the precise
    error). Returns the offset and sequence number after the last event framed. ``rowcodec.c``'s ``frame_events``
    is the same in C."""
    out: list[Event] = []
    size = len(buf)
    header = binlog.HEADER.unpack_from
    while off + 4 <= size:
        n = buf[off] | buf[off + 1] << 8 | buf[off + 2] << 16
        if n >= _MAX_PACKET or buf[off + 3] != seq or off + 4 + n > size or n < binlog.HEADER_END:
            break
        data = buf[off + 4:off + 4 + n]
        if data[0] != 0:
            break
        _ts, etype, _srv, esize, log_pos = header(data)
        if esize + 1 != n:
            break
        end = n
        if checksum and etype != binlog.HEARTBEAT:
            end -= 4
            if end < binlog.HEADER_END or not binlog.crc_ok(data, end):
                break
        out.append((etype, data, end, log_pos))
        off += 4 + n
        seq = (seq + 1) & 0xFF
    return out, off, seq


class EventReader:
    """Reads the dump's events from ``conn`` (a PyMySQL connection whose binlog dump has started; ``checksum``: whether
    the stream's events carry a CRC32, as the dump request asked). ``framer``: :func:`frame` or its C twin."""

    __slots__ = ("_backlog", "_buf", "_checksum", "_frame", "_off", "_poll", "_read", "_read1", "_seq")

    def __init__(self, conn: Any, checksum: bool, framer: Frame | None = None) -> None:
        rfile = conn._rfile  # noqa: SLF001 - the connection's own buffered socket file (its buffered bytes first)
        self._read1 = rfile.read1
        self._read = rfile.read
        self._seq: int = conn._next_seq_id  # noqa: SLF001
        self._checksum = checksum
        self._frame = framer or frame
        self._buf = b""
        self._off = 0
        self._backlog = False  # (backlog)
        self._poll = select.poll()  # (pending)
        try:
            self._poll.register(rfile.fileno(), select.POLLIN)
        except (OSError, ValueError):  # a byte stream without a socket (recorded streams): only the read bytes count
            pass

    def pending(self) -> bool:
        """Whether more of the stream has arrived than :meth:`events` returned: bytes read but not framed yet, or bytes
        (or the end of the stream) waiting on the socket. One ``poll`` with no timeout, no read. Bytes the socket file
        buffered ahead after reading a packet larger than :data:`CHUNK` are not seen (a hint, see
        ``upstream.base.SpanSource.caught_up_ts``)."""
        return self._off < len(self._buf) or bool(self._poll.poll(0))

    def backlog(self) -> bool:
        """Whether a read since the last call got at least :data:`BACKLOG` bytes (the stream had a backlog waiting:
        a catch-up, a burst, a large transaction), and forget it."""
        out, self._backlog = self._backlog, False
        return out

    def events(self) -> list[Event]:
        """The next events: every whole one the socket has delivered, at least one (blocks until there is)."""
        while True:
            evs, off, seq = self._frame(self._buf, self._off, self._seq, self._checksum)
            if evs:
                self._off, self._seq = off, seq
                return evs
            ev = self._unusual()
            if ev is not None:
                return [ev]

    def _unusual(self) -> Event | None:
        """The packet at the read offset, which :func:`frame` did not take: None after reading more bytes when it is
        not whole, else its event or the precise error (module docstring)."""
        buf, p, seq = self._buf, self._off, self._seq
        parts: list[bytes] = []
        while True:
            if p + 4 > len(buf):
                self._fill(p + 4 - len(buf))
                return None
            n = buf[p] | buf[p + 1] << 8 | buf[p + 2] << 16
            if buf[p + 3] != seq:
                raise FramingError(f"packet sequence number {buf[p + 3]}, expected {seq}")
            if p + 4 + n > len(buf):
                self._fill(p + 4 + n - len(buf))
                return None
            parts.append(buf[p + 4:p + 4 + n])
            p += 4 + n
            seq = (seq + 1) & 0xFF
            if n < _MAX_PACKET:
                break
        self._off, self._seq = p, seq
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if data[:1] == b"\xff":
            code = int.from_bytes(data[1:3], "little")
            msg = data[9:] if data[3:4] == b"#" else data[3:]
            raise pymysql.err.OperationalError(code, msg.decode(errors="replace"))
        if data[:1] != b"\x00":
            if data[:1] == b"\xfe" and len(data) < 9:
                raise ConnectionError("the binlog stream ended (EOF packet)")
            raise FramingError(f"unexpected packet 0x{data[0]:02x} in the binlog stream")
        if len(data) < binlog.HEADER_END:
            raise FramingError(f"a packet of {len(data)} bytes is shorter than an event header")
        _ts, etype, _srv, size, log_pos = binlog.HEADER.unpack_from(data)
        end = 1 + size
        if len(data) != end:
            raise FramingError(f"a packet of {len(data)} bytes holds an event of {size} bytes")
        if self._checksum and etype != binlog.HEARTBEAT:  # (a heartbeat's body is not read)
            end -= 4
            if end < binlog.HEADER_END or not binlog.crc_ok(data, end):
                raise FramingError(binlog.CRC_MISMATCH)
        return etype, data, end, log_pos

    def _fill(self, missing: int) -> None:
        """Read at least ``missing`` more bytes (what the socket has up to :data:`CHUNK`, or exactly the rest of a
        larger packet: a big event is read once, not joined chunk by chunk); ConnectionError when it closed."""
        try:
            if missing > CHUNK:
                more = self._read(missing)
                short = len(more) < missing
            else:
                more = self._read1(CHUNK)
                short = not more
        except ValueError as exc:  # "read of closed file": the span's close() (another thread) closed the connection
            raise ConnectionError(f"the binlog stream's connection was closed: {exc}") from exc
        if short:
            raise ConnectionError("Lost connection to MySQL server during the binlog dump")
        if len(more) >= BACKLOG:
            self._backlog = True
        self._buf = self._buf[self._off:] + more
        self._off = 0
