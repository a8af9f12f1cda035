"""Mounter: stored pgoutput payloads -> typed RowChange (processor.mounter).

Raw messages are built by a small encoder following PostgreSQL's "Logical Replication Message
Formats" (non-streamed Insert/Update/Delete/Truncate), independent of the decoder under test.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from cdc.errors import DecodeError
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from processor.mounter import Mounter
from tests import rowcodecs
from upstream.base import decode_payload, encode_payload
from upstream.postgres.rowcodec import RowCodec
from upstream.postgres.source import PgChangeDecoder

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, params=rowcodecs.NAMES)
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> RowCodec:
    """Every test here runs over both implementations of the per-row functions (tests/rowcodecs.py)."""
    return rowcodecs.use(request.param, monkeypatch)

RELID = 16384
U = object()  # marks an unchanged TOAST column in test tuples


# ---- encoder ------------------------------------------------------------------------------------------
def tupledata(values: Sequence[Any]) -> bytes:
    out = [struct.pack(">h", len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        elif v is U:
            out.append(b"u")
        elif isinstance(v, bytes):
            out.append(b"b" + struct.pack(">i", len(v)) + v)
        else:
            data = str(v).encode()
            out.append(b"t" + struct.pack(">i", len(data)) + data)
    return b"".join(out)


def insert_msg(new: Sequence[Any], relid: int = RELID) -> bytes:
    return b"I" + struct.pack(">I", relid) + b"N" + tupledata(new)


def update_msg(
    new: Sequence[Any], old: Sequence[Any] | None = None, kind: bytes = b"K", relid: int = RELID
) -> bytes:
    head = b"U" + struct.pack(">I", relid)
    if old is not None:
        head += kind + tupledata(old)
    return head + b"N" + tupledata(new)


def delete_msg(old: Sequence[Any], kind: bytes = b"K", relid: int = RELID) -> bytes:
    return b"D" + struct.pack(">I", relid) + kind + tupledata(old)


def truncate_msg(relid: int = RELID, options: int = 0) -> bytes:
    return b"T" + struct.pack(">iBI", 1, options, relid)


# ---- schemas ------------------------------------------------------------------------------------------
def col(name: str, base: str, oid: int, is_array: bool = False, key: bool = False) -> ColumnSchema:
    return ColumnSchema(name, oid, base, is_array, base, nullable=not key, is_key=key)


COLUMNS = (
    col("id", "int4", 23, key=True),
    col("name", "text", 25),
    col("amount", "numeric", 1700),
    col("ts", "timestamptz", 1184),
    col("tags", "text", 1009, is_array=True),
)
T_DEFAULT = TableSchema(TableName("public", "t"), COLUMNS, ("id",), "d", RELID, version=1)
T_FULL = TableSchema(TableName("public", "t"), COLUMNS, ("id",), "f", RELID, version=2)
# version 3: ALTER TABLE t ALTER amount TYPE text
T_V3 = TableSchema(
    TableName("public", "t"),
    (*COLUMNS[:2], col("amount", "text", 25), *COLUMNS[3:]),
    ("id",),
    "d",
    RELID,
    version=3,
)
COMPOSITE = TableSchema(
    TableName("s", "orders"),
    (col("region", "text", 25, key=True), col("no", "int8", 20, key=True), col("note", "text", 25)),
    ("region", "no"),
    "d",
    16400,
    version=4,
)
SCHEMAS = {s.version: s for s in (T_DEFAULT, T_FULL, T_V3, COMPOSITE)}

ROW1 = ["1", "alice", "12.50", "2024-01-01 05:30:00+05:30", '{a,"b c",NULL}']
ROW1_VALUES = {
    "id": 1,
    "name": "alice",
    "amount": Decimal("12.50"),
    "ts": datetime(2024, 1, 1, tzinfo=UTC),
    "tags": ["a", "b c", None],
}


@pytest.fixture
def mounter() -> Mounter:
    return Mounter(PgChangeDecoder(SCHEMAS.__getitem__))


def mount(m: Mounter, version: int, raw: bytes) -> RowChange:
    return m.mount(encode_payload(version, raw), 1234, 1700000000.5)


# ---- payload ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 255, 65536, 2**32 - 1])
def test_payload_round_trip(version: int) -> None:
    raw = insert_msg(ROW1)
    payload = encode_payload(version, raw)
    assert len(payload) == len(raw) + 4
    assert decode_payload(payload) == (version, raw)


def test_payload_version_is_big_endian_prefix() -> None:
    # byte order must sort like the integer (sorter keys and payloads share this convention)
    assert encode_payload(0x01020304, b"x")[:4] == b"\x01\x02\x03\x04"


def test_payload_errors() -> None:
    with pytest.raises(ValueError):
        encode_payload(2**32, b"x")
    with pytest.raises(ValueError):
        encode_payload(-1, b"x")
    with pytest.raises(DecodeError):
        decode_payload(b"\x00\x00\x00")
    with pytest.raises(DecodeError):
        Mounter(PgChangeDecoder(SCHEMAS.__getitem__)).mount(b"\x00\x00\x00\x01", 1, 0.0)


# ---- insert -------------------------------------------------------------------------------------------
def test_insert(mounter: Mounter) -> None:
    rc = mount(mounter, 1, insert_msg(ROW1))
    assert rc.op is OpType.INSERT
    assert rc.schema is T_DEFAULT
    assert rc.table == TableName("public", "t")
    assert (rc.commit_ts, rc.commit_time) == (1234, 1700000000.5)
    assert rc.values == ROW1_VALUES
    assert list(rc.values) == list(T_DEFAULT.column_names)  # column order kept
    assert rc.old_values is None
    assert rc.key_values() == (1,)


def test_insert_nulls(mounter: Mounter) -> None:
    rc = mount(mounter, 1, insert_msg(["7", None, None, None, None]))
    assert rc.values == {"id": 7, "name": None, "amount": None, "ts": None, "tags": None}


def test_insert_unicode_and_empty(mounter: Mounter) -> None:
    rc = mount(mounter, 1, insert_msg(["8", "日本語 🎉", "-0.001", None, "{}"]))
    assert rc.values is not None
    assert rc.values["name"] == "日本語 🎉"
    assert rc.values["amount"] == Decimal("-0.001")
    assert rc.values["tags"] == []


# ---- update -------------------------------------------------------------------------------------------
def test_update_without_key_change(mounter: Mounter) -> None:
    new = ["1", "bob", "13", "2024-01-01 00:00:00+00", "{}"]
    rc = mount(mounter, 1, update_msg(new))
    assert rc.op is OpType.UPDATE
    assert rc.values == {
        "id": 1,
        "name": "bob",
        "amount": Decimal(13),
        "ts": datetime(2024, 1, 1, tzinfo=UTC),
        "tags": [],
    }
    assert rc.old_values is None
    assert rc.key_values() == (1,)


def test_update_with_key_change(mounter: Mounter) -> None:
    new = ["2", "alice", "12.50", "2024-01-01 00:00:00+00", None]
    old_key = ["1", None, None, None, None]  # 'K': only the replica identity columns are set
    rc = mount(mounter, 1, update_msg(new, old_key, b"K"))
    assert rc.values is not None
    assert rc.values["id"] == 2
    assert rc.old_values == {"id": 1}
    assert rc.key_values() == (1,)  # the row to change downstream is the old key


def test_update_unchanged_toast_default_keeps_unchanged(mounter: Mounter) -> None:
    new = ["1", U, "1", "2024-01-01 00:00:00+00", U]
    rc = mount(mounter, 1, update_msg(new))
    assert rc.values is not None
    assert rc.values["name"] is UNCHANGED
    assert rc.values["tags"] is UNCHANGED
    assert rc.values["amount"] == Decimal(1)
    assert rc.old_values is None


def test_update_unchanged_toast_with_key_change_keeps_unchanged(mounter: Mounter) -> None:
    rc = mount(mounter, 1, update_msg(["2", U, None, None, None], ["1", None, None, None, None], b"K"))
    assert rc.values is not None
    assert rc.values["name"] is UNCHANGED
    assert rc.values["id"] == 2
    assert rc.old_values == {"id": 1}


def test_update_unchanged_key_column_taken_from_old_key(mounter: Mounter) -> None:
    rc = mount(mounter, 4, update_msg([U, "5", "n"], ["eu", "5", None], b"K", relid=16400))
    assert rc.values == {"region": "eu", "no": 5, "note": "n"}
    assert rc.old_values == {"region": "eu", "no": 5}


def test_update_unchanged_toast_full_takes_old_value(mounter: Mounter) -> None:
    old = ROW1
    new = ["1", U, "99", "2024-01-01 05:30:00+05:30", U]
    rc = mount(mounter, 2, update_msg(new, old, b"O"))
    assert rc.values == {**ROW1_VALUES, "amount": Decimal(99)}
    assert rc.old_values == ROW1_VALUES
    assert all(v is not UNCHANGED for v in rc.values.values())


def test_update_full_without_unchanged(mounter: Mounter) -> None:
    new = ["3", "carol", "1.5", None, None]
    rc = mount(mounter, 2, update_msg(new, ROW1, b"O"))
    assert rc.values == {"id": 3, "name": "carol", "amount": Decimal("1.5"), "ts": None, "tags": None}
    assert rc.old_values == ROW1_VALUES
    assert rc.key_values() == (1,)


# ---- delete -------------------------------------------------------------------------------------------
def test_delete_key(mounter: Mounter) -> None:
    rc = mount(mounter, 1, delete_msg(["5", None, None, None, None], b"K"))
    assert rc.op is OpType.DELETE
    assert rc.values is None
    assert rc.old_values == {"id": 5}
    assert rc.key_values() == (5,)


def test_delete_key_keeps_only_key_columns(mounter: Mounter) -> None:
    rc = mount(mounter, 4, delete_msg(["eu", "42", "stray"], b"K", relid=16400))
    assert rc.old_values == {"region": "eu", "no": 42}
    assert rc.key_values() == ("eu", 42)


def test_delete_full_row(mounter: Mounter) -> None:
    rc = mount(mounter, 2, delete_msg(ROW1, b"O"))
    assert rc.op is OpType.DELETE
    assert rc.old_values == ROW1_VALUES
    assert rc.key_values() == (1,)


def test_delete_key_with_null_key_column_raises(mounter: Mounter) -> None:
    with pytest.raises(DecodeError, match=r"s\.orders.*'no'"):
        mount(mounter, 4, delete_msg(["eu", None, None], b"K", relid=16400))


# ---- truncate -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [0, 1, 2, 3])
def test_truncate(mounter: Mounter, options: int) -> None:
    rc = mount(mounter, 1, truncate_msg(RELID, options))
    assert rc.op is OpType.TRUNCATE
    assert rc.values is None and rc.old_values is None
    assert rc.extra == {"truncate_options": options}
    assert rc.schema is T_DEFAULT


# ---- schema versions ----------------------------------------------------------------------------------
def test_schema_version_decides_types_and_is_cached() -> None:
    calls: list[int] = []

    def lookup(version: int) -> TableSchema:
        calls.append(version)
        return SCHEMAS[version]

    m = Mounter(PgChangeDecoder(lookup))
    for _ in range(3):
        assert mount(m, 1, insert_msg(ROW1)).values["amount"] == Decimal("12.50")  # type: ignore[index]
        assert mount(m, 3, insert_msg(ROW1)).values["amount"] == "12.50"  # type: ignore[index]
    assert calls == [1, 3]


# ---- errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        insert_msg(ROW1[:4]),
        insert_msg([*ROW1, "extra"]),
        update_msg(ROW1, ROW1[:3], b"O"),
        update_msg(ROW1, ["1"], b"K"),
        delete_msg(ROW1[:2], b"O"),
        delete_msg(["1"], b"K"),
    ],
    ids=["insert-short", "insert-long", "update-old-full", "update-old-key", "delete-full", "delete-key"],
)
def test_column_count_mismatch_names_table(mounter: Mounter, raw: bytes) -> None:
    with pytest.raises(DecodeError, match=r"public\.t .*columns"):
        mount(mounter, 1, raw)


def test_unparsable_value_names_table_and_column(mounter: Mounter) -> None:
    with pytest.raises(DecodeError, match=r"public\.t.*'amount'.*numeric"):
        mount(mounter, 1, insert_msg(["1", "x", "twelve", None, None]))
    with pytest.raises(DecodeError, match=r"public\.t.*'tags'"):
        mount(mounter, 1, insert_msg(["1", "x", None, None, "{unterminated"]))
    with pytest.raises(DecodeError, match=r"public\.t.*'id'"):
        mount(mounter, 1, delete_msg(["one", None, None, None, None], b"K"))


def test_binary_value_is_rejected(mounter: Mounter) -> None:
    with pytest.raises(DecodeError, match=r"'id'.*binary"):
        mount(mounter, 1, insert_msg([b"\x00\x00\x00\x01", None, None, None, None]))
    with pytest.raises(DecodeError, match=r"'id'.*binary"):
        mount(mounter, 1, delete_msg([b"\x00\x00\x00\x01", None, None, None, None], b"K"))


def test_relation_mismatch(mounter: Mounter) -> None:
    with pytest.raises(DecodeError, match="relation 999"):
        mount(mounter, 1, insert_msg(ROW1, relid=999))


def test_malformed_message(mounter: Mounter) -> None:
    with pytest.raises(DecodeError):
        mount(mounter, 1, insert_msg(ROW1)[:-3])
    with pytest.raises(DecodeError):
        mount(mounter, 1, b"B" + bytes(20))


def test_unknown_schema_version_propagates(mounter: Mounter) -> None:
    with pytest.raises(KeyError):
        mount(mounter, 77, insert_msg(ROW1))


def test_binary_value_in_a_text_column_is_rejected(mounter: Mounter) -> None:
    # text columns are taken as they are on the fast path: a binary value must not slip through there
    with pytest.raises(DecodeError, match=r"'name'.*binary"):
        mount(mounter, 1, insert_msg(["1", b"abc", None, None, None]))
    with pytest.raises(DecodeError, match=r"'name'.*binary"):
        mount(mounter, 1, update_msg(["1", b"abc", None, None, None]))
