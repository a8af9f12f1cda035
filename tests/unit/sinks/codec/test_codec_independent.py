"""Every message read by parsers that are not ours: the standard library's ``json`` and ``csv``, ``struct`` for the
open-protocol framing, ``jsonschema`` for canal-json, and a Kafka Connect JsonConverter-style check of Debezium's
payloads against their embedded schemas; field lists as TiCDC and Debezium publish them (TiCDC's canal-json and
open-protocol documentation, Debezium's PostgreSQL connector documentation, "Data change events")."""

from __future__ import annotations

import base64
import csv
import io
import json
import struct
from dataclasses import replace
from typing import Any

import pytest
from codec_cases import ALL, CLOCK, ROW1, cases

from cdc.events import OpType, RowChange
from sinks.codec import EncoderConfig, Message, MessageKind, encoder_for

BASE = EncoderConfig(debezium_database="appdb")


def _messages(protocol: str, cfg: EncoderConfig = BASE) -> list[Message]:
    out: list[Message] = []
    for case in cases():
        if protocol not in case.protocols:
            continue
        enc = encoder_for(protocol, cfg, clock=lambda: CLOCK)
        if case.ddl is not None:
            out += [m for m in [enc.encode_ddl(case.ddl)] if m is not None]
        elif case.watermark is not None:
            out += [m for m in [enc.encode_watermark(case.watermark)] if m is not None]
        else:
            enc.append_rows(case.changes)
            out += enc.build()
    return out


# ---- canal-json ---------------------------------------------------------------------------------------------
CANAL_FIELDS = ["id", "database", "table", "pkNames", "isDdl", "type", "es", "ts", "sql", "sqlType", "mysqlType"]
"""TiCDC's canal-json fields in the order its DML encoder writes them, followed by old, data, _tidb (DDL and watermark
messages are marshalled from the FlatMessage struct: data before old)."""

_VALUES = {"anyOf": [{"type": "null"}, {"type": "array", "minItems": 1, "maxItems": 1,
                                         "items": {"type": "object",
                                                   "additionalProperties": {"type": ["string", "null"]}}}]}
CANAL_SCHEMA = {
    "type": "object",
    "required": [*CANAL_FIELDS, "data", "old"],
    "additionalProperties": False,
    "properties": {
        "id": {"const": 0}, "database": {"type": "string"}, "table": {"type": "string"},
        "pkNames": {"anyOf": [{"type": "null"}, {"type": "array", "items": {"type": "string"}}]},
        "isDdl": {"type": "boolean"},
        "type": {"enum": ["INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "ERASE", "RENAME", "TRUNCATE", "CINDEX",
                          "DINDEX", "QUERY", "TIDB_WATERMARK"]},
        "es": {"type": "integer"}, "ts": {"type": "integer"}, "sql": {"type": "string"},
        "sqlType": {"anyOf": [{"type": "null"}, {"type": "object", "additionalProperties": {"type": "integer"}}]},
        "mysqlType": {"anyOf": [{"type": "null"}, {"type": "object", "additionalProperties": {"type": "string"}}]},
        "data": _VALUES, "old": _VALUES,
        "_tidb": {"type": "object", "additionalProperties": False,
                  "properties": {"commitTs": {"type": "integer"}, "watermarkTs": {"type": "integer"}}},
    },
}


@pytest.mark.unit
def test_canal_json_is_ticdcs_flat_message() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    msgs = _messages("canal-json")
    assert msgs
    for m in msgs:
        assert m.key is None
        assert m.value is not None
        doc = json.loads(m.value)
        jsonschema.validate(doc, CANAL_SCHEMA)
        keys = list(doc)
        assert keys[:len(CANAL_FIELDS)] == CANAL_FIELDS
        if doc["isDdl"] or doc["type"] == "TIDB_WATERMARK":
            assert keys[len(CANAL_FIELDS):] == ["data", "old", "_tidb"]
            assert doc["sqlType"] is None and doc["data"] is None
            continue
        assert keys[len(CANAL_FIELDS):] == ["old", "data", "_tidb"]
        data = doc["data"][0]
        assert list(doc["sqlType"]) == list(doc["mysqlType"]) == list(data)  # one entry per written column
        if doc["old"] is not None:
            assert set(doc["old"][0]) <= set(data)
        assert doc["_tidb"]["commitTs"] == m.commit_ts
        assert b"<" not in m.value and b">" not in m.value and b"&" not in m.value  # Go's HTML-safe escaping


# ---- Debezium -----------------------------------------------------------------------------------------------
SOURCE_FIELDS = ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us", "ts_ns", "schema",
                 "table", "txId", "lsn", "xmin", "origin", "origin_lsn"]
ENVELOPE_FIELDS = ["before", "after", "source", "transaction", "op", "ts_ms", "ts_us", "ts_ns"]
_INT_RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}


