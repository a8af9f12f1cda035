"""canal-json: Alibaba Canal's FlatMessage as TiCDC writes it, with the ``_tidb`` extension (on by default).

One message per row change, no key. Field order and spelling are TiCDC's (``pkg/sink/codec/canal``):

``{"id":0,"database":S,"table":T,"pkNames":[..]|null,"isDdl":false,"type":"INSERT|UPDATE|DELETE","es":MS,
"ts":MS,"sql":"","sqlType":{col:code},"mysqlType":{col:type},"old":[{..}]|null,"data":[{..}],
"_tidb":{"commitTs":TS}}``

- every value is a JSON string (``null`` for NULL) in the text forms of ``sinks.codec.text``; ``sqlType`` /
  ``mysqlType`` describe the columns as the MySQL columns Tidewater's MySQL sink creates (``sinks.codec.types``),
  in column order (TiCDC writes ``mysqlType`` in Go map order, i.e. unordered);
- ``es`` is the upstream commit time in milliseconds (TiCDC: the physical part of the TSO), ``ts`` the time of
  encoding, ``_tidb.commitTs`` the commit Ts (the commit LSN);
- UPDATE: ``data`` is the new row, ``old`` the old row: complete with REPLICA IDENTITY FULL, else the key columns
  (their old values; the key is unchanged unless the upstream sent the old key). DELETE: ``data`` is the old row,
  complete with REPLICA IDENTITY FULL, else the key columns only (like TiCDC's
  ``delete-only-output-handle-key-columns``), and ``sqlType``/``mysqlType`` then list those columns only;
- a value the upstream did not send (an unchanged TOAST value of REPLICA IDENTITY DEFAULT) is the string
  ``EncoderConfig.unavailable_value_placeholder`` (``__debezium_unavailable_value``): TiCDC has no such concept;
- rows of the initial copy are INSERTs: canal-json has no snapshot marker;
- DDL: ``{"id":0,..,"isDdl":true,"type":"CREATE|ALTER|ERASE|RENAME|TRUNCATE|CINDEX|DINDEX|QUERY","es":..,"ts":..,
  "sql":QUERY,"sqlType":null,"mysqlType":null,"data":null,"old":null,"_tidb":{"commitTs":TS}}`` (a TRUNCATE of the
  row stream is written the same way, ``sql`` ``TRUNCATE TABLE "s"."t"``);
- watermark: ``type`` ``TIDB_WATERMARK``, ``_tidb`` ``{"watermarkTs":TS}``, only with the TiDB extension;
- strings are escaped as Go's encoders escape them (``<``, ``>``, ``&`` as ``\\u003c``...).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.events import UNCHANGED, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from cdc.ts import Watermark
from sinks.codec import text as X
from sinks.codec import types as T
from sinks.codec.base import (
    DecodedEvent,
    Decoder,
    EncodeError,
    Message,
    MessageDecodeError,
    MessageKind,
    RowEventEncoder,
    has_full_row,
    quoted_name,
    row_key,
)
from sinks.codec.schema_cache import SchemaCache

PROTOCOL = "canal-json"
WATERMARK_TYPE = "TIDB_WATERMARK"

_DDL_TYPES = {
    DdlKind.CREATE_TABLE: "CREATE",
    DdlKind.DROP_TABLE: "ERASE",
    DdlKind.RENAME_TABLE: "RENAME",
    DdlKind.TRUNCATE_TABLE: "TRUNCATE",
    DdlKind.CREATE_INDEX: "CINDEX",
    DdlKind.ADD_PRIMARY_KEY: "CINDEX",
    DdlKind.DROP_INDEX: "DINDEX",
    DdlKind.DROP_PRIMARY_KEY: "DINDEX",
    DdlKind.OTHER: "QUERY",
}
"""Canal's event type of a DDL kind (TiCDC's convertDdlEventType); column changes are ALTER."""


def ddl_type(event: DdlEvent) -> str:
    """Canal's event type of ``event``: that of its change, ALTER when it has several of different types."""
    types = {_DDL_TYPES.get(c.kind, "ALTER") for c in event.changes} or {"QUERY"}
    return types.pop() if len(types) == 1 else "ALTER"


