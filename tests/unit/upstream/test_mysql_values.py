"""MySQL binlog values -> text (upstream.mysql.types), stored changes (upstream.mysql.payload) and Ts (positions):
exact round trips, and loud refusals for what a type cannot hold."""

from __future__ import annotations

import struct
from datetime import date, datetime, timedelta
from decimal import Decimal

import pytest

from cdc.errors import DecodeError
from cdc.ts import lsn_to_str
from upstream.mysql import payload, positions, types
from upstream.mysql.catalog import relation_id
from upstream.postgres.types import parser_for


def test_ts_orders_files_then_positions_and_splits_back() -> None:
    a = positions.to_ts("mariadb-bin.000001", 4_000_000)
    b = positions.to_ts("mariadb-bin.000002", 4)
    assert a < b and positions.split_ts(b) == (2, 4) and lsn_to_str(a) == "1/3D0900"
    assert positions.file_name(["x.000009", "x.000010"], 10) == "x.000010"
    assert positions.file_name(["x.000009"], 8) is None
    with pytest.raises(DecodeError):
        positions.file_sequence("no-suffix")


def test_payload_round_trip_keeps_null_empty_and_unicode() -> None:
    raw = payload.encode(b"U", 77, ["1", None, "", "😀"], ["1", "x", None, "a"])
    pc = payload.parse(raw)
    assert (pc.kind, pc.relid, pc.new, pc.old, pc.old_kind) == ("U", 77, ["1", None, "", "😀"], ["1", "x", None, "a"],
                                                                "O")
    assert payload.insert_values(b"xx" + payload.encode(b"I", 5, ["7"], None), 2) == (5, ["7"])
    assert payload.insert_values(raw, 0) is None
    with pytest.raises(DecodeError):
        payload.parse(raw[:-1])


@pytest.mark.parametrize(("data_type", "column_type", "value", "base", "expected"), [
    ("bigint", "bigint(20) unsigned", 2**64 - 1, "numeric", Decimal(2**64 - 1)),
    ("bigint", "bigint(20)", -2**63, "int8", -2**63),
    ("decimal", "decimal(65,30)", Decimal("1.500000000000000000000000000000"), "numeric",
     Decimal("1.500000000000000000000000000000")),
    ("float", "float", struct.unpack("<f", struct.pack("<f", 1.1))[0], "float4", 1.1),
    ("double", "double", 0.1, "float8", 0.1),
    ("varbinary", "varbinary(4)", b"\x00\xff", "bytea", b"\x00\xff"),
    ("blob", "blob", "", "bytea", b""),
    ("date", "date", date(2024, 2, 29), "date", date(2024, 2, 29)),
    ("datetime", "datetime(6)", datetime(2024, 1, 2, 3, 4, 5, 6), "timestamp", datetime(2024, 1, 2, 3, 4, 5, 6)),
    ("time", "time(1)", timedelta(hours=23, microseconds=100000), "time",
     datetime(1, 1, 1, 23, 0, 0, 100000).time()),
    ("year", "year(4)", 1900, "int2", 0),
])
def test_values_render_to_text_that_parses_back_exactly(data_type: str, column_type: str, value: object, base: str,
                                                       expected: object) -> None:
    col = types.column_schema("c", data_type, column_type, nullable=True, is_key=False, char_len=4, precision=65,
                              scale=30, fsp=6)
    assert col.base_type == base
    parsed = parser_for(col.base_type, False)(types.renderer(data_type, column_type, 4)(value))
    assert parsed == expected and type(parsed) is type(expected)


def test_binary_is_padded_back_to_its_length() -> None:
    assert types.renderer("binary", "binary(4)", 4)(b"a") == "\\x61000000"


@pytest.mark.parametrize(("data_type", "value", "fragment"), [
    ("timestamp", datetime(1970, 1, 1), "zero TIMESTAMP"),
    ("time", timedelta(hours=-1), "outside"),
    ("time", timedelta(hours=24), "outside"),
    ("varbinary", "abc", "binary value delivered as str"),
    ("varchar", b"\xff", "did not decode"),
])
def test_values_a_type_cannot_hold_exactly_raise(data_type: str, value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        types.renderer(data_type, data_type, 4)(value)


@pytest.mark.parametrize(("data_type", "column_type", "extra"), [
    ("enum", "enum('a','é')", ""), ("set", "set('ü')", ""), ("geometry", "geometry", ""), ("inet6", "inet6", ""),
    ("point", "point", ""),
])
def test_unsupported_columns_are_refused_with_a_reason(data_type: str, column_type: str, extra: str) -> None:
    assert types.column_refusal(data_type, column_type, extra)
    assert types.column_refusal("int", "int(11)", "") is None


def test_relation_ids_are_stable_nonzero_31_bit() -> None:
    from cdc.events import TableName

    a = relation_id(TableName("shop", "items"))
    assert a == relation_id(TableName("shop", "items")) and 0 < a < 2**31
    assert a != relation_id(TableName("shop", "items2"))


@pytest.mark.parametrize(("data_type", "column_type", "extra"), [
    ("enum", "enum('a','it''s')", ""), ("set", "set('a','b')", ""), ("bit", "bit(3)", ""),
    ("int", "int(11)", "VIRTUAL GENERATED"), ("int", "int(11)", "STORED GENERATED"),
])
def test_bit_enum_set_and_generated_columns_are_replicated(data_type: str, column_type: str, extra: str) -> None:
    assert types.column_refusal(data_type, column_type, extra) is None


def test_bit_enum_and_set_values_render_exactly_or_raise() -> None:
    bit = types.renderer("bit", "bit(10)", None)
    assert bit("0000000101") == "0000000101" and bit(b"\x00\x05") == "0000000101" and bit(b"\x03\xff") == "1" * 10
    for bad in ("101", b"\x05", 5):
        with pytest.raises(ValueError, match="BIT"):
            bit(bad)
    assert types.members("enum('a','it''s','')") == ("a", "it's", "")
    enum = types.renderer("enum", "enum('a','it''s')", None)
    assert enum("it's") == "it's" and enum("") == ""
    with pytest.raises(ValueError, match="ENUM"):
        enum("b")
    st = types.renderer("set", "set('r','g','b')", None)
    assert st({"b", "r"}) == "r,b" and st("r,b") == "r,b" and st("") == "" and st(set()) == ""
    with pytest.raises(ValueError, match="SET"):
        st({"x"})
