"""spark_jobs.lake without a JVM: the source rows of a file slice (key changes as delete + insert, unsent values
listed), the Spark types, and values a typed column cannot hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from cdc.errors import InvalidArgument
from cdc.events import UNCHANGED
from sinks.storage.reader import LakeOffset, StorageReader
from spark_jobs.lake import lake_change, slice_rows, spark_type, table_struct
from tests.unit.sinks.codec.codec_cases import ALL, ROW1, ROW2
from tests.unit.sinks.storage.storage_cases import KV, dele, ins, sink, trunc, upd, uri

pytestmark = pytest.mark.unit


def test_spark_types() -> None:
    t = {f.name: f.dataType for f in table_struct(ALL).fields}
    assert t["c_int8"] == LongType() and t["c_num"] == DecimalType(12, 3) and t["c_num_free"] == StringType()
    assert t["c_tstz"] == TimestampType() and t["c_ts"] == TimestampNTZType() and t["c_time"] == StringType()
    assert t["c_int_arr"] == ArrayType(IntegerType()) and spark_type(ALL.column("c_uuid")) == StringType()


@pytest.mark.parametrize("protocol", ["csv", "canal-json", "parquet"])
def test_slice_rows(tmp_path: Path, protocol: str) -> None:
    s = sink(tmp_path, protocol)
    s.write([ins(KV, 100, id=1, body="a", n=1), upd(KV, 110, {"id": 1}, id=2, body=UNCHANGED, n=2),
             dele(KV, 120, id=2), trunc(KV, 130), ins(KV, 130, id=3, body="c", n=3)])
    s.flush()
    s.publish_checkpoint(130)
    s.close()
    reader = StorageReader(uri(tmp_path, protocol))
    rows = sorted((r for sl in reader.plan(LakeOffset(), reader.latest_offset()) for r in slice_rows(reader, sl, KV)),
                  key=lambda r: r[1:6])
    got = [(r[0], r[1], r[6:9], r[9]) for r in rows]
    assert got == [("I", 100, (1, "a", 1), None), ("D", 110, (1, None, None), ["body", "n"]),
                   ("I", 110, (2, None, 2), ["body"]), ("D", 120, (2, None, None), ["body", "n"]),
                   ("T", 130, (None, None, None), None), ("I", 130, (3, "c", 3), None)]
    fields = ["_op", "_commit_ts", "_version", "_date", "_file", "_line", "id", "body", "n", "_unavailable"]
    change = lake_change(dict(zip(fields, rows[2], strict=True)), KV.column_names)
    assert change.values == {"id": 2, "body": UNCHANGED, "n": 2}


def test_values_spark_cannot_hold_are_refused(tmp_path: Path) -> None:
    s = sink(tmp_path, "csv")
    s.write([ins(ALL, 100, **ROW1), ins(ALL, 110, **{**ROW2, "c_text_arr": ["x"]})])
    s.flush()
    s.publish_checkpoint(110)
    s.close()
    reader = StorageReader(uri(tmp_path, "csv"))
    (sl,) = reader.plan(LakeOffset(), reader.latest_offset())
    with pytest.raises(InvalidArgument, match="has no Spark"):
        list(slice_rows(reader, sl, ALL))


def test_an_add_column_fill_stops_the_lake_job_naming_the_table(tmp_path: Path) -> None:
    """The lake job does not apply fills yet (docs/limits.md): it stops naming the table and the columns instead of
    leaving the rows before the ADD COLUMN NULL where the source has a value (a log line only, before)."""
    from cdc.events import ColumnFill, DdlChange, DdlEvent, DdlKind
    from tests.unit.sinks.storage.storage_cases import KV2

    s = sink(tmp_path, "csv")
    s.write([ins(KV, 100, id=1, body="a", n=1)])
    s.flush()
    s.apply_ddl(DdlEvent(110, 0.11, KV.name, (DdlChange(DdlKind.ADD_COLUMN, "note"),), KV, KV2, "ADD COLUMN note", 0,
                         fills=(ColumnFill("note", "x"),)))
    s.publish_checkpoint(110)
    s.close()
    reader = StorageReader(uri(tmp_path, "csv"))
    with pytest.raises(InvalidArgument, match=r"table app\.kv: column\(s\) \['note'\] were added"):
        [r for sl in reader.plan(LakeOffset(), reader.latest_offset()) for r in slice_rows(reader, sl, KV2)]
