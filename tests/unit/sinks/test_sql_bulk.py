"""sinks.sql.ops.bulk without servers: which schemas may pass through as text, and what a refusal costs (nothing read)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc.config import SinkConfig
from cdc.events import ColumnSchema, TableName, TableSchema
from sinks.factory import open_sink
from sinks.sql.ops.bulk import PASSTHROUGH_TYPES, type_refusal

pytestmark = pytest.mark.unit


def schema(*cols: tuple[str, str, bool]) -> TableSchema:
    return TableSchema(TableName("public", "t"), tuple(
        ColumnSchema(name, 0, base, is_array=arr, type_name=base, is_key=name == "id") for name, base, arr in cols),
        ("id",))


def test_only_proven_base_types_pass_through_arrays_included() -> None:
    assert type_refusal(schema(("id", "int8", False), ("v", "text", False), ("a", "numeric", True))) is None
    assert {"numeric", "float4", "float8", "timestamptz", "bytea", "jsonb", "text"} <= PASSTHROUGH_TYPES
    why = type_refusal(schema(("id", "int4", False), ("cash", "money", False), ("net", "inet", True)))
    assert why is not None and "cash (money)" in why and "net (inet)" in why
    assert type_refusal(TableSchema(TableName("public", "t"), (), ())) == "no columns"


@pytest.mark.parametrize(("uri", "cols"), [
    ("sqlite:///{tmp}/t.db", [("id", "int8", False)]),
    # MySQL takes text (C literal rows: sinks.sql.ops.literal_copy) only for columns it renders; never for bytea
    ("mysql://root@127.0.0.1:1/db", [("id", "int8", False), ("b", "bytea", False)]),
])
def test_other_targets_never_take_text_and_never_read_it(uri: str, cols: list[tuple[str, str, bool]],
                                                         tmp_path: Any) -> None:
    sink = open_sink(uri.format(tmp=tmp_path), SinkConfig())
    opened: list[int] = []
    try:
        assert sink.write_copy_text(schema(*cols), lambda: opened.append(1) or None) is None
    finally:
        sink.close()
    assert opened == []
