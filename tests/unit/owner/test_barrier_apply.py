"""The owner's barrier coordinator (owner.barrier_apply): only snapshot-mode changefeeds, latest offer wins, at most one
barrier per interval, never one at or below what the target shows, failures retried with backoff and shown as a
divergence warning once they persist, a recreated changefeed starts afresh; with the in-memory twins, a reader sees
only whole barriers."""

from __future__ import annotations

import pytest

from cdc.events import ColumnSchema, OpType, RowChange, TableName, TableSchema
from cdc.model import ChangefeedInfo, SpanInfo, WarningSeverity
from owner.barrier_apply import WARNING_CODE, BarrierCoordinator, BarrierFeed, consistency, due
from sinks.testing import MemoryBarrierSink, MemorySinks, MemoryStage

pytestmark = pytest.mark.unit

SNAPSHOT = {"consistency": {"mode": "snapshot", "interval": 1.0}}


def info(config: dict | None = None, start_ts: int = 100, cf: str = "cf") -> ChangefeedInfo:
    return ChangefeedInfo(id=cf, upstream_uri="postgresql://u@h/db", sink_uri="postgresql://u@h/t",
                          config=SNAPSHOT if config is None else config, start_ts=start_ts, start_time=1.0,
                          create_time=1.0, spans=tuple(SpanInfo(i, f"s{i}", f"p{i}", start_ts) for i in range(3)))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def coordinator(stage: MemoryStage, clock: Clock, fail: list[bool] | None = None
                ) -> tuple[BarrierCoordinator, list[MemoryBarrierSink]]:
    opened: list[MemoryBarrierSink] = []
    failing = fail if fail is not None else [False]

    def opener(_info: ChangefeedInfo) -> MemoryBarrierSink:
        s = MemoryBarrierSink(stage, lambda: failing[0])
        opened.append(s)
        return s

    return BarrierCoordinator(MemorySinks(MemoryBarrierSink), opener=opener, clock=clock, wall=clock, retry_min=1.0,
                              retry_max=8.0, warn_after=30.0), opened


def test_only_snapshot_mode_changefeeds_are_coordinated() -> None:
    assert consistency(info({})) is None
    assert consistency(info({"consistency": {"mode": "default"}})) is None
    assert consistency(info({"span_count": "x"})) is None  # unreadable: fails elsewhere
    c = consistency(info())
    assert c is not None and c.interval == 1.0
    stage, clock = MemoryStage(), Clock()
    coord, opened = coordinator(stage, clock)
    coord.offer(info({}), 500, 1.0)
    assert coord.apply_due() is None and opened == [] and stage.barriers == []


def test_due_waits_for_an_offer_above_the_target_and_the_interval() -> None:
    c = consistency(info())
    assert c is not None
    feed = BarrierFeed(info(), c)
    assert due(feed, 5.0) is None  # nothing offered
    feed.ts = 200
    assert due(feed, 5.0) == 0.0  # the first of the term: at once
    feed.applied, feed.last_apply = 200, 5.0
    assert due(feed, 5.2) is None  # applied already
    feed.ts = 300
    assert due(feed, 5.2) == pytest.approx(0.8)  # one interval after the last apply
    assert due(feed, 6.0) == 0.0
    feed.next_try = 9.0  # backing off after a failure
    assert due(feed, 6.0) == pytest.approx(3.0)


def test_latest_offer_wins_once_per_interval() -> None:
    stage, clock = MemoryStage(), Clock()
    coord, opened = coordinator(stage, clock)
    coord.offer(info(), 200, 2.0)
    assert coord.apply_due() is None
    assert stage.barriers == [("cf", 200, False)] and coord.applied("cf") == 200
    for ts in (250, 300, 280):  # 280 after 300: older, ignored
        coord.offer(info(), ts, float(ts))
    clock.now += 0.4
    assert coord.apply_due() == pytest.approx(0.6)  # not before the interval
    assert len(stage.barriers) == 1
    clock.now += 0.6
    coord.apply_due()
    assert stage.barriers == [("cf", 200, False), ("cf", 300, False)]
    coord.offer(info(), 300, 300.0)  # the same point again: nothing to do
    clock.now += 5
    assert coord.apply_due() is None and len(stage.barriers) == 2 and len(opened) == 1


