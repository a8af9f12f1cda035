"""Data warnings on the owner side (pure reconcile over hand-built snapshots, injected clock): span and
upstream warnings aggregate into ChangefeedStatus.warnings; a divergence moves normal -> warning and keeps
it there (never failed) until resume acknowledges it; notices leave the state alone."""

from __future__ import annotations

import pytest

from cdc import serde
from cdc.model import (
    ChangefeedInfo,
    ChangefeedStatus,
    DataWarning,
    FeedState,
    RunningError,
    SpanAssignment,
    SpanStatus,
    WarningSeverity,
)
from owner.reconcile import PutStatus, UpdateInfo, checkpoint_actions, reconcile, refresh_warnings
from tests.unit.owner.test_reconcile import NOW, cf, snap

pytestmark = pytest.mark.unit

DIV, NOTE = WarningSeverity.DIVERGENCE, WarningSeverity.NOTICE
ASSIGNED = {0: SpanAssignment("a", 1), 1: SpanAssignment("b", 1)}


def w(table: str = "public.t", code: str = "CDC:WarnMissingRow", severity: WarningSeverity = DIV, count: int = 1,
      t: float = NOW - 10, keys: tuple[str, ...] = ("1",)) -> DataWarning:
    return DataWarning(code, table, f"{count} row(s) of {table}", severity, count, keys, first_time=t)


def ss(*warnings: DataWarning, error: RunningError | None = None, capture: str = "a") -> SpanStatus:
    return SpanStatus(capture, 1, 200, 200.0, 200, 200.0, True, error, warnings=warnings)


def run(info: ChangefeedInfo, spans: dict[int, SpanStatus], status: ChangefeedStatus | None = None,
        now: float = NOW, **kw: object) -> tuple[ChangefeedStatus | None, ChangefeedInfo | None]:
    actions = reconcile(snap(info, assignments=ASSIGNED, span_statuses=spans, status=status), now, **kw)  # type: ignore[arg-type]
    put = next((a.status for a in actions if isinstance(a, PutStatus)), None)
    upd = next((a.info for a in actions if isinstance(a, UpdateInfo)), None)
    return put, upd


def test_span_warnings_aggregate_and_a_divergence_moves_normal_to_warning() -> None:
    spans = {0: ss(w("public.a", count=2, keys=("1", "2"))), 1: ss(w("public.b", severity=NOTE, t=NOW - 5),
                                                                   capture="b")}
    status, info = run(cf(), spans)
    assert status is not None and [(x.table, x.count, x.severity) for x in status.warnings] == [
        ("public.a", 2, DIV), ("public.b", 1, NOTE)]
    assert info is not None and info.state is FeedState.WARNING
    assert info.error is not None and info.error.data_warning and info.error.code == "CDC:WarnMissingRow"
    assert "public.a" in info.error.message and "2 row(s) of public.a" in info.error.message
    assert "1 more" not in info.error.message  # the notice does not count as a divergence


def test_notice_warnings_are_shown_but_leave_the_state_normal() -> None:
    status, info = run(cf(), {0: ss(w(severity=NOTE)), 1: ss(capture="b")})
    assert status is not None and [x.severity for x in status.warnings] == [NOTE]
    assert info is None


def test_a_divergence_keeps_warning_and_never_fails_however_long() -> None:
    first, info = run(cf(), {0: ss(w()), 1: ss(capture="b")})
    assert info is not None and first is not None
    later, again = run(info, {0: ss(w()), 1: ss(capture="b")}, first, now=NOW + 10 * 1800, stuck_duration=1800)
    assert later is None and again is None  # nothing to write, still warning


def test_resume_acknowledges_the_warnings_and_the_state_returns_to_normal() -> None:
    _, warned = run(cf(), {0: ss(w()), 1: ss(capture="b")})
    assert warned is not None
    # `cdc cli changefeed resume` sets normal and resumed_at = now (capture/changefeeds.py)
    resumed = warned.with_state(FeedState.NORMAL, error=None, now=NOW + 1, resumed_at=NOW + 1)
    stored = ChangefeedStatus(200, 200.0, 200, 200.0, NOW, warnings=(w(),))
    status, info = run(resumed, {0: ss(w()), 1: ss(capture="b")}, stored, now=NOW + 2)
    assert status is not None and status.warnings == ()
    assert info is None  # stays normal
    # a new occurrence after the resume is a new warning
    status, info = run(resumed, {0: ss(w(t=NOW + 3)), 1: ss(capture="b")}, stored, now=NOW + 4)
    assert status is not None and [x.seen for x in status.warnings] == [NOW + 3]
    assert info is not None and info.state is FeedState.WARNING


def test_a_span_error_outranks_the_data_warning_and_its_stuck_time_starts_with_it() -> None:
    _, warned = run(cf(), {0: ss(w()), 1: ss(capture="b")})
    assert warned is not None
    err = RunningError("CDC:ErrSinkUnavailable", "sink down", NOW + 100, "a", 0)
    _, erroring = run(warned, {0: ss(w(), error=err), 1: ss(capture="b")}, now=NOW + 5000, stuck_duration=1800)
    assert erroring is not None and erroring.state is FeedState.WARNING and erroring.error == err
    assert erroring.state_since == NOW + 5000  # not failed as "stuck" because of the data warning's age
    _, back = run(erroring, {0: ss(w()), 1: ss(capture="b")}, now=NOW + 5001)
    assert back is not None and back.state is FeedState.WARNING and back.error is not None
    assert back.error.data_warning