def canal_text_converter(col: Any) -> Callable[[Any], str]:
    """``value -> text`` of one column's non-NULL values in canal-json (and the other text protocols)."""
    kind = T.value_kind(col)
    fsp = T.fraction_digits(col)
    if kind == T.K_INT:
        return str
    if kind == T.K_BOOL:
        return lambda v: "1" if v else "0"
    if kind == T.K_DECIMAL:
        return lambda v: X.decimal_text(v) if hasattr(v, "is_finite") else str(v)
    if kind == T.K_FLOAT:
        return lambda v: X.positional_float(v) if type(v) is float else str(v)
    if kind == T.K_BYTES:
        return lambda v: X.latin1_text(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v)
    if kind == T.K_DATE:
        return X.date_text
    if kind == T.K_TIME:
        return lambda v: X.time_text(v, fsp)
    if kind in (T.K_DATETIME, T.K_TIMESTAMPTZ):
        return lambda v: X.datetime_text(v, fsp)
    if kind == T.K_ARRAY:
        return X.array_renderer(T.element_kind(col), fsp)
    return str


@dataclass(slots=True)
class _Plan:
    schema: TableSchema
    names: tuple[str, ...]
    pieces: tuple[str, ...]  # '"col":' per column
    convs: tuple[Callable[[Any], str], ...]
    key_idx: tuple[int, ...]
    full_types: str  # ',"sqlType":{..},"mysqlType":{..}'
    key_types: str  # the same for the key columns only
    head: str  # '{"id":0,"database":..,"table":..,"pkNames":..,"isDdl":false,"type":"'


def _types_json(schema: TableSchema, idx: tuple[int, ...]) -> str:
    if not idx:
        return ',"sqlType":null,"mysqlType":null'
    cols = [schema.columns[i] for i in idx]
    sql = ",".join(X.json_string(c.name) + ":" + str(T.mysql_type(c).java_type) for c in cols)
    my = ",".join(X.json_string(c.name) + ":" + X.json_string(T.mysql_type(c).mysql_type) for c in cols)
    return ',"sqlType":{' + sql + '},"mysqlType":{' + my + "}"


def _plan(schema: TableSchema) -> _Plan:
    names = schema.column_names
    key_idx = tuple(names.index(k) for k in schema.key) if schema.has_key else tuple(range(len(names)))
    pk = "[" + ",".join(X.json_string(k) for k in schema.key) + "]" if schema.has_key else "null"
    head = ('{"id":0,"database":' + X.json_string(schema.name.schema) + ',"table":' + X.json_string(schema.name.table)
            + ',"pkNames":' + pk + ',"isDdl":false,"type":"')
    return _Plan(schema, names, tuple(X.json_string(n) + ":" for n in names),
                 tuple(canal_text_converter(c) for c in schema.columns), key_idx,
                 _types_json(schema, tuple(range(len(names)))), _types_json(schema, key_idx), head)


