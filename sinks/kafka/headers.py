"""The one Kafka record header the sink adds, ``tidewater``, and its parsing (used by the consumer library).

Value (ASCII):

- a row or DDL message: ``<span>/<spans>:<seq>[,<seq>...]``: the span that wrote it (0-based) of how many, and the
  event position of each event in it, in order (``sinks.kafka.sink``: per span and commit Ts, a replay numbers its
  events as the first run did). Writers of the initial copy are bound to no span: ``-:<seq>...``; a copied row of a
  chunk (``CopyAnnouncer.write_copy_chunk``) says which: ``-<chunk>:<seq>...`` (the consumer counts them per chunk
  and partition against the chunk's marker: ``sinks.kafka.copy_markers``).
- a span's watermark: ``<span>/<spans>``. The changefeed checkpoint's watermarks (the owner's) carry no header.

One header, not two, on row messages: kafka-python's cost per header is ~2 us per message, a tenth of the sink's
budget. DDL messages (rare) carry a second one, ``tidewater-ddl``, when the DDL changes the column set: JSON
``{"changes": [[kind, column, new name], ...], "columns": [added column, ...], "fills": {column: fill}}`` (the
:class:`cdc.events.DdlChange` kinds ``add column``, ``drop column``, ``rename column``; each added column as
``cdc.serde`` writes a :class:`cdc.events.ColumnSchema`, with its type and default; each added column's
:class:`cdc.events.ColumnFill` as ``sinks.codec.fills`` writes it),
so that a consumer applies a rename as a rename and fills the rows that existed with what they hold upstream (the
protocols' DDL messages carry only the statement). A consumer that does not know ``fills`` falls back to the
default expression. A CREATE TABLE carries it too: ``{"changes": [["create table", null, null]], "columns": [],
"table": schema}``, the new table's :class:`cdc.events.TableSchema` as ``cdc.serde`` writes it (exact column types,
key, defaults; each column without the fields at their dataclass defaults), so that a consumer creates the table at its place, also when it stays empty (a consumer of an older
version reads ``changes`` it cannot apply and keeps creating the table at its first row).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from cdc.events import ColumnFill, ColumnSchema, DdlChange, DdlEvent, DdlKind, TableSchema
from cdc.serde import from_dict, to_dict
from sinks.codec.fills import fill_doc, fill_of

HEADER = "tidewater"
DDL_HEADER = "tidewater-ddl"
COLUMN_SET = (DdlKind.ADD_COLUMN, DdlKind.DROP_COLUMN, DdlKind.RENAME_COLUMN)


class DdlHeader(NamedTuple):
    """A ``tidewater-ddl`` header: the column-set changes, the added columns by name, their fills; for a CREATE
    TABLE, the new table's schema (``table``, else None)."""

    changes: tuple[DdlChange, ...]
    columns: dict[str, ColumnSchema]
    fills: tuple[ColumnFill, ...] = ()
    table: TableSchema | None = None


def row_header(span: bytes | None, seqs: Sequence[int]) -> tuple[str, bytes]:
    """The header of a row or DDL message; ``span`` as :func:`span_value` gives it (None: unbound)."""
    text = str(seqs[0]) if len(seqs) == 1 else ",".join(map(str, seqs))
    return HEADER, (span or b"-") + b":" + text.encode()


def span_value(span: int, spans: int) -> bytes:
    return f"{span}/{spans}".encode()


def copy_value(chunk: int) -> bytes:
    """The span part of a copied row's header that names its chunk (``-<chunk>``)."""
    return b"-%d" % chunk


def parse(value: bytes | None) -> tuple[str | None, list[int]]:
    """``(span text "i/n" or None, event positions)`` of a header value (None: no header, or a copy writer's)."""
    if not value:
        return None, []
    text = value.decode("ascii")
    span, _, seqs = text.partition(":")
    return (None if not span or span[0] == "-" else span), ([int(s) for s in seqs.split(",")] if seqs else [])


def copy_chunk(value: bytes) -> int | None:
    """The chunk a copy writer's header (``-<chunk>:...``) names; None: none (``-:...``, or not a copy writer's)."""
    span = value.partition(b":")[0]
    return int(span[1:]) if len(span) > 1 and span[:1] == b"-" else None


def ddl_header(event: DdlEvent) -> tuple[str, bytes] | None:
    """The ``tidewater-ddl`` header of a DDL message (module docstring); None when the DDL neither creates the table
    nor changes its column set."""
    if DdlKind.CREATE_TABLE in event.kinds and event.after is not None:
        doc = {"changes": [[DdlKind.CREATE_TABLE.value, None, None]], "columns": [], "table": _table_doc(event.after)}
        return DDL_HEADER, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    changes = [c for c in event.changes if c.kind in COLUMN_SET]
    if not changes:
        return None
    after = {c.name: c for c in event.after.columns} if event.after is not None else {}
    added = [to_dict(after[c.column]) for c in changes if c.kind is DdlKind.ADD_COLUMN and c.column in after]
    doc: dict[str, Any] = {"changes": [[c.kind.value, c.column, c.new_name] for c in changes], "columns": added}
    fills = {f.column: fill_doc(after[f.column], f) for f in event.fills if f.column in after}
    if fills:
        doc["fills"] = fills
    return DDL_HEADER, json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _table_doc(schema: TableSchema) -> dict[str, Any]:
    """``schema`` as ``cdc.serde`` writes it, each column without the fields that hold their defaults (``from_dict``
    restores them): about half the bytes, since the header counts against the topic's max.message.bytes."""
    doc = to_dict(schema)
    defaults = {f.name: f.default for f in dataclasses.fields(ColumnSchema) if f.default is not dataclasses.MISSING}
    doc["columns"] = [{k: v for k, v in c.items() if k not in defaults or v != defaults[k]} for c in doc["columns"]]
    return doc


def parse_ddl(value: bytes | None) -> DdlHeader | None:
    """The changes, added columns and fills of a ``tidewater-ddl`` header value (None: no header, or one this version
    cannot read - then the consumer falls back to the statement)."""
    if not value:
        return None
    try:
        doc = json.loads(value)
        changes = tuple(DdlChange(DdlKind(k), c, n) for k, c, n in doc["changes"])
        columns = {c.name: c for c in (from_dict(ColumnSchema, c) for c in doc.get("columns", ()))}
        fills = [fill_of(columns[name], f) for name, f in (doc.get("fills") or {}).items()]
        table = from_dict(TableSchema, doc["table"]) if doc.get("table") else None
    except (ValueError, KeyError, TypeError, ArithmeticError):
        return None
    return DdlHeader(changes, columns, tuple(fills), table)
