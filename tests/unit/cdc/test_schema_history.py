"""cdc.model.SchemaHistory: the schema of a table at a commit Ts, versions pruned below the stored checkpoint."""

from __future__ import annotations

import pytest

from cdc import serde
from cdc.events import ColumnSchema, TableName, TableSchema
from cdc.model import SchemaHistory

pytestmark = pytest.mark.unit


def schema(*cols: str) -> TableSchema:
    return TableSchema(TableName("public", "t"), tuple(ColumnSchema(c, 23, "int4") for c in cols), (cols[0],),
                       relation_id=7)


A, B, C = schema("id"), schema("id", "x"), schema("id", "x", "y")


def test_as_of_is_the_last_version_at_or_below_the_ts() -> None:
    h = SchemaHistory(7).with_version(10, A, 0).with_version(30, C, 0).with_version(20, B, 0)
    assert [v.ts for v in h.versions] == [10, 20, 30]
    assert (h.as_of(9), h.as_of(10), h.as_of(25), h.as_of(10**9)) == (None, A, B, C)


def test_a_version_at_the_same_ts_replaces_the_earlier_one_and_a_drop_hides_the_table() -> None:
    h = SchemaHistory(7).with_version(10, A, 0).with_version(10, B, 0).with_version(20, None, 0)
    assert h.as_of(15) == B and h.as_of(20) is None and not h.gone


def test_versions_no_restart_can_need_are_pruned_and_a_past_drop_is_gone() -> None:
    h = SchemaHistory(7).with_version(10, A, 0).with_version(20, B, 0).with_version(30, C, 25)
    assert [v.ts for v in h.versions] == [20, 30]  # a restart starts at a stored checkpoint >= 25
    assert h.as_of(25) == B
    assert SchemaHistory(7).with_version(10, A, 0).with_version(20, None, 20).gone


def test_round_trips_through_json() -> None:
    h = SchemaHistory(7).with_version(10, A, 0).with_version(20, None, 0)
    assert serde.from_json(SchemaHistory, serde.to_json(h)) == h
    # a field the schema derives (column_names) is neither stored nor read: values stay as earlier versions wrote them
    assert "column_names" not in serde.to_dict(B)
    back = serde.from_json(TableSchema, serde.to_json(B))
    assert back == B and back.column_names == ("id", "x")


def test_the_span_that_replicated_the_table_is_the_one_of_the_version_valid_then() -> None:
    h = SchemaHistory(7).with_version(10, A, 0, span=1).with_version(20, B, 0, span=0).with_version(30, None, 0, 0)
    assert (h.span_as_of(9), h.span_as_of(10), h.span_as_of(25), h.span_as_of(30)) == (-1, 1, 0, 0)
    assert SchemaHistory(7).with_version(10, A, 0).span_as_of(10) == -1  # stored before spans were recorded
    assert serde.from_json(SchemaHistory, serde.to_json(h)) == h
    old = b'{"relid": 7, "versions": [{"ts": 10, "schema": null}]}'  # a value written by an earlier version
    assert serde.from_json(SchemaHistory, old).span_as_of(10) == -1
