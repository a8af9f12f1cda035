"""The verify hold and verify runs in a real etcd (cdc/meta/store.py; docs/verify.md): one live hold per changefeed,
taken over only once expired, released only by its own id, read by ``snapshot()``; a changefeed's removal takes its
hold and runs with it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.meta.store import MetaStore
from cdc.model import ChangefeedInfo, ChangefeedStatus, SpanInfo, VerifyHold, VerifyRun
from playground.servers import EtcdServer

pytestmark = pytest.mark.integration


@pytest.fixture
def store(etcd_server: EtcdServer, cluster_id: str) -> Iterator[MetaStore]:
    client = EtcdClient([etcd_server.url], timeout=3.0)
    yield MetaStore(client, cluster_id)
    client.close()


def create(store: MetaStore, cf: str) -> None:
    store.create_changefeed(ChangefeedInfo(id=cf, upstream_uri="postgresql://u@127.0.0.1/db", sink_uri="blackhole://",
                                           config={}, start_ts=1, start_time=1.0, create_time=1.0,
                                           spans=(SpanInfo(0, "s0", "p0"),)), ChangefeedStatus())


def test_one_live_hold_per_changefeed_released_by_its_own_id(store: MetaStore) -> None:
    create(store, "cf-h")
    now = time.time()
    assert store.put_hold("cf-h", VerifyHold(1, now + 60, 0, "a:1"))
    assert store.put_hold("cf-h", VerifyHold(1, now + 60, 500, "a:1"))  # its next phase
    assert not store.put_hold("cf-h", VerifyHold(2, now + 60, 0, "b:2"))  # another verification: refused
    assert store.snapshot().holds["cf-h"] == VerifyHold(1, now + 60, 500, "a:1")
    assert not store.release_hold("cf-h", 2)
    assert store.release_hold("cf-h", 1) and store.get_hold("cf-h") is None
    assert "cf-h" not in store.snapshot().holds
    # an expired hold is taken over
    assert store.put_hold("cf-h", VerifyHold(3, time.time() - 1, 7, "dead:3"))
    assert store.put_hold("cf-h", VerifyHold(4, time.time() + 60, 0, "c:4"))
    assert store.get_hold("cf-h").id == 4  # type: ignore[union-attr]
    assert not store.put_hold("cf-nope", VerifyHold(5, time.time() + 60))  # no such changefeed


def test_removing_a_changefeed_removes_its_hold_and_runs(store: MetaStore, cluster_id: str) -> None:
    create(store, "cf-r")
    assert store.put_hold("cf-r", VerifyHold(1, time.time() + 60))
    store.put_verify_run("cf-r", VerifyRun("ab12", tables=("public.t",)))
    assert store.get_verify_run("cf-r", "ab12") == VerifyRun("ab12", tables=("public.t",))
    store.delete_changefeed("cf-r")
    assert store.get_hold("cf-r") is None and store.get_verify_run("cf-r", "ab12") is None
    assert keys.parse_key(keys.verify_run_key(cluster_id, "cf-r", "ab12")).run == "ab12"
