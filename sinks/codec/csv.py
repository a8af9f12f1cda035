"""TiCDC's storage-sink CSV (``pkg/sink/codec/csv``): one line per row change, every row appended to one message.

A line: ``OP,TABLE,SCHEMA[,COMMIT_TS][,IS_UPDATE],v1,v2,...`` + terminator (``\\r\\n`` by default), ``OP`` one of
``I``/``U``/``D``. Strings are quoted with ``csv-quote`` (``"``, doubled inside; with an empty quote, CR, LF,
backslash and the delimiter are backslash-escaped); NULL is ``csv-null`` unquoted (``\\N``); numbers and the commit
Ts are unquoted (integers as digits, bool as ``1``/``0``, floats as Go's ``%v``: ``1.5``, ``1e+06``), everything
else is a quoted string in the text forms of ``sinks.codec.text`` (numeric and dates too: TiCDC's mounter gives
them as strings); bytea is base64 (``csv-binary-encoding-method=hex``: hex).

- ``csv-include-commit-ts`` (on; TiCDC: off) adds the commit Ts after the schema name.
- ``csv-output-old-value`` (off) adds ``IS_UPDATE`` (``true``/``false``) and writes an update as a ``D`` line with
  the old row followed by an ``I`` line with the new row, both with ``IS_UPDATE`` true (TiCDC's encoding).
- An update's old row and a delete's row are complete with REPLICA IDENTITY FULL; otherwise the columns the upstream
  did not send (and the unchanged TOAST values of an update) are the quoted ``unavailable-value-placeholder``: a CSV
  line has every column, and NULL would be a lie.
- ``csv-output-field-header``: ``Message.key`` holds the header line
  (``ticdc-meta$operation,ticdc-meta$table,ticdc-meta$schema[,ticdc-meta$commit-ts][,ticdc-meta$is-update],c1,...``),
  for the storage sink to write at the top of each file.
- CSV has no DDL, watermark or TRUNCATE lines: the storage sink records schema changes in its schema files and
  the watermark in its ``metadata`` file (``encode_ddl``/``encode_watermark`` return None); appending a TRUNCATE
  raises :class:`EncodeError` so that it is never dropped silently (the storage sink starts a new table version).
- Rows of the initial copy are ``I`` lines (no snapshot marker).

Decoding needs the table's schema (the values are positional, as TiCDC's CSV decoder needs its table info); without
it the values come back as the strings of the file (None for NULL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.events import UNCHANGED, DdlEvent, OpType, RowChange, TableName, TableSchema
from cdc.ts import Watermark
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
    row_key,
)
from sinks.codec.canal_json import canal_text_converter
from sinks.codec.schema_cache import SchemaCache

PROTOCOL = "csv"
META_COLUMNS = ("ticdc-meta$operation", "ticdc-meta$table", "ticdc-meta$schema")


def _quoter(cfg: EncoderConfig) -> Callable[[str], str]:
    q, delim = cfg.csv_quote, cfg.csv_delimiter
    if q:
        qq = q + q
        return lambda s: q + s.replace(q, qq) + q

    def escape(s: str) -> str:
        if "\\" in s:
            s = s.replace("\\", "\\\\")
        if "\r" in s:
            s = s.replace("\r", "\\r")
        if "\n" in s:
            s = s.replace("\n", "\\n")
        if delim in s:
            s = s.replace(delim, "".join("\\" + c for c in delim))
        return s

    return escape


def _field_converter(col: Any, cfg: EncoderConfig, quote: Callable[[str], str]) -> Callable[[Any], str]:
    kind = T.value_kind(col)
    if kind == T.K_INT:
        return str
    if kind == T.K_BOOL:
        return lambda v: "1" if v else "0"
    if kind == T.K_FLOAT:
        return X.go_format_g
    if kind == T.K_BYTES:
        enc = X.b64_text if cfg.csv_binary_encoding == "base64" else X.hex_text
        return lambda v: quote(enc(bytes(v)))
    text = canal_text_converter(col)
    return lambda v: quote(text(v))


@dataclass(slots=True)
class _Plan:
    schema: TableSchema
    names: tuple[str, ...]
    convs: tuple[Callable[[Any], str], ...]
    meta: dict[str, str]  # op -> 'OP,"table","schema"' (the commit Ts and is-update follow per row)
    header: bytes
    key_idx: tuple[int, ...]


def _plan(schema: TableSchema, cfg: EncoderConfig, quote: Callable[[str], str]) -> _Plan:
    d = cfg.csv_delimiter
    meta = {op: quote(op) + d + quote(schema.name.table) + d + quote(schema.name.schema) for op in "IUD"}
    head = list(META_COLUMNS)
    if cfg.csv_include_commit_ts:
        head.append("ticdc-meta$commit-ts")
    if cfg.csv_output_old_value:
        head.append("ticdc-meta$is-update")
    header = (d.join(head + list(schema.column_names)) + cfg.csv_terminator).encode()
    key_idx = tuple(schema.column_names.index(k) for k in schema.key) if schema.has_key else ()
    return _Plan(schema, schema.column_names, tuple(_field_converter(c, cfg, quote) for c in schema.columns),
                 meta, header, key_idx)


class CsvEncoder(RowEventEncoder):
    """TiCDC storage CSV (see the module docstring): ``build()`` returns one message with every appended line."""

    protocol = PROTOCOL
    batching = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.config
        self._quote = _quoter(cfg)
        self._plans: SchemaCache[_Plan] = SchemaCache(lambda s: _plan(s, cfg, self._quote))
        self._lines: list[str] = []
        self._rows = 0
        self._last: RowChange | None = None
        self._last_key: tuple[Any, ...] | None = None
        self._header: bytes | None = None
        self._null = cfg.csv_null
        self._placeholder = self._quote(cfg.unavailable_value_placeholder)

    def _line(self, plan: _Plan, op: str, change: RowChange, is_update: bool, values: dict[str, Any] | None,
              row: tuple[Any, ...] | None, missing: Any) -> str:
        cfg = self.config
        d, null, ph = cfg.csv_delimiter, self._null, self._placeholder
        parts = [plan.meta[op]]
        if cfg.csv_include_commit_ts:
            parts.append(str(change.commit_ts))
        if cfg.csv_output_old_value:
            parts.append("true" if is_update else "false")
        try:
            if row is not None:
                parts.extend(null if v is None else conv(v) for conv, v in zip(plan.convs, row, strict=True))
            else:
                assert values is not None
                for name, conv in zip(plan.names, plan.convs, strict=True):
                    v = values.get(name, missing)
                    parts.append(null if v is None else ph if v is UNCHANGED else conv(v))
        except (TypeError, ValueError, AttributeError) as e:
            raise EncodeError(f"table {plan.schema.name}: a value cannot be written as CSV: {e}") from e
        return d.join(parts) + cfg.csv_terminator

    def append_row(self, change: RowChange) -> None:
        op = change.op
        schema = change.schema
        if op is OpType.TRUNCATE:
            raise EncodeError(f"table {schema.name}: CSV has no TRUNCATE line; the storage sink must record the "
                              f"truncate of commit Ts {change.commit_ts} itself (a new table version)")
        plan = self._plans.get(schema)
        if self._header is None and self.config.csv_output_field_header:
            self._header = plan.header
        lines = self._lines
        if op is OpType.INSERT:
            row = change.row
            lines.append(self._line(plan, "I", change, False, None if row is not None else change.values, row,
                                    UNCHANGED))
        elif op is OpType.UPDATE:
            if self.config.csv_output_old_value:
                old = dict(change.values or {})
                for name in plan.names:
                    old[name] = UNCHANGED
                if change.old_values:
                    old.update(change.old_values)
                elif schema.has_key:
                    for k in schema.key:
                        old[k] = (change.values or {}).get(k, UNCHANGED)
                lines.append(self._line(plan, "D", change, True, old, None, UNCHANGED))
                lines.append(self._line(plan, "I", change, True, change.values, None, UNCHANGED))
            else:
                lines.append(self._line(plan, "U", change, False, change.values, None, UNCHANGED))
        elif op is OpType.DELETE:
            if change.old_values is None:
                raise EncodeError(f"table {schema.name}: a DELETE without old values (commit Ts {change.commit_ts})")
            lines.append(self._line(plan, "D", change, False, change.old_values, None, UNCHANGED))
        else:  # pragma: no cover - OpType is closed
            raise EncodeError(f"table {schema.name}: unknown change {op!r}")
        self._rows += 1
        self._last = change
        self._last_key = row_key(change, plan.key_idx)

    def build(self) -> list[Message]:
        if self._lines:
            last = self._last
            assert last is not None
            self._out.append(Message(self._header, "".join(self._lines).encode(), MessageKind.ROW, PROTOCOL,
                                     last.schema.name, last.commit_ts, self._rows, row_key=self._last_key))
            self._lines, self._rows, self._last, self._header, self._last_key = [], 0, None, None, None
        return super().build()

    def header(self, schema: TableSchema) -> bytes:
        """The header line of ``schema``'s files (``csv-output-field-header``)."""
        return self._plans.get(schema).header

    def encode_ddl(self, event: DdlEvent) -> Message | None:
        return None

    def encode_watermark(self, watermark: Watermark) -> Message | None:
        return None


