"""The owner's prompt checkpoint aggregation: checkpoint_actions (pure) and FlushPacer (injected clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc.meta.store import ClusterSnapshot, Versioned
from cdc.model import ChangefeedInfo, ChangefeedStatus, FeedState, SpanAssignment, SpanInfo, SpanStatus
from owner.reconcile import FlushPacer, PutStatus, checkpoint_actions, reconcile, stops_confirmed

pytestmark = pytest.mark.unit

NOW = 5000.0


def info(state: FeedState = FeedState.NORMAL, spans: int = 2) -> ChangefeedInfo:
    return ChangefeedInfo(id="cf", upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=1.0, create_time=1.0,
                          spans=tuple(SpanInfo(i, f"s{i}", f"p{i}", 100) for i in range(spans)), state=state)


def snap(i: ChangefeedInfo, cks: dict[int, int], old: ChangefeedStatus | None = None) -> ClusterSnapshot:
    s = ClusterSnapshot(revision=3, changefeeds={"cf": Versioned(i, 1)})
    s.span_statuses = {"cf": {k: SpanStatus("a", 1, v, float(v), v + 5, float(v + 5), True) for k, v in cks.items()}}
    if old is not None:
        s.statuses = {"cf": old}
    return s


def test_global_checkpoint_is_the_minimum_over_spans() -> None:
    (a,) = checkpoint_actions(snap(info(), {0: 300, 1: 250}, ChangefeedStatus(200, 200.0)), NOW)
    assert a == PutStatus("cf", ChangefeedStatus(250, 250.0, 255, 255.0, NOW))


def test_same_result_as_the_full_reconcile() -> None:
    s = snap(info(), {0: 300, 1: 250}, ChangefeedStatus(200, 200.0, retained_wal={"0": 5}))
    full = [a for a in reconcile(s, NOW) if isinstance(a, PutStatus)]
    assert checkpoint_actions(s, NOW) == full
    assert full[0].status.retained_wal == {"0": 5}, "the owner's other status fields are kept"


def test_never_backwards_and_nothing_when_unchanged() -> None:
    old = ChangefeedStatus(400, 400.0, 405, 405.0, NOW - 1)
    assert checkpoint_actions(snap(info(), {0: 300, 1: 350}, old), NOW) == []
    assert checkpoint_actions(snap(info(), {0: 400, 1: 400}, ChangefeedStatus(400, 400.0, 405, 405.0)), NOW) == []


def test_waits_for_every_span_and_skips_stopped_changefeeds() -> None:
    assert checkpoint_actions(snap(info(), {0: 300}, ChangefeedStatus(200, 200.0)), NOW) == []
    assert checkpoint_actions(snap(info(FeedState.STOPPED), {0: 300, 1: 300}, ChangefeedStatus(200, 200.0)),
                              NOW) == []


def test_pacer_fires_at_once_then_at_most_every_min_interval() -> None:
    p = FlushPacer(0.1)
    assert not p.due(10.0) and p.delay(10.0) is None, "nothing pending"
    p.notify()
    assert p.due(10.0) and p.delay(10.0) == 0.0, "the first change aggregates at once"
    p.done(10.0)
    p.notify()
    assert not p.due(10.04)
    assert p.delay(10.04) == pytest.approx(0.06)
    assert p.due(10.1)
    p.done(10.1)
    assert not p.due(11.0), "no change, no aggregation"


def test_pacer_bounds_aggregations_under_a_storm_of_changes() -> None:
    p = FlushPacer(0.1)
    fired = 0
    t = 0.0
    while t < 2.0:  # a span status change every 10 ms for 2 s
        p.notify()
        if p.due(t):
            p.done(t)
            fired += 1
        t += 0.01
    assert 19 <= fired <= 21


def test_full_cycle_resets_the_pacer() -> None:
    p = FlushPacer(0.1)
    p.notify()
    p.done(5.0)  # the full cycle covered the change
    assert not p.due(5.0) and p.delay(5.0) is None


def test_a_table_copy_holds_the_published_checkpoint_not_the_changefeed_checkpoint() -> None:
    """A span in a table copy reports ``hold_ts``: the changefeed checkpoint goes on (the span streams its other
    tables), the checkpoint published to the sink (Kafka watermarks, storage metadata) stays at the lowest hold until
    the copy is written, then catches up."""
    from dataclasses import replace

    from owner.reconcile import published_checkpoint

    s = snap(info(), {0: 300, 1: 250}, ChangefeedStatus(200, 200.0))
    s.span_statuses["cf"][0] = replace(s.span_statuses["cf"][0], hold_ts=220, hold_time=220.0)
    (a,) = checkpoint_actions(s, NOW)
    assert (a.status.checkpoint_ts, a.status.hold_ts) == (250, 220)
    assert published_checkpoint(a.status) == (220, 220.0)
    # the hold alone changes: a new status, so the owner offers the checkpoint it now may publish
    s = snap(info(), {0: 300, 1: 250}, a.status)
    (b,) = checkpoint_actions(s, NOW + 1)
    assert (b.status.checkpoint_ts, b.status.hold_ts) == (250, 0)
    assert published_checkpoint(b.status) == (250, 250.0)
    assert published_checkpoint(ChangefeedStatus(250, 250.0, hold_ts=300, hold_time=300.0)) == (250, 250.0)


def test_stops_confirmed_only_for_a_new_confirmation_of_a_stopping_assignment() -> None:
    base = ClusterSnapshot(revision=3, changefeeds={"cf": Versioned(info(), 1)},
                           assignments={"cf": {0: SpanAssignment("a", 4, stopping=True), 1: SpanAssignment("a", 4)}})
    base.span_statuses = {"cf": {0: SpanStatus("a", 4, 100, running=True), 1: SpanStatus("a", 4, 100, running=True)}}

    def newer(span: int, status: SpanStatus) -> ClusterSnapshot:
        return replace(base, span_statuses={"cf": {**base.span_statuses["cf"], span: status}})

    assert stops_confirmed(base, newer(0, SpanStatus("a", 4, 120, running=False)))
    assert not stops_confirmed(base, newer(0, SpanStatus("a", 4, 120, running=True))), "still running"
    assert not stops_confirmed(base, newer(0, SpanStatus("a", 3, 120, running=False))), "an older epoch"
    assert not stops_confirmed(base, newer(1, SpanStatus("a", 4, 120, running=False))), "not asked to stop"
    done = newer(0, SpanStatus("a", 4, 120, running=False))
    assert not stops_confirmed(done, done), "a confirmation the snapshot already holds is not new"


def test_pacer_aggregation_that_wrote_nothing_does_not_hold_back_the_next() -> None:
    # a resumed span first reports that it runs (nothing to write), then its first checkpoint: that one is
    # aggregated at once, not min_interval after the aggregation that wrote nothing
    p = FlushPacer(0.1)
    p.done(10.0)  # the full cycle that assigned the span
    p.notify()
    assert p.delay(10.01) == pytest.approx(0.09), "a change right after a cycle that wrote waits for the spacing"
    p.done(10.1, wrote=False)
    assert not p.due(10.12), "nothing pending"
    p.notify()
    assert p.due(10.12) and p.delay(10.12) == 0.0
    p.done(10.12)
    p.notify()
    assert not p.due(10.15), "after a write, the spacing holds"


def test_the_applied_barrier_is_kept_by_every_status_write() -> None:
    """(Snapshot mode: the owner sets barrier_ts on a write; later writes computed from that status keep it.)"""
    old = ChangefeedStatus(200, 200.0, barrier_ts=180, barrier_time=180.0)
    s = snap(info(), {0: 300, 1: 250}, old)
    (a,) = checkpoint_actions(s, NOW)
    assert (a.status.checkpoint_ts, a.status.barrier_ts, a.status.barrier_time) == (250, 180, 180.0)
    (full,) = [x for x in reconcile(s, NOW) if isinstance(x, PutStatus)]
    assert full.status.barrier_ts == 180
