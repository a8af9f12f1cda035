"""Where a row change goes: the topic and partition of each change (TiCDC's event router and dispatchers).

Rules come from the changefeed TOML (``cdc.config.DispatcherRule``, ``[[sink.dispatchers]]``); the first rule whose
``matcher`` (filter rules, ``cdc.filter``) selects the table decides; a table no rule selects goes to the sink URI's
topic, dispatched by table. Per rule:

- **topic**: empty (the URI's topic), a fixed name, or an expression ``[prefix]{schema}[middle{table}][suffix]``.
  As TiCDC does, characters Kafka does not allow in topic names (``a-z A-Z 0-9 . _ -``) are replaced by ``_`` after
  substitution (``public."Ledger Entries"`` with ``cdc_{schema}_{table}`` -> ``cdc_public_Ledger_Entries``), and a
  name longer than 249 characters is cut to 240 plus 8 hex digits of its CRC-32, so distinct tables stay apart.
- **partition**: ``default`` and ``table`` hash ``schema.table`` (a table's changes share one partition: total
  order per table); ``index-value`` hashes the row's key (column names and values; the old key for deletes), so
  one key's changes share one partition (per-key order) while a table spreads over all partitions; tables without
  a key fall back to ``table``; ``ts`` is the commit Ts modulo the partition count (no per-key order: consumers
  order by commit Ts); ``columns`` hashes the named columns' values (an error names the table and column when
  the change does not carry one of them: a delete without REPLICA IDENTITY FULL, an unsent TOAST value).

An UPDATE that changes the key is split into a delete of the old key and an insert of the new one before it is
dispatched (``sinks.codec.split_key_change``, the sink's job), so each half lands on its own key's partition.

Hashes are CRC-32 (IEEE) of a canonical byte form of the values: stable across processes, restarts and Python
versions (never ``hash()``), so a replay sends every change to the partition it went to before. The partition
count is the topic's (``partition-num``); changing it moves keys, as in TiCDC.

Thread-safety: one caller thread (the sink's). Routes are cached per table schema version.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
import zlib
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from cdc.config import DispatcherRule
from cdc.errors import InvalidConfig, SinkError
from cdc.events import UNCHANGED, OpType, RowChange, TableName, TableSchema
from cdc.filter import TableFilter

_FORBIDDEN = re.compile(r"[^A-Za-z0-9._-]")
MAX_TOPIC = 249

Partitioner = Callable[[RowChange, int], int]


def topic_for(expression: str, table: TableName, default: str) -> str:
    """The topic of ``table`` under ``expression`` (empty: ``default``); see the module docstring."""
    if not expression:
        return default
    if "{" not in expression:
        return expression
    name = _FORBIDDEN.sub("_", expression.replace("{schema}", table.schema).replace("{table}", table.table))
    if len(name) > MAX_TOPIC:
        name = f"{name[:240]}_{zlib.crc32(name.encode()):08x}"
    if name in (".", ".."):
        name = name.replace(".", "_")
    return name


def canonical(value: Any) -> bytes:
    """A value's bytes for hashing: type-tagged, independent of the process (a row's key hashes the same after a
    restart). ``UNCHANGED`` cannot be hashed (the caller refuses it first)."""
    if value is None:
        return b"n"
    if isinstance(value, bool):
        return b"b1" if value else b"b0"
    if isinstance(value, int):
        return b"i" + str(value).encode()
    if isinstance(value, str):
        return b"s" + value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return b"x" + bytes(value)
    if isinstance(value, Decimal):
        return b"d" + str(value).encode()
    if isinstance(value, float):
        return b"f" + repr(value).encode()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return b"t" + value.isoformat().encode()
    if isinstance(value, uuid.UUID):
        return b"u" + value.bytes
    if isinstance(value, (list, tuple)):
        return b"[" + b",".join(canonical(v) for v in value) + b"]"
    return b"r" + repr(value).encode()


def by_table(table: TableName) -> Partitioner:
    h = zlib.crc32(f"{table.schema}.{table.table}".encode())
    return lambda _change, n: h % n


def by_ts(change: RowChange, n: int) -> int:
    return change.commit_ts % n


def by_columns(schema: TableSchema, columns: Sequence[str], what: str) -> Partitioner:
    """Hash of ``columns``' values: of the new row (insert, update) or the old row (delete)."""
    names = tuple(columns)
    encoded = tuple((c, c.encode() + b"=") for c in names)

    def partition(change: RowChange, n: int) -> int:
        src = change.old_values if change.op is OpType.DELETE or change.values is None else change.values
        h = 0
        for name, prefix in encoded:
            if src is None or name not in src or src[name] is UNCHANGED:
                raise SinkError(
                    f"table {schema.name}: a {change.op.name} at commit Ts {change.commit_ts} does not carry column "
                    f"{name!r}, which the {what} dispatcher hashes (the upstream did not send it: a delete or key "
                    "change without REPLICA IDENTITY FULL, or an unchanged TOAST value); dispatch by the key "
                    "(partition = 'index-value') or set REPLICA IDENTITY FULL on the table")
            h = zlib.crc32(canonical(src[name]), zlib.crc32(prefix, h))
        return h % n

    return partition


