"""Coalesced span-status writes and the owner's status feed against a real etcd."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cdc.errors import ChangefeedNotFound
from cdc.meta.etcd import EtcdClient
from cdc.meta.session import Session
from cdc.meta.status_feed import StatusFeed
from cdc.meta.store import SPAN_STATUSES_PER_TXN, MetaStore, SpanStatusWrite
from cdc.model import CaptureInfo, ChangefeedInfo, ChangefeedStatus, SpanAssignment, SpanInfo, SpanStatus
from playground.servers import EtcdServer

pytestmark = pytest.mark.integration


@pytest.fixture
def store(etcd_server: EtcdServer, cluster_id: str) -> Iterator[MetaStore]:
    c = EtcdClient([etcd_server.url], timeout=3.0)
    yield MetaStore(c, cluster_id)
    c.close()


def info(cf: str, spans: int) -> ChangefeedInfo:
    return ChangefeedInfo(id=cf, upstream_uri="postgresql://u@127.0.0.1:5432/db", sink_uri="blackhole://",
                          config={}, start_ts=100, start_time=1.0, create_time=1.0,
                          spans=tuple(SpanInfo(i, f"s{i}", f"p{i}", 100) for i in range(spans)))


def test_statuses_of_many_spans_share_transactions_and_guards_stay_per_span(store: MetaStore) -> None:
    n = SPAN_STATUSES_PER_TXN + 6  # two transactions
    session = Session(store.client, 10)
    try:
        store.register_capture(CaptureInfo("cap", "127.0.0.1:1", "v", 1.0), session.lease_id)
        store.create_changefeed(info("cf", n), ChangefeedStatus())
        mine = SpanAssignment("cap", 1)
        for i in range(n):
            store.put_assignment("cf", i, mine)
        writes = [SpanStatusWrite("cf", i, SpanStatus("cap", 1, 200 + i), store.processor_guard("cf", i, mine,
                                                                                             session.lease_id))
                  for i in range(n)]
        before = store.snapshot().revision
        assert store.put_span_statuses(writes) == [True] * n
        after = store.snapshot().revision
        assert after - before == 2, "one etcd revision per transaction"
        assert {i: s.checkpoint_ts for i, s in store.snapshot().span_statuses["cf"].items()} == {
            i: 200 + i for i in range(n)}

        # span 3 moved away: its write is refused, every other one of the same batch is stored
        store.put_assignment("cf", 3, SpanAssignment("other", 2))
        writes = [SpanStatusWrite(w.cf, w.span, SpanStatus("cap", 1, 500 + w.span), w.guard) for w in writes]
        result = store.put_span_statuses(writes)
        assert [i for i, ok in enumerate(result) if not ok] == [3]
        stored = store.snapshot().span_statuses["cf"]
        assert stored[3].checkpoint_ts == 203 and stored[4].checkpoint_ts == 504
        assert store.put_span_statuses([]) == []
    finally:
        session.close()
    # the lease is part of every guard
    assert store.put_span_statuses(writes[:2]) == [False, False]


def test_status_feed_sees_span_statuses_after_the_snapshot(store: MetaStore) -> None:
    store.create_changefeed(info("cf", 1), ChangefeedStatus())
    snap = store.snapshot()
    feed = StatusFeed(store)
    feed.follow(snap)
    try:
        assert not feed.broken
        store.put_span_status("cf", 0, SpanStatus("cap", 1, 300))
        assert feed.wait(5.0)
        deadline = time.monotonic() + 5
        while feed.overlay(snap) is snap and time.monotonic() < deadline:
            time.sleep(0.01)
        assert feed.overlay(snap).span_statuses["cf"][0].checkpoint_ts == 300
        rev = store.put_status("cf", ChangefeedStatus(300))
        assert rev > snap.revision
        feed.note_status("cf", ChangefeedStatus(300), rev)
        assert feed.overlay(snap).statuses["cf"].checkpoint_ts == 300
        store.delete_changefeed("cf")
        with pytest.raises(ChangefeedNotFound):
            store.put_status("cf", ChangefeedStatus(301))
    finally:
        feed.close()
