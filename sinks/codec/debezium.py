"""Debezium JSON as Debezium's PostgreSQL connector (3.6 layout) writes it through Kafka's JsonConverter.

Key: ``{"schema":{..."<server>.<schema>.<table>.Key"},"payload":{<key columns>}}`` (null for a table without a key).
Value: ``{"schema":{..."<server>.<schema>.<table>.Envelope","version":2},"payload":{"before":..,"after":..,
"source":{..},"transaction":null,"op":"c|u|d|r|t","ts_ms":..,"ts_us":..,"ts_ns":..}}`` - field order and spelling
as the JsonConverter writes the connector's Connect structs (``schemas-enable=false``: the payloads only).

- ``source``: ``{"version":"3.6.1.Final","connector":"postgresql","name":<server>,"ts_ms":<commit ms>,
  "snapshot":"true|false","db":<database>,"sequence":null,"ts_us":..,"ts_ns":..,"schema":..,"table":..,
  "txId":<xid or null>,"lsn":<commit LSN>,"xmin":null,"origin":null,"origin_lsn":null}``. ``lsn`` is the commit's LSN
  (Tidewater's commit Ts; Debezium writes each change's own LSN), ``sequence`` is null, ``txId`` is the upstream
  transaction id when the change carries it (``RowChange.extra["xid"]``), else null.
- ``op``: ``c`` insert, ``u`` update, ``d`` delete, ``r`` a row of the initial copy (``source.snapshot`` ``"true"``;
  Debezium's ``first``/``last`` markers are not written), ``t`` truncate (Debezium skips truncates by default
  through ``skipped.operations``; Tidewater writes them, as a broadcast DDL-kind message with a null key; the Kafka
  sink's ``skipped-operations`` drops what it names before encoding).
- ``before``: the full old row with REPLICA IDENTITY FULL; else null for an update and the key columns (others null)
  for a delete, as Debezium writes them. ``after``: the new row; a value the upstream did not send is
  ``unavailable-value-placeholder`` in the shape Debezium uses for the type (``sinks.codec.debezium_values``).
- An update that changes the key is a delete of the old key (header ``__debezium.newkey``), a tombstone and a create
  of the new one (header ``__debezium.oldkey``), as the connector writes a primary key change.
- A delete is followed by a tombstone (same key, null value) unless ``tombstones-on-delete=false``.
- Schema (``optional``): key columns are required; the other columns follow their nullability with REPLICA IDENTITY
  FULL and are all optional otherwise, because a delete then carries no value for them (Debezium writes a type's
  zero there - 0, ``""`` - instead, which is wrong data).
- DDL: a record in the shape of Debezium's schema change topic (``...postgresql.SchemaChangeKey`` /
  ``SchemaChangeValue`` with ``ddl`` and ``tableChanges``); the PostgreSQL connector itself has none
  (``include-schema-changes=false``: none either, ``encode_ddl`` returns None).
- Watermark: a heartbeat-shaped record (``io.debezium.connector.common.ServerNameKey`` /
  ``io.debezium.connector.common.Heartbeat`` with ``ts_ms`` and an extra ``watermark_ts``); turn off with
  ``debezium-watermarks=false`` for consumers that accept only change events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cdc.events import UNCHANGED, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema, is_snapshot
from cdc.ts import Watermark
from sinks.codec import debezium_values as D
from sinks.codec import text as X
from sinks.codec import types as T
from sinks.codec.base import (
    DecodedEvent,
    Decoder,
    EncodeError,
    EncoderConfig,
    Message,
    MessageDecodeError,
    MessageKind,
    RowEventEncoder,
    has_full_row,
    row_key,
)
from sinks.codec.schema_cache import SchemaCache

PROTOCOL = "debezium"
CONNECTOR = "postgresql"
SNAPSHOT_VALUES = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"

_S = {"type": "string", "optional": False}
_OS = {"type": "string", "optional": True}
_L = {"type": "int64", "optional": False}
_OL = {"type": "int64", "optional": True}


def _f(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return {**schema, "field": name}


SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_f(_S, "version"), _f(_S, "connector"), _f(_S, "name"), _f(_L, "ts_ms"),
               {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": SNAPSHOT_VALUES}, "default": "false", "field": "snapshot"},
               _f(_S, "db"), _f(_OS, "sequence"), _f(_OL, "ts_us"), _f(_OL, "ts_ns"), _f(_S, "schema"),
               _f(_S, "table"), _f(_OL, "txId"), _f(_OL, "lsn"), _f(_OL, "xmin"), _f(_OS, "origin"),
               _f(_OL, "origin_lsn")],
    "optional": False, "name": "io.debezium.connector.postgresql.Source", "version": 1,
}
TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_f(_S, "id"), _f(_L, "total_order"), _f(_L, "data_collection_order")],
    "optional": True, "name": "event.block", "version": 1,
}
_COLUMN_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_f(_S, "name"), _f({"type": "int32", "optional": False}, "jdbcType"),
               _f({"type": "int32", "optional": True}, "nativeType"), _f(_S, "typeName"), _f(_OS, "typeExpression"),
               _f(_OS, "charsetName"), _f({"type": "int32", "optional": True}, "length"),
               _f({"type": "int32", "optional": True}, "scale"), _f({"type": "int32", "optional": False}, "position"),
               _f({"type": "boolean", "optional": True}, "optional"),
               _f({"type": "boolean", "optional": True}, "autoIncremented"),
               _f({"type": "boolean", "optional": True}, "generated"), _f(_OS, "comment"),
               _f(_OS, "defaultValueExpression"),
               _f({"type": "array", "items": _S, "optional": True}, "enumValues")],
    "optional": False, "name": "io.debezium.connector.schema.Column", "version": 1,
}
_TABLE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_f(_OS, "defaultCharsetName"), _f({"type": "array", "items": _S, "optional": True},
                                                "primaryKeyColumnNames"),
               _f({"type": "array", "items": _COLUMN_SCHEMA, "optional": False}, "columns"), _f(_OS, "comment")],
    "optional": True, "name": "io.debezium.connector.schema.Table", "version": 1,
}
_CHANGE_SCHEMA: dict[str, Any] = {
    "type": "struct", "fields": [_f(_S, "type"), _f(_S, "id"), _f(_TABLE_SCHEMA, "table")],
    "optional": False, "name": "io.debezium.connector.schema.Change", "version": 1,
}
_JDBC_TYPES = {"int2": 5, "int4": 4, "int8": -5, "oid": -5, "numeric": 2, "float4": 7, "float8": 8, "bool": -7,
               "text": 12, "varchar": 12, "name": 12, "bpchar": 1, "char": 1, "bytea": -2, "date": 91, "time": 92,
               "timetz": 92, "timestamp": 93, "timestamptz": 93}
"""java.sql.Types of a column type as pgjdbc reports it (arrays 2003, every other type OTHER 1111)."""


def _ms_us_ns(seconds: float) -> tuple[int, int, int]:
    us = round(seconds * 1_000_000)
    return us // 1000, us, us * 1000


def _json_converter(cfg: EncoderConfig, key_schema: dict[str, Any], key_payload: dict[str, Any],
                    value_schema: dict[str, Any], value_payload: dict[str, Any]) -> tuple[bytes, bytes]:
    """Key and value as Kafka Connect's JsonConverter writes them: ``{"schema": .., "payload": ..}`` with
    ``schemas-enable`` (its default), else the payloads alone."""
    if cfg.schemas_enable:
        key = X.json_dumps({"schema": key_schema, "payload": key_payload})
        value = X.json_dumps({"schema": value_schema, "payload": value_payload})
    else:
        key, value = X.json_dumps(key_payload), X.json_dumps(value_payload)
    return key.encode(), value.encode()


@dataclass(slots=True)
class _Plan:
    schema: TableSchema
    names: tuple[str, ...]
    value_cols: tuple[D.DbzColumn, ...]
    pieces: tuple[str, ...]  # '"col":'
    key_cols: tuple[D.DbzColumn, ...]
    key_pieces: tuple[str, ...]
    key_idx: tuple[int, ...]
    key_schema: str | None  # '{"schema":<key schema>,"payload":' or '' (no schema), None: no key
    value_head: bytes  # b'{"schema":<envelope schema>,"payload":' or b''
    source_tail: str  # ',"schema":..,"table":..,"txId":'


def _value_schema(plan_cols: tuple[D.DbzColumn, ...], name: str, field: str) -> dict[str, Any]:
    return {"type": "struct", "fields": [_f(c.schema, c.name) for c in plan_cols], "optional": True, "name": name,
            "field": field}


def _plan(schema: TableSchema, cfg: EncoderConfig) -> _Plan:
    prefix = f"{cfg.debezium_server_name}.{schema.name.schema}.{schema.name.table}"
    keys = set(schema.key) if schema.has_key else set()
    full = schema.replica_identity == "f"
    value_cols = tuple(D.column(c, cfg, c.name not in keys and (c.nullable or not full)) for c in schema.columns)
    key_cols = tuple(D.column(schema.column(k), cfg, False) for k in schema.key) if schema.has_key else ()
    envelope = {
        "type": "struct",
        "fields": [_value_schema(value_cols, prefix + ".Value", "before"),
                   _value_schema(value_cols, prefix + ".Value", "after"), _f(SOURCE_SCHEMA, "source"),
                   _f(TRANSACTION_SCHEMA, "transaction"), _f(_S, "op"), _f(_OL, "ts_ms"), _f(_OL, "ts_us"),
                   _f(_OL, "ts_ns")],
        "optional": False, "name": prefix + ".Envelope", "version": 2,
    }
    key_schema: str | None = None
    if key_cols:
        ks = {"type": "struct", "fields": [_f(c.schema, c.name) for c in key_cols], "optional": False,
              "name": prefix + ".Key"}
        key_schema = '{"schema":' + X.json_dumps(ks) + ',"payload":' if cfg.schemas_enable else ""
    value_head = ('{"schema":' + X.json_dumps(envelope) + ',"payload":').encode() if cfg.schemas_enable else b""
    source_tail = (',"schema":' + X.json_string(schema.name.schema) + ',"table":' + X.json_string(schema.name.table)
                   + ',"txId":')
    return _Plan(schema, schema.column_names, value_cols, tuple(X.json_string(c.name) + ":" for c in value_cols),
                 key_cols, tuple(X.json_string(c.name) + ":" for c in key_cols),
                 tuple(schema.column_names.index(c.name) for c in key_cols), key_schema, value_head, source_tail)


class DebeziumEncoder(RowEventEncoder):
    """Debezium JSON (see the module docstring). One record per event, plus tombstones."""

    protocol = PROTOCOL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config
        self._plans: SchemaCache[_Plan] = SchemaCache(lambda s: _plan(s, cfg))
        self._source_head = ('{"version":' + X.json_string(cfg.debezium_version) + ',"connector":"' + CONNECTOR
                             + '","name":' + X.json_string(cfg.debezium_server_name) + ',"ts_ms":')
        self._db = X.json_string(cfg.debezium_database)
        self._close = "}}" if cfg.schemas_enable else "}"

    # -- pieces ----------------------------------------------------------------------------------------------
    def _struct(self, plan: _Plan, cols: tuple[D.DbzColumn, ...], pieces: tuple[str, ...],
                values: dict[str, Any] | None, row: tuple[Any, ...] | None, missing_null: bool) -> str:
        if row is not None:  # fast path: a positional row has no unsent values; errors are located below
            try:
                return "{" + ",".join([pre + ("null" if v is None else c.to_json(v))
                                       for pre, c, v in zip(pieces, cols, row, strict=True)]) + "}"
            except Exception:  # noqa: BLE001, S110 - redone value by value to name the column
                pass
        parts = []
        for i, c in enumerate(cols):
            if row is not None:
                v = row[i]
            else:
                assert values is not None
                v = values.get(c.name, None if missing_null else UNCHANGED)
            if v is None:
                parts.append(pieces[i] + "null")
            elif v is UNCHANGED:
                if c.placeholder is None:
                    raise EncodeError(f"table {plan.schema.name}: column {c.name!r} was not sent by the upstream "
                                      "(unchanged TOAST value) and Debezium has no placeholder for its type; set "
                                      "REPLICA IDENTITY FULL on the table")
                parts.append(pieces[i] + c.placeholder)
            else:
                try:
                    parts.append(pieces[i] + c.to_json(v))
                except EncodeError as e:
                    raise EncodeError(f"table {plan.schema.name}: {e.message}") from e
                except (TypeError, ValueError, AttributeError, OverflowError) as e:
                    raise EncodeError(f"table {plan.schema.name}: column {c.name!r}: value {str(v)[:60]!r} cannot "
                                      f"be written as Debezium JSON: {e}") from e
        return "{" + ",".join(parts) + "}"

    def _key(self, plan: _Plan, values: dict[str, Any] | None, row: tuple[Any, ...] | None) -> bytes | None:
        if plan.key_schema is None:
            return None
        key_row = tuple(row[i] for i in plan.key_idx) if row is not None else None
        payload = self._struct(plan, plan.key_cols, plan.key_pieces, values, key_row, False)
        return (plan.key_schema + payload + ("}" if self.config.schemas_enable else "")).encode()

    def _source(self, plan: _Plan, change: RowChange) -> str:
        ms, us, ns = _ms_us_ns(change.commit_time)
        xid = change.extra.get("xid")
        return "".join((self._source_head, str(ms), ',"snapshot":"', "true" if is_snapshot(change) else "false",
                        '","db":', self._db, ',"sequence":null,"ts_us":', str(us), ',"ts_ns":', str(ns),
                        plan.source_tail, "null" if xid is None else str(int(xid)), ',"lsn":', str(change.commit_ts),
                        ',"xmin":null,"origin":null,"origin_lsn":null}'))

    def _value(self, plan: _Plan, before: str, after: str, source: str, op: str) -> bytes:
        ms, us, ns = _ms_us_ns(self.clock())
        return plan.value_head + "".join((
            '{"before":', before, ',"after":', after, ',"source":', source, ',"transaction":null,"op":"', op,
            '","ts_ms":', str(ms), ',"ts_us":', str(us), ',"ts_ns":', str(ns), self._close)).encode()

    def _emit(self, plan: _Plan, change: RowChange, key: bytes | None, value: bytes | None,
              kind: MessageKind = MessageKind.ROW, headers: tuple[tuple[str, bytes], ...] = ()) -> None:
        rows = 1 if kind is MessageKind.ROW else 0
        self._out.append(Message(key, value, kind, PROTOCOL, change.schema.name, change.commit_ts, rows, headers,
                                 row_key(change, plan.key_idx)))

    # -- rows ------------------------------------------------------------------------------------------------
    def append_row(self, change: RowChange) -> None:
        op = change.op
        plan = self._plans.get(change.schema)
        schema = plan.schema
        source = self._source(plan, change)
        if op is OpType.TRUNCATE:
            self._emit(plan, change, None, self._value(plan, "null", "null", source, "t"), MessageKind.DDL)
            return
        if op is OpType.INSERT:
            row = change.row
            values = None if row is not None else change.values
            after = self._struct(plan, plan.value_cols, plan.pieces, values, row, False)
            self._emit(plan, change, self._key(plan, values, row),
                       self._value(plan, "null", after, source, "r" if is_snapshot(change) else "c"))
            return
        if op is OpType.DELETE:
            prev = change.old_values
            if prev is None:
                raise EncodeError(f"table {schema.name}: a DELETE without old values (commit Ts {change.commit_ts})")
            self._delete(plan, change, prev, source)
            return
        if op is not OpType.UPDATE:  # pragma: no cover - OpType is closed
            raise EncodeError(f"table {schema.name}: unknown change {op!r}")
        new = change.values
        assert new is not None
        prev = change.old_values
        if prev is not None and schema.has_key and any(prev.get(k, new.get(k)) != new.get(k) for k in schema.key):
            old_key = self._key(plan, {**new, **prev}, None)
            new_key = self._key(plan, new, None)
            assert old_key is not None and new_key is not None
            self._delete(plan, change, prev, source, (("__debezium.newkey", new_key),))
            after = self._struct(plan, plan.value_cols, plan.pieces, new, None, False)
            self._emit(plan, change, new_key, self._value(plan, "null", after, source, "c"),
                       headers=(("__debezium.oldkey", old_key),))
            return
        before = (self._struct(plan, plan.value_cols, plan.pieces, prev, None, True)
                  if prev is not None and has_full_row(schema, prev) else "null")
        after = self._struct(plan, plan.value_cols, plan.pieces, new, None, False)
        self._emit(plan, change, self._key(plan, new, None), self._value(plan, before, after, source, "u"))

    def _delete(self, plan: _Plan, change: RowChange, prev: dict[str, Any], source: str,
                headers: tuple[tuple[str, bytes], ...] = ()) -> None:
        before = self._struct(plan, plan.value_cols, plan.pieces, prev, None, True)
        key = self._key(plan, prev, None)
        self._emit(plan, change, key, self._value(plan, before, "null", source, "d"), headers=headers)
        if self.config.tombstones_on_delete and key is not None:
            self._emit(plan, change, key, None, MessageKind.TOMBSTONE)

    # -- DDL and watermarks ----------------------------------------------------------------------------------
    def encode_ddl(self, event: DdlEvent) -> Message | None:
        cfg = self.config
        if not cfg.include_schema_changes:
            return None
        table = event.new_table or event.table
        key_schema = {"type": "struct", "fields": [_f(_S, "databaseName")], "optional": False,
                      "name": f"io.debezium.connector.{CONNECTOR}.SchemaChangeKey", "version": 1}
        value_schema = {
            "type": "struct",
            "fields": [_f(SOURCE_SCHEMA, "source"), _f(_L, "ts_ms"), _f(_OS, "databaseName"), _f(_OS, "schemaName"),
                       _f(_OS, "ddl"), _f({"type": "array", "items": _CHANGE_SCHEMA, "optional": False},
                                          "tableChanges")],
            "optional": False, "name": f"io.debezium.connector.{CONNECTOR}.SchemaChangeValue", "version": 1,
        }
        ms, us, ns = _ms_us_ns(event.commit_time)
        source = {"version": cfg.debezium_version, "connector": CONNECTOR, "name": cfg.debezium_server_name,
                  "ts_ms": ms, "snapshot": "false", "db": cfg.debezium_database, "sequence": None, "ts_us": us,
                  "ts_ns": ns, "schema": table.schema, "table": table.table, "txId": None,
                  "lsn": event.commit_ts, "xmin": None, "origin": None, "origin_lsn": None}
        payload = {"source": source, "ts_ms": _ms_us_ns(self.clock())[0], "databaseName": cfg.debezium_database,
                   "schemaName": table.schema, "ddl": event.query, "tableChanges": _table_changes(event, table)}
        key, value = _json_converter(cfg, key_schema, {"databaseName": cfg.debezium_database}, value_schema, payload)
        return Message(key, value, MessageKind.DDL, PROTOCOL, table, event.commit_ts)

    def encode_watermark(self, watermark: Watermark) -> Message | None:
        cfg = self.config
        if not cfg.debezium_watermarks:
            return None
        key_schema = {"type": "struct", "fields": [_f(_S, "serverName")], "optional": False,
                      "name": "io.debezium.connector.common.ServerNameKey", "version": 1}
        value_schema = {"type": "struct", "fields": [_f(_L, "ts_ms"), _f(_L, "watermark_ts")], "optional": False,
                        "name": "io.debezium.connector.common.Heartbeat", "version": 1}
        payload = {"ts_ms": _ms_us_ns(watermark.time)[0], "watermark_ts": watermark.ts}
        key, value = _json_converter(cfg, key_schema, {"serverName": cfg.debezium_server_name}, value_schema, payload)
        return Message(key, value, MessageKind.WATERMARK, PROTOCOL, None, watermark.ts)


def _table_struct(schema: TableSchema) -> dict[str, Any]:
    columns = []
    for pos, c in enumerate(schema.columns, 1):
        length: int | None = None
        scale: int | None = None
        ps = T.numeric_precision_scale(c) if c.base_type == "numeric" else None
        if ps is not None:
            length, scale = ps
        elif c.base_type in ("varchar", "bpchar") and c.type_modifier >= 4:
            length = c.type_modifier - 4
        type_name = ("_" if c.is_array else "") + c.base_type
        columns.append({
            "name": c.name, "jdbcType": 2003 if c.is_array else _JDBC_TYPES.get(c.base_type, 1111),
            "nativeType": c.type_oid or None, "typeName": type_name, "typeExpression": type_name,
            "charsetName": None, "length": length, "scale": scale, "position": pos, "optional": c.nullable,
            "autoIncremented": bool(c.default and "nextval(" in c.default), "generated": False, "comment": None,
            "defaultValueExpression": c.default, "enumValues": None,
        })
    return {"defaultCharsetName": None, "primaryKeyColumnNames": list(schema.key) if schema.has_key else [],
            "columns": columns, "comment": None}


def _table_changes(event: DdlEvent, table: TableName) -> list[dict[str, Any]]:
    kinds = set(event.kinds)
    if kinds & {DdlKind.TRUNCATE_TABLE} or kinds <= {DdlKind.OTHER}:
        return []
    tid = '"' + table.schema + '"."' + table.table + '"'
    if DdlKind.CREATE_TABLE in kinds and event.after is not None:
        return [{"type": "CREATE", "id": tid, "table": _table_struct(event.after)}]
    if DdlKind.DROP_TABLE in kinds:
        return [{"type": "DROP", "id": tid, "table": _table_struct(event.before) if event.before else None}]
    schema = event.after or event.before
    return [{"type": "ALTER", "id": tid, "table": _table_struct(schema) if schema else None}]


# ---- decoding ----------------------------------------------------------------------------------------------
_OPS = {"c": OpType.INSERT, "r": OpType.INSERT, "u": OpType.UPDATE, "d": OpType.DELETE, "t": OpType.TRUNCATE}


def _fields(schema: dict[str, Any] | None, name: str) -> dict[str, dict[str, Any]]:
    if not schema:
        return {}
    for f in schema.get("fields", ()):
        if f.get("field") == name:
            return {g["field"]: g for g in f.get("fields", ())}
    return {}


class DebeziumDecoder(Decoder):
    """Debezium JSON records back to :class:`DecodedEvent` (with or without the ``schema`` parts)."""

    protocol = PROTOCOL

    def decode(self, key: bytes | None, value: bytes | None) -> list[DecodedEvent]:
        try:
            k = json.loads(key) if key else None
            v = json.loads(value) if value is not None else None
        except ValueError as e:
            raise MessageDecodeError(f"debezium: not JSON: {e}") from e
        key_schema, key_payload = _split(k)
        if v is None:
            return [DecodedEvent(MessageKind.TOMBSTONE, key=key_payload)]
        schema, payload = _split(v)
        if not isinstance(payload, dict):
            raise MessageDecodeError("debezium: the value is not a JSON object")
        if "watermark_ts" in payload:
            return [DecodedEvent(MessageKind.WATERMARK, commit_ts=payload["watermark_ts"],
                                 commit_time=payload.get("ts_ms", 0) / 1000)]
        source = payload.get("source") or {}
        table = TableName(source.get("schema", ""), source.get("table", ""))
        lsn = source.get("lsn")
        commit_time = source["ts_us"] / 1e6 if source.get("ts_us") is not None else (
            source["ts_ms"] / 1000 if source.get("ts_ms") is not None else None)
        if "ddl" in payload and "tableChanges" in payload:
            return [DecodedEvent(MessageKind.DDL, table, None, lsn, commit_time, query=payload.get("ddl"),
                                 extra={"tableChanges": payload.get("tableChanges")})]
        op_code = payload.get("op")
        op = _OPS.get(op_code) if isinstance(op_code, str) else None
        if op is None:
            raise MessageDecodeError(f"debezium: unknown op {op_code!r}")
        snapshot = op_code == "r" or source.get("snapshot") not in (None, "false", False, "incremental")
        if op is OpType.TRUNCATE:
            return [DecodedEvent(MessageKind.ROW, table, op, lsn, commit_time, snapshot=snapshot)]
        col_schemas = self._column_schemas(table, schema)
        before = self._row(payload.get("before"), col_schemas, table)
        after = self._row(payload.get("after"), col_schemas, table)
        key_fields = {f["field"]: f for f in (key_schema or {}).get("fields", ())} or col_schemas
        key_values = self._row(key_payload, key_fields, table) if isinstance(key_payload, dict) else None
        if op is OpType.DELETE:
            return [DecodedEvent(MessageKind.ROW, table, op, lsn, commit_time, key_values, None, before, snapshot)]
        return [DecodedEvent(MessageKind.ROW, table, op, lsn, commit_time, key_values, after, before, snapshot)]

    def _column_schemas(self, table: TableName, schema: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        fields = _fields(schema, "after")
        if fields:
            return fields
        ts = self.schema_of(table)
        if ts is None:
            return {}
        return {c.name: D.column(c, self.config, True).schema for c in ts.columns}

    def _row(self, obj: Any, fields: dict[str, dict[str, Any]], table: TableName) -> dict[str, Any] | None:
        if obj is None:
            return None
        ts = self.schema_of(table)
        cols = {c.name: c for c in ts.columns} if ts is not None else {}
        out = {}
        for name, raw in obj.items():
            fs = fields.get(name)
            try:
                out[name] = D.decode_value(fs, raw, cols.get(name), self.config) if fs is not None else raw
            except (ValueError, TypeError, KeyError) as e:
                raise MessageDecodeError(f"debezium: table {table}: column {name!r}: {e}") from e
        return out


def _split(doc: Any) -> tuple[dict[str, Any] | None, Any]:
    """``(schema, payload)`` of a JsonConverter document with or without its envelope."""
    if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
        return doc["schema"], doc["payload"]
    return None, doc