# ---- decoding ----------------------------------------------------------------------------------------------
QUOTED, PLAIN, NULL = "quoted", "plain", "null"


def split_lines(data: str, cfg: EncoderConfig) -> list[list[tuple[str, str]]]:
    """Fields of each line of ``data`` as ``(text, how)``: ``how`` is QUOTED (unquoted now), PLAIN (unescaped when
    the configuration has no quote) or NULL (the null marker, unquoted and unescaped)."""
    q, delim, n, dl, null = cfg.csv_quote, cfg.csv_delimiter, len(data), len(cfg.csv_delimiter), cfg.csv_null
    lines: list[list[tuple[str, str]]] = []
    fields: list[tuple[str, str]] = []
    i = 0
    while i < n:
        if q and data.startswith(q, i):
            buf = []
            i += 1
            while True:
                j = data.find(q, i)
                if j < 0:
                    raise MessageDecodeError("csv: an unterminated quoted field")
                buf.append(data[i:j])
                if data.startswith(q, j + 1):
                    buf.append(q)
                    i = j + 2
                    continue
                i = j + 1
                break
            fields.append(("".join(buf), QUOTED))
        else:
            start = i
            buf = []
            while i < n and not data.startswith(delim, i) and data[i] not in "\r\n":
                c = data[i]
                if c == "\\" and not q and i + 1 < n:
                    nxt = data[i + 1]
                    buf.append({"n": "\n", "r": "\r"}.get(nxt, nxt))
                    i += 2
                    continue
                buf.append(c)
                i += 1
            fields.append(("", NULL) if data[start:i] == null else ("".join(buf), PLAIN))
        if data.startswith(delim, i):
            i += dl
            continue
        if data.startswith("\r\n", i):
            i += 2
        elif i < n and data[i] == "\n":
            i += 1
        elif i < n:
            raise MessageDecodeError(f"csv: unexpected character {data[i]!r} after a field")
        lines.append(fields)
        fields = []
    if fields:
        lines.append(fields)
    return lines


