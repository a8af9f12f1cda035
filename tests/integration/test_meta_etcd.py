"""cdc.meta against a real etcd: client, sessions, election, fencing, typed store, watches."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdc import serde
from cdc.errors import ChangefeedExists, ChangefeedNotFound, LeaseLost, MetaStoreError, NotOwner
from cdc.meta import etcd as etcd_mod
from cdc.meta import keys
from cdc.meta.election import Election
from cdc.meta.etcd import EtcdClient
from cdc.meta.kv import Compare, Op, WatchResponse
from cdc.meta.session import Session
from cdc.meta.store import MetaStore
from cdc.model import (
    CaptureInfo,
    ChangefeedInfo,
    ChangefeedStatus,
    FeedState,
    SpanAssignment,
    SpanInfo,
    SpanStatus,
)
from playground.servers import EtcdServer, free_port

pytestmark = pytest.mark.integration

TTL = 2  # seconds; etcd's minimum lease TTL with default election settings is 2


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def client(etcd_server: EtcdServer) -> Iterator[EtcdClient]:
    c = EtcdClient([etcd_server.url], timeout=3.0)
    yield c
    c.close()


@pytest.fixture
def store(client: EtcdClient, cluster_id: str) -> MetaStore:
    return MetaStore(client, cluster_id)


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A private etcd this test may stop and restart."""
    server = EtcdServer(tmp_path, "own-etcd").start()
    yield server
    server.stop()


def make_info(cf: str, spans: int = 2) -> ChangefeedInfo:
    return ChangefeedInfo(
        id=cf,
        upstream_uri="postgresql://u@127.0.0.1:5432/db",
        sink_uri="blackhole://",
        config={"filter": {"rules": ["public.*"]}, "span-count": spans},
        start_ts=100,
        start_time=1.5,
        create_time=2.5,
        spans=tuple(SpanInfo(i, f"slot_{i}", f"pub_{i}", 100) for i in range(spans)),
    )


# ---- raw client ---------------------------------------------------------------------------------------------
def test_put_get_prefix_delete(client: EtcdClient, cluster_id: str) -> None:
    p = keys.cluster_prefix(cluster_id)
    assert client.get(p + "a") is None
    rev1 = client.put(p + "a", b"1")
    client.put(p + "b", b"2")
    client.put(p + "b", b"3")
    client.put(keys.cluster_prefix(cluster_id + "x") + "a", b"other cluster")
    kv = client.get(p + "b")
    assert kv is not None and kv.value == b"3" and kv.version == 2 and kv.mod_revision > kv.create_revision
    revision, kvs = client.get_prefix(p)
    assert [(k.key, k.value) for k in kvs] == [(p + "a", b"1"), (p + "b", b"3")]
    assert revision >= kv.mod_revision > rev1
    assert client.delete(p + "a") is True
    assert client.delete(p + "a") is False
    assert client.delete_prefix(p) == 1
    assert client.get_prefix(p)[1] == []
    client.delete_prefix(keys.cluster_prefix(cluster_id + "x"))


