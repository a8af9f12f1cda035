"""SpanRunner with a sink that buffers until its flush (``sinks.base.BufferedSink``, the storage sink): the checkpoint
moves past written rows only once a flush made them durable, the rows before a DDL are flushed before it, and a
sink without buffering is unchanged (checkpoint after every write)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from cdc.events import DdlEvent, RowChange
from cdc.ts import Watermark
from processor.span import SinkPlan, SpanRunner
from sinks.base import BufferedSink
from sorter.base import SortedTxn
from tests.settle import SETTLE_S
from tests.unit.processor.test_span_ddl import DdlSource, RecordingSink, row
from tests.unit.processor.test_span_warnings import FakeSorter
from upstream.base import SCHEMA_CHANGE, encode_payload

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("source_mode")]


class BufferingSink(RecordingSink, BufferedSink):
    def __init__(self, interval: float) -> None:
        super().__init__()
        self.flush_interval = interval
        self.buffered: list[Any] = []
        self.flushes: list[list[Any]] = []
        self.runner: SpanRunner | None = None
        self.checkpoint_at_write: list[int] = []
        self.flushed_at_write: list[int] = []  # rows flushed before each write
        self.first_flush = 0.0

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        rows = [c.values["id"] for c in changes]
        self.buffered += rows
        assert self.runner is not None
        self.checkpoint_at_write.append(self.runner.checkpoint.ts)
        self.flushed_at_write.append(sum(map(len, self.flushes)))
        return len(rows)

    def flush(self, fence: Callable[[], None] | None = None) -> None:
        self.flushes.append(self.buffered)
        self.buffered = []
        self.first_flush = self.first_flush or time.monotonic()

    def apply_ddl(self, event: DdlEvent, fence: Callable[[], None] | None = None, *, skip: bool = False) -> bool:
        assert not self.buffered, "a DDL before the rows written ahead of it were flushed"
        return super().apply_ddl(event, fence, skip=skip)


def _run(sink: BufferingSink, txns: list[SortedTxn], resolved: int, commits: set[int], until: Callable[[], bool],
         txn_rows: int = 1) -> SpanRunner:
    runner = SpanRunner("cf/0", Watermark(100, 100.0), DdlSource(resolved, commits), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=txn_rows))
    sink.runner = runner
    runner.start()
    # (a bound, not a timing: a source process slow to start on a loaded host, then two flush intervals of the
    # buffered sink, took more than the 10 s this was once)
    deadline = time.monotonic() + 60
    while not until() and time.monotonic() < deadline and not runner.failed.is_set():
        time.sleep(0.01)
    runner.stop()
    assert runner.error is None, runner.error
    return runner


def test_the_checkpoint_waits_for_the_flush_of_a_buffering_sink() -> None:
    # (an interval long enough for the resolved watermark to arrive within it also from a source process that is
    # slow to start on a loaded host: both writes fall into the first interval)
    sink = BufferingSink(interval=3.0)
    txns = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(120, 120.0, 1, [row(2)])]
    began = time.monotonic()
    runner = _run(sink, txns, 130, set(), lambda: not sink.buffered and sum(map(len, sink.flushes)) == 2
                  and sink.runner.checkpoint.ts == 130)
    # Whether both writes fall into the first interval depends on when the resolved watermark arrives (from a source
    # process slow to start on a loaded host, the second may come after the first flush): what must hold either way
    # is that the checkpoint never passes a row before a flush made it durable.
    assert [r for f in sink.flushes for r in f] == [1, 2] and runner.checkpoint.ts == 130
    ts_of = {0: 100, 1: 110, 2: 120}  # rows flushed -> the Ts they make durable
    assert all(cp <= ts_of[n] for cp, n in zip(sink.checkpoint_at_write, sink.flushed_at_write, strict=True))
    assert sink.checkpoint_at_write[0] == 100  # nothing durable before the first flush
    assert sink.first_flush - began >= 2.5  # (the flush waited for its interval)


def test_rows_before_a_ddl_are_flushed_before_it() -> None:
    sink = BufferingSink(interval=30.0)  # only the DDL makes it flush
    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 3, [row(2), encode_payload(SCHEMA_CHANGE, b"c"), row(3)])]
    runner = _run(sink, txns, 120, {120}, lambda: ("ddl", "c") in sink.log and sink.buffered == [3], txn_rows=100)
    assert sink.flushes == [[1, 2]] and sink.log == [("ddl", "c")]
    assert runner.checkpoint.ts < 120  # row 3 is written but not flushed: its transaction is not durable


def test_a_sink_that_does_not_buffer_checkpoints_after_every_write() -> None:
    sink = RecordingSink()
    txns = [SortedTxn(110, 110.0, 1, [row(1)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), DdlSource(110, set()), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while runner.checkpoint.ts < 110 and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    assert runner.checkpoint.ts == 110 and sink.log == [[1]]


def test_a_full_disk_under_the_storage_sink_fails_the_span_and_acknowledges_nothing(tmp_path: Any) -> None:
    """The real storage sink over a file system whose disk is full when files are published: the span fails with
    a retryable SinkUnavailable naming the path, its checkpoint stays where it started, no data file is visible."""
    import errno

    from cdc.errors import SinkUnavailable
    from sinks.storage.sink import StorageSink
    from tests.unit.sinks.storage.storage_cases import FailingFS

    root = tmp_path / "lake"
    fs = FailingFS(str(root), "fsync", errno.ENOSPC, path_part="/public/t/", times=10**6)
    sink = StorageSink(f"file://{root}?protocol=csv&flush-interval=100ms", fs=fs)
    txns = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(120, 120.0, 1, [row(2)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), DdlSource(130, set()), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1, position=("cf", 0, 100)))
    runner.start()
    assert runner.failed.wait(SETTLE_S)
    runner.stop()
    assert isinstance(runner.error, SinkUnavailable) and runner.error.retryable
    assert "no space left" in runner.error.message and str(root / "public" / "t") in runner.error.message
    assert runner.checkpoint.ts == 100
    assert not [p for p in root.rglob("CDC*") if not p.name.startswith(".")]
