"""The replication stream's packets, read off the PyMySQL connection that requested the binlog dump.

``pymysqlreplication`` connects, registers the replica and sends the dump request on a PyMySQL connection; after
that the connection carries nothing but the server's packets of the dump. :class:`PacketReader` reads them from the
connection's buffered socket file itself (PyMySQL's ``_read_packet`` builds a packet object per event and checks
the same things with more calls). Guarantees: every packet's sequence number is the next one (else
:class:`~upstream.mysql.binlog.FramingError`); a packet of 16 MB or more is joined with its continuation packets; a
short read (the connection closed or lost) raises ``ConnectionError``; an error packet raises PyMySQL's
``OperationalError`` with the server's code and message, as PyMySQL would. No reconnect, ever: the span restarts
from its checkpoint on any of these.
"""

from __future__ import annotations

from typing import Any

import pymysql

from upstream.mysql.binlog import FramingError

_MAX_PACKET = 0xFFFFFF


class PacketReader:
    """Reads the dump's packets from ``conn`` (a PyMySQL connection whose binlog dump has started)."""

    __slots__ = ("_read", "_seq")

    def __init__(self, conn: Any) -> None:
        self._read = conn._rfile.read  # noqa: SLF001 - the connection's own buffered socket file
        self._seq: int = conn._next_seq_id  # noqa: SLF001

    def read(self) -> bytes:
        """The next packet's payload (an event packet starts with 0x00, the end of a non-blocking dump is an EOF
        packet: 0xFE and fewer than 9 bytes)."""
        read = self._read
        parts: list[bytes] = []
        while True:
            head = read(4)
            if len(head) < 4:
                raise ConnectionError("Lost connection to MySQL server during the binlog dump")
            n = head[0] | head[1] << 8 | head[2] << 16
            if head[3] != self._seq:
                raise FramingError(f"packet sequence number {head[3]}, expected {self._seq}")
            self._seq = (self._seq + 1) & 0xFF
            data = read(n)
            if len(data) < n:
                raise ConnectionError("Lost connection to MySQL server during the binlog dump")
            if n < _MAX_PACKET and not parts:
                break
            parts.append(data)
            if n < _MAX_PACKET:
                data = b"".join(parts)
                break
        if data[:1] == b"\xff":
            code = int.from_bytes(data[1:3], "little")
            msg = data[9:] if data[3:4] == b"#" else data[3:]
            raise pymysql.err.OperationalError(code, msg.decode(errors="replace"))
        return data
