"""The owner's decisions as a pure function over hand-built snapshots, with an injected clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cdc.meta.store import ClusterSnapshot, Versioned
from cdc.model import (
    CaptureInfo,
    ChangefeedInfo,
    ChangefeedStatus,
    FeedState,
    RunningError,
    SpanAssignment,
    SpanInfo,
    SpanStatus,
)
from owner.reconcile import Assign, DropChangefeed, PutStatus, Unassign, UpdateInfo, reconcile

pytestmark = pytest.mark.unit

NOW = 1_000_000.0


def cf(state: FeedState = FeedState.NORMAL, spans: int = 2, **kw: object) -> ChangefeedInfo:
    return ChangefeedInfo(id="cf", upstream_uri="postgresql://u@h/db", sink_uri="blackhole://", config={},
                          start_ts=100, start_time=NOW - 100, create_time=NOW - 100,
                          spans=tuple(SpanInfo(i, f"slot{i}", f"pub{i}", 100) for i in range(spans)),
                          state=state, state_since=kw.pop("state_since", NOW - 50), **kw)  # type: ignore[arg-type]


def snap(info: ChangefeedInfo, captures: tuple[str, ...] = ("a", "b"), assignments: dict | None = None,
         span_statuses: dict | None = None, status: ChangefeedStatus | None = None) -> ClusterSnapshot:
    s = ClusterSnapshot(revision=10)
    s.captures = {c: CaptureInfo(c, f"{c}:1", "v", NOW) for c in captures}
    s.changefeeds = {"cf": Versioned(info, 7)}
    s.assignments = {"cf": assignments or {}}
    s.span_statuses = {"cf": span_statuses or {}}
    if status is not None:
        s.statuses = {"cf": status}
    return s


def span_status(ck: int, rs: int, error: RunningError | None = None, capture: str = "a") -> SpanStatus:
    return SpanStatus(capture, 1, ck, float(ck), rs, float(rs), True, error)


def test_spans_are_spread_over_least_loaded_captures() -> None:
    actions = reconcile(snap(cf(spans=2)), NOW)
    assigns = [a for a in actions if isinstance(a, Assign)]
    assert sorted(a.assignment.capture_id for a in assigns) == ["a", "b"]
    assert all(a.assignment.epoch == 1 and a.previous is None for a in assigns)


def test_span_of_dead_capture_moves_with_higher_epoch() -> None:
    s = snap(cf(spans=1), captures=("b",), assignments={0: SpanAssignment("a", 3)})
    (assign,) = [a for a in reconcile(s, NOW) if isinstance(a, Assign)]
    assert assign.assignment == SpanAssignment("b", 4)
    assert assign.previous == SpanAssignment("a", 3)


def test_live_assignment_is_kept() -> None:
    s = snap(cf(spans=1), assignments={0: SpanAssignment("a", 1)})
    assert not [a for a in reconcile(s, NOW) if isinstance(a, Assign)]


def test_no_capture_no_assignment() -> None:
    assert not [a for a in reconcile(snap(cf(spans=1), captures=()), NOW) if isinstance(a, Assign)]


@pytest.mark.parametrize("state", [FeedState.STOPPED, FeedState.FAILED, FeedState.FINISHED])
def test_stopped_changefeeds_lose_their_assignments_in_two_phases(state: FeedState) -> None:
    a = SpanAssignment("a", 1)
    s = snap(cf(state, spans=1), assignments={0: a})
    assert reconcile(s, NOW) == [Assign("cf", 0, SpanAssignment("a", 1, stopping=True), a)]
    stopping = SpanAssignment("a", 1, stopping=True)
    s = snap(cf(state, spans=1), assignments={0: stopping}, span_statuses={0: span_status(5, 5)})
    assert reconcile(s, NOW) == [], "still running: wait for the holder to confirm"
    confirmed = SpanStatus("a", 1, 5, 5.0, 5, 5.0, running=False)
    s = snap(cf(state, spans=1), assignments={0: stopping}, span_statuses={0: confirmed})
    assert reconcile(s, NOW) == [Unassign("cf", 0, stopping)]


def test_stopped_changefeed_on_dead_capture_is_unassigned_at_once() -> None:
    a = SpanAssignment("gone", 1)
    assert reconcile(snap(cf(FeedState.STOPPED, spans=1), assignments={0: a}), NOW) == [Unassign("cf", 0, a)]


def test_remove_unassigns_first_then_drops_after_grace() -> None:
    info = cf(FeedState.REMOVED, spans=1, state_since=NOW - 1)
    stopping = SpanAssignment("a", 1, stopping=True)
    confirmed = SpanStatus("a", 1, 5, 5.0, 5, 5.0, running=False)
    assert reconcile(snap(info, assignments={0: stopping}, span_statuses={0: confirmed}), NOW) == [
        Unassign("cf", 0, stopping)]
    assert reconcile(snap(info), NOW) == []  # processors get time to stop
    assert reconcile(snap(info), NOW + 5) == [DropChangefeed("cf", info)]


def test_draining_capture_hands_its_span_over_in_two_phases() -> None:
    s = snap(cf(spans=1), assignments={0: SpanAssignment("a", 1)}, span_statuses={0: span_status(5, 5)})
    s.captures["a"] = CaptureInfo("a", "a:1", "v", NOW, draining=True)
    (mark,) = [x for x in reconcile(s, NOW) if isinstance(x, Assign)]
    assert mark.assignment == SpanAssignment("a", 1, stopping=True)
    s.assignments["cf"][0] = mark.assignment
    assert not [x for x in reconcile(s, NOW) if isinstance(x, Assign)], "not before the holder confirms"
    s.span_statuses["cf"][0] = SpanStatus("a", 1, 5, 5.0, 5, 5.0, running=False)
    (move,) = [x for x in reconcile(s, NOW) if isinstance(x, Assign)]
    assert move.assignment == SpanAssignment("b", 2)


def test_a_joining_capture_gets_spans_by_rebalancing_one_at_a_time() -> None:
    info = cf(spans=4)
    assigns = {i: SpanAssignment("a", 1) for i in range(4)}
    s = snap(info, captures=("a", "b"), assignments=assigns,
             span_statuses={i: span_status(5, 5) for i in range(4)})
    moves = [x for x in reconcile(s, NOW) if isinstance(x, Assign)]
    assert moves == [Assign("cf", 0, SpanAssignment("a", 1, stopping=True), SpanAssignment("a", 1))]
    # while one move is in flight, no other starts
    s.assignments["cf"][0] = moves[0].assignment
    assert not [x for x in reconcile(s, NOW) if isinstance(x, Assign)]
    s.span_statuses["cf"][0] = SpanStatus("a", 1, 5, 5.0, 5, 5.0, running=False)
    (done,) = [x for x in reconcile(s, NOW) if isinstance(x, Assign)]
    assert done.assignment == SpanAssignment("b", 2)


def test_balanced_cluster_does_not_move() -> None:
    assigns = {0: SpanAssignment("a", 1), 1: SpanAssignment("b", 1), 2: SpanAssignment("a", 1)}
    s = snap(cf(spans=3), assignments=assigns, span_statuses={i: span_status(5, 5) for i in range(3)})
    assert not [x for x in reconcile(s, NOW) if isinstance(x, Assign)]


def test_global_watermarks_are_minimums_and_never_go_back() -> None:
    old = ChangefeedStatus(150, 150.0, 160, 160.0, NOW - 1)
    s = snap(cf(), assignments={0: SpanAssignment("a", 1), 1: SpanAssignment("b", 1)},
             span_statuses={0: span_status(200, 300), 1: span_status(180, 250)}, status=old)
    (put,) = [a for a in reconcile(s, NOW) if isinstance(a, PutStatus)]
    assert (put.status.checkpoint_ts, put.status.resolved_ts) == (180, 250)
    # a span reporting an older checkpoint (e.g. restarted elsewhere) does not pull the global one back
    s.statuses["cf"] = put.status
    s.span_statuses["cf"][1] = span_status(170, 170)
    assert not [a for a in reconcile(s, NOW) if isinstance(a, PutStatus)]


def test_a_span_waiting_at_a_ddl_barrier_counts_as_just_below_it() -> None:
    """A span waiting at a DDL of commit Ts 190 wrote everything before it but keeps its checkpoint (160) a safe
    restart point: the changefeed checkpoint counts it as 189 (SpanStatus.covered_ts), and keeps that after the span
    restarted from 160."""
    waiting = replace(span_status(160, 300), barrier_ts=190, barrier_seq=0)
    assert waiting.covered_ts == 189 and span_status(160, 300).covered_ts == 160
    s = snap(cf(), assignments={0: SpanAssignment("a", 1), 1: SpanAssignment("b", 1)},
             span_statuses={0: span_status(200, 300), 1: waiting})
    (put,) = [a for a in reconcile(s, NOW) if isinstance(a, PutStatus)]
    assert put.status.checkpoint_ts == 189
    s.statuses["cf"] = put.status
    s.span_statuses["cf"][1] = span_status(160, 300)  # restarted: not waiting (yet)
    assert not [a for a in reconcile(s, NOW) if isinstance(a, PutStatus)]


def test_watermarks_wait_for_every_span() -> None:
    s = snap(cf(), span_statuses={0: span_status(200, 300)})
    assert not [a for a in reconcile(s, NOW) if isinstance(a, PutStatus)]


def _state_change(s: ClusterSnapshot, now: float = NOW) -> ChangefeedInfo | None:
    changes = [a for a in reconcile(s, now) if isinstance(a, UpdateInfo)]
    assert all(c.expected_mod == 7 for c in changes)  # CAS on the revision that was read
    return changes[0].info if changes else None


def test_retryable_error_means_warning_then_normal_again() -> None:
    err = RunningError("CDC:ErrSinkUnavailable", "sink down", NOW, "a", 0, True)
    new = _state_change(snap(cf(), span_statuses={0: span_status(1, 1, err)}))
    assert new is not None and new.state is FeedState.WARNING and new.error == err
    healed = _state_change(snap(new, span_statuses={0: span_status(5, 5)}))
    assert healed is not None and healed.state is FeedState.NORMAL and healed.error is None


def test_fatal_error_fails_at_once() -> None:
    err = RunningError("CDC:ErrSlotLost", "slot gone", NOW, "a", 0, False)
    new = _state_change(snap(cf(), span_statuses={0: span_status(1, 1, err)}))
    assert new is not None and new.state is FeedState.FAILED and new.error == err


def test_warning_stuck_too_long_fails() -> None:
    err = RunningError("CDC:ErrSinkUnavailable", "sink down", NOW, "a", 0, True)
    info = cf(FeedState.WARNING, error=err, state_since=NOW - 10)
    assert _state_change(snap(info, span_statuses={0: span_status(1, 1, err)}), NOW) is None
    failed = _state_change(snap(info, span_statuses={0: span_status(1, 1, err)}), NOW + 3600)
    assert failed is not None and failed.state is FeedState.FAILED and "stuck" in failed.error.message


def test_target_ts_finishes() -> None:
    info = cf(spans=1, target_ts=500)
    s = snap(info, span_statuses={0: span_status(600, 600)})
    new = _state_change(s)
    assert new is not None and new.state is FeedState.FINISHED


def test_errors_from_before_a_resume_are_history() -> None:
    err = RunningError("CDC:ErrSinkFatal", "bad table", NOW - 30, "a", 0, False)
    info = cf(spans=1, resumed_at=NOW - 10)
    assert _state_change(snap(info, span_statuses={0: span_status(1, 1, err)})) is None
    fresh = RunningError("CDC:ErrSinkFatal", "bad table", NOW - 1, "a", 0, False)
    failed = _state_change(snap(info, span_statuses={0: span_status(1, 1, fresh)}))
    assert failed is not None and failed.state is FeedState.FAILED
