"""The processor's status cadence (processor.processor.report_due / Processor.report) with an injected
clock, fake span runners and a recording meta-store: busy spans at most every checkpoint-min-interval,
idle spans every checkpoint-interval, all due spans of a capture in one batch, never backwards."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from cdc.config import ServerConfig
from cdc.errors import DdlOrderUnknown
from cdc.events import DdlChange, DdlEvent, DdlKind, TableName
from cdc.meta.kv import Compare
from cdc.meta.store import ClusterSnapshot, SpanStatusWrite, Versioned
from cdc.model import ChangefeedInfo, RunningError, SpanAssignment, SpanInfo, SpanStatus
from cdc.ts import Watermark
from processor.processor import Processor, Slot, report_due
from sinks.testing import MemorySinks
from upstream import open_upstream

pytestmark = pytest.mark.unit

MIN, IDLE = 0.2, 1.0


def st(ck: int, ck_time: float | None = None, rs: int | None = None, running: bool = True) -> SpanStatus:
    return SpanStatus("cap", 1, ck, float(ck) if ck_time is None else ck_time, ck if rs is None else rs,
                      0.0, running)


def due(prev: SpanStatus | None, cur: SpanStatus, elapsed: float) -> bool:
    return report_due(prev, cur, elapsed, min_interval=MIN, idle_interval=IDLE)


def test_first_report_and_state_changes_are_immediate() -> None:
    assert due(None, st(5), 0.0)
    assert due(st(5), st(5, running=False), 0.01)


def test_moving_checkpoint_is_rate_limited_by_min_interval() -> None:
    assert not due(st(5), st(6), MIN - 0.01)
    assert due(st(5), st(6), MIN)


def test_idle_span_reports_only_every_checkpoint_interval() -> None:
    # only the checkpoint time (keepalive) or the resolved Ts moved: not at the busy cadence
    assert not due(st(5, 5.0), st(5, 9.0), MIN * 2)
    assert not due(st(5), st(5, rs=8), IDLE - 0.01)
    assert due(st(5, 5.0), st(5, 9.0), IDLE)
    assert due(st(5), st(5, rs=8), IDLE)


def test_unchanged_span_only_heartbeats() -> None:
    assert not due(st(5), st(5), IDLE * 5)
    assert due(st(5), st(5), 10.0)


# ---- Processor.report over fakes ------------------------------------------------------------------
class FakeRunner:
    def __init__(self, ts: int) -> None:
        self.checkpoint = Watermark(ts, float(ts))
        self.resolved = Watermark(ts, float(ts))
        self.start_ts = ts
        self.rows = 0
        self.alive = True
        self.stopped = False
        self.acked: list[int] = []
        self.failed = threading.Event()
        self.watermark_limit: Watermark | None = None  # a table copy's hold (SpanRunner.watermark_limit)
        self.barrier_at: tuple[int, int] | None = None  # where it waits at a changefeed barrier (SpanRunner)
        self.caught_up_at = 0  # where its source caught up with its stream (SpanRunner.caught_up_at)

    def advance(self, ts: int, t: float | None = None) -> None:
        self.checkpoint = self.resolved = Watermark(ts, float(ts) if t is None else t)

    def persisted(self, ts: int) -> None:
        self.acked.append(ts)

    def stop(self) -> bool:
        self.stopped = True
        return True


@dataclass
class FakeStore:
    refuse: set[tuple[str, int]] = field(default_factory=set)
    batches: list[list[SpanStatusWrite]] = field(default_factory=list)
    stored: dict[tuple[str, int], SpanStatus] = field(default_factory=dict)

    def processor_guard(self, cf: str, span: int, assignment: SpanAssignment, lease: int = 0) -> list[Compare]:
        return [Compare(f"a/{cf}/{span}", "mod", "=", assignment.epoch)]

    def put_span_statuses(self, writes: Sequence[SpanStatusWrite]) -> list[bool]:
        self.batches.append(list(writes))
        out = []
        for w in writes:
            ok = (w.cf, w.span) not in self.refuse
            if ok:
                self.stored[(w.cf, w.span)] = w.status
            out.append(ok)
        return out


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(spans: int, clock: Clock, store: FakeStore) -> tuple[Processor, list[FakeRunner]]:
    p = Processor(store, "cap", sorter=None, config=ServerConfig(), lease=lambda: 7, clock=clock,  # type: ignore[arg-type]
                  sinks=MemorySinks(), open_upstream=open_upstream)
    runners = []
    for i in range(spans):
        r = FakeRunner(100)
        slot = Slot("cf", i, SpanAssignment("cap", 1), runner=r)  # type: ignore[arg-type]
        p.slots[("cf", i)] = slot
        runners.append(r)
    return p, runners


def test_busy_spans_are_reported_together_at_min_interval() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(8, clock, store)
    assert p.report()
    assert len(store.batches) == 1 and len(store.batches[0]) == 8, "all spans in one batch"
    writes = 0
    for step in range(1, 41):  # 2 s of 50 ms report passes while every checkpoint moves each pass
        clock.now += 0.05
        for r in runners:
            r.advance(100 + step)
        p.report()
        writes = len(store.batches) - 1
    assert 2.0 / 0.25 <= writes <= 2.0 / MIN, writes
    assert all(len(b) == 8 for b in store.batches)
    # the stored checkpoint trails the span by at most min-interval (+ one pass)
    assert store.stored[("cf", 0)].checkpoint_ts >= 140 - int((MIN + 0.05) / 0.05)
    assert runners[0].acked[-1] == store.stored[("cf", 0)].checkpoint_ts, "acked only what etcd holds"


def test_idle_spans_write_once_per_checkpoint_interval() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(3, clock, store)
    p.report()
    for _ in range(100):  # 5 s; keepalives move the checkpoint time only
        clock.now += 0.05
        for r in runners:
            r.advance(100, clock.now)
        p.report()
    writes = len(store.batches) - 1
    assert 4 <= writes <= 5, writes


def test_only_due_spans_are_written() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(2, clock, store)
    p.report()
    clock.now += MIN
    runners[1].advance(200)
    p.report()
    assert [(w.span, w.status.checkpoint_ts) for w in store.batches[-1]] == [(1, 200)]


def test_fenced_write_is_not_acked_and_stops_only_when_asked() -> None:
    clock, store = Clock(), FakeStore(refuse={("cf", 1)})
    p, runners = make(2, clock, store)
    assert p.report(stop_fenced=False) is False
    assert not runners[1].stopped and runners[1].acked == []
    assert runners[0].acked == [100]
    clock.now += MIN
    runners[1].advance(150)
    assert p.report(stop_fenced=True) is False
    assert runners[1].stopped and runners[1].acked == []


def test_reported_checkpoint_never_moves_backwards() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(1, clock, store)
    p.slots[("cf", 0)].reported = st(500)
    p.slots[("cf", 0)].last_report = clock.now - 20
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 500


def test_tick_reports_through_the_same_batch() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(2, clock, store)
    info = ChangefeedInfo(id="cf", upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=0.0, create_time=0.0,
                          spans=tuple(SpanInfo(i, f"s{i}", f"p{i}", 100) for i in range(2)))
    snap = ClusterSnapshot(revision=1, changefeeds={"cf": Versioned(info, 1)},
                           assignments={"cf": {0: SpanAssignment("cap", 1), 1: SpanAssignment("cap", 1)}})
    p.tick(snap)
    assert len(store.batches) == 1 and {w.span for w in store.batches[0]} == {0, 1}


def test_busy_spans_share_one_cadence_even_when_their_commits_interleave() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(8, clock, store)
    for r in runners:  # steady state: every runner moved past its start long ago (a first move is stored at once)
        r.start_ts = 50
    p.report()
    for step in range(1, 41):  # 2 s; each pass only one span (round robin) receives a commit
        clock.now += 0.05
        runners[step % 8].advance(100 + step)
        p.report()
    writes = len(store.batches) - 1
    assert writes <= 2.0 / MIN, f"{writes} transactions: spans are not coalesced"
    assert max(len(b) for b in store.batches[1:]) > 1


def test_idle_spans_do_not_ride_along_with_busy_ones() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(2, clock, store)
    p.report()
    idle_writes = 0
    for step in range(1, 21):  # 1 s: span 0 busy, span 1 only keepalives
        clock.now += 0.05
        runners[0].advance(100 + step)
        runners[1].advance(100, clock.now)
        p.report()
        idle_writes += sum(1 for w in store.batches[-1] if w.span == 1) if len(store.batches) > 1 else 0
        store.batches.append([])  # mark the pass boundary
    assert idle_writes <= 1


def test_an_error_clears_once_the_restarted_span_progresses_even_if_the_report_pass_stored_it_first() -> None:
    """The 50 ms report pass can store the restarted span's progress (with the error still attached)
    before the tick looks: progress is measured from the runner's start, not from the stored status."""
    clock, store = Clock(), FakeStore()
    p, runners = make(1, clock, store)
    slot = p.slots[("cf", 0)]
    slot.error = RunningError("CDC:ErrSinkUnavailable", "sink down", clock.now, "cap", 0)
    p.report()
    runners[0].advance(150)
    clock.now += MIN
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 150 and store.stored[("cf", 0)].error is not None
    info = ChangefeedInfo(id="cf", upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=0.0, create_time=0.0, spans=(SpanInfo(0, "s0", "p0", 100),))
    p.tick(ClusterSnapshot(revision=1, changefeeds={"cf": Versioned(info, 1)},
                           assignments={"cf": {0: SpanAssignment("cap", 1)}}))
    assert slot.error is None and slot.failures == 0
    assert store.stored[("cf", 0)].error is None


