"""The owner's upstream protection decisions (pure, injected clock) and the watcher's bookkeeping."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cdc.errors import GCTTLExceeded, SlotLost, UpstreamUnavailable
from cdc.events import TableName
from cdc.model import ChangefeedInfo, FeedState, RunningError, SpanInfo, WarningSeverity
from owner.table_pickup import filter_rules, ineligible_table_warning, unreplicated_rows_warning
from owner.upstream_watch import (
    FailSlotLost,
    ReleaseAfterGcTtl,
    SlotReport,
    UpstreamReport,
    UpstreamWatcher,
    can_resume,
    decide,
    is_released,
    mark_released,
    report_warnings,
)
from sinks.factory import SinkFactory
from upstream import open_upstream

pytestmark = pytest.mark.unit

NOW = 1_000_000.0
DAY = 86400.0


def cf(state: FeedState = FeedState.NORMAL, since: float = NOW - 100, spans: int = 2,
       error: RunningError | None = None, **kw: Any) -> ChangefeedInfo:
    return ChangefeedInfo(id="cf", upstream_uri="postgresql://u@127.0.0.1:1/db", sink_uri="blackhole://",
                          config={"span_count": spans, "filter": {"rules": ["public.*"]}}, start_ts=100,
                          start_time=NOW - DAY * 10, create_time=NOW - DAY * 10,
                          spans=tuple(SpanInfo(i, f"slot{i}", f"pub{i}", 100) for i in range(spans)),
                          state=state, error=error, state_since=since, **kw)


def slot(span: int, *, exists: bool = True, lost: bool = False, pub: bool = True,
         retained: int | None = 4096) -> SlotReport:
    return SlotReport(span, f"slot{span}", exists, exists, retained if exists and not lost else None,
                      200 if exists else None, ("lost" if lost else "reserved") if exists else None, lost,
                      f"pub{span}", pub, "wal_removed" if lost else None)


def report(*slots: SlotReport, at: float = NOW - 1, **kw: Any) -> UpstreamReport:
    return UpstreamReport("cf", at, tuple(slots) or (slot(0), slot(1)), **kw)


# ---- running changefeeds ------------------------------------------------------------------------------
def test_running_with_healthy_slots_needs_nothing() -> None:
    assert decide(cf(), report(), NOW, DAY) is None
    assert decide(cf(FeedState.WARNING), report(), NOW, DAY) is None


def test_slot_disappeared_under_running_changefeed_fails_loudly() -> None:
    d = decide(cf(), report(slot(0), slot(1, exists=False)), NOW, DAY)
    assert isinstance(d, FailSlotLost)
    assert "'slot1'" in d.reason and "disappeared" in d.reason
    assert "failover" in d.reason and "checkpoint may be gone" in d.reason and "create it again" in d.reason
    assert "slot0" not in d.reason
    err = d.running_error(NOW)
    assert (err.code, err.retryable, err.time) == (SlotLost.code, False, NOW)


def test_invalidated_slot_under_running_changefeed_fails() -> None:
    d = decide(cf(FeedState.WARNING), report(slot(0, lost=True), slot(1)), NOW, DAY)
    assert isinstance(d, FailSlotLost)
    assert "invalidated" in d.reason and "wal_removed" in d.reason


def test_dropped_publication_under_running_changefeed_fails() -> None:
    d = decide(cf(), report(slot(0, pub=False), slot(1)), NOW, DAY)
    assert isinstance(d, FailSlotLost)
    assert "'pub0'" in d.reason


def test_missing_slot_of_stopped_changefeed_within_gc_ttl_is_not_a_failure() -> None:
    assert decide(cf(FeedState.STOPPED), report(slot(0, exists=False), slot(1)), NOW, DAY) is None


def test_lost_slot_outranks_warnings() -> None:
    r = report(slot(0, exists=False), slot(1), ineligible=("public.nokey has no primary key",),
               unreplicated=("public.x",))
    assert isinstance(decide(cf(), r, NOW, DAY), FailSlotLost)


def test_ineligible_and_unreplicated_tables_are_data_warnings_not_decisions() -> None:
    """They never fail the changefeed (decide() ignores them): they are DataWarnings of the report, which the
    owner stores in the changefeed's status (a divergence moves it to warning)."""
    msg = 'public.nokey has no primary key and REPLICA IDENTITY DEFAULT; fix with ALTER TABLE ...'
    warnings = [ineligible_table_warning(TableName("public", "nokey"), msg, NOW - 1),
                unreplicated_rows_warning(TableName("public", "b"), 42, "pub1", NOW - 1)]
    r = report(new_tables=("public.a", "public.b"), unreplicated=("public.b",), ineligible=(msg,), warnings=warnings)
    assert decide(cf(), r, NOW, DAY) is None
    inel, rows = report_warnings(cf(), r)
    assert (inel.code, inel.table, inel.severity, inel.count) == ("CDC:WarnTableIneligible", "public.nokey",
                                                                  WarningSeverity.DIVERGENCE, 1)
    assert msg in inel.message and "exclude it with the filter" in inel.message
    assert (rows.code, rows.table, rows.severity, rows.count) == ("CDC:WarnUnreplicatedRows", "public.b",
                                                                  WarningSeverity.DIVERGENCE, 42)
    assert "42 row(s)" in rows.message and "pub1" in rows.message
    assert "at least 100000" in unreplicated_rows_warning(TableName("public", "b"), 100_000, "p", NOW).message