class CanalJsonEncoder(RowEventEncoder):
    """canal-json (see the module docstring). One message per row change."""

    protocol = PROTOCOL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plans: SchemaCache[_Plan] = SchemaCache(_plan)
        self._placeholder = X.json_string(self.config.unavailable_value_placeholder)

    # -- rows ------------------------------------------------------------------------------------------------
    def _object(self, plan: _Plan, values: dict[str, Any] | None, row: tuple[Any, ...] | None,
                idx: tuple[int, ...] | None = None) -> str:
        pieces, convs, js, ph = plan.pieces, plan.convs, X.json_string, self._placeholder
        parts = []
        try:
            if row is not None:
                parts = [pre + ("null" if v is None else js(conv(v))) for pre, conv, v in zip(pieces, convs, row,
                                                                                              strict=True)]
            else:
                assert values is not None
                names = plan.names
                for i in range(len(names)) if idx is None else idx:
                    v = values.get(names[i], UNCHANGED)
                    parts.append(pieces[i] + ("null" if v is None else ph if v is UNCHANGED else js(convs[i](v))))
        except (TypeError, ValueError, AttributeError) as e:
            raise EncodeError(f"table {plan.schema.name}: a value cannot be written as canal-json: {e}") from e
        return "[{" + ",".join(parts) + "}]"

    def _tidb(self, commit_ts: int) -> str:
        return ',"_tidb":{"commitTs":' + str(commit_ts) + "}}" if self.config.enable_tidb_extension else "}"

    def append_row(self, change: RowChange) -> None:
        op = change.op
        if op is OpType.TRUNCATE:
            self._out.append(self._ddl_message(change.schema.name, "TRUNCATE",
                                               f"TRUNCATE TABLE {quoted_name(change.schema.name)}", change.commit_ts,
                                               change.commit_time))
            return
        plan = self._plans.get(change.schema)
        schema = plan.schema
        if op is OpType.INSERT:
            row = change.row
            data = self._object(plan, None if row is not None else change.values, row)
            types, old, kind = plan.full_types, "null", "INSERT"
        elif op is OpType.UPDATE:
            data = self._object(plan, change.values, None)
            types, kind = plan.full_types, "UPDATE"
            prev = change.old_values
            if prev is not None and has_full_row(schema, prev):
                old = self._object(plan, prev, None)
            else:  # the old key: sent when it changed, else the same as the new one
                known = dict(change.values or {})
                if prev:
                    known.update(prev)
                old = self._object(plan, known, None, plan.key_idx)
        elif op is OpType.DELETE:
            prev = change.old_values
            if prev is None:
                raise EncodeError(f"table {schema.name}: a DELETE without old values (commit Ts {change.commit_ts})")
            if has_full_row(schema, prev):
                data, types = self._object(plan, prev, None), plan.full_types
            else:
                data, types = self._object(plan, prev, None, plan.key_idx), plan.key_types
            old, kind = "null", "DELETE"
        else:  # pragma: no cover - OpType is closed
            raise EncodeError(f"table {schema.name}: unknown change {op!r}")
        doc = "".join((plan.head, kind, '","es":', str(int(change.commit_time * 1000)), ',"ts":',
                       str(int(self.clock() * 1000)), ',"sql":""', types, ',"old":', old, ',"data":', data,
                       self._tidb(change.commit_ts)))
        value = X.go_html_escape(doc).encode()
        self._out.append(Message(None, value, MessageKind.ROW, PROTOCOL, schema.name, change.commit_ts, 1,
                                 row_key=row_key(change, plan.key_idx)))

    def encode_key_only(self, change: RowChange, claim_check_location: str | None = None) -> Message:
        """TiCDC's large-message forms: ``data`` (and ``old``) with the key columns only, ``sqlType``/``mysqlType``
        of those, and ``_tidb.onlyHandleKey`` true or ``_tidb.claimCheckLocation`` (needs the TiDB extension)."""
        schema = change.schema
        if not self.config.enable_tidb_extension or not schema.has_key or change.op is OpType.TRUNCATE:
            raise EncodeError(f"table {schema.name}: a key-only canal-json message needs a table with a key and "
                              "enable-tidb-extension=true")
        plan = self._plans.get(schema)
        new = change.values if change.op is not OpType.DELETE else None
        known_old = {**(new or {}), **(change.old_values or {})}
        old, kind = "null", {OpType.INSERT: "INSERT", OpType.UPDATE: "UPDATE", OpType.DELETE: "DELETE"}[change.op]
        if change.op is OpType.DELETE:
            data = self._object(plan, known_old, None, plan.key_idx)
        else:
            data = self._object(plan, new, None, plan.key_idx)
            if change.op is OpType.UPDATE:
                old = self._object(plan, known_old, None, plan.key_idx)
        mark = ('"onlyHandleKey":true' if claim_check_location is None
                else '"claimCheckLocation":' + X.json_string(claim_check_location))
        doc = "".join((plan.head, kind, '","es":', str(int(change.commit_time * 1000)), ',"ts":',
                       str(int(self.clock() * 1000)), ',"sql":""', plan.key_types, ',"old":', old, ',"data":', data,
                       ',"_tidb":{"commitTs":', str(change.commit_ts), ",", mark, "}}"))
        return Message(None, X.go_html_escape(doc).encode(), MessageKind.ROW, PROTOCOL, schema.name, change.commit_ts,
                       1, row_key=row_key(change, plan.key_idx))

    # -- DDL and watermarks ----------------------------------------------------------------------------------
    def _ddl_message(self, table: TableName, kind: str, query: str, commit_ts: int, commit_time: float) -> Message:
        doc = ('{"id":0,"database":' + X.json_string(table.schema) + ',"table":' + X.json_string(table.table)
               + ',"pkNames":null,"isDdl":true,"type":"' + kind + '","es":' + str(int(commit_time * 1000))
               + ',"ts":' + str(int(self.clock() * 1000)) + ',"sql":' + X.json_string(query)
               + ',"sqlType":null,"mysqlType":null,"data":null,"old":null' + self._tidb(commit_ts))
        return Message(None, X.go_html_escape(doc).encode(), MessageKind.DDL, PROTOCOL, table, commit_ts)

    def encode_ddl(self, event: DdlEvent) -> Message | None:
        table = event.new_table or event.table
        return self._ddl_message(table, ddl_type(event), event.query, event.commit_ts, event.commit_time)

    def encode_watermark(self, watermark: Watermark) -> Message | None:
        if not self.config.enable_tidb_extension:
            return None
        doc = ('{"id":0,"database":"","table":"","pkNames":null,"isDdl":false,"type":"' + WATERMARK_TYPE
               + '","es":' + str(int(watermark.time * 1000)) + ',"ts":' + str(int(self.clock() * 1000))
               + ',"sql":"","sqlType":null,"mysqlType":null,"data":null,"old":null,"_tidb":{"watermarkTs":'
               + str(watermark.ts) + "}}")
        return Message(None, doc.encode(), MessageKind.WATERMARK, PROTOCOL, None, watermark.ts)


