"""The bench sees a catch-up's end when the owner writes the changefeed checkpoint (``bench.checkpoint_watch``, a watch
on a real etcd), not at its next poll of the capture's API: a 0.25 s poll rounded every catch-up figure up to the next
poll (the bimodal MariaDB (a) rates, docs/benchmarks.md 2026-11-29)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

from bench.checkpoint_watch import CheckpointWatch
from bench.mariadb_refs import MariaDBFeed
from cdc.meta.etcd import EtcdClient
from cdc.meta.store import MetaStore
from cdc.model import ChangefeedInfo, ChangefeedStatus, SpanInfo
from playground.cluster import CdcServer
from playground.servers import EtcdServer, MariaDBServer

pytestmark = pytest.mark.integration

CF = "cf-watched"


@pytest.fixture
def store(etcd_server: EtcdServer, cluster_id: str) -> Iterator[MetaStore]:
    c = EtcdClient([etcd_server.url], timeout=3.0)
    s = MetaStore(c, cluster_id)
    s.create_changefeed(ChangefeedInfo(id=CF, upstream_uri="mysql://u@127.0.0.1:3306/db", sink_uri="blackhole://",
                                       config={}, start_ts=100, start_time=1.0, create_time=1.0,
                                       spans=(SpanInfo(0, "s0", "p0", 100),)), ChangefeedStatus(checkpoint_ts=100))
    yield s
    c.close()


class ApiFromEtcd:
    """What the feed reads of ``playground.cluster.CdcServer``: the changefeed as the API shows it (its checkpoint is
    the stored status, as ``capture.changefeed_view`` reads it); ``polled`` is set by the first read."""

    def __init__(self, store: MetaStore, etcd_url: str) -> None:
        self.store, self.etcd_url, self.cluster_id = store, etcd_url, store.cluster_id
        self.polled = threading.Event()
        self.reads = 0

    def changefeed(self, cf: str) -> dict[str, Any]:
        status = self.store.get_status(cf)
        assert status is not None
        self.reads += 1
        self.polled.set()
        ts = status.value.checkpoint_ts
        return {"checkpoint_ts": ts, "checkpoint": str(ts), "state": "normal", "spans": []}


def test_wait_returns_with_the_write_that_reaches_the_ts(store: MetaStore, etcd_server: EtcdServer) -> None:
    with CheckpointWatch(etcd_server.url, store.cluster_id, CF) as watch:
        assert watch.checkpoint == 100  # the stored value, read when opened
        assert watch.wait(100, 0) is not None  # already there
        assert watch.wait(500, 0) is None
        store.put_status(CF, ChangefeedStatus(checkpoint_ts=400))  # not far enough
        put_at = time.monotonic()
        store.put_status(CF, ChangefeedStatus(checkpoint_ts=500))
        seen = watch.wait(500, 60)
        assert seen is not None and seen >= put_at  # the time of the write's event, not of the read when opened
        assert watch.checkpoint == 500


def test_a_longer_changefeed_id_under_the_same_prefix_is_not_taken(store: MetaStore, etcd_server: EtcdServer) -> None:
    other = CF + "x"  # its status key starts with CF's
    store.create_changefeed(ChangefeedInfo(id=other, upstream_uri="mysql://u@127.0.0.1:3306/db",
                                           sink_uri="blackhole://", config={}, start_ts=100, start_time=1.0,
                                           create_time=1.0, spans=(SpanInfo(0, "s0", "p0", 100),)),
                            ChangefeedStatus(checkpoint_ts=100))
    with CheckpointWatch(etcd_server.url, store.cluster_id, CF) as watch:
        store.put_status(other, ChangefeedStatus(checkpoint_ts=900))
        store.put_status(CF, ChangefeedStatus(checkpoint_ts=300))  # after the other one: seen after it
        assert watch.wait(300, 60) is not None
        assert watch.checkpoint == 300


def test_feed_wait_ends_on_the_write_not_at_its_next_api_poll(store: MetaStore, etcd_server: EtcdServer) -> None:
    """The API poll is an hour apart: the wait can only end by the watch (before the change it slept the poll)."""
    api = ApiFromEtcd(store, etcd_server.url)
    feed = MariaDBFeed(cast(CdcServer, api), cast(MariaDBServer, None), "db", CF, "blackhole", "blackhole://")
    feed.checkpoints.open()
    returned = threading.Event()
    result: list[dict[str, Any]] = []

    def wait() -> None:
        result.append(feed.wait(700, timeout=7200, poll=3600))
        returned.set()

    waiter = threading.Thread(target=wait, daemon=True)
    try:
        waiter.start()
        assert api.polled.wait(60)  # the feed read the API once (checkpoint 100) and waits for the next poll
        put_at = time.monotonic()
        store.put_status(CF, ChangefeedStatus(checkpoint_ts=700))
        assert returned.wait(60), "the wait did not end on the checkpoint's write"
        assert result[0]["checkpoint_ts"] == 700
        assert feed.reached_at >= put_at  # the figure ends at the write's event
        assert api.reads == 2  # the first poll, and the final read of the state
    finally:
        feed.checkpoints.close()
