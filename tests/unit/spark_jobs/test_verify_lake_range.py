"""The verifier's side of a storage sink's lake (spark_jobs.verify_lake): a chunk's key range read from a Parquet
version with pyarrow, lexicographic on a composite key; an absent version is empty; the ``lake`` dialect compares
``float4`` as the float32 Parquet holds."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cdc.events import ColumnSchema, TableName, TableSchema
from spark_jobs.verify_lake import lake_count, lake_rows
from spark_jobs.verify_values import column_forms

SCHEMA = TableSchema(TableName("public", "t"), (ColumnSchema("a", 23, "int4", is_key=True),
                                                 ColumnSchema("b", 25, "text", is_key=True),
                                                 ColumnSchema("v", 25, "text")), key=("a", "b"))


def _lake(tmp_path: Path) -> str:
    rows = [{"v": f"{a}{b}", "b": b, "a": a} for a in range(1, 5) for b in ("x", "y", "z")]  # (column order differs)
    path = tmp_path / "v1"
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:6]), path / "part-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[6:]), path / "part-1.parquet")
    return str(path)


def test_a_composite_key_range_is_lexicographic_and_columns_come_in_schema_order(tmp_path: Path) -> None:
    path = _lake(tmp_path)
    got = sorted(lake_rows(path, SCHEMA, ("a", "b"), [2, "y"], [4, "y"]))
    assert got == [(2, "y", "2y"), (2, "z", "2z"), (3, "x", "3x"), (3, "y", "3y"), (3, "z", "3z"), (4, "x", "4x")]
    assert len(list(lake_rows(path, SCHEMA, ("a", "b"), None, [1, "z"]))) == 2
    assert len(list(lake_rows(path, SCHEMA, ("a", "b"), [4, "z"], None))) == 1
    assert len(list(lake_rows(path, SCHEMA))) == lake_count(path) == 12


def test_no_version_yet_is_an_empty_table() -> None:
    assert list(lake_rows("", SCHEMA)) == [] and lake_count("") == 0


def test_float4_in_the_lake_is_the_float32_the_upstream_value_rounds_to() -> None:
    up, down = column_forms(ColumnSchema("f", 700, "float4"), "lake")
    stored = float(pa.array([0.1], pa.float32()).to_pylist()[0])  # 0.10000000149011612
    assert up(0.1) == down(stored)
    assert up(0.1) != down(0.2)
    mysql_up, mysql_down = column_forms(ColumnSchema("f", 700, "float4"), "mysql")
    assert mysql_up(0.1) != mysql_down(stored)  # (why the lake has its own form)
