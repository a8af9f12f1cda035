"""pgoutput decoder: messages built byte by byte with our own small encoder (PostgreSQL's proto.c layout)."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest

from cdc.errors import DecodeError
from cdc.events import UNCHANGED
from tests import rowcodecs
from tests.pgoutput_wire import (
    TS_UNIX,
    TS_US,
    enc_begin,
    enc_commit,
    enc_delete,
    enc_insert,
    enc_message,
    enc_origin,
    enc_relation,
    enc_stream_abort,
    enc_stream_commit,
    enc_stream_start,
    enc_truncate,
    enc_tuple,
    enc_type,
    enc_update,
    strip_xid,
)
from upstream.base import ParsedChange
from upstream.postgres.pgoutput import decode, parse_change, truncate_raw
from upstream.postgres.pgoutput_messages import (
    Begin,
    Change,
    Commit,
    LogicalMessage,
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
from upstream.postgres.rowcodec import RowCodec

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, params=rowcodecs.NAMES)
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> RowCodec:
    """Every test here runs over both implementations of the per-row functions (tests/rowcodecs.py)."""
    return rowcodecs.use(request.param, monkeypatch, globals())

BIG_XID = 0xFFFF_FFF0  # above 2**31: must come back unsigned
BIG_OID = 0xFFFF_FF00
ROW = ["42", None, UNCHANGED, "héllo wörld ✓", b"\x00\x01\xff", ""]

# ---- control messages -----------------------------------------------------------------------------


def test_pg_time_to_unix() -> None:
    assert pg_time_to_unix(0) == 946_684_800.0
    assert pg_time_to_unix(-1_000_000) == 946_684_799.0
    assert pg_time_to_unix(TS_US) == pytest.approx(TS_UNIX, abs=1e-6)


def test_begin_and_commit() -> None:
    b = decode(enc_begin(0x1_0000_0010, TS_US, BIG_XID), False)
    assert b == Begin(0x1_0000_0010, pytest.approx(TS_UNIX, abs=1e-6), BIG_XID)
    assert isinstance(b, Begin) and b.xid == BIG_XID
    c = decode(enc_commit(0, 0x1_0000_0010, 0x1_0000_0040, TS_US), False)
    assert isinstance(c, Commit)
    assert (c.flags, c.commit_lsn, c.end_lsn) == (0, 0x1_0000_0010, 0x1_0000_0040)
    assert c.commit_time == pytest.approx(TS_UNIX, abs=1e-6)


def test_begin_accepts_memoryview_and_bytearray() -> None:
    msg = enc_begin(7, TS_US, 9)
    assert decode(memoryview(msg), False) == decode(msg, False) == decode(bytearray(msg), False)


def test_origin() -> None:
    assert decode(enc_origin(0xABCDEF, "pg_16385"), False) == Origin(0xABCDEF, "pg_16385")


@pytest.mark.parametrize("xid", [None, BIG_XID])
def test_relation(xid: int | None) -> None:
    cols = [(1, "id", 23, -1), (0, "name", 1043, 104), (1, "tenant", BIG_OID, -1), (0, "ünï", 25, -1)]
    msg = enc_relation(xid, BIG_OID - 1, "app", "orders", "d", cols)
    r = decode(msg, xid is not None)
    assert r == Relation(
        xid,
        BIG_OID - 1,
        "app",
        "orders",
        "d",
        (
            RelationColumn(1, "id", 23, -1),
            RelationColumn(0, "name", 1043, 104),
            RelationColumn(1, "tenant", BIG_OID, -1),
            RelationColumn(0, "ünï", 25, -1),
        ),
    )
    assert [c.is_key for c in r.columns] == [True, False, True, False]


def test_relation_empty_namespace_means_pg_catalog_and_zero_columns() -> None:
    r = decode(enc_relation(None, 5, "", "t", "n", []), False)
    assert isinstance(r, Relation)
    assert (r.namespace, r.replica_identity, r.columns) == ("pg_catalog", "n", ())


@pytest.mark.parametrize("xid", [None, 77])
def test_type(xid: int | None) -> None:
    assert decode(enc_type(xid, 16_500, "public", "mood"), xid is not None) == TypeMsg(
        xid, 16_500, "public", "mood"
    )
    assert decode(enc_type(xid, 16_500, "", "x"), xid is not None).namespace == "pg_catalog"


@pytest.mark.parametrize("xid", [None, BIG_XID])
def test_logical_message(xid: int | None) -> None:
    content = b"\x00binary\xffcontent\x00"
    m = decode(enc_message(xid, 1, 0x5_0000_0000, "tidewater", content), xid is not None)
    assert m == LogicalMessage(xid, 1, 0x5_0000_0000, "tidewater", content)
    assert isinstance(m, LogicalMessage) and m.transactional and type(m.content) is bytes
    m2 = decode(enc_message(None, 0, 1, "p", b""), False)
    assert isinstance(m2, LogicalMessage) and not m2.transactional and m2.content == b""


def test_stream_control_messages() -> None:
    assert decode(enc_stream_start(BIG_XID, True), False) == StreamStart(BIG_XID, True)
    assert decode(enc_stream_start(5, False), False) == StreamStart(5, False)
    assert decode(b"E", True) == StreamStop()
    sc = decode(enc_stream_commit(BIG_XID, 0, 100, 200, TS_US), False)
    assert sc == StreamCommit(BIG_XID, 0, 100, 200, pytest.approx(TS_UNIX, abs=1e-6))


def test_stream_abort_v2_v3_layout() -> None:
    assert decode(enc_stream_abort(10, 11), False) == StreamAbort(10, 11, None, None)
    assert decode(enc_stream_abort(10, 10), True) == StreamAbort(10, 10, None, None)


def test_stream_abort_v4_parallel_layout() -> None:
    msg = enc_stream_abort(10, 12, 0x2_0000_0000, TS_US)
    a = decode(msg, False, abort_has_lsn=True)
    assert isinstance(a, StreamAbort)
    assert (a.xid, a.subxid, a.abort_lsn) == (10, 12, 0x2_0000_0000)
    assert a.abort_time == pytest.approx(TS_UNIX, abs=1e-6)
    # the 25-byte layout is unambiguous, so it is decoded whatever the flag says
    assert decode(msg, False) == a
    # but when the LSN is expected, a short abort is an error
    with pytest.raises(DecodeError, match="'A'"):
        decode(enc_stream_abort(10, 12), False, abort_has_lsn=True)


# ---- changes --------------------------------------------------------------------------------------


def test_insert_not_streamed_is_returned_as_is() -> None:
    msg = enc_insert(None, BIG_OID, ROW)
    c = decode(msg, False)
    assert c == Change("I", None, BIG_OID, msg)
    assert type(c) is Change and type(c.raw) is bytes


@pytest.mark.parametrize(
    "enc,kind",
    [
        (lambda x: enc_insert(x, 16384, ROW), "I"),
        (lambda x: enc_update(x, 16384, ROW), "U"),
        (lambda x: enc_update(x, 16384, ROW, ["1", None], "K"), "U"),
        (lambda x: enc_update(x, 16384, ROW, ROW, "O"), "U"),
        (lambda x: enc_delete(x, 16384, ["1", None], "K"), "D"),
        (lambda x: enc_delete(x, 16384, ROW, "O"), "D"),
    ],
)
def test_streamed_change_is_normalised(enc: Any, kind: str) -> None:
    plain, streamed = enc(None), enc(BIG_XID)
    c = decode(streamed, True)
    assert c == Change(kind, BIG_XID, 16384, plain)
    assert decode(plain, False) == Change(kind, None, 16384, plain)
    assert decode(memoryview(streamed), True) == c
    assert parse_change(c.raw) == parse_change(plain)


def test_change_objects_are_genuine_frozen_dataclasses() -> None:
    c = decode(enc_insert(None, 1, ["x"]), False)
    p = parse_change(c.raw)
    for obj in (c, p):
        assert dataclasses.is_dataclass(obj)
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.kind = "D"  # type: ignore[misc]
        assert not hasattr(obj, "__dict__")
    assert hash(c) == hash(Change("I", None, 1, c.raw))
    assert repr(c).startswith("Change(kind='I'")
    assert dataclasses.replace(c, relid=2).relid == 2


def test_parse_insert_all_value_kinds() -> None:
    p = parse_change(enc_insert(None, 7, ROW))
    assert p == ParsedChange("I", 7, ROW, None, None, 0)
    assert p.new is not None
    assert p.new[2] is UNCHANGED and p.new[1] is None
    assert type(p.new[3]) is str and type(p.new[4]) is bytes


def test_parse_update_variants() -> None:
    assert parse_change(enc_update(None, 7, ROW)) == ParsedChange("U", 7, ROW, None, None, 0)
    key = ["1", None, None, None, None, None]
    assert parse_change(enc_update(None, 7, ROW, key, "K")) == ParsedChange("U", 7, ROW, key, "K", 0)
    old = ["0", "a", None, "b", b"", "c"]
    assert parse_change(enc_update(None, 7, ROW, old, "O")) == ParsedChange("U", 7, ROW, old, "O", 0)


def test_parse_delete_variants() -> None:
    assert parse_change(enc_delete(None, 8, ["5", None], "K")) == ParsedChange(
        "D", 8, None, ["5", None], "K", 0
    )
    assert parse_change(enc_delete(None, 8, ROW, "O")) == ParsedChange("D", 8, None, ROW, "O", 0)


def test_parse_empty_tuple_and_large_value() -> None:
    big = "x" * 100_000
    assert parse_change(enc_insert(None, 1, [])).new == []
    assert parse_change(enc_insert(None, 1, [big, b"\x00" * 70_000])).new == [big, b"\x00" * 70_000]


@pytest.mark.parametrize("xid", [None, BIG_XID])
def test_truncate_multi_relation(xid: int | None) -> None:
    msg = enc_truncate(xid, 3, [16384, BIG_OID, 16390])
    t = decode(msg, xid is not None)
    assert t == Truncate(xid, 3, (16384, BIG_OID, 16390))
    assert parse_change(strip_xid(msg) if xid is not None else msg) == ParsedChange(
        "T", 16384, None, None, None, 3
    )


def test_truncate_raw_round_trip() -> None:
    raw = truncate_raw(BIG_OID, 2)
    assert raw == enc_truncate(None, 2, [BIG_OID])
    assert decode(raw, False) == Truncate(None, 2, (BIG_OID,))
    assert parse_change(raw) == ParsedChange("T", BIG_OID, None, None, None, 2)


# ---- malformed input ------------------------------------------------------------------------------

ALL_MESSAGES: list[tuple[bytes, bool, bool]] = [
    (enc_begin(1, 2, 3), False, False),
    (enc_commit(0, 1, 2, 3), False, False),
    (enc_origin(1, "o"), False, False),
    (enc_relation(None, 1, "s", "t", "d", [(1, "a", 23, -1), (0, "b", 25, -1)]), False, False),
    (enc_relation(9, 1, "s", "t", "f", [(1, "a", 23, -1)]), True, False),
    (enc_type(None, 1, "s", "t"), False, False),
    (enc_type(9, 1, "s", "t"), True, False),
    (enc_message(None, 1, 5, "pfx", b"abc"), False, False),
    (enc_message(9, 1, 5, "pfx", b"abc"), True, False),
    (enc_truncate(None, 0, [1, 2]), False, False),
    (enc_truncate(9, 0, [1, 2]), True, False),
    (enc_stream_start(1, True), False, False),
    (enc_stream_commit(1, 0, 2, 3, 4), False, False),
    (enc_stream_abort(1, 2), False, False),
    (enc_stream_abort(1, 2, 3, 4), False, True),
    (b"E", True, False),
]
ALL_CHANGES: list[tuple[bytes, bool]] = [
    (enc_insert(None, 1, ROW), False),
    (enc_insert(9, 1, ROW), True),
    (enc_update(None, 1, ROW, ROW, "O"), False),
    (enc_update(9, 1, ROW, ["1", None], "K"), True),
    (enc_update(None, 1, ROW), False),
    (enc_delete(None, 1, ROW, "O"), False),
    (enc_delete(9, 1, ["1"], "K"), True),
]


@pytest.mark.parametrize("msg,in_stream,has_lsn", ALL_MESSAGES)
def test_every_truncation_of_a_message_is_an_error(msg: bytes, in_stream: bool, has_lsn: bool) -> None:
    decode(msg, in_stream, abort_has_lsn=has_lsn)  # the full message is fine
    for n in range(len(msg)):
        with pytest.raises(DecodeError):
            decode(msg[:n], in_stream, abort_has_lsn=has_lsn)


@pytest.mark.parametrize("msg,in_stream,has_lsn", ALL_MESSAGES)
def test_trailing_garbage_is_an_error(msg: bytes, in_stream: bool, has_lsn: bool) -> None:
    with pytest.raises(DecodeError):
        decode(msg + b"\x00", in_stream, abort_has_lsn=has_lsn)


@pytest.mark.parametrize("msg,in_stream", ALL_CHANGES)
def test_every_truncation_of_a_change_is_an_error(msg: bytes, in_stream: bool) -> None:
    raw = decode(msg, in_stream).raw  # type: ignore[union-attr]
    parse_change(raw)
    for n in range(len(msg)):
        with pytest.raises(DecodeError):
            c = decode(msg[:n], in_stream)
            assert isinstance(c, Change)
            parse_change(c.raw)  # decode does not parse tuples: the parser must catch the rest
    with pytest.raises(DecodeError):
        parse_change(raw + b"n")


def test_error_names_type_byte_and_length() -> None:
    with pytest.raises(DecodeError) as ei:
        decode(b"Q\x00\x01", False)
    assert "'Q'" in str(ei.value) and "length 3" in str(ei.value)
    assert ei.value.code == "CDC:ErrDecode"
    with pytest.raises(DecodeError, match="length 4"):
        decode(enc_begin(1, 2, 3)[:4], False)
    with pytest.raises(DecodeError, match="<empty>"):
        decode(b"", False)


@pytest.mark.parametrize("t", [b"b", b"P", b"K", b"r", b"p"])
def test_two_phase_messages_are_rejected(t: bytes) -> None:
    with pytest.raises(DecodeError, match="two-phase"):
        decode(t + b"\x00" * 40, False)


def test_bad_tuple_markers_and_values() -> None:
    with pytest.raises(DecodeError, match="marker"):
        decode(b"I" + struct.pack(">I", 1) + b"K" + enc_tuple(["a"]), False)
    with pytest.raises(DecodeError, match="marker"):
        decode(b"D" + struct.pack(">II", 5, 1) + b"N" + enc_tuple(["a"]), True)
    with pytest.raises(DecodeError):  # old tuple without the new one
        parse_change(b"U" + struct.pack(">I", 1) + b"O" + enc_tuple(["a"]))
    with pytest.raises(DecodeError):  # old tuple followed by a second old tuple
        parse_change(b"U" + struct.pack(">I", 1) + b"O" + enc_tuple(["a"]) + b"K" + enc_tuple(["a"]))
    with pytest.raises(DecodeError, match="column kind"):
        parse_change(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"x")
    with pytest.raises(DecodeError, match="negative"):
        parse_change(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">i", -1))
    with pytest.raises(DecodeError, match="malformed"):  # invalid UTF-8 in a text value
        parse_change(
            b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">i", 1) + b"\xff"
        )
    with pytest.raises(DecodeError, match="not a change"):
        parse_change(enc_begin(1, 2, 3))
    with pytest.raises(DecodeError, match="no relation"):
        parse_change(enc_truncate(None, 0, []))
    with pytest.raises(DecodeError):  # negative relation count
        decode(b"T" + struct.pack(">iB", -1, 0), False)
    with pytest.raises(DecodeError):  # message content longer than the buffer
        decode(b"M" + struct.pack(">BQ", 1, 1) + b"p\0" + struct.pack(">i", 10) + b"abc", False)


def test_in_stream_flag_mismatch_is_detected_where_the_layout_allows() -> None:
    # a streamed Relation read as non-streamed: the xid is taken for the relid and the names go wrong
    msg = enc_relation(9, 1, "s", "t", "d", [(1, "a", 23, -1)])
    with pytest.raises(DecodeError):
        decode(msg, False)


def test_begin_xid_and_commit_position_read_raw_messages_as_decode_does() -> None:
    from tests.pgoutput_wire import enc_begin, enc_commit
    from upstream.postgres import pgoutput

    for xid, lsn, t in ((1, 16, 0), (2**32 - 1, 2**64 - 2, -5_000_000), (7, 1 << 40, 848_000_000_123_456)):
        b, c = enc_begin(lsn, t, xid), enc_commit(0, lsn, lsn + 1, t)
        assert pgoutput.begin_xid(b) == pgoutput.decode(b, False).xid
        m = pgoutput.decode(c, False)
        assert pgoutput.commit_position(c) == (m.end_lsn, m.commit_time)
        for bad in (b[:-1], b + b"\0"):
            with pytest.raises(DecodeError):
                pgoutput.begin_xid(bad)
        for bad in (c[:-1], c + b"\0"):
            with pytest.raises(DecodeError):
                pgoutput.commit_position(bad)
