"""The exactly-once filter of one SQL sink write (``Tracked``): it drops exactly the leading changes at or
below the applied position, passes everything after it, and knows the call's last commit once exhausted."""

import pytest

from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from sinks.sql.target.position import Tracked

pytestmark = pytest.mark.unit

S = TableSchema(TableName("public", "t"), (ColumnSchema("a", 0, "int4"),), ("a",), has_key=False)


def changes(*ts: int) -> list[RowChange]:
    return [RowChange(OpType.INSERT, S, t, t / 10, values={"a": i}) for i, t in enumerate(ts)]


def test_drops_the_prefix_at_or_below_applied_and_notes_the_last_commit() -> None:
    chs = changes(10, 10, 20, 30, 30, 40)
    tracked = Tracked(chs, applied=20)
    assert list(tracked) == chs[3:]
    assert (tracked.skipped, tracked.last_ts, tracked.last_time, tracked.done) == (3, 40, 4.0, True)


def test_everything_already_applied() -> None:
    tracked = Tracked(changes(5, 6), applied=6)
    assert list(tracked) == []
    assert (tracked.skipped, tracked.last_ts, tracked.done) == (2, 0, True)


def test_nothing_applied_yet_and_empty_input() -> None:
    chs = changes(1, 2)
    tracked = Tracked(chs, applied=0)
    assert list(tracked) == chs
    assert (tracked.skipped, tracked.last_ts) == (0, 2)
    empty = Tracked([], applied=0)
    assert list(empty) == [] and empty.done and empty.last_ts == 0


def test_not_done_until_exhausted() -> None:
    tracked = Tracked(changes(1, 2, 3), applied=0)
    it = iter(tracked)
    next(it)
    assert not tracked.done and tracked.last_ts == 0  # a writer that stopped early records no position
