"""Key and value layout of the LevelDB sorter (pure functions, no I/O).

All integers are unsigned big-endian so that LevelDB's bytewise order is replay order
(the idea of TiCDC's pebble sorter keys: ``tsWindow, uniqueID, tableID, CRTs, startTs, ...``).
Every key starts with an area byte and the span's 8-byte uid, so each span owns three disjoint ranges.

Committed area ``C``, read in order by the sink::

    b"C" + span_uid(8) + commit_ts(u64) + seq(u64)          (25 bytes)

``seq == 0`` is the transaction header, ``seq >= 1`` are the changes in add order (value: the payload).
The header is written in the same write batch as the changes, or after them. Its value is
``commit_time(float64) + xid(u64)`` for a transaction kept in memory until its commit, or, for a
transaction that spilled, additionally ``serial(u64)`` and ``(subxid, seq)`` pairs (u64 each): the
transaction's changes are then the spill area range of ``serial``, minus, for each pair, the entries of
``subxid`` with a spill seq below ``seq`` (rolled-back subtransactions). A spilled transaction is thus
committed without copying it.

Spill area ``U``, one range per transaction that outgrew its memory buffer::

    b"U" + span_uid(8) + serial(u64) + seq(u64)             (25 bytes)

with value ``subxid(u64) + payload``. ``serial`` is unique per span (never reused, also across
restarts), so a reused ``xid`` never meets an old range. ``xid``/``subxid`` are 64-bit because
MySQL/MariaDB transaction ids are.

Spill references ``S``, so that ``clean`` finds the spill ranges of checkpointed transactions::

    b"S" + span_uid(8) + commit_ts(u64)  ->  serial(u64)    (17 bytes)
"""

from __future__ import annotations

import hashlib
import struct

COMMITTED = b"C"
SPILLED = b"U"
SPILL_REFS = b"S"
SPAN_UID_LEN = 8
PREFIX_LEN = 1 + SPAN_UID_LEN  # area byte + span uid
KEY_LEN = PREFIX_LEN + 16
TS_END = PREFIX_LEN + 8  # end of commit_ts / serial in a key
U64_MAX = (1 << 64) - 1

U64 = struct.Struct(">Q")
U64_PAIR = struct.Struct(">QQ")
HEADER = struct.Struct(">dQ")
SPILLED_HEADER = struct.Struct(">dQQ")
HEADER_SEQ = bytes(8)  # seq 0 of a committed key


def span_uid(span_key: str) -> bytes:
    """A stable 8-byte id of a span key such as ``'changefeed-id/3'`` (blake2b, 64 bits)."""
    return hashlib.blake2b(span_key.encode("utf-8"), digest_size=SPAN_UID_LEN).digest()


