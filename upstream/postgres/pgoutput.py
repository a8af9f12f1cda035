"""Decoder for PostgreSQL's ``pgoutput`` logical replication protocol (versions 1-4, with streaming).

One XLogData payload is one pgoutput message; :func:`decode` turns it into one message object.
The formats follow PostgreSQL's "Logical Replication Message Formats" (protocol.sgml) and
``src/backend/replication/logical/proto.c``. All integers are big-endian; LSNs and timestamps are
64-bit, xids and OIDs unsigned 32-bit; strings are NUL-terminated UTF-8 (the walsender converts to
the client encoding, UTF8 for our connections); timestamps are microseconds since 2000-01-01 UTC and
are returned as Unix seconds (float) by :func:`pg_time_to_unix`.

Streaming (protocol >= 2, ``streaming = on|parallel``): between Stream Start and Stream Stop, the
Relation, Type, Insert, Update, Delete, Truncate and Message messages carry the int32 xid of the
(sub)transaction right after the type byte. The caller tracks that state and passes ``in_stream``.

Hot path: Insert/Update/Delete are *not* parsed by :func:`decode`; it only reads the relation id at
its fixed offset and returns the message normalised to its non-streamed form (the xid cut out) as
:attr:`Change.raw`, ready to be stored as bytes. :func:`parse_change` parses such a normalised
message (or one made by :func:`truncate_raw`) later, when the row is mounted.

Guarantees: pure functions, no I/O, no global state, thread-safe. Every malformed input (unknown type
byte, truncated or over-long buffer, bad tuple marker, invalid UTF-8) raises
:class:`cdc.errors.DecodeError` naming the type byte and the length; nothing else escapes.
The message types it returns are :mod:`upstream.postgres.pgoutput_messages`.
Two-phase messages (Begin Prepare, Prepare, Commit Prepared, Rollback Prepared, Stream Prepare) are
rejected with DecodeError: Tidewater never enables ``two_phase``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

from cdc.errors import DecodeError
from cdc.events import UNCHANGED
from upstream.base import ParsedChange  # the interface's type: parse_change returns it
from upstream.postgres.pgoutput_messages import (
    PG_EPOCH_UNIX,
    Begin,
    Change,
    Commit,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TypeMsg,
    pg_time_to_unix,
)

# ---- fast construction of the two per-row classes ------------------------------------------------
# A frozen dataclass's __init__ sets each field with object.__setattr__, which costs several times
# a plain slot store. For the per-row objects we build a non-frozen twin with the very same slot
# layout and then switch its class: the result is an ordinary, immutable Change / ParsedChange.


class _ChangeBuilder:
    __slots__ = ("kind", "xid", "relid", "raw")

    def __init__(self, kind: str, xid: int | None, relid: int, raw: bytes) -> None:
        self.kind = kind
        self.xid = xid
        self.relid = relid
        self.raw = raw


class _ParsedChangeBuilder:
    __slots__ = ("kind", "relid", "new", "old", "old_kind", "truncate_options")

    def __init__(
        self,
        kind: str,
        relid: int,
        new: list[Any] | None,
        old: list[Any] | None,
        old_kind: str | None,
        truncate_options: int,
    ) -> None:
        self.kind = kind
        self.relid = relid
        self.new = new
        self.old = old
        self.old_kind = old_kind
        self.truncate_options = truncate_options


for _cls, _builder in ((Change, _ChangeBuilder), (ParsedChange, _ParsedChangeBuilder)):
    if tuple(_cls.__slots__) != _builder.__slots__:  # keep the twins in step with the dataclasses
        raise RuntimeError(f"{_builder.__name__} slots differ from {_cls.__name__}")


def parsed_change(
    kind: str, relid: int, new: list[Any] | None, old: list[Any] | None, old_kind: str | None, opts: int
) -> ParsedChange:
    """``ParsedChange(kind, relid, new, old, old_kind, opts)``, built without the frozen dataclass's __init__."""
    o: Any = _ParsedChangeBuilder(kind, relid, new, old, old_kind, opts)
    o.__class__ = ParsedChange
    return o


# ---- decoding -------------------------------------------------------------------------------------