def test_a_table_copys_hold_is_stored_and_its_release_reported_at_once() -> None:
    clock, store = Clock(), FakeStore()
    p, runners = make(1, clock, store)
    runners[0].watermark_limit = Watermark(99, 99.0)
    p.report()
    assert (store.stored[("cf", 0)].hold_ts, store.stored[("cf", 0)].hold_time) == (99, 99.0)
    clock.now += 0.01  # well within checkpoint-min-interval
    runners[0].watermark_limit = None
    p.report()
    assert store.stored[("cf", 0)].hold_ts == 0 and len(store.batches) == 2


def test_where_a_span_waits_at_a_changefeed_barrier_is_stored_at_once_and_cleared_at_once() -> None:
    """Other spans' barriers wait for it (processor.barrier): not at the checkpoint's cadence."""
    clock, store = Clock(), FakeStore()
    p, runners = make(1, clock, store)
    p.report()
    clock.now += 0.01  # well within checkpoint-min-interval
    runners[0].advance(119)
    runners[0].barrier_at = (120, 3)
    p.report()
    s = store.stored[("cf", 0)]
    assert (s.checkpoint_ts, s.barrier_ts, s.barrier_seq) == (119, 120, 3) and len(store.batches) == 2
    clock.now += 0.01
    runners[0].barrier_at = None
    p.report()
    assert store.stored[("cf", 0)].barrier_ts == 0 and len(store.batches) == 3


