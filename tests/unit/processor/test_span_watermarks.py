"""SpanRunner and span watermarks (``Sink.watermark_interval``, the Kafka sink): the sink learns its span and the span
count before ``open_position``, and ``publish_resolved`` gets only checkpoints (durable downstream), at most once per
interval, never one it already got; a buffering sink's watermark waits for its flush."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from cdc.events import RowChange
from cdc.ts import Watermark
from processor.span import SpanRunner
from sorter.base import SortedTxn
from tests.unit.processor.test_span_ddl import DdlSource, RecordingSink, row
from tests.unit.processor.test_span_warnings import FakeSorter

pytestmark = pytest.mark.unit


class WatermarkSink(RecordingSink):
    def __init__(self, interval: float, flush_interval: float = 0.0) -> None:
        super().__init__()
        self.watermark_interval = interval
        self.flush_interval = flush_interval
        self.calls: list[Any] = []
        self.durable: list[int] = []  # commit Ts of rows durable downstream
        self.pending: list[int] = []
        self.published: list[tuple[int, float]] = []

    def bind_span(self, changefeed: str, span: int, spans: int) -> None:
        self.calls.append(("bind", changefeed, span, spans))

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        self.calls.append(("position", changefeed, span))
        return 0

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        ts = [c.commit_ts for c in changes]
        (self.pending if self.flush_interval else self.durable).extend(ts)
        return len(ts)

    def flush(self, fence: Callable[[], None] | None = None) -> None:
        self.durable += self.pending
        self.pending = []

    def publish_resolved(self, watermark: Watermark, fence: Callable[[], None] | None = None) -> None:
        assert not self.pending or min(self.pending) > watermark.ts, "a watermark over rows not yet durable"
        self.published.append((watermark.ts, time.monotonic()))


def _run(sink: WatermarkSink, txns: list[SortedTxn], resolved: int, until: Callable[[], bool]) -> SpanRunner:
    runner = SpanRunner("cf/0", DdlSource(resolved, set()), FakeSorter(txns),  # type: ignore[arg-type]
                        lambda: sink, Watermark(100, 100.0), txn_rows=1, position=("cf", 2, 100), spans=3)
    runner.start()
    deadline = time.monotonic() + 10
    while not until() and time.monotonic() < deadline and not runner.failed.is_set():
        time.sleep(0.01)
    runner.stop()
    assert runner.error is None, runner.error
    return runner


def test_the_span_is_bound_before_its_position_and_watermarks_follow_the_checkpoint() -> None:
    sink = WatermarkSink(interval=0.3)
    txns = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(120, 120.0, 1, [row(2)])]
    _run(sink, txns, 150, lambda: bool(sink.published) and sink.published[-1][0] == 150)
    assert sink.calls == [("bind", "cf", 2, 3), ("position", "cf", 2)]
    marks = [ts for ts, _ in sink.published]
    assert marks == sorted(set(marks)) and marks[-1] == 150  # increasing, never repeated
    gaps = [b - a for (_, a), (_, b) in zip(sink.published, sink.published[1:], strict=False)]
    assert all(g >= 0.25 for g in gaps), gaps


def test_a_buffering_sink_gets_a_watermark_only_after_its_flush() -> None:
    sink = WatermarkSink(interval=0.05, flush_interval=0.5)
    txns = [SortedTxn(110, 110.0, 1, [row(1)])]
    _run(sink, txns, 110, lambda: any(ts >= 110 for ts, _ in sink.published))
    assert sink.durable == [110]


def test_no_watermarks_without_an_interval() -> None:
    sink = WatermarkSink(interval=0.0)
    _run(sink, [SortedTxn(110, 110.0, 1, [row(1)])], 120, lambda: sink.durable == [110])
    time.sleep(0.3)
    assert sink.published == []