def test_report_warnings_ignore_failed_foreign_and_acknowledged_reports() -> None:
    w = [unreplicated_rows_warning(TableName("public", "b"), 3, "pub1", NOW - 10)]
    assert report_warnings(cf(), None) == []
    assert report_warnings(cf(), report(warnings=w, error="unreachable")) == []
    assert report_warnings(cf(), dataclasses.replace(report(warnings=w), changefeed="other")) == []
    assert report_warnings(cf(resumed_at=NOW - 5), report(warnings=w)) == []  # acknowledged by resume
    assert report_warnings(cf(resumed_at=NOW - 20), report(warnings=w)) == w


def test_new_table_without_rows_needs_nothing() -> None:
    assert decide(cf(), report(new_tables=("public.a",)), NOW, DAY) is None


# ---- gc-ttl -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", [FeedState.STOPPED, FeedState.FAILED])
def test_stopped_or_failed_past_gc_ttl_releases(state: FeedState) -> None:
    info = cf(state, since=NOW - DAY - 5, error=RunningError("CDC:ErrSinkFatal", "bad row", NOW - DAY - 5,
                                                            retryable=False) if state is FeedState.FAILED else None)
    d = decide(info, report(), NOW, DAY)
    assert isinstance(d, ReleaseAfterGcTtl)
    assert "gc-ttl" in d.reason and "released" in d.reason and "create it again" in d.reason
    assert "slot0" in d.reason and "slot1" in d.reason and state.value in d.reason
    if state is FeedState.FAILED:
        assert "bad row" in d.reason
    err = d.running_error(NOW)
    assert (err.code, err.retryable) == (GCTTLExceeded.code, False)


def test_stopped_within_gc_ttl_keeps_its_slots() -> None:
    assert decide(cf(FeedState.STOPPED, since=NOW - DAY + 5), report(), NOW, DAY) is None
    # the threshold follows the configured gc-ttl
    assert isinstance(decide(cf(FeedState.STOPPED, since=NOW - 61), report(), NOW, 60.0), ReleaseAfterGcTtl)


def test_failed_past_gc_ttl_with_slots_already_gone_needs_nothing() -> None:
    gone = report(slot(0, exists=False), slot(1, exists=False))
    released = mark_released(cf(FeedState.STOPPED, since=NOW - 2 * DAY),
                             ReleaseAfterGcTtl("released after gc-ttl"), NOW - DAY - 10)
    assert decide(released, gone, NOW, DAY) is None
    # slots dropped by someone else while it failed: nothing left to release either
    assert decide(cf(FeedState.FAILED, since=NOW - 2 * DAY), gone, NOW, DAY) is None


def test_released_changefeed_whose_slots_survived_is_released_again() -> None:
    released = mark_released(cf(FeedState.STOPPED, since=NOW - 2 * DAY),
                             ReleaseAfterGcTtl("released after gc-ttl"), NOW - 30)
    d = decide(released, report(slot(0, exists=False), slot(1)), NOW, DAY)
    assert isinstance(d, ReleaseAfterGcTtl)


def test_running_finished_and_removed_are_never_released() -> None:
    for state in (FeedState.NORMAL, FeedState.FINISHED, FeedState.REMOVED):
        assert not isinstance(decide(cf(state, since=NOW - 5 * DAY), report(), NOW, DAY), ReleaseAfterGcTtl)


# ---- report validity ----------------------------------------------------------------------------------
def test_no_report_or_failed_inspection_decides_nothing() -> None:
    info = cf(FeedState.STOPPED, since=NOW - 2 * DAY)
    assert decide(info, None, NOW, DAY) is None
    assert decide(info, UpstreamReport("cf", NOW - 1, (), error="cannot connect"), NOW, DAY) is None


def test_report_older_than_the_current_state_is_ignored() -> None:
    # e.g. the report of a removed changefeed whose id was reused: its slots were gone then
    stale = report(slot(0, exists=False), slot(1, exists=False), at=NOW - 20)
    assert decide(cf(since=NOW - 10), stale, NOW, DAY) is None
    fresh = dataclasses.replace(stale, checked_at=NOW - 5)
    assert isinstance(decide(cf(since=NOW - 10), fresh, NOW, DAY), FailSlotLost)


