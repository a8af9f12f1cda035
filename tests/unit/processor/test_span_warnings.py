"""Data warnings on the processor side: the sink's ``take_warnings`` after each write reach the span's
``SpanWarnings``, which outlive runner restarts, are stored in ``SpanStatus.warnings`` at once when they
change, survive a move (seeded from the stored status) and are dropped once acknowledged (``resumed_at``).
Also: the sink thread hands the sink its row source and closes it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from cdc.events import ColumnSchema, RowChange, TableName, TableSchema
from cdc.meta.store import ClusterSnapshot, Versioned
from cdc.model import ChangefeedInfo, DataWarning, SpanAssignment, SpanInfo, SpanStatus, WarningSeverity
from cdc.ts import Watermark
from processor.span import SinkPlan, SpanHooks, SpanRunner, SpanWarnings
from sinks.testing import MemoryRowSourceSink
from sorter.base import SortedTxn
from tests.pgoutput_wire import enc_insert
from tests.settle import SETTLE_S
from tests.unit.processor.test_processor_report import MIN, Clock, FakeRunner, FakeStore, make
from upstream.base import encode_payload
from upstream.postgres.source import PgChangeDecoder

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("source_mode")]

SCHEMA = TableSchema(TableName("public", "t"), (ColumnSchema("id", 23, "int4", is_key=True, nullable=False),),
                     ("id",), relation_id=16384)


def w(table: str = "public.t", t: float = 1000.0, count: int = 1, keys: tuple[str, ...] = ("1",),
      code: str = "CDC:WarnMissingRow", severity: WarningSeverity = WarningSeverity.DIVERGENCE) -> DataWarning:
    return DataWarning(code, table, f"{count} row(s) missing", severity, count, keys, first_time=t)


# ---- SpanWarnings ------------------------------------------------------------------------------------
def test_span_warnings_merge_by_code_and_table_and_forget_what_was_acknowledged() -> None:
    sw = SpanWarnings((w(t=10.0),))
    sw.add([w(t=20.0, count=2, keys=("2", "3")), w(table="public.u", t=21.0)])
    (t, u) = sw.current()
    assert (t.count, t.keys, t.first_time, t.seen) == (3, ("1", "2", "3"), 10.0, 20.0)
    assert (u.table, u.count) == ("public.u", 1)
    sw.acknowledge(20.0)  # t last seen at 20: acknowledged; u (21) stays
    assert [x.table for x in sw.current()] == ["public.u"]
    sw.add([w(t=19.0)])  # raised before the acknowledgement (clock of another capture): not shown again
    assert [x.table for x in sw.current()] == ["public.u"]
    sw.add([w(t=30.0, count=4)])  # a new occurrence starts a new count
    assert {x.table: x.count for x in sw.current()} == {"public.u": 1, "public.t": 4}


# ---- Processor: stored at once, carried, acknowledged ---------------------------------------------------
def info(resumed_at: float = 0.0) -> ChangefeedInfo:
    return ChangefeedInfo(id="cf", upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=0.0, create_time=0.0, spans=(SpanInfo(0, "s0", "p0", 100),),
                          resumed_at=resumed_at)


def test_a_new_warning_is_stored_at_once_even_inside_the_batch_interval() -> None:
    clock, store = Clock(), FakeStore()
    p, _ = make(1, clock, store)
    p.report()
    assert store.stored[("cf", 0)].warnings == ()
    clock.now += MIN / 4  # a report pass well inside checkpoint-min-interval
    p.slots[("cf", 0)].warnings.add([w(t=clock.now)])
    p.report()
    assert [x.table for x in store.stored[("cf", 0)].warnings] == ["public.t"]
    batches = len(store.batches)
    clock.now += MIN / 4
    p.report()  # nothing changed: no write
    assert len(store.batches) == batches


def test_warnings_come_from_the_stored_status_and_survive_a_restart_then_clear_on_resume() -> None:
    """A span coming to this capture (a move, a capture restart) starts from its stored warnings; a failed
    runner's replacement shares them; ``resumed_at`` after them acknowledges them and the status drops them."""
    clock, store = Clock(), FakeStore()
    p, _ = make(0, clock, store)
    started: list[FakeRunner] = []

    def start(i: ChangefeedInfo, span: int, status: SpanStatus | None, *a: Any) -> FakeRunner:
        r = FakeRunner(100)
        started.append(r)
        return r

    p.start_runner = start  # type: ignore[method-assign]
    stored = SpanStatus("other-capture", 1, 100, 1.0, warnings=(w(t=900.0, count=7),))
    snap = ClusterSnapshot(revision=1, changefeeds={"cf": Versioned(info(), 1)},
                           assignments={"cf": {0: SpanAssignment("cap", 2)}}, span_statuses={"cf": {0: stored}})
    p.tick(snap)
    assert [x.count for x in store.stored[("cf", 0)].warnings] == [7]
    slot = p.slots[("cf", 0)]
    slot.warnings.add([w(t=clock.now, count=1)])
    # the runner is discarded (a failure); the restarted one reports the same (merged) warnings
    slot.runner = None
    p.tick(snap)
    assert len(started) == 2
    assert [x.count for x in store.stored[("cf", 0)].warnings] == [8]
    clock.now += 1
    resumed = ClusterSnapshot(revision=2, changefeeds={"cf": Versioned(info(resumed_at=clock.now), 2)},
                              assignments={"cf": {0: SpanAssignment("cap", 2)}}, span_statuses={"cf": {0: stored}})
    p.tick(resumed)
    assert store.stored[("cf", 0)].warnings == ()


