"""SpanRunner's passes (``processor.span.PASS_GAP``): transactions committed faster than the gap after a pass that wrote
share the next pass (one sink write for all of them, in commit order, the checkpoint at the last), and a transaction
after a quiet moment is read at once. Without the gap every commit woke the sink thread for a pass of its own (one
write per transaction: ~50 us of wake-up, batcher and write per single-row transaction)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from cdc.ts import Watermark
from processor import span as span_module
from processor.span import SinkPlan, SpanRunner
from sorter.memory import MemorySorter
from tests.unit.processor.test_span_ddl import RecordingSink, row
from tests.unit.processor.test_span_warnings import FakeSource

pytestmark = pytest.mark.unit


class PacedSource(FakeSource):
    """Commits single-row transactions into the real buffer as it is told (``commit_many``), each followed by
    ``on_resolved`` as a span source does; runs in the puller thread."""

    runs_in_child = False

    def __init__(self) -> None:
        super().__init__(100)
        self.todo: list[tuple[list[int], float]] = []
        self.cond = threading.Condition()
        self.ts = 100

    def commit_many(self, ids: list[int], pause: float) -> None:
        with self.cond:
            self.todo.append((ids, pause))
            self.cond.notify()

    def run(self, buffer: Any, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        while not stop.is_set():
            with self.cond:
                if not self.todo:
                    self.cond.wait(0.05)
                    continue
                ids, pause = self.todo.pop(0)
            for i in ids:
                self.ts += 10
                buffer.add_many(self.ts, self.ts, [row(i)])
                buffer.commit(self.ts, self.ts, float(self.ts))
                on_resolved(Watermark(self.ts, float(self.ts)))
                time.sleep(pause)  # (the GIL is released, as a socket read releases it)


def _wait(until: Callable[[], bool], runner: SpanRunner, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline and not runner.failed.is_set():
        time.sleep(0.005)
    assert runner.error is None, runner.error
    assert until()


def test_transactions_arriving_within_the_gap_share_one_pass_and_one_after_a_quiet_moment_is_read_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_module, "PASS_GAP", 2.0)  # (wide, so that a loaded host cannot split the run)
    sink = RecordingSink()
    source = PacedSource()
    runner = SpanRunner("cf/0", Watermark(100, 100.0), source, MemorySorter().span("cf/0"),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1000))
    runner.start()
    try:
        source.commit_many([1], 0)
        _wait(lambda: sink.log == [[1]], runner)
        source.commit_many(list(range(2, 42)), 0.002)  # 40 transactions over ~0.1 s, each waking the sink thread
        _wait(lambda: runner.checkpoint.ts == 100 + 41 * 10, runner)
        assert sink.log == [[1], list(range(2, 42))]  # one pass, one write, in commit order
        time.sleep(2.1)  # quiet for longer than the gap
        began = time.monotonic()
        source.commit_many([42], 0)
        _wait(lambda: runner.checkpoint.ts == 100 + 42 * 10, runner)
        assert time.monotonic() - began < 1.8  # read at once, not held for the gap
        assert sink.log == [[1], list(range(2, 42)), [42]]
    finally:
        runner.stop()
