"""Per-schema-version pieces of an encoder (field names, converters, JSON schema text), computed once.

Keyed by ``(table, relation_id, version)``; an entry is reused only for the very same ``TableSchema`` object
(identity, the common case: the mounter hands the same object for every row of a version) or an equal one, so two
schemas that share a version number (tests, a restarted upstream) never share pieces. Bounded: when it holds more
than ``limit`` versions it starts over. Not thread-safe (one per encoder, like the encoder).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from cdc.events import TableName, TableSchema

P = TypeVar("P")


class SchemaCache(Generic[P]):
    def __init__(self, build: Callable[[TableSchema], P], limit: int = 1024) -> None:
        self._build = build
        self._limit = limit
        self._entries: dict[tuple[TableName, int, int], tuple[TableSchema, P]] = {}

    def get(self, schema: TableSchema) -> P:
        key = (schema.name, schema.relation_id, schema.version)
        entry = self._entries.get(key)
        if entry is not None and (entry[0] is schema or entry[0] == schema):
            return entry[1]
        piece = self._build(schema)
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = (schema, piece)
        return piece