_U32 = struct.Struct(">I")
_U32_U32 = struct.Struct(">II")
_BEGIN = struct.Struct(">QqI")  # final_lsn, commit_time, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, commit_time
_COMMIT_END = struct.Struct(">Qq")  # end_lsn, commit_time: a Commit's bytes 10..26
_STREAM_START = struct.Struct(">IB")
_STREAM_COMMIT = struct.Struct(">IBQQq")
_STREAM_ABORT = struct.Struct(">II")
_STREAM_ABORT_V4 = struct.Struct(">IIQq")
_I32_B = struct.Struct(">iB")  # truncate: nrelids, options
_B_Q = struct.Struct(">BQ")  # message: flags, lsn
_I32 = struct.Struct(">i")
_U32_I32 = struct.Struct(">Ii")  # column: type oid, typmod
_U16 = struct.Struct(">H")
_TRUNC1 = struct.Struct(">iBI")

_u32_from = _U32.unpack_from
_u32u32_from = _U32_U32.unpack_from
_i32_from = _I32.unpack_from
_u16_from = _U16.unpack_from
_kind_len_from = struct.Struct(">Bi").unpack_from  # tuple column: kind byte, int32 length

_TWO_PHASE = {
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}


def _error(buf: bytes, why: str) -> DecodeError:
    t = chr(buf[0]) if buf else "<empty>"
    return DecodeError(f"pgoutput message type {t!r}, length {len(buf)}: {why}")


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\0", pos)  # ValueError when missing -> caller turns it into DecodeError
    return buf[pos:end].decode(), end + 1


def _check_len(buf: bytes, n: int) -> None:
    if len(buf) != n:
        raise _error(buf, f"expected {n} bytes")


