"""changefeed create tells a Kafka or file sink's user which tables' messages carry partial old rows."""

from __future__ import annotations

import pytest

from capture.changefeeds import old_image_notice
from cdc.events import ColumnSchema, TableName, TableSchema

pytestmark = pytest.mark.unit


def _schema(name: str, identity: str) -> TableSchema:
    return TableSchema(TableName("public", name), (ColumnSchema("id", 23, "int4", is_key=True),), ("id",),
                       replica_identity=identity)


def test_tables_without_full_identity_are_named_for_message_sinks_only() -> None:
    schemas = [_schema("full", "f"), _schema("dflt", "d"), _schema("idx", "i")]
    text = old_image_notice("kafka", schemas)
    assert text is not None and text.startswith("CDC:NoticePartialOldImage: public.dflt, public.idx do not")
    assert "public.full" not in text and "REPLICA IDENTITY FULL" in text
    assert old_image_notice("file", schemas) == text
    for scheme in ("mysql", "postgresql", "sqlite", "blackhole"):  # rebuilt by key: nothing to say
        assert old_image_notice(scheme, schemas) is None
    assert old_image_notice("kafka", [_schema("full", "f")]) is None


def test_a_long_list_is_cut() -> None:
    text = old_image_notice("kafka", [_schema(f"t{i:02d}", "d") for i in range(25)])
    assert text is not None and "public.t09 and 15 more" in text and "public.t10" not in text