# ---- decoding ----------------------------------------------------------------------------------------------
_INT_TYPES = ("tinyint", "smallint", "mediumint", "int", "bigint", "year", "bit")


def _native_parser(mysql_type: str) -> Callable[[str], Any]:
    """Value typing from ``mysqlType`` alone (no schema known)."""
    base = mysql_type.split("(")[0].split(" ")[0]
    if base in _INT_TYPES:
        return int
    if base == "decimal":
        return X.text_parser(T.K_DECIMAL)
    if base in ("float", "double"):
        return float
    if "blob" in base or "binary" in base:
        return lambda t: t.encode("latin-1")
    return lambda t: t


class CanalJsonDecoder(Decoder):
    """canal-json messages back to :class:`DecodedEvent` (one per message; also reads messages without ``_tidb``:
    ``commit_ts`` is then None)."""

    protocol = PROTOCOL

    def decode(self, key: bytes | None, value: bytes | None) -> list[DecodedEvent]:
        if value is None:
            raise MessageDecodeError("canal-json: a message without a value")
        try:
            msg = json.loads(value)
        except ValueError as e:
            raise MessageDecodeError(f"canal-json: not JSON: {e}") from e
        if not isinstance(msg, dict) or "type" not in msg:
            raise MessageDecodeError("canal-json: not a FlatMessage (no 'type')")
        ext = msg.get("_tidb") or {}
        es = msg.get("es")
        commit_time = es / 1000 if isinstance(es, (int, float)) else None
        if msg.get("type") == WATERMARK_TYPE:
            return [DecodedEvent(MessageKind.WATERMARK, commit_ts=ext.get("watermarkTs"), commit_time=commit_time)]
        table = TableName(msg.get("database") or "", msg.get("table") or "")
        commit_ts = ext.get("commitTs")
        if msg.get("isDdl"):
            op = OpType.TRUNCATE if msg["type"] == "TRUNCATE" else None
            return [DecodedEvent(MessageKind.DDL, table, op, commit_ts, commit_time, query=msg.get("sql"),
                                 extra={"type": msg["type"]})]
        kind = msg["type"]
        op = {"INSERT": OpType.INSERT, "UPDATE": OpType.UPDATE, "DELETE": OpType.DELETE}.get(kind)
        if op is None:
            raise MessageDecodeError(f"canal-json: unknown event type {kind!r}")
        parse = self._parsers(table, msg.get("mysqlType") or {})
        data = self._row(msg.get("data"), parse)
        old = self._row(msg.get("old"), parse)
        pk = msg.get("pkNames") or []
        if op is OpType.DELETE:
            values, old = None, data
        else:
            values = data
        src = old if old is not None and all(k in old for k in pk) else values
        key = {k: src[k] for k in pk} if src is not None and pk else None
        extra = {k: ext[k] for k in ("onlyHandleKey", "claimCheckLocation") if ext.get(k)}
        return [DecodedEvent(MessageKind.ROW, table, op, commit_ts, commit_time, key, values, old, extra=extra)]

    def _parsers(self, table: TableName, mysql_types: dict[str, str]) -> Callable[[str, str], Any]:
        schema = self.schema_of(table)
        placeholder = self.config.unavailable_value_placeholder
        if schema is not None:
            by_name = {c.name: X.text_parser(T.value_kind(c)) if T.value_kind(c) != T.K_ARRAY
                       else X.array_parser(T.element_kind(c)) for c in schema.columns}
        else:
            by_name = {n: _native_parser(t) for n, t in mysql_types.items()}

        def parse(name: str, text: str) -> Any:
            if text == placeholder:
                return UNCHANGED
            p = by_name.get(name)
            if p is None and name in mysql_types:  # a column the schema no longer has (renamed, dropped since)
                p = by_name[name] = _native_parser(mysql_types[name])
            try:
                return p(text) if p is not None else text
            except ValueError as e:
                raise MessageDecodeError(f"canal-json: table {table}: column {name!r}: {e}") from e

        return parse

    @staticmethod
    def _row(rows: Any, parse: Callable[[str, str], Any]) -> dict[str, Any] | None:
        if not rows:
            return None
        return {n: None if t is None else parse(n, t) for n, t in rows[0].items()}