# ---- SpanRunner: take_warnings after each write, row source in the sink thread ---------------------------
class FakeSource:
    """A span source whose stream is resolved up to ``resolved`` at once (the sorter holds the data). It can run in a
    process of its own (``source_mode``): it is picklable and the parent's instance holds all it has."""

    runs_in_child = True

    def take_state(self) -> object:
        return None

    def put_state(self, state: object) -> None: ...

    def __init__(self, resolved: int, warnings: list[DataWarning] | None = None) -> None:
        self._resolved = resolved
        self.warnings = list(warnings or [])

    def take_warnings(self) -> list[DataWarning]:
        out, self.warnings = self.warnings, []
        return out

    def schema_change_commits(self) -> frozenset[int]:
        return frozenset()

    def caught_up_ts(self) -> int:
        return 0

    def take_schema_versions(self) -> list[tuple[int, TableSchema]]:
        out, self.versions = getattr(self, "versions", []), []
        return out

    def open(self) -> None: ...

    def close(self) -> None: ...

    def ack(self, ts: int) -> None: ...

    def decoder(self) -> PgChangeDecoder:
        return PgChangeDecoder(lambda version: SCHEMA)

    def run(self, buffer: Any, stop: threading.Event, on_resolved: Callable[[Watermark], None]) -> None:
        on_resolved(Watermark(self._resolved, float(self._resolved)))
        stop.wait()


class FakeSorter:
    def __init__(self, txns: list[SortedTxn]) -> None:
        self.txns = txns

    def clear(self) -> None: ...

    def clean(self, ts: int) -> None: ...

    # (the ChangeBuffer a source feeds: the fake sources add nothing, the transactions are given above)
    def add(self, xid: int, subxid: int, payload: bytes) -> None: ...

    def add_many(self, xid: int, subxid: int, payloads: list[bytes]) -> None: ...

    def abort(self, xid: int, subxid: int) -> None: ...

    def commit(self, xid: int, commit_ts: int, commit_time: float) -> None: ...

    def read_txns(self, after: int, upto: int) -> Iterable[SortedTxn]:
        return [t for t in self.txns if after < t.commit_ts <= upto]


class WarningSink(MemoryRowSourceSink):
    """The row-source twin (``sinks.testing``), raising one warning per write (keyed by the rows it got)."""

    def write(self, changes: Iterable[RowChange], fence: Callable[[], None] | None = None) -> int:
        rows = list(changes)
        self.warn(w(t=time.time(), count=len(rows), keys=tuple(str(r.values["id"]) for r in rows)))
        return super().write(rows, fence)


class FakeRowSource:
    def __init__(self) -> None:
        self.closed = False

    def __call__(self, schema: TableSchema, keys: Sequence[tuple[Any, ...]]) -> list[dict[str, Any] | None]:
        return [None for _ in keys]

    def close(self) -> None:
        self.closed = True


def test_runner_collects_sink_warnings_after_each_write_and_wires_the_row_source() -> None:
    txns = [SortedTxn(ts, float(ts), 1, [encode_payload(0, enc_insert(None, 16384, [str(ts)]))])
            for ts in (110, 120, 130)]
    sink, sources = WarningSink(), []

    def source() -> FakeRowSource:
        sources.append(FakeRowSource())
        return sources[-1]

    shared = SpanWarnings((w(t=1.0, count=5, keys=("old",)),))
    runner = SpanRunner("cf/0", Watermark(100, 100.0), FakeSource(130), FakeSorter(txns),  # type: ignore[arg-type]
                        SinkPlan(lambda: sink, txn_rows=1, row_source=source), hooks=SpanHooks(warnings=shared))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while runner.checkpoint.ts < 130 and time.monotonic() < deadline and not runner.failed.is_set():
        time.sleep(0.01)
    assert runner.stop() and runner.error is None
    assert runner.checkpoint.ts == 130
    (merged,) = shared.current()
    assert merged.count == 5 + 3 and merged.keys == ("old", "110", "120", "130")
    assert runner.warnings is shared
    assert len(sources) == 1 and sink.row_source is sources[0]
    assert sources[0].closed and sink.closed


def test_warnings_the_stream_carried_reach_the_span_without_a_write() -> None:
    lost = DataWarning("CDC:WarnPartitionRowsLost", "public.m", "rows lost", "divergence", first_time=time.time(),
                       last_time=time.time())
    shared = SpanWarnings()
    runner = SpanRunner("cf/0", Watermark(100, 100.0), FakeSource(100, [lost]), FakeSorter([]),  # type: ignore[arg-type]
                        SinkPlan(WarningSink, txn_rows=1), hooks=SpanHooks(warnings=shared))
    runner.start()
    deadline = time.monotonic() + SETTLE_S
    while not shared.current() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.stop() and runner.error is None
    assert [x.code for x in shared.current()] == ["CDC:WarnPartitionRowsLost"]
