"""SpanRunner and span watermarks (``sinks.base.WatermarkSink``, the Kafka sink): the sink learns its span and the span
count before ``open_position``, and ``publish_resolved`` gets only checkpoints (durable downstream), at most once per
interval, never one it already got; a buffering sink's watermark waits for its flush."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from cdc.events import RowChange
from cdc.ts import Watermark
from processor.span import CopyPlan, SinkPlan, SpanHooks, SpanRunner
from sinks.base import BufferedSink
from sinks.base import WatermarkSink as WatermarkRole
from sorter.base import SortedTxn
from tests.settle import SETTLE_S
from tests.unit.processor.test_span_ddl import DdlSource, RecordingSink, row
from tests.unit.processor.test_span_warnings import FakeSorter

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("source_mode")]


class WatermarkSink(RecordingSink, BufferedSink, WatermarkRole):
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
    runner = SpanRunner("cf/0", Watermark(100, 100.0), DdlSource(resolved, set()), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1, position=("cf", 2, 100), spans=3))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
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


def test_a_table_copy_holds_the_watermarks_below_its_snapshot_until_it_is_written() -> None:
    """The copy's rows carry its snapshot Ts B (or a later run's) while the span streams its other tables past it:
    until the copy is written, the span's watermarks stay at the start checkpoint, then at B - 1 once B is known;
    ``watermark_limit`` (stored as ``SpanStatus.hold_ts`` for the owner) says the same."""
    import threading

    from processor.table_hold import TableHold

    sink = WatermarkSink(interval=0.02)
    known, done = threading.Event(), threading.Event()

    def table_copy(stop: threading.Event, gate: Any) -> dict[str, int]:
        known.wait(SETTLE_S)
        gate.pass_up_to(130, {})
        done.wait(SETTLE_S)
        return {"public.held": 130}

    txns = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(140, 140.0, 1, [row(2)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), DdlSource(150, set()), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1, position=("cf", 0, 100)),
                        CopyPlan(table=table_copy, hold=TableHold(["public.held"])))
    runner.start()
    try:
        def until(pred: Callable[[], bool]) -> None:
            deadline = time.monotonic() + SETTLE_S
            while not pred() and time.monotonic() < deadline and not runner.failed.is_set():
                time.sleep(0.01)
            assert pred(), (runner.error, runner.checkpoint, sink.published)

        until(lambda: runner.checkpoint.ts == 150)
        time.sleep(0.1)
        assert sink.published == [] and runner.watermark_limit == Watermark(100, 100.0)  # nothing above the start
        known.set()
        until(lambda: bool(sink.published))
        time.sleep(0.1)
        assert [ts for ts, _ in sink.published] == [129] and runner.watermark_limit is not None \
            and runner.watermark_limit.ts == 129
        done.set()  # the copy is written: the hold is released, the watermark catches up
        until(lambda: sink.published[-1][0] == 150)
        assert runner.watermark_limit is None
    finally:
        known.set()
        done.set()
        runner.stop()
    assert runner.error is None, runner.error


class CaughtUpSource(DdlSource):
    """A source that says it caught up with its stream at ``caught_up`` (SpanSource.caught_up_ts). In a thread, as
    the MySQL source (the hint does not cross processor.source_process's pipe: a child's parent instance says 0)."""

    runs_in_child = False

    def __init__(self, resolved: int, caught_up: int) -> None:
        super().__init__(resolved, set())
        self.caught_up = caught_up

    def caught_up_ts(self) -> int:
        return self.caught_up


@pytest.mark.parametrize(("caught_up", "calls"), [(150, [110, 150]), (140, [110, 150]), (200, [110]), (0, [110])])
def test_report_hook_fires_at_the_first_move_and_where_the_source_caught_up(caught_up: int, calls: list[int]) -> None:
    # the processor stores at once (SpanHooks.report_now wakes its report pass) a resumed span's first checkpoint
    # (once) and the end of a catch-up (a checkpoint that reaches SpanSource.caught_up_ts; 0: the source cannot tell)
    sink = WatermarkSink(interval=0.0)
    moved: list[int] = []
    txns = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(120, 120.0, 1, [row(2)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), CaughtUpSource(150, caught_up), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1, position=("cf", 2, 100), spans=3),
                        hooks=SpanHooks(report_now=lambda: moved.append(runner.checkpoint.ts)))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while runner.checkpoint.ts < 150 and time.monotonic() < deadline and not runner.failed.is_set():
        time.sleep(0.01)
    runner.stop()
    assert runner.error is None, runner.error
    assert runner.checkpoint.ts == 150
    assert moved == calls
    assert runner.caught_up_at == (caught_up if caught_up <= 150 else 0)
