"""Binlog event framing: the v4 event header and the few event bodies the span source reads, from raw packets.

The span source reads the replication stream's packets itself (:mod:`upstream.mysql.source`; the connection, the
dump request, the checksum and heartbeat handshake stay ``pymysqlreplication``'s) and frames each event here, with
no object per event: :data:`HEADER` unpacks ``(timestamp, type, server_id, event_size, log_pos, flags)`` from a
packet (its first byte is the OK marker), and the body helpers read the fields the source needs.

Guarantees: :func:`check_crc` verifies an event's CRC32 (``binlog_checksum = CRC32``) over exactly the bytes the
server checksummed, so a mis-framed or damaged event is an error, never decoded; :func:`body_end` is where an
event's body stops (before the checksum). Pure functions, no I/O.
"""

from __future__ import annotations

import struct
import zlib

HEADER = struct.Struct("<xIBIII")
"""``(timestamp, type, server_id, event_size, log_pos)`` of the event in a packet (after the 0x00 OK byte)."""
HEADER_END = 20  # 1 OK byte + the 19-byte event header

# event types (MySQL's Log_event_type, MariaDB's additions)
QUERY = 2
ROTATE = 4
FORMAT_DESCRIPTION = 15
XID = 16
TABLE_MAP = 19
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25
HEARTBEAT = 27
GTID_MYSQL = 33
ANONYMOUS_GTID_MYSQL = 34  # MySQL's GTID event when gtid_mode is OFF: it opens the transaction all the same
PREVIOUS_GTIDS_MYSQL = 35
TRANSACTION_PAYLOAD = 40  # MySQL 8.0.20+ binlog_transaction_compression: a whole transaction's events compressed
WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2 = 30, 31, 32
PARTIAL_UPDATE_ROWS = 39  # MySQL's partial JSON update
GTID_MARIADB = 162
QUERY_COMPRESSED = 165  # MariaDB log_bin_compress
ROWS_COMPRESSED = frozenset({166, 167, 168, 169, 170, 171})
ROWS_V1 = frozenset({WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1})
ROWS_V2 = frozenset({WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2})
WRITES = frozenset({WRITE_ROWS_V1, WRITE_ROWS_V2})
UPDATES = frozenset({UPDATE_ROWS_V1, UPDATE_ROWS_V2})
DELETES = frozenset({DELETE_ROWS_V1, DELETE_ROWS_V2})

INCIDENT = 26  # the server logged an incident: changes may be missing from the binlog after it
PASSED = frozenset({
    1,  # START_EVENT_V3
    3,  # STOP_EVENT: the server stopped
    5, 13, 14,  # INTVAR, RAND, USER_VAR: context of a statement that follows as a QUERY event
    FORMAT_DESCRIPTION,
    28,  # IGNORABLE_LOG_EVENT (ignorable by definition)
    29,  # ROWS_QUERY_LOG_EVENT: the statement's text (binlog_rows_query_log_events)
    PREVIOUS_GTIDS_MYSQL,
    36, 37,  # TRANSACTION_CONTEXT, VIEW_CHANGE (group replication)
    38,  # XA_PREPARE_LOG_EVENT: the transaction's rows without a commit are refused at the next GTID event
    41,  # HEARTBEAT_LOG_EVENT_V2 (MySQL 8.0.26+)
    160,  # MariaDB ANNOTATE_ROWS: the statement's text
    161,  # MariaDB BINLOG_CHECKPOINT
    163,  # MariaDB GTID_LIST
    164,  # MariaDB START_ENCRYPTION
})
"""Event types the span source passes over: they carry no row change and no schema change. Every type neither read
nor in this allow-list stops the span with an error naming it (it could carry rows or DDL the target would miss:
statement-based LOAD DATA, pre-GA rows events, an incident, a newer server's events such as MySQL's tagged GTIDs)."""

_Q = struct.Struct("<Q")
_QUERY_POST = struct.Struct("<IIBHH")  # thread id, exec time, db length, error code, status vars length
_GTID_MARIADB = struct.Struct("<QI")  # seq_no, domain_id


class FramingError(ValueError):
    """An event that is not what its header says (length, checksum)."""


def body_end(data: bytes, event_size: int, checksum: bool) -> int:
    """The offset in ``data`` (a packet) where the event's body ends: before its 4-byte CRC32 when ``checksum``.
    FramingError when the packet does not hold exactly the event its header announces."""
    end = 1 + event_size
    if len(data) != end:
        raise FramingError(f"a packet of {len(data)} bytes holds an event of {event_size} bytes")
    return end - 4 if checksum else end


def crc_ok(data: bytes, end: int) -> bool:
    """Whether the 4 bytes after ``end`` are the CRC32 of the event (``data[1:end]``)."""
    return zlib.crc32(memoryview(data)[1:end]) == int.from_bytes(data[end:end + 4], "little") and len(data) >= end + 4


CRC_MISMATCH = "binlog event checksum mismatch (damaged or mis-framed event)"


def check_crc(data: bytes, end: int) -> None:
    """Raise FramingError unless :func:`crc_ok`."""
    if not crc_ok(data, end):
        raise FramingError(CRC_MISMATCH)


def rotate(data: bytes, end: int) -> tuple[str, int]:
    """A ROTATE event's ``(next binlog file, position)``."""
    (pos,) = _Q.unpack_from(data, HEADER_END)
    return data[HEADER_END + 8:end].decode(), pos


def query(data: bytes, end: int) -> tuple[str, str]:
    """A QUERY event's ``(default schema, statement)`` (the statement decoded as UTF-8, undecodable bytes replaced:
    it is matched, never applied)."""
    _tid, _exec, db_len, _err, status_len = _QUERY_POST.unpack_from(data, HEADER_END)
    off = HEADER_END + _QUERY_POST.size + status_len
    schema = data[off:off + db_len].decode(errors="replace")
    return schema, data[off + db_len + 1:end].decode(errors="replace")


def mariadb_gtid(data: bytes) -> tuple[int, int, int]:
    """A MariaDB GTID event's ``(domain_id, server_id, seq_no)`` (its server id is the header's)."""
    seq, domain = _GTID_MARIADB.unpack_from(data, HEADER_END)
    return domain, int.from_bytes(data[6:10], "little"), seq


def timestamp(data: bytes) -> int:
    """The event's timestamp (seconds since the epoch) from its header."""
    return int.from_bytes(data[1:5], "little")


def mysql_gtid(data: bytes) -> tuple[bytes, int]:
    """A MySQL GTID event's ``(source uuid as 16 bytes, transaction number)`` (after its 1-byte flags)."""
    off = HEADER_END + 1
    return bytes(data[off:off + 16]), int.from_bytes(data[off + 16:off + 24], "little")


def packed_int(data: bytes, off: int) -> tuple[int, int]:
    """A length-encoded integer at ``off``: ``(value, offset after it)``."""
    c = data[off]
    if c < 0xFB:
        return c, off + 1
    if c == 0xFC:
        return data[off + 1] | data[off + 2] << 8, off + 3
    if c == 0xFD:
        return int.from_bytes(data[off + 1:off + 4], "little"), off + 4
    if c == 0xFE:
        return int.from_bytes(data[off + 1:off + 9], "little"), off + 9
    raise FramingError(f"invalid length-encoded integer 0x{c:02x}")
