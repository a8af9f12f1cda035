"""TiCDC open-protocol: batched key/value frames of JSON events (``pkg/sink/codec/open``).

Framing (batch version 1, every length and the version big-endian 8-byte integers):
key = ``version(=1) | len(key1) | key1 | len(key2) | key2 ...``, value = ``len(value1) | value1 | ...``. Row events
are batched up to ``max-batch-size`` events per message and while the message stays within ``max-message-bytes``;
DDL and watermark events are messages of one event.

Event key: ``{"ts":TS,"scm":SCHEMA,"tbl":TABLE,"t":1}`` (1 row, 2 DDL, 3 watermark ("resolved"): ``{"ts":TS,"t":3}``
with an empty value). Row value: ``{"u":{..}}`` insert, ``{"u":{..},"p":{..}}`` update (new and old row),
``{"d":{..}}`` delete; each column ``name:{"t":TYPE,"h":true,"f":FLAGS,"v":VALUE}`` in column-name order (Go sorts
map keys), ``h`` only for key columns. Types, flags and values: ``sinks.codec.types`` (numbers as JSON numbers,
MySQL TEXT/BLOB types base64, the rest strings; a float's NaN/Infinity, which JSON numbers cannot spell, as the
strings ``"NaN"``/``"Infinity"``/``"-Infinity"``). DDL value: ``{"q":QUERY,"t":ACTION}`` with TiDB's DDL action
code (a TRUNCATE of the row stream: ``TRUNCATE TABLE "s"."t"``, 11).

As in canal-json: without REPLICA IDENTITY FULL an update's ``p`` and a delete's ``d`` hold the key columns only; a
value the upstream did not send is the placeholder string (base64 of it in TEXT/BLOB columns); rows of the initial
copy are inserts (no snapshot marker in the protocol).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
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
from sinks.codec.canal_json import canal_text_converter
from sinks.codec.schema_cache import SchemaCache

PROTOCOL = "open-protocol"
BATCH_VERSION = 1
TYPE_ROW, TYPE_DDL, TYPE_RESOLVED = 1, 2, 3
_U64 = struct.Struct(">Q")
_VERSION = _U64.pack(BATCH_VERSION)

ACTION_MULTI_SCHEMA_CHANGE = 61
_ACTIONS = {
    DdlKind.CREATE_TABLE: 3, DdlKind.DROP_TABLE: 4, DdlKind.ADD_COLUMN: 5, DdlKind.DROP_COLUMN: 6,
    DdlKind.CREATE_INDEX: 7, DdlKind.DROP_INDEX: 8, DdlKind.TRUNCATE_TABLE: 11, DdlKind.ALTER_COLUMN_TYPE: 12,
    DdlKind.RENAME_COLUMN: 12, DdlKind.SET_NOT_NULL: 12, DdlKind.DROP_NOT_NULL: 12, DdlKind.RENAME_TABLE: 14,
    DdlKind.SET_DEFAULT: 15, DdlKind.DROP_DEFAULT: 15, DdlKind.ADD_PRIMARY_KEY: 32, DdlKind.DROP_PRIMARY_KEY: 33,
    DdlKind.OTHER: 0,
}
"""TiDB's DDL action code of a DDL kind (TiDB renames a column and changes nullability with MODIFY COLUMN, 12)."""


def ddl_action(event: DdlEvent) -> int:
    actions = {_ACTIONS.get(c.kind, 0) for c in event.changes} or {0}
    return actions.pop() if len(actions) == 1 else ACTION_MULTI_SCHEMA_CHANGE


def _value_converter(col: Any) -> Callable[[Any], str]:
    """``value -> JSON fragment`` of one column's non-NULL values."""
    kind = T.value_kind(col)
    if kind == T.K_INT:
        return str
    if kind == T.K_BOOL:
        return lambda v: "1" if v else "0"
    if kind == T.K_FLOAT:
        return lambda v: X.go_json_float(v) if v == v and v not in (float("inf"), float("-inf")) \
            else X.json_string(X.positional_float(v))
    if kind == T.K_LONGTEXT:
        return lambda v: '"' + X.b64_text(str(v).encode()) + '"'
    if kind == T.K_BYTES:
        return lambda v: '"' + X.b64_text(bytes(v)) + '"'
    text = canal_text_converter(col)
    return lambda v: X.json_string(text(v))


@dataclass(slots=True)
class _Plan:
    schema: TableSchema
    order: tuple[int, ...]  # column indices in name order
    names: tuple[str, ...]
    pieces: tuple[str, ...]  # '"col":{"t":..,"h":true,"f":..,"v":' per column (schema order)
    convs: tuple[Callable[[Any], str], ...]
    placeholders: tuple[str, ...]
    key_idx: tuple[int, ...]
    key_head: bytes  # '{"ts":' ... filled per event


