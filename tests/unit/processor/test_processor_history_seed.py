"""processor.processor.history_at: what a starting span is seeded with from the schema history, and which tables the
history gives to it (their DDL concerns it even once they left its publication: docs/ddl.md, "Schema history")."""

from __future__ import annotations

import pytest

from cdc.events import ColumnSchema, TableName, TableSchema
from cdc.model import SchemaHistory
from cdc.spans import span_of
from processor.processor import history_at

pytestmark = pytest.mark.unit


def schema(table: str, relid: int) -> TableSchema:
    return TableSchema(TableName("public", table), (ColumnSchema("id", 23, "int4"),), ("id",), relation_id=relid)


def test_the_span_a_table_belonged_to_at_the_start_carries_it() -> None:
    mine = SchemaHistory(1).with_version(10, schema("mine", 1), 0, span=1)
    moved_here = SchemaHistory(2).with_version(10, schema("moved", 2), 0, span=0).with_version(30, schema("moved", 2),
                                                                                             0, span=1)
    other = SchemaHistory(3).with_version(10, schema("other", 3), 0, span=0)
    dropped = SchemaHistory(4).with_version(10, schema("dropped", 4), 0, span=1).with_version(20, None, 0, span=1)
    schemas, carried = history_at([mine, moved_here, other, dropped], 25, 1, 2)
    assert [s.relation_id for s in schemas] == [1, 2, 3]  # every table's schema as of the start, none of a drop
    assert carried == [1]  # moved here only at 30, after the start
    assert history_at([mine, moved_here, other, dropped], 30, 1, 2)[1] == [1, 2]


def test_a_history_stored_before_versions_named_their_span_gives_the_table_to_the_span_it_hashes_to() -> None:
    a, b = schema("a", 1), schema("d", 2)
    assert span_of(a.name, 2) != span_of(b.name, 2)
    old = [SchemaHistory(1).with_version(10, a, 0), SchemaHistory(2).with_version(10, b, 0)]
    assert history_at(old, 10, span_of(a.name, 2), 2)[1] == [1]
    assert history_at(old, 10, span_of(b.name, 2), 2)[1] == [2]
