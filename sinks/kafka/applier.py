"""The consumer library's SQL target (``sinks.kafka.consumer``): :class:`SinkApplier` applies each cut of events to any
SQL sink of ``sinks.factory``, creating and altering the tables as the events show them.

Schemas: with a :data:`sinks.codec.base.SchemaLookup` (e.g. the upstream's), exact column types; otherwise inferred
from the decoded values (:func:`infer_schema`: the messages' column set, types from the Python values; lossy, see
docs/sinks.md). DDL:

- CREATE TABLE with the Kafka sink's ``tidewater-ddl`` header (which carries the new table's schema) creates the
  target table at its place among the rows, from that schema (exact column types; the SQL sink's translation of a
  create), so a table that stays empty upstream is there downstream too. A Tidewater CREATE message without the
  schema (a sink of an older version) takes the ``schemas`` lookup's when given. A target table already there with
  the same columns and key (``sinks.base.TableShape.fits``: a replay, e.g. the consumer restarted from an earlier
  watermark) is used as it is; one of another shape stops the consumer (``SinkError`` naming the table and both
  shapes), never written in the wrong shape. Other producers' CREATE messages (no header) create nothing: the table
  is created at its first row, as its columns show it (an upstream table that stays empty is missing downstream).
- TRUNCATE is applied at its place among the rows; DROP TABLE drops the target table.
- A column-set change (ADD, DROP, RENAME COLUMN) is applied exactly at its place when the DDL message says what it
  is: the Kafka sink's ``tidewater-ddl`` header (``sinks.kafka.headers``: the elementary changes, and each added
  column's exact type and default, and what the rows that existed hold in it: one value, or one per row, which
  ``row_source`` (the upstream's, ``--upstream``) reads back by key; without it such a DDL stops the consumer), or, from other producers, a statement that is one ``ALTER TABLE ... RENAME COLUMN a TO b`` of that
  table. A rename is then a rename: the column keeps its values.
- Any other DDL marks the table, and the next row whose column set differs becomes ADD/DROP COLUMN downstream (a
  rename seen that way would lose the column's values: the consumer logs it as a warning).

Key-only messages: a handle-key-only row is fetched with ``fetch_row`` when given, else the consumer fails naming
the table and key. Threading: the consumer's one thread.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cdc.errors import SinkError
from cdc.events import ColumnSchema, DdlChange, DdlEvent, DdlKind, OpType, RowChange, TableName, TableSchema
from sinks.base import RowSource, TableShapes
from sinks.codec import DecodedEvent, MessageKind
from sinks.codec.base import SchemaLookup
from sinks.kafka.headers import DdlHeader
from sinks.kafka.target import Event, is_create_table, is_drop_table

log = logging.getLogger(__name__)

CONSUMER_POSITION = "kafka-consumer"

RowFetcher = Callable[[TableName, dict[str, Any]], dict[str, Any] | None]
"""``fetch(table, key)``: the row's current values (all columns) from the upstream, or None when it is gone."""

COLUMN_SET = (DdlKind.RENAME_COLUMN, DdlKind.DROP_COLUMN, DdlKind.ADD_COLUMN)

_INFERRED: list[tuple[type, str, int]] = [
    (bool, "bool", 16), (int, "int8", 20), (decimal.Decimal, "numeric", 1700), (float, "float8", 701),
    (bytes, "bytea", 17), (dt.datetime, "timestamp", 1114), (dt.date, "date", 1082), (dt.time, "time", 1083),
    (uuid.UUID, "uuid", 2950), (dict, "jsonb", 3802), (str, "text", 25),
]


def _inferred_column(name: str, value: Any, is_key: bool) -> ColumnSchema:
    for tp, base, oid in _INFERRED:
        if isinstance(value, tp):
            if tp is dt.datetime and value.tzinfo is not None:
                base, oid = "timestamptz", 1184
            return ColumnSchema(name, oid, base, False, base, nullable=not is_key, is_key=is_key)
    return ColumnSchema(name, 25, "text", False, "text", nullable=not is_key, is_key=is_key)


