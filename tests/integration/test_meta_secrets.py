"""Credentials at rest in etcd (issue 12, item 7): a changefeed's URIs were stored in plain text. With a key
file they are sealed (no password, no host in etcd), still read by a capture holding the key, changefeeds
stored earlier in plain text stay readable and are sealed on reseal, and keys rotate without downtime."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from cdc.crypto import SecretBox, generate_key, is_sealed
from cdc.errors import SecretKeyMissing
from cdc.meta import keys
from cdc.meta.etcd import EtcdClient
from cdc.meta.store import MetaStore
from cdc.model import ChangefeedInfo, ChangefeedStatus, FeedState, SpanInfo
from cdc.uri import parse_upstream_uri, redact
from playground.servers import EtcdServer

pytestmark = pytest.mark.integration

UPSTREAM = "postgresql://repl:Up%40str3am-pw@db1.example:5432/shop?sslpassword=K3y-pw"
SINK = "mysql://app:S1nk-pw@db2.example:3306/shop"


@pytest.fixture
def client(etcd_server: EtcdServer) -> Iterator[EtcdClient]:
    c = EtcdClient([etcd_server.url], timeout=3.0)
    yield c
    c.close()


def info(cf: str) -> ChangefeedInfo:
    now = time.time()
    return ChangefeedInfo(id=cf, upstream_uri=UPSTREAM, sink_uri=SINK, config={}, start_ts=1, start_time=now,
                          create_time=now, spans=(SpanInfo(0, "s", "p", 1),), state=FeedState.NORMAL)


def raw_value(client: EtcdClient, cluster: str, cf: str) -> str:
    kv = client.get(keys.changefeed_info_key(cluster, cf))
    assert kv is not None
    return kv.value.decode()


def assert_no_secret(text: str) -> None:
    for secret in ("Up%40str3am-pw", "Up@str3am-pw", "K3y-pw", "S1nk-pw", "db1.example", "db2.example"):
        assert secret not in text, (secret, text)


def test_plain_text_in_etcd_without_a_key(client: EtcdClient, cluster_id: str) -> None:
    """The reproduction: without a key file the passwords sit in etcd as written (the old behaviour,
    still the default, announced by a warning at server start)."""
    MetaStore(client, cluster_id).create_changefeed(info("plain"), ChangefeedStatus())
    assert "S1nk-pw" in raw_value(client, cluster_id, "plain")


def test_sealed_in_etcd_and_readable_with_the_key(client: EtcdClient, cluster_id: str) -> None:
    box = SecretBox([generate_key()])
    store = MetaStore(client, cluster_id, box)
    store.create_changefeed(info("sealed"), ChangefeedStatus())
    assert_no_secret(raw_value(client, cluster_id, "sealed"))
    got = store.get_changefeed("sealed")
    assert got is not None and (got.value.upstream_uri, got.value.sink_uri) == (UPSTREAM, SINK)
    assert store.snapshot().changefeeds["sealed"].value.sink_uri == SINK
    assert store.list_changefeeds()["sealed"].value.upstream_uri == UPSTREAM
    # a state change written back stays sealed
    assert store.update_changefeed(got.value.with_state(FeedState.STOPPED), got.mod_revision)
    assert_no_secret(raw_value(client, cluster_id, "sealed"))

    # a capture without the key (or with another one) sees a sealed value: parsing names the fix, the
    # API's view shows a marker, and writing the info back keeps the sealed value intact
    for other in (MetaStore(client, cluster_id), MetaStore(client, cluster_id, SecretBox([generate_key()]))):
        seen = other.get_changefeed("sealed")
        assert seen is not None and is_sealed(seen.value.upstream_uri)
        with pytest.raises(SecretKeyMissing, match="secret-key-file"):
            parse_upstream_uri(seen.value.upstream_uri)
        assert redact(seen.value.sink_uri) == "<encrypted>"
        assert other.update_changefeed(seen.value.with_state(FeedState.NORMAL), seen.mod_revision)
        again = store.get_changefeed("sealed")
        assert again is not None and again.value.sink_uri == SINK and again.value.state is FeedState.NORMAL


def test_plain_changefeeds_stay_readable_and_are_sealed_by_reseal(client: EtcdClient, cluster_id: str) -> None:
    MetaStore(client, cluster_id).create_changefeed(info("old"), ChangefeedStatus())  # stored before encryption
    box = SecretBox([generate_key()])
    store = MetaStore(client, cluster_id, box)
    got = store.get_changefeed("old")
    assert got is not None and got.value.upstream_uri == UPSTREAM
    assert store.reseal_changefeeds() == 1
    assert_no_secret(raw_value(client, cluster_id, "old"))
    assert store.reseal_changefeeds() == 0
    got = store.get_changefeed("old")
    assert got is not None and got.value.upstream_uri == UPSTREAM


def test_key_rotation(client: EtcdClient, cluster_id: str) -> None:
    k1, k2 = generate_key(), generate_key()
    MetaStore(client, cluster_id, SecretBox([k1])).create_changefeed(info("rot"), ChangefeedStatus())
    before = raw_value(client, cluster_id, "rot")
    # step 1-2: every capture gets [k2, k1]: old values still open; reseal moves them to k2
    both = MetaStore(client, cluster_id, SecretBox([k2, k1]))
    got = both.get_changefeed("rot")
    assert got is not None and got.value.sink_uri == SINK
    assert both.reseal_changefeeds() == 1
    assert raw_value(client, cluster_id, "rot") != before
    # step 3: k1 is dropped; everything opens with k2 alone, nothing with k1 alone
    got = MetaStore(client, cluster_id, SecretBox([k2])).get_changefeed("rot")
    assert got is not None and got.value.sink_uri == SINK
    got = MetaStore(client, cluster_id, SecretBox([k1])).get_changefeed("rot")
    assert got is not None and is_sealed(got.value.sink_uri)