def test_get_prefix_pages_at_one_revision(
    client: EtcdClient, cluster_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = keys.cluster_prefix(cluster_id)
    for i in range(10):
        client.put(f"{p}k{i:02d}", str(i).encode())
    monkeypatch.setattr(etcd_mod, "_PAGE", 3)
    real_call = client._call
    calls = []

    def call_and_write(what: str, fn: Callable, **kw: object) -> object:
        # A concurrent writer changes keys between pages; the read must not see it.
        calls.append(what)
        result = real_call(what, fn, **kw)
        real_call(
            "put",
            lambda ch, t: etcd_mod.rpc.KVStub(ch).Put(
                etcd_mod.rpc.PutRequest(key=f"{p}k09".encode(), value=b"changed"), t
            ),
        )
        return result

    monkeypatch.setattr(client, "_call", call_and_write)
    revision, kvs = client.get_prefix(p)
    monkeypatch.undo()
    assert len(calls) == 4  # 3 + 3 + 3 + 1
    assert [kv.value for kv in kvs] == [str(i).encode() for i in range(10)]
    assert all(kv.mod_revision <= revision for kv in kvs)
    assert client.get(f"{p}k09").value == b"changed"  # type: ignore[union-attr]


def test_txn_compare_and_swap(client: EtcdClient, cluster_id: str) -> None:
    p = keys.cluster_prefix(cluster_id)
    k = p + "cas"
    assert client.txn([Compare.absent(k)], [Op.put(k, b"v1")]) is True
    assert client.txn([Compare.absent(k)], [Op.put(k, b"v2")]) is False
    kv = client.get(k)
    assert kv is not None and kv.value == b"v1"
    # mod revision CAS: the first writer wins, the second (stale) one fails and runs the failure branch.
    assert client.txn([Compare(k, "mod", "=", kv.mod_revision)], [Op.put(k, b"v2")]) is True
    assert (
        client.txn(
            [Compare(k, "mod", "=", kv.mod_revision)], [Op.put(k, b"v3")], [Op.put(p + "lost", b"yes")]
        )
        is False
    )
    assert client.get(k).value == b"v2"  # type: ignore[union-attr]
    assert client.get(p + "lost").value == b"yes"  # type: ignore[union-attr]
    # value, version and lease targets; '<' '>' '!='.
    assert client.txn([Compare(k, "value", "=", b"v2"), Compare(k, "version", "=", 2)], [Op.put(k, b"v4")])
    assert not client.txn([Compare(k, "value", "!=", b"v4")], [Op.put(k, b"x")])
    assert client.txn([Compare(k, "version", ">", 2), Compare(k, "create", "<", 10**12)], [])
    lease = client.grant_lease(10)
    try:
        client.put(p + "leased", b"l", lease=lease)
        assert client.txn([Compare(p + "leased", "lease", "=", lease)], [])
        assert not client.txn([Compare(k, "lease", "=", lease)], [])
        assert not client.txn([Compare(p + "missing", "lease", "=", lease)], [])
    finally:
        client.revoke_lease(lease)
    assert client.get(p + "leased") is None
    # One transaction deletes a prefix and puts a key atomically.
    client.put(p + "sub/1", b"1")
    client.put(p + "sub/2", b"2")
    commit = client.commit([Compare.exists(k)], [Op.delete_prefix(p + "sub/"), Op.put(p + "only", b"1")])
    assert commit.succeeded and commit.revision > 0
    assert [kv.key for kv in client.get_prefix(p)[1]] == [p + "cas", p + "lost", p + "only"]
    assert client.get(p + "only").mod_revision == commit.revision  # type: ignore[union-attr]
    # etcd refuses a transaction that touches one key twice (here: a put inside a deleted range).
    with pytest.raises(MetaStoreError, match="duplicate key"):
        client.txn([], [Op.delete_prefix(p), Op.put(p + "only", b"2")])
    with pytest.raises(ValueError):
        Compare(k, "mod", "=", b"1")
    with pytest.raises(ValueError):
        Compare(k, "value", "=", 1)


def test_failover_to_next_endpoint_and_errors_name_the_endpoint(
    etcd_server: EtcdServer, cluster_id: str
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with EtcdClient([f"http://{dead}", etcd_server.url], timeout=2) as c:
        k = keys.cluster_prefix(cluster_id) + "fo"
        c.put(k, b"1")  # first endpoint refuses, the second answers
        assert c.get(k).value == b"1"  # type: ignore[union-attr]
        assert c.endpoint == etcd_server.url.removeprefix("http://")
    with EtcdClient([dead], timeout=1) as c, pytest.raises(MetaStoreError) as ei:
        started = time.monotonic()
        c.get("/tidewater/x")
    assert dead in str(ei.value) and "UNAVAILABLE" in str(ei.value) and ei.value.retryable
    assert 0.5 < time.monotonic() - started < 3  # retried for about the timeout, then gave up


def test_lease_refresh_and_revoke(client: EtcdClient, cluster_id: str) -> None:
    lease = client.grant_lease(5)
    assert client.refresh_lease(lease) == 5
    assert 0 < client.lease_ttl(lease) <= 5
    client.revoke_lease(lease)
    client.revoke_lease(lease)  # idempotent
    assert client.lease_ttl(lease) == -1
    assert client.refresh_lease(lease) <= 0
    with pytest.raises(MetaStoreError):
        client.put(keys.cluster_prefix(cluster_id) + "x", b"", lease=lease)


# ---- watch --------------------------------------------------------------------------------------------------
def test_watch_delivers_events_in_order_and_replays_from_revision(
    client: EtcdClient, cluster_id: str
) -> None:
    p = keys.cluster_prefix(cluster_id)
    first_rev = client.put(p + "w0", b"before")
    got: list[WatchResponse] = []
    w = client.watch_prefix(p, None, got.append)
    try:
        client.put(p + "w1", b"a")
        client.put(keys.cluster_prefix(cluster_id + "x") + "w1", b"not ours")
        client.txn([], [Op.put(p + "w2", b"b"), Op.delete(p + "w0")])
        wait_until(lambda: sum(len(r.events) for r in got) >= 3, 5, "3 events")
    finally:
        w.cancel()
    events = [(e.type, e.kv.key, e.kv.value) for r in got for e in r.events]
    assert events == [("put", p + "w1", b"a"), ("put", p + "w2", b"b"), ("delete", p + "w0", b"")]
    revs = [e.kv.mod_revision for r in got for e in r.events]
    assert revs == sorted(revs) and revs[1] == revs[2]  # one txn, one revision
    # Replay from an old revision sees everything since, including the 'before' put.
    replay: list[WatchResponse] = []
    w2 = client.watch_prefix(p, first_rev, replay.append)
    try:
        wait_until(lambda: sum(len(r.events) for r in replay) >= 4, 5, "replayed events")
    finally:
        w2.cancel()
    assert [(e.type, e.kv.key) for r in replay for e in r.events][0] == ("put", p + "w0")
    client.delete_prefix(keys.cluster_prefix(cluster_id + "x"))


def test_watch_reports_compaction(client: EtcdClient, cluster_id: str) -> None:
    p = keys.cluster_prefix(cluster_id)
    old = client.put(p + "c", b"1")
    new = client.put(p + "c", b"2")
    client._call(
        "compact",
        lambda ch, t: etcd_mod.rpc.KVStub(ch).Compact(etcd_mod.rpc.CompactionRequest(revision=new), t),
    )
    errors: list[MetaStoreError] = []
    w = client.watch_prefix(p, old, lambda r: None, on_error=errors.append)
    try:
        wait_until(lambda: bool(errors), 5, "compaction error")
    finally:
        w.cancel()
    assert "compacted" in str(errors[0])


def test_watch_survives_etcd_restart(own_etcd: EtcdServer) -> None:
    got: list[WatchResponse] = []
    with EtcdClient([own_etcd.url], timeout=2) as c:
        w = c.watch_prefix("/tidewater/r/", None, got.append)
        c.put("/tidewater/r/1", b"1")
        wait_until(lambda: len(got) == 1, 5, "first event")
        own_etcd.stop()
        own_etcd.start()
        c.put("/tidewater/r/2", b"2")  # written after the restart, before/while the watch reconnects
        wait_until(lambda: sum(len(r.events) for r in got) >= 2, 15, "event after restart")
        time.sleep(0.3)
        w.cancel()
    assert [e.kv.key for r in got for e in r.events] == ["/tidewater/r/1", "/tidewater/r/2"]


# ---- session ------------------------------------------------------------------------------------------------
def test_session_keeps_lease_alive_and_revokes_on_close(client: EtcdClient, cluster_id: str) -> None:
    k = keys.cluster_prefix(cluster_id) + "sess"
    s = Session(client, TTL)
    client.put(k, b"x", lease=s.lease_id)
    time.sleep(TTL * 1.5)  # longer than the TTL: only the refresher keeps it
    assert s.alive.is_set() and client.get(k) is not None
    s.close()
    assert not s.alive.is_set() and not s.lost.is_set()
    assert client.get(k) is None  # revoked at once


def test_session_close_without_revoke_lets_lease_expire(client: EtcdClient, cluster_id: str) -> None:
    k = keys.cluster_prefix(cluster_id) + "sess"
    s = Session(client, TTL)
    client.put(k, b"x", lease=s.lease_id)
    s.close(revoke=False)
    assert client.get(k) is not None
    wait_until(lambda: client.get(k) is None, TTL + 3, "lease expiry")


def test_session_lost_when_lease_revoked_elsewhere(client: EtcdClient) -> None:
    reasons: list[str] = []
    s = Session(client, TTL, on_lost=reasons.append)
    client.revoke_lease(s.lease_id)
    assert s.lost.wait(TTL + 2)
    assert not s.alive.is_set() and len(reasons) == 1 and "expired" in reasons[0]
    late: list[str] = []
    s.add_on_lost(late.append)  # registered after the loss: runs at once
    assert late == reasons
    s.close()
    assert len(reasons) == 1


def test_session_lost_when_etcd_unreachable_for_ttl(own_etcd: EtcdServer) -> None:
    with EtcdClient([own_etcd.url], timeout=1) as c:
        lost_at: list[float] = []
        s = Session(c, TTL, on_lost=lambda _r: lost_at.append(time.monotonic()))
        time.sleep(0.5)
        own_etcd.kill()
        killed = time.monotonic()
        assert s.lost.wait(TTL + 3)
        # Lost no later than TTL after the last successful refresh (<= TTL after the kill, plus slack).
        assert len(lost_at) == 1 and lost_at[0] - killed <= TTL + 1.0
        assert lost_at[0] - killed >= TTL - s.refresh_interval - 0.2  # and not before the TTL could have run out
        assert "no successful refresh" in s.lost_reason
        s.close()


# ---- election -----------------------------------------------------------------------------------------------
def _campaign_in_thread(
    e: Election, value: bytes, stop: threading.Event
) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(e.campaign(value, stop)), daemon=True)
    t.start()
    return t, result


def test_election_second_wins_after_resign_and_deposed_fence_fails(store: MetaStore) -> None:
    client = store.client
    prefix = store.owner_election_prefix
    s1, s2 = Session(client, TTL), Session(client, TTL)
    e1, e2 = Election(client, s1, prefix, poll_interval=0.2), Election(client, s2, prefix, poll_interval=0.2)
    stop = threading.Event()
    try:
        assert e1.campaign(b"cap-1", stop) is True
        assert e1.is_leader() and e1.leader() == (e1.key, b"cap-1")
        store.create_changefeed(make_info("cf1"), ChangefeedStatus())
        fence1 = e1.fence()
        store.put_status("cf1", ChangefeedStatus(checkpoint_ts=10), fence1)

        t, result = _campaign_in_thread(e2, b"cap-2", stop)
        time.sleep(0.5)
        assert t.is_alive() and not result and not e2.is_leader()
        with pytest.raises(NotOwner):
            e2.fence()  # not elected yet

        e1.resign()
        t.join(5)
        assert result == [True] and e2.is_leader() and not e1.is_leader()
        assert e2.leader() == (e2.key, b"cap-2")
        # The deposed owner still holds its old fence: every fenced write fails and changes nothing.
        with pytest.raises(NotOwner):
            store.put_status("cf1", ChangefeedStatus(checkpoint_ts=999), fence1)
        with pytest.raises(NotOwner):
            store.put_assignment("cf1", 0, SpanAssignment("cap-1", 1), fence1)
        info = store.get_changefeed("cf1")
        assert info is not None
        with pytest.raises(NotOwner):
            store.update_changefeed(info.value.with_state(FeedState.STOPPED), info.mod_revision, fence1)
        with pytest.raises(NotOwner):
            store.delete_changefeed("cf1", fence1)
        assert store.get_status("cf1").value.checkpoint_ts == 10  # type: ignore[union-attr]
        assert store.get_changefeed("cf1").value.state is FeedState.NORMAL  # type: ignore[union-attr]
        # The new owner's fence works.
        store.put_status("cf1", ChangefeedStatus(checkpoint_ts=20), e2.fence())
        assert store.get_status("cf1").value.checkpoint_ts == 20  # type: ignore[union-attr]
    finally:
        stop.set()
        s1.close()
        s2.close()


def test_election_successor_wins_when_leader_session_dies(store: MetaStore) -> None:
    client = store.client
    prefix = store.owner_election_prefix
    s1, s2 = Session(client, TTL), Session(client, TTL)
    e1, e2 = Election(client, s1, prefix, poll_interval=0.2), Election(client, s2, prefix, poll_interval=0.2)
    stop = threading.Event()
    try:
        assert e1.campaign(b"cap-1", stop)
        t, result = _campaign_in_thread(e2, b"cap-2", stop)
        time.sleep(0.3)
        assert not result
        s1.close(revoke=False)  # a crashed leader: its key lives until the lease expires
        started = time.monotonic()
        t.join(TTL + 5)
        assert result == [True], "successor not elected after the leader's lease expired"
        assert time.monotonic() - started >= 0.5  # not before the lease expired
        assert e2.is_leader() and not e1.is_leader()
        with pytest.raises(NotOwner):
            store.delete_changefeed("nope", e1.fence())
    finally:
        stop.set()
        s2.close()


def test_campaign_returns_false_when_stopped_or_session_lost(store: MetaStore) -> None:
    client = store.client
    prefix = store.owner_election_prefix
    s1, s2, s3 = Session(client, TTL), Session(client, TTL), Session(client, TTL)
    e1 = Election(client, s1, prefix, poll_interval=0.1)
    stop = threading.Event()
    try:
        assert e1.campaign(b"1", stop)
        stop2 = threading.Event()
        t, result = _campaign_in_thread(Election(client, s2, prefix, poll_interval=0.1), b"2", stop2)
        stop2.set()
        t.join(3)
        assert result == [False]
        e3 = Election(client, s3, prefix, poll_interval=0.1)
        t, result = _campaign_in_thread(e3, b"3", stop)
        time.sleep(0.3)
        client.revoke_lease(s3.lease_id)  # session 3 lost while waiting
        t.join(TTL + 3)
        assert result == [False] and s3.lost.is_set()
        assert e1.is_leader()
    finally:
        stop.set()
        for s in (s1, s2, s3):
            s.close()


# ---- typed store --------------------------------------------------------------------------------------------
def test_create_changefeed_is_unique_and_cas_update(store: MetaStore) -> None:
    info = make_info("orders")
    store.create_changefeed(info, ChangefeedStatus(checkpoint_ts=100))
    with pytest.raises(ChangefeedExists):
        store.create_changefeed(make_info("orders", spans=5), ChangefeedStatus())
    got = store.get_changefeed("orders")
    assert got is not None and got.value == info  # the first one is untouched
    assert store.list_changefeeds() == {"orders": got}
    assert store.get_status("orders").value.checkpoint_ts == 100  # type: ignore[union-attr]

    stopped = info.with_state(FeedState.STOPPED, now=5.0)
    assert store.update_changefeed(stopped, got.mod_revision) is True
    assert store.update_changefeed(info, got.mod_revision) is False  # stale revision
    now = store.get_changefeed("orders")
    assert now is not None and now.value.state is FeedState.STOPPED and now.mod_revision > got.mod_revision
    assert store.get_changefeed("missing") is None


def test_store_writes_need_the_changefeed(store: MetaStore) -> None:
    with pytest.raises(ChangefeedNotFound):
        store.put_status("ghost", ChangefeedStatus())
    with pytest.raises(ChangefeedNotFound):
        store.put_assignment("ghost", 0, SpanAssignment("c", 1))
    assert store.snapshot().statuses == {} and store.snapshot().assignments == {}


def test_span_status_guard_and_delete_changefeed(store: MetaStore) -> None:
    client = store.client
    session = Session(client, 10)
    try:
        cap = CaptureInfo("cap-a", "127.0.0.1:8300", "0.1.0", 1.0, pid=42)
        store.register_capture(cap, session.lease_id)
        store.create_changefeed(make_info("cf"), ChangefeedStatus())
        a1 = SpanAssignment("cap-a", 1)
        store.put_assignment("cf", 0, a1)
        guard = store.processor_guard("cf", 0, a1, session.lease_id)
        assert store.put_span_status("cf", 0, SpanStatus("cap-a", 1, checkpoint_ts=7), guard) is True
        assert store.get_span_status("cf", 0).value.checkpoint_ts == 7  # type: ignore[union-attr]
        # Reassigned (new epoch): the old processor's guard fails.
        store.put_assignment("cf", 0, SpanAssignment("cap-b", 2))
        assert store.put_span_status("cf", 0, SpanStatus("cap-a", 1, checkpoint_ts=8), guard) is False
        assert store.get_span_status("cf", 0).value.checkpoint_ts == 7  # type: ignore[union-attr]
        assert store.get_assignments("cf") == {0: SpanAssignment("cap-b", 2)}
        # The capture's lease is part of the guard.
        store.put_assignment("cf", 1, a1)
        guard1 = store.processor_guard("cf", 1, a1, session.lease_id)
        assert store.put_span_status("cf", 1, SpanStatus("cap-a", 1, checkpoint_ts=3), guard1)
        assert store.list_captures() == {"cap-a": cap}
        session.close()  # revokes: the capture key goes
        assert store.list_captures() == {}
        assert store.put_span_status("cf", 1, SpanStatus("cap-a", 1, checkpoint_ts=4), guard1) is False
        with pytest.raises(LeaseLost):
            store.register_capture(cap, session.lease_id)
        # The span status is not leased: checkpoints survive the capture.
        assert store.get_span_status("cf", 1).value.checkpoint_ts == 3  # type: ignore[union-attr]

        store.delete_changefeed("cf")
        assert client.get_prefix(keys.cluster_prefix(store.cluster_id))[1] == []
        # Re-creating the id starts clean even if a stale span key was left behind.
        client.put(keys.span_status_key(store.cluster_id, "cf", 0), serde.to_json(SpanStatus("x", 9)))
        store.create_changefeed(make_info("cf"), ChangefeedStatus())
        assert store.snapshot().span_statuses == {}
    finally:
        session.close()


def test_snapshot_decodes_everything_at_one_revision(store: MetaStore) -> None:
    client = store.client
    s1, s2 = Session(client, 10), Session(client, 10)
    stop = threading.Event()
    try:
        caps = {
            c.id: c
            for c in (CaptureInfo("cap-1", "h1:1", "0.1", 1.0), CaptureInfo("cap-2", "h2:2", "0.1", 2.0))
        }
        store.register_capture(caps["cap-1"], s1.lease_id)
        store.register_capture(caps["cap-2"], s2.lease_id)
        e1 = Election(client, s1, store.owner_election_prefix)
        assert e1.campaign(b"cap-1", stop)
        client.put(keys.owner_key(store.cluster_id, s2.lease_id), b"cap-2", lease=s2.lease_id)
        infos = {cf: make_info(cf) for cf in ("a", "b-2")}
        for info in infos.values():
            store.create_changefeed(info, ChangefeedStatus(checkpoint_ts=5))
        store.put_status("a", ChangefeedStatus(checkpoint_ts=6, resolved_ts=9), e1.fence())
        store.put_assignment("a", 0, SpanAssignment("cap-1", 1), e1.fence())
        store.put_assignment("a", 1, SpanAssignment("cap-2", 1), e1.fence())
        store.put_span_status("a", 1, SpanStatus("cap-2", 1, checkpoint_ts=6, resolved_ts=8, running=True))
        client.put(keys.cluster_prefix(store.cluster_id) + "future/key", b"from a newer version")

        snap = store.snapshot()
        assert snap.captures == caps
        assert snap.capture_leases == {"cap-1": s1.lease_id, "cap-2": s2.lease_id}
        assert [(c.lease, c.capture_id) for c in snap.owner_candidates] == [
            (s1.lease_id, "cap-1"),
            (s2.lease_id, "cap-2"),
        ]
        assert snap.owner is not None and snap.owner.capture_id == "cap-1"
        assert {cf: v.value for cf, v in snap.changefeeds.items()} == infos
        assert snap.statuses == {
            "a": ChangefeedStatus(checkpoint_ts=6, resolved_ts=9),
            "b-2": ChangefeedStatus(checkpoint_ts=5),
        }
        assert snap.assignments == {"a": {0: SpanAssignment("cap-1", 1), 1: SpanAssignment("cap-2", 1)}}
        assert snap.span_statuses == {
            "a": {1: SpanStatus("cap-2", 1, checkpoint_ts=6, resolved_ts=8, running=True)}
        }
        info_key = keys.changefeed_info_key(store.cluster_id, "a")
        assert (
            snap.changefeeds["a"].mod_revision
            == snap.mod_revisions[info_key]
            == client.get(info_key).mod_revision
        )  # type: ignore[union-attr]
        assert all(r <= snap.revision for r in snap.mod_revisions.values())
        # The snapshot revision is a valid watch start: nothing is missed in between.
        got: list[WatchResponse] = []
        w = store.watch(snap.revision + 1, got.append)
        store.put_status("b-2", ChangefeedStatus(checkpoint_ts=7), e1.fence())
        wait_until(lambda: bool(got), 5, "watch event")
        w.cancel()
        assert keys.parse_key(got[0].events[0].kv.key).changefeed == "b-2"

        # Corrupt JSON: a MetaStoreError that names the key.
        bad = keys.span_status_key(store.cluster_id, "b-2", 0)
        client.put(bad, b"{not json")
        with pytest.raises(MetaStoreError) as ei:
            store.snapshot()
        assert bad in str(ei.value)
        client.put(bad, b'{"capture_id": "x", "epoch": 1}')
        assert store.snapshot().span_statuses["b-2"][0] == SpanStatus("x", 1)
    finally:
        stop.set()
        s1.close()
        s2.close()


def test_schema_histories_live_beside_the_snapshot_and_go_with_the_changefeed(store: MetaStore) -> None:
    from cdc.events import ColumnSchema, TableName, TableSchema
    from cdc.model import SchemaHistory

    schema = TableSchema(TableName("public", "t"), (ColumnSchema("id", 23, "int4"),), ("id",), relation_id=7)
    h7 = SchemaHistory(7).with_version(100, schema, 0)
    store.put_schema_histories("cf1", [h7])  # no changefeed yet: refused silently by the guard, nothing stored
    assert store.get_schema_histories("cf1") == {}
    store.create_changefeed(make_info("cf1"), ChangefeedStatus())
    store.put_schema_histories("cf1", [h7] + [SchemaHistory(i).with_version(100, schema, 0) for i in range(8, 78)])
    assert len(store.get_schema_histories("cf1")) == 71  # more than one etcd transaction's worth
    assert store.get_schema_history("cf1", 7) == h7
    snap = store.snapshot()  # the owner's and processors' snapshot does not carry the histories
    assert not any("/schema/" in k for k in snap.mod_revisions) and "cf1" in snap.changefeeds
    store.put_schema_histories("cf1", [h7.with_version(200, None, 200)])  # a drop below the checkpoint: gone
    assert store.get_schema_history("cf1", 7) is None
    store.delete_changefeed("cf1")
    assert store.get_schema_histories("cf1") == {}


@pytest.mark.parametrize("tables", [3, 64, 65, 150])  # in the creating transaction; more than one transaction's worth
def test_create_stores_the_first_schema_histories_no_later_than_the_info(store: MetaStore, tables: int) -> None:
    """Whoever sees the changefeed's info (the owner, then a span starting) sees each table's first schema history:
    every history key was written at or before the info key's revision (docs/ddl.md, "Schema history")."""
    from cdc.events import ColumnSchema, TableName, TableSchema
    from cdc.model import SchemaHistory

    client = store.client

    def history(relid: int) -> SchemaHistory:
        schema = TableSchema(TableName("public", f"t{relid}"), (ColumnSchema("id", 23, "int4"),), ("id",),
                             relation_id=relid)
        return SchemaHistory(relid).with_version(100, schema, 0, span=relid % 2)

    # leftovers of an earlier changefeed with the id (not removed through delete_changefeed) go
    client.put(keys.schema_history_key(store.cluster_id, "cf", 9999), serde.to_json(history(9999)))
    wanted = [history(i) for i in range(1, tables + 1)]
    store.create_changefeed(make_info("cf"), ChangefeedStatus(), wanted)
    info_kv = client.get(keys.changefeed_info_key(store.cluster_id, "cf"))
    assert info_kv is not None
    _, kvs = client.get_prefix(keys.schema_history_prefix(store.cluster_id, "cf"))
    assert len(kvs) == tables and max(kv.mod_revision for kv in kvs) <= info_kv.create_revision
    assert store.get_schema_histories("cf") == {h.relid: h for h in wanted}
    # a second create of the id changes nothing of the first one's histories
    with pytest.raises(ChangefeedExists):
        store.create_changefeed(make_info("cf"), ChangefeedStatus(), [history(1).with_version(200, None, 0)])
    assert store.get_schema_histories("cf") == {h.relid: h for h in wanted}
