"""The upstream interface without servers: open_upstream dispatches on the scheme with no I/O, and the
mounter works against any ChangeDecoder (here a toy one that is not pgoutput), as another upstream's would."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from cdc.errors import InvalidURI
from cdc.events import ColumnSchema, OpType, TableName, TableSchema
from processor.mounter import Mounter
from upstream import open_upstream
from upstream.base import ChangeDecoder, ParsedChange, Parser, encode_payload
from upstream.postgres.upstream import PostgresUpstream

pytestmark = pytest.mark.unit


def test_factory_dispatches_on_the_scheme_without_io() -> None:
    u = open_upstream("postgres://u:secret@DB.example:6000/app?sslmode=require")
    assert isinstance(u, PostgresUpstream)
    assert u.server_identity() == ("db.example", 6000, "app")
    assert open_upstream("postgresql://u@db.example/app").server_identity() == ("db.example", 5432, "app")
    u.close()  # nothing was opened
    with pytest.raises(InvalidURI, match="unsupported upstream URI scheme"):
        open_upstream("oracle://x/y")


SCHEMA = TableSchema(TableName("app", "t"), (ColumnSchema("id", 0, "int", False, is_key=True),
                                             ColumnSchema("v", 0, "text", False)), ("id",), "d", 7, 1)


class JsonDecoder(ChangeDecoder):
    """A toy upstream's stored change: JSON ``{"k": kind, "new": [...], "old": [...]}``."""

    def schema(self, version: int) -> TableSchema:
        return SCHEMA

    def parse_change(self, raw: bytes) -> ParsedChange:
        d = json.loads(raw)
        return ParsedChange(d["k"], 7, d.get("new"), d.get("old"), "K" if d.get("old") else None, 0)

    def insert_values(self, payload: bytes, offset: int) -> tuple[int, list[Any]] | None:
        return None  # no fast path: everything goes through parse_change

    def parser(self, column: ColumnSchema) -> Parser:
        return int if column.base_type == "int" else str

    def row_parser(self, parsers: Sequence[Parser]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        return lambda row: tuple(None if v is None else p(v) for p, v in zip(parsers, row, strict=True))


def test_the_mounter_decodes_through_any_change_decoder() -> None:
    mount = Mounter(JsonDecoder()).mount
    ins = mount(encode_payload(1, b'{"k": "I", "new": ["1", "a"]}'), 10, 1.0)
    assert ins.op is OpType.INSERT and ins.values == {"id": 1, "v": "a"} and ins.commit_ts == 10
    dele = mount(encode_payload(1, b'{"k": "D", "old": ["1", null]}'), 11, 2.0)
    assert dele.op is OpType.DELETE and dele.old_values == {"id": 1}