def infer_schema(table: TableName, values: Mapping[str, Any], key: Sequence[str], base: TableSchema | None,
                 version: int) -> TableSchema:
    """A table schema for a row's column set: each column from ``base`` (e.g. the upstream's schema) when it has
    it, else inferred from the value's Python type; the key from the message, else from ``base``."""
    known = {c.name: c for c in base.columns} if base is not None else {}
    key = tuple(key) or (base.key if base is not None and base.has_key else ())
    cols = tuple(known[n] if n in known else _inferred_column(n, values[n], n in key) for n in values)
    has_key = bool(key)
    return TableSchema(table, cols, key if has_key else tuple(values), "d" if has_key else "f", 0, version, has_key)


class SinkApplier:
    """Applies cuts to an SQL target through ``sinks.factory`` (see the module docstring); a
    :class:`sinks.kafka.target.Applier`."""

    def __init__(self, sink_uri: str, *, position: str = CONSUMER_POSITION, schemas: SchemaLookup | None = None,
                 fetch_row: RowFetcher | None = None, open_sink: Callable[[str], Any] | None = None,
                 row_source: RowSource | None = None) -> None:
        if open_sink is None:
            from sinks.factory import open_sink
        self.sink = open_sink(sink_uri)
        self.row_source = row_source  # re-reads a volatile default's values (DdlEvent.fills), as the span's sink does
        self.sink.set_row_source(row_source)
        self.position = position
        self.schemas = schemas
        self.fetch_row = fetch_row
        self._tables: dict[TableName, TableSchema] = {}
        self._ddl_pending: set[TableName] = set()
        self._seen_at: dict[TableName, int] = {}  # commit Ts of the event that gave _tables its entry (observe)
        self._version = 0
        self._ddl_seq: dict[int, int] = {}
        self._rows: list[RowChange] = []  # the cut's rows not yet written

    def open(self) -> int:
        self.sink.check()
        return self.sink.open_position(self.position, 0, 0)

    def observe(self, event: Event) -> None:
        ev = event.ev
        if ev.table is None:
            return
        if ev.kind is MessageKind.DDL and is_drop_table(ev):
            if event.commit_ts >= self._seen_at.get(ev.table, 0):
                self._tables.pop(ev.table, None)
                self._seen_at[ev.table] = event.commit_ts
            return
        created = self._created(event) if ev.kind is MessageKind.DDL else None
        if created is not None:  # created before the restart: the target has that shape
            if event.commit_ts >= self._seen_at.get(ev.table, 0):
                self._tables[ev.table] = created
                self._seen_at[ev.table] = event.commit_ts
            return
        if ev.kind is MessageKind.DDL:  # a column change applied before the restart: the target has that shape
            changes, columns = (event.ddl or DdlHeader(renames_in(ev.query or "", ev.table), {}))[:2]
            current = self._tables.get(ev.table)
            if changes and current is not None and event.commit_ts >= self._seen_at.get(ev.table, 0):
                after = self._changed(current, changes, columns)
                if after is not None:
                    self._tables[ev.table] = after
                    self._seen_at[ev.table] = event.commit_ts
            return
        if ev.kind is not MessageKind.ROW or ev.op not in (OpType.INSERT, OpType.UPDATE) or not ev.values \
                or ev.extra.get("onlyHandleKey") or event.commit_ts < self._seen_at.get(ev.table, 0):
            return
        current = self._tables.get(ev.table)
        if current is None or set(ev.values) != set(current.column_names):
            self._version += 1
            base = self.schemas(ev.table) if self.schemas is not None else None
            self._tables[ev.table] = infer_schema(ev.table, ev.values, tuple(ev.key or ()), base, self._version)
        self._seen_at[ev.table] = event.commit_ts

    def apply(self, events: list[Event], watermark: int, watermark_time: float) -> None:
        self._rows = []
        copying = False
        for e in events:
            ev = e.ev
            # a copy's rows (a copy writer's header, or Debezium's op "r") may hit rows the target holds (a chunk
            # copied again, a resync): written on their own, as upserts, never netted with the stream's changes
            # around them (an INSERT netted with a later DELETE of the same key would leave the row it replaced)
            if (e.seq is not None and e.span < 0 or ev.snapshot) is not copying:
                self._flush()
                copying = not copying
            if ev.kind is MessageKind.DDL and ev.op is not OpType.TRUNCATE:
                self._flush()
                self._ddl(e)
                continue
            change = self._change(e)
            if change is not None:
                self._rows.append(change)
        self._flush()

    def _flush(self) -> None:
        """The rows gathered so far in one downstream transaction; the SQL sink records the last row's commit Ts in
        it (its exactly-once position), and every event of the stream up to that Ts is in this or an earlier cut,
        so a restart resumes exactly after it."""
        rows, self._rows = self._rows, []
        if rows:
            self.sink.write(rows)

    def _schema(self, table: TableName, ev: DecodedEvent) -> TableSchema:
        current = self._tables.get(table)
        values = ev.values
        if values is None or ev.op not in (OpType.INSERT, OpType.UPDATE):
            if current is None:
                base = self.schemas(table) if self.schemas is not None else None
                if base is None:
                    raise SinkError(f"table {table}: a {ev.op.name if ev.op else 'row'} event before any row that "
                                    "shows its columns; give the consumer the table's schema (--upstream)")
                current = self._tables[table] = base
            return current
        if current is not None and tuple(values) == current.column_names:
            return current
        if current is not None and set(values) == set(current.column_names):
            return current
        self._version += 1
        base = self.schemas(table) if self.schemas is not None else None
        new = infer_schema(table, values, tuple(ev.key or ()), base, self._version)
        if current is not None:
            self._alter(current, new, ev)
        self._tables[table] = new
        return new

    def _alter(self, before: TableSchema, after: TableSchema, ev: DecodedEvent) -> None:
        """The column set changed (after a DDL the consumer could not apply exactly): ADD/DROP COLUMN downstream."""
        old, new = set(before.column_names), set(after.column_names)
        if before.name not in self._ddl_pending:
            log.warning("table %s: the columns changed without a DDL event (%s -> %s)", before.name,
                        ", ".join(before.column_names), ", ".join(after.column_names))
        elif old - new and new - old:
            log.warning("table %s: columns %s replaced by %s after a DDL that did not say how: dropped and added (a "
                        "rename among them loses its values; the Kafka sink's tidewater-ddl header says it exactly)",
                        before.name, ", ".join(sorted(old - new)), ", ".join(sorted(new - old)))
        self._ddl_pending.discard(before.name)
        self._flush()  # the rows before it, in their shapes
        changes = tuple([DdlChange(DdlKind.DROP_COLUMN, c) for c in before.column_names if c not in new]
                        + [DdlChange(DdlKind.ADD_COLUMN, c) for c in after.column_names if c not in old])
        if changes:
            ts = int(ev.commit_ts or 0)
            self.sink.apply_ddl(DdlEvent(ts, ev.commit_time or 0.0, before.name, changes, before, after,
                                         "(column set changed)", self._next_ddl_seq(ts)))

    def _next_ddl_seq(self, ts: int) -> int:
        seq = self._ddl_seq.get(ts, 0)
        self._ddl_seq = {ts: seq + 1}
        return seq

    def _ddl(self, e: Event) -> None:
        ev = e.ev
        table = ev.table
        if table is None:
            return
        if is_drop_table(ev):
            before = self._tables.pop(table, None) or (self.schemas(table) if self.schemas is not None else None)
            self._ddl_pending.discard(table)
            if before is not None:
                self.sink.apply_ddl(DdlEvent(e.commit_ts, ev.commit_time or 0.0, table,
                                             (DdlChange(DdlKind.DROP_TABLE),), before, None, ev.query or "",
                                             self._next_ddl_seq(e.commit_ts)))
            return
        created = self._created(e)
        if created is not None:
            self._create(e, created)
            return
        changes, columns, fills = (e.ddl or DdlHeader(renames_in(ev.query or "", table), {}))[:3]
        current = self._tables.get(table)
        if changes and current is not None:
            after = self._changed(current, changes, columns)
            if after is not None:
                per_row = [f.column for f in fills if f.per_row]
                if per_row and self.row_source is None:
                    raise SinkError(f"table {table}: the rows that existed before the DDL at commit Ts {e.commit_ts} "
                                    f"each got their own value of column(s) {', '.join(per_row)} upstream (a volatile "
                                    "default); give the consumer the upstream (--upstream) to read them back")
                self.sink.apply_ddl(DdlEvent(e.commit_ts, ev.commit_time or 0.0, table, changes, current, after,
                                             ev.query or "", self._next_ddl_seq(e.commit_ts), fills=fills))
                self._tables[table] = after
                self._ddl_pending.discard(table)
                return
        self._ddl_pending.add(table)

    def _created(self, e: Event) -> TableSchema | None:
        """The schema of the table a CREATE TABLE event creates (module docstring), None when it is not one or the
        consumer does not know the schema (then the first row creates the table)."""
        ev = e.ev
        assert ev.table is not None
        schema = e.ddl.table if e.ddl is not None else None
        if schema is None and e.seq is not None and self.schemas is not None and is_create_table(ev):
            schema = self.schemas(ev.table)  # a Tidewater sink of an older version: no schema in the header
        if schema is None:
            return None
        self._version += 1
        return dataclasses.replace(schema, name=ev.table, version=self._version)

    def _create(self, e: Event, schema: TableSchema) -> None:
        """Create the target table of a CREATE TABLE event; a replay where it is there in that shape, a stop
        (``SinkError``) where it is there in another one."""
        ev, table = e.ev, schema.name
        shape = self.sink.table_shape(table) if isinstance(self.sink, TableShapes) else None
        if shape is None:
            self.sink.apply_ddl(DdlEvent(e.commit_ts, ev.commit_time or 0.0, table, (DdlChange(DdlKind.CREATE_TABLE),),
                                         None, schema, ev.query or "", self._next_ddl_seq(e.commit_ts)))
        elif shape.fits(schema):
            log.info("table %s: created at commit Ts %d, and target table %s is already there with its columns and "
                     "key (a replay): used as it is", table, e.commit_ts, shape.name)
        else:
            raise SinkError(f"table {table}: CREATE TABLE at commit Ts {e.commit_ts} makes it {shape_of(schema)}, but "
                            f"the target already has table {shape} (another incarnation of it, or a table made "
                            "there): not written in the wrong shape; drop or rename the target table, or move it "
                            "aside, and restart the consumer")
        self._tables[table] = schema
        self._seen_at[table] = e.commit_ts
        self._ddl_pending.discard(table)

    def _changed(self, current: TableSchema, changes: Sequence[DdlChange], columns: Mapping[str, ColumnSchema]
                 ) -> TableSchema | None:
        """``current`` after the column-set ``changes`` (an added column as ``columns`` or the schema lookup gives it,
        with its default); None when one cannot be applied exactly (the next row's column set decides then)."""
        cols = list(current.columns)
        key = list(current.key)
        base = self.schemas(current.name) if self.schemas is not None else None
        known = {c.name: c for c in base.columns} if base is not None else {}
        for ch in changes:
            names = [c.name for c in cols]
            if ch.kind is DdlKind.RENAME_COLUMN and ch.column in names and ch.new_name:
                i = names.index(ch.column)
                cols[i] = dataclasses.replace(cols[i], name=ch.new_name)
                key = [ch.new_name if k == ch.column else k for k in key]
            elif ch.kind is DdlKind.DROP_COLUMN and ch.column in names and ch.column not in key:
                del cols[names.index(ch.column)]
            elif ch.kind is DdlKind.ADD_COLUMN and ch.column and ch.column not in names:
                col = columns.get(ch.column) or known.get(ch.column)
                if col is None:
                    return None
                cols.append(dataclasses.replace(col, is_key=False))
            else:
                return None
        self._version += 1
        return dataclasses.replace(current, columns=tuple(cols), key=tuple(key), version=self._version)

    def _change(self, e: Event) -> RowChange | None:
        ev = e.ev
        table = ev.table
        assert table is not None
        if ev.op is OpType.TRUNCATE:
            schema = self._tables.get(table) or (self.schemas(table) if self.schemas is not None else None)
            if schema is None:
                return None  # nothing of it downstream yet
            return RowChange(OpType.TRUNCATE, schema, e.commit_ts, ev.commit_time or 0.0)
        if ev.extra.get("onlyHandleKey"):
            ev = self._fetched(ev)
            if ev is None:
                return None
        schema = self._schema(table, ev)
        op = ev.op
        if op is OpType.INSERT:
            return RowChange(OpType.INSERT, schema, e.commit_ts, ev.commit_time or 0.0, dict(ev.values or {}))
        if op is OpType.UPDATE:
            return RowChange(OpType.UPDATE, schema, e.commit_ts, ev.commit_time or 0.0, dict(ev.values or {}),
                             dict(ev.old) if ev.old else None)
        if op is OpType.DELETE:
            old = ev.old or ev.key
            if not old:
                raise SinkError(f"table {table}: a delete at commit Ts {e.commit_ts} without its key")
            return RowChange(OpType.DELETE, schema, e.commit_ts, ev.commit_time or 0.0, None, dict(old))
        raise SinkError(f"table {table}: unknown operation {op!r}")

    def _fetched(self, ev: DecodedEvent) -> DecodedEvent | None:
        """A handle-key-only row: a delete needs only its key; an insert or update its current upstream values."""
        if ev.op is OpType.DELETE:
            return ev
        if self.fetch_row is None:
            raise SinkError(f"table {ev.table}: the row with key {ev.key} at commit Ts {ev.commit_ts} was sent in "
                            "key-only form (too large for the topic); give the consumer the upstream (--upstream) to "
                            "read it, or have the sink use large-message-handle-option=claim-check")
        assert ev.table is not None and ev.key is not None
        values = self.fetch_row(ev.table, ev.key)
        if values is None:
            log.info("table %s: key-only row %s no longer exists upstream; a later event removes it", ev.table,
                     ev.key)
            return None
        return dataclasses.replace(ev, values=values)

    def close(self) -> None:
        self.sink.close()