# ---- resume -------------------------------------------------------------------------------------------
def test_can_resume() -> None:
    assert can_resume(cf(FeedState.STOPPED)) is None
    failed = cf(FeedState.FAILED, error=RunningError("CDC:ErrSinkFatal", "bad row", NOW, retryable=False))
    assert can_resume(failed) is None
    by_code = cf(FeedState.FAILED, error=RunningError(GCTTLExceeded.code, "stopped for 90000s", NOW,
                                                      retryable=False))
    assert is_released(by_code)
    reason = can_resume(by_code)
    assert reason is not None and "gc-ttl" in reason and "stopped for 90000s" in reason
    assert "create it again" in reason


def test_mark_released_sets_failed_with_the_reason() -> None:
    info = cf(FeedState.STOPPED, since=NOW - 2 * DAY, retries=3)
    d = ReleaseAfterGcTtl("upstream position released")
    new = mark_released(info, d, NOW)
    assert new.state is FeedState.FAILED and new.state_since == NOW and new.retries == 0
    assert new.error is not None and new.error.code == GCTTLExceeded.code
    assert new.error.message == "upstream position released"
    if any(f.name == "released" for f in dataclasses.fields(ChangefeedInfo)):
        assert new.released  # type: ignore[attr-defined]
        # the flag alone (no error) is enough to refuse a resume
        assert can_resume(dataclasses.replace(new, error=None)) is not None
    assert can_resume(new) is not None


def test_filter_rules_from_stored_config() -> None:
    assert filter_rules(cf()) == ("public.*",)
    assert filter_rules(dataclasses.replace(cf(), config={})) == ("*.*",)


# ---- watcher bookkeeping ------------------------------------------------------------------------------
class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_unreachable_upstream_is_reported_not_raised_and_rate_limited() -> None:
    calls: list[str] = []

    def opener(uri: str) -> Any:
        calls.append(uri)
        raise UpstreamUnavailable("cannot connect to PostgreSQL 127.0.0.1:1/db: refused")

    clock = Clock(NOW)
    w = UpstreamWatcher(open_upstream, SinkFactory(), interval=10.0, gc_ttl=DAY, clock=clock, opener=opener)
    info = cf()
    assert w.due("cf", NOW) and w.latest("cf") is None
    r = w.inspect(info)
    assert r.error and "refused" in r.error and r.slots == () and r.checked_at == NOW
    assert w.latest("cf") == r and w.reports() == [r]
    assert not w.due("cf", NOW + 9.9) and w.due("cf", NOW + 10)
    assert w.decide(info, NOW) is None

    clock.t = NOW + 5
    assert w.poll([info]) == [] and len(calls) == 1  # not due yet
    clock.t = NOW + 10
    assert len(w.poll([info, dataclasses.replace(info, id="gone", state=FeedState.REMOVED)])) == 1
    assert len(calls) == 2 and w.latest("gone") is None

    w.retain(["other"])
    assert w.latest("cf") is None and w.due("cf", NOW + 10)


def test_watcher_bug_becomes_an_error_report() -> None:
    class BrokenUpstream:
        def span_tables(self, span: Any) -> Any:
            raise RuntimeError("boom")

        def close(self) -> None:
            pass

    w = UpstreamWatcher(open_upstream, SinkFactory(), clock=Clock(NOW), opener=lambda uri: BrokenUpstream())  # type: ignore[arg-type,return-value]
    r = w.inspect(cf())
    assert "boom" in r.error
    w.forget("cf")
    assert w.reports() == []


def test_watcher_keeps_warnings_found_once_until_forgotten() -> None:
    """Rows of a table are reported only by the inspection that added it: a later inspection must not make
    the owner miss them; a condition found again is one warning (the newest); acknowledged ones are left out."""
    clock = [NOW]
    rows = unreplicated_rows_warning(TableName("public", "late"), 3, "pub1", NOW)
    inel = ineligible_table_warning(TableName("public", "nokey"), "no key", NOW)
    script = [report(warnings=[rows, inel]), report(warnings=[]),
              report(warnings=[dataclasses.replace(inel, first_time=NOW + 2)])]
    watcher = UpstreamWatcher(open_upstream, SinkFactory(), clock=lambda: clock[0],
                              look=lambda info, started: script.pop(0))
    info = cf()
    for _ in range(3):
        watcher.inspect(info)
        clock[0] += 1
    found = watcher.found_warnings(info)
    assert [(w.table, w.first_time) for w in found] == [("public.late", NOW), ("public.nokey", NOW + 2)]
    assert [w.table for w in watcher.found_warnings(cf(resumed_at=NOW + 1))] == ["public.nokey"]
    watcher.forget("cf")
    assert watcher.found_warnings(info) == []