# ---- the changefeed barrier's wait over the stored statuses --------------------------------------------------------
class NoPlans:
    def get_plan(self, changefeed: str, span: int, table: object) -> None:
        return None


@dataclass
class StatusStore(FakeStore):
    def get_span_status(self, cf: str, span: int) -> Versioned[SpanStatus] | None:
        s = self.stored.get((cf, span))
        return None if s is None else Versioned(s, 1)


def barrier_wait(store: StatusStore) -> Any:
    info = ChangefeedInfo(id="cf", upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=0.0, create_time=0.0,
                          spans=(SpanInfo(0, "s0", "p0", 100), SpanInfo(1, "s1", "p1", 100)))
    p = Processor(store, "cap", sorter=None, config=ServerConfig(), lease=lambda: 7,  # type: ignore[arg-type]
                  sinks=MemorySinks(), open_upstream=open_upstream)
    return p._changefeed_barrier(info, 0, NoPlans())  # type: ignore[arg-type]


def drop(seq: int, local: bool = False) -> DdlEvent:
    return DdlEvent(120, 0.0, TableName("public", "dst"), (DdlChange(DdlKind.DROP_TABLE),), None, None,
                    "DROP TABLE dst", seq, seq_local=local)


def test_the_barrier_passes_once_the_other_span_waits_at_a_later_ddl_of_the_transaction() -> None:
    store = StatusStore()
    store.stored[("cf", 1)] = replace(st(119), barrier_ts=120, barrier_seq=1)
    assert barrier_wait(store)(drop(0), threading.Event()) == []


