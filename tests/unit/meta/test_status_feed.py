"""StatusFeed: span/changefeed statuses newer than the owner's snapshot, from watch events (fed directly)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cdc import serde
from cdc.errors import MetaStoreError
from cdc.meta import keys
from cdc.meta.kv import KV, WatchEvent, WatchResponse
from cdc.meta.status_feed import StatusFeed
from cdc.meta.store import ClusterSnapshot
from cdc.model import ChangefeedStatus, SpanStatus

pytestmark = pytest.mark.unit

C = "c1"


class FakeWatch:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeStore:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started: list[int | None] = []
        self.watches: list[FakeWatch] = []
        self.on_error: Callable[[MetaStoreError], None] | None = None

    def watch(self, start: int | None, cb: Any, on_error: Any) -> FakeWatch:
        if self.fail:
            raise MetaStoreError("etcd down")
        self.started.append(start)
        self.on_error = on_error
        self.watches.append(FakeWatch())
        return self.watches[-1]


def span_put(cf: str, span: int, ck: int, rev: int) -> WatchEvent:
    return WatchEvent("put", KV(keys.span_status_key(C, cf, span), serde.to_json(SpanStatus("a", 1, ck)), rev, rev, 0))


def status_put(cf: str, ck: int, rev: int) -> WatchEvent:
    return WatchEvent("put", KV(keys.changefeed_status_key(C, cf), serde.to_json(ChangefeedStatus(ck)), rev, rev, 0))


def base(revision: int = 10) -> ClusterSnapshot:
    s = ClusterSnapshot(revision=revision)
    s.span_statuses = {"cf": {0: SpanStatus("a", 1, 5), 1: SpanStatus("a", 1, 6)}}
    s.statuses = {"cf": ChangefeedStatus(5)}
    return s


def feed() -> tuple[StatusFeed, FakeStore]:
    store = FakeStore()
    f = StatusFeed(store)  # type: ignore[arg-type]
    f.follow(base())
    return f, store


def test_watch_starts_after_the_snapshot_and_only_once() -> None:
    f, store = feed()
    f.follow(base(12))
    assert store.started == [11] and not f.broken


def test_overlay_applies_newer_values_without_touching_the_snapshot() -> None:
    f, _ = feed()
    s = base()
    f.on_events(WatchResponse(11, [span_put("cf", 1, 9, 11), status_put("cf", 6, 11)]))
    o = f.overlay(s)
    assert o.span_statuses["cf"][1].checkpoint_ts == 9 and o.span_statuses["cf"][0].checkpoint_ts == 5
    assert o.statuses["cf"].checkpoint_ts == 6
    assert s.span_statuses["cf"][1].checkpoint_ts == 6 and s.statuses["cf"].checkpoint_ts == 5


def test_only_span_status_events_wake_the_owner() -> None:
    f, _ = feed()
    f.on_events(WatchResponse(11, [status_put("cf", 6, 11)]))
    assert not f.wait(0)
    f.on_events(WatchResponse(12, [span_put("cf", 0, 7, 12)]))
    assert f.wait(0) and not f.wait(0)


def test_values_older_than_a_new_snapshot_are_dropped() -> None:
    f, _ = feed()
    f.on_events(WatchResponse(11, [span_put("cf", 1, 9, 11)]))
    newer = base(11)
    newer.span_statuses["cf"][1] = SpanStatus("a", 1, 9)
    f.follow(newer)
    assert f.overlay(newer) is newer
    old = base(10)
    assert f.overlay(old) is old, "forgotten once a snapshot holds it"


def test_own_write_is_seen_before_its_event_and_never_replaced_by_an_older_one() -> None:
    f, _ = feed()
    f.note_status("cf", ChangefeedStatus(8), 15)
    assert f.overlay(base()).statuses["cf"].checkpoint_ts == 8
    f.on_events(WatchResponse(14, [status_put("cf", 7, 14)]))  # an older write delivered late
    assert f.overlay(base()).statuses["cf"].checkpoint_ts == 8
    f.on_events(WatchResponse(15, [status_put("cf", 8, 15)]))
    f.on_events(WatchResponse(16, [status_put("cf", 9, 16)]))
    assert f.overlay(base()).statuses["cf"].checkpoint_ts == 9


def test_deletes_remove_keys() -> None:
    f, _ = feed()
    f.on_events(WatchResponse(11, [WatchEvent("delete", KV(keys.span_status_key(C, "cf", 0), b"", 0, 11, 0)),
                                    WatchEvent("delete", KV(keys.changefeed_status_key(C, "cf"), b"", 0, 11, 0))]))
    o = f.overlay(base())
    assert 0 not in o.span_statuses["cf"] and "cf" not in o.statuses


def test_undecodable_and_foreign_keys_are_ignored() -> None:
    f, _ = feed()
    f.on_events(WatchResponse(11, [WatchEvent("put", KV(keys.span_status_key(C, "cf", 0), b"{nope", 11, 11, 0)),
                                    WatchEvent("put", KV("/tidewater/c1/whatever", b"x", 11, 11, 0))]))
    assert f.overlay(base()).span_statuses["cf"][0].checkpoint_ts == 5


def test_broken_watch_is_restarted_by_the_next_follow() -> None:
    f, store = feed()
    assert store.on_error is not None
    store.on_error(MetaStoreError("compacted"))
    assert f.broken
    f.follow(base(20))
    assert store.started == [11, 21] and not f.broken and store.watches[0].cancelled


def test_watch_that_cannot_start_leaves_the_feed_broken() -> None:
    store = FakeStore(fail=True)
    f = StatusFeed(store)  # type: ignore[arg-type]
    f.follow(base())
    assert f.broken
    s = base()
    assert f.overlay(s) is s