def by_key(schema: TableSchema) -> Partitioner:
    """Hash of the row's key (old key for deletes and unsplit key changes); a keyless table goes by table."""
    if not schema.has_key:
        return by_table(schema.name)
    key = schema.key
    encoded = tuple(k.encode() + b"=" for k in key)
    pos = {c.name: i for i, c in enumerate(schema.columns)}
    idx = tuple(pos[k] for k in key)

    def partition(change: RowChange, n: int) -> int:
        row = change.row
        if row is not None and change.old_values is None:
            values: Sequence[Any] = tuple(row[i] for i in idx)
        else:
            src = change.old_values if change.old_values is not None else change.values
            if src is None:
                raise SinkError(f"table {schema.name}: a {change.op.name} at commit Ts {change.commit_ts} carries no "
                                "key to dispatch by")
            values = tuple(src.get(k) for k in key)
        h = 0
        for prefix, value in zip(encoded, values, strict=True):
            h = zlib.crc32(canonical(value), zlib.crc32(prefix, h))
        return h % n

    return partition


class Route:
    """The topic and partitioner of one table (one schema version)."""

    __slots__ = ("topic", "partition", "rule")

    def __init__(self, topic: str, partition: Partitioner, rule: str) -> None:
        self.topic = topic
        self.partition = partition
        self.rule = rule


class Dispatcher:
    """The changefeed's dispatcher rules for one sink (see the module docstring)."""

    def __init__(self, rules: Sequence[DispatcherRule], default_topic: str) -> None:
        self.default_topic = default_topic
        self._rules: list[tuple[TableFilter, DispatcherRule, str]] = []
        for i, rule in enumerate(rules):
            where = f"sink.dispatchers[{i}]"
            rule.validate(where)
            try:
                self._rules.append((TableFilter(rule.matcher), rule, where))
            except InvalidConfig as exc:
                raise InvalidConfig(f"{where}: {exc.message}") from exc
        self._routes: dict[tuple[TableName, int, int], Route] = {}
        self._topics: dict[TableName, str] = {}

    @property
    def has_table_topics(self) -> bool:
        """Some rule sends tables to topics other than the URI's (``{schema}``/``{table}`` or a fixed name)."""
        return any(rule.topic and rule.topic != self.default_topic for _, rule, _ in self._rules)

    def rule_for(self, table: TableName) -> DispatcherRule | None:
        for matcher, rule, _ in self._rules:
            if matcher.match(table):
                return rule
        return None

    def topic(self, table: TableName) -> str:
        """The topic of ``table`` (its DDL and its rows go there)."""
        topic = self._topics.get(table)
        if topic is None:
            rule = self.rule_for(table)
            topic = self._topics[table] = topic_for(rule.topic if rule else "", table, self.default_topic)
        return topic

    def route(self, schema: TableSchema) -> Route:
        """The route of ``schema``'s table (cached per schema version: ``columns`` checks them)."""
        cache_key = (schema.name, schema.relation_id, schema.version)
        route = self._routes.get(cache_key)
        if route is None:
            route = self._routes[cache_key] = self._build(schema)
        return route

    def _build(self, schema: TableSchema) -> Route:
        rule = self.rule_for(schema.name)
        topic = self.topic(schema.name)
        kind = rule.partition if rule is not None else "default"
        if kind in ("default", "table"):
            return Route(topic, by_table(schema.name), kind)
        if kind == "ts":
            return Route(topic, by_ts, kind)
        if kind == "index-value":
            return Route(topic, by_key(schema), kind)
        assert rule is not None
        missing = [c for c in rule.columns if c not in schema.column_names]
        if missing:
            raise SinkError(f"table {schema.name} has no column(s) {', '.join(map(repr, missing))} that its "
                            f"dispatcher rule (matcher {list(rule.matcher)}, partition = 'columns') hashes: its "
                            f"columns are {', '.join(schema.column_names)}; fix the rule's columns or its matcher")
        return Route(topic, by_columns(schema, rule.columns, "columns"), kind)
