"""sinks.sql.target.stage_codec: a staged piece reads back as the changes that were staged (values, positional rows
and their text, old values, extra, UNCHANGED), and a piece naming anything but the change vocabulary is refused
without being run."""

from __future__ import annotations

import math
import os
import pickle
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest

from cdc.errors import SinkError
from cdc.events import UNCHANGED, ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.target import stage_codec

pytestmark = pytest.mark.unit

A = TableSchema(TableName("public", "a"), (ColumnSchema("id", 23, "int4", is_key=True),
                                           ColumnSchema("v", 1700, "numeric")), ("id",))
B = TableSchema(TableName("public", "b"), (ColumnSchema("k", 25, "text", is_key=True),), ("k",), version=3)


def test_changes_read_back_equal() -> None:
    values = [datetime.now(UTC), datetime(2020, 1, 1, 5, tzinfo=timezone(timedelta(hours=-3))), date.today(),
              time(1, 2, 3), uuid.uuid4(), b"\x00\xff", None, 1.5, float("inf"), True, "ünï", [1, [2, None]],
              "infinity", Decimal("-1.50")]
    changes = [
        RowChange(OpType.UPDATE, A, 5, 1.0, values={"id": 1, "v": UNCHANGED}, old_values={"id": 0, "v": Decimal(1)}),
        RowChange(OpType.INSERT, A, 5, 1.0, row=(2, Decimal("1.5")), row_text=("2", "1.5")),
        RowChange(OpType.DELETE, B, 5, 1.0, old_values={"k": "x"}),
        RowChange(OpType.TRUNCATE, B, 5, 1.0, extra={"truncate_options": 1}),
        RowChange(OpType.INSERT, A, 5, 1.0, values={"id": 3, "v": values}),
    ]
    out = stage_codec.decode(stage_codec.encode(changes))
    assert out == changes
    assert out[0].values is not None and out[0].values["v"] is UNCHANGED
    assert out[1].row == (2, Decimal("1.5")) and tuple(out[1].row_text or ()) == ("2", "1.5")
    assert out[0].schema is out[1].schema and out[2].schema.version == 3
    nan = stage_codec.decode(stage_codec.encode([RowChange(OpType.INSERT, A, 6, 1.0, values={"id": 1, "v": math.nan})]))
    assert math.isnan(nan[0].values["v"])  # type: ignore[index]


def test_a_foreign_piece_is_refused_unrun(tmp_path: object) -> None:
    for evil in (pickle.dumps((1, [A], [(1, 0, 5, 1.0, None, None, {"x": os.system}, None, None)])),
                 pickle.dumps([os.system])):
        with pytest.raises(SinkError, match="not a row change value"):
            stage_codec.decode(evil)
    with pytest.raises(SinkError, match="cannot be read back"):
        stage_codec.decode(b"not a pickle")
    with pytest.raises(SinkError, match="cannot be read back"):
        stage_codec.decode(pickle.dumps((2, [], [])))  # another format


def test_a_value_that_is_not_plain_is_refused_before_staging() -> None:
    class Odd:
        pass

    with pytest.raises(SinkError, match="cannot be staged"):
        stage_codec.encode([RowChange(OpType.INSERT, A, 5, 1.0, values={"id": 1, "v": Odd()})])