def test_failures_back_off_and_persisting_ones_are_a_divergence_warning() -> None:
    stage, clock = MemoryStage(), Clock()
    failing = [True]
    coord, opened = coordinator(stage, clock, failing)
    coord.offer(info(), 200, 2.0)
    waits = []
    for _ in range(5):
        waits.append(coord.apply_due())
        clock.now += waits[-1] or 0
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]  # exponential up to retry_max
    assert stage.barriers == [] and coord.warnings("cf") == []  # 23 s: not yet
    clock.now += 8
    coord.apply_due()
    (w,) = coord.warnings("cf")
    assert (w.code, w.severity, w.table) == (WARNING_CODE, WarningSeverity.DIVERGENCE, "*")
    assert "staged up to 200" in w.message and "went away" in w.message
    assert all(s.closed for s in opened)  # a failed sink is reopened, never reused
    failing[0] = False
    clock.now += 8
    coord.apply_due()
    assert stage.barriers == [("cf", 200, False)]
    (w,) = coord.warnings("cf")  # the owner keeps the stored warning: it must say that the outage ended
    assert w.code == WARNING_CODE and "applied again since then (barrier 200)" in w.message


def test_a_recreated_changefeed_starts_afresh_and_forget_drops_it() -> None:
    stage, clock = MemoryStage(), Clock()
    coord, opened = coordinator(stage, clock)
    coord.offer(info(), 900, 9.0)
    coord.apply_due()
    coord.offer(info(start_ts=1000), 1100, 11.0)  # same id, a new changefeed: its own origin
    clock.now += 5
    coord.apply_due()
    assert stage.barriers == [("cf", 900, False), ("cf", 1100, False)]
    assert stage.applied["cf"] == (1000, 1100)
    assert opened[0].closed
    coord.forget("cf")
    assert coord.applied("cf") == 0 and opened[1].closed


ACCT = TableSchema(TableName("public", "acct"), (ColumnSchema("id", 23, "int4", is_key=True),
                                                 ColumnSchema("balance", 20, "int8")), ("id",))


def test_readers_see_whole_barriers_only() -> None:
    """Spans stage (twins), the coordinator applies the changefeed checkpoint: what is visible is exactly the
    transactions at or below the last barrier, whichever span staged them."""
    stage, clock = MemoryStage(), Clock()
    spans = []
    for i in range(3):
        s = MemoryBarrierSink(stage)
        s.stage_barriers()
        s.open_position("cf", i, 100)
        spans.append(s)
    for ts in range(110, 200, 10):  # each transaction touches two spans
        for i in (ts // 10 % 3, (ts // 10 + 1) % 3):
            spans[i].write([RowChange(OpType.UPDATE, ACCT, ts, float(ts), values={"id": i, "balance": ts})])
    assert stage.visible == []
    coord, _ = coordinator(stage, clock, None)
    coord.offer(info(), 150, 15.0)
    coord.apply_due()
    assert sorted({c.commit_ts for c in stage.visible}) == [110, 120, 130, 140, 150]
    assert all(len([c for c in stage.visible if c.commit_ts == ts]) == 2 for ts in range(110, 160, 10))
    clock.now += 1
    coord.offer(info(), 190, 19.0)
    coord.apply_due()
    assert [c.commit_ts for c in stage.visible] == sorted(c.commit_ts for c in stage.visible)
    assert len(stage.visible) == 18 and stage.staged == []


def test_a_config_changed_to_another_mode_is_read_again() -> None:
    """(A changed config is a new dict: never taken for the one parsed before.)"""
    stage, clock = MemoryStage(), Clock()
    coord, _ = coordinator(stage, clock)
    coord.offer(info({}), 200, 2.0)
    coord.apply_due()
    assert stage.barriers == []
    coord.offer(info(dict(SNAPSHOT)), 300, 3.0)
    coord.apply_due()
    assert stage.barriers == [("cf", 300, False)]