def _plan(schema: TableSchema, placeholder: str) -> _Plan:
    names = schema.column_names
    pieces, phs = [], []
    for c in schema.columns:
        t = T.mysql_type(c)
        flags = T.column_flags(c, schema)
        h = ',"h":true' if flags & T.FLAG_HANDLE_KEY else ""
        pieces.append(X.json_string(c.name) + ':{"t":' + str(t.code) + h + ',"f":' + str(flags) + ',"v":')
        phs.append('"' + X.b64_text(placeholder.encode()) + '"' if t.kind in (T.K_LONGTEXT, T.K_BYTES)
                   else X.json_string(placeholder))
    order = tuple(sorted(range(len(names)), key=lambda i: names[i].encode()))
    key_idx = tuple(names.index(k) for k in schema.key) if schema.has_key else tuple(range(len(names)))
    scm = ',"scm":' + X.json_string(schema.name.schema) if schema.name.schema else ""
    tbl = ',"tbl":' + X.json_string(schema.name.table) if schema.name.table else ""
    return _Plan(schema, order, names, tuple(pieces), tuple(_value_converter(c) for c in schema.columns),
                 tuple(phs), key_idx, (scm + tbl + ',"t":1}').encode())


class OpenProtocolEncoder(RowEventEncoder):
    """open-protocol (see the module docstring): row events batched per message."""

    protocol = PROTOCOL
    batching = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        placeholder = self.config.unavailable_value_placeholder
        self._plans: SchemaCache[_Plan] = SchemaCache(lambda s: _plan(s, placeholder))
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._size = 0  # bytes of the open batch (key + value, with the framing)
        self._last: RowChange | None = None
        self._last_key: tuple[Any, ...] | None = None

    # -- framing ---------------------------------------------------------------------------------------------
    def _close(self) -> None:
        if not self._keys:
            return
        last = self._last
        assert last is not None
        self._out.append(Message(_VERSION + b"".join(self._keys), b"".join(self._values), MessageKind.ROW, PROTOCOL,
                                 last.schema.name, last.commit_ts, len(self._keys), row_key=self._last_key))
        self._keys, self._values, self._size, self._last, self._last_key = [], [], 0, None, None

    def _add(self, change: RowChange, key: bytes, value: bytes, rkey: tuple[Any, ...] | None) -> None:
        n = len(key) + len(value) + 16
        if self._keys and (len(self._keys) >= self.config.max_batch_size
                           or self._size + 8 + n + 36 > self.config.max_message_bytes):
            self._close()
        self._keys.append(_U64.pack(len(key)) + key)
        self._values.append(_U64.pack(len(value)) + value)
        self._size += n
        self._last = change
        self._last_key = rkey

    def build(self) -> list[Message]:
        self._close()
        return super().build()

    @staticmethod
    def _single(key: bytes, value: bytes) -> tuple[bytes, bytes]:
        return _VERSION + _U64.pack(len(key)) + key, _U64.pack(len(value)) + value

    # -- rows ------------------------------------------------------------------------------------------------
    def _columns(self, plan: _Plan, values: dict[str, Any] | None, row: tuple[Any, ...] | None,
                 idx: tuple[int, ...] | None = None) -> str:
        pieces, convs, names, phs = plan.pieces, plan.convs, plan.names, plan.placeholders
        parts = []
        try:
            for i in plan.order:
                if idx is not None and i not in idx:
                    continue
                v = row[i] if row is not None else values.get(names[i], UNCHANGED)  # type: ignore[union-attr]
                parts.append(pieces[i] + ("null" if v is None else phs[i] if v is UNCHANGED else convs[i](v)) + "}")
        except (TypeError, ValueError, AttributeError) as e:
            raise EncodeError(f"table {plan.schema.name}: a value cannot be written as open-protocol: {e}") from e
        return "{" + ",".join(parts) + "}"

    def append_row(self, change: RowChange) -> None:
        op = change.op
        if op is OpType.TRUNCATE:
            self._close()
            self._out.append(self._ddl(change.schema.name, f"TRUNCATE TABLE {quoted_name(change.schema.name)}",
                                       _ACTIONS[DdlKind.TRUNCATE_TABLE], change.commit_ts))
            return
        plan = self._plans.get(change.schema)
        schema = plan.schema
        if op is OpType.INSERT:
            row = change.row
            value = '{"u":' + self._columns(plan, None if row is not None else change.values, row) + "}"
        elif op is OpType.UPDATE:
            prev = change.old_values
            if prev is not None and has_full_row(schema, prev):
                old = self._columns(plan, prev, None)
            else:
                known = dict(change.values or {})
                if prev:
                    known.update(prev)
                old = self._columns(plan, known, None, plan.key_idx)
            value = '{"u":' + self._columns(plan, change.values, None) + ',"p":' + old + "}"
        elif op is OpType.DELETE:
            prev = change.old_values
            if prev is None:
                raise EncodeError(f"table {schema.name}: a DELETE without old values (commit Ts {change.commit_ts})")
            cols = self._columns(plan, prev, None, None if has_full_row(schema, prev) else plan.key_idx)
            value = '{"d":' + cols + "}"
        else:  # pragma: no cover - OpType is closed
            raise EncodeError(f"table {schema.name}: unknown change {op!r}")
        key = b'{"ts":' + str(change.commit_ts).encode() + plan.key_head
        self._add(change, key, X.go_html_escape(value).encode(), row_key(change, plan.key_idx))

    def encode_key_only(self, change: RowChange, claim_check_location: str | None = None) -> Message:
        """TiCDC's large-message forms: the key columns only, the event key marked ``"ohk":true``
        (handle-key-only) or carrying ``"ccl":LOCATION`` (claim check); a message of its own."""
        schema = change.schema
        if not schema.has_key or change.op is OpType.TRUNCATE:
            raise EncodeError(f"table {schema.name}: a key-only open-protocol message needs a table with a key")
        plan = self._plans.get(schema)
        new = change.values if change.op is not OpType.DELETE else None
        known_old = {**(new or {}), **(change.old_values or {})}
        if change.op is OpType.DELETE:
            value = '{"d":' + self._columns(plan, known_old, None, plan.key_idx) + "}"
        elif change.op is OpType.UPDATE:
            value = ('{"u":' + self._columns(plan, new, None, plan.key_idx) + ',"p":'
                     + self._columns(plan, known_old, None, plan.key_idx) + "}")
        else:
            value = '{"u":' + self._columns(plan, new, None, plan.key_idx) + "}"
        mark = b',"ohk":true}' if claim_check_location is None else (
            ',"ccl":' + X.json_string(claim_check_location) + "}").encode()
        key = b'{"ts":' + str(change.commit_ts).encode() + plan.key_head[:-1] + mark
        k, v = self._single(X.go_html_escape(key.decode()).encode(), X.go_html_escape(value).encode())
        return Message(k, v, MessageKind.ROW, PROTOCOL, schema.name, change.commit_ts, 1,
                       row_key=row_key(change, plan.key_idx))

    # -- DDL and watermarks ----------------------------------------------------------------------------------
    def _ddl(self, table: TableName, query: str, action: int, commit_ts: int) -> Message:
        scm = ',"scm":' + X.json_string(table.schema) if table.schema else ""
        tbl = ',"tbl":' + X.json_string(table.table) if table.table else ""
        key = X.go_html_escape('{"ts":' + str(commit_ts) + scm + tbl + ',"t":2}').encode()
        value = X.go_html_escape('{"q":' + X.json_string(query) + ',"t":' + str(action) + "}").encode()
        k, v = self._single(key, value)
        return Message(k, v, MessageKind.DDL, PROTOCOL, table, commit_ts)

    def encode_ddl(self, event: DdlEvent) -> Message | None:
        return self._ddl(event.new_table or event.table, event.query, ddl_action(event), event.commit_ts)

    def encode_watermark(self, watermark: Watermark) -> Message | None:
        k, v = self._single(b'{"ts":' + str(watermark.ts).encode() + b',"t":3}', b"")
        return Message(k, v, MessageKind.WATERMARK, PROTOCOL, None, watermark.ts)