def _begin(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> Begin:
    _check_len(buf, 21)
    final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(final_lsn, pg_time_to_unix(ts), xid)


def _commit(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> Commit:
    _check_len(buf, 26)
    flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, commit_lsn, end_lsn, pg_time_to_unix(ts))


def _origin(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> Origin:
    (lsn,) = struct.unpack_from(">Q", buf, 1)
    name, pos = _cstring(buf, 9)
    if pos != len(buf):
        raise _error(buf, "trailing bytes")
    return Origin(lsn, name)


def _relation(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> Relation:
    pos = 1
    xid = None
    if in_stream:
        (xid,) = _u32_from(buf, pos)
        pos += 4
    (relid,) = _u32_from(buf, pos)
    namespace, pos = _cstring(buf, pos + 4)
    name, pos = _cstring(buf, pos)
    ident = chr(buf[pos])
    (ncols,) = _u16_from(buf, pos + 1)
    pos += 3
    cols = []
    for _ in range(ncols):
        flags = buf[pos]
        cname, pos = _cstring(buf, pos + 1)
        type_oid, typmod = _U32_I32.unpack_from(buf, pos)
        pos += 8
        cols.append(RelationColumn(flags, cname, type_oid, typmod))
    if pos != len(buf):
        raise _error(buf, "trailing bytes")
    return Relation(xid, relid, namespace or "pg_catalog", name, ident, tuple(cols))


def _type(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> TypeMsg:
    pos = 1
    xid = None
    if in_stream:
        (xid,) = _u32_from(buf, pos)
        pos += 4
    (oid,) = _u32_from(buf, pos)
    namespace, pos = _cstring(buf, pos + 4)
    name, pos = _cstring(buf, pos)
    if pos != len(buf):
        raise _error(buf, "trailing bytes")
    return TypeMsg(xid, oid, namespace or "pg_catalog", name)


def _message(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> LogicalMessage:
    pos = 1
    xid = None
    if in_stream:
        (xid,) = _u32_from(buf, pos)
        pos += 4
    flags, lsn = _B_Q.unpack_from(buf, pos)
    prefix, pos = _cstring(buf, pos + 9)
    (size,) = _i32_from(buf, pos)
    pos += 4
    if size < 0 or pos + size != len(buf):
        raise _error(buf, f"content length {size} does not match the buffer")
    return LogicalMessage(xid, flags, lsn, prefix, buf[pos:])


def _truncate(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> Truncate:
    pos = 1
    xid = None
    if in_stream:
        (xid,) = _u32_from(buf, pos)
        pos += 4
    nrelids, options = _I32_B.unpack_from(buf, pos)
    pos += 5
    if nrelids < 0 or pos + 4 * nrelids != len(buf):
        raise _error(buf, f"{nrelids} relation ids do not match the buffer")
    relids = struct.unpack_from(f">{nrelids}I", buf, pos)
    return Truncate(xid, options, relids)


def _stream_start(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> StreamStart:
    _check_len(buf, 6)
    xid, first = _STREAM_START.unpack_from(buf, 1)
    return StreamStart(xid, first == 1)


def _stream_stop(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> StreamStop:
    _check_len(buf, 1)
    return _STREAM_STOP


def _stream_commit(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> StreamCommit:
    _check_len(buf, 30)
    xid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(buf, 1)
    return StreamCommit(xid, flags, commit_lsn, end_lsn, pg_time_to_unix(ts))


def _stream_abort(buf: bytes, in_stream: bool, abort_has_lsn: bool) -> StreamAbort:
    n = len(buf)
    if n == 25:
        xid, subxid, lsn, ts = _STREAM_ABORT_V4.unpack_from(buf, 1)
        return StreamAbort(xid, subxid, lsn, pg_time_to_unix(ts))
    if n == 9 and not abort_has_lsn:
        xid, subxid = _STREAM_ABORT.unpack_from(buf, 1)
        return StreamAbort(xid, subxid, None, None)
    raise _error(buf, "expected 25 bytes" if abort_has_lsn else "expected 9 (or 25) bytes")


_STREAM_STOP = StreamStop()

_DISPATCH = {
    ord("B"): _begin,
    ord("C"): _commit,
    ord("O"): _origin,
    ord("R"): _relation,
    ord("Y"): _type,
    ord("M"): _message,
    ord("T"): _truncate,
    ord("S"): _stream_start,
    ord("E"): _stream_stop,
    ord("c"): _stream_commit,
    ord("A"): _stream_abort,
}

_I, _U, _D = ord("I"), ord("U"), ord("D")
_KIND = {_I: "I", _U: "U", _D: "D"}
# first byte of the tuple part that must follow the relid
_FIRST_MARK = {_I: frozenset(b"N"), _U: frozenset(b"NKO"), _D: frozenset(b"KO")}


PLAIN_CHANGE_TYPES = frozenset((_I, _U, _D))
BEGIN, COMMIT = ord("B"), ord("C")  # first bytes of the (non-streamed) Begin and Commit messages, yielded raw too


def begin_xid(buf: bytes) -> int:
    """The xid of a raw Begin message ``buf`` (``decode(buf).xid``, checked as :func:`decode` checks it; raises
    :class:`DecodeError` on malformed input). Per transaction on the puller's path: no Begin object."""
    if len(buf) != 21:  # (_check_len inline: one call less per transaction)
        raise _error(buf, "expected 21 bytes")
    return _U32.unpack_from(buf, 17)[0]  # type: ignore[no-any-return]


def commit_position(buf: bytes) -> tuple[int, float]:
    """``(end_lsn, commit_time)`` of a raw Commit message ``buf`` (those of ``decode(buf)``, checked as :func:`decode`
    checks it; raises :class:`DecodeError` on malformed input). Per transaction: no Commit object."""
    if len(buf) != 26:  # (_check_len and pg_time_to_unix inline: two calls less per transaction)
        raise _error(buf, "expected 26 bytes")
    end_lsn, ts = _COMMIT_END.unpack_from(buf, 10)
    return end_lsn, PG_EPOCH_UNIX + ts / 1_000_000


def plain_change_relid(buf: bytes) -> int:
    """The relid of a non-streamed Insert/Update/Delete message ``buf`` (its first byte is in
    ``PLAIN_CHANGE_TYPES``), checked as :func:`decode` checks it; the message itself stays unparsed (it
    is what ``Change.raw`` would hold). Raises :class:`DecodeError` on malformed input. The hot path of
    the puller: no ``Change`` object per row."""
    try:
        if buf[5] not in _FIRST_MARK[buf[0]]:
            raise _error(buf, f"unexpected tuple marker {buf[5]:#x}")
        return _u32_from(buf, 1)[0]  # type: ignore[no-any-return]
    except (IndexError, KeyError, struct.error) as e:
        raise _error(buf, f"malformed ({e!r})") from e


def decode(buf: bytes | memoryview | bytearray, in_stream: bool, *, abort_has_lsn: bool = False) -> Message:
    """Decode one pgoutput message (one XLogData payload).

    ``in_stream``: True between Stream Start and Stream Stop (Relation, Type, Insert, Update,
    Delete, Truncate and Message then carry an xid). ``abort_has_lsn``: True for protocol 4 with
    ``streaming = parallel``, where Stream Abort carries the abort LSN and time; a 25-byte Stream
    Abort is decoded with them either way, a 9-byte one is an error when this is True.

    Insert/Update/Delete are returned as :class:`Change` without parsing the tuples (only the
    relid and the first tuple marker are checked). Raises :class:`DecodeError` on any malformed
    input. Pure and thread-safe; a memoryview/bytearray ``buf`` is copied, so the result never
    aliases a mutable buffer.
    """
    if type(buf) is not bytes:
        buf = bytes(buf)
    try:
        t = buf[0]
        kind = _KIND.get(t)
        if kind is not None:
            if in_stream:
                xid, relid = _u32u32_from(buf, 1)
                if buf[9] not in _FIRST_MARK[t]:
                    raise _error(buf, f"unexpected tuple marker {buf[9]:#x}")
                o: Any = _ChangeBuilder(kind, xid, relid, buf[:1] + buf[5:])
                o.__class__ = Change
                return o
            (relid,) = _u32_from(buf, 1)
            if buf[5] not in _FIRST_MARK[t]:
                raise _error(buf, f"unexpected tuple marker {buf[5]:#x}")
            o = _ChangeBuilder(kind, None, relid, buf)
            o.__class__ = Change
            return o
        fn = _DISPATCH.get(t)
        if fn is None:
            if t in _TWO_PHASE:
                raise _error(buf, f"two-phase message {_TWO_PHASE[t]} is not supported")
            raise _error(buf, "unknown message type")
        return fn(buf, in_stream, abort_has_lsn)
    except DecodeError:
        raise
    except (IndexError, ValueError, struct.error) as e:  # UnicodeDecodeError is a ValueError
        raise _error(buf, f"malformed ({e})") from e


def truncate_raw(relid: int, options: int) -> bytes:
    """A normalised single-relation Truncate message ('T', 1 relid, options), for per-table storage."""
    return b"T" + _TRUNC1.pack(1, options, relid)


# ---- tuple parsing --------------------------------------------------------------------------------

_N, _K, _O = ord("N"), ord("K"), ord("O")
_NULL, _UNCH, _TEXT, _BIN = ord("n"), ord("u"), ord("t"), ord("b")


def _tuple(raw: bytes, pos: int) -> tuple[list[Any], int]:
    ncols = (raw[pos] << 8) | raw[pos + 1]
    pos += 2
    values: list[Any] = [None] * ncols
    # Per column, the kind byte and the length after it are read in one unpack (a 'n'/'u' column has no
    # length: whatever follows is read and ignored) while 5 bytes are left. An all-ASCII message (the
    # common case) is decoded once: its str slices equal the values' UTF-8 decodings, one object each.
    last = len(raw) - 5
    text = raw.decode("ascii") if raw.isascii() else None
    for i in range(ncols):
        if pos <= last:
            k, n = _kind_len_from(raw, pos)
        else:
            k = raw[pos]
            n = _i32_from(raw, pos + 1)[0] if k in (_TEXT, _BIN) else 0  # truncated: struct.error
        if k == _TEXT:
            if n < 0:
                raise _error(raw, f"negative value length at offset {pos}")
            pos += 5
            end = pos + n
            values[i] = raw[pos:end].decode() if text is None else text[pos:end]
            pos = end
        elif k == _NULL:
            pos += 1
        elif k == _UNCH:
            values[i] = UNCHANGED
            pos += 1
        elif k == _BIN:
            if n < 0:
                raise _error(raw, f"negative value length at offset {pos}")
            pos += 5
            end = pos + n
            values[i] = raw[pos:end]
            pos = end
        else:
            raise _error(raw, f"unknown column kind {k:#x} at offset {pos}")
    return values, pos


def insert_values(buf: bytes, offset: int) -> tuple[int, list[Any]] | None:
    """Fast path of :func:`parse_change` for an Insert starting at ``buf[offset]``: ``(relid, new)``.

    Returns None when ``buf[offset:]`` is not a well-formed Insert (then :func:`parse_change` of that slice
    raises the precise :class:`DecodeError`). Pure and thread-safe.
    """
    try:
        if buf[offset] != _I or buf[offset + 5] != _N:
            return None
        (relid,) = _u32_from(buf, offset + 1)
        new, pos = _tuple(buf, offset + 6)
    except (DecodeError, IndexError, ValueError, struct.error):
        return None
    return (relid, new) if pos == len(buf) else None


_STR_OR_NULL = frozenset((str, type(None)))


def plain_row(buf: bytes, offset: int, parse_row: Callable[[Sequence[Any]], tuple[Any, ...]],
              ncols: int) -> tuple[str, int, tuple[Any, ...], list[Any]] | None:
    """Fast path of the mounter for a row that needs nothing but its new tuple: an Insert, or an Update without an
    old tuple, starting at ``buf[offset]``, whose ``ncols`` values are all text or NULL and all parse with
    ``parse_row``: ``(kind 'I' or 'U', relid, parse_row(values), values)``.

    Returns None for anything else (another message kind, an old tuple, an unchanged TOAST or binary value, a
    column count other than ``ncols``, a value ``parse_row`` refuses, a malformed message): the caller's general
    path (:func:`parse_change`) handles it and reports errors precisely. Pure and thread-safe.
    """
    try:
        t = buf[offset]
        if (t != _I and t != _U) or buf[offset + 5] != _N:
            return None
        (relid,) = _u32_from(buf, offset + 1)
        new, pos = _tuple(buf, offset + 6)
    except (DecodeError, IndexError, ValueError, struct.error):
        return None
    if pos != len(buf) or len(new) != ncols or not _STR_OR_NULL.issuperset(map(type, new)):
        return None
    try:
        row = parse_row(new)
    except Exception:  # noqa: BLE001 - the general path locates and reports the value
        return None
    return ("I" if t == _I else "U"), relid, row, new


def parse_change(raw: bytes) -> ParsedChange:
    """Parse a normalised (non-streamed form) Insert/Update/Delete/Truncate message.

    Values are returned in the Relation's column order. Raises :class:`DecodeError` when the
    message is malformed, truncated or has trailing bytes. Pure and thread-safe.
    """
    if type(raw) is not bytes:
        raw = bytes(raw)
    try:
        t = raw[0]
        if t == _I:
            (relid,) = _u32_from(raw, 1)
            if raw[5] != _N:
                raise _error(raw, "expected 'N'")
            new, pos = _tuple(raw, 6)
            if pos != len(raw):
                raise _error(raw, "length mismatch")
            o: Any = _ParsedChangeBuilder("I", relid, new, None, None, 0)
            o.__class__ = ParsedChange
            return o
        if t == _U:
            (relid,) = _u32_from(raw, 1)
            mark = raw[5]
            old = None
            old_kind = None
            pos = 6
            if mark in (_K, _O):
                old_kind = "K" if mark == _K else "O"
                old, pos = _tuple(raw, 6)
                mark = raw[pos]
                pos += 1
            if mark != _N:
                raise _error(raw, "expected 'N'")
            new, pos = _tuple(raw, pos)
            if pos != len(raw):
                raise _error(raw, "length mismatch")
            return parsed_change("U", relid, new, old, old_kind, 0)
        if t == _D:
            (relid,) = _u32_from(raw, 1)
            mark = raw[5]
            if mark != _K and mark != _O:
                raise _error(raw, "expected 'K' or 'O'")
            old, pos = _tuple(raw, 6)
            if pos != len(raw):
                raise _error(raw, "length mismatch")
            return parsed_change("D", relid, None, old, "K" if mark == _K else "O", 0)
        if t == ord("T"):
            tr = _truncate(raw, False, False)
            if not tr.relids:
                raise _error(raw, "no relation ids")
            return parsed_change("T", tr.relids[0], None, None, None, tr.options)
        raise _error(raw, "not a change message")
    except DecodeError:
        raise
    except (IndexError, ValueError, struct.error) as e:
        raise _error(raw, f"malformed ({e})") from e