def _typed(col: Any, cfg: EncoderConfig) -> Callable[[str], Any]:
    kind = T.value_kind(col)
    if kind == T.K_BYTES:
        return X.parse_b64 if cfg.csv_binary_encoding == "base64" else bytes.fromhex
    if kind == T.K_ARRAY:
        return X.array_parser(T.element_kind(col))
    return X.text_parser(kind)


class CsvDecoder(Decoder):
    """CSV messages (files) back to :class:`DecodedEvent`\\ s, one per row change (an update written as a D and
    an I line with ``csv-output-old-value`` is one UPDATE). ``key`` (the header line, if any) is ignored; a header
    line at the top of ``value`` is skipped."""

    protocol = PROTOCOL

    def decode(self, key: bytes | None, value: bytes | None) -> list[DecodedEvent]:
        cfg = self.config
        try:
            lines = split_lines((value or b"").decode(), cfg)
        except UnicodeDecodeError as e:
            raise MessageDecodeError(f"csv: not UTF-8: {e}") from e
        meta = 3 + cfg.csv_include_commit_ts + cfg.csv_output_old_value
        out: list[DecodedEvent] = []
        pending: DecodedEvent | None = None
        for fields in lines:
            if fields and fields[0] == (META_COLUMNS[0], PLAIN):
                continue
            if len(fields) < meta:
                raise MessageDecodeError(f"csv: a line with {len(fields)} fields, fewer than the {meta} meta columns")
            op_text, table, schema_name = fields[0][0], fields[1][0], fields[2][0]
            name = TableName(schema_name, table)
            commit_ts = int(fields[3][0]) if cfg.csv_include_commit_ts else None
            is_update = cfg.csv_output_old_value and fields[meta - 1][0] == "true"
            values = self._values(name, fields[meta:])
            ev = self._event(name, op_text, commit_ts, values)
            if is_update and op_text == "D":
                pending = ev
                continue
            if is_update and op_text == "I" and pending is not None:
                ev = DecodedEvent(MessageKind.ROW, name, OpType.UPDATE, commit_ts, None,
                                  self._key(name, pending.old), values, pending.old)
                pending = None
            out.append(ev)
        if pending is not None:
            raise MessageDecodeError("csv: the old row of an update without its new row")
        return out

    def _event(self, name: TableName, op_text: str, commit_ts: int | None, values: dict[str, Any]) -> DecodedEvent:
        if op_text == "I":
            return DecodedEvent(MessageKind.ROW, name, OpType.INSERT, commit_ts, None, self._key(name, values), values)
        if op_text == "U":
            return DecodedEvent(MessageKind.ROW, name, OpType.UPDATE, commit_ts, None, self._key(name, values), values)
        if op_text == "D":
            return DecodedEvent(MessageKind.ROW, name, OpType.DELETE, commit_ts, None, self._key(name, values), None,
                                values)
        raise MessageDecodeError(f"csv: unknown operation {op_text!r}")

    def _key(self, name: TableName, values: dict[str, Any] | None) -> dict[str, Any] | None:
        schema = self.schema_of(name)
        if schema is None or not schema.has_key or values is None:
            return None
        return {k: values.get(k) for k in schema.key}

    def _values(self, name: TableName, fields: list[tuple[str, str]]) -> dict[str, Any]:
        cfg = self.config
        schema = self.schema_of(name)
        placeholder = cfg.unavailable_value_placeholder
        string = QUOTED if cfg.csv_quote else PLAIN  # how a string field is written
        if schema is None:
            return {str(i): None if how == NULL else t for i, (t, how) in enumerate(fields)}
        if len(fields) != len(schema.columns):
            raise MessageDecodeError(f"csv: table {name}: {len(fields)} values, the schema has {len(schema.columns)}")
        out: dict[str, Any] = {}
        for col, (t, how) in zip(schema.columns, fields, strict=True):
            if how == NULL:
                out[col.name] = None
            elif how == string and t == placeholder:
                out[col.name] = UNCHANGED
            else:
                try:
                    out[col.name] = _typed(col, cfg)(t)
                except (ValueError, ArithmeticError) as e:
                    raise MessageDecodeError(f"csv: table {name}: column {col.name!r}: {e}") from e
        return out