# ---- decoding ----------------------------------------------------------------------------------------------
def _frames(data: bytes, with_version: bool) -> list[bytes]:
    out, pos = [], 0
    if with_version:
        if len(data) < 8 or _U64.unpack_from(data)[0] != BATCH_VERSION:
            raise MessageDecodeError("open-protocol: the key does not start with batch version 1")
        pos = 8
    while pos < len(data):
        if pos + 8 > len(data):
            raise MessageDecodeError("open-protocol: a truncated length")
        (n,) = _U64.unpack_from(data, pos)
        pos += 8
        if pos + n > len(data):
            raise MessageDecodeError("open-protocol: a truncated event")
        out.append(data[pos:pos + n])
        pos += n
    return out


def _native(code: int, flags: int) -> Callable[[Any], Any]:
    if code in (249, 250, 251, 252):
        if flags & T.FLAG_BINARY:
            return X.parse_b64
        return lambda v: X.parse_b64(v).decode()
    if code == T.MYSQL_NEWDECIMAL:
        return Decimal
    if code in (T.MYSQL_FLOAT, T.MYSQL_DOUBLE):
        return float
    return lambda v: v


def _typed(col: Any) -> Callable[[Any], Any]:
    kind = T.value_kind(col)
    if kind == T.K_INT:
        return int
    if kind == T.K_BOOL:
        return bool
    if kind == T.K_FLOAT:
        return float
    if kind == T.K_DECIMAL:
        return Decimal
    if kind == T.K_LONGTEXT:
        return lambda v: X.parse_b64(v).decode()
    if kind == T.K_BYTES:
        return X.parse_b64
    if kind == T.K_ARRAY:
        return X.array_parser(T.element_kind(col))
    return X.text_parser(kind)


