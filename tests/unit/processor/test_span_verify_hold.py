"""SpanRunner under a verify hold (docs/verify.md, "The hold"): the first phase stops the sink thread where it is, the
second applies exactly up to the hold's point and reports it once the checkpoint is there, a release lets it go on;
nothing past the point is written meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cdc.model import SpanStatus
from cdc.ts import Watermark
from processor.processor import report_due
from processor.span import SinkPlan, SpanRunner
from sorter.base import SortedTxn
from tests.settle import SETTLE_S
from tests.unit.processor.test_span_ddl import DdlSource, RecordingSink, row
from tests.unit.processor.test_span_warnings import FakeSorter

pytestmark = pytest.mark.unit

TXNS = [SortedTxn(110, 110.0, 1, [row(1)]), SortedTxn(120, 120.0, 1, [row(2)]), SortedTxn(130, 130.0, 1, [row(3)]),
        SortedTxn(140, 140.0, 1, [row(4)])]


def until(cond: Callable[[], bool], runner: SpanRunner) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not cond():
        assert time.monotonic() < deadline and not runner.failed.is_set(), runner.error
        time.sleep(0.01)


def runner(sink: RecordingSink, hold: tuple[int, int] | None) -> SpanRunner:
    r = SpanRunner("cf/0", Watermark(100, 100.0), DdlSource(150, set()), FakeSorter(TXNS),  # type: ignore[arg-type]
                   SinkPlan(lambda: sink, txn_rows=1))
    r.set_verify_hold(hold)
    r.start()
    return r


def test_a_hold_at_a_point_applies_up_to_it_then_waits_until_released() -> None:
    sink = RecordingSink()
    r = runner(sink, (7, 125))
    try:
        until(lambda: r.verify_held is not None, r)
        assert r.verify_held == (7, 125) and r.checkpoint.ts == 125
        time.sleep(0.5)  # nothing past the point while held
        assert sink.log == [[1], [2]] and r.checkpoint.ts == 125
        r.set_verify_hold((7, 135))  # the point moves: up to it
        until(lambda: r.verify_held == (7, 135), r)
        assert sink.log == [[1], [2], [3]]
        r.set_verify_hold(None)
        until(lambda: r.checkpoint.ts == 150, r)
        assert sink.log == [[1], [2], [3], [4]] and r.verify_held is None
    finally:
        r.stop()


def test_the_first_phase_stops_where_the_span_is_and_reports_it() -> None:
    sink = RecordingSink()
    r = runner(sink, (9, 0))
    try:
        until(lambda: r.verify_held is not None, r)
        assert r.verify_held == (9, 100) and sink.log == [] and r.checkpoint.ts == 100
        r.set_verify_hold((9, 130))  # the verifier's snapshot is at 130
        until(lambda: r.verify_held == (9, 130), r)
        assert sink.log == [[1], [2], [3]]
    finally:
        r.stop()


def test_a_span_already_past_the_point_reports_where_it_is() -> None:
    """A hold at a point below the span's checkpoint: the span cannot go back; it reports its checkpoint, which the
    verifier compares with its point and refuses."""
    sink = RecordingSink()
    r = runner(sink, None)
    try:
        until(lambda: r.checkpoint.ts == 150, r)
        r.set_verify_hold((3, 125))
        until(lambda: r.verify_held is not None, r)
        assert r.verify_held == (3, 150) and sink.log == [[1], [2], [3], [4]]
    finally:
        r.stop()


def test_a_span_holding_is_reported_at_once() -> None:
    """The verifier waits for ``held_id``/``held_ts``: a change of them is stored without the usual cadence."""
    prev = SpanStatus("c", 1, checkpoint_ts=100, running=True)
    held = SpanStatus("c", 1, checkpoint_ts=100, running=True, held_id=7, held_ts=100)
    assert not report_due(prev, prev, 0.01, min_interval=1.0, idle_interval=5.0)
    assert report_due(prev, held, 0.01, min_interval=1.0, idle_interval=5.0)
