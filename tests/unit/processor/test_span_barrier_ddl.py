"""SpanRunner of a snapshot-mode changefeed (``SinkPlan.barrier_origin``) at a schema change that alters a table's
shape: everything before the DDL's transaction staged, the span published as waiting there (counted as a checkpoint
just below it), the DDL applied only once the target shows that barrier (never before), then the rows after it staged. A DDL that alters no shape is applied at
once, without waiting."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cdc.events import DdlChange, DdlEvent, DdlKind
from cdc.ts import Watermark
from processor.span import SinkPlan, SpanRunner
from sinks.testing import MemoryBarrierSink, MemoryStage
from sorter.base import SortedTxn
from tests.unit.processor.test_span_ddl import DdlSource, T, row
from tests.unit.processor.test_span_warnings import SCHEMA, FakeSorter
from upstream.base import SCHEMA_CHANGE, encode_payload
from upstream.postgres.source import PgChangeDecoder

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("source_mode")]

ORIGIN = 7


class KindDecoder(PgChangeDecoder):
    """The payload names the DDL's kind."""

    def schema_changes(self, raw: bytes, commit_ts: int, commit_time: float) -> list[DdlEvent]:
        kind = DdlKind(raw.decode())
        return [DdlEvent(commit_ts, commit_time, T, (DdlChange(kind, "c"),), SCHEMA, SCHEMA, f"{kind} on t")]


class KindSource(DdlSource):
    def decoder(self) -> KindDecoder:
        return KindDecoder(lambda version: SCHEMA)


def start(kind: DdlKind) -> tuple[SpanRunner, MemoryBarrierSink, MemoryStage]:
    stage = MemoryStage()
    sink = MemoryBarrierSink(stage)
    sink.stage_barriers(ORIGIN)
    txns = [SortedTxn(110, 110.0, 1, [row(1)]),
            SortedTxn(120, 120.0, 2, [encode_payload(SCHEMA_CHANGE, str(kind).encode()), row(2)]),
            SortedTxn(130, 130.0, 1, [row(3)])]
    runner = SpanRunner("cf/0", Watermark(100, 100.0), KindSource(130, {120}),  # type: ignore[arg-type]
                        FakeSorter(txns), SinkPlan(lambda: sink, txn_rows=10, position=("cf", 0, 100),
                                                   barrier_origin=ORIGIN))
    runner.start()
    return runner, sink, stage


def until(cond: Callable[[], bool], runner: SpanRunner, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert not runner.failed.is_set(), runner.error
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_shape_change_waits_for_the_barrier_just_before_its_transaction() -> None:
    runner, sink, stage = start(DdlKind.ADD_COLUMN)
    try:
        # it waits where the processor stores it (counted as checkpoint 119: cdc.model.SpanStatus.covered_ts), its
        # checkpoint at the last whole transaction before the DDL's (a safe restart point)
        until(lambda: runner.barrier_at == (120, 0), runner)
        assert runner.checkpoint.ts == 110
        time.sleep(0.5)
        assert sink.ddls == []  # not before the barrier
        assert [c.values["id"] for _, c in stage.staged] == [1]
        coordinator = MemoryBarrierSink(stage)
        coordinator.apply_barrier("cf", ORIGIN, 110, 110.0, history=False)  # a barrier below it: still waiting
        time.sleep(0.5)
        assert sink.ddls == []
        coordinator.apply_barrier("cf", ORIGIN, 119, 119.0, history=False)
        until(lambda: runner.checkpoint.ts == 130, runner)
        assert runner.barrier_at is None
        assert [e.commit_ts for e, _ in sink.ddls] == [120]
        assert [c.values["id"] for c in stage.visible] == [1]  # applied before the DDL
        assert [c.values["id"] for _, c in stage.staged] == [2, 3]  # the rows after it, staged
    finally:
        runner.stop()


def test_a_change_that_alters_no_shape_is_applied_at_once() -> None:
    runner, sink, stage = start(DdlKind.CREATE_INDEX)
    try:
        until(lambda: runner.checkpoint.ts == 130, runner)
        assert [e.commit_ts for e, _ in sink.ddls] == [120]
        assert stage.barriers == []
    finally:
        runner.stop()
