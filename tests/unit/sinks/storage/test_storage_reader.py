"""Reading the storage sink back (sinks.storage.reader): only changes up to the published checkpoint, incremental
offsets that add up to a full rebuild, files published late, and the Parquet type mapping read back exactly."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from cdc.events import UNCHANGED
from sinks.codec.base import EncodeError
from sinks.storage.reader import LakeOffset, StorageReader, TableState, rebuild
from tests.unit.sinks.codec.codec_cases import ALL, ROW1, ROW2
from tests.unit.sinks.storage.storage_cases import (
    KV,
    PROTOCOLS,
    Model,
    dele,
    ins,
    sink,
    sorted_rows,
    upd,
    uri,
)

pytestmark = pytest.mark.unit


def _apply(reader: StorageReader, start: LakeOffset, end: LakeOffset, state: TableState) -> None:
    state.apply(reader.changes(start, end, [KV.name]).get(KV.name, []))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_incremental_offsets_hold_back_rows_above_the_checkpoint(tmp_path: Path, protocol: str) -> None:
    changes = [ins(KV, 100, id=1, body="a", n=1), ins(KV, 110, id=2, body="b", n=2),
               upd(KV, 120, {"id": 1}, id=3, body=UNCHANGED, n=3), dele(KV, 130, id=2),
               ins(KV, 140, id=2, body="again", n=4)]
    s = sink(tmp_path, protocol)
    s.write(changes[:3])
    s.flush()
    s.publish_checkpoint(110)  # the file holds 100..120: only 100 and 110 count
    reader = StorageReader(uri(tmp_path, protocol))
    state = TableState(KV)
    o1 = reader.latest_offset()
    assert o1.checkpoint == 110 and o1.files == {"app/kv/99": (0, 1)}  # file 1 not done: it has rows above 110
    _apply(reader, LakeOffset(), o1, state)
    assert sorted_rows(KV, state.rows()) == Model(KV).apply(changes[:2]).result()
    s.write(changes[3:])
    s.flush()
    s.publish_checkpoint(140)
    s.close()
    o2 = reader.latest_offset(o1)
    assert o2.files == {"app/kv/99": (2, 2)}
    _apply(reader, o1, o2, state)
    assert sorted_rows(KV, state.rows()) == Model(KV).apply(changes).result()
    o3 = reader.latest_offset(o2)
    assert reader.changes(o2, o3) == {KV.name: []}  # nothing twice
    assert not state.problems


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_offset_cut_at_until_holds_the_changes_up_to_it_and_stays_there(tmp_path: Path, protocol: str) -> None:
    """``changefeed verify`` of a storage sink: the lake at exactly its point Y while metadata moves past Y."""
    changes = [ins(KV, 100, id=1, body="a", n=1), ins(KV, 110, id=2, body="b", n=2),
               upd(KV, 120, {"id": 1}, id=1, body="c", n=3), dele(KV, 130, id=2), ins(KV, 140, id=5, body="d", n=4)]
    s = sink(tmp_path, protocol)
    s.write(changes[:4])
    s.flush()
    s.publish_checkpoint(130)
    reader = StorageReader(uri(tmp_path, protocol))
    state = TableState(KV)
    o1 = reader.latest_offset(until=120)
    assert o1.checkpoint == 120
    _apply(reader, LakeOffset(), o1, state)
    assert sorted_rows(KV, state.rows()) == Model(KV).apply(changes[:3]).result()
    s.write(changes[4:])
    s.flush()
    s.publish_checkpoint(140)
    assert reader.latest_offset(o1, until=120) == o1  # the cut reached: no new offset, the stream ends there
    o2 = reader.latest_offset(o1)
    _apply(reader, o1, o2, state)
    s.close()
    assert sorted_rows(KV, state.rows()) == Model(KV).apply(changes).result() and not state.problems


def test_a_file_published_after_the_checkpoint_passed_its_rows_still_counts(tmp_path: Path) -> None:
    """A table copy publishes chunks at its snapshot's Ts, which the checkpoint may have passed already."""
    s = sink(tmp_path, "csv")
    s.write([ins(KV, 200, id=9, body="streamed", n=0)])
    s.flush()
    s.publish_checkpoint(300)
    reader = StorageReader(uri(tmp_path, "csv"))
    state = TableState(KV)
    o1 = reader.latest_offset()
    _apply(reader, LakeOffset(), o1, state)
    copy = sink(tmp_path, "csv", position=False)
    copy.set_bulk_load()
    copy.write([ins(KV, 150, id=1, body="copied", n=1)])
    copy.flush()
    copy.close()
    o2 = reader.latest_offset(o1)
    _apply(reader, o1, o2, state)
    assert sorted(r["id"] for r in state.rows()) == [1, 9]


