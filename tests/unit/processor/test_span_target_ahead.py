"""SpanRunner asks its source whether it can replay under the same commit Ts what the target already holds past the
start (``SpanSource.check_target_ahead``): a source that cannot (MySQL after a move to another server) fails the span
before anything is written, instead of applying those transactions twice."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from cdc.errors import SlotLost
from cdc.events import RowChange
from cdc.ts import Watermark
from processor.span import SinkPlan, SpanRunner
from sorter.base import SortedTxn
from tests.settle import SETTLE_S
from tests.unit.processor.test_span_ddl import DdlSource, RecordingSink, row
from tests.unit.processor.test_span_warnings import FakeSorter

pytestmark = pytest.mark.unit


class AheadSink(RecordingSink):
    """A target that already holds commits up to ``applied``."""

    def __init__(self, applied: int) -> None:
        super().__init__()
        self.applied = applied

    def open_position(self, changefeed: str, span: int, origin: int = 0) -> int:
        return self.applied

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        return super().write([c for c in changes if c.commit_ts > self.applied], fence)


class RebasedSource(DdlSource):
    """A source whose Ts changed at its start: it refuses a target ahead of it."""

    def __init__(self, resolved: int, refuse: bool) -> None:
        super().__init__(resolved, set())
        self.refuse = refuse
        self.asked: list[int] = []

    def check_target_ahead(self, applied_ts: int) -> None:
        self.asked.append(applied_ts)
        if self.refuse:
            raise SlotLost(f"target holds up to {applied_ts} of the old server")


def run(sink: AheadSink, source: Any) -> SpanRunner:
    txns = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(120, 120.0, 1, [row(2)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), source, FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1, position=("cf", 0, 100)))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while runner.checkpoint.ts < 120 and not runner.failed.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    return runner


def test_a_source_that_cannot_replay_under_the_same_ts_fails_the_span_before_any_write() -> None:
    sink, source = AheadSink(110), RebasedSource(120, refuse=True)
    runner = run(sink, source)
    assert isinstance(runner.error, SlotLost) and source.asked == [110]
    assert sink.log == [] and runner.checkpoint.ts == 100


def test_a_source_with_stable_ts_replays_and_the_target_skips_what_it_holds() -> None:
    sink, source = AheadSink(110), RebasedSource(120, refuse=False)
    runner = run(sink, source)
    assert runner.error is None and source.asked == [110]
    assert [ids for ids in sink.log if ids] == [[2]] and runner.checkpoint.ts == 120


def test_the_source_is_not_asked_when_the_target_is_not_ahead() -> None:
    sink, source = AheadSink(0), RebasedSource(120, refuse=True)
    runner = run(sink, source)
    assert runner.error is None and source.asked == [] and sink.log == [[1], [2]]
