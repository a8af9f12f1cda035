"""Key and value layout of the LevelDB sorter and its spill files (pure functions, no I/O).

LevelDB holds *committed segments* that did not fit the span's memory budget (the sink lags): a run of
consecutive committed transactions, packed into one value under::

    b"C" + span_uid(8) + first_commit_ts(u64)               (17 bytes)

Integers in keys are unsigned big-endian, so LevelDB's bytewise order is replay order (the idea of
TiCDC's pebble sorter keys), and each span owns one disjoint range. A segment value (``pack_segment``)
is::

    ntxns(u32) nrows(u32) | commit_ts(u64) x ntxns | commit_time(f64) x ntxns | rows(u32) x ntxns
                          | payload length(u32) x nrows | payloads

so packing and unpacking are a few C-level array operations, not a Python loop per row.

A *spill file* holds the changes of one open transaction that outgrew its memory buffer, appended in
chunks (``pack_spill_chunk``)::

    nrows(u32) nbytes(u32) | subxid(u64) x nrows | payload length(u32) x nrows | payloads

Array items use the machine's byte order: spill files and segments never leave the process that wrote
them (the sorter is a cache, wiped when a capture starts). ``xid``/``subxid`` are 64-bit because
MySQL/MariaDB transaction ids are.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate, chain

COMMITTED = b"C"
SPAN_UID_LEN = 8
PREFIX_LEN = 1 + SPAN_UID_LEN  # area byte + span uid
KEY_LEN = PREFIX_LEN + 8
U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1

U64 = struct.Struct(">Q")
COUNTS = struct.Struct("=II")  # (ntxns, nrows) of a segment, (nrows, nbytes) of a spill chunk

for _code, _size in (("Q", 8), ("d", 8), ("I", 4)):
    if array(_code).itemsize != _size:  # pragma: no cover - every platform CPython supports here
        raise ImportError(f"array type {_code!r} is not {_size} bytes on this platform")


def span_uid(span_key: str) -> bytes:
    """A stable 8-byte id of a span key such as ``'changefeed-id/3'`` (blake2b, 64 bits)."""
    return hashlib.blake2b(span_key.encode("utf-8"), digest_size=SPAN_UID_LEN).digest()


def check_u64(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` fits an unsigned 64-bit integer."""
    if not 0 <= value <= U64_MAX:
        raise ValueError(f"{name} out of the unsigned 64-bit range: {value}")


def check_range(after_ts: int, upto_ts: int) -> bool:
    """Validate a read range ``(after_ts, upto_ts]``; False when it is empty.

    ``after_ts`` may be -1 (from the beginning) and ``upto_ts`` larger than the u64 range (to the end).
    """
    if after_ts < -1 or upto_ts < 0:
        raise ValueError(f"invalid ts range ({after_ts}, {upto_ts}]")
    return after_ts < min(upto_ts, U64_MAX)


def committed_prefix(uid: bytes) -> bytes:
    if len(uid) != SPAN_UID_LEN:
        raise ValueError(f"span uid must be {SPAN_UID_LEN} bytes, got {len(uid)}")
    return COMMITTED + uid


def segment_key(uid: bytes, first_ts: int) -> bytes:
    check_u64("commit_ts", first_ts)
    return committed_prefix(uid) + U64.pack(first_ts)


def decode_segment_key(key: bytes) -> tuple[bytes, int]:
    """``(span_uid, first_commit_ts)`` of a segment key."""
    if len(key) != KEY_LEN or key[:1] != COMMITTED:
        raise ValueError(f"not a committed segment key: {key!r}")
    return key[1:PREFIX_LEN], U64.unpack_from(key, PREFIX_LEN)[0]


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    b = bytearray(prefix)
    while b:
        if b[-1] != 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return None


def _lengths(payloads: Iterable[bytes]) -> array:
    try:
        return array("I", map(len, payloads))
    except OverflowError:
        raise ValueError("a sorter payload is 4 GiB or larger") from None


def _split(data: bytes, lengths: array, start: int = 0) -> list[bytes]:
    """``data[start:]`` cut into consecutive pieces of ``lengths`` (the loops run in C)."""
    ends = list(accumulate(lengths, initial=start))
    if ends[-1] > len(data):
        raise ValueError(f"sorter data truncated: {len(data)} bytes, lengths need {ends[-1]}")
    return list(map(data.__getitem__, map(slice, ends[:-1], ends[1:])))


def pack_segment(txns: Sequence[tuple[int, float, Sequence[bytes]]]) -> bytes:
    """One value holding ``(commit_ts, commit_time, payloads)`` transactions (see the module doc)."""
    rows = array("I", (len(p) for _, _, p in txns))
    all_payloads = list(chain.from_iterable(p for _, _, p in txns))
    return b"".join((
        COUNTS.pack(len(txns), len(all_payloads)),
        array("Q", (t[0] for t in txns)).tobytes(),
        array("d", (t[1] for t in txns)).tobytes(),
        rows.tobytes(),
        _lengths(all_payloads).tobytes(),
        *all_payloads,
    ))


def unpack_segment(value: bytes) -> list[tuple[int, float, list[bytes]]]:
    """Inverse of ``pack_segment``; ValueError on a malformed value."""
    if len(value) < COUNTS.size:
        raise ValueError("sorter segment shorter than its header")
    ntxns, nrows = COUNTS.unpack_from(value)
    mv = memoryview(value)
    pos = COUNTS.size
    parts: list[array] = []
    for code, n in (("Q", ntxns), ("d", ntxns), ("I", ntxns), ("I", nrows)):
        a = array(code)
        end = pos + n * a.itemsize
        if end > len(value):
            raise ValueError("sorter segment truncated")
        a.frombytes(mv[pos:end])
        parts.append(a)
        pos = end
    ts, times, counts, lengths = parts
    if sum(counts) != nrows:
        raise ValueError("sorter segment row counts do not add up")
    payloads = _split(value, lengths, pos)
    out: list[tuple[int, float, list[bytes]]] = []
    i = 0
    for t, tm, n in zip(ts, times, counts, strict=True):
        out.append((t, tm, payloads[i : i + n]))
        i += n
    return out


def pack_spill_chunk(subxids: Sequence[int], payloads: Sequence[bytes]) -> bytes:
    """One appended chunk of a spill file (see the module doc)."""
    lengths = _lengths(payloads)
    try:
        subs = array("Q", subxids)
    except OverflowError:
        raise ValueError("subxid out of the unsigned 64-bit range") from None
    data = b"".join(payloads)
    if len(data) > U32_MAX:
        raise ValueError("spill chunk of 4 GiB or more")
    return b"".join((COUNTS.pack(len(payloads), len(data)), subs.tobytes(), lengths.tobytes(), data))


def spill_chunk_sizes(header: bytes) -> tuple[int, int]:
    """``(nrows, bytes after the header)`` of a spill chunk whose ``COUNTS.size`` header is given."""
    nrows, nbytes = COUNTS.unpack(header)
    return nrows, nrows * 12 + nbytes


def unpack_spill_chunk(nrows: int, body: bytes) -> tuple[array, list[bytes]]:
    """``(subxids, payloads)`` of a chunk body (everything after its header)."""
    mv = memoryview(body)
    subs = array("Q")
    subs.frombytes(mv[: nrows * 8])
    lengths = array("I")
    lengths.frombytes(mv[nrows * 8 : nrows * 12])
    return subs, _split(body, lengths, nrows * 12)
