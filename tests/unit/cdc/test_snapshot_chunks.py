"""cdc.snapshot: chunk plans from bounds, chunk validation, JSON round trips (etcd and the job file)."""

from __future__ import annotations

import pytest

from cdc import serde
from cdc.events import TableName
from cdc.snapshot import ChunkDone, SnapshotChunk, SnapshotRun, TablePlan, plan_from_bounds

pytestmark = pytest.mark.unit

T = TableName("app", "orders")


def test_bounds_make_contiguous_chunks_from_open_end_to_open_end() -> None:
    plan = plan_from_bounds(T, 1000, 300, ("id",), [("301",), ("601",), ("901",)])
    assert [(c.index, c.count, c.lower, c.upper) for c in plan.chunks] == [
        (0, 4, None, ("301",)), (1, 4, ("301",), ("601",)), (2, 4, ("601",), ("901",)), (3, 4, ("901",), None)]
    assert plan.has_key and plan.rows == 1000 and plan.chunk_rows == 300 and plan.table_name == T
    assert all(c.key == ("id",) and not c.whole and c.table_name == T for c in plan.chunks)
    assert plan.chunks[2].label == "app.orders#2"


def test_a_small_table_is_one_open_chunk_and_a_keyless_one_a_whole_chunk() -> None:
    one = plan_from_bounds(T, 5, 300, ("a", "b"))
    assert [(c.lower, c.upper, c.whole) for c in one.chunks] == [(None, None, False)]
    whole = plan_from_bounds(T, 5, 300, None)
    assert not whole.has_key and [(c.key, c.whole, c.count) for c in whole.chunks] == [((), True, 1)]
    with pytest.raises(ValueError, match="no chunk bounds"):
        plan_from_bounds(T, 5, 300, None, [("1",)])
    with pytest.raises(ValueError, match="empty key"):
        plan_from_bounds(T, 5, 300, ())


def test_chunks_refuse_inconsistent_bounds() -> None:
    with pytest.raises(ValueError, match="outside"):
        SnapshotChunk("s", "t", 2, 2)
    with pytest.raises(ValueError, match="lower bound has 1 values for a key of 2"):
        SnapshotChunk("s", "t", 0, 1, ("a", "b"), ("1",))
    with pytest.raises(ValueError, match="whole-table chunk"):
        SnapshotChunk("s", "t", 0, 2, whole=True)


def test_plans_and_records_survive_json_exactly() -> None:
    texts = ("2024-01-02 03:04:05.5+00", "1.50", 'a\tb"\\c', "-0", "NaN")
    plan = plan_from_bounds(T, 10, 2, ("ts", "n", "s", "f", "g"), [texts])
    back = serde.from_json(TablePlan, serde.to_json(plan))
    assert back == plan and back.chunks[1].lower == texts and isinstance(back.chunks[1].lower, tuple)
    for obj in (ChunkDone(300, 0.25, 1.7e9, "00000003-00000002-1"), SnapshotRun("r1", 1.5, "h", 7),
                plan_from_bounds(T, 0, 2, None)):
        assert serde.from_json(type(obj), serde.to_json(obj)) == obj


def test_passwords_are_redacted_anywhere_in_a_message() -> None:
    from cdc.uri import redact_text

    text = "x postgresql://u:p@ss@h/db and mysql://root:pw@h:1/x, sqlite:///a.db http://h:80/x"
    assert redact_text(text) == "x postgresql://u:***@h/db and mysql://root:***@h:1/x, sqlite:///a.db http://h:80/x"