def test_parquet_columns_are_typed_and_read_back_exactly(tmp_path: Path) -> None:
    s = sink(tmp_path, "parquet")
    s.write([ins(ALL, 100, **ROW1)])
    s.flush()
    s.publish_checkpoint(100)
    s.close()
    reader = StorageReader(uri(tmp_path, "parquet"))
    (df,) = reader.data_files(ALL.name)
    types = {f.name: str(f.type) for f in pq.read_schema(tmp_path / df.path)}
    assert types["ticdc-meta$commit-ts"] == "int64" and types["ticdc-meta$operation"] == "string"
    assert types["c_int2"] == "int16" and types["c_int8"] == "int64" and types["c_num"] == "decimal128(12, 3)"
    assert types["c_num_free"] == "string" and types["c_f4"] == "float" and types["c_bytea"] == "binary"
    assert types["c_tstz"] == "timestamp[us, tz=UTC]" and types["c_ts"] == "timestamp[us]"
    assert types["c_time"] == "time64[us]" and types["c_date"] == "date32[day]" and types["c_uuid"] == "string"
    assert types["c_int_arr"] == "list<element: int32>" and types["c_jsonb"] == "string"
    _, states = rebuild(uri(tmp_path, "parquet"))
    (row,) = states[ALL.name].rows()
    f32 = struct.Struct("f")
    assert f32.pack(row.pop("c_f4")) == f32.pack(ROW1["c_f4"])
    assert row == {k: v for k, v in ROW1.items() if k != "c_f4"}


def test_values_a_parquet_column_cannot_hold_fail_naming_the_column(tmp_path: Path) -> None:
    s = sink(tmp_path, "parquet")
    with pytest.raises(EncodeError, match="c_num_free|c_date|c_time|c_ts|c_text_arr") as info:
        s.write([ins(ALL, 100, **{**ROW1, "c_date": ROW2["c_date"]})])
        s.flush()
    assert "protocol=csv" in info.value.message
    s.close()


@pytest.mark.parametrize("protocol", ["csv", "canal-json"])
def test_text_protocols_keep_values_parquet_refuses(tmp_path: Path, protocol: str) -> None:
    s = sink(tmp_path, protocol)
    s.write([ins(ALL, 100, **ROW2)])
    s.flush()
    s.publish_checkpoint(100)
    s.close()
    _, states = rebuild(uri(tmp_path, protocol))
    (row,) = states[ALL.name].rows()
    assert row["c_date"] == "0044-03-15 BC" and row["c_ts"] == "infinity" and row["id"] == 2


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_add_column_schema_file_fills_the_rows_held_before_it(tmp_path: Path, protocol: str) -> None:
    from cdc.events import ColumnFill, DdlChange, DdlEvent, DdlKind
    from tests.unit.sinks.storage.storage_cases import BAG, KV2

    bag2 = BAG.__class__(BAG.name, (*BAG.columns, KV2.column("note")), ("a", "b", "note"), "f", 2, 2, False)
    s = sink(tmp_path, protocol)
    s.write([ins(KV, 100, id=1, body="a", n=1), ins(KV, 100, id=2, body="b", n=2), ins(BAG, 100, a=1, b="x"),
             ins(BAG, 100, a=1, b="x")])
    s.flush()
    for before, after in ((KV, KV2), (BAG, bag2)):
        s.apply_ddl(DdlEvent(110, 0.11, before.name, (DdlChange(DdlKind.ADD_COLUMN, "note"),), before, after,
                             "ALTER TABLE ... ADD COLUMN note varchar(32) DEFAULT current_user", 0,
                             fills=(ColumnFill("note", "alice"),)))
    assert s.take_warnings() == []
    s.write([ins(KV2, 120, id=3, body="c", n=3, note=None), upd(KV2, 120, {"id": 2}, id=2, body="b", n=2, note="z"),
             ins(bag2, 120, a=2, b="y", note=None)])
    s.flush()
    s.apply_ddl(DdlEvent(130, 0.13, KV.name, (DdlChange(DdlKind.ADD_COLUMN, "v"),), KV2, KV2, "ADD COLUMN v ... "
                         "DEFAULT clock_timestamp()", 0, fills=(ColumnFill("v", per_row=True),)))
    (w,) = s.take_warnings()  # each row's own value is not in the files: said, not silent
    assert w.code == "CDC:WarnDdlDefault" and w.table == "app.kv" and "clock_timestamp" in w.message
    s.publish_checkpoint(130)
    s.close()
    _, states = rebuild(uri(tmp_path, protocol))
    assert sorted_rows(KV2, states[KV.name].rows()) == [
        {"id": 1, "body": "a", "n": 1, "note": "alice"}, {"id": 2, "body": "b", "n": 2, "note": "z"},
        {"id": 3, "body": "c", "n": 3, "note": None}]
    assert sorted(states[BAG.name].rows(), key=repr) == [{"a": 1, "b": "x", "note": "alice"}] * 2 + [
        {"a": 2, "b": "y", "note": None}]
