"""Binlog events and replication packets as a MySQL/MariaDB server sends them, for the unit tests of
upstream.mysql's framing and event loop (no server)."""

from __future__ import annotations

import struct
import zlib


def event(etype: int, body: bytes, *, log_pos: int = 1234, checksum: bool = True, timestamp: int = 1700000000,
          server_id: int = 7) -> bytes:
    """A v4 binlog event as the dump's packet carries it: the 0x00 OK byte, the 19-byte header, ``body`` and, with
    ``checksum``, its CRC32."""
    size = 19 + len(body) + (4 if checksum else 0)
    ev = struct.pack("<IBIIIH", timestamp, etype, server_id, size, log_pos, 0) + body
    if checksum:
        ev += zlib.crc32(ev).to_bytes(4, "little")
    return b"\x00" + ev


def packet(seq: int, payload: bytes) -> bytes:
    """A MySQL protocol packet: 3-byte length, sequence number, payload."""
    return len(payload).to_bytes(3, "little") + bytes([seq & 0xFF]) + payload