class OpenProtocolDecoder(Decoder):
    """open-protocol messages back to :class:`DecodedEvent`\\ s (one per event of the batch)."""

    protocol = PROTOCOL

    def decode(self, key: bytes | None, value: bytes | None) -> list[DecodedEvent]:
        if key is None:
            raise MessageDecodeError("open-protocol: a message without a key")
        keys = _frames(key, True)
        values = _frames(value or b"", False)
        if len(values) != len(keys):
            if not (len(values) == 0 and len(keys) == 1):
                raise MessageDecodeError(f"open-protocol: {len(keys)} keys but {len(values)} values")
            values = [b""]
        out = []
        for k, v in zip(keys, values, strict=True):
            try:
                mk = json.loads(k)
                mv = json.loads(v) if v else None
            except ValueError as e:
                raise MessageDecodeError(f"open-protocol: not JSON: {e}") from e
            t = mk.get("t")
            if t == TYPE_RESOLVED:
                out.append(DecodedEvent(MessageKind.WATERMARK, commit_ts=mk["ts"]))
                continue
            table = TableName(mk.get("scm", ""), mk.get("tbl", ""))
            if t == TYPE_DDL:
                q = (mv or {}).get("q")
                op = OpType.TRUNCATE if (mv or {}).get("t") == 11 else None
                out.append(DecodedEvent(MessageKind.DDL, table, op, mk["ts"], query=q,
                                        extra={"action": (mv or {}).get("t")}))
                continue
            if t != TYPE_ROW or not isinstance(mv, dict):
                raise MessageDecodeError(f"open-protocol: unknown event type {t!r}")
            ev = self._row(table, mk["ts"], mv)
            if mk.get("ohk"):
                ev.extra["onlyHandleKey"] = True
            if mk.get("ccl"):
                ev.extra["claimCheckLocation"] = mk["ccl"]
            out.append(ev)
        return out

    def _row(self, table: TableName, ts: int, mv: dict[str, Any]) -> DecodedEvent:
        schema = self.schema_of(table)
        typed = {c.name: (_typed(c), T.mysql_type(c).kind) for c in schema.columns} if schema is not None else {}
        placeholder = self.config.unavailable_value_placeholder
        ph64 = X.b64_text(placeholder.encode())
        handle: list[str] = []

        def cols(obj: dict[str, Any] | None) -> dict[str, Any] | None:
            if obj is None:
                return None
            res = {}
            for name, c in obj.items():
                v = c.get("v")
                if (c.get("h") or (c.get("f", 0) & T.FLAG_HANDLE_KEY)) and name not in handle:
                    handle.append(name)
                if v is None:
                    res[name] = None
                    continue
                code = c.get("t")
                if v == placeholder or (v == ph64 and code in (249, 250, 251, 252)):
                    res[name] = UNCHANGED
                    continue
                conv = typed[name][0] if name in typed else _native(code, c.get("f", 0))
                try:
                    res[name] = conv(v)
                except (ValueError, TypeError) as e:
                    raise MessageDecodeError(f"open-protocol: table {table}: column {name!r}: {e}") from e
            return res

        new, old, gone = cols(mv.get("u")), cols(mv.get("p")), cols(mv.get("d"))
        if schema is not None and schema.has_key:
            handle = list(schema.key)
        if gone is not None:
            op, values, old = OpType.DELETE, None, gone
        elif old is not None:
            op, values = OpType.UPDATE, new
        else:
            op, values = OpType.INSERT, new
        src = old if old is not None and all(k in old for k in handle) else values
        key = {k: src[k] for k in handle} if src is not None and handle else None
        return DecodedEvent(MessageKind.ROW, table, op, ts, None, key, values, old)