def test_upstream_warnings_are_stored_once_refreshed_and_survive_without_a_report() -> None:
    rows = w("public.new", code="CDC:WarnUnreplicatedRows", count=42, keys=())
    status, info = run(cf(), {0: ss(), 1: ss(capture="b")}, upstream_warnings={"cf": [rows]})
    assert status is not None and status.upstream_warnings == (rows,) and status.warnings == (rows,)
    assert info is not None and info.state is FeedState.WARNING
    # the same report again: nothing to write (idempotent, the count does not add up)
    again, _ = run(info, {0: ss(), 1: ss(capture="b")}, status, upstream_warnings={"cf": [rows]})
    assert again is None
    # a new owner without a report yet: the stored warning stays
    kept, _ = run(info, {0: ss(), 1: ss(capture="b")}, status)
    assert kept is None
    # the condition found again by a later inspection: refreshed, not counted twice
    refound = w("public.new", code="CDC:WarnUnreplicatedRows", count=42, keys=(), t=NOW - 1)
    fresh, _ = run(info, {0: ss(), 1: ss(capture="b")}, status, upstream_warnings={"cf": [refound]})
    assert fresh is not None
    (x,) = fresh.upstream_warnings
    assert (x.count, x.first_time, x.seen) == (42, NOW - 10, NOW - 1)


def test_a_left_out_table_that_joins_ends_its_warning_and_the_state_returns_to_normal() -> None:
    """WarnTableIneligible / WarnTargetNameConflict say a table is not in its publication: once a report finds it
    published they end without a resume (a new owner too: stored ones are dropped by the same rule). Other
    warnings of that table, and the same codes of other tables, stay."""
    left = w("public.nokey", code="CDC:WarnTableIneligible", keys=())
    clash = w("public.clash", code="CDC:WarnTargetNameConflict", keys=())
    rows = w("public.nokey", code="CDC:WarnUnreplicatedRows", count=3, keys=())
    status, info = run(cf(), {0: ss(), 1: ss(capture="b")}, upstream_warnings={"cf": [left, clash]},
                       published={"cf": frozenset({"public.other"})})
    assert status is not None and [x.table for x in status.warnings] == ["public.nokey", "public.clash"]
    assert info is not None and info.state is FeedState.WARNING
    # a report finds public.nokey published: its warning ends (also the one the watcher still hands in)
    healed, same = run(info, {0: ss(), 1: ss(capture="b")}, status, upstream_warnings={"cf": [left, clash]},
                       published={"cf": frozenset({"public.other", "public.nokey"})})
    assert healed is not None and [x.code for x in healed.warnings] == ["CDC:WarnTargetNameConflict"]
    assert same is not None and same.state is FeedState.WARNING  # still: the clash of public.clash holds
    assert same.error is not None and same.error.code == "CDC:WarnTargetNameConflict"
    # the clash excluded and the table added with rows nobody copies: that warning is a new one, not healed
    done, back = run(info, {0: ss(), 1: ss(capture="b")}, healed, upstream_warnings={"cf": [rows]},
                     published={"cf": frozenset({"public.nokey", "public.clash"})})
    assert done is not None and [(x.code, x.table) for x in done.warnings] == [("CDC:WarnUnreplicatedRows",
                                                                               "public.nokey")]
    # nothing left: normal again by itself
    clear, normal = run(info, {0: ss(), 1: ss(capture="b")}, healed, published={"cf": frozenset({"public.nokey",
                                                                                                "public.clash"})})
    assert clear is not None and clear.warnings == ()
    assert normal is not None and normal.state is FeedState.NORMAL and normal.error is None


def test_refresh_warnings_is_idempotent() -> None:
    a, b = w("public.a", t=1.0), w("public.b", t=2.0)
    once = refresh_warnings((), [a, b])
    assert refresh_warnings(once, [a, b]) == once == (a, b)


def test_stopped_changefeed_keeps_its_warnings_and_checkpoints_do_not_drop_them() -> None:
    rows = w("public.new", code="CDC:WarnUnreplicatedRows", count=3, keys=())
    status, info = run(cf(FeedState.STOPPED), {}, upstream_warnings={"cf": [rows]})
    assert status is not None and status.warnings == (rows,) and info is None
    # the owner's checkpoint aggregation between cycles carries the warnings along
    s = snap(cf(), assignments=ASSIGNED, span_statuses={0: ss(), 1: ss(capture="b")},
             status=ChangefeedStatus(100, 100.0, 100, 100.0, NOW, upstream_warnings=(rows,), warnings=(rows,)))
    (put,) = checkpoint_actions(s, NOW)
    assert put.status.checkpoint_ts == 200 and put.status.warnings == (rows,)


def test_status_with_warnings_round_trips_and_old_records_load() -> None:
    st = ChangefeedStatus(1, 1.0, 2, 2.0, 3.0, {"0": 5}, warnings=(w(),), upstream_warnings=(w(),))
    assert serde.from_json(ChangefeedStatus, serde.to_json(st)) == st
    old = serde.from_json(ChangefeedStatus, b'{"checkpoint_ts": 7, "retained_wal": {}}')
    assert old.warnings == () and old.upstream_warnings == ()
    err = serde.from_json(RunningError, b'{"code": "C", "message": "m"}')
    assert err.data_warning is False


def test_removed_changefeed_writes_no_status() -> None:
    actions = reconcile(snap(cf(FeedState.REMOVED), status=ChangefeedStatus()), NOW,
                        upstream_warnings={"cf": [w()]})
    assert not [a for a in actions if isinstance(a, PutStatus)]
