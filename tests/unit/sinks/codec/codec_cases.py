"""Shared test data of the codec tests: two upstream tables, rows of every type, and the scenarios the golden files
cover. Values are what the mounter makes of PostgreSQL's text (``upstream.postgres.types``)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cdc.events import (
    SNAPSHOT,
    UNCHANGED,
    ColumnSchema,
    DdlChange,
    DdlEvent,
    DdlKind,
    OpType,
    RowChange,
    TableName,
    TableSchema,
)
from cdc.ts import Watermark

CLOCK = 1_767_225_600.25  # fixed "time of encoding" (2026-01-01 00:00:00.25 UTC)
UTC = dt.UTC


def col(name: str, oid: int, base: str, *, array: bool = False, typmod: int = -1, key: bool = False,
        nullable: bool = True, type_name: str = "") -> ColumnSchema:
    return ColumnSchema(name, oid, base, array, type_name or base, typmod, nullable and not key, key)


def numeric_typmod(p: int, s: int) -> int:
    return ((p << 16) | s) + 4


ALL_COLUMNS = (
    col("id", 23, "int4", key=True),
    col("c_int2", 21, "int2"),
    col("c_int8", 20, "int8", nullable=False),
    col("c_oid", 26, "oid"),
    col("c_num", 1700, "numeric", typmod=numeric_typmod(12, 3)),
    col("c_num_free", 1700, "numeric"),
    col("c_f4", 700, "float4"),
    col("c_f8", 701, "float8"),
    col("c_bool", 16, "bool"),
    col("c_text", 25, "text"),
    col("c_varchar", 1043, "varchar", typmod=24),
    col("c_bpchar", 1042, "bpchar", typmod=9),
    col("c_bytea", 17, "bytea"),
    col("c_date", 1082, "date"),
    col("c_time", 1083, "time"),
    col("c_time3", 1083, "time", typmod=3),
    col("c_timetz", 1266, "timetz"),
    col("c_ts", 1114, "timestamp"),
    col("c_ts0", 1114, "timestamp", typmod=0),
    col("c_tstz", 1184, "timestamptz"),
    col("c_interval", 1186, "interval"),
    col("c_uuid", 2950, "uuid"),
    col("c_json", 114, "json"),
    col("c_jsonb", 3802, "jsonb"),
    col("c_int_arr", 1007, "int4", array=True),
    col("c_text_arr", 1009, "text", array=True),
    col("c_enum", 16500, "mood", type_name="mood"),
    col("c_inet", 869, "inet"),
)
ALL = TableSchema(TableName("public", "all_types"), ALL_COLUMNS, ("id",), replica_identity="f", relation_id=16400,
                  version=1)
KV = TableSchema(TableName("app", "kv"), (col("id", 20, "int8", key=True), col("body", 25, "text"),
                                          col("n", 23, "int4")), ("id",), relation_id=16410, version=1)
KV2 = TableSchema(KV.name, (*KV.columns, col("note", 1043, "varchar", typmod=36)), ("id",), relation_id=16410,
                  version=2)

ROW1: dict[str, Any] = {
    "id": 1, "c_int2": -32768, "c_int8": 9223372036854775807, "c_oid": 4294967295, "c_num": Decimal("12345.670"),
    "c_num_free": Decimal("-0.000000001234"), "c_f4": 3.4028235e38, "c_f8": 0.1, "c_bool": True,
    "c_text": "héllo <b>&'\"\n\tworld", "c_varchar": "a,b;c", "c_bpchar": "ab   ", "c_bytea": b"\x00\x01\xfe\xff<&",
    "c_date": dt.date(2024, 2, 29), "c_time": dt.time(23, 59, 59, 999999), "c_time3": dt.time(12, 0, 0, 500000),
    "c_timetz": "12:34:56.789+05:30", "c_ts": dt.datetime(2024, 1, 2, 3, 4, 5, 678900),
    "c_ts0": dt.datetime(1999, 12, 31, 23, 59, 59),
    "c_tstz": dt.datetime(2024, 6, 30, 22, 0, 0, 120000, tzinfo=UTC), "c_interval": "1 year 2 mons 3 days 04:05:06.789",
    "c_uuid": uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e"), "c_json": '{"a": [1, 2.5, "x<y"]}',
    "c_jsonb": '{"k": null, "n": 1e+20}', "c_int_arr": [1, None, -3], "c_text_arr": ["a", "NULL", None, 'q"u,o'],
    "c_enum": "happy", "c_inet": "192.168.0.1/24",
}
ROW2: dict[str, Any] = {  # special values, empty strings, NULLs
    "id": 2, "c_int2": None, "c_int8": -1, "c_oid": None, "c_num": Decimal("-0.001"), "c_num_free": Decimal("NaN"),
    "c_f4": float("-inf"), "c_f8": float("nan"), "c_bool": False, "c_text": "", "c_varchar": None,
    "c_bpchar": "     ", "c_bytea": b"", "c_date": "0044-03-15 BC", "c_time": "24:00:00", "c_time3": None,
    "c_timetz": "00:00:00-01", "c_ts": "infinity", "c_ts0": dt.datetime(1, 1, 1, 0, 0, 0),
    "c_tstz": "-infinity", "c_interval": "-1 days +02:03:00", "c_uuid": None, "c_json": "null", "c_jsonb": "[]",
    "c_int_arr": [], "c_text_arr": [["a", "b"], ["c", None]], "c_enum": None, "c_inet": "::1",
}
ROW1_NEW = {**ROW1, "c_text": "changed", "c_f8": 1e-7, "c_int_arr": [7]}


def row_tuple(schema: TableSchema, values: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(values[c.name] for c in schema.columns)


@dataclass
class Case:
    """One golden scenario: changes appended together (one ``build()``), or a DDL, or a watermark."""

    name: str
    changes: list[RowChange] = field(default_factory=list)
    ddl: DdlEvent | None = None
    watermark: Watermark | None = None
    protocols: tuple[str, ...] = ("canal-json", "debezium", "open-protocol", "csv")


def _change(op: OpType, schema: TableSchema, ts: int, values: dict[str, Any] | None = None,
            old: dict[str, Any] | None = None, *, positional: bool = False, snapshot: bool = False,
            xid: int | None = None) -> RowChange:
    extra: dict[str, Any] = {}
    if snapshot:
        extra[SNAPSHOT] = True
    if xid is not None:
        extra["xid"] = xid
    commit_time = 1_767_225_000.0 + (ts % 1000) / 8
    if positional:
        assert values is not None
        return RowChange(op, schema, ts, commit_time, None, old, extra, row_tuple(schema, values))
    return RowChange(op, schema, ts, commit_time, values, old, extra)


def cases() -> list[Case]:
    """The scenarios of the golden files (fresh objects on every call)."""
    no_debezium_nan = ("canal-json", "open-protocol", "csv")
    row2_dbz = {**ROW2, "c_num_free": Decimal("1E-20"), "c_text_arr": ["a"]}
    add_note = DdlEvent(0x1A2B3C4D, 1_767_225_100.5, KV.name, (DdlChange(DdlKind.ADD_COLUMN, "note"),), KV, KV2,
                        "ALTER TABLE app.kv ADD COLUMN note varchar(32) DEFAULT 'n/a'")
    create = DdlEvent(0x1A2B3C00, 1_767_225_000.0, KV.name, (DdlChange(DdlKind.CREATE_TABLE),), None, KV,
                      "CREATE TABLE app.kv (id bigint PRIMARY KEY, body text, n int)")
    return [
        Case("insert every type", [_change(OpType.INSERT, ALL, 1001, ROW1, positional=True, xid=777)]),
        Case("insert special values", [_change(OpType.INSERT, ALL, 1002, ROW2)], protocols=no_debezium_nan),
        Case("insert special values (Debezium)", [_change(OpType.INSERT, ALL, 1002, row2_dbz)],
             protocols=("debezium",)),
        Case("update with the full old row (REPLICA IDENTITY FULL)",
             [_change(OpType.UPDATE, ALL, 1003, ROW1_NEW, dict(ROW1))]),
        Case("delete with the full old row", [_change(OpType.DELETE, ALL, 1004, None, dict(ROW1_NEW))]),
        Case("insert (default replica identity)", [_change(OpType.INSERT, KV, 2001, {"id": 10, "body": "x", "n": 1})]),
        Case("update keeping an unchanged TOAST value",
             [_change(OpType.UPDATE, KV, 2002, {"id": 10, "body": UNCHANGED, "n": 2})]),
        Case("update changing the key", [_change(OpType.UPDATE, KV, 2003, {"id": 11, "body": "y", "n": 3}, {"id": 10})]),
        Case("delete with the key only", [_change(OpType.DELETE, KV, 2004, None, {"id": 11})]),
        Case("snapshot row", [_change(OpType.INSERT, KV, 1999, {"id": 5, "body": "copied", "n": None}, snapshot=True)]),
        Case("truncate", [_change(OpType.TRUNCATE, KV, 2005)], protocols=("canal-json", "debezium", "open-protocol")),
        Case("a transaction of several rows", [
            _change(OpType.INSERT, KV, 2006, {"id": i, "body": f"r{i}", "n": i}) for i in range(20, 25)]),
        Case("create table", ddl=create),
        Case("add column", ddl=add_note),
        Case("watermark", watermark=Watermark(0x1A2B3C4E, 1_767_225_200.125)),
    ]


Normalizer = Callable[[str, Any], Any]
