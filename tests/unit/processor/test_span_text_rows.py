"""The span mounts rows for its sink's role: a sink that writes rows by their text (``sinks.base.TextRows``, the SQL
sink) gets inserts whose typed values are deferred (``RowChange.row`` not a tuple), any other sink gets every
row parsed; both read the same values."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import pytest

from cdc.events import RowChange
from cdc.ts import Watermark
from processor.span import SinkPlan, SpanRunner
from sinks.base import TextRows
from sorter.memory import MemorySorter
from tests import rowcodecs
from tests.unit.processor.test_span_ddl import RecordingSink
from tests.unit.processor.test_span_passes import PacedSource

pytestmark = pytest.mark.unit


class StoredRowsSink(RecordingSink):
    """Records, per change, whether its row was stored as a tuple when the sink got it (before anything read it)."""

    def __init__(self) -> None:
        super().__init__()
        self.tuples: list[bool] = []

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        kept = list(changes)
        self.tuples += [isinstance(c.row, tuple) for c in kept]
        return super().write(kept, fence)


class StoredTextRowsSink(StoredRowsSink, TextRows):
    pass


@pytest.mark.parametrize("text_rows", [False, True])
def test_a_text_rows_sink_gets_deferred_inserts(text_rows: bool) -> None:
    rowcodecs.codec_named("c")  # (skips where the C codec cannot be built: the Python one never defers)
    sink = StoredTextRowsSink() if text_rows else StoredRowsSink()
    source = PacedSource()
    runner = SpanRunner("cf/0", Watermark(100, 100.0), source, MemorySorter().span("cf/0"),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1000))
    runner.start()
    try:
        source.commit_many(list(range(1, 11)), 0)
        deadline = time.monotonic() + 20
        while runner.checkpoint.ts < 200 and time.monotonic() < deadline and not runner.failed.is_set():
            time.sleep(0.005)
        assert runner.error is None, runner.error
    finally:
        runner.stop()
    assert [i for rows in sink.log for i in rows] == list(range(1, 11))  # the same values either way
    # (the first row of a schema version is mounted in Python, which plans the version: never deferred)
    assert sink.tuples[1:] == [not text_rows] * 9