def check_u64(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` fits an unsigned 64-bit integer."""
    if not 0 <= value <= U64_MAX:
        raise ValueError(f"{name} out of the unsigned 64-bit range: {value}")


def _area_prefix(area: bytes, uid: bytes) -> bytes:
    if len(uid) != SPAN_UID_LEN:
        raise ValueError(f"span uid must be {SPAN_UID_LEN} bytes, got {len(uid)}")
    return area + uid


def committed_prefix(uid: bytes) -> bytes:
    return _area_prefix(COMMITTED, uid)


def spill_area_prefix(uid: bytes) -> bytes:
    return _area_prefix(SPILLED, uid)


def spill_refs_prefix(uid: bytes) -> bytes:
    return _area_prefix(SPILL_REFS, uid)


def committed_key(uid: bytes, commit_ts: int, seq: int) -> bytes:
    check_u64("commit_ts", commit_ts)
    check_u64("seq", seq)
    return committed_prefix(uid) + U64_PAIR.pack(commit_ts, seq)


def decode_committed_key(key: bytes) -> tuple[bytes, int, int]:
    """``(span_uid, commit_ts, seq)`` of a committed key."""
    if len(key) != KEY_LEN or key[:1] != COMMITTED:
        raise ValueError(f"not a committed sorter key: {key!r}")
    commit_ts, seq = U64_PAIR.unpack_from(key, PREFIX_LEN)
    return key[1:PREFIX_LEN], commit_ts, seq


def spill_key(uid: bytes, serial: int, seq: int) -> bytes:
    check_u64("serial", serial)
    check_u64("seq", seq)
    return spill_area_prefix(uid) + U64_PAIR.pack(serial, seq)


def decode_spill_key(key: bytes) -> tuple[bytes, int, int]:
    """``(span_uid, serial, seq)`` of a spill area key."""
    if len(key) != KEY_LEN or key[:1] != SPILLED:
        raise ValueError(f"not a spill sorter key: {key!r}")
    serial, seq = U64_PAIR.unpack_from(key, PREFIX_LEN)
    return key[1:PREFIX_LEN], serial, seq


def spill_range_prefix(uid: bytes, serial: int) -> bytes:
    """Prefix of every spilled change of the transaction with spill ``serial``."""
    check_u64("serial", serial)
    return spill_area_prefix(uid) + U64.pack(serial)


def spill_ref_key(uid: bytes, commit_ts: int) -> bytes:
    check_u64("commit_ts", commit_ts)
    return spill_refs_prefix(uid) + U64.pack(commit_ts)


def decode_spill_ref_key(key: bytes) -> tuple[bytes, int]:
    """``(span_uid, commit_ts)`` of a spill reference key."""
    if len(key) != PREFIX_LEN + 8 or key[:1] != SPILL_REFS:
        raise ValueError(f"not a spill reference key: {key!r}")
    return key[1:PREFIX_LEN], U64.unpack_from(key, PREFIX_LEN)[0]


def header_value(
    commit_time: float, xid: int, serial: int | None = None, aborted: dict[int, int] | None = None
) -> bytes:
    """Header of a transaction; ``serial``/``aborted`` (subxid -> spill seq watermark) if it spilled."""
    check_u64("xid", xid)
    if serial is None:
        if aborted:
            raise ValueError("aborted subtransactions are recorded only for spilled transactions")
        return HEADER.pack(commit_time, xid)
    check_u64("serial", serial)
    parts = [SPILLED_HEADER.pack(commit_time, xid, serial)]
    for subxid, watermark in (aborted or {}).items():
        check_u64("subxid", subxid)
        check_u64("seq", watermark)
        parts.append(U64_PAIR.pack(subxid, watermark))
    return b"".join(parts)


def decode_header_value(value: bytes) -> tuple[float, int, int | None, dict[int, int]]:
    """``(commit_time, xid, serial or None, aborted)`` of a transaction header."""
    if len(value) == HEADER.size:
        commit_time, xid = HEADER.unpack(value)
        return commit_time, xid, None, {}
    if len(value) < SPILLED_HEADER.size or (len(value) - SPILLED_HEADER.size) % U64_PAIR.size:
        raise ValueError(f"malformed sorter transaction header ({len(value)} bytes)")
    commit_time, xid, serial = SPILLED_HEADER.unpack_from(value)
    aborted = dict(U64_PAIR.iter_unpack(value[SPILLED_HEADER.size :]))
    return commit_time, xid, serial, aborted


def spill_value(subxid: int, payload: bytes) -> bytes:
    check_u64("subxid", subxid)
    return U64.pack(subxid) + payload


def decode_spill_value(value: bytes) -> tuple[int, bytes]:
    """``(subxid, payload)`` of a spilled change."""
    if len(value) < 8:
        raise ValueError("spilled sorter value shorter than its subxid")
    return U64.unpack_from(value)[0], value[8:]


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def ts_range(prefix: bytes, after_ts: int, upto_ts: int) -> tuple[bytes, bytes] | None:
    """``[start, stop)`` of the keys ``prefix + ts(u64) + ...`` with ``after_ts < ts <= upto_ts``.

    ``after_ts`` may be -1 (from the beginning) and ``upto_ts`` larger than the u64 range (to the end);
    None when the range is empty.
    """
    if after_ts < -1 or upto_ts < 0:
        raise ValueError(f"invalid ts range ({after_ts}, {upto_ts}]")
    upto_ts = min(upto_ts, U64_MAX)
    if after_ts >= upto_ts:
        return None
    start = prefix + U64.pack(after_ts + 1) if after_ts >= 0 else prefix
    if upto_ts == U64_MAX:
        stop = prefix_end(prefix)
        if stop is None:
            raise ValueError("prefix has no end")
    else:
        stop = prefix + U64.pack(upto_ts + 1)
    return start, stop


def committed_range(uid: bytes, after_ts: int, upto_ts: int) -> tuple[bytes, bytes] | None:
    """``[start, stop)`` covering the committed keys with ``after_ts < commit_ts <= upto_ts``."""
    return ts_range(committed_prefix(uid), after_ts, upto_ts)