def test_the_barrier_waits_while_the_other_span_may_still_hold_an_earlier_ddl_of_the_transaction() -> None:
    store = StatusStore()
    store.stored[("cf", 1)] = replace(st(119), barrier_ts=120, barrier_seq=0)  # the DROP in span 1 first
    stop = threading.Event()
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(barrier_wait(store)(drop(1), stop)))
    t.start()
    t.join(1.2)
    assert t.is_alive() and not result  # still waiting (polls every 0.5 s)
    store.stored[("cf", 1)] = st(120)  # span 1 applied its DROP and wrote the rest of the transaction
    t.join(2.0)
    assert not t.is_alive() and result == [[]]


def test_a_ddl_without_a_position_meeting_another_span_at_its_commit_fails_naming_tables_ts_and_fix() -> None:
    store = StatusStore()
    store.stored[("cf", 1)] = replace(st(119), barrier_ts=120, barrier_seq=2)
    with pytest.raises(DdlOrderUnknown) as e:
        barrier_wait(store)(drop(0, local=True), threading.Event())
    assert "public.dst" in str(e.value) and "commit Ts 120" in str(e.value) and "cf/1" in str(e.value)
    assert "--skip-ddl-ts 120" in str(e.value) and e.value.code == "CDC:ErrDdlOrderUnknown"


def test_first_checkpoint_move_after_start_is_immediate_once() -> None:
    # the runner started from checkpoint 5: its first move past it is stored at once (the changefeed checkpoint
    # after a resume or a span move), the next ones at the busy cadence again
    assert report_due(st(5), st(6), 0.01, min_interval=MIN, idle_interval=IDLE, started_at=5)
    assert not report_due(st(6), st(7), 0.01, min_interval=MIN, idle_interval=IDLE, started_at=5)
    assert not due(st(5), st(6), 0.01), "without a start, the busy cadence"


def _resumed_and_moved(clock: Clock, store: FakeStore) -> tuple[Processor, FakeRunner]:
    """A span resumed from checkpoint 100 (stored at once: running) whose first move, to 130, 50 ms later was stored
    at once too, and whose next move, to 160, another 50 ms later, waits."""
    p, (runner,) = make(1, clock, store)
    p.slots[("cf", 0)].reported = st(100, running=False)  # stored by the previous holder (paused)
    assert p.report()  # running=True: stored at once
    assert store.stored[("cf", 0)].running and store.stored[("cf", 0)].checkpoint_ts == 100
    clock.now += 0.05  # one report pass later, well within checkpoint-min-interval
    runner.advance(130)
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 130, "the first move is not held back by the start report"
    clock.now += 0.05
    runner.advance(160)
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 130, "later moves at most every checkpoint-min-interval"
    return p, runner


def test_report_stores_the_first_move_after_the_start_report_without_waiting() -> None:
    clock, store = Clock(), FakeStore()
    p, _runner = _resumed_and_moved(clock, store)
    clock.now += MIN
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 160


def test_a_checkpoint_that_reaches_where_the_source_caught_up_is_stored_at_once() -> None:
    # the end of a catch-up (or of a burst): not up to checkpoint-min-interval later
    assert report_due(st(130), st(160), 0.01, min_interval=MIN, idle_interval=IDLE, caught_up_at=160)
    assert report_due(st(130), st(170), 0.01, min_interval=MIN, idle_interval=IDLE, caught_up_at=160)
    assert not report_due(st(130), st(150), 0.01, min_interval=MIN, idle_interval=IDLE, caught_up_at=160)
    assert not report_due(st(160), st(170), 0.01, min_interval=MIN, idle_interval=IDLE, caught_up_at=160), "once"
    assert not due(st(130), st(160), 0.01), "without it, the busy cadence"


def test_report_stores_the_end_of_a_catch_up_without_waiting() -> None:
    clock, store = Clock(), FakeStore()
    p, runner = _resumed_and_moved(clock, store)  # (160 within the catch-up waits)
    clock.now += 0.05
    runner.advance(190)
    runner.caught_up_at = 190  # its source had nothing more waiting at 190, and the checkpoint got there
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 190, "the end of the catch-up is not held back"
    clock.now += 0.05
    runner.advance(200)
    p.report()
    assert store.stored[("cf", 0)].checkpoint_ts == 190, "then the busy cadence again"