def shape_of(schema: TableSchema) -> str:
    """``schema`` for humans, as an error message names it: ``(id bigint, v text; key (id))``."""
    cols = ", ".join(f"{c.name} {c.type_name or c.base_type}" for c in schema.columns)
    return f"({cols}; key ({', '.join(schema.key)}))" if schema.has_key else f"({cols}; no key)"


_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_RENAME = re.compile(rf"^\s*ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?(?P<table>{_IDENT}(?:\s*\.\s*{_IDENT})?)"
                     rf"\s*\*?\s+RENAME\s+(?:COLUMN\s+)?(?P<old>{_IDENT})\s+TO\s+(?P<new>{_IDENT})\s*;?\s*$",
                     re.IGNORECASE | re.DOTALL)


def _ident(text: str) -> str:
    text = text.strip()
    return text[1:-1].replace('""', '"') if text.startswith('"') else text.lower()


def renames_in(query: str, table: TableName) -> tuple[DdlChange, ...]:
    """The RENAME COLUMN of ``table`` that ``query`` is, when it is exactly one such PostgreSQL statement (a DDL
    message of another producer, without the ``tidewater-ddl`` header); () otherwise."""
    m = _RENAME.match(query)
    if m is None or m.group("old").upper() == "CONSTRAINT":
        return ()
    parts = [_ident(p) for p in re.findall(_IDENT, m.group("table"))]
    if parts[-1] != table.table or (len(parts) == 2 and parts[0] != table.schema):
        return ()
    return (DdlChange(DdlKind.RENAME_COLUMN, _ident(m.group("old")), _ident(m.group("new"))),)