def connect_check(schema: dict[str, Any], value: Any, path: str = "$") -> None:
    """Kafka Connect's JsonConverter.toConnectData rules for one value against its JSON schema."""
    if value is None:
        assert schema.get("optional") or "default" in schema, f"{path}: null in a required field"
        return
    t = schema["type"]
    if t in _INT_RANGES:
        bits = _INT_RANGES[t]
        assert type(value) is int and -(1 << bits) <= value < (1 << bits), f"{path}: {value!r} is no {t}"
    elif t in ("float", "double"):
        assert type(value) in (int, float) or value in ("NaN", "Infinity", "-Infinity"), f"{path}: {value!r}"
    elif t == "boolean":
        assert type(value) is bool, path
    elif t == "string":
        assert type(value) is str, path
    elif t == "bytes":
        assert type(value) is str, path
        base64.b64decode(value, validate=True)
        if schema.get("name") == "org.apache.kafka.connect.data.Decimal":
            assert set(schema["parameters"]) == {"scale", "connect.decimal.precision"}, path
    elif t == "array":
        assert type(value) is list, path
        for i, x in enumerate(value):
            connect_check(schema["items"], x, f"{path}[{i}]")
    elif t == "struct":
        assert type(value) is dict, path
        names = [f["field"] for f in schema["fields"]]
        assert list(value) == names, f"{path}: fields {list(value)} != schema {names}"
        for f in schema["fields"]:
            connect_check(f, value[f["field"]], f"{path}.{f['field']}")
    else:
        raise AssertionError(f"{path}: unknown Connect type {t!r}")
    for key in schema:  # JsonConverter's schema keys and their order
        assert key in ("type", "items", "fields", "optional", "name", "version", "doc", "parameters", "default",
                       "field"), f"{path}: schema key {key!r}"


@pytest.mark.unit
def test_debezium_records_are_connect_json_with_the_documented_fields() -> None:
    msgs = _messages("debezium")
    kinds = {m.kind for m in msgs}
    assert kinds == {MessageKind.ROW, MessageKind.TOMBSTONE, MessageKind.DDL, MessageKind.WATERMARK}
    ops = set()
    for m in msgs:
        key = json.loads(m.key) if m.key is not None else None
        if key is not None:
            assert list(key) == ["schema", "payload"]
            connect_check(key["schema"], key["payload"])
        if m.kind is MessageKind.TOMBSTONE:
            assert m.value is None and key is not None
            continue
        assert m.value is not None
        doc = json.loads(m.value)
        assert list(doc) == ["schema", "payload"]
        connect_check(doc["schema"], doc["payload"])
        payload = doc["payload"]
        if "op" not in payload:  # DDL (schema change record) or watermark (heartbeat)
            assert doc["schema"]["name"] in ("io.debezium.connector.postgresql.SchemaChangeValue",
                                             "io.debezium.connector.common.Heartbeat")
            continue
        ops.add(payload["op"])
        assert list(payload) == ENVELOPE_FIELDS
        assert list(payload["source"]) == SOURCE_FIELDS
        src = payload["source"]
        assert src["connector"] == "postgresql" and src["db"] == "appdb" and src["lsn"] == m.commit_ts
        assert src["snapshot"] == ("true" if payload["op"] == "r" else "false")
        assert doc["schema"]["name"].endswith(".Envelope") and doc["schema"]["version"] == 2
        if payload["op"] in ("c", "r"):
            assert payload["before"] is None and payload["after"] is not None
        if payload["op"] == "d":
            assert payload["after"] is None and payload["before"] is not None
        if payload["op"] == "t":
            assert m.key is None and payload["before"] is None and payload["after"] is None
    assert ops == {"c", "u", "d", "r", "t"}


@pytest.mark.unit
def test_debezium_delete_is_followed_by_its_tombstone() -> None:
    msgs = _messages("debezium")
    for i, m in enumerate(msgs):
        if m.value is not None and b'"op":"d"' in m.value:
            assert msgs[i + 1].kind is MessageKind.TOMBSTONE and msgs[i + 1].key == m.key


# ---- open-protocol ------------------------------------------------------------------------------------------
def _frames(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack(">q", data[pos:pos + 8])
        out.append(data[pos + 8:pos + 8 + n])
        pos += 8 + n
    assert pos == len(data)
    return out


@pytest.mark.unit
def test_open_protocol_frames_and_events() -> None:
    msgs = _messages("open-protocol", replace(BASE, max_batch_size=2))
    types = set()
    for m in msgs:
        assert m.key is not None and m.value is not None
        assert struct.unpack(">q", m.key[:8]) == (1,)
        keys, values = _frames(m.key[8:]), _frames(m.value)
        assert len(keys) == len(values)
        for k, v in zip(keys, values, strict=True):
            key = json.loads(k)
            types.add(key["t"])
            assert list(key) == [f for f in ("ts", "scm", "tbl", "t") if f in key]
            if key["t"] == 3:
                assert v == b"" and m.kind is MessageKind.WATERMARK
                continue
            value = json.loads(v)
            if key["t"] == 2:
                assert list(value) == ["q", "t"] and isinstance(value["t"], int)
                continue
            assert list(value) in (["u"], ["u", "p"], ["d"])
            for cols in value.values():
                assert list(cols) == sorted(cols, key=str.encode)  # Go sorts map keys
                for c in cols.values():
                    assert list(c) in (["t", "f", "v"], ["t", "h", "f", "v"])
                    assert bool(c.get("h")) == bool(c["f"] & 0x02)
    assert types == {1, 2, 3}


# ---- CSV ----------------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_csv_reads_with_the_standard_csv_module() -> None:
    change = RowChange(OpType.INSERT, ALL, 77, 1.0, dict(ROW1))
    enc = encoder_for("csv", BASE)
    enc.append_row(change)
    (m,) = enc.build()
    assert m.value is not None
    (row,) = list(csv.reader(io.StringIO(m.value.decode(), newline="")))
    assert row[:4] == ["I", "all_types", "public", "77"]
    values = row[4:]
    assert len(values) == len(ALL.columns)
    by_name = dict(zip(ALL.column_names, values, strict=True))
    assert by_name["c_text"] == ROW1["c_text"]
    assert by_name["c_varchar"] == "a,b;c"
    assert base64.b64decode(by_name["c_bytea"]) == ROW1["c_bytea"]
    assert json.loads(by_name["c_text_arr"]) == ROW1["c_text_arr"]
    assert by_name["c_num"] == "12345.670" and by_name["c_bool"] == "1"
